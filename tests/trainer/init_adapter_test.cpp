// lora.model_dir (Axolotl's lora_model_dir): a new run starts from an existing PEFT adapter. The
// external reference is an adapter PEFT itself made and saved (tests/fixtures/peft_make_adapter.py:
// get_peft_model + seeded non-zero lora_B + save_pretrained); `qlora train` runs on the tiny model
// of tiny_run.h. Torch-free itself (it runs the qlora binary and reads safetensors).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/files.h"
#include "common/safetensors.h"
#include "test_util.h"
#include "trainer/tiny_run.h"

namespace fs = std::filesystem;
using qlora::test::CommandResult;
using qlora::test::contains;
using qlora::test::line_with;
using qlora::test::run_command;

namespace {

// Every tensor of a safetensors file as float32 values (F32 only: both PEFT's save of an fp32 model
// and ours write F32), by name.
std::map<std::string, std::vector<float>> read_f32(const fs::path& p) {
  qlora::st::SafetensorsFile f(p.string());
  std::map<std::string, std::vector<float>> out;
  for (const qlora::st::TensorInfo& t : f.tensors()) {
    EXPECT_EQ(t.dtype, qlora::st::DType::F32) << p << ": " << t.name;
    std::vector<float> v(static_cast<size_t>(t.numel()));
    std::memcpy(v.data(), f.data(t), t.nbytes());
    out[t.name] = std::move(v);
  }
  return out;
}

// The largest |a - b| over tensors present in both; fails the test when the key sets differ.
double max_abs_diff(const std::map<std::string, std::vector<float>>& a, const std::map<std::string, std::vector<float>>& b) {
  std::vector<std::string> ka, kb;
  for (const auto& [k, v] : a) ka.push_back(k);
  for (const auto& [k, v] : b) kb.push_back(k);
  EXPECT_EQ(ka, kb);
  double m = 0;
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    if (it == b.end()) continue;
    EXPECT_EQ(v.size(), it->second.size()) << k;
    for (size_t i = 0; i < std::min(v.size(), it->second.size()); ++i)
      m = std::max(m, std::abs(static_cast<double>(v[i]) - static_cast<double>(it->second[i])));
  }
  return m;
}

}  // namespace

class InitAdapter : public qlora::test::TinyRunSuite<InitAdapter> {
 public:
  static constexpr const char* kTempName = "init_adapter";
  static constexpr int kSaveSteps = 0;
  // Two PEFT-made adapters of the tiny model: r 4, alpha 8 (the tiny run's lora section) on
  // all-linear ("peft") and on q_proj, v_proj ("peft_qv").
  static void prepare(const fs::path& root) {
    const std::string py = qlora::test::python_exe();
    if (!setup.expect(!py.empty(), "QLORA_PYTHON is empty (configure with the venv python; scripts/build.sh does)")) return;
    const std::string script = (qlora::test::source_dir() / "tests/fixtures/peft_make_adapter.py").string();
    for (const auto& [dir, targets] : {std::pair<const char*, const char*>{"peft", "all-linear"}, {"peft_qv", "q_proj,v_proj"}}) {
      const CommandResult o = run_command(py + " " + script + " " + (root / "model").string() + " " +
                                          (root / dir).string() + " 4 8 " + targets + " 11");
      if (!setup.expect(o.status == 0, std::string("peft_make_adapter.py ") + targets + " failed", o.out)) return;
    }
  }

 protected:
  // `qlora train` of the tiny run into `out`: one optimizer step, then `extra` (--set ...).
  static CommandResult train(const fs::path& out, const std::string& extra) {
    return run_command(qlora::test::qlora_bin() + " train " + (root / "run.yaml").string() + " --set output_dir=" +
                       out.string() + " --set training.max_steps=1 " + extra);
  }
};

// A run with lora.model_dir = PEFT's adapter starts from PEFT's lora_A / lora_B: after one step at a
// learning rate of 1e-12 (learning_rate must be > 0; AdamW moves each element by about lr) the
// adapter it writes equals PEFT's within 1e-9, while a run without lora.model_dir differs (its B
// starts at zero, its A from another draw).
TEST_F(InitAdapter, RunStartsFromThePeftAdapter) {
  const std::string tiny_lr = "--set training.learning_rate=1e-12 --set training.warmup_steps=0";
  const CommandResult o = train(root / "from_peft", tiny_lr + " --set lora.model_dir=" + (root / "peft").string());
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_TRUE(contains(o.out, "lora: initialised from " + (root / "peft").string() + " (14 modules)")) << o.out;
  const auto peft = read_f32(root / "peft" / "adapter_model.safetensors");
  ASSERT_EQ(peft.size(), 28u);  // the tiny preset: 2 layers x 7 projections x {A, B}
  const auto ours = read_f32(root / "from_peft" / "adapter_model.safetensors");
  EXPECT_LE(max_abs_diff(peft, ours), 1e-9);
  // The resolved config records the key (a run-meaning setting: resume compares it).
  EXPECT_TRUE(contains(qlora::read_file((root / "from_peft" / "config.resolved.yaml").string()), "model_dir: "));

  const CommandResult fresh = train(root / "fresh", tiny_lr);
  ASSERT_EQ(fresh.status, 0) << fresh.out;
  EXPECT_FALSE(contains(fresh.out, "lora: initialised from")) << fresh.out;
  EXPECT_GT(max_abs_diff(peft, read_f32(root / "fresh" / "adapter_model.safetensors")), 1e-3);
}

// An adapter that does not fit this lora section is refused before anything is written: one line
// naming the file and our key, exit 1, no output_dir.
TEST_F(InitAdapter, AdapterThatDoesNotFitIsRefusedWritingNothing) {
  const std::string peft = (root / "peft").string(), qv = (root / "peft_qv").string();
  struct Case {
    const char* name;
    std::string extra;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"other r", "--set lora.model_dir=" + peft + " --set lora.r=8",
       "lora.model_dir: " + peft + "/adapter_config.json has r 4, this config's lora.r is 8 (set lora.r: 4 to continue it)"},
      {"other alpha", "--set lora.model_dir=" + peft + " --set lora.alpha=16",
       "lora.model_dir: " + peft + "/adapter_config.json has lora_alpha 8, this config's lora.alpha is 16 (set lora.alpha: 8"},
      {"other use_rslora", "--set lora.model_dir=" + peft + " --set lora.use_rslora=true",
       "lora.model_dir: " + peft + "/adapter_config.json has use_rslora false, this config's lora.use_rslora is true"},
      {"adapter on fewer modules", "--set lora.model_dir=" + qv,
       "lora.model_dir: " + qv + "/adapter_model.safetensors: adapter does not fit the model: missing key "
       "'base_model.model.model.layers.0.mlp.down_proj.lora_A.weight'"},
      {"adapter on more modules", "--set lora.model_dir=" + peft + " --set 'lora.target_modules=[q_proj, v_proj]'",
       "lora.model_dir: " + peft + "/adapter_model.safetensors: adapter does not fit the model: unexpected key "
       "'base_model.model.model.layers.0.mlp.down_proj.lora_A.weight' (not a module of this model that "
       "lora.target_modules selects)"},
      {"no such directory", "--set lora.model_dir=" + (root / "no_such_adapter").string(),
       "lora.model_dir: " + (root / "no_such_adapter").string() + ": adapter directory not found"},
      {"a directory without adapter_config.json", "--set lora.model_dir=" + (root / "model").string(),
       "lora.model_dir: " + (root / "model").string() + "/adapter_config.json: not found"},
  };
  for (const Case& c : cases) {
    const fs::path out = root / "refused";
    const CommandResult o = train(out, c.extra);
    EXPECT_EQ(o.status, 1) << c.name << ":\n" << o.out;
    const std::string line = line_with(o.out, "lora.model_dir: ");
    EXPECT_TRUE(contains(line, c.expect)) << c.name << ": " << line << "\n" << o.out;
    EXPECT_TRUE(contains(line, "--set lora.model_dir=")) << c.name << ": the key's source first: " << line;
    EXPECT_EQ(line_with(o.out, "lora.model_dir: "), line_with(o.out, "error: "))
        << c.name << ": the error is that one line:\n" << o.out;
    EXPECT_FALSE(fs::exists(out)) << c.name << ": output_dir written";
    qlora::remove_tree(out);
  }
}

// lora.model_dir is a setting that changes the run: a checkpoint's run resumed with another (or no)
// lora.model_dir is refused like any changed setting; with the same one it resumes from the
// checkpoint's weights and does not read the adapter again (it may be gone by then); one that only
// moved (the same files) is the same run.
TEST_F(InitAdapter, ResumeComparesModelDirAndTheCheckpointWins) {
  const fs::path out = root / "resumed", adapter = root / "peft_gone";
  fs::copy(root / "peft", adapter);
  const std::string dir = "--set lora.model_dir=" + adapter.string();
  CommandResult o = train(out, dir + " --set checkpoint.save_steps=1");
  ASSERT_EQ(o.status, 0) << o.out;
  qlora::remove_tree(adapter);
  o = run_command(qlora::test::qlora_bin() + " train " + (root / "run.yaml").string() + " --set output_dir=" +
                  out.string() + " --set training.max_steps=2 --set checkpoint.save_steps=1");
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_TRUE(contains(o.out, "lora.model_dir: " + adapter.string() + " -> (absent)")) << o.out;
  o = run_command(qlora::test::qlora_bin() + " train " + (root / "run.yaml").string() + " --set output_dir=" +
                  out.string() + " --set training.max_steps=2 --set checkpoint.save_steps=1 " + dir);
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_TRUE(contains(o.out, "lora: lora.model_dir " + adapter.string() + " not read: the run resumes from"))
      << o.out;
  EXPECT_FALSE(contains(o.out, "lora: initialised from")) << o.out;
  // Another adapter under another path: refused, naming its files. The same adapter moved (the
  // checkpoint of step 2 was written while it was gone: the digests of the adapter the run started
  // from are carried over): the same run, it resumes.
  const fs::path qv = root / "peft_qv", moved = root / "peft_moved";
  const std::string resume3 = qlora::test::qlora_bin() + " train " + (root / "run.yaml").string() + " --set output_dir=" +
                              out.string() + " --set training.max_steps=3 --set checkpoint.save_steps=1 ";
  o = run_command(resume3 + "--set lora.model_dir=" + qv.string());
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_TRUE(contains(o.out, "lora.model_dir: " + adapter.string() + " -> " + qv.string() +
                                  " (another adapter: adapter_config.json differs, adapter_model.safetensors differs)"))
      << o.out;
  fs::copy(root / "peft", moved);
  o = run_command(resume3 + "--set lora.model_dir=" + moved.string());
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_TRUE(contains(o.out, "resume: lora.model_dir moved: " + adapter.string() + " -> " + moved.string() +
                                  " (the same files: their sampled SHA-256 equal the checkpoint's); the same run"))
      << o.out;
  EXPECT_TRUE(contains(o.out, "checkpoint-2")) << o.out;
}
