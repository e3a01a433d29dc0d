// HF tokenizer.json backend of qlora::data::Tokenizer (work in progress: interface stub).
#include "common/error.h"
#include "data/tokenizer_backend.h"

namespace qlora::data::detail {

std::unique_ptr<TokenizerBackend> load_hf_json(const std::string& path) {
  fail(path, ": tokenizer.json support is not built yet");
}

}  // namespace qlora::data::detail
