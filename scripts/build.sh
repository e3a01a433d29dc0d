#!/usr/bin/env bash
# Configures and builds qlora-cpp into $QLORA_BUILD (default ./build). Extra args go to cmake configure.
#   QLORA_SANITIZE=1 scripts/build.sh   -> ASan+UBSan build in build-asan/
#   QLORA_WERROR=0 scripts/build.sh     -> warnings stay warnings; the default 1 is -Werror on the project's code
#                                          (-Wall -Wextra), as scripts/test.sh builds, so the quickstart's build
#                                          and the test command's are one build (same flags: no object recompiled)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
"$QLORA_ROOT/scripts/setup.sh"

extra=(-DQLORA_WERROR="$([ "${QLORA_WERROR:-1}" = 1 ] && echo ON || echo OFF)")
if [ "${QLORA_SANITIZE:-0}" = 1 ]; then
  QLORA_BUILD="${QLORA_BUILD_ASAN:-$QLORA_ROOT/build-asan}"
  extra+=(-DQLORA_SANITIZE=ON -DQLORA_CUDA=OFF -DQLORA_BUILD_BENCH=OFF)
fi
TORCH_PREFIX="$("$QLORA_VENV/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
mkdir -p "$QLORA_BUILD"
if [ ! -f "$QLORA_BUILD/Makefile" ]; then
  cmake -S "$QLORA_ROOT" -B "$QLORA_BUILD" -DCMAKE_BUILD_TYPE="${QLORA_BUILD_TYPE:-RelWithDebInfo}" \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DPython3_EXECUTABLE="$QLORA_VENV/bin/python" \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache \
    -DQLORA_PYTHON="$QLORA_VENV/bin/python" "${extra[@]}" "$@" > "$QLORA_BUILD/configure.log" 2>&1 \
    || { cat "$QLORA_BUILD/configure.log"; exit 1; }
elif ! grep -q "^QLORA_WERROR:BOOL=${extra[0]#*=}\$" "$QLORA_BUILD/CMakeCache.txt"; then
  cmake "$QLORA_BUILD" "${extra[0]}" > "$QLORA_BUILD/configure.log" 2>&1 || { cat "$QLORA_BUILD/configure.log"; exit 1; }
fi
cmake --build "$QLORA_BUILD" -j"${QLORA_JOBS:-$(nproc)}" ${QLORA_TARGETS:+--target $QLORA_TARGETS}
