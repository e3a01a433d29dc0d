// The imported SmolLM2-135M-Instruct run by our decoder: fp32 logits of a chat prompt equal to
// transformers' model loaded from the same GGUF (`from_pretrained(dir, gguf_file=...)`, fixture
// gguf/smollm2/logits.safetensors from tests/fixtures/make_gguf_refs.py), within 1e-4. Tied
// embeddings (SmolLM2 has no output.weight). The same for the tiny random Qwen3 GGUF (q/k norms,
// head_dim 128 != hidden / heads). And a tiny random Llama 3.1-style GGUF whose llama3 RoPE
// scaling is the tensor rope_freqs.weight: our decoder on the import vs the original HF model
// (llama3 rope_parameters), which transformers' GGUF loader does not reproduce.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/safetensors.h"
#include "common/tensor_io.h"
#include "test_util.h"
#include "model/import_gguf.h"
#include "model/model.h"

namespace {
namespace fs = std::filesystem;

// max |a - b| over two logits tensors (1e9 when their shapes differ, with a failure).
double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  return a.sizes() == b.sizes() ? (a - b).abs().max().item<double>() : 1e9;
}

// Imports `gguf` (fp32) into a fresh dir, runs our decoder on the input_ids of `ref` (a
// make_gguf_refs.py logits.safetensors) and returns our fp32 logits [1, T, V]. `config` (if not
// null) receives the imported config.json. Expects tied embeddings (no output.weight) when `tied`.
torch::Tensor import_and_run(const std::string& gguf, const fs::path& ref, const std::string& name, bool tied,
                             nlohmann::json* config = nullptr) {
  const fs::path dir = qlora::test::fresh_temp_dir("import_logits_" + name);
  qlora::import_gguf({gguf, (dir / name).string(), "fp32"});
  if (config) *config = nlohmann::json::parse(std::ifstream(dir / name / "config.json"));
  qlora::LlamaModel m = qlora::LlamaModel::load((dir / name).string(), torch::kFloat32, torch::kCPU);
  EXPECT_EQ(m.config().tie_word_embeddings, tied);
  const qlora::st::SafetensorsFile r(ref.string());
  const torch::Tensor ids = qlora::load_tensor(r, r.info("input_ids"));
  torch::NoGradGuard ng;
  torch::Tensor ours = m.forward({ids, {}, {}, {}});
  qlora::remove_tree(dir);
  return ours;
}

// import_and_run, then max |ours - transformers'| over the logits of `ref`.
double import_and_compare_logits(const std::string& gguf, const fs::path& ref, const std::string& name) {
  const torch::Tensor ours = import_and_run(gguf, ref, name, /*tied=*/true);
  const qlora::st::SafetensorsFile r(ref.string());
  const torch::Tensor want = qlora::load_tensor(r, r.info("logits"));
  const double d = max_abs_diff(ours, want);
  std::cout << name << " imported, fp32 max|dlogit| vs transformers (GGUF-loaded) = " << d << " over "
            << want.numel() << " logits\n";
  return d;
}

TEST(ImportGgufLogits, SmolLM2Fp32MatchesTransformers) {
  const char* env = std::getenv("QLORA_SMOLLM2_GGUF");
  const std::string gguf =
      env ? env : std::string(std::getenv("HOME")) + "/.cache/qlora-cpp/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(gguf)) FAIL() << gguf << ": missing (run scripts/setup.sh)";
  QLORA_REQUIRE_FIXTURE(ref, "gguf/smollm2/logits.safetensors");
  EXPECT_LE(import_and_compare_logits(gguf, ref, "smollm2"), 1e-4);
}

// The tiny random Qwen3 GGUF (make_gguf_refs.py make_tiny_qwen3: head_dim 128 from
// attention.key_length with hidden 256 / 4 heads, q/k norms, tied, K-quants): our decoder on the
// imported dir vs transformers' model loaded from the GGUF, over a chat prompt.
TEST(ImportGgufLogits, TinyQwen3Fp32MatchesTransformers) {
  QLORA_REQUIRE_FIXTURE(gguf, "gguf/qwen3_tiny/model.gguf");
  QLORA_REQUIRE_FIXTURE(ref, "gguf/qwen3_tiny/logits.safetensors");
  EXPECT_LE(import_and_compare_logits(gguf.string(), ref, "qwen3"), 1e-4);
}

// The tiny random Llama 3.1-style GGUF (make_gguf_refs.py make_tiny_llama31_rope: rope_freqs.weight
// of factor 8, rope_theta 12000, head_dim 16, so its 8 factors are 1 x5, two smooth ones, 8; tied):
// the import writes rope_parameters llama3, and our decoder's logits of a 149-token prompt equal
// the original HF model's (transformers' LlamaForCausalLM with the llama3 rope_parameters and the
// GGUF-loaded state dict) within 1e-4, and differ from the default-RoPE ones (transformers' GGUF
// loader's) by more than 1e-3.
TEST(ImportGgufLogits, TinyLlama31RopeFreqsFp32MatchesOriginalHfModel) {
  QLORA_REQUIRE_FIXTURE(gguf, "gguf/llama31_rope_tiny/model.gguf");
  QLORA_REQUIRE_FIXTURE(ref, "gguf/llama31_rope_tiny/logits.safetensors");
  QLORA_REQUIRE_FIXTURE(ref_default, "gguf/llama31_rope_tiny/logits_default_rope.safetensors");
  nlohmann::json cfg;
  const torch::Tensor ours = import_and_run(gguf.string(), ref, "llama31", /*tied=*/true, &cfg);
  EXPECT_EQ(cfg["rope_parameters"],
            (nlohmann::json{{"rope_type", "llama3"}, {"rope_theta", 12000.0}, {"factor", 8.0},
                            {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                            {"original_max_position_embeddings", 8192}}));
  EXPECT_EQ(cfg["max_position_embeddings"], 131072);
  const qlora::st::SafetensorsFile r(ref.string()), rd(ref_default.string());
  const double d = max_abs_diff(ours, qlora::load_tensor(r, r.info("logits")));
  const double d_default = max_abs_diff(ours, qlora::load_tensor(rd, rd.info("logits")));
  std::cout << "llama31_rope_tiny imported, fp32 max|dlogit| vs the original HF model (llama3 RoPE) = " << d
            << ", vs transformers' GGUF load (default RoPE) = " << d_default << " over " << ours.numel()
            << " logits\n";
  EXPECT_LE(d, 1e-4);
  EXPECT_GT(d_default, 1e-3);
}

}  // namespace
