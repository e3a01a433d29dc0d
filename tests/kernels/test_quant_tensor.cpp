// kernels/quant_tensor: the quantized-weight type on tensors — views, errors, CUDA vs reference.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/error.h"
#include "kernels/quant4.h"
#include "kernels/quant_tensor.h"
#include "quant_test_util.h"
#include "tests/test_util.h"

namespace {

using qlora::kernels::Quant4Type;

bool same_bytes(const torch::Tensor& a, const torch::Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  const auto ac = a.cpu().contiguous(), bc = b.cpu().contiguous();
  return ac.scalar_type() == bc.scalar_type() && ac.sizes() == bc.sizes() &&
         std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.numel() * ac.element_size()) == 0;
}

void expect_same_quant(const qlora::QuantizedWeight& a, const qlora::QuantizedWeight& b,
                       const std::string& what) {
  EXPECT_TRUE(same_bytes(a.packed, b.packed)) << what << ": packed";
  EXPECT_TRUE(same_bytes(a.absmax, b.absmax)) << what << ": absmax";
  EXPECT_TRUE(same_bytes(a.absmax_q, b.absmax_q)) << what << ": absmax_q";
  EXPECT_TRUE(same_bytes(a.nested_absmax, b.nested_absmax)) << what << ": nested_absmax";
  EXPECT_EQ(a.offset, b.offset) << what;
  EXPECT_EQ(a.shape, b.shape) << what;
}

template <typename F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    FAIL() << "no error; expected one mentioning '" << needle << "'";
  } catch (const qlora::Error& e) {  // every validation in kernels/ throws qlora::Error
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(QuantTensor, ParseQuantType) {
  EXPECT_EQ(qlora::kernels::parse_quant_type("nf4"), Quant4Type::NF4);
  EXPECT_EQ(qlora::kernels::parse_quant_type("fp4"), Quant4Type::FP4);
  expect_error([] { qlora::kernels::parse_quant_type("int4"); }, "int4");
  EXPECT_THROW(qlora::kernels::parse_quant_type("NF4 "), qlora::Error);
}

TEST(QuantTensor, StridedTransposedSlicedViewsQuantizeLikeTheirCopies) {
  torch::manual_seed(3);
  const auto base = torch::randn({96, 130});
  const std::vector<std::pair<std::string, torch::Tensor>> views = {
      {"transposed", base.t()},
      {"sliced rows", base.slice(0, 5, 77)},
      {"sliced cols", base.slice(1, 3, 101)},
      {"strided", base.slice(1, 0, 130, 3)},
      {"expanded", torch::randn({1, 130}).expand({40, 130})},
      {"bf16 transposed", base.to(torch::kBFloat16).t()},
      {"fp16 sliced", base.to(torch::kHalf).slice(0, 1, 50, 2)},
  };
  for (const auto& [name, v] : views)
    for (bool dq : {false, true}) {
      const auto a = qlora::quantize(v, Quant4Type::NF4, 64, dq);
      const auto b = qlora::quantize(v.contiguous(), Quant4Type::NF4, 64, dq);
      expect_same_quant(a, b, name);
      EXPECT_TRUE(torch::equal(a.dequantize(torch::kFloat), b.dequantize(torch::kFloat))) << name;
    }
}

TEST(QuantTensor, DequantizeShapeDtypeBytesAndError) {
  torch::manual_seed(4);
  const auto w = torch::randn({33, 71});  // 2343 elements: odd, ragged for every blocksize
  for (auto t : {Quant4Type::NF4, Quant4Type::FP4})
    for (bool dq : {false, true}) {
      const auto q = qlora::quantize(w, t, 64, dq);
      EXPECT_EQ(q.numel(), 2343);
      EXPECT_EQ(q.packed.numel(), 1172);
      const int64_t nb = 37;
      EXPECT_EQ(q.bytes(), dq ? 1172 + nb + 4 + 256 * 4 + 4 : 1172 + nb * 4);
      for (auto dt : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
        const auto y = q.dequantize(dt);
        EXPECT_EQ(y.sizes(), w.sizes());
        EXPECT_EQ(y.scalar_type(), dt);
        // normalised MSE of 4-bit blockwise quantization of N(0,1): well under 2%
        const double nmse = ((y.to(torch::kFloat) - w).pow(2).sum() / w.pow(2).sum()).item<double>();
        EXPECT_LT(nmse, 0.02) << qlora::kernels::quant_type_name(t) << " dq=" << dq;
      }
    }
}

TEST(QuantTensor, BadInputsGiveClearErrors) {
  const auto w = torch::randn({8, 64});
  expect_error([&] { qlora::quantize(w, Quant4Type::NF4, 48); }, "blocksize");
  expect_error([&] { qlora::quantize(w, Quant4Type::NF4, 8192); }, "got 8192");
  expect_error([&] { qlora::quantize(w, Quant4Type::NF4, 16); }, "32..4096");
  expect_error([&] { qlora::quantize(w.to(torch::kDouble), Quant4Type::NF4); }, "got Double");
  expect_error([&] { qlora::quantize(w.to(torch::kInt), Quant4Type::FP4); }, "expected dtype");
  expect_error([&] { qlora::quantize(torch::empty({0, 64}), Quant4Type::NF4); }, "non-empty");
  expect_error([&] { qlora::quantize(torch::Tensor(), Quant4Type::NF4); }, "undefined");
  const auto q = qlora::quantize(w, Quant4Type::NF4);
  expect_error([&] { q.dequantize(torch::kDouble); }, "expected dtype");
  auto broken = q;
  broken.packed = broken.packed.slice(0, 0, 10);
  expect_error([&] { broken.dequantize(torch::kFloat); }, "expected packed uint8");
}

// Every scale tensor must share packed's device, dtype, size and contiguity, checked before any
// kernel launch (a host pointer reaching a CUDA kernel is a sticky fault that kills the context).
// The meta device stands in for "another device" here; CudaQuantTensor.* does it with CPU vs CUDA.
TEST(QuantTensor, DequantizeChecksEveryScaleTensorFirst) {
  const auto w = torch::randn({8, 64});
  const auto dq = qlora::quantize(w, Quant4Type::NF4, 64, true);
  const auto sq = qlora::quantize(w, Quant4Type::NF4, 64, false);
  auto moved = dq;
  moved.absmax_q = moved.absmax_q.to(torch::kMeta);
  expect_error([&] { moved.dequantize(torch::kFloat); }, "absmax_q is on meta but packed is on cpu");
  moved = dq;
  moved.nested_absmax = moved.nested_absmax.to(torch::kMeta);
  expect_error([&] { moved.dequantize(torch::kFloat); }, "nested_absmax is on meta");
  moved = dq;
  moved.nested_code = torch::Tensor();
  expect_error([&] { moved.dequantize(torch::kFloat); }, "nested_code is missing");
  moved = dq;
  moved.nested_code = moved.nested_code.to(torch::kDouble);
  expect_error([&] { moved.dequantize(torch::kFloat); }, "expected nested_code Float contiguous [256]");
  moved = sq;
  moved.absmax = torch::stack({moved.absmax, moved.absmax}, 1).select(1, 0);  // strided view
  expect_error([&] { moved.dequantize(torch::kFloat); }, "(not contiguous)");
  moved = sq;
  moved.absmax = moved.absmax.to(torch::kMeta);
  expect_error([&] { moved.dequantize(torch::kFloat); }, "absmax is on meta");
}

// The same check on the GPU: host scales with CUDA packed bytes are refused before the launch, and
// the CUDA context still works afterwards. Must report OK on the device (tests/skip_allowlist.txt).
TEST(CudaQuantTensor, HostScalesAreRefusedBeforeTheLaunch) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  const auto w = torch::randn({64, 64});
  const auto q = qlora::quantize(w, Quant4Type::NF4, 64, true);
  auto mixed = q.to(torch::Device(torch::kCUDA));
  mixed.absmax_q = q.absmax_q;  // host tensor
  expect_error([&] { mixed.dequantize(torch::kBFloat16); }, "absmax_q is on cpu but packed is on cuda:0");
  const auto ok = q.to(torch::Device(torch::kCUDA)).dequantize(torch::kFloat);
  torch::cuda::synchronize();
  EXPECT_TRUE(same_bytes(q.dequantize(torch::kFloat), ok));
}

TEST(QuantTensor, CudaMatchesCpuReference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  torch::manual_seed(5);
  for (auto t : {Quant4Type::NF4, Quant4Type::FP4})
    for (bool dq : {false, true})
      for (int64_t bs : {32, 64, 128, 256, 512, 1024, 2048, 4096})
        for (int64_t n : {int64_t{1}, int64_t{77}, 257 * bs + 3, 300 * bs})
          for (auto dt : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
            const auto w = (torch::randn({n}) * torch::rand({n}).mul(4).exp()).to(dt);
            const std::string what = std::string(qlora::kernels::quant_type_name(t)) + " dq=" +
                                     std::to_string(dq) + " bs=" + std::to_string(bs) +
                                     " n=" + std::to_string(n) + " " + c10::toString(dt);
            const auto cpu = qlora::quantize(w, t, bs, dq);
            const auto gpu = qlora::quantize(w.cuda(), t, bs, dq);
            expect_same_quant(gpu, cpu, what);
            for (auto od : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
              const auto a = cpu.dequantize(od);
              const auto b = cpu.to(torch::Device(torch::kCUDA)).dequantize(od);
              EXPECT_TRUE(b.is_cuda());
              EXPECT_TRUE(same_bytes(a, b)) << what << " -> " << c10::toString(od);
            }
            if (HasFailure()) return;
          }
  // a misaligned output/packed pointer takes the scalar path and still matches
  const auto w = torch::randn({4096 * 3 + 64});
  const auto q = qlora::quantize(w, Quant4Type::NF4, 64, true);
  auto qs = q.to(torch::Device(torch::kCUDA));
  qs.packed = torch::cat({torch::zeros({1}, qs.packed.options()), qs.packed}).slice(0, 1);
  EXPECT_TRUE(same_bytes(q.dequantize(torch::kBFloat16), qs.dequantize(torch::kBFloat16)));
}

// qlora::quantize() — the function the model loader calls — byte for byte against bitsandbytes'
// quantize_4bit on every fixture case (tests/fixtures/make_quant_refs.py, tie cases included):
// plain (packed, absmax) and double quant (packed, absmax_q byte for byte; the offset we compute
// ourselves within 2 float32 ulps of bnb's torch float32 mean, nested_absmax identical whenever the
// offsets are; see Quant4Bnb.ByteExactWithBitsandbytesCpu for the nested_absmax bound otherwise).
TEST(QuantTensor, QuantizeMatchesBitsandbytesByteForByte) {
  QLORA_REQUIRE_FIXTURE(manifest_path, "quant/manifest.json");
  const std::filesystem::path dir = manifest_path.parent_path();
  std::ifstream in(manifest_path);
  const nlohmann::json manifest = nlohmann::json::parse(in);
  auto bytes_of = [&](const nlohmann::json& name) { return qlora::test::read_bin<uint8_t>(dir / name.get<std::string>()); };
  auto tensor_of = [](const std::vector<uint8_t>& b, at::ScalarType dt, std::vector<int64_t> shape) {
    return torch::from_blob(const_cast<uint8_t*>(b.data()), shape, dt).clone();
  };
  int cases = 0, identical_offset = 0;
  int64_t worst_ulps = 0;
  for (const auto& c : manifest["cases"]) {
    const std::string name = c["name"], dn = c["dtype"];
    SCOPED_TRACE(name);
    const at::ScalarType dt = dn == "f32" ? at::kFloat : dn == "bf16" ? at::kBFloat16 : at::kHalf;
    const auto x_bytes = bytes_of(c["input"]);
    const torch::Tensor x = tensor_of(x_bytes, dt, c["shape"].get<std::vector<int64_t>>());
    const Quant4Type t = c["quant_type"] == "nf4" ? Quant4Type::NF4 : Quant4Type::FP4;
    const int64_t bs = c["blocksize"];
    const auto packed = bytes_of(c["packed"]);
    const auto absmax = bytes_of(c["absmax"]);
    const qlora::QuantizedWeight plain = qlora::quantize(x, t, bs, /*double_quant=*/false);
    EXPECT_TRUE(same_bytes(plain.packed, tensor_of(packed, at::kByte, {int64_t(packed.size())}))) << "packed";
    EXPECT_TRUE(same_bytes(plain.absmax, tensor_of(absmax, at::kFloat, {int64_t(absmax.size() / 4)}))) << "absmax";
    const qlora::QuantizedWeight dq = qlora::quantize(x, t, bs, /*double_quant=*/true);
    const auto absmax_q = bytes_of(c["absmax_q"]);
    const auto nested = bytes_of(c["nested_absmax"]);
    EXPECT_TRUE(same_bytes(dq.packed, tensor_of(packed, at::kByte, {int64_t(packed.size())}))) << "packed (dq)";
    EXPECT_TRUE(same_bytes(dq.absmax_q, tensor_of(absmax_q, at::kByte, {int64_t(absmax_q.size())}))) << "absmax_q";
    const float bnb_offset = c["offset"];
    const int64_t ulps = qlora::test::ulp_distance(dq.offset, bnb_offset);
    EXPECT_LE(ulps, 2) << "offset " << dq.offset << " vs bnb " << bnb_offset;
    identical_offset += ulps == 0;
    worst_ulps = std::max(worst_ulps, ulps);
    if (ulps == 0) {  // the same offset: nested_absmax must then be identical too
      EXPECT_TRUE(same_bytes(dq.nested_absmax, tensor_of(nested, at::kFloat, {int64_t(nested.size() / 4)})))
          << "nested_absmax";
    }
    ++cases;
  }
  EXPECT_EQ(cases, 42);
  std::cout << "[quantize() vs bnb] packed, absmax, absmax_q identical in all " << cases << " cases; offset identical in "
            << identical_offset << ", worst " << worst_ulps << " ulp\n";
}
