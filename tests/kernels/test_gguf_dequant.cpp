// GGUF dequantization: the scalar reference and the CPU path against gguf-py's
// gguf.quants.dequantize (fixture tests/fixtures/make_gguf_refs.py: dequant.gguf), bit for bit, for
// every supported type; CPU path vs reference on many random blocks (OpenMP split); refusals.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "kernels/gguf_dequant.h"
#include "test_util.h"

namespace {
using qlora::gguf::GgmlType;
using qlora::gguf::GgufFile;

std::vector<uint32_t> bits(const float* p, size_t n) {
  std::vector<uint32_t> b(n);
  std::memcpy(b.data(), p, n * 4);
  return b;
}
// As bits(), every NaN as 0x7fc00000: random fp16 scales include inf/NaN, and which NaN payload
// an operation with two NaN operands returns depends on the operand order the compiler picks.
std::vector<uint32_t> bits_nan_canonical(const float* p, size_t n) {
  std::vector<uint32_t> b = bits(p, n);
  for (uint32_t& u : b)
    if ((u & 0x7fffffffu) > 0x7f800000u) u = 0x7fc00000u;
  return b;
}

TEST(GgufDequant, BitIdenticalToGgufPyForEveryType) {
  QLORA_REQUIRE_FIXTURE(file, "gguf/dequant.gguf");
  QLORA_REQUIRE_FIXTURE(list, "gguf/dequant.json");
  GgufFile f(file.string());
  std::ifstream in(list);
  const auto j = nlohmann::json::parse(in);
  std::set<std::string> types;
  for (const auto& e : j["tensors"]) {
    const std::string name = e["name"];
    const auto* t = f.find_tensor(name);
    const auto* x = f.find_tensor(name + ".expected");
    ASSERT_TRUE(t && x) << name;
    ASSERT_EQ(x->type, GgmlType::F32);
    ASSERT_EQ(t->numel(), x->numel()) << name;
    ASSERT_EQ(t->shape(), x->shape()) << name;
    EXPECT_EQ(qlora::gguf::ggml_type_info(t->type).name, e["type"].get<std::string>());
    const size_t n = static_cast<size_t>(t->numel());
    std::vector<float> ref(n), cpu(n), want(n);
    std::memcpy(want.data(), f.data(*x), n * 4);
    qlora::kernels::dequantize_gguf_ref(t->type, f.data(*t), t->numel(), ref.data());
    qlora::kernels::dequantize_gguf_cpu(t->type, f.data(*t), t->numel(), cpu.data());
    EXPECT_EQ(bits(ref.data(), n), bits(want.data(), n)) << name << " (reference)";
    EXPECT_EQ(bits(cpu.data(), n), bits(want.data(), n)) << name << " (cpu)";
    types.insert(e["type"].get<std::string>());
  }
  EXPECT_EQ(types.size(), 13u);  // F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K..Q6_K
}

TEST(GgufDequant, CpuPathEqualsReferenceOnRandomBlocks) {
  std::mt19937 rng(11);
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
                     GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,
                     GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    const auto& ti = qlora::gguf::ggml_type_info(t);
    const int64_t blocks = 997;  // odd: uneven OpenMP split
    std::vector<uint8_t> src(static_cast<size_t>(blocks * ti.type_size));
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    const size_t n = static_cast<size_t>(blocks * ti.block);
    std::vector<float> ref(n), cpu(n);
    qlora::kernels::dequantize_gguf_ref(t, src.data(), static_cast<int64_t>(n), ref.data());
    qlora::kernels::dequantize_gguf_cpu(t, src.data(), static_cast<int64_t>(n), cpu.data());
    EXPECT_EQ(bits_nan_canonical(ref.data(), n), bits_nan_canonical(cpu.data(), n)) << ti.name;
    EXPECT_TRUE(qlora::kernels::dequantize_gguf_supported(t));
  }
}

TEST(GgufDequant, RefusesUnsupportedTypesAndRaggedSizes) {
  std::vector<uint8_t> src(1024);
  std::vector<float> out(256);
  for (GgmlType t : {GgmlType::IQ2_XXS, GgmlType::Q8_K, GgmlType::I32, GgmlType::MXFP4}) {
    EXPECT_FALSE(qlora::kernels::dequantize_gguf_supported(t));
    try {
      qlora::kernels::dequantize_gguf_cpu(t, src.data(), 256, out.data());
      ADD_FAILURE() << "accepted";
    } catch (const qlora::Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("type ") + qlora::gguf::ggml_type_info(t).name +
                                           " is not supported"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(qlora::kernels::dequantize_gguf_ref(GgmlType::Q4_K, src.data(), 100, out.data()), qlora::Error);
}

}  // namespace
