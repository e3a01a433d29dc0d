#!/usr/bin/env python3
"""The GPU run's tables (issue 15), made from what scripts/device-check.sh left in its run folder.

    python3 scripts/device-report.py --run build-device/run --out $OUT [--mode device|dry|fake]

Reads (each optional: whatever a step did not leave is reported as "pending" with that step's
status, never estimated): steps.tsv, meta.txt, env.txt, tests.log, parity.log, bench.txt
(bench_quant4), bench-7b.csv + bench-7b.smi, bench-13b.csv + bench-13b.smi, bench-8b.csv + bench-8b.smi, baseline.json.
Writes OUT/report.json (every number, with the step statuses) and OUT/report.md (the tables that
scripts/device-append-docs.py appends to docs/memory.md and docs/performance.md), and prints
report.md. Standard library only (the device's python3 has no extra packages for this).

Table columns per `qlora bench` point: peak allocated and peak reserved (torch caching allocator),
the estimate of each (`qlora estimate`'s terms without the CUDA context constant; the reserved one adds
the allocator's segment rounding), their errors, the nvidia-smi memory.used peak while that point ran
(samples every 200 ms, matched by the CSV's start/end times), tokens/s, MFU, and whether the point
fits a 16 GB card: nvidia-smi peak <= 15360 MiB (a T4, the smallest 16 GB card: its memory.total), or without nvidia-smi
peak reserved + 768 MiB (the unmeasured context placeholder, marked so).
"""
import argparse
import csv
import datetime
import json
import os
import re
import sys

CARD_16GB_MIB = 15360  # T4 memory.total, the smallest 16 GB card (trainer/estimate.cpp common_gpu_cards)
CTX_PLACEHOLDER_MIB = 768
GiB = 1 << 30
MiB = 1 << 20


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def steps_of(run):
    st = {}
    for line in (read(os.path.join(run, "steps.tsv")) or "").splitlines():
        parts = line.split("\t")
        if len(parts) >= 3:
            st[parts[0]] = {"status": parts[1], "seconds": int(parts[2] or 0), "note": parts[3] if len(parts) > 3 else ""}
    return st


def pending(steps, name):
    s = steps.get(name)
    return f"pending (step {name}: {s['status']})" if s else f"pending (step {name} not reached)"


def gtest_cases(text, pattern):
    out = {}
    for m in re.finditer(r"^\[ +(OK|FAILED|SKIPPED) +\] (" + pattern + r")\b", text or "", re.M):
        out[m.group(2)] = m.group(1)
    return out


def smi_samples(path):
    """[(unix_s, MiB)] from 'YYYY/MM/DD HH:MM:SS.fff, MiB' lines (the device's local time)."""
    out = []
    for line in (read(path) or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2:
            continue
        try:
            t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            out.append((t, int(parts[1])))
        except ValueError:
            continue
    return out


def bench_rows(path, smi):
    text = read(path)
    if not text:
        return []
    rows = []
    for r in csv.DictReader(text.splitlines()):
        try:
            # an empty field is a value not measured (a point that did not fit, no known peak FLOP/s)
            row = {"seq_len": int(r["seq_len"]), "micro_batch_size": int(r["micro_batch_size"]),
                   "fits": r["fits"] == "true", "tokens_per_s": float(r["tokens_per_s"] or 0),
                   "mfu": float(r["mfu"]) if r["mfu"] else None,
                   "peak_allocated": int(r["measured_peak_bytes"]), "peak_reserved": int(r["measured_reserved_bytes"] or 0),
                   "estimated_reserved": int(r["estimated_bytes"]),
                   "estimated_allocated": int(r.get("estimated_allocated_bytes") or r["estimated_bytes"])}
        except (KeyError, ValueError):
            continue  # a row cut by a kill
        t0, t1 = float(r.get("start_unix_s") or 0), float(r.get("end_unix_s") or 0)
        # samples from the point's start to its end only: the bench empties the allocator's cache
        # after each point, but a window reaching before t0 takes the previous (larger) point's
        # memory.used (the first H200 run, 2026-12-04, read 512x2 at 8192x1's 11085 MiB with 0.3 s of slack)
        inside = [m for (t, m) in smi if t0 <= t <= t1]
        row["smi_peak_mib"] = max(inside) if inside else None
        a, res = row["peak_allocated"], row["peak_reserved"]
        row["error_allocated"] = (row["estimated_allocated"] - a) / a if a > 0 else None
        row["error_reserved"] = (row["estimated_reserved"] - res) / res if res > 0 else None
        if row["smi_peak_mib"] is not None:
            row["fits_16gb"] = row["fits"] and row["smi_peak_mib"] <= CARD_16GB_MIB
            row["fits_16gb_by"] = "nvidia-smi peak"
        elif res > 0:
            row["fits_16gb"] = row["fits"] and res / MiB + CTX_PLACEHOLDER_MIB <= CARD_16GB_MIB
            row["fits_16gb_by"] = f"reserved + {CTX_PLACEHOLDER_MIB} MiB placeholder context"
        else:
            row["fits_16gb"] = None
            row["fits_16gb_by"] = "no CUDA measurement"
        rows.append(row)
    return rows


def dequant_rows(text):
    rows, on = [], False
    for line in (text or "").splitlines():
        if line.startswith("CUDA dequantize"):
            on = True
            continue
        m = re.match(r"^\s*(\d+)x(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", line)
        if on and m:
            rows.append({"shape": f"{m.group(1)}x{m.group(2)}", "deq_us": float(m.group(3)),
                         "deq_gbps": float(m.group(4)), "memcpy_gbps": float(m.group(5)), "ratio": float(m.group(6))})
        elif on and rows and not m:
            on = False
    return rows


def gib(b):
    return f"{b / GiB:.2f}"


def pct(x):
    return "-" if x is None else f"{100 * x:+.1f}%"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", default="device")
    a = ap.parse_args()
    run = a.run
    steps = steps_of(run)
    meta = dict(kv.split("=", 1) for kv in (read(os.path.join(run, "meta.txt")) or "").split() if "=" in kv)
    env = read(os.path.join(run, "env.txt")) or ""
    gpu = next((l.strip() for l in env.splitlines() if "H200" in l or "H100" in l or "NVIDIA" in l), "")
    rep = {"mode": a.mode, "commit": meta.get("commit", "?"), "started": meta.get("started", "?"),
           "date": meta.get("started", "?")[:10], "gpu": gpu, "steps": steps,
           "command": "bash scripts/device-check.sh" + {"device": "", "dry": " --dry-run", "fake": " --fake"}.get(a.mode, "")}

    rep["kernel_cases"] = gtest_cases(read(os.path.join(run, "tests.log")), r"QuantTensor\.Cuda\w*|Cuda\w*\.\w+")
    parity_log = read(os.path.join(run, "parity.log")) or ""
    rep["parity_cases"] = gtest_cases(parity_log, r"Cuda\w*\.\w+")
    rep["parity_gaps"] = re.findall(r"worst relative gap: (.*)", parity_log)
    rep["nccl_cases"] = gtest_cases(read(os.path.join(run, "nccl.log")) or "", r"CudaNccl\.\w+")
    rep["dequant"] = dequant_rows(read(os.path.join(run, "bench.txt")))
    rep["bench_7b"] = bench_rows(os.path.join(run, "bench-7b.csv"), smi_samples(os.path.join(run, "bench-7b.smi")))
    rep["bench_13b"] = bench_rows(os.path.join(run, "bench-13b.csv"), smi_samples(os.path.join(run, "bench-13b.smi")))
    rep["bench_8b"] = bench_rows(os.path.join(run, "bench-8b.csv"), smi_samples(os.path.join(run, "bench-8b.smi")))
    bl = read(os.path.join(run, "baseline.json"))
    rep["baseline"] = json.loads(bl) if bl else None
    fits = [r["seq_len"] for r in rep["bench_7b"] if r["micro_batch_size"] == 1 and r.get("fits_16gb")]
    mb1 = [r for r in rep["bench_7b"] if r["micro_batch_size"] == 1]
    rep["largest_seq_16gb_mb1"] = max(fits) if fits else None

    L = []
    L.append(f"### GPU check {rep['date']} (commit {rep['commit']}, `{rep['command']}`, mode {a.mode})")
    L.append("")
    L.append(f"GPU: {gpu or 'none seen'}. Steps: " +
             ", ".join(f"{k} {v['status']} ({v['seconds']} s)" for k, v in steps.items()) + ".")
    L.append("")
    kc = rep["kernel_cases"]
    L.append("Kernel tests on the GPU (CUDA_LAUNCH_BLOCKING=1): " +
             (", ".join(f"`{k}` {v}" for k, v in sorted(kc.items())) if kc else pending(steps, "kernel-tests")) + ".")
    pc = rep["parity_cases"]
    L.append("CUDA training parity: " +
             (", ".join(f"`{k}` {v}" for k, v in sorted(pc.items())) if pc else pending(steps, "cuda-parity")) +
             (("; gaps: " + "; ".join(rep["parity_gaps"])) if rep["parity_gaps"] else "") + ".")
    nc = rep["nccl_cases"]
    L.append("NCCL smoke (ProcessGroupNCCL forced at world size 1 on cuda:0 vs no process group, byte-identical): " +
             (", ".join(f"`{k}` {v}" for k, v in sorted(nc.items())) if nc else pending(steps, "nccl-smoke")) + ".")
    L.append("")
    L.append("#### Dequantize bandwidth (NF4 bs64 double quant → bf16, best of 20, vs D2D memcpy)")
    L.append("")
    L.append("| shape | deq µs | deq GB/s | D2D memcpy GB/s | fraction of memcpy |")
    L.append("|---|---|---|---|---|")
    if rep["dequant"]:
        for r in rep["dequant"]:
            L.append(f"| {r['shape']} | {r['deq_us']:.1f} | {r['deq_gbps']:.0f} | {r['memcpy_gbps']:.0f} | {r['ratio']:.2f} |")
    else:
        L.append(f"| {pending(steps, 'dequant-bandwidth')} | | | | |")
    L.append("")
    L.append("#### Memory and throughput, `qlora bench` (NF4 bs64 dq, LoRA r=16 all-linear, checkpointing, bf16, 3 steps)")
    L.append("")
    L.append("| model | seq | batch | peak alloc GiB | est. alloc GiB | error | peak reserved GiB | est. reserved GiB | error | nvidia-smi peak MiB | tokens/s | MFU | fits 16 GB |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    def table(rows, name, step):
        if not rows:
            L.append(f"| {name} | {pending(steps, step)} | | | | | | | | | | | |")
            return
        for r in rows:
            if not r["fits"]:
                L.append(f"| {name} | {r['seq_len']} | {r['micro_batch_size']} | out of memory | {gib(r['estimated_allocated'])} | | | {gib(r['estimated_reserved'])} | | | | | no |")
                continue
            f16 = "-" if r["fits_16gb"] is None else ("yes" if r["fits_16gb"] else "no")
            if r["fits_16gb_by"] != "nvidia-smi peak" and r["fits_16gb"] is not None:
                f16 += " (placeholder context)"
            L.append(f"| {name} | {r['seq_len']} | {r['micro_batch_size']} | {gib(r['peak_allocated'])} | "
                     f"{gib(r['estimated_allocated'])} | {pct(r['error_allocated'])} | {gib(r['peak_reserved'])} | "
                     f"{gib(r['estimated_reserved'])} | {pct(r['error_reserved'])} | "
                     f"{r['smi_peak_mib'] if r['smi_peak_mib'] is not None else '-'} | {r['tokens_per_s']:.0f} | "
                     f"{'-' if r['mfu'] is None else format(100 * r['mfu'], '.1f') + '%'} | {f16} |")
    table(rep["bench_7b"], "llama2-7b", "bench-7b")
    table(rep["bench_13b"], "llama2-13b", "bench-13b")
    table(rep["bench_8b"], "llama3-8b", "bench-8b")
    L.append("")
    if rep["largest_seq_16gb_mb1"] is not None:
        L.append(f"Largest measured 7B context that fits 16 GB at micro-batch 1: {rep['largest_seq_16gb_mb1']} tokens.")
    elif mb1:
        L.append("Largest measured 7B context that fits 16 GB at micro-batch 1: none of the measured points.")
    else:
        L.append("Largest 7B context that fits 16 GB at micro-batch 1: " + pending(steps, "bench-7b") + ".")
    L.append("")
    L.append("#### Against transformers + PEFT (same GPU, same call; llama2-7b shape, seq 2048 × 1, r 16 all-linear, checkpointing)")
    L.append("")
    b = rep["baseline"]
    ours = next((r for r in rep["bench_7b"] if r["seq_len"] == 2048 and r["micro_batch_size"] == 1 and r["fits"]), None)
    L.append("| run | base | tokens/s | peak alloc GiB | peak reserved GiB |")
    L.append("|---|---|---|---|---|")
    L.append("| qlora-cpp | NF4 (4-bit) | " + (f"{ours['tokens_per_s']:.0f} | {gib(ours['peak_allocated'])} | {gib(ours['peak_reserved'])} |"
                                              if ours else f"{pending(steps, 'bench-7b')} | | |"))
    if b and "tokens_per_s" in b:
        L.append(f"| transformers {b['versions']['transformers']} + PEFT {b['versions']['peft']} | bf16 (16-bit) | "
                 f"{b['tokens_per_s']:.0f} | {gib(b.get('peak_allocated_bytes', 0))} | {gib(b.get('peak_reserved_bytes', 0))} |")
    else:
        L.append(f"| transformers + PEFT | bf16 | {pending(steps, 'baseline-peft')} | | |")
    if ours and b and b.get("tokens_per_s"):
        rep["throughput_ratio_vs_peft"] = ours["tokens_per_s"] / b["tokens_per_s"]
        L.append("")
        L.append(f"Throughput ratio qlora-cpp / transformers+PEFT: {rep['throughput_ratio_vs_peft']:.2f} "
                 "(4-bit base against a 16-bit base; bitsandbytes NF4 was not on the device).")
    text = "\n".join(L) + "\n"
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "report.json"), "w") as f:
        json.dump(rep, f, indent=1)
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
