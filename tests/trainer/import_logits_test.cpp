// The imported SmolLM2-135M-Instruct run by our decoder: fp32 logits of a chat prompt equal to
// transformers' model loaded from the same GGUF (`from_pretrained(dir, gguf_file=...)`, fixture
// gguf/smollm2/logits.safetensors from tests/fixtures/make_gguf_refs.py), within 1e-4. Tied
// embeddings (SmolLM2 has no output.weight).
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

TEST(ImportGgufLogits, SmolLM2Fp32MatchesTransformers) {
  const char* env = std::getenv("QLORA_SMOLLM2_GGUF");
  const std::string gguf =
      env ? env : std::string(std::getenv("HOME")) + "/.cache/qlora-cpp/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(gguf)) FAIL() << gguf << ": missing (run scripts/setup.sh)";
  QLORA_REQUIRE_FIXTURE(ref, "gguf/smollm2/logits.safetensors");
  const fs::path dir = qlora::test::fresh_temp_dir("import_logits");
  qlora::import_gguf({gguf, (dir / "smollm2").string(), "fp32"});
  qlora::LlamaModel m = qlora::LlamaModel::load((dir / "smollm2").string(), torch::kFloat32, torch::kCPU);
  EXPECT_TRUE(m.config().tie_word_embeddings);
  const qlora::st::SafetensorsFile r(ref.string());
  const torch::Tensor ids = qlora::load_tensor(r, r.info("input_ids"));
  const torch::Tensor want = qlora::load_tensor(r, r.info("logits"));
  torch::NoGradGuard ng;
  const torch::Tensor ours = m.forward({ids, {}, {}, {}});
  ASSERT_EQ(ours.sizes(), want.sizes());
  const double d = (ours - want).abs().max().item<double>();
  std::cout << "SmolLM2 imported, fp32 max|dlogit| vs transformers (GGUF-loaded) = " << d << " over "
            << want.numel() << " logits\n";
  EXPECT_LE(d, 1e-4);
  fs::remove_all(dir);
}

}  // namespace
