// Helpers shared by the PEFT parity suites (lora_train_test.cpp, real_model_test.cpp): reference
// files, batches from [B, T] tensors, one train step's loss and gradients, logits at real
// positions, and transformers + PEFT logits through tests/fixtures/peft_logits.py.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "adapters/lora.h"
#include "adapters/peft.h"
#include "common/error.h"
#include "common/files.h"
#include "common/tensor_io.h"
#include "test_util.h"
#include "trainer/batch_tensors.h"
#include "model/model.h"
#include "trainer/train.h"

namespace qlora::peft_test {
namespace fs = std::filesystem;
using Refs = std::map<std::string, torch::Tensor>;
using test::TempDir;
using test::error_of;

inline Refs load_refs(const fs::path& p) {
  st::SafetensorsFile f(p.string());
  Refs out;
  for (const st::TensorInfo& t : f.tensors()) out[t.name] = load_tensor(f, t).clone();
  return out;
}

inline double max_abs(const torch::Tensor& t) { return t.abs().max().item<double>(); }
inline double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

/// A data::Batch from [B, T] long tensors (right padding; segment 1 on real tokens).
inline data::Batch to_batch(const torch::Tensor& ids, const torch::Tensor& labels, const torch::Tensor& mask) {
  data::Batch b;
  b.batch_size = ids.size(0);
  b.seq_len = ids.size(1);
  auto cp = [](const torch::Tensor& t) {
    torch::Tensor c = t.to(torch::kInt32).contiguous();
    return std::vector<int32_t>(c.data_ptr<int32_t>(), c.data_ptr<int32_t>() + c.numel());
  };
  b.input_ids = cp(ids);
  b.labels = cp(labels);
  b.attention_mask = cp(mask);
  b.position_ids = cp((mask.cumsum(-1) - 1).clamp_min(0) * mask);
  b.segment_ids = cp(mask);
  for (int64_t r = 0; r < b.batch_size; ++r) b.example_ids.push_back(r);
  return b;
}

inline TrainingConfig adamw_config(double weight_decay = 0.0) {
  TrainingConfig t;
  t.learning_rate = 1e-3;
  t.adam_beta1 = 0.9;
  t.adam_beta2 = 0.999;
  t.adam_epsilon = 1e-8;
  t.weight_decay = weight_decay;
  return t;
}

/// Base + the adapter in `adapter_dir`, fp32 on the CPU, dropout as stored.
inline LlamaModel with_adapter(const fs::path& base, const fs::path& adapter_dir) {
  LlamaModel m = LlamaModel::load(base.string(), torch::kFloat32, torch::kCPU);
  const PeftConfig pc = read_peft_config(adapter_dir.string());
  const LoraWeights w = load_peft_adapter(adapter_dir.string(), pc, m.lora_shapes(pc.target_modules), kSelectedByAdapterConfig);
  m.set_lora(w, lora_options(pc));
  return m;
}

/// Loss and gradients of one step with lr 0 (a throwaway optimizer: the weights do not move).
/// Returns the loss; gradients by "<module>.lora_A" / ".lora_B".
inline double loss_and_grads(LlamaModel& m, const std::vector<data::Batch>& batches, Refs* grads) {
  auto opt = make_adamw(m.lora_parameters(), adamw_config());
  const StepResult r = train_step(m, *opt, batches, StepOptions{});  // lr 0, no clipping
  grads->clear();
  for (const FrozenLinear* f : m.linears())
    if (f->lora) {
      (*grads)[f->name + ".lora_A"] = f->lora->A.grad().clone();
      (*grads)[f->name + ".lora_B"] = f->lora->B.grad().clone();
    }
  return r.loss;
}

/// Logits at real (unpadded) positions only, [n_real, vocab]: what a padded query position
/// computes is unspecified (transformers' sdpa path and ours differ there; nothing reads it).
inline torch::Tensor real(const torch::Tensor& logits, const Refs& in) {
  return logits.index({in.at("attention_mask").to(torch::kBool)});
}

/// Our logits for the fixture batch, real positions only.
inline torch::Tensor logits_of(const LlamaModel& m, const Refs& in) {
  torch::NoGradGuard ng;
  ForwardInputs fi;
  fi.input_ids = in.at("input_ids");
  fi.attention_mask = in.at("attention_mask");
  fi.position_ids = in.at("position_ids");
  return real(m.forward(fi).to(torch::kFloat32), in);
}

inline std::string python() { return ::qlora::test::python_exe(); }

/// Runs tests/fixtures/peft_logits.py (transformers + PEFT) and returns its logits.
inline torch::Tensor python_logits(const fs::path& model_dir, const std::string& adapter_dir, const Refs& in,
                            const fs::path& work) {
  const fs::path inp = work / "input.safetensors", out = work / "logits.safetensors", log = work / "python.log";
  save_tensors(inp.string(), {{"input_ids", in.at("input_ids")},
                              {"attention_mask", in.at("attention_mask")},
                              {"position_ids", in.at("position_ids")}});
  const std::string cmd = python() + " " + (test::source_dir() / "tests/fixtures/peft_logits.py").string() + " " +
                          model_dir.string() + " " + adapter_dir + " " + out.string() + " " + inp.string() + " > " +
                          log.string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    ADD_FAILURE() << "peft_logits.py failed (" << rc << "):\n" << read_file(log.string());
    return {};
  }
  return real(load_refs(out).at("logits"), in);
}

#define QLORA_REQUIRE_PYTHON()                                                                \
  if (python().empty()) FAIL() << "QLORA_PYTHON is empty (configure with the venv python; scripts/build.sh does)"

}  // namespace qlora::peft_test
