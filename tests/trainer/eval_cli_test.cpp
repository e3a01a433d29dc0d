// `qlora eval --model DIR --data FILE` without a config: an adapter trained here (its run dir, or a
// checkpoint dir) brings its run's rendering, labelling and quantization keys (adapter_run_keys()),
// a template that is not the model's own is warned about, exact_match refuses raw text.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;
using CliRun = qlora::test::CommandResult;

CliRun run(const std::string& args) { return qlora::test::run_command(::qlora::test::qlora_bin() + " " + args); }
std::string q(const fs::path& p) { return "'" + p.string() + "'"; }
using qlora::test::read_json;

// A 2-step run (alpaca template, sequence_len 256, NF4 without double quant, a checkpoint every
// step): eval of checkpoints/checkpoint-2 uses alpaca / 256 / no double quant as eval of the run dir
// does, not the defaults (chatml / 2048 / double quant).
TEST(EvalCli, CheckpointDirGivesItsRunsTemplateAndLength) {
  QLORA_REQUIRE_SHARED(data, "data/alpaca_en_demo.json");
  QLORA_REQUIRE_SHARED(tokenizer, "tokenizers/llama2/tokenizer.model");
  const qlora::test::TempDir d("eval_ckpt");
  CliRun r = run("init-model --preset tiny --out " + q(d.path / "model") + " --tokenizer " + q(tokenizer) + " --seed 0");
  ASSERT_EQ(r.status, 0) << r.out;
  const fs::path cfg = d.path / "run.yaml";
  std::ofstream(cfg) << "output_dir: " << (d.path / "run").string() << "\nmodel:\n  path: " << (d.path / "model").string()
                     << "\n  dtype: fp32\nquantization:\n  method: nf4\n  double_quant: false\nlora:\n  r: 4\n  alpha: 8\n"
                     << "data:\n  train: " << data.string() << "\n  template: alpaca\n  sequence_len: 256\n"
                     << "  val_set_size: 0\ntraining:\n  micro_batch_size: 1\n  gradient_accumulation_steps: 1\n"
                     << "  max_steps: 2\n  gradient_checkpointing: false\n  eval_steps: 0\n"
                     << "checkpoint:\n  save_steps: 1\n  save_minutes: 0\n  resume: never\n";
  r = run("train " + q(cfg));
  ASSERT_EQ(r.status, 0) << r.out;
  // the run's own config warning is train's (warmup_steps 10 >= max_steps 2), not eval's below
  const std::string warmup = "config: training.warmup_steps (10) >= training.max_steps (2): the run never leaves warmup";
  EXPECT_NE(r.out.find("warning: " + warmup), std::string::npos) << r.out;
  const fs::path ck = d.path / "run" / "checkpoints" / "checkpoint-2";
  ASSERT_TRUE(fs::exists(ck / "trainer_state.json")) << r.out;
  ASSERT_FALSE(fs::exists(ck / "config.resolved.yaml"));
  for (const fs::path& adapter : {d.path / "run", ck}) {
    r = run("eval --model " + q(d.path / "model") + " --data " + q(data) + " --adapter " + q(adapter) +
            " --max-examples 2 --out " + q(d.path / "eval.json"));
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("eval: data.template alpaca, data.sequence_len 256, "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("(template alpaca, sequence_len 256, quantization nf4)"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find(warmup), std::string::npos) << "a trial: the run's config warned in eval: " << r.out;
    EXPECT_EQ(r.out.find("by default: the model is evaluated as a QLoRA run"), std::string::npos) << r.out;
    EXPECT_EQ(read_json(d.path / "eval.json")["template"], "alpaca") << adapter;
    EXPECT_EQ(read_json(d.path / "eval.json")["sequence_len"], 256) << adapter;
    // and the run's quantization (no double quant here), not the NF4 double-quant default
    EXPECT_NE(r.out.find(", quantization nf4 (blocksize 64, double_quant false), model.dtype fp32, "
                         "training.micro_batch_size 1 from " + adapter.string()),
              std::string::npos) << r.out;
    EXPECT_EQ(read_json(d.path / "eval.json")["quantization"],
              json({{"method", "nf4"}, {"blocksize", 64}, {"double_quant", false}}));
    EXPECT_EQ(read_json(d.path / "eval.json")["dtype"], "fp32");
  }
  // --set still wins over the checkpoint's values
  r = run("eval --model " + q(d.path / "model") + " --data " + q(data) + " --adapter " + q(ck) +
          " --max-examples 2 --set data.sequence_len=128 --out " + q(d.path / "eval.json"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(read_json(d.path / "eval.json")["sequence_len"], 128);
  // merge of the checkpoint knows its NF4 training as merge of the run dir does (read_adapter_run;
  // before: only a run dir's config.resolved.yaml was read, so a checkpoint merged without a word)
  r = run("merge --base " + q(d.path / "model") + " --adapter " + q(ck) + " --out " + q(d.path / "merged") +
          " --dtype fp32");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("merge: the adapter was trained on the nf4-quantized base (" + (ck / "trainer_state.json").string()),
            std::string::npos) << r.out;
  // a checkpoint whose trainer_state.json has no config (written before it carried one): its run
  // dir's config.resolved.yaml
  json state = read_json(ck / "trainer_state.json");
  ASSERT_TRUE(state.contains("config"));
  state.erase("config");
  std::ofstream(ck / "trainer_state.json") << state.dump();
  r = run("eval --model " + q(d.path / "model") + " --data " + q(data) + " --adapter " + q(ck) +
          " --max-examples 2 --out " + q(d.path / "eval.json"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("from " + (d.path / "run" / "config.resolved.yaml").string() + " (the adapter's training run)"),
            std::string::npos) << r.out;
  EXPECT_EQ(read_json(d.path / "eval.json")["sequence_len"], 256);
}

// No config, no adapter: the default template (chatml) on a model whose own chat template is
// smollm2's is warned about (data::template_mismatch_note, as train and data preview warn), before
// the model loads (the tokenizer fixture dir has no weights, so the run then stops at the load);
// with the model's own template there is no warning.
TEST(EvalCli, WarnsWhenTheTemplateIsNotTheModelsOwn) {
  QLORA_REQUIRE_FIXTURE(smol, "tokenizers/smollm2/tokenizer_config.json");
  QLORA_REQUIRE_SHARED(data, "data/alpaca_en_demo.json");
  const std::string base = "eval --model " + q(smol.parent_path()) + " --data " + q(data) + " --max-examples 2";
  CliRun r = run(base);
  EXPECT_NE(r.out.find("eval: data.template is chatml, but the model's own chat template is smollm2's"),
            std::string::npos) << r.out;
  r = run(base + " --set data.template=smollm2");
  EXPECT_EQ(r.out.find("eval: data.template is"), std::string::npos) << r.out;
  r = run(base + " --set data.template=auto");
  EXPECT_EQ(r.out.find("eval: data.template is"), std::string::npos) << r.out;
}

// `qlora eval CONFIG` with data.eval a list of two files of two formats: the examples of both, in
// order; the loss is the target-weighted mean of each file's own (mean next-token CE over all
// targets, as each file alone reports it); each file's unused records are warned about under its
// own name; eval.json names both files.
TEST(EvalCli, EvalListIsTheConcatenationOfItsFiles) {
  QLORA_REQUIRE_SHARED(tokenizer, "tokenizers/llama2/tokenizer.model");
  const qlora::test::TempDir d("eval_list");
  const fs::path e1 = d.path / "e1.json", e2 = d.path / "e2.jsonl", cfg = d.path / "eval.yaml";
  std::ofstream(e1) << R"([{"instruction": "Name a colour.", "output": "Blue."},
 {"instruction": "Add 2 and 3.", "output": "5"}])";
  std::ofstream(e2) << R"({"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello, how can I help?"}]})"
                    << "\n"
                    << R"({"conversations": [{"from": "human", "value": "Nobody answers"}]})" << "\n"
                    << R"({"conversations": [{"from": "human", "value": "Capital of Peru?"}, {"from": "gpt", "value": "Lima"}]})"
                    << "\n";
  std::ofstream(cfg) << "output_dir: " << (d.path / "run").string() << "\nmodel:\n  preset: tiny\n  init: random\n"
                     << "  tokenizer: " << tokenizer.string() << "\n  dtype: fp32\ndata:\n  train: " << e1.string()
                     << "\n  template: chatml\n  sequence_len: 256\n";
  auto eval = [&](const std::string& set, const fs::path& out) {
    CliRun r = run("eval " + q(cfg) + " --set " + q(set) + " --out " + q(out));
    EXPECT_EQ(r.status, 0) << r.out;
    return std::make_pair(read_json(out), r.out);
  };
  const auto [j1, out1] = eval("data.eval=" + e1.string(), d.path / "1.json");
  const auto [j2, out2] = eval("data.eval=" + e2.string(), d.path / "2.json");
  const auto [j, out] = eval("data.eval=[" + e1.string() + ", {path: " + e2.string() + ", format: sharegpt}]",
                             d.path / "list.json");
  EXPECT_EQ(j["examples"], 4);
  EXPECT_EQ(j1["examples"].get<int>() + j2["examples"].get<int>(), 4);
  const double t1 = j1["targets"].get<double>(), t2 = j2["targets"].get<double>();
  EXPECT_EQ(j["targets"].get<double>(), t1 + t2);
  EXPECT_NEAR(j["loss"].get<double>(), (j1["loss"].get<double>() * t1 + j2["loss"].get<double>() * t2) / (t1 + t2),
              1e-4 * j["loss"].get<double>());
  EXPECT_EQ(j["data"], e1.string() + ", " + e2.string());
  EXPECT_NE(out.find("data: " + e2.string() + ": 1 of 3 records not used"), std::string::npos) << out;
  EXPECT_EQ(out.find("data: " + e1.string() + ":"), std::string::npos) << out;
}

// A before/after pair on one config: the base model's eval (no --adapter) goes to
// <output_dir>/eval_base.json, the adapter's to <adapter>/eval.json; when output_dir is the run's
// own dir (its final adapter) neither overwrites the other (before: both were output_dir/eval.json,
// the adapter's result silently replaced). A result file that cannot be written is refused before
// the model loads and the evaluation runs. (The run's sequence_len 4096, past the tiny preset's 2048
// positions, is warned about by train; merge's warnings are checked on the same run at the end.)
TEST(EvalCli, BaseAndAdapterEvalsKeepTheirOwnFiles) {
  QLORA_REQUIRE_SHARED(data, "data/alpaca_en_demo.json");
  QLORA_REQUIRE_SHARED(tokenizer, "tokenizers/llama2/tokenizer.model");
  const qlora::test::TempDir d("eval_pair");
  const fs::path run_dir = d.path / "run", cfg = d.path / "run.yaml", model = d.path / "model";
  CliRun r = run("init-model --preset tiny --out " + q(model) + " --tokenizer " + q(tokenizer) + " --seed 0");
  ASSERT_EQ(r.status, 0) << r.out;
  std::ofstream(cfg) << "output_dir: " << run_dir.string() << "\nmodel:\n  path: " << model.string()
                     << "\n  dtype: fp32\nquantization:\n  method: nf4\nlora:\n  r: 4\n  alpha: 8\n"
                     << "data:\n  train: " << data.string() << "\n  template: alpaca\n  sequence_len: 4096\n"
                     << "  val_set_size: 4\ntraining:\n  micro_batch_size: 1\n  gradient_accumulation_steps: 1\n"
                     << "  max_steps: 1\n  learning_rate: 0.01\n  warmup_steps: 0\n  eval_steps: 0\n"
                     << "checkpoint:\n  save_steps: 0\n  save_minutes: 0\n";
  // data preview says it too, before any training (trial 23: only train and estimate did)
  r = run("data preview " + q(cfg) + " --n 0");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("data.sequence_len: sequence length 4096 exceeds the model's max_position_embeddings 2048 "
                       "(config.json): positions past it were never trained (RoPE extrapolation)\n"),
            std::string::npos) << r.out;
  r = run("train " + q(cfg));
  ASSERT_EQ(r.status, 0) << r.out;
  // train warns as `qlora estimate` does when sequence_len is past the model's positions (tiny: 2048)
  EXPECT_NE(r.out.find("memory estimate: sequence length 4096 exceeds the model's max_position_embeddings 2048"),
            std::string::npos) << r.out;
  r = run("eval " + q(cfg) + " --adapter " + q(run_dir));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("wrote " + (run_dir / "eval.json").string()), std::string::npos) << r.out;
  r = run("eval " + q(cfg));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("wrote " + (run_dir / "eval_base.json").string()), std::string::npos) << r.out;
  // the demo's repeats are warned of by eval CONFIG too, as by train (its eval set is the config's)
  EXPECT_NE(r.out.find("data: 14 records duplicate an earlier one"), std::string::npos) << r.out;
  EXPECT_EQ(read_json(run_dir / "eval.json")["adapter"], run_dir.string());
  EXPECT_EQ(read_json(run_dir / "eval_base.json")["adapter"], "");
  // --out under a regular file: refused up front, naming the file, before any loss is computed
  const fs::path blocker = d.path / "a_file";
  std::ofstream(blocker) << "x";
  r = run("eval " + q(cfg) + " --out " + q(blocker / "sub" / "e.json"));
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("eval: result file " + (blocker / "sub" / "e.json").string() + ": cannot write there: " +
                       blocker.string() + " is not a directory"),
            std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("target tokens: loss"), std::string::npos) << r.out;

  // merge says what the merged model is: this NF4-trained adapter merged into the unquantized
  // weights is not the model eval measured; merged into an already merged model (not the base
  // adapter_config.json names) it is merged twice. Neither is said of the plain case.
  r = run("merge --base " + q(model) + " --adapter " + q(run_dir) + " --out " + q(d.path / "m1") + " --dtype fp32");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("merge: the adapter was trained on the nf4-quantized base"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("names the base"), std::string::npos) << r.out;
  r = run("merge --base " + q(d.path / "m1") + " --adapter " + q(run_dir) + " --out " + q(d.path / "m2") +
          " --dtype fp32");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("adapter_config.json names the base " + model.string() + ", not --base " +
                       (d.path / "m1").string()),
            std::string::npos) << r.out;
}

}  // namespace

namespace {

// The tiny model and a run trained on it with every rendering / labelling key of
// adapter_run_keys() away from its default: chatml with its own default_system_message,
// train_on_inputs, no EOS, truncation truncate at 96 tokens (every alpaca record is longer: the
// default, drop, keeps none), NF4, format alpaca (a layout key: not brought); data.eval is evaluated by the run at its end (summary.json
// eval_loss, the trial's reference). Returns {model, run dir, eval file}.
struct RenderRun {
  fs::path model, run, eval_file, config;
};
RenderRun make_render_run(const fs::path& dir, const fs::path& tokenizer, const fs::path& alpaca) {
  RenderRun rr{dir / "model", dir / "run", dir / "ev.json", dir / "run.yaml"};
  CliRun r = run("init-model --preset tiny --out " + q(rr.model) + " --tokenizer " + q(tokenizer) + " --seed 0");
  EXPECT_EQ(r.status, 0) << r.out;
  const json all = read_json(alpaca);
  std::ofstream(dir / "train.json") << json(std::vector<json>(all.begin(), all.begin() + 20)).dump();
  {  // a record a line (record k of 6 on line k + 2), so a prediction's source line is known
    std::ofstream ev(rr.eval_file);
    ev << "[\n";
    for (int i = 40; i < 46; ++i) ev << all[size_t(i)].dump() << (i < 45 ? ",\n" : "\n");
    ev << "]\n";
  }
  std::ofstream(rr.config) << "output_dir: " << rr.run.string() << "\nmodel:\n  path: " << rr.model.string()
                           << "\n  dtype: bf16\nquantization:\n  method: nf4\nlora:\n  r: 4\n  alpha: 8\n"
                           << "data:\n  train: " << (dir / "train.json").string() << "\n  eval: " << rr.eval_file.string()
                           << "\n  format: alpaca\n  template: chatml\n  sequence_len: 96\n  truncation: truncate\n"
                           << "  train_on_inputs: true\n  add_eos: false\n"
                           << "  default_system_message: You are Quokka, made by Acme Labs.\n"
                           << "training:\n  micro_batch_size: 2\n  gradient_accumulation_steps: 1\n  max_steps: 2\n"
                           << "  learning_rate: 0.01\n  warmup_steps: 0\n  eval_steps: 0\n  gradient_checkpointing: false\n"
                           << "checkpoint:\n  save_steps: 1\n  save_minutes: 0\n";
  r = run("train " + q(rr.config));
  EXPECT_EQ(r.status, 0) << r.out;
  return rr;
}

}  // namespace

// `eval --model --data --adapter RUN` renders and labels --data as the run did (the trial: a run
// with its own default_system_message evaluated under the template's default system prompt gave
// 3.13 for a training eval_loss of 1.18; a truncation run's long records were dropped): its loss
// is the run's own eval_loss of that file (summary.json) and the loss of `eval CONFIG --data`, for
// the run dir and its checkpoint alike; each brought key is logged with its source; --set wins and
// is logged as the source of its value (before: the run's quantization was logged under
// --set quantization.method=none); exact_match finds the answers of a train_on_inputs run.
TEST(EvalCli, AdapterRunBringsEveryRenderingAndLabellingKey) {
  QLORA_REQUIRE_SHARED(data, "data/alpaca_en_demo.json");
  QLORA_REQUIRE_SHARED(tokenizer, "tokenizers/llama2/tokenizer.model");
  const qlora::test::TempDir d("eval_run_keys");
  const RenderRun rr = make_render_run(d.path, tokenizer, data);
  const double train_eval_loss = read_json(rr.run / "summary.json")["eval_loss"].get<double>();
  CliRun r = run("eval " + q(rr.config) + " --adapter " + q(rr.run) + " --data " + q(rr.eval_file) + " --out " +
                 q(d.path / "ref.json"));
  ASSERT_EQ(r.status, 0) << r.out;
  const json ref = read_json(d.path / "ref.json");
  EXPECT_EQ(ref["examples"], 6);
  EXPECT_NEAR(ref["loss"].get<double>(), train_eval_loss, 1e-5 * train_eval_loss);
  const std::string base = "eval --model " + q(rr.model) + " --data " + q(rr.eval_file);
  for (const fs::path& adapter : {rr.run, rr.run / "checkpoints" / "checkpoint-2"}) {
    r = run(base + " --adapter " + q(adapter) + " --out " + q(d.path / "e.json"));
    ASSERT_EQ(r.status, 0) << r.out;
    const json j = read_json(d.path / "e.json");
    EXPECT_EQ(j["examples"], ref["examples"]) << adapter;
    EXPECT_EQ(j["targets"], ref["targets"]) << adapter;
    EXPECT_NEAR(j["loss"].get<double>(), train_eval_loss, 1e-5 * train_eval_loss) << adapter;
    EXPECT_NE(r.out.find("eval: data.template chatml, data.sequence_len 96, data.truncation truncate, "
                         "data.train_on_inputs true, data.add_eos false, data.default_system_message "
                         "\"You are Quokka, made by Acme Labs.\", quantization nf4 (blocksize 64, double_quant true), "
                         "model.dtype bf16, training.micro_batch_size 2 from " + adapter.string()),
              std::string::npos) << r.out;
    // the run's file layout keys are named, not applied to --data
    EXPECT_NE(r.out.find("eval: the run's data.format describes its own files and is not applied to --data " +
                         rr.eval_file.string()),
              std::string::npos) << r.out;
  }
  // no --model: the base adapter_config.json names (as AutoPeftModelForCausalLM), the same loss;
  // a base that is not a local directory is refused naming the file
  r = run("eval --adapter " + q(rr.run) + " --data " + q(rr.eval_file) + " --out " + q(d.path / "e.json"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("eval: model " + fs::absolute(rr.model).lexically_normal().string() + " (the base " +
                       (rr.run / "adapter_config.json").string() + " names; --model DIR for another)"),
            std::string::npos) << r.out;
  EXPECT_EQ(read_json(d.path / "e.json")["loss"], ref["loss"]);
  {
    const fs::path moved = d.path / "moved_adapter";
    fs::create_directories(moved);
    fs::copy_file(rr.run / "adapter_model.safetensors", moved / "adapter_model.safetensors");
    json pc = read_json(rr.run / "adapter_config.json");
    pc["base_model_name_or_path"] = "HuggingFaceTB/SmolLM2-135M-Instruct";
    std::ofstream(moved / "adapter_config.json") << pc.dump();
    r = run("eval --adapter " + q(moved) + " --data " + q(rr.eval_file));
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_NE(r.out.find("error: " + (moved / "adapter_config.json").string() + ": base_model_name_or_path "
                         "'HuggingFaceTB/SmolLM2-135M-Instruct' is not a local directory (a hub id, a preset, or a moved "
                         "model): give --model DIR"),
              std::string::npos) << r.out;
  }
  // --set wins, and the log says so (the run's values named), not the run's value
  r = run(base + " --adapter " + q(rr.run) + " --max-examples 2 --set quantization.method=none --set " +
          q("data.default_system_message=Be brief.") + " --out " + q(d.path / "e.json"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("eval: quantization none from --set quantization.method (the run's: nf4 (blocksize 64, "
                       "double_quant true))"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("eval: data.default_system_message \"Be brief.\" from --set data.default_system_message "
                       "(the run's: \"You are Quokka, made by Acme Labs.\")"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("quantization nf4 (blocksize 64, double_quant true) from"), std::string::npos) << r.out;
  EXPECT_EQ(read_json(d.path / "e.json")["quantization"]["method"], "none");
  // exact_match on a train_on_inputs run: its answers are found (labels as train_on_inputs: false)
  // (--predictions: every prediction as JSONL, here the same 2 as the result file's samples); the
  // run's sequence_len 96 cuts these records, their answers too: refused at it
  // (EvalCli.ResultFileRecordsWhatDecidesTheNumber), so a length that holds them
  r = run(base + " --adapter " + q(rr.run) + " --max-examples 2 --metric exact_match --out " + q(d.path / "e.json") +
          " --predictions " + q(d.path / "p" / "pred.jsonl") + " --set data.sequence_len=512");
  ASSERT_EQ(r.status, 0) << r.out;
  const json em = read_json(d.path / "e.json")["exact_match"];
  EXPECT_EQ(em["total"], 2) << r.out;
  EXPECT_NE(r.out.find("wrote 2 predictions to " + (d.path / "p" / "pred.jsonl").string()), std::string::npos) << r.out;
  std::ifstream pred(d.path / "p" / "pred.jsonl");
  json lines = json::array();
  for (std::string line; std::getline(pred, line);) lines.push_back(json::parse(line));
  EXPECT_EQ(lines, em["samples"]);
  ASSERT_EQ(lines.size(), 2u);
  // each names its record's file:line (the records start on lines 2 and 3)
  EXPECT_EQ(lines[0]["source"], rr.eval_file.string() + ":2");
  EXPECT_EQ(lines[1]["source"], rr.eval_file.string() + ":3");
  // --help names exactly the keys a line has (trial 20: it lacked `source`)
  std::string keys;
  for (const auto& [k, v] : lines[0].items()) keys += (keys.empty() ? "" : ", ") + k;  // nlohmann: sorted
  EXPECT_EQ(keys, "id, match, prediction, reference, source");
  const CliRun help = run("eval --help");
  EXPECT_NE(help.out.find("{id, source, reference, prediction, match}"), std::string::npos) << help.out;
  // --predictions of the loss: refused before anything is read
  r = run(base + " --predictions " + q(d.path / "p2.jsonl"));
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("error: eval: --predictions needs --metric exact_match"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("target tokens"), std::string::npos) << r.out;
}

// A raw-text run with truncation: split: eval --adapter splits --data as the run did (before: the
// default, drop, lost every record over sequence_len; the trial's c4 adapter lost 228 of 300),
// the example count of `eval CONFIG --data`. exact_match on raw text is a one-line error naming
// why, before the model loads (before: "exact_match: 0/0 = 0.0000" and exit 0).
TEST(EvalCli, RawTextRunSplitsAndExactMatchIsRefused) {
  QLORA_REQUIRE_SHARED(c4, "data/c4_demo.jsonl");
  QLORA_REQUIRE_SHARED(tokenizer, "tokenizers/llama2/tokenizer.model");
  const qlora::test::TempDir d("eval_run_split");
  const fs::path model = d.path / "model", run_dir = d.path / "run", cfg = d.path / "run.yaml", text = d.path / "c4.jsonl";
  CliRun r = run("init-model --preset tiny --out " + q(model) + " --tokenizer " + q(tokenizer) + " --seed 0");
  ASSERT_EQ(r.status, 0) << r.out;
  {
    std::ifstream in(c4);
    std::ofstream out(text);
    std::string line;
    for (int i = 0; i < 12 && std::getline(in, line); ++i) out << line << "\n";
  }
  std::ofstream(cfg) << "output_dir: " << run_dir.string() << "\nmodel:\n  path: " << model.string()
                     << "\n  dtype: fp32\nquantization:\n  method: none\nlora:\n  r: 4\n  alpha: 8\n"
                     << "data:\n  train: " << text.string() << "\n  sequence_len: 64\n  truncation: split\n"
                     << "training:\n  micro_batch_size: 1\n  gradient_accumulation_steps: 1\n  max_steps: 1\n"
                     << "  eval_steps: 0\n  gradient_checkpointing: false\ncheckpoint:\n  save_steps: 0\n  save_minutes: 0\n";
  r = run("train " + q(cfg));
  ASSERT_EQ(r.status, 0) << r.out;
  r = run("eval " + q(cfg) + " --adapter " + q(run_dir) + " --data " + q(text) + " --out " + q(d.path / "ref.json"));
  ASSERT_EQ(r.status, 0) << r.out;
  const json ref = read_json(d.path / "ref.json");
  EXPECT_GT(ref["examples"].get<int>(), 12);  // split: more pieces than records
  r = run("eval --model " + q(model) + " --data " + q(text) + " --adapter " + q(run_dir) + " --out " + q(d.path / "e.json"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(read_json(d.path / "e.json")["examples"], ref["examples"]);
  EXPECT_EQ(read_json(d.path / "e.json")["targets"], ref["targets"]);
  EXPECT_NEAR(read_json(d.path / "e.json")["loss"].get<double>(), ref["loss"].get<double>(), 1e-6);
  EXPECT_NE(r.out.find("data.truncation split"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("records not used"), std::string::npos) << r.out;
  // raw text is tokenized as it is: no template is named (a trial: "template chatml" before)
  EXPECT_NE(r.out.find(" examples (template none: raw text, sequence_len "), std::string::npos) << r.out;
  EXPECT_EQ(read_json(d.path / "e.json")["template"], "none");
  r = run("eval --model " + q(model) + " --data " + q(text) + " --metric exact_match --out " + q(d.path / "em.json"));
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("error: eval --metric exact_match: " + text.string() +
                       ": the data is raw text (format completion), with no assistant answer to match; exact match "
                       "needs records with an assistant answer (use --metric loss)"),
            std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("target tokens: loss"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(d.path / "em.json"));
  // a raw-text file in a list of chat ones: refused naming that file (before: its whole text was
  // scored as an "answer", the list's format "alpaca, completion" not being "completion")
  QLORA_REQUIRE_SHARED(alpaca, "data/alpaca_en_demo.json");
  const fs::path mixed = d.path / "mixed.yaml";
  std::ofstream(mixed) << "output_dir: " << (d.path / "mixed").string() << "\nmodel:\n  path: " << model.string()
                       << "\n  dtype: fp32\nquantization:\n  method: none\ndata:\n  train: " << alpaca.string()
                       << "\n  eval: [" << alpaca.string() << ", " << text.string() << "]\n  sequence_len: 2048\n";
  r = run("eval " + q(mixed) + " --metric exact_match --max-examples 2 --out " + q(d.path / "em.json"));
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("error: eval --metric exact_match: " + text.string() +
                       ": the data is raw text (format completion), with no assistant answer to match; exact match "
                       "needs records with an assistant answer (use --metric loss, or leave the raw-text files out of "
                       "the list)"),
            std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(d.path / "em.json"));
}

namespace {

// eval --metric exact_match decodes greedily whatever the model dir's generation_config.json says
// (`qlora generate` takes its sampling defaults from it; eval must not): llama_gqa and
// llama_gqa_sampling (the same weights; do_sample true, temperature 0.7, top_k 20, top_p 0.8,
// repetition_penalty 1.05, max_new_tokens 24) give the same predictions.
TEST(EvalCli, ExactMatchStaysGreedyWhateverGenerationConfigSays) {
  QLORA_REQUIRE_SHARED(data, "data/alpaca_en_demo.json");
  QLORA_REQUIRE_FIXTURE(sampling, "models/llama_gqa_sampling/generation_config.json");
  const qlora::test::TempDir d("eval_em_greedy");
  std::vector<json> preds;
  for (const fs::path& model : {sampling.parent_path().parent_path() / "llama_gqa", sampling.parent_path()}) {
    const fs::path p = d.path / (model.filename().string() + ".jsonl");
    CliRun r = run("eval --model " + q(model) + " --data " + q(data) + " --set data.template=chatml --set model.dtype=fp32"
                   " --metric exact_match --max-examples 2 --out " + q(d.path / "e.json") + " --predictions " + q(p));
    ASSERT_EQ(r.status, 0) << r.out;
    // No config, no run, no --set: the default NF4 quantization is said (a trial read an NF4 loss as
    // the stored model's), in a line of its own and in the result line.
    EXPECT_NE(r.out.find("eval: quantization nf4 (blocksize 64, double_quant true) by default: the model is evaluated "
                         "as a QLoRA run computes it, not as stored; --set quantization.method=none evaluates it as "
                         "transformers loads it"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find(", sequence_len 2048, quantization nf4), "), std::string::npos) << r.out;
    std::ifstream in(p);
    json lines = json::array();
    for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
    ASSERT_EQ(lines.size(), 2u) << r.out;
    EXPECT_FALSE(lines[0]["prediction"].get<std::string>().empty());
    preds.push_back(lines);
  }
  EXPECT_EQ(preds[0], preds[1]);
}

}  // namespace

// eval.json holds every setting that changes its number (two files that differ only in loss told
// nothing of truncation / train_on_inputs / micro_batch_size, trial 25) and the evaluated file's
// record counts; exact_match refuses examples whose answer a truncation cut; errors about --data
// name the flag (not data.train, a key the user never set); --predictions cannot be the --out file.
TEST(EvalCli, ResultFileRecordsWhatDecidesTheNumber) {
  QLORA_REQUIRE_SHARED(data, "data/alpaca_en_demo.json");
  QLORA_REQUIRE_SHARED(tokenizer, "tokenizers/llama2/tokenizer.model");
  const qlora::test::TempDir d("eval_settings");
  const fs::path model = d.path / "model", out = d.path / "e.json";
  CliRun r = run("init-model --preset tiny --out " + q(model) + " --tokenizer " + q(tokenizer) + " --seed 0");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string base = "eval --model " + q(model) + " --data " + q(data) +
                           " --set data.template=alpaca --set data.sequence_len=64 --set quantization.method=none";
  r = run(base + " --set data.truncation=truncate --set training.micro_batch_size=2 --max-examples 3 --out " + q(out));
  ASSERT_EQ(r.status, 0) << r.out;
  const json j = read_json(out);
  EXPECT_EQ(j["truncation"], "truncate");
  EXPECT_EQ(j["train_on_inputs"], false);
  EXPECT_EQ(j["add_eos"], true);
  EXPECT_EQ(j["default_system_message"], "");
  EXPECT_EQ(j["micro_batch_size"], 2);
  EXPECT_EQ(j["max_examples"], 3);
  EXPECT_EQ(j["examples"], 3);
  const json& rec = j["records"];
  EXPECT_EQ(rec["read"], 999);  // alpaca_en_demo.json's records (len(json.load(f)))
  EXPECT_GT(rec["truncated"].get<int64_t>(), 0);
  EXPECT_EQ(rec["dropped_too_long"], 0);
  EXPECT_EQ(j["examples_available"].get<int64_t>(),
            999 - rec["skipped_invalid"].get<int64_t>() - rec["dropped_truncated_away"].get<int64_t>() -
                rec["dropped_no_trainable"].get<int64_t>());
  // drop: the long ones are counted as dropped, none truncated; --out -: the JSON alone on stdout
  r = qlora::test::run_command("(" + qlora::test::qlora_bin() + " " + base + " --max-examples 3 --out - 2>/dev/null > " +
                               q(out) + ")");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(read_json(out)["truncation"], "drop");
  EXPECT_EQ(read_json(out)["records"]["truncated"], 0);
  EXPECT_EQ(read_json(out)["records"]["dropped_too_long"], rec["truncated"].get<int64_t>() + rec["dropped_truncated_away"].get<int64_t>());

  // exact_match on cut examples: refused, naming the first one's record
  r = run(base + " --set data.truncation=truncate --metric exact_match --max-examples 50 --out " + q(out));
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find(" examples were cut to data.sequence_len 64 (data.truncation: truncate), their reference answers "
                       "with them (first: " + data.string() + ":"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("set data.truncation: drop to leave them out, or raise data.sequence_len"), std::string::npos) << r.out;

  // --data errors name --data, with a config too (its data.train line is not the problem)
  const fs::path cfg = d.path / "c.yaml";
  std::ofstream(cfg) << "output_dir: " << (d.path / "run").string() << "\nmodel:\n  path: " << model.string()
                     << "\ndata:\n  train: " << data.string() << "\n";
  for (const std::string& how : {"--model " + q(model), q(cfg)}) {
    r = run("eval " + how + " --data " + q(d.path / "nope.jsonl"));
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_NE(r.out.find("error: --data: no such file: " + (d.path / "nope.jsonl").string()), std::string::npos) << how << ": " << r.out;
    r = run("eval " + how + " --data " + q(d.path));
    EXPECT_NE(r.out.find("error: --data: " + d.path.string() + " is a directory"), std::string::npos) << how << ": " << r.out;
  }
  // one path for --predictions and --out would keep only the result: refused before anything runs
  r = run(base + " --metric exact_match --predictions " + q(out) + " --out " + q(d.path / "." / "e.json"));
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("eval: --predictions " + out.string() + " is the result file too"), std::string::npos) << r.out;

  // a config's data.eval is evaluated where its data.train files are not (trial 25: refused for
  // them); eval.json lists the evaluated files
  const fs::path away = d.path / "away.yaml", gone = d.path / "gone.jsonl";
  std::ofstream(away) << "output_dir: " << (d.path / "run").string() << "\nmodel:\n  path: " << model.string()
                      << "\ndata:\n  train: " << gone.string() << "\n  eval: [" << data.string() << ", " << data.string()
                      << "]\n  template: alpaca\n  sequence_len: 64\nquantization:\n  method: none\n";
  r = run("eval " + q(away) + " --max-examples 2 --out " + q(out));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("eval: data.train " + gone.string() + " not found: data.eval is evaluated without it"),
            std::string::npos) << r.out;
  EXPECT_EQ(read_json(out)["data_files"], json::array({data.string(), data.string()}));
  EXPECT_EQ(read_json(out)["examples"], 2);
}
