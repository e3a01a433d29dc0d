#!/usr/bin/env python3
"""Python reference for bench_data: the same work with transformers' LlamaTokenizer.

Usage: bench_data_reference.py <data.json> <tokenizer.model> [reps=5] [templates=alpaca,chatml] [sequence_len=2048]

Tokenizer: transformers 5.x LlamaTokenizer(legacy=True) built from the same tokenizer.model (the
parity reference of data/tokenizer.h; a Rust `tokenizers` fast tokenizer underneath). Each alpaca
record becomes user = instruction [+ "\\n\\n" + input], assistant = output, rendered with the exact
strings of docs/data.md ("<s>"/"</s>" written as text and split out as special ids by the tokenizer,
as apply_chat_template output is tokenised); labels = id for tokens whose first character lies in a
trainable span (assistant content + its suffix + EOS), else -100 (offsets from the tokenizer);
examples longer than sequence_len or without a trainable token are dropped, as `truncation: drop`.

Stages (each repeated `reps` times after one warm-up; best and median wall-clock records/s, and
best process-CPU records/s, CPU time summed over the tokenizer's threads):
  load      json.load + render + tokenise + labels + length policy
  read      json.load + record normalisation only
  tokenize  render + tokenise + labels on records already read, one tokenizer call per example
  batched   same, one tokenizer call for all examples (the Rust tokenizer may use every core)
Output: a table, then `RESULT <stage> <template> <best> <median> <records> <tokens> <trainable> <cpu_best>`.
"""
import json, os, shutil, statistics, sys, tempfile, time

ALPACA_SYSTEM = ("Below is an instruction that describes a task. "
                 "Write a response that appropriately completes the request.")


def read(paths):
    """The records of the comma-separated files in `paths`, concatenated in order (data.train as a list)."""
    recs = [r for path in paths.split(",") if path for r in json.load(open(path, encoding="utf-8"))]
    out = []
    for r in recs:
        u = r["instruction"] + ("\n\n" + r["input"] if r.get("input") else "")
        out.append((r.get("system") or "", u, r["output"]))
    return out


def render(template, system, user, assistant, bos="<s>", eos="</s>"):
    """Rendered string and its trainable [start, end) character span (docs/data.md)."""
    if template == "alpaca":
        s = bos + (system or ALPACA_SYSTEM) + "\n\n" + "### Instruction:\n" + user + "\n\n### Response:\n"
        a = len(s)
        s += assistant + eos
        return s, a, len(s)
    if template == "chatml":
        s = bos
        if system:
            s += "<|im_start|>system\n" + system + "<|im_end|>\n"
        s += "<|im_start|>user\n" + user + "<|im_end|>\n" + "<|im_start|>assistant\n"
        a = len(s)
        s += assistant + "<|im_end|>" + eos
        e = len(s)
        return s + "\n", a, e
    raise ValueError(template)


def labels_of(ids, offsets, a, e):
    return [i if a <= o[0] < e else -100 for i, o in zip(ids, offsets)]


def build(tok, recs, template, seq_len, batched=False):
    rendered = [render(template, *r) for r in recs]
    if batched:
        enc = tok([r[0] for r in rendered], add_special_tokens=False, return_offsets_mapping=True)
        encs = zip(enc["input_ids"], enc["offset_mapping"])
    else:
        encs = ((x["input_ids"], x["offset_mapping"]) for x in
                (tok(r[0], add_special_tokens=False, return_offsets_mapping=True) for r in rendered))
    out = []
    for (s, a, e), (ids, offs) in zip(rendered, encs):
        if len(ids) > seq_len:
            continue
        labels = labels_of(ids, offs, a, e)
        if all(l == -100 for l in labels):
            continue
        out.append((ids, labels))
    return out


def time_reps(reps, fn):
    """Best and median wall seconds, best process CPU seconds (all threads) of `reps` runs."""
    fn()
    t, c = [], []
    for _ in range(reps):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
        c.append(time.process_time() - c0)
    return min(t), statistics.median(t), min(c)


def counts(exs):
    return sum(len(i) for i, _ in exs), sum(sum(l != -100 for l in ls) for _, ls in exs)


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    data, model = sys.argv[1], sys.argv[2]
    reps = max(1, int(sys.argv[3])) if len(sys.argv) > 3 else 5
    templates = [t for t in (sys.argv[4] if len(sys.argv) > 4 else "alpaca,chatml").split(",") if t]
    seq_len = int(sys.argv[5]) if len(sys.argv) > 5 else 2048

    import transformers
    from transformers import LlamaTokenizer
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        shutil.copy(model, os.path.join(d, "tokenizer.model"))
        tok = LlamaTokenizer.from_pretrained(d, legacy=True)
    tok_load = time.perf_counter() - t0
    print(f"bench_data_reference: {data}, transformers {transformers.__version__} {type(tok).__name__}(legacy=True) "
          f"from {model} (loaded in {tok_load:.3f} s), sequence_len {seq_len}, {reps} reps (+1 warm-up)")

    rows = []
    for tmpl in templates:
        res = {}
        lb, lm, lc = time_reps(reps, lambda: res.__setitem__("load", build(tok, read(data), tmpl, seq_len)))
        recs = read(data)
        n = len(recs)
        rows.append(("load", tmpl, n / lb, n / lm, n / lc, n, *counts(res.pop("load"))))
        rb, rm, rc = time_reps(reps, lambda: read(data))
        rows.append(("read", tmpl, n / rb, n / rm, n / rc, n, 0, 0))
        tb, tm, tc = time_reps(reps, lambda: res.__setitem__("tok", build(tok, recs, tmpl, seq_len)))
        rows.append(("tokenize", tmpl, n / tb, n / tm, n / tc, n, *counts(res.pop("tok"))))
        bb, bm, bc = time_reps(reps, lambda: res.__setitem__("bat", build(tok, recs, tmpl, seq_len, batched=True)))
        rows.append(("batched", tmpl, n / bb, n / bm, n / bc, n, *counts(res.pop("bat"))))

    print(f"{'stage':<9} {'template':<8} {'best ex/s':>12} {'median ex/s':>12} {'cpu ex/s':>12} {'records':>8} "
          f"{'tokens':>9} {'trainable':>10} {'best tok/s':>12}")
    for st, tm, b, m, c, n, nt, ntr in rows:
        print(f"{st:<9} {tm:<8} {b:12.1f} {m:12.1f} {c:12.1f} {n:8d} {nt:9d} {ntr:10d} {b * nt / n if n else 0:12.0f}")
    for st, tm, b, m, c, n, nt, ntr in rows:
        print(f"RESULT {st} {tm} {b:.3f} {m:.3f} {n} {nt} {ntr} {c:.3f}")


if __name__ == "__main__":
    main()
