#!/usr/bin/env python3
"""The transformers + PEFT baseline of the GPU run (issue 15; scripts/device-check.sh step
`baseline-peft`): LoRA training throughput and peak memory on the same synthetic shape, sequence
length, micro-batch, rank and targets as `qlora bench`, on the same GPU in the same call.

    python3 bench/train/peft_baseline_cuda.py --preset llama2-7b --seq-len 2048 --batch 1 --steps 4 \
        --out baseline.json

What it trains (as a user of transformers + PEFT would): LlamaForCausalLM built from a LlamaConfig
of the preset's shape with transformers' own random init, directly on the device in bf16 (no 16-bit
checkpoint is read or written), attn_implementation "sdpa", use_cache off, gradient checkpointing
on (use_reentrant=False); PEFT LoraConfig(r, lora_alpha, lora_dropout 0.05, target_modules
"all-linear", task_type CAUSAL_LM) with PEFT's default fp32 adapter weights (autocast_adapter_dtype);
torch.optim.AdamW(lr 1e-4) over the adapter; random token ids, labels = inputs (transformers shifts
them), one row per micro-batch, no padding. Timing: CUDA synchronise around each optimizer step
(forward, backward, step, zero_grad), the first step untimed, tokens/s = batch·seq / mean step time.
Memory: torch.cuda peak allocated / reserved since a reset made after the model and adapter exist
(so weights count, as in `qlora bench`). The base is 16-bit: bitsandbytes (NF4 QLoRA) is not on
the device and its wheel (CUDA libraries inside) does not fit the 64 MiB carry budget.

Writes one JSON object (also printed as the last line); never reports a number it did not measure.
--device cpu with --preset tiny runs the same code on the CPU (the smoke test of this script).
"""
import argparse
import json
import math
import os
import sys
import time

SHAPES = {  # qlora's model/model_config.cpp presets: vocab, hidden, intermediate, layers, heads, kv heads
    "tiny": (32000, 64, 176, 2, 4, 2),
    "small": (32000, 256, 688, 4, 8, 4),
    "llama2-7b": (32000, 4096, 11008, 32, 32, 32),
    "llama2-13b": (32000, 5120, 13824, 40, 40, 40),
}
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12}  # as qlora's peak_flops_for_device_name


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="llama2-7b", choices=sorted(SHAPES))
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--r", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.steps < 2:
        sys.exit("peft_baseline_cuda: --steps must be >= 2 (the first is untimed)")

    t_import = time.perf_counter()
    import torch
    import transformers
    import peft
    from transformers import LlamaConfig, LlamaForCausalLM
    from peft import LoraConfig, get_peft_model

    res = {"what": "transformers+PEFT LoRA, 16-bit base" if a.device != "cpu" else "transformers+PEFT LoRA, fp32 base (CPU smoke run)", "preset": a.preset, "seq_len": a.seq_len,
           "micro_batch_size": a.batch, "lora_r": a.r, "lora_alpha": a.alpha, "steps": a.steps,
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "peft": peft.__version__},
           "import_s": round(time.perf_counter() - t_import, 2)}
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("peft_baseline_cuda: no CUDA device visible")
    res["device"] = torch.cuda.get_device_name(dev) if cuda else "cpu"
    V, H, I, L, nh, nkv = SHAPES[a.preset]
    cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=L,
                      num_attention_heads=nh, num_key_value_heads=nkv, max_position_embeddings=max(4096, a.seq_len),
                      rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, use_cache=False)
    torch.manual_seed(a.seed)
    dtype = torch.bfloat16 if cuda else torch.float32
    t0 = time.perf_counter()
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    with torch.device(dev):
        model = LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa", torch_dtype=dtype)
    torch.set_default_dtype(old)
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=a.r, lora_alpha=a.alpha, lora_dropout=0.05,
                                             target_modules="all-linear", task_type="CAUSAL_LM"))
    model.train()
    if cuda:
        torch.cuda.synchronize()
    res["init_s"] = round(time.perf_counter() - t0, 2)
    trainable = [p for p in model.parameters() if p.requires_grad]
    res["trainable_parameters"] = sum(p.numel() for p in trainable)
    res["adapter_dtype"] = str(trainable[0].dtype).replace("torch.", "")
    opt = torch.optim.AdamW(trainable, lr=1e-4)
    g = torch.Generator(device="cpu").manual_seed(a.seed + 1)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    times, losses = [], []
    for s in range(a.steps):
        ids = torch.randint(0, V, (a.batch, a.seq_len), generator=g).to(dev)
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        losses.append(out.loss.detach().item())
        print(f"step {s + 1}: {times[-1]:.3f} s, loss {losses[-1]:.4f}", flush=True)
    step_s = sum(times[1:]) / len(times[1:])
    res["step_s"] = round(step_s, 4)
    res["tokens_per_s"] = round(a.batch * a.seq_len / step_s, 1)
    res["losses"] = losses
    res["finite"] = all(math.isfinite(x) for x in losses)
    if cuda:
        res["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(dev)
        res["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(dev)
        # MFU as qlora counts it: 4·N_frozen + 6·N_lora + 3 × causal attention 2·nh·hd·T per layer
        kv = H * nkv // nh
        n_frozen = L * (2 * H * H + 2 * H * kv + 3 * H * I) + V * H  # decoder linears + lm_head
        attn = 2.0 * H * a.seq_len * L
        flops = 4.0 * n_frozen + 6.0 * res["trainable_parameters"] + 3 * attn
        peak = next((v for k, v in PEAK_BF16.items() if k in res["device"]), 0)
        res["mfu"] = round(flops * res["tokens_per_s"] / peak, 4) if peak else None
    text = json.dumps(res)
    if a.out:
        with open(a.out + ".tmp", "w") as f:
            f.write(text + "\n")
        os.replace(a.out + ".tmp", a.out)
    print(text)
    if not res["finite"]:
        sys.exit("peft_baseline_cuda: non-finite loss")


if __name__ == "__main__":
    main()
