// qlora-cpp: the `qlora` subcommands, each a plain function taking typed options.
// Each throws qlora::Error for user-caused failures; main() prints it on one line and exits 1.
#pragma once
#include <cstdint>
#include <string>

#include "trainer/generate.h"

namespace qlora {

struct InspectOptions {
  std::string model_dir;
  bool json = false;
};
/// `qlora inspect MODEL_DIR [--json]`: architecture, parameters and bytes per component, dtypes.
/// Reads only config.json and the safetensors headers. Returns the text it printed.
std::string cmd_inspect(const InspectOptions& o);

struct GenerateCliOptions {
  std::string model_dir;
  std::string prompt;
  std::string dtype = "auto";
  bool print_ids = false;  ///< print new token ids instead of text
  GenerateOptions gen;
};
/// `qlora generate MODEL_DIR --prompt TEXT [...]`: prints the continuation (or its ids).
std::string cmd_generate(const GenerateCliOptions& o);

struct InitModelOptions {
  std::string preset;
  std::string out_dir;
  std::string tokenizer;        ///< path to a tokenizer.model to copy
  std::string train_tokenizer;  ///< or: a text/JSON(L) corpus to train one on
  int vocab_size = 0;           ///< with train_tokenizer (0: 2000)
  uint64_t seed = 0;
  std::string dtype;            ///< stored dtype: fp32|bf16|fp16 ("" = the preset's)
};
/// `qlora init-model --preset NAME --out DIR ...`: writes a random-init HF model directory
/// (config.json, model.safetensors, generation_config.json, tokenizer files). Refuses an existing
/// non-empty DIR; builds in DIR.tmp-<pid> and renames, so DIR is complete or absent.
void cmd_init_model(const InitModelOptions& o);

}  // namespace qlora
