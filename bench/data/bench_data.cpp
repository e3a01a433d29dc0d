// bench_data: throughput of the data pipeline on one file (or a data.train list) with one tokenizer.
//
//   bench_data <data.json[,more.json...]> <tokenizer.model|dir> [reps=5] [templates=alpaca,chatml] [sequence_len=2048]
//
// Several comma-separated files are a data.train list: loaded and read file by file, concatenated.
// For every template, three timings, each repeated `reps` times after one warm-up (best and
// median wall clock, and best process CPU time, which a busy shared machine disturbs less):
//   load      load_datasets end to end: read + parse JSON, render, tokenise, labels, length policy, stats
//   read      read_records only (JSON parse + normalisation), no tokenizer
//   tokenize  build_examples on the records already read: render + tokenise + labels + length policy
// Throughput is records/s of the file (every record of the file is processed each repetition;
// examples dropped by the length policy still count, as they were tokenised). Single thread.
// Output (stdout): a table, then one machine-readable line per row for run.sh:
//   RESULT <stage> <template> <best_eps> <median_eps> <records> <tokens> <trainable> <cpu_best_eps>
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/reader.h"
#include "data/template.h"
#include "data/tokenizer.h"

using namespace qlora::data;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Row {
  std::string stage, tmpl;
  double best = 0, median = 0;  // examples/s (wall clock)
  double cpu_best = 0;           // examples/s from process CPU time (less sensitive to a busy machine)
  int64_t records = 0, tokens = 0, trainable = 0;  // over the kept examples
};

// Tokens and trainable tokens (label != -100) of the kept examples: the parity check of run.sh.
std::pair<int64_t, int64_t> count_tokens(const std::vector<Example>& v) {
  int64_t n = 0, t = 0;
  for (const auto& e : v) {
    n += int64_t(e.input_ids.size());
    for (int32_t l : e.labels) t += l != kIgnoreIndex;
  }
  return {n, t};
}

struct Times {
  double best, median, cpu_best;  // seconds
};

// Times fn() `reps` times (after one untimed warm-up): best and median wall time, best CPU time.
template <class F>
Times time_reps(int reps, F&& fn) {
  fn();
  std::vector<double> t;
  double cpu = 1e30;
  for (int i = 0; i < reps; ++i) {
    const std::clock_t c0 = std::clock();
    const double t0 = now_s();
    fn();
    t.push_back(now_s() - t0);
    cpu = std::min(cpu, double(std::clock() - c0) / CLOCKS_PER_SEC);
  }
  std::sort(t.begin(), t.end());
  const double med = t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
  return {t.front(), med, cpu};
}

std::vector<std::string> split(const std::string& s, char c) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, c);)
    if (!x.empty()) out.push_back(x);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <data.json> <tokenizer.model|dir> [reps=5] [templates=alpaca,chatml] [sequence_len=2048]\n",
                 argv[0]);
    return 2;
  }
  try {
    const std::string data = argv[1], tok_path = argv[2];
    const int reps = argc > 3 ? std::max(1, std::atoi(argv[3])) : 5;
    const auto templates = split(argc > 4 ? argv[4] : "alpaca,chatml", ',');
    const int64_t seq_len = argc > 5 ? std::atoll(argv[5]) : 2048;

    const double t0 = now_s();
    const Tokenizer tok = Tokenizer::from_pretrained(tok_path);
    const double tok_load = now_s() - t0;
    std::printf("bench_data: %s, tokenizer %s (vocab %d, loaded in %.3f s), sequence_len %lld, %d reps (+1 warm-up)\n",
                data.c_str(), tok_path.c_str(), tok.vocab_size(), tok_load, (long long)seq_len, reps);

    std::vector<Row> rows;
    for (const std::string& tmpl : templates) {
      DataOptions opts;
      for (const std::string& f : split(data, ',')) opts.train.push_back(DataSource{f});
      opts.template_name = tmpl;
      opts.sequence_len = seq_len;

      // load_datasets end to end.
      Datasets d;
      const Times lt = time_reps(reps, [&] { d = load_datasets(opts, tok); });
      const int64_t nrec = d.stats.read.records_read;
      const auto [ntok, ntrain] = count_tokens(d.train);
      rows.push_back({"load", tmpl, nrec / lt.best, nrec / lt.median, nrec / lt.cpu_best, nrec, ntok, ntrain});

      // JSON read only.
      std::vector<Record> recs;
      const Times rt = time_reps(reps, [&] {
        recs.clear();
        for (const DataSource& src : opts.train) {
          ReadStats rs;
          std::vector<Record> r = read_records(src.path, options_for(opts, src), &rs);
          recs.insert(recs.end(), std::make_move_iterator(r.begin()), std::make_move_iterator(r.end()));
        }
      });
      const double n = double(recs.size());
      rows.push_back({"read", tmpl, n / rt.best, n / rt.median, n / rt.cpu_best, int64_t(n), 0, 0});

      // render + tokenise + labels on records already in memory.
      std::vector<Example> ex;
      const Times bt = time_reps(reps, [&] {
        DataStats st;
        ex = build_examples(recs, opts, tok, &st);
      });
      const auto [btok, btrain] = count_tokens(ex);
      rows.push_back({"tokenize", tmpl, n / bt.best, n / bt.median, n / bt.cpu_best, int64_t(n), btok, btrain});
    }

    std::printf("%-9s %-8s %12s %12s %12s %8s %9s %10s %12s\n", "stage", "template", "best ex/s", "median ex/s",
                "cpu ex/s", "records", "tokens", "trainable", "best tok/s");
    for (const Row& r : rows)
      std::printf("%-9s %-8s %12.1f %12.1f %12.1f %8lld %9lld %10lld %12.0f\n", r.stage.c_str(), r.tmpl.c_str(),
                  r.best, r.median, r.cpu_best, (long long)r.records, (long long)r.tokens, (long long)r.trainable,
                  r.records ? r.best * double(r.tokens) / double(r.records) : 0.0);
    for (const Row& r : rows)
      std::printf("RESULT %s %s %.3f %.3f %lld %lld %lld %.3f\n", r.stage.c_str(), r.tmpl.c_str(), r.best, r.median,
                  (long long)r.records, (long long)r.tokens, (long long)r.trainable, r.cpu_best);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_data: %s\n", e.what());
    return 1;
  }
  return 0;
}
