// qlora-cpp data options: the typed form of the config's `data:` section.
//
// Filled once by the config parser (config/), validated there, and passed by value into the
// data pipeline. The data pipeline never sees YAML.
#pragma once
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace qlora::data {

/// Where padding goes in a batch row (`data.padding_side`: right | left).
enum class PaddingSide { kRight, kLeft };

/// One data file of `data.train` / `data.eval`: its path and, where the entry sets them, the
/// format, field_map and role_map it is read with instead of the data section's (Axolotl's
/// per-entry `datasets:` settings). Everything else (template, sequence_len, truncation, ...) is
/// the section's: one model, one template. YAML: a path string, or a map {path, format?,
/// field_map?, role_map?} (docs/config.md).
struct DataSource {
  std::string path;                                           ///< .json array, .jsonl or .txt (~ and $VAR expanded)
  std::optional<std::string> format{};                        ///< unset: DataOptions::format
  std::optional<std::map<std::string, std::string>> field_map{};  ///< unset: DataOptions::field_map (replaced, not merged)
  std::optional<std::map<std::string, std::string>> role_map{};   ///< unset: DataOptions::role_map (replaced, not merged)
  /// True when the entry overrides nothing (written back as a plain path).
  bool path_only() const { return !format && !field_map && !role_map; }
};
inline bool operator==(const DataSource& a, const DataSource& b) {
  return a.path == b.path && a.format == b.format && a.field_map == b.field_map && a.role_map == b.role_map;
}
inline bool operator!=(const DataSource& a, const DataSource& b) { return !(a == b); }

/// Settings of the `data:` config section. Names follow Axolotl / torchtune where they exist.
struct DataOptions {
  /// The training files, in order: their examples are concatenated (each file read and its format
  /// detected on its own), then val_set_size and the epoch shuffle apply to the whole, as Hugging
  /// Face datasets' concatenate_datasets then train_test_split (Axolotl's `datasets:` list).
  /// YAML: one path, or a list of paths / {path, format, field_map, role_map} maps.
  std::vector<DataSource> train;
  std::vector<DataSource> eval;      ///< optional separate eval files, concatenated likewise (empty = none; then val_set_size applies)
  std::string format = "auto";       ///< auto | alpaca | sharegpt | messages | completion
  std::string template_name = "chatml";  ///< YAML key `template`: a data::template_names() entry or auto
  int64_t sequence_len = 2048;       ///< tokens per row (> 0)
  /// drop | truncate (keep the start, cut the end) | split (raw text: consecutive sequence_len
  /// pieces, every token kept; refused for conversations). Rules in docs/data.md#length.
  std::string truncation = "drop";
  bool train_on_inputs = false;      ///< false: prompt/system/user/tool tokens get label -100
  bool add_eos = true;               ///< EOS after every assistant turn (keeps its label even if pad == eos)
  bool sample_packing = false;       ///< pack examples into sequence_len rows, block-diagonal attention
  PaddingSide padding_side = PaddingSide::kRight;  ///< YAML right | left
  double val_set_size = 0.0;         ///< fraction (< 1) or count (>= 1) held out from `train`
  uint64_t seed = 42;                ///< shuffle seed (per-epoch permutation derives from it)
  bool shuffle = true;               ///< shuffle each epoch
  bool skip_invalid = false;         ///< skip and count malformed records instead of failing
  /// Drop exact duplicate records (record_digest equal: the same normalised turns, tools or raw
  /// text, wherever and however they were written): later copies within data.train (before the
  /// val_set_size hold-out) and within data.eval, and data.eval records also in data.train, the
  /// first in list / file order kept (Axolotl's `dataset_exact_deduplication`). false: counted and
  /// warned of (duplicates_note), nothing dropped.
  bool deduplicate = false;
  std::map<std::string, std::string> field_map;  ///< canonical field -> the file's name for it, e.g. {instruction: prompt}
  std::map<std::string, std::string> role_map;   ///< sharegpt role names, e.g. {human: user}
  /// A system message put first in every conversation that has none ("" = none), Axolotl's
  /// `default_system_message`: it replaces the template's own default system prompt (smollm2's
  /// "You are a helpful AI assistant named SmolLM...", qwen2.5's "You are Qwen...") in those records.
  std::string default_system_message;
  /// Not settings (the config's field table, to_yaml and the configs' operator== leave them out):
  /// the config keys that messages name for the field_map, role_map and format in effect —
  /// "data.field_map", or "data.train[1].field_map" where that entry of data.train sets its own
  /// (options_for).
  std::string field_map_key = "data.field_map";
  std::string role_map_key = "data.role_map";
  std::string format_key = "data.format";
};

/// The options file `src` is read with: `opts` with src's format, field_map and role_map where
/// the entry sets them. `entry_key` is the entry's config key ("data.train[1]"): messages about a
/// map or format the entry sets name it there ("data.train[1].field_map"); "" keeps the section's
/// keys in messages.
inline DataOptions options_for(const DataOptions& opts, const DataSource& src, const std::string& entry_key = "") {
  DataOptions o = opts;
  const bool named = !entry_key.empty();
  if (src.format) {
    o.format = *src.format;
    if (named) o.format_key = entry_key + ".format";
  }
  if (src.field_map) {
    o.field_map = *src.field_map;
    if (named) o.field_map_key = entry_key + ".field_map";
  }
  if (src.role_map) {
    o.role_map = *src.role_map;
    if (named) o.role_map_key = entry_key + ".role_map";
  }
  return o;
}

/// The files' paths in list order, joined by ", " (for messages; one file: its path).
inline std::string source_paths(const std::vector<DataSource>& v) {
  std::string out;
  for (const DataSource& s : v) out += (out.empty() ? "" : ", ") + s.path;
  return out;
}

/// Examples `data.val_set_size` holds out of `n`: a fraction (< 1) holds out ceil(val_set_size * n)
/// (the IEEE product, then ceil), as Hugging Face datasets' Dataset.train_test_split(test_size=)
/// does (arrow_dataset.py: `n_test = ceil(test_size * n_samples)`; Axolotl splits with it): 0.05 of
/// 203 is 11. A whole count (>= 1) is itself; 0 is 0. Which examples are held out is ours (a seeded
/// permutation, data::load_datasets), not datasets' shuffle.
inline int64_t val_set_count(double val_set_size, int64_t n) {
  return val_set_size < 1 ? static_cast<int64_t>(std::ceil(val_set_size * static_cast<double>(n)))
                          : static_cast<int64_t>(val_set_size);
}

}  // namespace qlora::data
