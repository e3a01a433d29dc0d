#!/usr/bin/env bash
# Installs everything qlora-cpp needs to build and test, idempotently:
#   - Debian packages (compilers' libraries: sentencepiece, yaml-cpp, CLI11, nlohmann-json, spdlog, OpenSSL, ccache)
#   - a venv with the pinned torch wheel (LibTorch for CMake) and the Python test-reference packages
# Safe to run again: each step is skipped when already done.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

DEBS=(libsentencepiece-dev libpcre2-dev libutf8proc-dev libgloo-dev libyaml-cpp-dev libcli11-dev nlohmann-json3-dev libspdlog-dev libssl-dev
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
