// Issue 14, the NCCL backend on one GPU (scripts/device-check.sh, step nccl-smoke): `qlora train`
// of the tiny run (tiny NF4 model, fp32, 4 steps) on CUDA as rank 0 of 1 with QLORA_DIST_FORCE_PG=1,
// so a c10d::ProcessGroupNCCL is made over the TCPStore and every collective of a step (target
// count, the flat gradient buffer, loss sum, stop flag, replica checksums, barriers) runs through
// NCCL on cuda:0; compared with the same run without the process group. A one-rank NCCL sum is a
// copy, so the adapter and every step's loss must be byte-identical (deterministic algorithms on,
// as in CudaTraining.ResumeAfterSigtermIsByteIdentical). A build without NCCL fails this test
// (qlora refuses CUDA with a process group), it does not skip it.
// CudaNccl.* skips without a GPU (tests/skip_allowlist.txt) and must report OK on the device.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include <torch/torch.h>

#include "common/files.h"
#include "test_util.h"
#include "trainer/tiny_run.h"

namespace qlora {
namespace {
namespace fs = std::filesystem;

std::map<int64_t, std::string> step_lines(const fs::path& out) {
  std::map<int64_t, std::string> m;
  std::ifstream in(out / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    const int64_t step = j["step"].get<int64_t>();
    // loss, grad_norm, tokens, lr: the numbers of the step (not its timings or memory)
    m[step] = nlohmann::json{{"loss", j["loss"]}, {"grad_norm", j["grad_norm"]}, {"tokens", j["tokens"]},
                             {"lr", j["lr"]}}.dump();
  }
  return m;
}

TEST(CudaNccl, ForcedProcessGroupOnOneGpuEqualsTheSingleProcess) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  const fs::path root = qlora::test::fresh_temp_dir("cuda_nccl");
  auto o = qlora::test::make_tiny_run(root, 0);
  ASSERT_EQ(o.status, 0) << o.out;
  const std::string env = "QLORA_DETERMINISTIC=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 CUDA_VISIBLE_DEVICES=0 ";
  auto train = [&](const fs::path& out, const std::string& extra_env) {
    return qlora::test::run_command(env + extra_env + " " + ::qlora::test::qlora_bin() + " train " + (root / "run.yaml").string() +
                                    " --set output_dir=" + out.string() + " --set training.max_steps=4");
  };
  o = train(root / "plain", "");
  ASSERT_EQ(o.status, 0) << o.out;
  ASSERT_NE(o.out.find("device cuda"), std::string::npos) << o.out;
  const int port = qlora::test::free_tcp_port();
  ASSERT_GT(port, 0);
  o = train(root / "nccl", "QLORA_DIST_FORCE_PG=1 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 "
                           "QLORA_DIST_TIMEOUT_S=120 MASTER_PORT=" + std::to_string(port));
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("distributed: rank 0 of 1 (local rank 0, from RANK/WORLD_SIZE), NCCL on cuda:0"), std::string::npos)
      << o.out;
  EXPECT_NE(o.out.find("device cuda:0"), std::string::npos) << o.out;
  const auto a = step_lines(root / "plain"), b = step_lines(root / "nccl");
  EXPECT_EQ(a.size(), 4u);
  EXPECT_EQ(b, a);
  EXPECT_EQ(read_file((root / "nccl" / "adapter_model.safetensors").string()),
            read_file((root / "plain" / "adapter_model.safetensors").string()));
  qlora::remove_tree(root);
}

}  // namespace
}  // namespace qlora
