// What an adapter trained here brings to `qlora eval --adapter` and `qlora generate --adapter`: the
// settings of its training run that change how a record renders, which of its tokens are labelled,
// or the base the adapter was trained on (docs/training.md, "What an adapter run brings").
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"

namespace qlora {

/// One setting an adapter's run brings: its dotted config key ("quantization" = the whole section:
/// method, blocksize, double_quant, keep_16bit), whether it also applies to `generate`'s single
/// prompt, how it is copied from the run's config, and how its value is written in the log.
struct AdapterRunKey {
  std::string key;
  bool for_prompt = false;
  std::function<void(const Config& from, Config& to)> copy;
  std::function<std::string(const Config& c)> show;
};

/// The one list of settings an adapter's run brings (eval takes all of them, generate those with
/// for_prompt): data.template, data.sequence_len, data.truncation, data.train_on_inputs,
/// data.add_eos, data.default_system_message, quantization, model.dtype (generate takes these
/// four), and training.micro_batch_size (the eval batch). Not brought: the data paths, the
/// per-file layout keys (data.format, field_map, role_map: they describe the run's own files, not
/// --data) and everything else.
const std::vector<AdapterRunKey>& adapter_run_keys();

/// The resolved config of the run that trained `adapter_dir`, and the file it came from.
struct AdapterRun {
  std::string source;
  Config config;
  /// The train files' formats as the run detected them ("completion" = raw text; "alpaca,
  /// completion" for a list): trainer_state.json's (a checkpoint) or summary.json's (a finished
  /// run dir) `data_format`; "" when neither says (an older run, or a run dir still training).
  std::string data_format;
  /// Its train records with a system turn of their own (trainer_state.json's or summary.json's
  /// `data_system_records`); -1 when neither says (an older run, or a run dir still training).
  int64_t data_system_records = -1;
};

/// Reads the run config of an adapter trained here: `adapter_dir`/config.resolved.yaml (a run's
/// output_dir), else `adapter_dir`/trainer_state.json "config" (a checkpoint), else, for
/// <run>/checkpoints/checkpoint-N, <run>/config.resolved.yaml. nullopt for a plain PEFT adapter
/// dir (none of these). A file that is there but unreadable: nullopt and a warning naming it,
/// prefixed `who` ("eval", "generate"). data_format and data_system_records from `adapter_dir`'s
/// trainer_state.json, else its summary.json (unreadable: "" and -1).
std::optional<AdapterRun> read_adapter_run(const std::string& adapter_dir, const std::string& who);

/// Copies every key of adapter_run_keys() (only for_prompt ones when `prompt_only`) from `run` to `to`.
void apply_adapter_run(const Config& run, Config& to, bool prompt_only);

/// The log lines (no prefix) saying where each brought key's value in `used` came from: one line
/// "K V, K V from SOURCE (the adapter's training run)" for those taken from the run, and one
/// "K V from FLAG (the run's: W)" for each key `given_by(key)` names a flag for ("" = not given).
std::vector<std::string> adapter_run_log(const AdapterRun& run, const Config& used, bool prompt_only,
                                         const std::function<std::string(const std::string& key)>& given_by);

/// The key of each "--set K=V" in `overrides` that sets brought key `key` (itself, a section above
/// it, or a key inside it): "--set K", or "" when none does.
std::string set_override_for(const std::vector<std::string>& overrides, const std::string& key);

}  // namespace qlora
