#!/usr/bin/env python3
"""Tokenizer encode throughput: ours (bench_tokenizer, C++) vs the Rust `tokenizers` library, one
thread each, same ~10 MB corpus, same run. Not a test; numbers go to docs/data.md.

  bench/tokenizer/run.py [--fixtures build/fixtures] [--bin build/bench/tokenizer/bench_tokenizer]
                         [--mb 10] [--reps 5] [--names smollm2,llama3_bpe,qwen2_bpe,llama2_hf]

Corpus: the texts of ../shared/data (alpaca, c4, glaive, identity) shuffled with a fixed seed and
repeated until --mb MB, one document per JSONL line. Reference: tokenizers Tokenizer.from_file(
tokenizer.json).encode_batch(docs, add_special_tokens=False) with TOKENIZERS_PARALLELISM=false
(serial, inside Rust: no Python per-call cost), best of --reps after a warm-up pass; also
encode() per document from Python. Both sides must produce the same total number of tokens.
"""
import argparse, json, os, random, subprocess, sys, time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SHARED = os.environ.get("QLORA_SHARED", os.path.join(ROOT, "..", "shared"))
sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures"))


def corpus(mb):
    from make_tokenizer_refs import shared_texts
    texts = shared_texts()
    rng = random.Random(10)
    docs, n = [], 0
    while n < mb * 1e6:
        rng.shuffle(texts)
        for t in texts:
            docs.append(t)
            n += len(t.encode("utf-8"))
            if n >= mb * 1e6:
                break
    return docs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default=os.path.join(ROOT, "build", "fixtures"))
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bench", "tokenizer", "bench_tokenizer"))
    ap.add_argument("--mb", type=float, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--names", default="smollm2,llama3_bpe,qwen2_bpe,llama2_hf")
    a = ap.parse_args()
    import tokenizers
    from tokenizers import Tokenizer
    docs = corpus(a.mb)
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    path = os.path.join("/tmp", f"qlora_bench_tokenizer_{os.getpid()}.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    print(f"== {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, load average "
          f"{open('/proc/loadavg').read().split()[:3]}, corpus {len(docs)} docs {nbytes / 1e6:.2f} MB, "
          f"tokenizers {tokenizers.__version__}")
    rows = []
    try:
        for name in a.names.split(","):
            d = os.path.join(a.fixtures, "tokenizers", name)
            # the file, not the dir: like for like with Tokenizer.from_file (a LlamaTokenizer dir is read
            # as transformers reads it, data/tokenizer.h)
            tj = os.path.join(d, "tokenizer.json")
            out = subprocess.run([a.bin, name, tj, path, str(a.reps)], check=True, capture_output=True, text=True).stdout
            print(out.strip())
            res = [l.split() for l in out.splitlines() if l.startswith("RESULT")][0]
            c_best, c_med, c_cpu, c_tok = float(res[2]), float(res[3]), float(res[4]), int(res[5])
            tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
            r_tok = sum(len(e.ids) for e in tok.encode_batch(docs, add_special_tokens=False))  # warm-up
            walls, cpus = [], []
            for _ in range(a.reps):
                w0, p0 = time.perf_counter(), time.process_time()
                tok.encode_batch(docs, add_special_tokens=False)
                walls.append(time.perf_counter() - w0)
                cpus.append(time.process_time() - p0)
            w0 = time.perf_counter()
            for t in docs:
                tok.encode(t, add_special_tokens=False)
            single = time.perf_counter() - w0
            walls.sort(); cpus.sort()
            mb = nbytes / 1e6
            r_best, r_med, r_cpu, r_single = mb / walls[0], mb / walls[len(walls) // 2], mb / cpus[0], mb / single
            print(f"# tokenizers {name}: walls {' '.join('%.3f' % w for w in walls)}, per-doc encode() {single:.3f} s")
            rows.append((name, c_best, c_med, c_cpu, r_best, r_med, r_cpu, r_single, c_tok == r_tok, c_tok))
    finally:
        os.remove(path)
    print("\n| tokenizer | ours MB/s (best / median / cpu) | tokenizers MB/s encode_batch (best / median / cpu) "
          "| tokenizers encode() per doc | ours / tokenizers (best, median, cpu) | same tokens |")
    print("|---|---|---|---|---|---|")
    for n, cb, cm, cc, rb, rm, rc, rs, same, ntok in rows:
        print(f"| {n} | {cb:.1f} / {cm:.1f} / {cc:.1f} | {rb:.1f} / {rm:.1f} / {rc:.1f} | {rs:.1f} | "
              f"{cb / rb:.2f}, {cm / rm:.2f}, {cc / rc:.2f} | {'yes' if same else 'NO'} ({ntok}) |")


if __name__ == "__main__":
    main()
