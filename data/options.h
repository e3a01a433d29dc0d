// qlora-cpp data options: the typed form of the config's `data:` section.
//
// Filled once by the config parser (config/), validated there, and passed by value into the
// data pipeline. The data pipeline never sees YAML.
#pragma once
#include <cmath>
#include <cstdint>
#include <map>
#include <string>

namespace qlora::data {

/// Where padding goes in a batch row (`data.padding_side`: right | left).
enum class PaddingSide { kRight, kLeft };

/// Settings of the `data:` config section. Names follow Axolotl / torchtune where they exist.
struct DataOptions {
  std::string train;                 ///< path to the training file (.json array, .jsonl or .txt)
  std::string eval;                  ///< optional separate eval file ("" = none; then val_set_size applies)
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
  std::map<std::string, std::string> field_map;  ///< canonical field -> the file's name for it, e.g. {instruction: prompt}
  std::map<std::string, std::string> role_map;   ///< sharegpt role names, e.g. {human: user}
  /// A system message put first in every conversation that has none ("" = none), Axolotl's
  /// `default_system_message`: it replaces the template's own default system prompt (smollm2's
  /// "You are a helpful AI assistant named SmolLM...", qwen2.5's "You are Qwen...") in those records.
  std::string default_system_message;
};

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
