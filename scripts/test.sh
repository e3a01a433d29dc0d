#!/usr/bin/env bash
# The README's test command: set up, build, make the Python reference fixtures, run every test;
# then the ASan+UBSan build runs the bad-input tests. CI (.ci/run) calls exactly this.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
t0=$(date +%s)
"$QLORA_ROOT/scripts/build.sh"
t1=$(date +%s)

FIX="$QLORA_BUILD/fixtures"
mkdir -p "$FIX"
for f in "$QLORA_ROOT"/tests/fixtures/make_*.py; do
  stamp="$FIX/.$(basename "$f").$(sha256sum "$f" | cut -c1-12)"
  if [ ! -f "$stamp" ]; then
    echo "[test] fixtures: $(basename "$f")"
    "$QLORA_VENV/bin/python" "$f" --out "$FIX"
    touch "$stamp"
  fi
done
t2=$(date +%s)

cd "$QLORA_BUILD"
ctest --output-on-failure -j"${QLORA_TEST_JOBS:-2}" --timeout 1200
# The GPU check script's CPU part (docs/gpu.md): syntax, and the dequant bench in CPU mode.
bash -n "$QLORA_ROOT/scripts/device-check.sh" "$QLORA_ROOT/scripts/device-prepare.sh"
if [ -x "$QLORA_BUILD/bench/quant4/bench_quant4" ]; then
  echo "[test] GPU check, CPU dry run: bench_quant4 cpu"
  "$QLORA_BUILD/bench/quant4/bench_quant4" cpu 1
fi
t3=$(date +%s)

if [ "${QLORA_SKIP_ASAN:-0}" != 1 ]; then
  echo "[test] sanitizer build (ASan+UBSan): bad-input tests"
  QLORA_SANITIZE=1 QLORA_TARGETS="${QLORA_ASAN_TARGETS:-test_badinput}" "$QLORA_ROOT/scripts/build.sh"
  ASAN="${QLORA_BUILD_ASAN:-$QLORA_ROOT/build-asan}"
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    QLORA_FIXTURES="$FIX" "$ASAN/tests/test_badinput"
fi
t4=$(date +%s)
echo "[test] wall: build $((t1-t0))s, fixtures $((t2-t1))s, ctest $((t3-t2))s, sanitizer $((t4-t3))s"
