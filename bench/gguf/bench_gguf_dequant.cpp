// bench_gguf_dequant FILE.gguf [repeats]: dequantizes every tensor of FILE with the scalar reference
// and with the CPU path (OpenMP; set OMP_NUM_THREADS), prints seconds and elements/s of each (best of
// `repeats`, default 2) and checks both agree bit for bit.
#include <chrono>
#include <cstring>
#include <iostream>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "kernels/gguf_dequant.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: bench_gguf_dequant FILE.gguf [repeats]\n";
    return 2;
  }
  try {
    const qlora::gguf::GgufFile f(argv[1]);
    const int repeats = argc > 2 ? std::max(1, std::atoi(argv[2])) : 2;
    int64_t total = 0, largest = 0;
    for (const auto& t : f.tensors()) {
      total += t.numel();
      largest = std::max(largest, t.numel());
    }
    std::vector<float> a(static_cast<size_t>(largest)), b(static_cast<size_t>(largest));
    bool same = true;
    for (const char* path : {"reference", "cpu"}) {
      double best = 1e30;
      for (int r = 0; r < repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        for (const auto& t : f.tensors()) {
          if (path[0] == 'r') qlora::kernels::dequantize_gguf_ref(t.type, f.data(t), t.numel(), a.data());
          else qlora::kernels::dequantize_gguf_cpu(t.type, f.data(t), t.numel(), b.data());
        }
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::cout << path << ": " << best << " s for " << total << " elements, " << total / best / 1e6
                << " M elements/s\n";
    }
    for (const auto& t : f.tensors()) {  // agreement, tensor by tensor
      qlora::kernels::dequantize_gguf_ref(t.type, f.data(t), t.numel(), a.data());
      qlora::kernels::dequantize_gguf_cpu(t.type, f.data(t), t.numel(), b.data());
      same = same && std::memcmp(a.data(), b.data(), static_cast<size_t>(t.numel()) * 4) == 0;
    }
    std::cout << "reference and cpu path " << (same ? "bit-identical" : "DIFFER") << "\n";
    return same ? 0 : 1;
  } catch (const qlora::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
