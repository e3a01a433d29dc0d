#!/usr/bin/env bash
# CPU training throughput: qlora-cpp vs transformers + PEFT (+ bitsandbytes), the same job, same run.
#
#   bash bench/train/run.sh            # MODEL=smollm2 (default) or tiny; QLORA_BUILD, STEPS, WARMUP,
#                                      # BATCH, SEQ, BENCH_DIR override
#
# MODEL=smollm2: the real SmolLM2-135M-Instruct, imported from $QLORA_SMOLLM2_GGUF (scripts/setup.sh
# fetches it) with `qlora import-gguf --dtype fp32`; its byte-level BPE tokenizer.json (the reference
# side reads it with `tokenizers`). MODEL=tiny: a tiny random Llama with a sentencepiece tokenizer
# trained on the data (`qlora init-model --preset tiny --train-tokenizer`).
# Data: the quickstart's ticket corpus (examples/quickstart/make_corpus.py), alpaca template.
# Trains LoRA r=16 / alpha 32 on all linears, micro-batch $BATCH (8), sequence_len $SEQ (128; rows
# padded to the batch's longest), constant lr 2e-3, AdamW, fp32 compute, no checkpoints, no gradient
# checkpointing, $STEPS steps, twice per implementation: NF4 + double quant base, and an unquantized
# (fp32) base:
#   (a) `qlora train` with a config written here; steps/s and tokens/s from metrics.jsonl
#   (b) bench/train/bench_train_reference.py (transformers + PEFT + bitsandbytes on CPU)
# Both time the optimizer steps after the first $WARMUP (non-padding tokens / summed step seconds),
# also the median step time (robust to the stalls of a loaded machine), and print a table with the
# ratio qlora / reference. Both sides see the same examples (the script checks that the example
# counts are equal); the batches differ (each side shuffles with its own generator), so the padded
# lengths differ a little. Work files go to $BENCH_DIR (default a temp dir).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/scripts/env.sh"
PY="${QLORA_PY:-$QLORA_VENV/bin/python}"
QLORA="$QLORA_BUILD/cli/qlora"
MODEL="${MODEL:-smollm2}"
STEPS="${STEPS:-30}"
WARMUP="${WARMUP:-2}"
BATCH="${BATCH:-8}"
SEQ="${SEQ:-128}"
# Idle OpenMP threads sleep instead of spinning (docs/training.md, "OpenMP threads on a busy
# machine"); the same for both sides, set before either starts.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
[ -x "$QLORA" ] || { echo "run.sh: no $QLORA; build it first (QLORA_TARGETS=qlora scripts/build.sh)" >&2; exit 1; }
W="${BENCH_DIR:-$(mktemp -d /tmp/qlora-bench-train.XXXXXX)}"
mkdir -p "$W"
echo "work dir: $W  binary: $QLORA  python: $PY  model: $MODEL  steps: $STEPS (first $WARMUP not timed)"

if [ ! -f "$W/data/train.json" ]; then "$PY" "$ROOT/examples/quickstart/make_corpus.py" --out "$W/data" > /dev/null; fi
if [ ! -f "$W/model/config.json" ]; then
  case "$MODEL" in
    smollm2)
      [ -f "$QLORA_SMOLLM2_GGUF" ] || { echo "run.sh: $QLORA_SMOLLM2_GGUF not found (scripts/setup.sh fetches it)" >&2; exit 1; }
      "$QLORA" import-gguf "$QLORA_SMOLLM2_GGUF" --out "$W/model" --dtype fp32 2> "$W/import.log" ;;
    tiny)
      "$QLORA" init-model --preset tiny --out "$W/model" --train-tokenizer "$W/data/corpus.txt" --vocab-size 1000 \
        --seed 0 2> "$W/init.log" ;;
    *) echo "run.sh: MODEL must be smollm2 or tiny, got $MODEL" >&2; exit 1 ;;
  esac
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
  sequence_len: $SEQ
training:
  micro_batch_size: $BATCH
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
  "$PY" - "$out" "$q" "$WARMUP" "$W/qlora_$q.log" >> "$results" <<'EOF'
import json, re, statistics, sys
out, q, warm = sys.argv[1], sys.argv[2], int(sys.argv[3])
m = re.search(r"data: (\d+) train / \d+ eval examples, (\d+) trainable tokens", open(sys.argv[4]).read())
rows = [json.loads(l) for l in open(out + "/metrics.jsonl")]
s = json.load(open(out + "/summary.json"))
timed = [r for r in rows if r["step"] > warm]
secs = sum(r["step_seconds"] for r in timed)
print(json.dumps({"impl": "qlora-cpp", "quant": q, "steps": s["steps"], "tokens": s["input_tokens"],
                  "timed_steps": len(timed), "timed_seconds": secs, "steps_per_s": len(timed) / secs,
                  "tokens_per_s": sum(r["tokens"] for r in timed) / secs, "first_loss": rows[0]["loss"],
                  "final_loss": s["final_loss"], "wall_seconds": s["wall_seconds"],
                  "median_step_s": statistics.median(r["step_seconds"] for r in timed),
                  "median_tokens_per_s": sum(r["tokens"] for r in timed) / len(timed)
                                         / statistics.median(r["step_seconds"] for r in timed),
                  "examples": int(m.group(1)), "trainable_tokens": int(m.group(2))}))
EOF
  tail -1 "$results"
  echo "--- transformers + PEFT + bitsandbytes ($q) ---"
  "$PY" "$ROOT/bench/train/bench_train_reference.py" --model "$W/model" --data "$W/data/train.json" \
    --quant "$q" --steps "$STEPS" --batch "$BATCH" --seq "$SEQ" --r 16 --alpha 32 --lr 2e-3 --warmup "$WARMUP" \
    2> "$W/ref_$q.log" | tail -1 >> "$results" || { cat "$W/ref_$q.log" >&2; exit 1; }
  tail -1 "$results"
done

"$PY" - "$results" "$MODEL" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
model = sys.argv[2]
by = {(r["impl"], r["quant"]): r for r in rows}
for q in ("nf4", "none"):
    a, b = by[("qlora-cpp", q)], by[("transformers+peft+bnb", q)]
    if (a["examples"], a["trainable_tokens"]) != (b["examples"], b["trainable_tokens"]):
        msg = (f"the two sides saw different data ({q}): qlora {a['examples']} examples / "
               f"{a['trainable_tokens']} trainable tokens, reference {b['examples']} / {b['trainable_tokens']}")
        # tiny: the reference encodes the response with sentencepiece's dummy-prefix space, qlora as
        # part of the text (one token apart per example); only an approximation of the same job.
        if model != "tiny":
            sys.exit("run.sh: " + msg)
        print("note: " + msg)
    else:
        print(f"same data on both sides ({q}): {a['examples']} examples, {a['trainable_tokens']} trainable tokens")
print(f"threads: reference {b['threads']}")
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
