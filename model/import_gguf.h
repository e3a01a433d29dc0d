// qlora-cpp: `qlora import-gguf` — a GGUF model file (llama.cpp / Ollama) to a Hugging Face model
// directory. Torch-free (common/gguf.h reader + kernels/gguf_dequant.h).
//
// What it writes, and the reference each part matches (transformers 5.23 loading the same file with
// `from_pretrained(dir, gguf_file=...)`: modeling_gguf_pytorch_utils.py, integrations/ggml.py,
// integrations/gguf/gguf_tokenizer_mapping.py):
//   model.safetensors      every tensor dequantized to float32 (kernels/gguf_dequant.h), Q/K rows
//                          un-permuted for the llama architecture (llama.cpp convert_hf_to_gguf.py
//                          LlamaModel.permute; undone as transformers' _reverse_permute_weights:
//                          HF row h·2d + s·d + i = GGUF row h·2d + 2i + s, per head h of q (heads)
//                          or k (kv heads), d = head_dim/2), stored as bf16 (RNE) or fp32; GGUF names
//                          mapped to HF names (docs/gguf.md); written one tensor at a time.
//                          qwen3's blk.N.attn_q_norm / attn_k_norm become self_attn.q_norm / k_norm.
//   config.json            LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM from `<arch>.*`
//                          metadata; tie_word_embeddings when there is no `output.weight`; qwen3's
//                          head_dim from `qwen3.attention.key_length` (llama.cpp writes it), else
//                          embedding_length / head_count (llama.cpp llama-model.cpp's default);
//                          rope_parameters llama3 when a llama file's rope_freqs.weight is the
//                          vector llama.cpp's converter writes for Llama 3.1 / 3.2 / 3.3 (factor =
//                          its last element, low 1, high 4, original 8192): the original HF
//                          model's RoPE, which transformers' GGUF loader drops (docs/gguf.md).
//   tokenizer.json         tokenizer.ggml.model "gpt2": byte-level BPE from tokenizer.ggml.{tokens,
//                          merges,token_type,pre}; "llama" (Llama 2 / Mistral files): sentencepiece
//                          BPE with byte fallback, LlamaTokenizer's pipeline, merges from the file or
//                          derived from tokenizer.ggml.scores (transformers' generate_merges).
//   tokenizer_config.json  bos/eos/unk/pad tokens, add_bos_token (absent: true for "llama"),
//                          chat_template; tokenizer_class (LlamaTokenizer with legacy false for "llama").
//   generation_config.json bos/eos (pad) ids.
#pragma once
#include <cstdint>
#include <map>
#include <string>

namespace qlora {

struct ImportGgufOptions {
  std::string gguf_path;
  std::string out_dir;         ///< must not exist or be empty
  std::string dtype = "bf16";  ///< stored dtype of model.safetensors: bf16 | fp32
};

struct ImportGgufResult {
  std::string architecture;    ///< GGUF general.architecture
  int64_t tensors = 0;         ///< tensors written
  int64_t parameters = 0;      ///< elements written
  uint64_t safetensors_bytes = 0;
  bool tied_embeddings = false;
  double seconds = 0;
  /// ggml type name ("Q4_K", "F32", ...) -> how many of the written tensors the file stores in it:
  /// what the import dequantized from (a Q4 file's errors are in the weights trained on).
  std::map<std::string, int64_t> tensor_types;
};

/// Imports `gguf_path` into `out_dir`. Everything is built in "<out_dir>.tmp-<pid>" and renamed at
/// the end, so on any error `out_dir` is left as it was (absent or empty) and no temporary remains.
/// Throws qlora::Error naming the file and the metadata key or tensor: an unreadable/malformed
/// GGUF (gguf::GgufFile's checks), a GGUF that is not a model (general.type other than "model",
/// e.g. a LoRA adapter, said so by name; LoRA tensor names; no tensors, as a vocab-only file), an architecture other than llama/qwen2/qwen3 (qwen3moe and
/// the rest are refused by name), qwen3 value_length differing from key_length or a
/// rope.dimension_count differing from it (partial RoPE), a tokenizer other than
/// "gpt2" (byte-level BPE) or "llama" (sentencepiece BPE; without merges it needs
/// tokenizer.ggml.scores, one per token, and tokens of at most 4096 bytes), a missing or mistyped
/// metadata key, a missing or unexpected tensor, a
/// tensor whose shape disagrees with the metadata, a quantization type not in kernels/gguf_dequant.h,
/// a rope_freqs.weight that is not F32/F16/BF16 [head_dim/2] and finite or is neither all ones nor
/// the llama3 scaling above (or appears in a qwen2/qwen3 file),
/// a bad --dtype, a non-empty out_dir, or an I/O error.
ImportGgufResult import_gguf(const ImportGgufOptions& o);

/// `qlora import-gguf FILE.gguf --out DIR [--dtype bf16|fp32]`: import_gguf, then the summary line
/// the CLI prints. Throws as import_gguf does.
std::string cmd_import_gguf(const ImportGgufOptions& o);

}  // namespace qlora
