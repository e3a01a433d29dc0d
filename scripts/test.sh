#!/usr/bin/env bash
# The README's test command: set up, build, make the Python reference fixtures, run every test;
# then the ASan+UBSan build runs the bad-input tests. CI (.ci/run) calls exactly this.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
t0=$(date +%s)
# A compiler warning in the project's code fails the test command (-Wall -Wextra -Werror, and an
# unusable precompiled header through -Winvalid-pch; docs/setup.md, "Warnings").
export QLORA_WERROR="${QLORA_WERROR:-1}"
"$QLORA_ROOT/scripts/build.sh"
t1=$(date +%s)

FIX="$QLORA_BUILD/fixtures"
mkdir -p "$FIX"
# A fixture is remade when its generator, the pinned Python packages (requirements.lock) or
# ../shared change: the stamp's name is a hash of the three (../shared by its file list, sizes and
# mtimes, which is cheap).
if [ ! -d "$QLORA_SHARED" ]; then  # tests read it; without this check pipefail would exit silently here
  echo "[test] FAILED: the shared test data folder is missing: $QLORA_SHARED (../shared beside the clone, or set QLORA_SHARED)" >&2
  exit 1
fi
shared_key="$( (cd "$QLORA_SHARED" 2>/dev/null && find . -type f -printf '%P %s %T@\n' | LC_ALL=C sort) | sha256sum | cut -c1-16)"
for f in "$QLORA_ROOT"/tests/fixtures/make_*.py; do
  deps=()  # the fixture helpers it imports (tests/fixtures/gguf_pre.py): a change there remakes it too
  for m in "$QLORA_ROOT"/tests/fixtures/*.py; do
    n="$(basename "$m" .py)"
    case "$n" in make_*) continue ;; esac
    if grep -qE "^(from $n import|import $n\b)" "$f"; then deps+=("$m"); fi
  done
  key="$(cat "$f" ${deps[@]+"${deps[@]}"} "$QLORA_ROOT/scripts/requirements.lock" <(echo "$shared_key") | sha256sum | cut -c1-16)"
  stamp="$FIX/.$(basename "$f").$key"
  if [ ! -f "$stamp" ]; then
    echo "[test] fixtures: $(basename "$f")"
    rm -f "$FIX/.$(basename "$f")."*
    "$QLORA_VENV/bin/python" "$f" --out "$FIX"
    touch "$stamp"
  fi
done
t2=$(date +%s)

cd "$QLORA_BUILD"
# Idle OpenMP threads sleep instead of spinning: ctest runs two test processes on CI's two cores,
# and a spinning thread starves the working ones (multi-second stalls; docs/training.md, "OpenMP
# threads on a busy machine"). libgomp reads it when it loads, so it is set before ctest starts them.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
# Every test must run: a skip outside tests/skip_allowlist.txt fails the command (check_skips.py
# reads ctest's JUnit report and lists every test that did not run, with its reason).
have_gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then have_gpu=1; fi
rm -f "$QLORA_BUILD/ctest-junit.xml"
ctest_rc=0
ctest --output-on-failure -j"${QLORA_TEST_JOBS:-2}" --timeout 1200 --output-junit "$QLORA_BUILD/ctest-junit.xml" \
  ${QLORA_CTEST_ARGS:-} || ctest_rc=$?
skips_rc=0
"$QLORA_VENV/bin/python" "$QLORA_ROOT/scripts/check_skips.py" "$QLORA_BUILD/ctest-junit.xml" \
  "$QLORA_ROOT/tests/skip_allowlist.txt" --have-gpu "$have_gpu" || skips_rc=$?
if [ "$ctest_rc" != 0 ] || [ "$skips_rc" != 0 ]; then
  echo "[test] FAILED: ctest exit $ctest_rc, skip check exit $skips_rc"
  exit 1
fi
# The GPU check script's CPU part (docs/gpu.md): syntax, and the dequant bench in CPU mode.
for f in device-check.sh device-prepare.sh device-lib.sh fuzz.sh; do bash -n "$QLORA_ROOT/scripts/$f"; done
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

# libFuzzer (clang, ASan+UBSan): >= 60 s per parser; any finding fails the command.
if [ "${QLORA_SKIP_FUZZ:-0}" != 1 ]; then
  echo "[test] fuzzing (scripts/fuzz.sh)"
  "$QLORA_ROOT/scripts/fuzz.sh"
fi
t5=$(date +%s)
echo "[test] wall: build $((t1-t0))s, fixtures $((t2-t1))s, ctest $((t3-t2))s, sanitizer $((t4-t3))s, fuzz $((t5-t4))s"
