#!/usr/bin/env python3
"""Appends the GPU run's tables to the docs (issue 15), HERE, after the `run` call returned.

    python3 scripts/device-append-docs.py RESULTS_DIR [--docs docs] [--command "run(...)"]

RESULTS_DIR holds scripts/device-check.sh's report.md and report.json (the run tool's files_at).
docs/memory.md gets the run header, the step statuses and the memory table (peak allocated /
reserved vs `qlora estimate`, nvidia-smi peak, the 16 GB verdict and the largest context that fits);
docs/performance.md (created when missing) gets the header, the dequantize bandwidth table, the
throughput columns of the same table and the transformers + PEFT comparison. Each appended section
names the date, the commit and the command; whatever the run did not measure stays "pending (...)"
exactly as the report says. Refuses a dry-run or fake report unless --allow-nondevice (tests).
"""
import argparse
import json
import os
import sys


def sections(md):
    """{'head': text before the first '#### ', '<heading>': body} from report.md."""
    out, cur, buf = {}, "head", []
    for line in md.splitlines():
        if line.startswith("#### "):
            out[cur] = "\n".join(buf).strip("\n")
            cur, buf = line[5:].strip(), [line]
        else:
            buf.append(line)
    out[cur] = "\n".join(buf).strip("\n")
    return out


def pick(secs, prefix):
    return next((v for k, v in secs.items() if k.startswith(prefix)), "")


def append(path, title, text):
    new = not os.path.exists(path)
    with open(path, "a") as f:
        if new:
            f.write(f"# {title}\n\nMeasured results only; every number names its run (date, commit, command).\n")
        f.write("\n" + text.rstrip("\n") + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--docs", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs"))
    ap.add_argument("--command", default="")
    ap.add_argument("--allow-nondevice", action="store_true")
    a = ap.parse_args()
    try:
        md = open(os.path.join(a.results, "report.md")).read()
        rep = json.load(open(os.path.join(a.results, "report.json")))
    except OSError as e:
        sys.exit(f"device-append-docs: {e}")
    if rep.get("mode") != "device" and not a.allow_nondevice:
        sys.exit(f"device-append-docs: {a.results}/report.json is from a {rep.get('mode')} run, not the device")
    secs = sections(md)
    head = secs["head"]
    if a.command:
        head += f"\n\nCall: `{a.command}`."
    mem = pick(secs, "Memory and throughput")
    perf = "\n\n".join(x for x in (pick(secs, "Dequantize bandwidth"), mem, pick(secs, "Against transformers")) if x)
    append(os.path.join(a.docs, "memory.md"), "Memory", head + "\n\n" + mem)
    append(os.path.join(a.docs, "performance.md"), "Performance", head + "\n\n" + perf)
    print(f"appended the {rep.get('date')} run (commit {rep.get('commit')}) to "
          f"{os.path.join(a.docs, 'memory.md')} and {os.path.join(a.docs, 'performance.md')}")


if __name__ == "__main__":
    main()
