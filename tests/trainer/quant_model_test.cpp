// The 4-bit frozen base inside the model: FrozenLinear with a QuantizedWeight, quantize-on-load
// (streaming), random_init with quantization, bitsandbytes pre-quantized checkpoints (fixtures from
// tests/fixtures/make_bnb_models.py), `qlora inspect --quant`, and the peak-RSS bound of a
// streaming load of a ≥ 1 GB model.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/error.h"
#include "common/tensor_io.h"
#include "kernels/quant4.h"
#include "test_util.h"
#include "cli/commands.h"
#include "model/model.h"

namespace qlora {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;
using test::TempDir;
using test::error_of;
using kernels::quantized_weight_bytes;

QuantOptions nf4(bool dq = true, int64_t bs = 64) {
  QuantOptions q;
  q.quant_type = kernels::Quant4Type::NF4;
  q.double_quant = dq;
  q.blocksize = bs;
  return q;
}

bool bits_equal(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         torch::equal(a.contiguous().view(torch::kInt32), b.contiguous().view(torch::kInt32));
}

// ---------------------------------------------------------------------------------------------
// Sizes

// quantized_weight_bytes (the formula inspect and the docs use) is exactly what a QuantizedWeight
// holds, for ragged sizes, blocksizes and both scale layouts.
TEST(QuantBytes, FormulaMatchesQuantizedWeight) {
  for (int64_t n : {1, 63, 64, 65, 4096, 64 * 256 + 5, 100000})
    for (int64_t bs : {32, 64, 128, 4096})
      for (bool dq : {false, true}) {
        const QuantizedWeight q = quantize(torch::randn({n}), kernels::Quant4Type::NF4, bs, dq);
        EXPECT_EQ(quantized_weight_bytes(n, bs, dq), q.bytes()) << n << " " << bs << " " << dq;
      }
}

// Llama 2 7B's linear weights (32 layers × q,k,v,o 4096² + gate,up,down 4096·11008) at NF4,
// blocksize 64, double quant: per element 4 bits + 8/64 (uint8 absmax) + 32/(64·256) (nested
// float32 absmax) = 4.126953 bits, plus 256·4 + 4 bytes of code and offset per tensor (≈ 2e-6 bits
// here). The bar from the issue: ≈ 4.127.
TEST(QuantBytes, Llama2_7bLinearsAre4_127BitsPerParam) {
  const ModelConfig c = preset_config("llama2-7b");
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const std::vector<int64_t> sizes = {H * H, H * H, H * H, H * H, I * H, I * H, H * I};
  int64_t params = 0, bytes = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    for (int64_t n : sizes) {
      params += n;
      bytes += quantized_weight_bytes(n, 64, true);
    }
  EXPECT_EQ(params, 6476005376);
  const double bits = 8.0 * bytes / params;
  const double formula = 4.0 + 8.0 / 64 + 32.0 / (64 * 256) + 7 * 32 * (256 * 4 + 4) * 8.0 / params;
  EXPECT_NEAR(bits, formula, 1e-5);
  EXPECT_NEAR(bits, 4.12724, 5e-6);  // the value docs/quantization.md states
  std::cout << "llama2-7b linears, nf4 bs64 dq: " << bits << " bits/param\n";
  // without double quant: 4 + 32/64 = 4.5
  int64_t b2 = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    for (int64_t n : sizes) b2 += quantized_weight_bytes(n, 64, false);
  EXPECT_NEAR(8.0 * b2 / params, 4.5, 1e-9);
}

TEST(QuantOptions, KeepListMatchesPathComponents) {
  QuantOptions q = nf4();
  EXPECT_TRUE(q.quantizes("model.layers.0.self_attn.q_proj"));
  EXPECT_FALSE(q.quantizes("lm_head"));
  q.keep_16bit.push_back("down_proj");
  EXPECT_FALSE(q.quantizes("model.layers.3.mlp.down_proj"));
  EXPECT_TRUE(q.quantizes("model.layers.3.mlp.up_proj"));
  q.keep_16bit.push_back("model.layers.1");
  EXPECT_FALSE(q.quantizes("model.layers.1.self_attn.q_proj"));
  EXPECT_TRUE(q.quantizes("model.layers.11.self_attn.q_proj"));
  EXPECT_FALSE(QuantOptions{}.quantizes("model.layers.0.self_attn.q_proj"));  // method none
}

// ---------------------------------------------------------------------------------------------
// FrozenLinear

// Forward with a 4-bit weight = linear with the dequantized weight, bit for bit (same op on the
// same values); backward gives the same grad wrt x and keeps no dequantized copy.
TEST(FrozenLinear, QuantizedForwardAndBackwardEqualDequantizedLinear) {
  torch::manual_seed(3);
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    const torch::Tensor w = torch::randn({48, 80}) * 0.05;
    FrozenLinear ql;
    ql.qweight = std::make_shared<const QuantizedWeight>(quantize(w, kernels::Quant4Type::NF4, 64, true));
    ql.bias = torch::randn({48}).to(dtype);
    const torch::Tensor wd = ql.qweight->dequantize(dtype);
    torch::Tensor x = torch::randn({2, 5, 80}).to(dtype).requires_grad_(true);
    torch::Tensor y = ql.forward(x);
    const torch::Tensor ref = torch::nn::functional::linear(x.detach(), wd, ql.bias);
    EXPECT_TRUE(torch::equal(y.detach(), ref));
    const torch::Tensor g = torch::randn_like(y);
    y.backward(g);
    const torch::Tensor gref = g.matmul(wd);
    EXPECT_TRUE(torch::allclose(x.grad().to(torch::kFloat), gref.to(torch::kFloat), 1e-5, 1e-5));
    EXPECT_EQ(ql.bytes(), quantized_weight_bytes(48 * 80, 64, true) + 48 * ql.bias.element_size());
    FrozenLinear plain;
    plain.name = "p";
    plain.weight = wd;
    plain.bias = ql.bias;
    EXPECT_EQ(plain.bytes(), (48 * 80 + 48) * static_cast<int64_t>(ql.bias.element_size()));
  }
}

// ---------------------------------------------------------------------------------------------
// Quantize on load / random_init

// Loading the fp32 source with nf4 gives, per linear, exactly quantize(stored weight); the
// 16-bit modules are the stored tensors; the 3-argument load still keeps everything 16-bit.
TEST(QuantizeOnLoad, EachLinearIsQuantizeOfTheStoredWeight) {
  QLORA_REQUIRE_FIXTURE(dir, "bnb/llama_fp32");
  const LlamaModel full = LlamaModel::load(dir.string(), torch::kFloat32, torch::kCPU);
  for (bool dq : {true, false}) {
    const LlamaModel m = LlamaModel::load(dir.string(), torch::kFloat32, torch::kCPU, nf4(dq));
    auto fl = full.linears();
    auto ql = m.linears();
    ASSERT_EQ(fl.size(), ql.size());
    for (size_t i = 0; i < fl.size(); ++i) {
      ASSERT_FALSE(fl[i]->quantized());
      ASSERT_TRUE(ql[i]->quantized()) << ql[i]->name;
      EXPECT_FALSE(ql[i]->weight.defined());
      const QuantizedWeight ref = quantize(fl[i]->weight, kernels::Quant4Type::NF4, 64, dq);
      EXPECT_TRUE(torch::equal(ql[i]->qweight->packed, ref.packed)) << ql[i]->name;
      EXPECT_TRUE(bits_equal(ql[i]->qweight->dequantize(torch::kFloat), ref.dequantize(torch::kFloat)));
    }
    EXPECT_TRUE(bits_equal(m.embed_tokens, full.embed_tokens));
    EXPECT_TRUE(bits_equal(m.lm_head, full.lm_head));
    EXPECT_TRUE(bits_equal(m.norm, full.norm));
    // named_tensors omits the quantized linears
    for (const auto& [name, t] : m.named_tensors()) EXPECT_EQ(name.find("_proj"), std::string::npos) << name;
  }
}

TEST(QuantizeOnLoad, KeepListKeepsModules16Bit) {
  QLORA_REQUIRE_FIXTURE(dir, "bnb/llama_fp32");
  QuantOptions q = nf4();
  q.keep_16bit.push_back("down_proj");
  const LlamaModel m = LlamaModel::load(dir.string(), torch::kBFloat16, torch::kCPU, q);
  for (const FrozenLinear* l : m.linears()) {
    const bool down = l->name.find("down_proj") != std::string::npos;
    EXPECT_EQ(l->quantized(), !down) << l->name;
    if (down) {
      EXPECT_EQ(l->weight.scalar_type(), torch::kBFloat16);
    }
  }
  QuantOptions bad = nf4();
  bad.keep_16bit = {"embed_tokens", "norm"};
  EXPECT_NE(error_of([&] { LlamaModel::load(dir.string(), torch::kFloat32, torch::kCPU, bad); })
                .find("'lm_head' must stay in keep_16bit"),
            std::string::npos);
  QuantOptions bs = nf4(true, 48);
  EXPECT_NE(error_of([&] { LlamaModel::load(dir.string(), torch::kFloat32, torch::kCPU, bs); }).find("got 48"),
            std::string::npos);
}

// random_init with quantization draws the same values as without, then quantizes them.
TEST(QuantizeOnLoad, RandomInitQuantizesTheSameDraws) {
  ModelConfig c = preset_config("tiny");
  const LlamaModel full = LlamaModel::random_init(c, 5, torch::kBFloat16, torch::kCPU);
  QuantOptions q = nf4();
  q.quant_type = kernels::Quant4Type::FP4;
  const LlamaModel m = LlamaModel::random_init(c, 5, torch::kBFloat16, torch::kCPU, q);
  auto fl = full.linears();
  auto ql = m.linears();
  for (size_t i = 0; i < fl.size(); ++i) {
    ASSERT_TRUE(ql[i]->quantized());
    EXPECT_EQ(ql[i]->qweight->type, kernels::Quant4Type::FP4);
    EXPECT_TRUE(torch::equal(ql[i]->qweight->packed, quantize(fl[i]->weight, kernels::Quant4Type::FP4, 64, true).packed));
  }
  EXPECT_TRUE(torch::equal(m.embed_tokens, full.embed_tokens));
}

// ---------------------------------------------------------------------------------------------
// bitsandbytes checkpoints

struct BnbRef {
  std::map<std::string, torch::Tensor> t;
};
BnbRef load_bnb_ref(const fs::path& dir) {
  st::SafetensorsFile f((dir / "bnb_ref.safetensors").string());
  BnbRef r;
  for (const st::TensorInfo& i : f.tensors()) r.t[i.name] = load_tensor(f, i).clone();
  return r;
}

class BnbCheckpoint : public ::testing::TestWithParam<std::string> {};

// Every linear weight dequantizes bit for bit to bnb.functional.dequantize_4bit's output.
TEST_P(BnbCheckpoint, DequantizedWeightsAreBitIdenticalToBitsandbytes) {
  QLORA_REQUIRE_FIXTURE(dir, "bnb/" + GetParam());
  const LlamaModel m = LlamaModel::load(dir.string(), torch::kFloat32, torch::kCPU);
  const BnbRef r = load_bnb_ref(dir);
  const bool dq = GetParam().find("_dq") != std::string::npos;
  int n = 0;
  for (const FrozenLinear* l : m.linears()) {
    ASSERT_TRUE(l->quantized()) << l->name;
    EXPECT_EQ(l->qweight->double_quant, dq);
    const torch::Tensor& ref = r.t.at(l->name + ".weight.dequant");
    // ±0 compare equal: bnb's native decoders give FP4 code 8 as −0.0, as ours (docs/quantization.md)
    EXPECT_TRUE(torch::equal(l->qweight->dequantize(torch::kFloat), ref)) << l->name;
    ++n;
  }
  EXPECT_EQ(n, 14);
}

// transformers' forward of the bnb model (AVX512 fast path off) is dequantize_4bit → float32 →
// F.linear, the ops our FrozenLinear runs on the same dequantized values; the rest is the fp32
// decoder whose parity is 1e-4 (model_test.cpp: reassociation inside matmul / SDPA kernels only).
TEST_P(BnbCheckpoint, LogitsMatchTransformers) {
  QLORA_REQUIRE_FIXTURE(dir, "bnb/" + GetParam());
  const LlamaModel m = LlamaModel::load(dir.string(), torch::kFloat32, torch::kCPU);
  const BnbRef r = load_bnb_ref(dir);
  torch::NoGradGuard ng;
  const torch::Tensor mask = r.t.at("attention_mask");
  torch::Tensor ours = m.forward({r.t.at("input_ids"), mask, r.t.at("position_ids"), {}});
  const torch::Tensor sel = mask.to(torch::kBool);
  const double d = (ours.index({sel}) - r.t.at("logits").index({sel})).abs().max().item<double>();
  std::cout << GetParam() << " fp32 max|dlogit| = " << d << "\n";
  EXPECT_LE(d, 1e-4);
}

// Asking for the other quant type than the stored one names both.
TEST_P(BnbCheckpoint, RequestingAnotherQuantTypeNamesBoth) {
  QLORA_REQUIRE_FIXTURE(dir, "bnb/" + GetParam());
  const bool is_nf4 = GetParam().find("nf4") != std::string::npos;
  QuantOptions q = nf4();
  q.quant_type = is_nf4 ? kernels::Quant4Type::FP4 : kernels::Quant4Type::NF4;
  const std::string e = error_of([&] { LlamaModel::load(dir.string(), torch::kFloat32, torch::kCPU, q); });
  const char* stored = is_nf4 ? "nf4" : "fp4";
  const std::string want = std::string("quantization.method: ") + (is_nf4 ? "fp4" : "nf4") + " was requested, but " +
                           (dir / "config.json").string() + ": the checkpoint is stored as bitsandbytes " + stored +
                           " (method " + stored + " uses it as stored; none dequantizes it)";
  EXPECT_EQ(e, want);
  // the same type loads (as stored, no re-quantization)
  q.quant_type = is_nf4 ? kernels::Quant4Type::NF4 : kernels::Quant4Type::FP4;
  EXPECT_TRUE(LlamaModel::load(dir.string(), torch::kFloat32, torch::kCPU, q).linears()[0]->quantized());
}

INSTANTIATE_TEST_SUITE_P(Bnb, BnbCheckpoint,
                         ::testing::Values("llama_nf4_dq", "llama_nf4", "llama_fp4_dq", "llama_fp4"));

/// Copies a bnb fixture dir into `out`, passing its tensors and config through `edit`.
void rewrite(const fs::path& src, const fs::path& out,
             const std::function<void(std::map<std::string, torch::Tensor>&, json&)>& edit) {
  st::SafetensorsFile f((src / "model.safetensors").string());
  std::map<std::string, torch::Tensor> t;
  for (const st::TensorInfo& i : f.tensors()) t[i.name] = load_tensor(f, i).clone();
  std::ifstream in(src / "config.json");
  json cfg = json::parse(in);
  edit(t, cfg);
  std::vector<std::pair<std::string, torch::Tensor>> v(t.begin(), t.end());
  save_tensors((out / "model.safetensors").string(), v);
  std::ofstream(out / "config.json") << cfg.dump(2);
}

torch::Tensor bytes_tensor(const std::string& s) {
  return torch::from_blob(const_cast<char*>(s.data()), {static_cast<int64_t>(s.size())}, torch::kUInt8).clone();
}

TEST(BnbCheckpointErrors, MalformedOrInconsistentStateNamesTheTensor) {
  QLORA_REQUIRE_FIXTURE(src, "bnb/llama_nf4_dq");
  TempDir tmp("bnb_err");
  const std::string W = "model.layers.0.self_attn.q_proj.weight";
  auto load_err = [&](const std::function<void(std::map<std::string, torch::Tensor>&, json&)>& edit) {
    qlora::remove_tree(tmp.path / "m");
    fs::create_directories(tmp.path / "m");
    rewrite(src, tmp.path / "m", edit);
    return error_of([&] { LlamaModel::load((tmp.path / "m").string(), torch::kFloat32, torch::kCPU); });
  };
  std::string e = load_err([&](auto& t, json&) { t[W + ".quant_state.bitsandbytes__nf4"] = bytes_tensor("{\"quant_type\": "); });
  EXPECT_NE(e.find("tensor '" + W + ".quant_state.bitsandbytes__nf4': malformed quant_state JSON"), std::string::npos) << e;

  e = load_err([&](auto& t, json&) { t[W + ".quant_state.bitsandbytes__nf4"] = bytes_tensor("{\"quant_type\": \"nf4\"}"); });
  EXPECT_NE(e.find("malformed quant_state JSON"), std::string::npos) << e;

  e = load_err([&](auto& t, json&) { t.erase(W + ".nested_absmax"); });
  EXPECT_NE(e.find("tensor '" + W + ".nested_absmax' is missing"), std::string::npos) << e;

  e = load_err([&](auto& t, json&) { t.erase(W + ".absmax"); });
  EXPECT_NE(e.find("tensor '" + W + ".absmax' is missing"), std::string::npos) << e;

  e = load_err([&](auto& t, json&) { t.erase(W + ".quant_state.bitsandbytes__nf4"); });
  EXPECT_NE(e.find("tensor '" + W + "' is U8 (4-bit packed?) but its quant_state tensor"), std::string::npos) << e;

  // config asks fp4, tensors are nf4
  e = load_err([&](auto&, json& c) { c["quantization_config"]["bnb_4bit_quant_type"] = "fp4"; });
  EXPECT_NE(e.find("is stored as nf4 but config.json's quantization_config asks for fp4"), std::string::npos) << e;

  // config asks 8-bit
  e = load_err([&](auto&, json& c) {
    c["quantization_config"]["load_in_8bit"] = true;
    c["quantization_config"]["load_in_4bit"] = false;
  });
  EXPECT_NE(e.find("asks for 8-bit bitsandbytes weights"), std::string::npos) << e;

  // stored 8-bit (int8 + SCB), config asks 4-bit
  e = load_err([&](auto& t, json&) {
    for (const char* s : {"", ".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map",
                          ".quant_state.bitsandbytes__nf4"})
      t.erase(W + s);
    t[W] = torch::zeros({64, 64}, torch::kInt8);
    t[W + ".SCB"] = torch::ones({64});
  });
  EXPECT_NE(e.find("tensor '" + W + "' is stored as 8-bit bitsandbytes (int8 + SCB) but config.json asks for 4-bit nf4"),
            std::string::npos) << e;
}

// ---------------------------------------------------------------------------------------------
// inspect --quant

TEST(InspectQuant, ReportsBytesPerComponentAndBitsPerParam) {
  QLORA_REQUIRE_FIXTURE(dir, "bnb/llama_fp32");
  InspectOptions o;
  o.model_dir = dir.string();
  o.quant = "nf4";
  o.double_quant = true;
  o.json = true;
  const json j = json::parse(cmd_inspect(o));
  const ModelConfig c = load_model_config(dir.string());
  const int64_t H = c.hidden_size, I = c.intermediate_size, kv = c.num_key_value_heads * c.head_dim;
  const std::vector<int64_t> sizes = {H * H, kv * H, kv * H, H * H, I * H, I * H, H * I};
  int64_t qp = 0, qb = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    for (int64_t n : sizes) {
      qp += n;
      qb += quantized_weight_bytes(n, 64, true);
    }
  const auto& comp = j["components"];
  EXPECT_EQ(comp["quantized_weights"]["parameters"].get<int64_t>(), qp);
  EXPECT_EQ(comp["quantized_weights"]["bytes"].get<int64_t>() + comp["quantization_constants"]["bytes"].get<int64_t>(), qb);
  const int64_t fp = 2 * c.vocab_size * H + (2 * c.num_hidden_layers + 1) * H;  // embed, lm_head, norms
  EXPECT_EQ(comp["unquantized_modules"]["parameters"].get<int64_t>(), fp);
  EXPECT_EQ(comp["unquantized_modules"]["bytes"].get<int64_t>(), 4 * fp);  // stored fp32
  EXPECT_EQ(j["parameters"].get<int64_t>(), c.num_parameters());
  EXPECT_NEAR(j["bits_per_quantized_param"].get<double>(), 8.0 * qb / qp, 1e-9);
  EXPECT_EQ(j["rule_of_thumb_bytes"].get<int64_t>(), c.num_parameters() / 2);
  o.json = false;
  const std::string text = cmd_inspect(o);
  EXPECT_NE(text.find("quantization constants"), std::string::npos) << text;
  EXPECT_NE(text.find("rule of thumb"), std::string::npos) << text;
}

// Plain `qlora inspect` on a bitsandbytes 4-bit dir (packed U8 weights + absmax, quant_map,
// nested_*, quant_state entries) counts each linear once, with its quant_state's shape: the
// parameters and tensors are the unquantized model's (transformers' num_parameters() and the
// entries of its model.safetensors, bnb/param_counts.json), component by component the same as
// inspect on the 16-bit source dir; the bytes are the stored ones. Before: 720 "tensors" on
// SmolLM2 and the packed bytes counted as parameters.
TEST(InspectBnb, CountsLogicalWeightsAndStoredBytes) {
  QLORA_REQUIRE_FIXTURE(counts_path, "bnb/param_counts.json");
  QLORA_REQUIRE_FIXTURE(src, "bnb/llama_fp32");
  std::ifstream in(counts_path);
  const json ref = json::parse(in);
  InspectOptions o;
  o.json = true;
  o.model_dir = src.string();
  const json plain = json::parse(cmd_inspect(o));
  EXPECT_EQ(plain["parameters"].get<int64_t>(), ref["num_parameters"].get<int64_t>());
  for (const char* name : {"llama_nf4_dq", "llama_nf4", "llama_fp4_dq", "llama_fp4"}) {
    SCOPED_TRACE(name);
    const fs::path dir = src.parent_path() / name;
    o.model_dir = dir.string();
    const json j = json::parse(cmd_inspect(o));
    EXPECT_EQ(j["parameters"].get<int64_t>(), ref["num_parameters"].get<int64_t>());
    EXPECT_EQ(j["parameters"], j["parameters_expected"]);
    int64_t tensors = 0;
    for (const auto& [comp, c] : j["components"].items()) {
      tensors += c["tensors"].get<int64_t>();
      EXPECT_EQ(c["parameters"], plain["components"][comp]["parameters"]) << comp;
      EXPECT_EQ(c["tensors"], plain["components"][comp]["tensors"]) << comp;
    }
    EXPECT_EQ(tensors, ref["num_tensors"].get<int64_t>());
    // Stored bytes: every entry of the files, the 4-bit ones included.
    int64_t file_bytes = 0;
    const st::SafetensorsCheckpoint ck(dir.string());
    for (const std::string& n : ck.names()) file_bytes += static_cast<int64_t>(ck.info(n).nbytes());
    EXPECT_EQ(j["bytes"].get<int64_t>(), file_bytes);
    const int64_t linear_params = j["bnb_4bit"]["parameters"].get<int64_t>();
    EXPECT_EQ(j["bnb_4bit"]["weights"].get<int64_t>(), 14);  // 2 layers × 7 linears
    EXPECT_LT(j["bnb_4bit"]["stored_bytes"].get<int64_t>(), linear_params);  // ≈ 4.1–4.5 bits each
    EXPECT_EQ(j["components"]["mlp"]["dtypes"], json({std::string(name).find("nf4") != std::string::npos ? "NF4" : "FP4"}));
    o.json = false;
    const std::string text = cmd_inspect(o);
    o.json = true;
    EXPECT_NE(text.find("14 linear weights stored by bitsandbytes in 4 bits"), std::string::npos) << text;
    EXPECT_NE(text.find("stored bytes"), std::string::npos) << text;
    EXPECT_NE(text.find(std::to_string(ref["num_parameters"].get<int64_t>())), std::string::npos) << text;
  }
}

// ---------------------------------------------------------------------------------------------
// Streaming: peak RSS

/// Runs `qlora inspect DIR --quant nf4 --double-quant --json` in a child and returns the child's
/// peak RSS in bytes: the VmHWM it reports of itself (/proc/self/status, per address space, so it
/// starts fresh at exec). getrusage/wait4 ru_maxrss would not do: Linux folds the forked copy of
/// this (large) test process into the child's maxrss at exec.
int64_t child_peak_rss(const fs::path& dir) {
  const std::string cmd = ::qlora::test::qlora_bin() + " inspect '" + dir.string() + "' --quant nf4 --double-quant --json";
  FILE* p = ::popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr);
  if (!p) return 0;
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  EXPECT_EQ(::pclose(p), 0) << cmd << "\n" << out;
  return json::parse(out).at("peak_rss_bytes").get<int64_t>();
}

/// Writes a random fp32 model of config c to dir (config.json + model.safetensors).
void write_model(const ModelConfig& c, const fs::path& dir) {
  fs::create_directories(dir);
  {
    const LlamaModel m = LlamaModel::random_init(c, 1, torch::kFloat32, torch::kCPU);
    save_tensors((dir / "model.safetensors").string(), m.named_tensors(), {{"format", "pt"}});
  }
  std::ofstream(dir / "config.json") << c.to_hf_json().dump(2);
}

// A ~1.1 GB fp32 model (17 layers, hidden 1024, intermediate 2816, vocab 32000) loaded with
// `qlora inspect --quant nf4 --double-quant` must peak at ≤ baseline + 1.2 × (quantized model +
// largest tensor); loading it in full would need +1.1 GB. The baseline is the same command on a
// tiny model (libtorch, allocator arenas), measured in the same run.
TEST(StreamingLoad, PeakRssIsQuantizedModelPlusLargestTensor) {
  TempDir tmp("rss");
  ModelConfig tiny = preset_config("tiny");
  tiny.torch_dtype = "float32";
  tiny.vocab_size = 512;
  ModelConfig big = tiny;
  big.vocab_size = 32000;
  big.hidden_size = 1024;
  big.intermediate_size = 2816;
  big.num_hidden_layers = 17;
  big.num_attention_heads = 16;
  big.num_key_value_heads = 16;
  big.head_dim = 64;
  write_model(tiny, tmp.path / "tiny");
  write_model(big, tmp.path / "big");
  const int64_t file_bytes = static_cast<int64_t>(fs::file_size(tmp.path / "big" / "model.safetensors"));
  ASSERT_GE(file_bytes, 1000ll * 1000 * 1000);

  const int64_t base = child_peak_rss(tmp.path / "tiny");
  const int64_t peak = child_peak_rss(tmp.path / "big");

  // quantized model as loaded: 4-bit linears + fp32 embed, lm_head, norms; largest tensor: embed
  const int64_t H = big.hidden_size, I = big.intermediate_size;
  int64_t model = (2 * big.vocab_size * H + (2 * big.num_hidden_layers + 1) * H) * 4;
  for (int64_t n : {H * H, H * H, H * H, H * H, I * H, I * H, H * I})
    model += big.num_hidden_layers * quantized_weight_bytes(n, 64, true);
  const int64_t largest = big.vocab_size * H * 4;
  const double bound = base + 1.2 * (model + largest);
  std::cout << "file " << file_bytes / 1e6 << " MB; baseline peak RSS " << base / 1e6 << " MB; streaming load peak "
            << peak / 1e6 << " MB; quantized model " << model / 1e6 << " MB + largest tensor " << largest / 1e6
            << " MB; bound " << bound / 1e6 << " MB\n";
  EXPECT_LE(peak, bound);
}

}  // namespace
}  // namespace qlora
