// `qlora eval` (held-out loss / perplexity, and greedy exact-match accuracy) and the adapter
// loading shared with `qlora generate --adapter`.
#include <chrono>
#include <cmath>
#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "adapters/lora.h"
#include "adapters/peft.h"
#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "data/dataset.h"
#include "data/template.h"
#include "data/tokenizer.h"
#include "cli/adapter_run.h"
#include "cli/commands.h"
#include "config/config.h"
#include "model/generate.h"
#include "model/model.h"
#include "trainer/train.h"

namespace qlora {
namespace fs = std::filesystem;
using json = nlohmann::json;

PeftConfig attach_peft_adapter(LlamaModel& model, const std::string& adapter_dir) {
  const PeftConfig pc = read_peft_config(adapter_dir);
  LoraWeights w = load_peft_adapter(adapter_dir, pc, peft_module_shapes(model, pc), kSelectedByAdapterConfig);
  LoraOptions lo = lora_options(pc);
  lo.dropout = 0.0;
  model.set_lora(w, lo);
  log::info("adapter: ", adapter_dir, " (r=", pc.r, " alpha=", pc.lora_alpha, ", ", w.size(), " modules)");
  return pc;
}

namespace {

/// Most bytes `qlora eval` spends on dequantized copies of the 4-bit linears (cache_dequantized):
/// 2 GiB holds a ~500M-parameter model in fp32 or a ~1B one in bf16; larger models dequantize per
/// forward as in training.
constexpr int64_t kDequantCacheBytes = int64_t{2} << 30;

/// The base model directory adapter_config.json in `adapter` names (base_model_name_or_path: what
/// PEFT's AutoPeftModelForCausalLM loads; `train` writes model.path made absolute), for an eval with
/// --adapter and no --model; logged. Throws qlora::Error naming the file when the name is not a
/// local directory (a hub id, a preset, a moved model), and read_peft_config's errors.
std::string adapter_base_dir(const std::string& adapter) {
  QLORA_CHECK(fs::is_directory(adapter), adapter, ": adapter directory not found", relative_path_note(adapter));
  const std::string name = read_peft_config(adapter).base_model_name_or_path;
  const std::string file = (fs::path(adapter) / "adapter_config.json").string();
  QLORA_CHECK(!name.empty(), file, ": base_model_name_or_path is empty: give --model DIR");
  std::error_code ec;
  QLORA_CHECK(fs::is_directory(name, ec), file, ": base_model_name_or_path '", name,
              "' is not a local directory (a hub id, a preset, or a moved model): give --model DIR");
  log::info("eval: model ", name, " (the base ", file, " names; --model DIR for another)");
  return name;
}

/// The config an eval runs with: the file's (plus overrides), or with no file a minimal one
/// built from --model and --data (dtype auto, the other keys at their defaults; with an adapter
/// of ours, its run's adapter_run_keys(), each logged with where its value came from), with the
/// overrides applied and validated as in a file (config_with_overrides).
Config eval_config(const EvalOptions& o) {
  std::vector<std::string> ov = o.overrides;
  if (!o.model_dir.empty()) ov.insert(ov.begin(), "model.path=" + json(o.model_dir).dump());
  if (!o.config_path.empty()) {
    Config c = load_config(o.config_path, ov);
    for (const std::string& w : config_warnings(c)) log::warn(w);
    return c;
  }
  QLORA_CHECK(!o.data.empty() && (!o.model_dir.empty() || !o.adapter.empty()),
              "eval: give a CONFIG, or --data FILE with --model DIR (or with --adapter DIR, whose base it names)");
  Config base;
  base.output_dir = "eval";
  base.model.path = o.model_dir.empty() ? adapter_base_dir(o.adapter) : o.model_dir;
  base.model.dtype = DType::kAuto;
  base.data.train = {data::DataSource{o.data}};
  // An adapter trained here says how its examples were rendered and labelled and what base it was
  // trained on: its run's adapter_run_keys() (template, sequence_len, truncation, train_on_inputs,
  // add_eos, default_system_message, quantization; config.resolved.yaml beside a run's final
  // adapter, a checkpoint dir's trainer_state.json "config"), so a loss compares with its training
  // eval_loss (a run with its own default_system_message was evaluated under the template's default
  // system prompt, a truncation: split run dropped its long records, before); --set wins.
  std::optional<AdapterRun> run;
  if (!o.adapter.empty()) run = read_adapter_run(o.adapter, "eval");
  if (run) apply_adapter_run(run->config, base, /*prompt_only=*/false);
  Config cfg = config_with_overrides(base, o.overrides, "eval (no config)");
  // The default quantization (no run brought one, no --set): said, since it changes the number.
  if (!run && set_override_for(o.overrides, "quantization").empty()) {
    const QuantOptions& q = cfg.quantization;
    log::info("eval: quantization ", quant_method_name(q.quant_type), " (blocksize ", q.blocksize, ", double_quant ",
              q.double_quant ? "true" : "false", ") by default: the model is evaluated as a QLoRA run computes it, "
              "not as stored; --set quantization.method=none evaluates it as transformers loads it");
  }
  if (run) {
    for (const std::string& line :
         adapter_run_log(*run, cfg, false, [&](const std::string& k) { return set_override_for(o.overrides, k); }))
      log::info("eval: ", line);
    // The layout keys describe the run's own files, not --data: said, not applied.
    std::vector<std::string> layout;
    const data::DataOptions& rd = run->config.data;
    auto entry_sets = [&](auto member) {
      for (const auto* list : {&rd.train, &rd.eval})
        for (const data::DataSource& s : *list)
          if (s.*member) return true;
      return false;
    };
    if (rd.format != "auto" || entry_sets(&data::DataSource::format)) layout.push_back("data.format");
    if (!rd.field_map.empty() || entry_sets(&data::DataSource::field_map)) layout.push_back("data.field_map");
    if (!rd.role_map.empty() || entry_sets(&data::DataSource::role_map)) layout.push_back("data.role_map");
    if (!layout.empty()) {
      std::string names;
      for (const std::string& n : layout) names += (names.empty() ? "" : ", ") + n;
      const bool one = layout.size() == 1;
      log::info("eval: the run's ", names, one ? " describes" : " describe", " its own files and ",
                one ? "is" : "are", " not applied to --data ", o.data, " (--set ", one ? "it" : "them",
                " if that file has the same layout)");
    }
  }
  return cfg;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}


struct ExactMatch {
  int64_t correct = 0, total = 0;
  /// every scored example {id, source, reference, prediction, match}, in order; source is the
  /// record's "file:line" (record_location)
  std::vector<json> rows;
};

/// Greedy exact match: the prompt is every token before the last answer span (exactly what
/// training conditioned on); generation stops at EOS or after the reference's length + 8 tokens.
/// The decoded continuation (EOS dropped, trimmed) must equal the decoded reference span (trimmed).
ExactMatch exact_match(const LlamaModel& model, const data::Tokenizer& tok, const std::vector<data::Example>& exs,
                       const std::vector<data::SourceStats>& sources) {
  ExactMatch em;
  for (const data::Example& ex : exs) {
    const auto [start, end] = data::last_answer_span(ex);
    if (start == 0 || start >= end) continue;  // nothing to condition on, or no answer
    std::vector<int64_t> prompt(ex.input_ids.begin(), ex.input_ids.begin() + static_cast<std::ptrdiff_t>(start));
    data::TokenIds ref;
    for (size_t i = start; i < end; ++i)
      if (!tok.is_special(ex.input_ids[i])) ref.push_back(ex.input_ids[i]);
    GenerateOptions g;
    g.max_new_tokens = static_cast<int64_t>(end - start) + 8;
    g.do_sample = false;  // greedy always: generation_config.json's sampling keys are not read here
    g.eos_token_ids.assign(tok.eos_ids().begin(), tok.eos_ids().end());
    data::TokenIds out;
    for (int64_t id : generate_tokens(model, prompt, g))
      if (!tok.is_special(static_cast<int32_t>(id))) out.push_back(static_cast<int32_t>(id));
    const std::string want = trim(tok.decode(ref)), got = trim(tok.decode(out));
    const bool ok = want == got;
    em.correct += ok;
    ++em.total;
    em.rows.push_back({{"id", ex.id}, {"source", data::record_location(sources, ex.record)}, {"reference", want},
                       {"prediction", got}, {"match", ok}});
  }
  return em;
}

}  // namespace

std::string cmd_eval(const EvalOptions& o) {
  QLORA_CHECK(o.metric == "loss" || o.metric == "exact_match", "eval: --metric must be loss or exact_match, got '",
              o.metric, "'");
  QLORA_CHECK(o.max_examples >= 0, "eval: --max-examples must be >= 0, got ", o.max_examples);
  const auto t0 = std::chrono::steady_clock::now();
  Config cfg = eval_config(o);
  if (!o.model_dir.empty()) cfg.key_sources.erase("model.path");  // --model, not a --set: its errors name no source
  // Where the result goes, known (and checked writable) before anything slow runs: an adapter's
  // eval next to it, the base model's (no adapter) as eval_base.json, so a before/after pair in a
  // run's output_dir (its final adapter's dir) keeps both.
  const std::string out = !o.out.empty()       ? o.out
                          : !o.adapter.empty() ? (fs::path(o.adapter) / "eval.json").string()
                          : !o.config_path.empty() ? (fs::path(cfg.output_dir) / "eval_base.json").string()
                                                   : std::string("eval_base.json");
  const bool to_stdout = out == "-";  // the JSON is the command's stdout (as jq and lm-eval pipes want)
  if (!to_stdout) check_can_create(out, "eval: result file");
  QLORA_CHECK(o.predictions.empty() || o.metric == "exact_match",
              "eval: --predictions needs --metric exact_match (the loss has no predictions)");
  if (!o.predictions.empty()) check_can_create(o.predictions, "eval: --predictions file");
  // one file for both would keep only the result written last (trial 25)
  QLORA_CHECK(o.predictions.empty() || to_stdout || fs::weakly_canonical(o.predictions) != fs::weakly_canonical(out),
              "eval: --predictions ", o.predictions, " is the result file too (", out,
              "); give them different paths");
  const torch::Device device = torch::cuda::is_available() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);

  // Data first: every bad-input error comes before the (slow) model load.
  const std::string tok_src = with_key_sources(cfg, [&] { return tokenizer_source(cfg.model); });
  const data::Tokenizer tok = data::Tokenizer::from_pretrained(tok_src);
  log::info("tokenizer: ", tok.describe());
  data::DataOptions dopts = cfg.data;
  dopts.template_name = with_key_sources(cfg, [&] { return data::resolve_template(dopts.template_name, tok_src); });
  if (!o.data.empty()) {
    dopts.train = {data::DataSource{o.data}};
    dopts.eval.clear();
    dopts.val_set_size = 0;
  }
  // A config's data.eval is evaluated without its data.train files where they are not here (an
  // eval on another machine than the run's; trial 25 was refused for them). They are read only to
  // warn of eval records that are training records too.
  if (o.data.empty() && !dopts.eval.empty()) {
    std::string missing;
    for (const data::DataSource& s : dopts.train)
      if (std::error_code ec; !fs::exists(s.path, ec)) missing += (missing.empty() ? "" : ", ") + s.path;
    if (!missing.empty()) {
      log::info("eval: data.train ", missing, " not found: data.eval is evaluated without it (it is read only to warn "
                "of eval records that are also training records)");
      dopts.train.clear();
    }
  }
  // Errors about --data name the flag, not data.train (which --data replaces here: the config's
  // data.train line, or "data.train" with no config, pointed at a key the user never set, trial 25).
  const auto data_errors = [&](auto&& f) {
    try {
      return with_key_sources(cfg, f);
    } catch (const Error& e) {
      if (o.data.empty() || typeid(e) != typeid(Error)) throw;
      std::string m = e.what();
      for (const std::string key : {"data.train[0]: ", "data.train: "}) {
        const size_t at = m.find(key);
        if (at != std::string::npos && (at == 0 || m.compare(at - 2, 2, ": ") == 0))
          throw Error("--data: " + m.substr(at + key.size()));
      }
      throw;
    }
  };
  data::Datasets ds = data_errors([&] { return data::load_datasets(dopts, tok); });
  const bool eval_file = o.data.empty() && !dopts.eval.empty();
  // the config's eval set sharing records with its train set measures memorisation (as train warns)
  if (const std::string note = data::duplicates_note(ds); o.data.empty() && !note.empty()) log::warn("data: ", note);
  for (const data::SourceStats& f : eval_file ? ds.eval_sources : ds.train_sources)  // each file's own drops
    for (const std::string& note : data::file_notes(f.stats, dopts.template_name))
      log::warn("data: ", f.source.path, ": ", note);
  // The model was tuned on its own chat format: a loss in another one is not the model's best and
  // does not compare with a run that used the model's template (as `train` and `data preview` warn).
  if (ds.stats.read.format != "completion")
    for (const std::string& note : data::template_warnings(dopts.template_name, tok_src, tok, dopts.add_eos)) log::warn("eval: ", note);
  std::vector<data::Example> exs = o.data.empty() ? std::move(ds.eval) : std::move(ds.train);
  QLORA_CHECK(!exs.empty(), o.config_path.empty() ? o.data : o.config_path, ": no eval data (set data.eval or data.val_set_size, or pass --data FILE)");
  const auto available = static_cast<int64_t>(exs.size());
  if (o.max_examples > 0 && static_cast<int64_t>(exs.size()) > o.max_examples) exs.resize(static_cast<size_t>(o.max_examples));
  // exact_match's prompts and answers: the last assistant answer of each example as
  // train_on_inputs: false labels it (with train_on_inputs every token is a target and no answer
  // span could be told apart; the same records, the same order: labels change no length).
  std::vector<data::Example> em_exs;
  if (o.metric == "exact_match") {
    if (dopts.train_on_inputs) {
      data::DataOptions eo = dopts;
      eo.train_on_inputs = false;
      data::Datasets eds = data_errors([&] { return data::load_datasets(eo, tok); });
      em_exs = o.data.empty() ? std::move(eds.eval) : std::move(eds.train);
      if (em_exs.size() > exs.size()) em_exs.resize(exs.size());
    } else {
      em_exs = exs;
    }
    // Raw text (format completion) has no answer: every token is a target (but a BOS), so the
    // "answer" would be the whole text after it, or nothing (0/0 = 0.0, exit 0, before).
    // Each file on its own: a raw-text file in a list of chat ones would score its whole text.
    const std::vector<data::SourceStats>& files = eval_file ? ds.eval_sources : ds.train_sources;
    for (const data::SourceStats& f : files)
      QLORA_CHECK(f.stats.read.format != "completion", "eval --metric exact_match: ", f.source.path,
                  ": the data is raw text (format completion), with no assistant answer to match; exact match needs "
                  "records with an assistant answer (use --metric loss",
                  files.size() > 1 ? ", or leave the raw-text files out of the list)" : ")");
    const std::string what = !o.data.empty() ? o.data : data::source_paths(eval_file ? dopts.eval : dopts.train);
    int64_t answered = 0;
    for (const data::Example& ex : em_exs) {
      const auto [start, end] = data::last_answer_span(ex);
      answered += start > 0 && start < end;
    }
    QLORA_CHECK(answered > 0, "eval --metric exact_match: ", what, ": none of the ", em_exs.size(),
                " examples has an assistant answer to match (use --metric loss)");
    // A cut example lost the end of its last answer: the reference would be the cut answer and the
    // generation budget its length (lm-eval cuts the context, never the target; trial 25).
    const auto is_cut = [](const data::Example& ex) { return ex.untruncated_len > 0; };
    const auto cut = std::find_if(em_exs.begin(), em_exs.end(), is_cut);
    if (cut != em_exs.end())
      fail("eval --metric exact_match: ", std::count_if(em_exs.begin(), em_exs.end(), is_cut), " of the ", em_exs.size(),
           " examples were cut to data.sequence_len ", dopts.sequence_len,
           " (data.truncation: truncate), their reference answers with them (first: ",
           data::record_location(eval_file ? ds.eval_sources : ds.train_sources, cut->record), ", ", cut->untruncated_len,
           " tokens); set data.truncation: drop to leave them out, or raise data.sequence_len");
  }
  if (!o.adapter.empty()) {
    QLORA_CHECK(fs::is_directory(o.adapter), o.adapter, ": adapter directory not found", relative_path_note(o.adapter));
    read_peft_config(o.adapter);  // fails early on a bad adapter_config.json
  }

  // model.path without weights: named by its key before the load (after the data's notes)
  with_key_sources(cfg, [&] { check_model_weights(cfg.model); });
  const torch::Dtype dtype = torch_dtype(cfg.model.dtype, device);
  // init: random (a preset, or model.path's config.json) trains on random weights from
  // training.seed: the same here
  const QuantOptions& q = cfg.quantization;
  LlamaModel model = load_base_model(cfg, tok.vocab_size(), dtype, device);
  check_tokenizer_fits(model.config(), tok.vocab_size());
  if (!o.adapter.empty()) attach_peft_adapter(model, o.adapter);
  model.training = false;
  torch::NoGradGuard no_grad;
  // Dequantize the frozen 4-bit linears once instead of at every forward (each decode step of
  // exact_match would otherwise dequantize every weight again; same values, same logits). Only
  // while the copies fit kDequantCacheBytes: a large model keeps QLoRA's memory bound instead.
  const int64_t cached = model.cache_dequantized(kDequantCacheBytes);
  if (cached > 0) log::info("eval: dequantized the 4-bit linears once (", cached / (1 << 20), " MiB) for inference");

  const int32_t pad_id = tok.batch_pad_id();
  const auto [loss, targets] = evaluate_loss(model, exs, cfg.training.micro_batch_size, dopts, pad_id);
  // Raw text (format completion) is tokenized as it is: no template applies to it.
  const std::vector<data::SourceStats>& files = eval_file ? ds.eval_sources : ds.train_sources;
  const auto raw = static_cast<size_t>(std::count_if(files.begin(), files.end(), [](const data::SourceStats& f) {
    return f.stats.read.format == "completion";
  }));
  const bool all_raw = raw > 0 && raw == files.size();
  const std::string template_used = all_raw ? "none" : dopts.template_name;
  const std::string template_text = all_raw ? "none: raw text"
                                    : raw > 0 ? dopts.template_name + "; raw-text files: none"
                                              : dopts.template_name;
  json data_files = json::array();
  for (const data::SourceStats& f : files) data_files.push_back(f.source.path);
  json j = {{"model", cfg.model.path.empty() ? cfg.model.preset : cfg.model.path},
            {"adapter", o.adapter},
            {"data", !o.data.empty()        ? o.data
                     : !dopts.eval.empty() ? data::source_paths(dopts.eval)
                                           : data::source_paths(dopts.train) + " (val_set_size hold-out)"},
            {"data_files", data_files},  // each evaluated file's path (a list's "data" joins them)
            {"examples", static_cast<int64_t>(exs.size())},
            {"examples_available", available},  // before --max-examples
            {"template", template_used},
            {"dtype", dtype_name(resolve_dtype(cfg.model.dtype, device.is_cuda()))},
            {"quantization", {{"method", quant_method_name(q.quant_type)}, {"blocksize", q.blocksize},
                              {"double_quant", q.double_quant}}},
            {"sequence_len", dopts.sequence_len},
            // what else decides the number (two evals that differ in these differ in meaning; trial 25)
            {"truncation", dopts.truncation},
            {"train_on_inputs", dopts.train_on_inputs},
            {"add_eos", dopts.add_eos},
            {"default_system_message", dopts.default_system_message},
            {"micro_batch_size", cfg.training.micro_batch_size},
            {"max_examples", o.max_examples},
            {"targets", targets},
            {"loss", loss},
            {"perplexity", std::exp(loss)}};
  if (eval_file || !o.data.empty()) {  // the evaluated files' records and what became of them
    const data::DataStats& st = eval_file ? ds.eval_stats : ds.stats;
    j["records"] = {{"read", st.read.records_read},           {"skipped_invalid", st.read.skipped_invalid},
                    {"dropped_too_long", st.dropped_too_long}, {"dropped_truncated_away", st.dropped_truncated_away},
                    {"dropped_no_trainable", st.dropped_no_trainable}, {"truncated", st.truncated}};
  }
  std::ostringstream os;
  os << std::fixed << std::setprecision(4) << "eval: " << exs.size() << " examples (template " << template_text
     << ", sequence_len " << dopts.sequence_len << ", quantization " << quant_method_name(q.quant_type) << "), "
     << targets << " target tokens: loss " << loss
     << "  perplexity " << std::exp(loss) << "\n";
  if (o.metric == "exact_match") {
    const ExactMatch em = exact_match(model, tok, em_exs, eval_file ? ds.eval_sources : ds.train_sources);
    const double acc = em.total ? static_cast<double>(em.correct) / static_cast<double>(em.total) : 0.0;
    const size_t kept = std::min<size_t>(em.rows.size(), 20);
    j["exact_match"] = {{"correct", em.correct}, {"total", em.total}, {"accuracy", acc},
                        {"samples", json(std::vector<json>(em.rows.begin(), em.rows.begin() + std::ptrdiff_t(kept)))}};
    os << "exact_match: " << em.correct << "/" << em.total << " = " << std::setprecision(4) << acc << "\n";
    if (!o.predictions.empty()) {
      std::string lines;
      for (const json& row : em.rows) lines += row.dump() + "\n";
      try {
        if (fs::path(o.predictions).has_parent_path()) fs::create_directories(fs::path(o.predictions).parent_path());
        atomic_write_string(o.predictions, lines);
      } catch (const std::exception&) {
        std::cout << os.str() << std::flush;  // the numbers are not lost with the file
        throw;
      }
      os << "wrote " << em.rows.size() << " predictions to " << o.predictions << "\n";
    }
  }
  j["metric"] = o.metric;
  j["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (to_stdout) {
    std::istringstream lines(os.str());
    for (std::string line; std::getline(lines, line);) log::info(line);
    return j.dump(2) + "\n";
  }
  try {
    if (fs::path(out).has_parent_path()) fs::create_directories(fs::path(out).parent_path());
    atomic_write_string(out, j.dump(2) + "\n");
  } catch (const std::exception&) {
    std::cout << os.str() << std::flush;  // the numbers are not lost with the file
    throw;
  }
  os << "wrote " << out << "\n";
  return os.str();
}

}  // namespace qlora
