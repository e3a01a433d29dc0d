// safetensors writer/reader round trip (every dtype, zero-copy views, sharded checkpoints) and
// agreement with the Python `safetensors` package's files (the fixture models).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "common/files.h"
#include "common/tensor_io.h"
#include "test_util.h"

namespace qlora {
namespace {
namespace fs = std::filesystem;

TEST(Safetensors, RoundTripsEveryDtype) {
  const test::TempDir tmp("st_rt");  // removed when the test ends, pass or fail
  const fs::path d = tmp.path;
  std::vector<std::pair<std::string, torch::Tensor>> ts = {
      {"f32", torch::randn({3, 5})},
      {"f16", torch::randn({7}).to(torch::kHalf)},
      {"bf16", torch::randn({2, 3, 4}).to(torch::kBFloat16)},
      {"f64", torch::randn({2}).to(torch::kDouble)},
      {"i64", torch::arange(10)},
      {"i32", torch::arange(9).to(torch::kInt)},
      {"i16", torch::arange(3).to(torch::kShort)},
      {"i8", torch::arange(-3, 3).to(torch::kChar)},
      {"u8", torch::arange(0, 255).to(torch::kByte)},
      {"bool", torch::rand({5}) > 0.5},
      {"scalar", torch::tensor(3.5f)},
      {"empty", torch::empty({0, 4})},
      {"strided", torch::randn({4, 6}).t()},  // non-contiguous input is written contiguously
  };
  save_tensors((d / "a.safetensors").string(), ts, {{"format", "pt"}});
  st::SafetensorsFile f((d / "a.safetensors").string());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  for (const auto& [name, t] : ts) {
    torch::Tensor back = load_tensor(f, f.info(name));
    EXPECT_EQ(back.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(back.sizes(), t.sizes()) << name;
    EXPECT_TRUE(torch::equal(back, t.contiguous())) << name;
  }
  // writing into a zero-copy view never touches the file
  torch::Tensor v = load_tensor(f, f.info("f32"));
  v.fill_(0);
  st::SafetensorsFile again((d / "a.safetensors").string());
  EXPECT_TRUE(torch::equal(load_tensor(again, again.info("f32")), ts[0].second));
}

TEST(Safetensors, WriterIsAtomicAndRejectsDuplicates) {
  const test::TempDir tmp("st_atomic");  // removed when the test ends, pass or fail
  const fs::path d = tmp.path;
  const std::string p = (d / "x.safetensors").string();
  save_tensors(p, {{"a", torch::ones({2})}});
  const std::string before = read_file(p);
  EXPECT_THROW(save_tensors(p, {{"a", torch::ones({2})}, {"a", torch::zeros({2})}}), Error);
  EXPECT_EQ(read_file(p), before);
  for (const auto& e : fs::directory_iterator(d)) EXPECT_EQ(e.path().filename(), "x.safetensors");
}

TEST(Safetensors, ReadsTransformersShardedCheckpoint) {
  QLORA_REQUIRE_FIXTURE(dir, "models/mistral_sharded");
  st::SafetensorsCheckpoint ck(dir.string());
  EXPECT_GT(ck.num_shards(), 1u);
  EXPECT_TRUE(ck.contains("model.layers.1.mlp.down_proj.weight"));
  torch::Tensor w = load_tensor(ck, "model.norm.weight");
  EXPECT_EQ(w.scalar_type(), torch::kFloat);
}

TEST(Safetensors, ShardIndexErrorsNameTheTensor) {
  QLORA_REQUIRE_FIXTURE(src, "models/mistral_sharded");
  const test::TempDir tmp("st_idx");  // removed when the test ends, pass or fail
  const fs::path d = tmp.path;
  for (const auto& e : fs::directory_iterator(src)) fs::copy_file(e.path(), d / e.path().filename());
  std::string idx = read_file((d / "model.safetensors.index.json").string());
  const std::string from = "\"model.norm.weight\": \"";
  auto at = idx.find(from);
  ASSERT_NE(at, std::string::npos);
  auto end = idx.find('"', at + from.size());
  std::string other = idx.substr(at + from.size(), end - at - from.size()) == "model-00001-of-00006.safetensors"
                          ? "model-00002-of-00006.safetensors"
                          : "model-00001-of-00006.safetensors";
  idx.replace(at + from.size(), end - at - from.size(), other);
  atomic_write_string((d / "model.safetensors.index.json").string(), idx);
  try {
    st::SafetensorsCheckpoint ck(d.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'model.norm.weight'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qlora
