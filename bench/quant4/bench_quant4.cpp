// bench/quant4: dequantize bandwidth and round-trip error of the 4-bit NF4/FP4 format.
//   build-kernels/bench/quant4/bench_quant4 cpu    [reps]  CPU dequantize GB/s vs memcpy
//   build-kernels/bench/quant4/bench_quant4 cuda   [reps]  CUDA dequantize GB/s vs D2D memcpy
//   build-kernels/bench/quant4/bench_quant4 error          N(0,1) 4096x4096 round-trip error
// GB/s counts bytes moved: packed + absmax read, output written (memcpy: output size read+written
// is reported as "output bytes x 2" so the two columns compare the same kind of traffic).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/quant4.h"
#include "kernels/quant_tensor.h"
#if QLORA_WITH_CUDA
#include <cuda_runtime.h>

#include "kernels/quant4.cuh"
#endif

namespace k = qlora::kernels;

namespace {

struct Shape { int64_t rows, cols; };
const Shape kShapes[] = {{4096, 4096}, {4096, 14336}, {14336, 4096}, {11008, 4096}, {32000, 4096}};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <typename F>
double best_of(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_s();
    f();
    best = std::min(best, now_s() - t0);
  }
  return best;
}

void bench_cpu(int reps) {
  std::printf("CPU dequantize NF4 bs=64 -> bf16 (best of %d)\n", reps);
  std::printf("%-14s %10s %10s %12s %12s\n", "shape", "deq ms", "deq GB/s", "memcpy GB/s", "ratio");
  for (const Shape s : {kShapes[0], kShapes[3]}) {
    const int64_t n = s.rows * s.cols, bs = 64, nb = k::quant4_num_blocks(n, bs);
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>((i * 2654435761u % 2001) - 1000) * 1e-3f;
    std::vector<uint8_t> packed(k::quant4_packed_bytes(n));
    std::vector<float> absmax(nb);
    k::quantize_4bit_cpu(x.data(), n, bs, k::Quant4Type::NF4, packed.data(), absmax.data());
    std::vector<k::BF16Bits> out(n), src(n), dst(n);
    k::Quant4Scales sc;
    sc.absmax = absmax.data();
    const double td = best_of(reps, [&] {
      k::dequantize_4bit_cpu(packed.data(), sc, n, bs, k::Quant4Type::NF4, out.data());
    });
    const double tm = best_of(reps, [&] { std::memcpy(dst.data(), src.data(), n * 2); });
    const double bytes_d = packed.size() + nb * 4.0 + n * 2.0, bytes_m = n * 2.0 * 2;
    std::printf("%5ldx%-8ld %10.2f %10.2f %12.2f %12.2f\n", (long)s.rows, (long)s.cols, td * 1e3,
                bytes_d / td / 1e9, bytes_m / tm / 1e9, (bytes_d / td) / (bytes_m / tm));
  }
}

#if QLORA_WITH_CUDA
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); std::exit(1); } } while (0)
void bench_cuda(int reps) {
  std::printf("CUDA dequantize NF4 bs=64, double quant -> bf16 (best of %d)\n", reps);
  std::printf("%-14s %10s %10s %14s %8s\n", "shape", "deq us", "deq GB/s", "D2D memcpy GB/s", "ratio");
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (const Shape s : kShapes) {
    const int64_t n = s.rows * s.cols, bs = 64, nb = k::quant4_num_blocks(n, bs);
    uint8_t *packed, *aq;
    float *nested, *code;
    void *out, *src;
    CK(cudaMalloc(&packed, k::quant4_packed_bytes(n)));
    CK(cudaMalloc(&aq, nb));
    CK(cudaMalloc(&nested, k::quant4_num_blocks(nb, 256) * 4));
    CK(cudaMalloc(&code, 256 * 4));
    CK(cudaMalloc(&out, n * 2));
    CK(cudaMalloc(&src, n * 2));
    CK(cudaMemset(packed, 0x5a, k::quant4_packed_bytes(n)));
    CK(cudaMemset(aq, 200, nb));
    CK(cudaMemset(nested, 0, k::quant4_num_blocks(nb, 256) * 4));
    CK(cudaMemcpy(code, k::dynamic_map_signed(), 1024, cudaMemcpyHostToDevice));
    k::Quant4Scales sc;
    sc.absmax_q = aq; sc.nested_absmax = nested; sc.nested_code = code; sc.offset = 0.1f;
    auto time_it = [&](auto&& f) {
      f();
      float best = 1e30f;
      for (int r = 0; r < reps; ++r) {
        CK(cudaEventRecord(a));
        f();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        best = std::min(best, ms);
      }
      return best * 1e-3;
    };
    const double td = time_it([&] {
      k::dequantize_4bit_cuda(packed, sc, n, bs, k::Quant4Type::NF4,
                              static_cast<k::BF16Bits*>(out), nullptr);
    });
    const double tm = time_it([&] { CK(cudaMemcpyAsync(out, src, n * 2, cudaMemcpyDeviceToDevice)); });
    const double bytes_d = k::quant4_packed_bytes(n) + nb + n * 2.0, bytes_m = n * 2.0 * 2;
    std::printf("%5ldx%-8ld %10.1f %10.1f %14.1f %8.2f\n", (long)s.rows, (long)s.cols, td * 1e6,
                bytes_d / td / 1e9, bytes_m / tm / 1e9, (bytes_d / td) / (bytes_m / tm));
    cudaFree(packed); cudaFree(aq); cudaFree(nested); cudaFree(code); cudaFree(out); cudaFree(src);
  }
}
#endif

void error_table() {
  torch::manual_seed(0);
  const auto w = torch::randn({4096, 4096});
  std::printf("N(0,1) 4096x4096, torch::manual_seed(0): round-trip error of dequantize(quantize(w)) in fp32\n");
  std::printf("| type | blocksize | double quant | RMSE | max abs err | NMSE | bits/param |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (auto t : {k::Quant4Type::NF4, k::Quant4Type::FP4})
    for (int64_t bs : {32, 64, 128, 256, 512, 1024, 2048, 4096})
      for (bool dq : {false, true}) {
        const auto q = qlora::quantize(w, t, bs, dq);
        const auto d = (q.dequantize(torch::kFloat) - w);
        std::printf("| %s | %ld | %s | %.5f | %.4f | %.5f | %.3f |\n", k::quant_type_name(t),
                    (long)bs, dq ? "yes" : "no", d.pow(2).mean().sqrt().item<double>(),
                    d.abs().max().item<double>(),
                    (d.pow(2).sum() / w.pow(2).sum()).item<double>(),
                    q.bytes() * 8.0 / static_cast<double>(w.numel()));
      }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "cpu";
  const int reps = argc > 2 ? std::atoi(argv[2]) : 10;
  if (mode == "cpu") bench_cpu(reps);
  else if (mode == "error") error_table();
  else if (mode == "cuda") {
#if QLORA_WITH_CUDA
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      std::printf("no CUDA device visible; skipping\n");
      return 0;
    }
    bench_cuda(reps);
#else
    std::printf("built without CUDA\n");
#endif
  } else {
    std::fprintf(stderr, "usage: %s cpu|cuda|error [reps]\n", argv[0]);
    return 2;
  }
  return 0;
}
