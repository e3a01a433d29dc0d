// The imported SmolLM2-135M-Instruct run by our decoder: fp32 logits of a chat prompt equal to
// transformers' model loaded from the same GGUF (`from_pretrained(dir, gguf_file=...)`, fixture
// gguf/smollm2/logits.safetensors from tests/fixtures/make_gguf_refs.py), within 1e-4. Tied
// embeddings (SmolLM2 has no output.weight). The same for the tiny random Qwen3 GGUF (q/k norms,
// head_dim 128 != hidden / heads).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "common/safetensors.h"
#include "common/tensor_io.h"
#include "test_util.h"
#include "model/import_gguf.h"
#include "model/model.h"

namespace {
namespace fs = std::filesystem;

// Imports `gguf` (fp32) into a fresh dir, runs our decoder on the fixture's input_ids and returns
// max |ours - transformers'| over the logits of `ref` (a make_gguf_refs.py logits.safetensors).
// Both models here have tied embeddings (no output.weight).
double import_and_compare_logits(const std::string& gguf, const fs::path& ref, const std::string& name) {
  const fs::path dir = qlora::test::fresh_temp_dir("import_logits_" + name);
  qlora::import_gguf({gguf, (dir / name).string(), "fp32"});
  qlora::LlamaModel m = qlora::LlamaModel::load((dir / name).string(), torch::kFloat32, torch::kCPU);
  EXPECT_TRUE(m.config().tie_word_embeddings);
  const qlora::st::SafetensorsFile r(ref.string());
  const torch::Tensor ids = qlora::load_tensor(r, r.info("input_ids"));
  const torch::Tensor want = qlora::load_tensor(r, r.info("logits"));
  torch::NoGradGuard ng;
  const torch::Tensor ours = m.forward({ids, {}, {}, {}});
  EXPECT_EQ(ours.sizes(), want.sizes());
  const double d = ours.sizes() == want.sizes() ? (ours - want).abs().max().item<double>() : 1e9;
  std::cout << name << " imported, fp32 max|dlogit| vs transformers (GGUF-loaded) = " << d << " over "
            << want.numel() << " logits\n";
  fs::remove_all(dir);
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

}  // namespace
