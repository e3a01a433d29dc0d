// adapters/target_modules.h — LoRA `target_modules` in the one form every layer uses: a list of
// module names (or path suffixes) in which the entry "all-linear" stands for the seven
// Llama-family projections, as PEFT's LoraConfig(target_modules="all-linear") does (lm_head
// excluded). Header-only and torch-free: the config (which is torch-free) reads and writes it.
#pragma once
#include <algorithm>
#include <string>
#include <vector>

namespace qlora {

/// The target_modules entry that means every decoder linear.
inline constexpr const char* kAllLinear = "all-linear";

/// The seven Llama-family projection names, which "all-linear" expands to (lm_head excluded).
inline const std::vector<std::string>& llama_linear_names() {
  static const std::vector<std::string> names = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
  return names;
}

/// `targets` with "all-linear" replaced by llama_linear_names() and later duplicates dropped
/// (order kept); PEFT writes the expanded list into a saved adapter_config.json.
inline std::vector<std::string> expand_target_modules(const std::vector<std::string>& targets) {
  std::vector<std::string> out;
  auto add = [&out](const std::string& t) {
    if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
  };
  for (const std::string& t : targets) {
    if (t == kAllLinear)
      for (const std::string& n : llama_linear_names()) add(n);
    else
      add(t);
  }
  return out;
}

}  // namespace qlora
