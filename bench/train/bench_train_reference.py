#!/usr/bin/env python3
"""The Python reference side of bench/train/run.sh: LoRA / QLoRA training throughput with
transformers + PEFT + bitsandbytes on CPU, on the same model directory, data and batch geometry as
the `qlora train` run it is compared with.

    python bench/train/bench_train_reference.py --model DIR --data train.json --quant nf4 \
        --steps 30 --batch 8 --seq 128 --r 16 --alpha 32 --lr 2e-3 --warmup 2

Data: alpaca records rendered with the alpaca template exactly as qlora's data/template.cpp does
("{system}\\n\\n### Instruction:\\n{instruction}[\\n\\n{input}]\\n\\n### Response:\\n" + output + EOS,
BOS first when the tokenizer has one), tokenised with the model directory's tokenizer.model through
sentencepiece, or its tokenizer.json through `tokenizers` (special tokens from tokenizer_config.json)
(prompt and response encoded separately, as qlora encodes the template's pieces); labels -100 on the prompt and
on padding; examples longer than --seq dropped (qlora's truncation: drop); rows shuffled (seed 42);
each micro-batch right-padded to its longest row (qlora's collate). Optimizer torch.optim.AdamW
(betas 0.9/0.999, eps 1e-8, weight decay 0), constant lr. --quant nf4 loads the model with
BitsAndBytesConfig(load_in_4bit, nf4, double quant, compute dtype fp32); --quant none loads it fp32.

Prints one JSON line: steps, tokens (non-padding tokens, as qlora's summary counts them), the
seconds of the steps after the --warmup first ones, steps_per_s and tokens_per_s over those steps,
and the median step time of those steps (median_step_s, median_tokens_per_s = mean tokens per step /
median step time: robust to the stalls a loaded machine adds).
"""
import argparse
import json
import os
import random
import statistics
import sys
import time

import torch

ALPACA_SYSTEM = ("Below is an instruction that describes a task. "
                 "Write a response that appropriately completes the request.")


class Tok:
    """encode(text) -> ids without special tokens; bos_id / eos_id (None when the model has none);
    add_bos: the tokenizer prepends its BOS itself (qlora's rule for its own templates, docs/data.md)."""

    def __init__(self, model_dir):
        spm_path = os.path.join(model_dir, "tokenizer.model")
        if os.path.exists(spm_path):
            import sentencepiece as spm
            sp = spm.SentencePieceProcessor(model_file=spm_path)
            self.encode = sp.encode
            self.bos_id = sp.bos_id() if sp.bos_id() >= 0 else None
            self.eos_id = sp.eos_id()
            self.pad_id = sp.pad_id() if sp.pad_id() >= 0 else sp.eos_id()
            self.add_bos = self.bos_id is not None  # LlamaTokenizer's add_bos_token default
            return
        from tokenizers import Tokenizer
        tk = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        with open(os.path.join(model_dir, "tokenizer_config.json")) as f:
            tc = json.load(f)

        def special(key):
            v = tc.get(key)
            if isinstance(v, dict):
                v = v.get("content")
            return tk.token_to_id(v) if v else None

        self.encode = lambda text: tk.encode(text, add_special_tokens=False).ids
        self.bos_id, self.eos_id = special("bos_token"), special("eos_token")
        self.add_bos = self.bos_id is not None and tk.encode("a", add_special_tokens=True).ids[:1] == [self.bos_id]
        pad = special("pad_token")
        self.pad_id = pad if pad is not None else self.eos_id


def load_examples(path, sp, seq):
    with open(path) as f:
        recs = json.load(f) if path.endswith(".json") else [json.loads(l) for l in f if l.strip()]
    out = []
    for r in recs:
        user = r["instruction"] + ("\n\n" + r["input"] if r.get("input") else "")
        prompt = (r.get("system") or ALPACA_SYSTEM) + "\n\n" + "### Instruction:\n" + user + "\n\n### Response:\n"
        p = ([sp.bos_id] if sp.add_bos else []) + sp.encode(prompt)
        a = sp.encode(r["output"]) + [sp.eos_id]
        ids = p + a
        if len(ids) > seq:
            continue
        out.append((ids, [-100] * len(p) + a))
    return out


def batches(examples, bsz, pad_id, seed):
    rng = random.Random(seed)
    while True:
        order = list(range(len(examples)))
        rng.shuffle(order)
        for i in range(0, len(order) - bsz + 1, bsz):
            rows = [examples[j] for j in order[i:i + bsz]]
            T = max(len(ids) for ids, _ in rows)
            ids = torch.full((bsz, T), pad_id, dtype=torch.long)
            labels = torch.full((bsz, T), -100, dtype=torch.long)
            mask = torch.zeros((bsz, T), dtype=torch.long)
            for k, (x, y) in enumerate(rows):
                ids[k, :len(x)] = torch.tensor(x)
                labels[k, :len(y)] = torch.tensor(y)
                mask[k, :len(x)] = 1
            yield ids, labels, mask


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--quant", choices=["nf4", "none"], default="nf4")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--r", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the timing")
    args = ap.parse_args()

    from transformers import BitsAndBytesConfig, LlamaForCausalLM
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    sp = Tok(args.model)
    examples = load_examples(args.data, sp, args.seq)
    pad_id = sp.pad_id

    kw = {"torch_dtype": torch.float32}
    if args.quant == "nf4":
        kw["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.float32)
        kw["device_map"] = {"": "cpu"}
    model = LlamaForCausalLM.from_pretrained(args.model, **kw)
    model.config.use_cache = False
    lcfg = LoraConfig(r=args.r, lora_alpha=args.alpha, lora_dropout=0.0, target_modules="all-linear",
                      bias="none", task_type="CAUSAL_LM")
    pm = get_peft_model(model, lcfg)
    params = [p for p in pm.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    pm.train()

    it = batches(examples, args.batch, pad_id, 42)
    timed_s, timed_tokens, tokens, losses, step_s = 0.0, 0, 0, [], []
    for step in range(args.steps):
        ids, labels, mask = next(it)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = pm(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        n = int(mask.sum())
        tokens += n
        losses.append(loss.item())
        if step >= args.warmup:
            timed_s += dt
            step_s.append(dt)
            timed_tokens += n
    timed_steps = args.steps - args.warmup
    print(json.dumps({"impl": "transformers+peft+bnb", "quant": args.quant, "steps": args.steps,
                      "tokens": tokens, "timed_steps": timed_steps, "timed_seconds": timed_s,
                      "steps_per_s": timed_steps / timed_s, "tokens_per_s": timed_tokens / timed_s,
                      "median_step_s": statistics.median(step_s),
                      "median_tokens_per_s": timed_tokens / timed_steps / statistics.median(step_s),
                      "first_loss": losses[0], "final_loss": losses[-1],
                      "threads": torch.get_num_threads(), "examples": len(examples),
                      "trainable_tokens": sum(sum(1 for y in lab if y != -100) for _, lab in examples)}))


if __name__ == "__main__":
    sys.exit(main())
