#!/usr/bin/env bash
# libFuzzer runs of the untrusted-input parsers under ASan+UBSan (docs/status.md, "Fuzzing"):
#   fuzz_safetensors  safetensors header + tensor table (common/safetensors.cpp)
#   fuzz_dataset      JSON / JSONL / .txt dataset readers (data/reader.cpp), and generation_config.json
#                     (model/generation_config.cpp), --prompts files and the chat-template lexer
#                     (data/template.cpp, template_text_hash) on the same bytes
#   fuzz_config       YAML training config + the to_yaml round trip (config/config.cpp)
# Builds them with clang into build-fuzz (-DQLORA_FUZZ=ON: torch-free libraries only), seeds each
# from tests/badinput/ and tests/fuzz/corpus/, runs each for QLORA_FUZZ_SECONDS (default 60),
# QLORA_FUZZ_JOBS at a time (default 2), and fails on any crash, sanitizer report, leak, timeout or
# escaped exception, printing the log tail and the saved input. scripts/test.sh calls it.
#   QLORA_FUZZ_SECONDS=600 bash scripts/fuzz.sh     # a longer run; the working corpus persists in build-fuzz/corpus
#   QLORA_FUZZ_TARGETS="fuzz_config" bash scripts/fuzz.sh
# Under CI (CI=true, set by .ci/run) or with QLORA_FUZZ_RUNS set, each target instead runs a fixed
# number of inputs (QLORA_FUZZ_RUNS, default 50000) from a fixed seed (QLORA_FUZZ_SEED, default 1)
# on a fresh working corpus: the same inputs on every machine, so a CI result is reproducible here
# with `CI=true bash scripts/fuzz.sh`, and a run never fails for a bug it happened to draw only this
# once. Exploring for new bugs is the timed mode's job (run it after touching a parser).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
FB="${QLORA_BUILD_FUZZ:-$QLORA_ROOT/build-fuzz}"
SECS="${QLORA_FUZZ_SECONDS:-60}"
JOBS="${QLORA_FUZZ_JOBS:-2}"
TARGETS=(${QLORA_FUZZ_TARGETS:-fuzz_safetensors fuzz_dataset fuzz_config})
CXX_FUZZ="${QLORA_FUZZ_CXX:-$(command -v clang++-14 || command -v clang++)}"
CC_FUZZ="${QLORA_FUZZ_CC:-$(command -v clang-14 || command -v clang)}"

mkdir -p "$FB"
if [ ! -f "$FB/Makefile" ]; then
  cmake -S "$QLORA_ROOT" -B "$FB" -DQLORA_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER="$CC_FUZZ" -DCMAKE_CXX_COMPILER="$CXX_FUZZ" -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
    > "$FB/configure.log" 2>&1 || { cat "$FB/configure.log"; exit 1; }
fi
cmake --build "$FB" -j"${QLORA_JOBS:-$(nproc)}" --target "${TARGETS[@]}"

# Seeds (rebuilt each run; read-only input to libFuzzer). fuzz_dataset's first byte selects the
# file suffix (0 .jsonl, 1 .json, 2 .txt) and bit 5 skip_invalid (fuzz_dataset.cpp).
S="$FB/seeds"
rm -rf "$S"
mkdir -p "$S/fuzz_safetensors" "$S/fuzz_dataset" "$S/fuzz_config"
cp "$QLORA_ROOT"/tests/fuzz/corpus/safetensors/* "$S/fuzz_safetensors/"
for f in "$QLORA_ROOT"/tests/badinput/data/* "$QLORA_ROOT"/tests/fuzz/corpus/dataset/*; do
  case "$f" in *.jsonl) sel=0 ;; *.json) sel=1 ;; *.txt) sel=2 ;; *) continue ;; esac
  b="$(basename "$f")"
  { printf "\\x0$sel"; cat "$f"; } > "$S/fuzz_dataset/$b"
  { printf "\\x2$sel"; cat "$f"; } > "$S/fuzz_dataset/skip_$b"
done
# the family chat templates (fuzz_dataset also lexes its bytes as a jinja template)
for f in "$QLORA_ROOT"/tests/fixtures/chat_templates/*.jinja; do
  { printf "\\x00"; cat "$f"; } > "$S/fuzz_dataset/$(basename "$f")"
done
i=0
while IFS= read -r f; do
  cp "$f" "$S/fuzz_config/$((i++))_$(basename "$f")"
done < <(find "$QLORA_ROOT/tests/badinput/configs" "$QLORA_ROOT/configs" "$QLORA_ROOT/examples" "$QLORA_ROOT/tests/fuzz/corpus/config" \
           -name '*.yaml' 2>/dev/null | sort)
# Inputs a fuzzer once crashed on (fixed since) are seeds too, so every run re-checks them.
for t in "${TARGETS[@]}"; do
  d="$QLORA_ROOT/tests/fuzz/corpus/crashes/${t#fuzz_}"
  [ -d "$d" ] && cp "$d"/* "$S/$t/" 2>/dev/null || true
done

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
L="$FB/logs"
mkdir -p "$L" "$FB/artifacts"
FIXED=""
if [ "${CI:-}" = true ] || [ -n "${QLORA_FUZZ_RUNS:-}" ]; then
  FIXED=1
  RUNS="${QLORA_FUZZ_RUNS:-50000}"
  SEED="${QLORA_FUZZ_SEED:-1}"
fi
run_one() {
  local t="$1" dict=json budget
  [ "$t" = fuzz_config ] && dict=yaml
  if [ -n "$FIXED" ]; then
    rm -rf "$FB/corpus/$t"
    budget=(-runs="$RUNS" -seed="$SEED" -max_total_time=900)  # the time cap only guards a stuck run
  else
    budget=(-max_total_time="$SECS")
  fi
  mkdir -p "$FB/corpus/$t"
  "$FB/tests/fuzz/$t" "${budget[@]}" -timeout=20 -rss_limit_mb=3072 -max_len=16384 -print_final_stats=1 \
    -dict="$QLORA_ROOT/tests/fuzz/dict/$dict.dict" -artifact_prefix="$FB/artifacts/$t-" \
    "$FB/corpus/$t" "$S/$t" > "$L/$t.log" 2>&1
}
declare -A pid
fail=0
for t in "${TARGETS[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 1; done
  if [ -n "$FIXED" ]; then echo "[fuzz] $t: $RUNS inputs from seed $SEED"; else echo "[fuzz] $t: ${SECS}s"; fi
  run_one "$t" &
  pid[$t]=$!
done
for t in "${TARGETS[@]}"; do
  if wait "${pid[$t]}"; then
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$L/$t.log" | grep -o '[0-9]*$' || echo "?")
    cov=$(grep -o 'cov: [0-9]*' "$L/$t.log" | tail -1 | grep -o '[0-9]*' || echo "?")
    secs=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$L/$t.log" | grep -o 'in [0-9]*' | grep -o '[0-9]*' || echo "$SECS")
    echo "[fuzz] $t: OK, $execs executions in ${secs}s, coverage $cov edges, corpus $(ls "$FB/corpus/$t" | wc -l) inputs"
  else
    fail=1
    echo "[fuzz] $t: FAILED (log $L/$t.log); last lines:"
    tail -40 "$L/$t.log"
    ls -1 "$FB/artifacts/$t-"* 2>/dev/null | sed 's/^/[fuzz] saved input: /' || true
  fi
done
exit "$fail"
