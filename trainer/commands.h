// qlora-cpp: the `qlora` subcommands, each a plain function taking typed options.
// Each throws qlora::Error for user-caused failures; main() prints it on one line and exits 1.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trainer/generate.h"

namespace qlora {

struct InspectOptions {
  std::string model_dir;
  bool json = false;
  std::string quant;          ///< "" = headers only; "nf4" | "fp4" = really quantize on load
  bool double_quant = false;  ///< with quant: quantize the absmax constants too
  int64_t blocksize = 64;     ///< with quant: 32..4096, power of two
};
/// `qlora inspect MODEL_DIR [--json]`: architecture, parameters and bytes per component, dtypes.
/// Reads only config.json and the safetensors headers. Returns the text it printed.
/// With `--quant nf4|fp4 [--double-quant] [--blocksize N]`: loads the model on the CPU, quantizing
/// the decoder linears as it streams them (LlamaModel::load with QuantOptions; a bitsandbytes
/// checkpoint is read as stored), and reports bytes of the quantized weights, of the quantization
/// constants and of the unquantized (stored-dtype) modules, bits per parameter, the rule of thumb
/// params × 0.5 byte, and this process's peak RSS (VmHWM). Throws qlora::Error as load does.
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

struct DataPreviewOptions {
  std::string config_path;
  std::vector<std::string> overrides;  ///< --set key=value
  int n = 3;                           ///< examples to render
};
/// `qlora data preview CONFIG [--n N] [--set k=v]`: loads the config's data section with its
/// tokenizer and returns rendered examples (masked spans marked) and dataset statistics.
/// Throws qlora::Error for config, tokenizer or dataset errors (file:line / key named).
std::string cmd_data_preview(const DataPreviewOptions& o);

struct TrainCliOptions {
  std::string config_path;
  std::vector<std::string> overrides;  ///< --set key=value
};
/// `qlora train CONFIG [--set k=v]`: validates the config, trains, writes the adapter and reports
/// into output_dir. Bad config or data: qlora::Error before anything is written to output_dir.
void cmd_train(const TrainCliOptions& o);

}  // namespace qlora
