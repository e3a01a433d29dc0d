#!/usr/bin/env bash
# CPU training throughput: qlora-cpp vs transformers + PEFT + bitsandbytes, same tiny job.
#
#   bash bench/train/run.sh            # QLORA_BUILD picks the build (default build/), STEPS=30
#
# Makes the quickstart data (examples/quickstart/make_corpus.py) and a tiny random Llama with a
# tokenizer trained on it (`qlora init-model --preset tiny --train-tokenizer`), then trains LoRA
# r=16 / alpha 32 on all linears, micro-batch 8, sequence_len 128 (rows padded to the batch's
# longest), constant lr 2e-3, AdamW, fp32 compute, no checkpoints, $STEPS steps, twice per
# implementation: NF4 + double quant base, and an unquantized (fp32) base:
#   (a) `qlora train` with a config written here; steps/s and tokens/s from metrics.jsonl
#   (b) bench/train/bench_train_reference.py (transformers + PEFT + bitsandbytes on CPU)
# Both time the optimizer steps after the first $WARMUP (non-padding tokens / summed step seconds),
# also the median step time (robust to the stalls of a loaded machine), and print a table with the
# ratio qlora / reference. Work files go to $BENCH_DIR (default a temp dir).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${QLORA_PY:-/root/.cache/qlora-cpp/venv-de9fff0c7bef/bin/python}"
BUILD="${QLORA_BUILD:-build}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
QLORA="$BUILD/trainer/qlora"
STEPS="${STEPS:-30}"
WARMUP="${WARMUP:-2}"
[ -x "$QLORA" ] || { echo "run.sh: no $QLORA; build it first (QLORA_TARGETS=qlora scripts/build.sh)" >&2; exit 1; }
W="${BENCH_DIR:-$(mktemp -d /tmp/qlora-bench-train.XXXXXX)}"
mkdir -p "$W"
echo "work dir: $W  binary: $QLORA  python: $PY  steps: $STEPS (first $WARMUP not timed)"

if [ ! -f "$W/data/train.json" ]; then "$PY" "$ROOT/examples/quickstart/make_corpus.py" --out "$W/data" > /dev/null; fi
if [ ! -f "$W/model/config.json" ]; then
  "$QLORA" init-model --preset tiny --out "$W/model" --train-tokenizer "$W/data/corpus.txt" --vocab-size 1000 --seed 0 2> "$W/init.log"
fi

write_cfg() {  # $1 = quantization method, $2 = output dir
  cat <<EOF
output_dir: $2
model:
  path: $W/model
  dtype: fp32
quantization:
  method: $1
  double_quant: true
  blocksize: 64
lora:
  r: 16
  alpha: 32
  dropout: 0.0
  target_modules: all-linear
data:
  train: $W/data/train.json
  format: alpaca
  template: alpaca
  sequence_len: 128
training:
  micro_batch_size: 8
  gradient_accumulation_steps: 1
  max_steps: $STEPS
  learning_rate: 2.0e-3
  lr_scheduler: constant
  warmup_steps: 0
  gradient_checkpointing: false
  logging_steps: 10
  seed: 0
checkpoint:
  save_steps: 0
  save_minutes: 0
  resume: never
EOF
}

results="$W/results.jsonl"
: > "$results"
for q in nf4 none; do
  out="$W/qlora_$q"
  rm -rf "$out"
  write_cfg "$q" "$out" > "$W/qlora_$q.yaml"
  echo "--- qlora train ($q) ---"
  "$QLORA" train "$W/qlora_$q.yaml" 2> "$W/qlora_$q.log" || { cat "$W/qlora_$q.log" >&2; exit 1; }
  "$PY" - "$out" "$q" "$WARMUP" >> "$results" <<'EOF'
import json, statistics, sys
out, q, warm = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [json.loads(l) for l in open(out + "/metrics.jsonl")]
s = json.load(open(out + "/summary.json"))
timed = [r for r in rows if r["step"] > warm]
secs = sum(r["step_seconds"] for r in timed)
print(json.dumps({"impl": "qlora-cpp", "quant": q, "steps": s["steps"], "tokens": s["tokens_trained"],
                  "timed_steps": len(timed), "timed_seconds": secs, "steps_per_s": len(timed) / secs,
                  "tokens_per_s": sum(r["tokens"] for r in timed) / secs, "first_loss": rows[0]["loss"],
                  "final_loss": s["final_loss"], "wall_seconds": s["wall_seconds"],
                  "median_step_s": statistics.median(r["step_seconds"] for r in timed),
                  "median_tokens_per_s": sum(r["tokens"] for r in timed) / len(timed)
                                         / statistics.median(r["step_seconds"] for r in timed)}))
EOF
  tail -1 "$results"
  echo "--- transformers + PEFT + bitsandbytes ($q) ---"
  "$PY" "$ROOT/bench/train/bench_train_reference.py" --model "$W/model" --data "$W/data/train.json" \
    --quant "$q" --steps "$STEPS" --batch 8 --seq 128 --r 16 --alpha 32 --lr 2e-3 --warmup "$WARMUP" \
    2> "$W/ref_$q.log" | tail -1 >> "$results" || { cat "$W/ref_$q.log" >&2; exit 1; }
  tail -1 "$results"
done

"$PY" - "$results" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {(r["impl"], r["quant"]): r for r in rows}
print()
print("| base | implementation | steps/s (mean) | tokens/s (mean) | steps/s (median step) | tokens/s (median step) | loss step 1 → last |")
print("|---|---|---|---|---|---|---|")
for q, name in (("nf4", "NF4 + double quant"), ("none", "unquantized (fp32)")):
    for impl in ("qlora-cpp", "transformers+peft+bnb"):
        r = by[(impl, q)]
        print(f"| {name} | {impl} | {r['steps_per_s']:.2f} | {r['tokens_per_s']:,.0f} | "
              f"{1 / r['median_step_s']:.2f} | {r['median_tokens_per_s']:,.0f} | "
              f"{r['first_loss']:.3f} → {r['final_loss']:.3f} |")
    a, b = by[("qlora-cpp", q)], by[("transformers+peft+bnb", q)]
    print(f"| {name} | ratio qlora / reference | {a['steps_per_s'] / b['steps_per_s']:.2f}× | "
          f"{a['tokens_per_s'] / b['tokens_per_s']:.2f}× | {b['median_step_s'] / a['median_step_s']:.2f}× | "
          f"{a['median_tokens_per_s'] / b['median_tokens_per_s']:.2f}× | |")
EOF
