#!/usr/bin/env bash
# The README's main command: sets everything up, builds, and runs the quickstart job end to end:
#   1. make a synthetic support-ticket triage dataset (make_corpus.py: 2,000 train, 300 held out)
#   2. `qlora init-model --preset tiny` with a tokenizer trained on that corpus (random weights)
#   3. `qlora eval --metric exact_match` on the held-out tickets: the untrained model (~0%)
#   4. `qlora train examples/quickstart/qlora.yaml` (NF4 base, LoRA on all linears, a few minutes)
#   5. `qlora eval --metric exact_match --adapter`: the trained adapter
# and fails (exit 1) unless accuracy after >= before + 0.5 (the asserted bar; measured runs: docs/training.md).
# Outputs go to runs/quickstart/ (override with QLORA_QUICKSTART_DIR); QLORA_BUILD picks the build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/scripts/env.sh"
if [ -z "${QLORA_SKIP_BUILD:-}" ]; then QLORA_TARGETS=qlora "$ROOT/scripts/build.sh"; fi
QLORA="$QLORA_BUILD/trainer/qlora"

OUT="${QLORA_QUICKSTART_DIR:-$ROOT/runs/quickstart}"
rm -rf "$OUT/model" "$OUT/adapter" "$OUT/data"
mkdir -p "$OUT"
t0=$(date +%s)
"$QLORA_VENV/bin/python" "$ROOT/examples/quickstart/make_corpus.py" --out "$OUT/data"
"$QLORA" init-model --preset tiny --out "$OUT/model" --train-tokenizer "$OUT/data/corpus.txt" --vocab-size 1000 --seed 0
SETS=(--set "output_dir=$OUT/adapter" --set "model.path=$OUT/model"
      --set "data.train=$OUT/data/train.json" --set "data.eval=$OUT/data/eval.json")
CFG="$ROOT/examples/quickstart/qlora.yaml"

echo "--- before training: the random base model (an untrained adapter, B = 0, is the same function) ---"
"$QLORA" eval "$CFG" "${SETS[@]}" --metric exact_match --out "$OUT/eval_before.json"
"$QLORA" train "$CFG" "${SETS[@]}"
echo "--- after training ---"
"$QLORA" eval "$CFG" "${SETS[@]}" --metric exact_match --adapter "$OUT/adapter" --out "$OUT/eval_after.json"
PROMPT=$'Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n### Instruction:\nTriage this support ticket: give its topic and urgency.\n\nHello, my printer 1234 is jammed again, this is an emergency. Thanks.\n\n### Response:\n'
echo "--- generate with the adapter (expect: topic: hardware, urgency: urgent) ---"
"$QLORA" generate "$OUT/model" --adapter "$OUT/adapter" --max-new-tokens 16 --prompt "$PROMPT"

"$QLORA_VENV/bin/python" - "$OUT/eval_before.json" "$OUT/eval_after.json" "$(( $(date +%s) - t0 ))" <<'EOF'
import json, sys
b, a = (json.load(open(p))["exact_match"]["accuracy"] for p in sys.argv[1:3])
print(f"quickstart: exact-match accuracy on 300 held-out tickets: before {b:.3f}, after {a:.3f} "
      f"({sys.argv[3]} s for data, model, evals and training)")
if a < b + 0.5:
    sys.exit(f"quickstart: FAILED: accuracy after training ({a:.3f}) must be >= before + 0.5 ({b:.3f} + 0.5)")
EOF
