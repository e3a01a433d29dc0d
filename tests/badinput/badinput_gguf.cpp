// Malformed GGUF corpus for the reader and `import-gguf`: each hand-made file is refused with one
// line naming the file and the key or tensor, and nothing is left in --out; then a byte-flip /
// truncation loop over a valid tiny model that must never crash (only qlora::Error or success).
// Torch-free; also runs under ASan+UBSan.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <random>

#include "common/files.h"
#include "common/error.h"
#include "common/gguf.h"
#include "gguf_builder.h"
#include "test_util.h"
#include "model/import_gguf.h"

namespace {
namespace fs = std::filesystem;
using qlora::test::GgufBuilder;
using qlora::test::tiny_llama_gguf;

struct Case {
  const char* name;
  std::string bytes;
  const char* expect;  // fragment of the message
};

std::string with_header(uint32_t version, uint64_t n_tensors, uint64_t n_kv, const std::string& rest = "") {
  return "GGUF" + GgufBuilder::pod(version) + GgufBuilder::pod(n_tensors) + GgufBuilder::pod(n_kv) + rest;
}

GgufBuilder tiny(std::set<std::string> omit = {}) { return tiny_llama_gguf(true, "llama", std::move(omit)); }

std::vector<Case> corpus() {
  std::vector<Case> c;
  const std::string valid = tiny().bytes();
  c.push_back({"empty", "", "shorter than the 4-byte magic"});
  c.push_back({"bad_magic", "GGML" + valid.substr(4), "bad magic"});
  c.push_back({"version_1", with_header(1, 0, 0), "GGUF version 1 is not supported"});
  c.push_back({"version_big_endian", with_header(0x03000000u, 0, 0), "big-endian GGUF files are not supported"});
  c.push_back({"truncated_header", valid.substr(0, 12), "runs past the end of the file"});
  c.push_back({"truncated_half", valid.substr(0, valid.size() / 2), "runs past the end of the"});
  c.push_back({"truncated_data", valid.substr(0, valid.size() - 5), "runs past the end of the data section"});
  c.push_back({"absurd_kv_count", with_header(3, 0, uint64_t{1} << 40), "metadata key count 1099511627776 is impossible"});
  c.push_back({"absurd_tensor_count", with_header(3, uint64_t{1} << 62, 0), "tensor count 4611686018427387904 is impossible"});
  c.push_back({"absurd_key_length", with_header(3, 0, 1, GgufBuilder::pod<uint64_t>(uint64_t{1} << 40) + std::string(16, 'x')),
               "metadata entry #0: key length 1099511627776 exceeds"});
  {
    GgufBuilder b;
    b.kv("k.arr", 9, GgufBuilder::pod<uint32_t>(4) + GgufBuilder::pod<uint64_t>(uint64_t{1} << 60));
    c.push_back({"absurd_array_length", b.bytes(), "metadata key 'k.arr': array length 1152921504606846976 runs past"});
  }
  {
    GgufBuilder b;
    b.kv("k.bad", 13, GgufBuilder::pod<uint32_t>(0));
    c.push_back({"unknown_value_type", b.bytes(), "metadata key 'k.bad': unknown value type 13"});
  }
  {
    GgufBuilder b;
    b.kv("k.nested", 9, GgufBuilder::pod<uint32_t>(9) + GgufBuilder::pod<uint64_t>(1));
    c.push_back({"nested_array", b.bytes(), "metadata key 'k.nested': arrays of arrays are not supported"});
  }
  {
    GgufBuilder b;
    b.u32("k.dup", 1);
    b.u32("k.dup", 2);
    c.push_back({"duplicate_key", b.bytes(), "metadata key 'k.dup': duplicate key"});
  }
  {
    GgufBuilder b;
    b.u32("general.alignment", 24);
    c.push_back({"alignment_not_power_of_two", b.bytes(), "metadata key 'general.alignment': 24 is not a power of two"});
  }
  {
    GgufBuilder b;
    b.tensor_f32("w", {4}, {1, 2, 3, 4});
    b.tensor("w", {4}, 0, std::string(16, '\0'));
    c.push_back({"duplicate_tensor", b.bytes(), "tensor 'w': duplicate tensor name"});
  }
  {
    GgufBuilder b;
    b.tensor("w", {1, 1, 1, 1, 1}, 0, std::string(4, '\0'));
    c.push_back({"five_dims", b.bytes(), "tensor 'w': 5 dimensions (expected 1..4)"});
  }
  {
    GgufBuilder b;
    b.tensor("w", {uint64_t{1} << 40, uint64_t{1} << 40}, 0, "");
    c.push_back({"shape_overflow", b.bytes(), "tensor 'w': shape overflows"});
  }
  {
    GgufBuilder b;
    b.tensor("w", {4}, 99, std::string(4, '\0'));
    c.push_back({"unknown_ggml_type", b.bytes(), "tensor 'w': unknown ggml type 99"});
  }
  {
    GgufBuilder b;
    b.tensor("w", {8}, 8, std::string(34, '\0'));
    c.push_back({"row_not_multiple_of_block", b.bytes(), "tensor 'w': row length 8 is not a multiple of the Q8_0 block size 32"});
  }
  {
    GgufBuilder b;
    b.tensor("w", {4}, 0, std::string(16, '\0'), 4);
    c.push_back({"unaligned_offset", b.bytes(), "tensor 'w': data offset 4 is not a multiple of the alignment 32"});
  }
  {
    GgufBuilder b;
    b.tensor_f32("w", {256}, std::vector<float>(256, 1.f));
    b.tensor("tail", {64}, 0, "", 1024);
    c.push_back({"data_past_end", b.bytes(), "tensor 'tail': data [1024, +256) runs past the end of the data section"});
  }
  {
    GgufBuilder b;
    b.tensor("big", {uint64_t{1} << 40}, 0, "");
    c.push_back({"tensor_bigger_than_file", b.bytes(), "tensor 'big': 1099511627776 elements of F32 do not fit in a file of"});
  }
  {
    GgufBuilder b;
    b.tensor("a", {16}, 0, std::string(64, '\1'), 0);
    b.tensor("b", {16}, 0, std::string(64, '\2'), 32);
    c.push_back({"overlapping_tensors", b.bytes(), "tensor 'b': data overlaps tensor 'a'"});
  }
  // Whole-model problems (import level).
  {
    GgufBuilder b = tiny({"general.architecture"});
    b.str("general.architecture", "falcon");
    c.push_back({"unsupported_architecture", b.bytes(), "metadata key 'general.architecture': architecture 'falcon' is not supported"});
  }
  c.push_back({"missing_architecture", tiny({"general.architecture"}).bytes(), "metadata key 'general.architecture': missing"});
  c.push_back({"missing_tokenizer_merges", tiny({"tokenizer.ggml.merges"}).bytes(), "metadata key 'tokenizer.ggml.merges': missing"});
  c.push_back({"missing_tokenizer_tokens", tiny({"tokenizer.ggml.tokens"}).bytes(), "metadata key 'tokenizer.ggml.tokens': missing"});
  c.push_back({"missing_tokenizer_model", tiny({"tokenizer.ggml.model"}).bytes(), "metadata key 'tokenizer.ggml.model': missing"});
  c.push_back({"missing_rms_eps", tiny({"llama.attention.layer_norm_rms_epsilon"}).bytes(),
               "metadata key 'llama.attention.layer_norm_rms_epsilon': missing"});
  {
    GgufBuilder b = tiny({"tokenizer.ggml.model"});
    b.str("tokenizer.ggml.model", "t5");
    c.push_back({"unsupported_tokenizer", b.bytes(), "metadata key 'tokenizer.ggml.model': tokenizer 't5' is not supported"});
  }
  {  // a sentencepiece vocabulary without merges needs the scores they are derived from
    GgufBuilder b = tiny({"tokenizer.ggml.model", "tokenizer.ggml.merges"});
    b.str("tokenizer.ggml.model", "llama");
    c.push_back({"spm_without_scores", b.bytes(), "metadata key 'tokenizer.ggml.scores': missing"});
  }
  {
    GgufBuilder b = tiny({"tokenizer.ggml.model", "tokenizer.ggml.merges"});
    b.str("tokenizer.ggml.model", "llama");
    b.f32_array("tokenizer.ggml.scores", {0.f, -1.f});
    c.push_back({"spm_scores_count", b.bytes(), "metadata key 'tokenizer.ggml.scores': 2 entries for"});
  }
  {
    GgufBuilder b = tiny({"tokenizer.ggml.model", "tokenizer.ggml.merges", "tokenizer.ggml.tokens"});
    b.str("tokenizer.ggml.model", "llama");
    b.str_array("tokenizer.ggml.tokens", {"<unk>", "a", "b", "c", std::string(5000, 'x'), "ab", "e", "f", "g", "h", "i", "j"});
    c.push_back({"spm_token_too_long", b.bytes(), "metadata key 'tokenizer.ggml.tokens': token 4 is 5000 bytes"});
  }
  {
    GgufBuilder b = tiny({"tokenizer.ggml.model", "tokenizer.ggml.merges"});
    b.str("tokenizer.ggml.model", "llama");
    b.str("tokenizer.ggml.scores", "x");
    c.push_back({"spm_scores_not_floats", b.bytes(), "metadata key 'tokenizer.ggml.scores': expected ARRAY of floats, got STRING"});
  }
  {
    GgufBuilder b = tiny({"tokenizer.ggml.tokens"});
    b.str("tokenizer.ggml.tokens", "abc");
    c.push_back({"tokens_not_array", b.bytes(), "metadata key 'tokenizer.ggml.tokens': expected ARRAY of STRING, got STRING"});
  }
  {
    GgufBuilder b = tiny({"tokenizer.ggml.eos_token_id"});
    b.u32("tokenizer.ggml.eos_token_id", 12);
    c.push_back({"eos_outside_vocab", b.bytes(), "metadata key 'tokenizer.ggml.eos_token_id': token id 12 is outside the vocabulary"});
  }
  {
    GgufBuilder b = tiny({"tokenizer.ggml.merges"});
    b.str_array("tokenizer.ggml.merges", {"a b", "abc"});
    c.push_back({"bad_merge", b.bytes(), "metadata key 'tokenizer.ggml.merges': entry 1 is not two tokens"});
  }
  {
    GgufBuilder b = tiny({"llama.block_count"});
    b.u32("llama.block_count", 1u << 30);
    c.push_back({"absurd_block_count", b.bytes(), "metadata key 'llama.block_count': 1073741824 layers need at least"});
  }
  {
    GgufBuilder b = tiny({"general.architecture"});
    b.str("general.architecture", "qwen3moe");
    c.push_back({"qwen3moe_architecture", b.bytes(),
                 "metadata key 'general.architecture': architecture 'qwen3moe' is not supported (supported: llama, qwen2, qwen3)"});
  }
  {
    GgufBuilder b = tiny_llama_gguf(true, "qwen3", {"qwen3.attention.value_length"});
    b.u32("qwen3.attention.value_length", 8);
    c.push_back({"qwen3_value_length_differs", b.bytes(),
                 "metadata key 'qwen3.attention.value_length': 8 differs from the key head size 4"});
  }
  {
    // key_length sets the head size the tensors are checked against
    GgufBuilder b = tiny_llama_gguf(true, "qwen3", {"qwen3.attention.key_length", "qwen3.attention.value_length"});
    b.u32("qwen3.attention.key_length", 2);
    b.u32("qwen3.attention.value_length", 2);
    c.push_back({"qwen3_key_length_shapes", b.bytes(),
                 "tensor 'blk.0.attn_q.weight': shape [8, 8] does not match the metadata ([4, 8])"});
  }
  {
    GgufBuilder b = tiny_llama_gguf(true, "qwen3");
    b.u32("qwen3.rope.dimension_count", 2);
    c.push_back({"qwen3_partial_rope", b.bytes(),
                 "metadata key 'qwen3.rope.dimension_count': 2 differs from the head size 4 (partial RoPE is not"});
  }
  c.push_back({"qwen3_missing_q_norm", tiny_llama_gguf(true, "qwen3", {"blk.1.attn_q_norm.weight"}).bytes(),
               "tensor 'blk.1.attn_q_norm.weight': missing"});
  {
    GgufBuilder b = tiny_llama_gguf(true, "qwen3", {"blk.0.attn_k_norm.weight"});
    b.tensor_f32("blk.0.attn_k_norm.weight", {8}, std::vector<float>(8, 1.f));
    c.push_back({"qwen3_k_norm_shape", b.bytes(),
                 "tensor 'blk.0.attn_k_norm.weight': shape [8] does not match the metadata ([4])"});
  }
  // llama 3's rope_freqs.weight (tiny: head_dim 4, so [2]; rope_theta 10000, so llama3 scaling gives [1, 1]).
  {
    GgufBuilder b = tiny();
    b.tensor_f32("rope_freqs.weight", {3}, {1.f, 1.f, 1.f});
    c.push_back({"rope_freqs_shape", b.bytes(),
                 "tensor 'rope_freqs.weight': shape [3] does not match the metadata ([2] = head_dim / 2)"});
  }
  {
    GgufBuilder b = tiny();
    b.tensor("rope_freqs.weight", {2}, 26, GgufBuilder::pod<int32_t>(1) + GgufBuilder::pod<int32_t>(8));
    c.push_back({"rope_freqs_type", b.bytes(),
                 "tensor 'rope_freqs.weight': ggml type I32 is not supported here (F32, F16, BF16)"});
  }
  {
    GgufBuilder b = tiny();
    b.tensor_f32("rope_freqs.weight", {2}, {1.f, std::numeric_limits<float>::quiet_NaN()});
    c.push_back({"rope_freqs_nan", b.bytes(), "tensor 'rope_freqs.weight': element 1 is"});
  }
  {
    GgufBuilder b = tiny();
    b.tensor_f32("rope_freqs.weight", {2}, {1.f, -8.f});
    c.push_back({"rope_freqs_negative_factor", b.bytes(),
                 "tensor 'rope_freqs.weight': last element (the llama3 factor) is -8, not > 0"});
  }
  {
    GgufBuilder b = tiny();
    b.tensor_f32("rope_freqs.weight", {2}, {1.f, 8.f});
    c.push_back({"rope_freqs_not_llama3", b.bytes(),
                 "tensor 'rope_freqs.weight': element 1 is 8 where llama 3 RoPE scaling (rope_type llama3, "
                 "factor 8 = the last element, low_freq_factor 1, high_freq_factor 4, "
                 "original_max_position_embeddings 8192, rope_theta 10000, head_dim 4) gives 1; this file's RoPE "
                 "cannot be written as a config.json"});
  }
  {
    GgufBuilder b = tiny_llama_gguf(true, "qwen2");
    b.tensor_f32("rope_freqs.weight", {2}, {1.f, 1.f});
    c.push_back({"rope_freqs_qwen2", b.bytes(), "tensor 'rope_freqs.weight': not expected in a qwen2 model"});
  }
  // Not a model (llama.cpp's general.type; the gguf-py-written adapter and vocab-only files are in
  // test_import_gguf): refused before any model key is read.
  {
    GgufBuilder b;
    b.str("general.architecture", "llama");
    b.str("general.type", "adapter");
    b.str("adapter.type", "lora");
    b.f32("adapter.lora.alpha", 16.f);
    b.tensor_f32("blk.0.attn_q.weight.lora_a", {8, 2}, std::vector<float>(16, 0.f));
    b.tensor_f32("blk.0.attn_q.weight.lora_b", {2, 8}, std::vector<float>(16, 0.f));
    c.push_back({"lora_adapter", b.bytes(),
                 "metadata key 'general.type': 'adapter': this is a LoRA adapter GGUF (adapter.type 'lora'), not a "
                 "model; import-gguf needs the base model's GGUF (converting adapter GGUFs is not supported)"});
  }
  {
    GgufBuilder b;  // no general.type: recognised by the tensor names
    b.str("general.architecture", "llama");
    b.tensor_f32("blk.0.attn_q.weight.lora_a", {8, 2}, std::vector<float>(16, 0.f));
    c.push_back({"lora_tensors_untyped", b.bytes(),
                 "metadata key 'general.type': absent, but the tensors are named *.lora_a / *.lora_b: this is a "
                 "LoRA adapter GGUF"});
  }
  {
    GgufBuilder b = tiny();
    b.str("general.type", "imatrix");
    c.push_back({"imatrix_type", b.bytes(),
                 "metadata key 'general.type': 'imatrix' is not a model GGUF (import-gguf imports general.type 'model')"});
  }
  {
    GgufBuilder b = tiny();
    b.str("general.type", "model");
    b.drop_tensors();
    c.push_back({"vocab_only", b.bytes(), "the file has no tensors (a vocab-only GGUF?); import-gguf needs a model GGUF"});
  }
  // Metadata the readers take but a model dir could not be loaded from (trial 27: import exited 0,
  // every later command refused the dir): refused by its key, or by the loader's reason.
  {
    GgufBuilder b = tiny({"llama.rope.freq_base"});
    b.omit.clear();
    b.f32("llama.rope.freq_base", -1.f);
    c.push_back({"rope_freq_base_negative", b.bytes(), "metadata key 'llama.rope.freq_base': -1 is not a positive number"});
  }
  {
    GgufBuilder b = tiny({"llama.attention.layer_norm_rms_epsilon"});
    b.omit.clear();
    b.f32("llama.attention.layer_norm_rms_epsilon", std::numeric_limits<float>::quiet_NaN());
    c.push_back({"rms_eps_nan", b.bytes(),
                 "metadata key 'llama.attention.layer_norm_rms_epsilon': nan is not a positive number"});
  }
  {
    GgufBuilder b = tiny({"tokenizer.ggml.merges"});
    b.omit.clear();
    b.str_array("tokenizer.ggml.merges", {"a b", "zz qq"});
    c.push_back({"merge_unknown_token", b.bytes(), "its metadata gives a model directory that would not load: "});
  }
  {
    GgufBuilder b = tiny({"tokenizer.ggml.tokens"});
    b.omit.clear();
    b.str_array("tokenizer.ggml.tokens", {"<|endoftext|>", "a", "b", "c", "Ġ", "a", "Ġa", "abc", "d", "e", "<|im_end|>", "f"});
    c.push_back({"duplicate_token_text", b.bytes(), "its metadata gives a model directory that would not load: "});
  }
  c.push_back({"missing_tensor", tiny({"blk.1.ffn_down.weight"}).bytes(), "tensor 'blk.1.ffn_down.weight': missing"});
  {
    GgufBuilder b = tiny({"blk.0.attn_k.weight"});
    b.tensor_f32("blk.0.attn_k.weight", {8, 8}, std::vector<float>(64, 0.f));
    c.push_back({"shape_mismatch", b.bytes(), "tensor 'blk.0.attn_k.weight': shape [8, 8] does not match the metadata ([4, 8])"});
  }
  {
    GgufBuilder b = tiny();
    b.tensor_f32("blk.7.attn_q.weight", {8, 8}, std::vector<float>(64, 0.f));
    c.push_back({"unexpected_tensor", b.bytes(), "tensor 'blk.7.attn_q.weight': not expected in a llama model"});
  }
  {
    GgufBuilder b = tiny({"blk.0.ffn_up.weight"});
    b.tensor("blk.0.ffn_up.weight", {8, 16}, 16, std::string(0, '\0'));  // IQ2_XXS, but block is 256
    c.push_back({"unsupported_type_block", b.bytes(), "tensor 'blk.0.ffn_up.weight': row length 8 is not a multiple of the IQ2_XXS block size 256"});
  }
  return c;
}

class MalformedGguf : public ::testing::TestWithParam<Case> {};

TEST_P(MalformedGguf, RefusedWithOneLineNothingLeft) {
  const Case& c = GetParam();
  const fs::path dir = qlora::test::fresh_temp_dir(std::string("bad_gguf_") + c.name);
  const fs::path p = dir / (std::string(c.name) + ".gguf");
  std::ofstream(p, std::ios::binary) << c.bytes;
  const fs::path out = dir / "out";
  qlora::test::expect_file_error(p.string(), c.expect, c.name,
                                 [&] { qlora::import_gguf({p.string(), out.string(), "fp32"}); });
  EXPECT_FALSE(fs::exists(out)) << c.name;
  for (const auto& e : fs::directory_iterator(dir))  // no temporary left behind
    EXPECT_EQ(e.path(), p) << "left behind: " << e.path();
  qlora::remove_tree(dir);
}

INSTANTIATE_TEST_SUITE_P(Corpus, MalformedGguf, ::testing::ValuesIn(corpus()),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

TEST(MalformedGguf, UnsupportedQuantTypeNamed) {
  // A legal IQ2_XXS tensor (ne[0] = 256, 66 bytes per block) where the model expects a weight.
  const fs::path dir = qlora::test::fresh_temp_dir("bad_gguf_iq2");
  GgufBuilder m = tiny_llama_gguf(true, "llama", {"blk.0.ffn_gate.weight", "llama.feed_forward_length", "blk.0.ffn_up.weight",
                                                  "blk.0.ffn_down.weight", "blk.1.ffn_gate.weight", "blk.1.ffn_up.weight",
                                                  "blk.1.ffn_down.weight"});
  m.u32("llama.feed_forward_length", 256);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    m.tensor(p + "ffn_gate.weight", {8, 256}, 0, std::string(8 * 256 * 4, '\0'));
    m.tensor(p + "ffn_up.weight", {8, 256}, 0, std::string(8 * 256 * 4, '\0'));
    m.tensor(p + "ffn_down.weight", {256, 8}, 16, std::string(8 * 66, '\0'));  // 8 rows of one block
  }
  const fs::path p = dir / "iq2.gguf";
  std::ofstream(p, std::ios::binary) << m.bytes();
  try {
    qlora::import_gguf({p.string(), (dir / "out").string(), "bf16"});
    ADD_FAILURE() << "accepted";
  } catch (const qlora::Error& e) {
    EXPECT_NE(std::string(e.what()).find(p.string() + ": tensor 'blk.0.ffn_down.weight': ggml type IQ2_XXS is not supported"),
              std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("; import a file of the same model in one of those (its F16 / BF16 or Q8_0"),
              std::string::npos) << e.what();  // with what to do (trial 15)
  }
  EXPECT_FALSE(fs::exists(dir / "out"));
  qlora::remove_tree(dir);
}

TEST(MalformedGguf, ValidTinyModelImports) {
  // The base of the corpus is itself valid: the cases above fail for their own reason.
  const fs::path dir = qlora::test::fresh_temp_dir("tiny_gguf_ok");
  const fs::path p = dir / "tiny.gguf";
  std::ofstream(p, std::ios::binary) << tiny().bytes();
  const auto r = qlora::import_gguf({p.string(), (dir / "out").string(), "fp32"});
  EXPECT_EQ(r.tensors, 2 + 2 * 9);
  EXPECT_TRUE(r.tied_embeddings);
  EXPECT_TRUE(fs::exists(dir / "out" / "model.safetensors"));
  qlora::remove_tree(dir);
}

TEST(MalformedGguf, ByteFlipsAndTruncationsNeverCrash) {
  const std::string valid = tiny().bytes();
  const fs::path dir = qlora::test::fresh_temp_dir("gguf_fuzz");
  const fs::path p = dir / "fuzz.gguf";
  const fs::path out = dir / "out";
  std::mt19937 rng(20261130);
  int refused = 0, imported = 0;
  for (int it = 0; it < 400; ++it) {
    std::string b = valid;
    if (it % 4 == 0) {
      b.resize(rng() % valid.size());
    } else {
      const int flips = 1 + static_cast<int>(rng() % 4);
      // Mostly the header (metadata and tensor infos), where the structure lives.
      for (int k = 0; k < flips; ++k) {
        const size_t pos = (it % 2 ? rng() % valid.size() : rng() % std::min<size_t>(valid.size(), 1200));
        b[pos] = static_cast<char>(rng() % 256);
      }
    }
    std::ofstream(p, std::ios::binary | std::ios::trunc) << b;
    try {
      qlora::import_gguf({p.string(), out.string(), it % 2 ? "bf16" : "fp32"});
      ++imported;
      qlora::remove_tree(out);
    } catch (const qlora::Error& e) {
      ++refused;
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      EXPECT_FALSE(fs::exists(out)) << msg;
    }
  }
  size_t left = 0;
  for (const auto& e : fs::directory_iterator(dir)) left += e.path() != p;
  EXPECT_EQ(left, 0u);
  std::cout << "byte flips / truncations: " << refused << " refused, " << imported << " imported, 0 crashes\n";
  EXPECT_GT(refused, 100);
  EXPECT_GT(imported, 10);
  qlora::remove_tree(dir);
}

}  // namespace
