#!/usr/bin/env bash
# The README's main command: sets everything up, builds, and runs the embedded default job.
# Today (foundation stage) the job is: write a tiny random Llama model with a tokenizer trained on
# a small synthetic corpus (`qlora init-model`), describe it (`qlora inspect`), and generate from it
# (`qlora generate`). Outputs go to runs/quickstart/ (override with QLORA_QUICKSTART_DIR).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/scripts/env.sh"
QLORA_TARGETS=qlora "$ROOT/scripts/build.sh"
QLORA="$QLORA_BUILD/trainer/qlora"

OUT="${QLORA_QUICKSTART_DIR:-$ROOT/runs/quickstart}"
mkdir -p "$OUT"
"$QLORA_VENV/bin/python" "$ROOT/examples/quickstart/make_corpus.py" --out "$OUT/corpus.txt"
rm -rf "$OUT/model"
"$QLORA" init-model --preset tiny --out "$OUT/model" --train-tokenizer "$OUT/corpus.txt" --vocab-size 512 --seed 0
"$QLORA" inspect "$OUT/model"
echo "--- generate (random weights: the text is noise until training exists) ---"
"$QLORA" generate "$OUT/model" --prompt "Ticket: my printer is broken" --max-new-tokens 16
