// Helpers shared by the quant4 tests: deterministic inputs and raw fixture files.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/quant4.h"

namespace qlora::test {

/// n values ~ N(0,1) times a per-block scale spread over 4 decades, 1% exact zeros, one
/// all-zero block when there are more than 3 blocks.
inline std::vector<float> make_weights(int64_t n, int64_t bs, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(-6.f, 3.f), u01(0.f, 1.f);
  std::vector<float> x(n);
  float scale = 1.f;
  for (int64_t i = 0; i < n; ++i) {
    if (i % bs == 0) scale = std::exp(ud(rng));
    x[i] = u01(rng) < 0.01f ? 0.f : nd(rng) * scale;
  }
  if (n > 3 * bs)
    for (int64_t i = bs; i < 2 * bs; ++i) x[i] = 0.f;
  return x;
}

template <typename T>
std::vector<T> convert(const std::vector<float>& x) {
  std::vector<T> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = kernels::from_float<T>(x[i]);
  return out;
}

template <typename T>
std::vector<T> read_bin(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + p.string());
  f.seekg(0, std::ios::end);
  const auto size = static_cast<size_t>(f.tellg());
  if (size % sizeof(T)) throw std::runtime_error("size of " + p.string() + " not a multiple");
  f.seekg(0);
  std::vector<T> v(size / sizeof(T));
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(size));
  return v;
}

/// Distance of two finite floats in float32 ulps (representable values between them).
inline int64_t ulp_distance(float a, float b) {
  auto ordered = [](float f) {
    int32_t i;
    std::memcpy(&i, &f, 4);
    return i < 0 ? int64_t{INT32_MIN} - i : int64_t{i};
  };
  const int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

/// Index of the first differing byte of two equally sized arrays, or -1.
template <typename T>
int64_t first_diff(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  return -1;
}

}  // namespace qlora::test
