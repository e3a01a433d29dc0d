#!/usr/bin/env bash
# Data pipeline throughput, C++ (bench_data) vs the Python reference (bench_data_reference.py),
# same file, tokenizer, templates, sequence_len and repetitions; prints both tables and the ratio.
#   bench/data/run.sh [data.json[,more.json...]] [tokenizer.model] [reps=10] [templates=alpaca,chatml] [sequence_len=2048]
# Env: QLORA_BUILD (build dir holding bench/data/bench_data, default ./build), QLORA_VENV python.
# Build first: QLORA_TARGETS=bench_data scripts/build.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/env.sh"
DATA="${1:-$QLORA_SHARED/data/alpaca_en_demo.json}"
TOK="${2:-$QLORA_SHARED/tokenizers/llama2/tokenizer.model}"
REPS="${3:-10}"
TEMPLATES="${4:-alpaca,chatml}"
SEQ="${5:-2048}"
BIN="${BENCH_DATA_BIN:-$QLORA_BUILD/bench/data/bench_data}"
PY="${QLORA_PYTHON:-$QLORA_VENV/bin/python}"
[ -x "$BIN" ] || { echo "run.sh: $BIN missing; build it with QLORA_TARGETS=bench_data scripts/build.sh" >&2; exit 1; }

tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
echo "== $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== C++: $BIN"
"$BIN" "$DATA" "$TOK" "$REPS" "$TEMPLATES" "$SEQ" | tee "$tmp/cpp"
echo "== Python: $PY $(dirname "${BASH_SOURCE[0]}")/bench_data_reference.py"
"$PY" "$(dirname "${BASH_SOURCE[0]}")/bench_data_reference.py" "$DATA" "$TOK" "$REPS" "$TEMPLATES" "$SEQ" | tee "$tmp/py"

echo "== ratio C++ / Python (examples/s; >1 = C++ faster; best/med = wall clock, cpu = best process CPU time)"
echo "   parity ok = same total tokens and trainable tokens over the kept examples"
awk '
  FNR == NR && $1 == "RESULT" { cb[$2" "$3] = $4; cm[$2" "$3] = $5; cc[$2" "$3] = $9; ct[$2" "$3] = $7" "$8; next }
  $1 == "RESULT"              { pb[$2" "$3] = $4; pm[$2" "$3] = $5; pc[$2" "$3] = $9; pt[$2" "$3] = $7" "$8; order[++n] = $2" "$3 }
  END {
    printf "%-9s %-8s %-8s %10s %10s %10s %10s %10s %10s %6s %6s %6s  %s\n", "stage", "template", "python",
           "C++ best", "py best", "C++ med", "py med", "C++ cpu", "py cpu", "best x", "med x", "cpu x", "parity"
    for (i = 1; i <= n; ++i) {
      k = order[i]; split(k, a, " ")
      ck = (a[1] == "batched") ? "tokenize " a[2] : k    # C++ has one tokenize row: compare it to both
      if (!(ck in cb)) continue
      par = (a[1] == "read") ? "-" : (ct[ck] == pt[k] ? "ok" : "DIFF C++ " ct[ck] " py " pt[k])
      printf "%-9s %-8s %-8s %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f %6.2f %6.2f %6.2f  %s\n",
             (a[1] == "batched" ? "tokenize" : a[1]), a[2], (a[1] == "batched" ? "batched" : "per-ex"),
             cb[ck], pb[k], cm[ck], pm[k], cc[ck], pc[k], cb[ck] / pb[k], cm[ck] / pm[k], cc[ck] / pc[k], par
    }
  }' "$tmp/cpp" "$tmp/py"
