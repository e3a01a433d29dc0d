// Encode throughput of qlora::data::Tokenizer on a JSONL corpus ({"text": ...} per line), one
// thread: every document is encoded with encode(text) (no special tokens), `reps` times after one
// warm-up pass. Prints `RESULT <name> <best MB/s> <median MB/s> <cpu MB/s> <tokens> <bytes>`.
//   bench_tokenizer NAME MODEL_DIR|TOKENIZER_FILE CORPUS.jsonl [reps=5]
// A dir is loaded with Tokenizer::from_pretrained, a tokenizer.json / tokenizer.model file alone
// (the constructor: the `tokenizers` contract, what run.py compares with).
// Driver: bench/tokenizer/run.py (adds the Rust `tokenizers` numbers and the ratio).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.h"
#include "data/tokenizer.h"

namespace {
double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s NAME MODEL_DIR|TOKENIZER_FILE CORPUS.jsonl [reps=5]\n", argv[0]);
    return 2;
  }
  try {
    const std::string name = argv[1];
    const int reps = argc > 4 ? std::max(1, std::atoi(argv[4])) : 5;
    const auto t0 = std::chrono::steady_clock::now();
    const qlora::data::Tokenizer tok = std::filesystem::is_directory(argv[2])
                                           ? qlora::data::Tokenizer::from_pretrained(argv[2])
                                           : qlora::data::Tokenizer(argv[2]);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::vector<std::string> docs;
    size_t bytes = 0;
    std::ifstream f(argv[3]);
    QLORA_CHECK(f.good(), argv[3], ": cannot open");
    for (std::string line; std::getline(f, line);) {
      if (line.empty()) continue;
      docs.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
      bytes += docs.back().size();
    }
    size_t tokens = 0;
    for (const auto& d : docs) tokens += tok.encode(d).size();  // warm-up
    std::vector<double> wall, cpu;
    for (int r = 0; r < reps; ++r) {
      const double c0 = cpu_seconds();
      const auto w0 = std::chrono::steady_clock::now();
      size_t n = 0;
      for (const auto& d : docs) n += tok.encode(d).size();
      wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count());
      cpu.push_back(cpu_seconds() - c0);
      QLORA_CHECK(n == tokens, "bench_tokenizer: token count changed between passes");
    }
    std::sort(wall.begin(), wall.end());
    std::sort(cpu.begin(), cpu.end());
    const double mb = double(bytes) / 1e6;
    std::printf("# %s: %zu docs, %.2f MB, %zu tokens, load %.3f s, walls:", name.c_str(), docs.size(), mb, tokens, load_s);
    for (double w : wall) std::printf(" %.3f", w);
    std::printf("\nRESULT %s %.3f %.3f %.3f %zu %zu\n", name.c_str(), mb / wall.front(), mb / wall[wall.size() / 2],
                mb / cpu.front(), tokens, bytes);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
