// `qlora import-gguf`: SmolLM2-135M-Instruct (Q4_1 GGUF) imported and compared with what
// transformers builds from the same file (tests/fixtures/make_gguf_refs.py): every tensor bit for
// bit (SHA-256 of float32 bytes), tokenizer.json as JSON, config fields, and transformers loading the
// result; a tiny Qwen2 and a tiny Qwen3 the same way; bf16 = RNE of fp32; peak RSS of the streaming
// import; tiny hand-built llama/qwen2/qwen3 files; the CLI's exit codes; llama 3's rope_freqs.weight
// read as rope_parameters llama3 (vs the original HF model, not transformers' GGUF load).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"
#include "common/gguf.h"
#include "common/proc_status.h"
#include "common/safetensors.h"
#include "data/template.h"
#include "data/tokenizer.h"
#include "gguf_builder.h"
#include "kernels/quant4.h"
#include "test_util.h"
#include "model/import_gguf.h"

namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

std::string smollm2_path() {
  if (const char* e = std::getenv("QLORA_SMOLLM2_GGUF")) return e;
  return std::string(std::getenv("HOME")) + "/.cache/qlora-cpp/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}
#define REQUIRE_SMOLLM2(var)                          \
  const std::string var = smollm2_path();             \
  if (!fs::exists(var)) FAIL() << var << ": missing (run scripts/setup.sh)"

using qlora::test::read_json;

std::string tensor_sha(const qlora::st::SafetensorsFile& f, const qlora::st::TensorInfo& t) {
  return qlora::sha256_hex(std::string(reinterpret_cast<const char*>(f.data(t)), t.nbytes()));
}

// Runs the qlora CLI; returns exit status and stderr+stdout.
struct CliRun {
  int status;
  std::string out;
};
CliRun run_cli(const std::vector<std::string>& args, const fs::path& log) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    FILE* f = std::fopen(log.c_str(), "w");
    if (f) {
      ::dup2(fileno(f), 1);
      ::dup2(fileno(f), 2);
    }
    std::vector<char*> argv;
    std::string bin = ::qlora::test::qlora_bin();
    argv.push_back(bin.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(bin.c_str(), argv.data());
    ::_exit(127);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  std::ifstream in(log);
  std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

// Compares an imported fp32 directory with what transformers built from the same GGUF
// (`ref` = a make_gguf_refs.py output dir): every tensor's float32 bytes (SHA-256), the fields of
// config.json, tokenizer.json as a JSON value; then transformers loads `out` itself
// (gguf_import_check.py: logits <= 1e-4, corpus ids, tied). Returns the number of equal tensors.
size_t expect_matches_transformers(const fs::path& out, const fs::path& ref) {
  const json man = read_json(ref / "tensors.json");
  qlora::st::SafetensorsFile st((out / "model.safetensors").string());
  EXPECT_EQ(st.tensors().size(), man["tensors"].size());
  EXPECT_EQ(st.contains("lm_head.weight"), !man["tied"].get<bool>());
  size_t equal = 0;
  for (auto it = man["tensors"].begin(); it != man["tensors"].end(); ++it) {
    if (!st.contains(it.key())) {
      ADD_FAILURE() << it.key() << ": missing";
      continue;
    }
    const auto& t = st.info(it.key());
    EXPECT_EQ(t.dtype, qlora::st::DType::F32);
    EXPECT_EQ(t.shape, it.value()["shape"].get<std::vector<int64_t>>()) << it.key();
    const bool same = tensor_sha(st, t) == it.value()["sha256"].get<std::string>();
    EXPECT_TRUE(same) << it.key() << " differs from transformers' GGUF-loaded tensor";
    equal += same;
  }
  std::cout << ref.filename().string() << ": tensors bit-identical to transformers: " << equal << "/"
            << man["tensors"].size() << "\n";

  // config.json: every field we write that transformers' config has, equal.
  const json cfg = read_json(out / "config.json"), rc = read_json(ref / "config.json");
  for (auto it = cfg.begin(); it != cfg.end(); ++it) {
    if (it.key() == "architectures") continue;  // transformers leaves it null for a GGUF load
    if (it.key() == "rope_theta" || it.key() == "rope_scaling") {
      // transformers 4's keys, for converters back to GGUF (transformers 5 saves rope_parameters only
      // and reads it first): the same values as rope_parameters, rope_scaling only when not default
      EXPECT_EQ(it.value(), it.key() == "rope_theta" ? cfg["rope_parameters"]["rope_theta"] : [&] {
        json scaling = cfg["rope_parameters"];
        scaling.erase("rope_theta");
        return scaling;
      }()) << it.key();
      EXPECT_TRUE(it.key() == "rope_theta" || cfg["rope_parameters"]["rope_type"] != "default");
      continue;
    }
    EXPECT_TRUE(rc.contains(it.key())) << it.key();
    EXPECT_EQ(it.value(), rc.value(it.key(), json())) << "config.json field " << it.key();
  }
  for (const char* k : {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                        "num_key_value_heads", "rope_parameters", "rms_norm_eps", "tie_word_embeddings",
                        "max_position_embeddings", "bos_token_id", "eos_token_id", "model_type"})
    EXPECT_TRUE(cfg.contains(k)) << k;

  // tokenizer.json: the same JSON value as transformers' GGUF tokenizer saved by `tokenizers`.
  const json tok = read_json(out / "tokenizer.json"), rt = read_json(ref / "tokenizer.json");
  for (auto it = rt.begin(); it != rt.end(); ++it)
    EXPECT_EQ(tok.value(it.key(), json()), it.value()) << "tokenizer.json field " << it.key();
  EXPECT_EQ(tok, rt);

  const std::string python = ::qlora::test::python_exe();
  if (python.empty()) {  // no silent skip: the transformers check is part of the comparison
    ADD_FAILURE() << "QLORA_PYTHON is empty: configure with -DQLORA_PYTHON=<venv python> (scripts/build.sh does)";
    return false;
  }
  const auto res = qlora::test::run_command(
      python + " " + (qlora::test::source_dir() / "tests/fixtures/gguf_import_check.py").string() + " " +
      out.string() + " " + ref.string());
  EXPECT_EQ(res.status, 0) << res.out;
  const size_t at = res.out.find("transformers on the imported dir");
  std::cout << (at == std::string::npos ? res.out : res.out.substr(at));
  return equal;
}

// Our tokenizer (data::Tokenizer) on the imported dir `out` gives transformers' GGUF-tokenizer ids on
// the fixture corpus of `ref` (corpus.json). Returns the number of strings compared.
size_t expect_our_tokenizer_matches_corpus(const fs::path& out, const fs::path& ref) {
  const json corpus = read_json(ref / "corpus.json");
  const qlora::data::Tokenizer t = qlora::data::Tokenizer::from_pretrained(out.string());
  EXPECT_EQ(corpus["texts"].size(), corpus["ids"].size());
  EXPECT_GE(corpus["texts"].size(), 20u);
  size_t bad = 0;
  for (size_t i = 0; i < corpus["texts"].size() && i < corpus["ids"].size(); ++i) {
    const std::string text = corpus["texts"][i];
    const auto want = corpus["ids"][i].get<std::vector<int32_t>>();
    if (t.encode_with_special_tokens(text) != want && bad++ < 3) ADD_FAILURE() << "ids differ for '" << text << "'";
  }
  EXPECT_EQ(bad, 0u);
  return corpus["texts"].size();
}

// ---------------------------------------------------------------------------------------------
TEST(ImportGguf, SmolLM2EqualsTransformersGgufLoad) {
  REQUIRE_SMOLLM2(gguf);
  QLORA_REQUIRE_FIXTURE(ref, "gguf/smollm2/tensors.json");
  const fs::path dir = qlora::test::fresh_temp_dir("import_smollm2_fp32");
  const fs::path out = dir / "smollm2";
  const auto r = qlora::import_gguf({gguf, out.string(), "fp32"});
  std::cout << "import-gguf SmolLM2 fp32: " << r.seconds << " s, " << r.tensors << " tensors\n";
  EXPECT_EQ(r.architecture, "llama");
  EXPECT_TRUE(r.tied_embeddings);
  EXPECT_EQ(r.parameters, 134515008);
  // the types the summary names, as gguf-py's GGUFReader counts them (tensor_type of its 272 tensors)
  EXPECT_EQ(r.tensor_types, (std::map<std::string, int64_t>{{"F32", 61}, {"Q4_1", 210}, {"Q8_0", 1}}));
  EXPECT_EQ(expect_matches_transformers(out, ref.parent_path()), 272u);

  // A few tensors in full, so a failure shows where (the permuted q/k rows first of all).
  QLORA_REQUIRE_FIXTURE(subset, "gguf/smollm2/subset.safetensors");
  qlora::st::SafetensorsFile st((out / "model.safetensors").string());
  qlora::st::SafetensorsFile sub(subset.string());
  for (const auto& t : sub.tensors()) {
    const auto& o = st.info(t.name);
    ASSERT_EQ(o.nbytes(), t.nbytes()) << t.name;
    const float* a = reinterpret_cast<const float*>(st.data(o));
    const float* b = reinterpret_cast<const float*>(sub.data(t));
    int64_t first = -1;
    for (int64_t i = 0; i < t.numel() && first < 0; ++i)
      if (std::memcmp(a + i, b + i, 4) != 0) first = i;
    EXPECT_EQ(first, -1) << t.name << ": first difference at flat index " << first;
  }
  const json cfg = read_json(out / "config.json");
  EXPECT_EQ(cfg["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(cfg["head_dim"], 64);
  const qlora::gguf::GgufFile g(gguf);
  const json tc = read_json(out / "tokenizer_config.json");
  EXPECT_EQ(tc["bos_token"], "<|im_start|>");
  EXPECT_EQ(tc["eos_token"], "<|im_end|>");
  EXPECT_EQ(tc["pad_token"], "<|im_end|>");
  EXPECT_EQ(tc["unk_token"], "<|endoftext|>");
  EXPECT_EQ(tc["add_bos_token"], false);
  EXPECT_EQ(tc["chat_template"], g.get_string("tokenizer.chat_template"));
  EXPECT_EQ(read_json(out / "generation_config.json"),
            (json{{"bos_token_id", 1}, {"eos_token_id", 2}, {"pad_token_id", 2}}));
  // tokenizer.ggml.pre "smollm": every digit its own token, as llama.cpp splits it and SmolLM2's own
  // tokenizer.json does (Digits(individual_digits) before ByteLevel); transformers' GGUF loader, which
  // has no entry for "smollm", would give "2024" as fewer tokens (trial 28). The reference fixture
  // applies the same pipeline through `tokenizers` (tests/fixtures/gguf_pre.py), so the comparisons
  // above check the rest; this checks the digits on their own.
  EXPECT_EQ(g.get_string("tokenizer.ggml.pre"), "smollm");
  const json tj = read_json(out / "tokenizer.json");
  EXPECT_EQ(tj["pre_tokenizer"]["pretokenizers"][0], (json{{"type", "Digits"}, {"individual_digits", true}}));
  const qlora::data::Tokenizer t = qlora::data::Tokenizer::from_pretrained(out.string());
  const std::string text = "In 2024, 15 apples cost $3.50 (about 1,000 yen).";
  std::string digits_seen;
  for (int32_t id : t.encode(text)) {
    const std::string piece = t.decode({id});
    int digits = 0;
    for (char c : piece) digits += (c >= '0' && c <= '9');
    EXPECT_LE(digits, 1) << "token " << id << " '" << piece << "' holds several digits";
    for (char c : piece)
      if (c >= '0' && c <= '9') digits_seen += c;
  }
  EXPECT_EQ(digits_seen, "2024153501000");
  EXPECT_EQ(t.decode(t.encode(text)), text);
  qlora::remove_tree(dir);
}

// A tiny random Qwen2 written by gguf-py (Q8_0, Q4_K, Q6_K, Q5_0, Q4_1, Q5_1, Q4_0, BF16, F16, F32
// tensors; biases; untied lm_head; pre-tokenizer "qwen2"; add_bos_token; a user-defined token).
TEST(ImportGguf, TinyQwen2EqualsTransformersGgufLoad) {
  QLORA_REQUIRE_FIXTURE(gguf, "gguf/qwen2_tiny/model.gguf");
  const fs::path dir = qlora::test::fresh_temp_dir("import_qwen2_fp32");
  const fs::path out = dir / "qwen2";
  const auto r = qlora::import_gguf({gguf.string(), out.string(), "fp32"});
  EXPECT_EQ(r.architecture, "qwen2");
  EXPECT_FALSE(r.tied_embeddings);
  EXPECT_EQ(expect_matches_transformers(out, gguf.parent_path()), 27u);
  const json cfg = read_json(out / "config.json");
  EXPECT_EQ(cfg["architectures"], json::array({"Qwen2ForCausalLM"}));
  const json tc = read_json(out / "tokenizer_config.json");
  EXPECT_EQ(tc["add_bos_token"], true);
  EXPECT_EQ(tc["bos_token"], "<|im_start|>");
  EXPECT_EQ(tc["pad_token"], "<|endoftext|>");
  EXPECT_TRUE(tc["unk_token"].is_null());
  qlora::remove_tree(dir);
}

// A tiny random Llama with the Llama 2 sentencepiece vocabulary of ../shared as llama.cpp's
// converter writes it (tokenizer.ggml.model "llama": tokens, scores, token types; no merges, no
// add_bos_token key; "model" and "▁token" retyped as control tokens and "ada" as user-defined, as
// Mistral v0.3's [INST] are control tokens inside the vocabulary), as Ollama keeps Llama 2 /
// Mistral files: the merges transformers derives from the scores, LlamaTokenizer's pipeline, BOS by
// default; our tokenizer on the imported dir gives transformers' ids on the fixture corpus (120 of
// its 300 strings contain a retyped token, so the added-token split is exercised).
TEST(ImportGguf, TinyLlamaSentencepieceEqualsTransformersGgufLoad) {
  QLORA_REQUIRE_FIXTURE(gguf, "gguf/llama_spm_tiny/model.gguf");
  const fs::path dir = qlora::test::fresh_temp_dir("import_llama_spm_fp32");
  const fs::path out = dir / "llama";
  const auto r = qlora::import_gguf({gguf.string(), out.string(), "fp32"});
  EXPECT_EQ(r.architecture, "llama");
  EXPECT_FALSE(r.tied_embeddings);
  EXPECT_EQ(expect_matches_transformers(out, gguf.parent_path()), 21u);
  const json tok = read_json(out / "tokenizer.json");
  EXPECT_EQ(tok["model"]["merges"].size(), 61249u);  // derived from the scores (the file has none)
  const json tc = read_json(out / "tokenizer_config.json");
  EXPECT_EQ(tc["tokenizer_class"], "LlamaTokenizer");
  EXPECT_EQ(tc["legacy"], false);
  EXPECT_EQ(tc["add_bos_token"], true);
  EXPECT_EQ(tc["bos_token"], "<s>");
  EXPECT_EQ(tc["eos_token"], "</s>");
  EXPECT_EQ(tc["unk_token"], "<unk>");
  EXPECT_EQ(expect_our_tokenizer_matches_corpus(out, gguf.parent_path()), 300u);
  qlora::remove_tree(dir);
}

// A tiny random Qwen3 as llama.cpp writes one (Ollama's qwen3:0.6b.. files): head_dim 128 from
// qwen3.attention.key_length with hidden 256 / 4 heads (q_proj 512 x 256), q/k norms, no biases,
// tied, K-quants, Qwen's special tokens and Qwen3's chat template. Everything equal to transformers'
// GGUF load; our tokenizer's ids on the corpus; `data.template: auto` finds qwen3; and the CLI
// imports it from a path without the .gguf extension, as Ollama keeps its blobs.
TEST(ImportGguf, TinyQwen3EqualsTransformersGgufLoad) {
  QLORA_REQUIRE_FIXTURE(gguf, "gguf/qwen3_tiny/model.gguf");
  const fs::path dir = qlora::test::fresh_temp_dir("import_qwen3_fp32");
  const fs::path out = dir / "qwen3";
  const auto r = qlora::import_gguf({gguf.string(), out.string(), "fp32"});
  EXPECT_EQ(r.architecture, "qwen3");
  EXPECT_TRUE(r.tied_embeddings);
  EXPECT_EQ(expect_matches_transformers(out, gguf.parent_path()), 24u);
  const json cfg = read_json(out / "config.json");
  EXPECT_EQ(cfg["architectures"], json::array({"Qwen3ForCausalLM"}));
  EXPECT_EQ(cfg["head_dim"], 128);
  EXPECT_EQ(cfg["hidden_size"], 256);
  EXPECT_EQ(cfg["num_attention_heads"], 4);
  EXPECT_EQ(cfg["tie_word_embeddings"], true);
  qlora::st::SafetensorsFile st((out / "model.safetensors").string());
  EXPECT_EQ(st.info("model.layers.1.self_attn.q_proj.weight").shape, (std::vector<int64_t>{512, 256}));
  EXPECT_EQ(st.info("model.layers.1.self_attn.k_norm.weight").shape, (std::vector<int64_t>{128}));
  const json tc = read_json(out / "tokenizer_config.json");
  EXPECT_EQ(tc["add_bos_token"], false);
  EXPECT_EQ(tc["bos_token"], "<|endoftext|>");
  EXPECT_EQ(tc["eos_token"], "<|im_end|>");
  EXPECT_EQ(tc["pad_token"], "<|endoftext|>");
  EXPECT_EQ(expect_our_tokenizer_matches_corpus(out, gguf.parent_path()), 300u);
  EXPECT_EQ(qlora::data::resolve_template("auto", out.string()), "qwen3");

  const fs::path blob = dir / ("sha256-" + std::string(64, 'a'));
  fs::copy_file(gguf, blob);
  const CliRun cli = run_cli({"import-gguf", blob.string(), "--out", (dir / "from_blob").string()}, dir / "log");
  EXPECT_EQ(cli.status, 0) << cli.out;
  EXPECT_NE(cli.out.find("imported " + blob.string() + " (qwen3, 24 tensors, " + std::to_string(r.parameters) +
                         " parameters, tied embeddings; stored as "),
            std::string::npos)
      << cli.out;
  // The summary once: the CLI prints the result; the library logs no second copy of it.
  EXPECT_EQ(cli.out.find("(qwen3, 24 tensors"), cli.out.rfind("(qwen3, 24 tensors")) << cli.out;
  EXPECT_TRUE(fs::exists(dir / "from_blob" / "model.safetensors"));
  qlora::remove_tree(dir);
}

// A tiny random Llama 3.1-style GGUF (make_gguf_refs.py make_tiny_llama31_rope): llama3 RoPE scaling
// as llama.cpp writes it, the tensor rope_freqs.weight (F32 [8]: 1 x5, 1.1033, 6.0604, 8 for factor 8,
// rope_theta 12000, head_dim 16) and no rope_scaling key. The reference is the original HF model:
// its config.json (llama3 rope_parameters, max_position_embeddings = the file's 131072) field by
// field, the GGUF-loaded tensors bit for bit (rope_freqs.weight is not a weight), tokenizer.json;
// and transformers loading the imported dir gives that model's logits of a 149-token prompt within
// 1e-4 (gguf_import_check.py), which transformers' own GGUF load (default RoPE) misses by 0.69.
// The same file with one smooth factor x 1.1 (llama31_rope_bad) is refused in one line naming the
// tensor, by the library and by the CLI (exit 1), nothing left in --out.
TEST(ImportGguf, TinyLlama31RopeFreqsEqualsOriginalHfModel) {
  QLORA_REQUIRE_FIXTURE(gguf, "gguf/llama31_rope_tiny/model.gguf");
  QLORA_REQUIRE_FIXTURE(bad, "gguf/llama31_rope_bad/model.gguf");
  const fs::path dir = qlora::test::fresh_temp_dir("import_llama31_rope");
  const fs::path out = dir / "llama31";
  const auto r = qlora::import_gguf({gguf.string(), out.string(), "fp32"});
  EXPECT_EQ(r.architecture, "llama");
  EXPECT_TRUE(r.tied_embeddings);
  EXPECT_EQ(r.tensors, 20);
  EXPECT_EQ(expect_matches_transformers(out, gguf.parent_path()), 20u);
  const json cfg = read_json(out / "config.json");
  EXPECT_EQ(cfg["rope_parameters"], (json{{"rope_type", "llama3"}, {"rope_theta", 12000.0}, {"factor", 8.0},
                                          {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                                          {"original_max_position_embeddings", 8192}}));
  EXPECT_EQ(cfg["max_position_embeddings"], 131072);
  EXPECT_EQ(cfg["head_dim"], 16);
  // and the keys of Meta's Llama 3.1 config.json (transformers 4), which GGUF converters read
  EXPECT_EQ(cfg["rope_theta"], 12000.0);
  EXPECT_EQ(cfg["rope_scaling"], (json{{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                       {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}}));

  const std::string want = "tensor 'rope_freqs.weight': element 6 is 6.66639 where llama 3 RoPE scaling";
  qlora::test::expect_file_error(bad.string(), want, "llama31_rope_bad",
                                 [&] { qlora::import_gguf({bad.string(), (dir / "bad").string(), "fp32"}); });
  const CliRun cli = run_cli({"import-gguf", bad.string(), "--out", (dir / "bad").string()}, dir / "log");
  EXPECT_EQ(cli.status, 1);
  EXPECT_EQ(cli.out.rfind("error: " + bad.string() + ": " + want, 0), 0u) << cli.out;
  EXPECT_NE(cli.out.find("gives 6.06035; this file's RoPE cannot be written as a config.json"), std::string::npos)
      << cli.out;
  EXPECT_EQ(std::count(cli.out.begin(), cli.out.end(), '\n'), 1) << cli.out;
  EXPECT_FALSE(fs::exists(dir / "bad"));
  qlora::remove_tree(dir);
}

// Hand-built rope_freqs.weight on the tiny llama (head_dim 4, so 2 factors): F16 [1, 8] with
// rope_theta 1e7 (wavelengths 6.3 and 19869: factor 1, then the factor) is llama3 with factor 8,
// within F16's rounding; all ones is no scaling (rope_type default).
TEST(ImportGguf, TinyLlamaRopeFreqsF16AndAllOnes) {
  const fs::path dir = qlora::test::fresh_temp_dir("import_tiny_rope_freqs");
  struct Variant {
    const char* name;
    float theta;
    std::string f16;  // two F16 values
    json rope;
  };
  using qlora::test::GgufBuilder;
  const std::string one = GgufBuilder::pod<uint16_t>(0x3C00), eight = GgufBuilder::pod<uint16_t>(0x4800);
  for (const Variant& v : std::vector<Variant>{
           {"llama3_f16", 1e7f, one + eight,
            {{"rope_type", "llama3"}, {"rope_theta", 1e7}, {"factor", 8.0}, {"low_freq_factor", 1.0},
             {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}}},
           {"all_ones", 10000.f, one + one, {{"rope_type", "default"}, {"rope_theta", 10000.0}}}}) {
    qlora::test::GgufBuilder b = qlora::test::tiny_llama_gguf(true, "llama", {"llama.rope.freq_base"});
    b.f32("llama.rope.freq_base", v.theta);
    b.tensor("rope_freqs.weight", {2}, 1, v.f16);
    const fs::path p = dir / (std::string(v.name) + ".gguf");
    std::ofstream(p, std::ios::binary) << b.bytes();
    const fs::path out = dir / v.name;
    const auto r = qlora::import_gguf({p.string(), out.string(), "fp32"});
    EXPECT_EQ(r.tensors, 2 + 2 * 9) << v.name;  // rope_freqs.weight is not written
    EXPECT_EQ(read_json(out / "config.json")["rope_parameters"], v.rope) << v.name;
  }
  qlora::remove_tree(dir);
}

// The rope_freqs.weight of Meta's releases (rope_theta 500000, head_dim 128; factor 8 for Llama 3.1 /
// 3.3, 32 for 3.2: 29 ones, 6 smooth factors, 29 factors), as make_gguf_refs.py's reimplementation of
// llama.cpp's converter computes them (torch float32, rope_freqs.json), in a hand-built one-layer
// llama (hidden 128, 1 head): recognised as llama3 with that factor.
TEST(ImportGguf, RopeFreqsOfMetaLlama3ReleasesAreLlama3) {
  QLORA_REQUIRE_FIXTURE(vectors, "gguf/llama31_rope_tiny/rope_freqs.json");
  const json meta = read_json(vectors)["meta"];
  const fs::path dir = qlora::test::fresh_temp_dir("import_meta_rope_freqs");
  for (const int factor : {8, 32}) {
    const auto v = meta["factor_" + std::to_string(factor)].get<std::vector<float>>();
    ASSERT_EQ(v.size(), 64u);
    std::set<std::string> omit = {"llama.embedding_length", "llama.block_count", "llama.feed_forward_length",
                                  "llama.attention.head_count", "llama.attention.head_count_kv",
                                  "llama.rope.freq_base", "token_embd.weight", "output_norm.weight"};
    for (const char* l : {"blk.0.", "blk.1."})
      for (const char* t : {"attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                            "ffn_down"})
        omit.insert(std::string(l) + t + ".weight");
    qlora::test::GgufBuilder b = qlora::test::tiny_llama_gguf(true, "llama", omit);
    b.u32("llama.embedding_length", 128);
    b.u32("llama.block_count", 1);
    b.u32("llama.feed_forward_length", 8);
    b.u32("llama.attention.head_count", 1);
    b.u32("llama.attention.head_count_kv", 1);
    b.u32("llama.rope.dimension_count", 128);
    b.f32("llama.rope.freq_base", meta["rope_theta"].get<float>());
    auto zeros = [&](const std::string& name, std::vector<uint64_t> ne) {
      b.tensor_f32(name, ne, std::vector<float>(ne.size() == 1 ? ne[0] : ne[0] * ne[1], 0.f));
    };
    zeros("token_embd.weight", {128, 12});
    zeros("output_norm.weight", {128});
    for (const char* t : {"attn_norm", "ffn_norm"}) zeros(std::string("blk.0.") + t + ".weight", {128});
    for (const char* t : {"attn_q", "attn_k", "attn_v", "attn_output"})
      zeros(std::string("blk.0.") + t + ".weight", {128, 128});
    zeros("blk.0.ffn_gate.weight", {128, 8});
    zeros("blk.0.ffn_up.weight", {128, 8});
    zeros("blk.0.ffn_down.weight", {8, 128});
    b.tensor_f32("rope_freqs.weight", {64}, v);
    const fs::path p = dir / ("meta" + std::to_string(factor) + ".gguf");
    std::ofstream(p, std::ios::binary) << b.bytes();
    const fs::path out = dir / ("meta" + std::to_string(factor));
    qlora::import_gguf({p.string(), out.string(), "fp32"});
    const json cfg = read_json(out / "config.json");
    EXPECT_EQ(cfg["rope_parameters"], (json{{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", factor},
                                            {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                                            {"original_max_position_embeddings", 8192}}))
        << "factor " << factor;
    EXPECT_EQ(cfg["head_dim"], 128);
  }
  qlora::remove_tree(dir);
}

TEST(ImportGguf, SmolLM2Bf16StreamsWithBoundedPeakRss) {
  REQUIRE_SMOLLM2(gguf);
  QLORA_REQUIRE_FIXTURE(subset, "gguf/smollm2/subset.safetensors");
  const fs::path dir = qlora::test::fresh_temp_dir("import_smollm2_bf16");
  // Reset this process's peak RSS to its current RSS (Linux clear_refs "5"), then import.
  {
    std::ofstream cr("/proc/self/clear_refs");
    cr << "5";
  }
  const int64_t before = qlora::rss_bytes();  // VmRSS / VmHWM of /proc/self/status
  ASSERT_GT(before, 0) << "no VmRSS in /proc/self/status";
  ASSERT_LE(qlora::peak_rss_bytes() - before, 1024 * 1024) << "clear_refs did not reset VmHWM";
  const auto r = qlora::import_gguf({gguf, (dir / "smollm2").string(), "bf16"});
  const int64_t peak = qlora::peak_rss_bytes();
  // Largest tensor: token_embd 49152 x 576: 113 MB as fp32 (+ its 30 MB of Q8_0 blocks and 57 MB
  // as bf16). Holding all 134.5M parameters at once would take 538 MB (fp32) or 269 MB (bf16).
  const double largest_f32_mb = 49152.0 * 576 * 4 / 1e6;
  const double delta_mb = static_cast<double>(peak - before) / 1e6;
  std::cout << "import-gguf SmolLM2 bf16: " << r.seconds << " s; peak RSS above the start: " << delta_mb
            << " MB (largest tensor as fp32: " << largest_f32_mb << " MB; model as bf16: "
            << r.safetensors_bytes / 1e6 << " MB)\n";
  EXPECT_GT(delta_mb, largest_f32_mb);           // the measurement sees the largest buffer
  EXPECT_LT(delta_mb, 2.0 * largest_f32_mb);     // 226 MB: one tensor's buffers, not the model
  EXPECT_LT(delta_mb, r.safetensors_bytes / 1e6);

  // bf16 = round-to-nearest-even of the exact float32 values.
  qlora::st::SafetensorsFile st((dir / "smollm2" / "model.safetensors").string());
  qlora::st::SafetensorsFile sub(subset.string());
  EXPECT_EQ(read_json(dir / "smollm2" / "config.json")["dtype"], "bfloat16");
  for (const auto& t : sub.tensors()) {
    const auto& o = st.info(t.name);
    ASSERT_EQ(o.dtype, qlora::st::DType::BF16);
    const float* want = reinterpret_cast<const float*>(sub.data(t));
    const uint16_t* got = reinterpret_cast<const uint16_t*>(st.data(o));
    int64_t bad = 0;
    for (int64_t i = 0; i < t.numel(); ++i) bad += got[i] != qlora::kernels::float_to_bf16(want[i]);
    EXPECT_EQ(bad, 0) << t.name;
  }
  qlora::remove_tree(dir);
}

TEST(ImportGguf, CliRefusesBadInputWithOneLineAndExit1) {
  const fs::path dir = qlora::test::fresh_temp_dir("import_cli_bad");
  const fs::path bad = dir / "bad.gguf";
  std::string bytes = qlora::test::tiny_llama_gguf().bytes();
  bytes.resize(bytes.size() / 2);
  std::ofstream(bad, std::ios::binary) << bytes;
  const CliRun r = run_cli({"import-gguf", bad.string(), "--out", (dir / "out").string()}, dir / "log");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out.rfind("error: " + bad.string() + ": ", 0), 0u) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_FALSE(fs::exists(dir / "out"));
  // --out exists and is not empty: refused, untouched.
  fs::create_directories(dir / "full");
  std::ofstream(dir / "full" / "keep.txt") << "x";
  std::ofstream(dir / "ok.gguf", std::ios::binary) << qlora::test::tiny_llama_gguf().bytes();
  const CliRun r2 = run_cli({"import-gguf", (dir / "ok.gguf").string(), "--out", (dir / "full").string()}, dir / "log2");
  EXPECT_EQ(r2.status, 1);
  EXPECT_NE(r2.out.find("exists and is not an empty directory"), std::string::npos) << r2.out;
  EXPECT_TRUE(fs::exists(dir / "full" / "keep.txt"));
  // A good file: exit 0 and the summary line.
  const CliRun ok = run_cli({"import-gguf", (dir / "ok.gguf").string(), "--out", (dir / "out").string(), "--dtype", "fp32"},
                            dir / "log3");
  EXPECT_EQ(ok.status, 0) << ok.out;
  EXPECT_NE(ok.out.find("imported " + (dir / "ok.gguf").string() +
                        " (llama, 20 tensors, 1288 parameters, tied embeddings; stored as F32 x20) into"),
            std::string::npos) << ok.out;
  EXPECT_TRUE(fs::exists(dir / "out" / "model.safetensors"));
  qlora::remove_tree(dir);
}

// GGUFs that are not models, written by gguf-py as llama.cpp's converters write them
// (make_gguf_refs.py make_not_models): a LoRA adapter (general.type "adapter") is refused in one
// line saying so and what to give instead, not "metadata key 'llama.embedding_length': missing";
// a vocab-only file (general.type "model", no tensors) is refused as having no tensors. Both from
// the library and the CLI (exit 1), nothing left in --out.
// A GGUF where a Hugging Face model directory is needed (trial 15: an Ollama user points every
// command at the blob): each command says it is a GGUF and how to import it, by the file's magic
// (an Ollama blob has no extension), also for a directory holding only a GGUF; exit 1, one line.
TEST(ImportGguf, AGgufGivenAsAModelDirSaysImportIt) {
  const fs::path dir = qlora::test::fresh_temp_dir("gguf_as_model_dir");
  const fs::path blob = dir / ("sha256-" + std::string(64, 'b'));
  std::ofstream(blob, std::ios::binary) << qlora::test::tiny_llama_gguf().bytes();
  fs::create_directories(dir / "repo");
  fs::copy_file(blob, dir / "repo" / "model-Q4_K_M.gguf");
  const std::string is_gguf = blob.string() + " is a GGUF file (llama.cpp / Ollama), not a Hugging Face model "
                                              "directory: import it first: qlora import-gguf " + blob.string() + " --out DIR";
  const std::string cfg = (qlora::test::source_dir() / "configs/smollm2/135m_qlora.yaml").string();
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"generate", blob.string(), "--prompt", "hi"}, "error: " + is_gguf},
      {{"inspect", blob.string()}, "error: " + is_gguf},
      {{"tokenize", blob.string(), "--text", "hi"}, "error: " + is_gguf},
      {{"merge", "--base", blob.string(), "--adapter", (dir / "none").string(), "--out", (dir / "m").string()},
       "error: " + is_gguf},
      // (data.train set to a file that exists: the shipped config's own would be named too)
      {{"data", "preview", cfg, "--set", "model.path=" + blob.string(), "--set", "data.train=" + cfg},
       "model.path: " + is_gguf},
      {{"inspect", (dir / "repo").string()},
       "error: " + (dir / "repo" / "config.json").string() + ": not found (an HF model directory needs config.json); "
       "it holds the GGUF file model-Q4_K_M.gguf: import it first: qlora import-gguf " +
           (dir / "repo" / "model-Q4_K_M.gguf").string() + " --out DIR"},
  };
  for (const auto& [args, want] : cases) {
    const CliRun r = run_cli(args, dir / "log");
    EXPECT_EQ(r.status, 1) << args[0] << ": " << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << args[0] << ": " << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    EXPECT_FALSE(fs::exists(dir / "m"));
  }
  qlora::remove_tree(dir);
}

// What a broken download looks like, named so: a file cut short, a web page or a pre-GGUF file saved
// as .gguf (the bytes found), one part of a split GGUF (gguf-py's split.count / split.no keys, as
// llama-gguf-split and convert_hf_to_gguf.py --split-max-tensors write them) (trial 15).
TEST(ImportGguf, CutShortWebPageOldFormatAndSplitPartsAreNamed) {
  const fs::path dir = qlora::test::fresh_temp_dir("gguf_downloads");
  std::string bytes = qlora::test::tiny_llama_gguf().bytes();
  auto error_of = [&](const std::string& name, const std::string& content) {
    const fs::path p = dir / name;
    std::ofstream(p, std::ios::binary) << content;
    try {
      qlora::import_gguf({p.string(), (dir / "out").string(), "fp32"});
    } catch (const qlora::Error& e) {
      EXPECT_FALSE(fs::exists(dir / "out"));
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string cut = error_of("cut.gguf", bytes.substr(0, bytes.size() - 100));
  EXPECT_NE(cut.find("runs past the end of the data section"), std::string::npos) << cut;
  EXPECT_NE(cut.find("; the file is cut short (an interrupted download?): fetch it again"), std::string::npos) << cut;
  const std::string head = error_of("head.gguf", bytes.substr(0, 40));
  EXPECT_NE(head.find("the file is cut short"), std::string::npos) << head;
  EXPECT_EQ(error_of("page.gguf", "<!DOCTYPE html><html>sign in</html>"),
            (dir / "page.gguf").string() + ": not a GGUF file: bad magic \"<!DO\" (expected \"GGUF\"): an HTML page (a "
                                           "download that saved a web page, e.g. a login or error page?)");
  EXPECT_EQ(error_of("old.bin", std::string("tjgg\x03\x00\x00\x00", 8)),
            (dir / "old.bin").string() + ": not a GGUF file: bad magic \"tjgg\" (expected \"GGUF\"): a pre-GGUF llama.cpp "
                                         "file (GGML / GGJT), which current llama.cpp no longer reads either; get the "
                                         "model's GGUF");
  EXPECT_EQ(error_of("bin.gguf", std::string("\x01\x02\x03\x04rest", 8)),
            (dir / "bin.gguf").string() + ": not a GGUF file: bad magic \"\\x01\\x02\\x03\\x04\" (expected \"GGUF\")");
  qlora::test::GgufBuilder split = qlora::test::tiny_llama_gguf();
  split.u16("split.no", 0);
  split.u16("split.count", 3);
  split.u16("split.tensors.count", 60);
  EXPECT_EQ(error_of("m-00001-of-00003.gguf", split.bytes()),
            (dir / "m-00001-of-00003.gguf").string() +
                ": metadata key 'split.count': 3: this is part 1 of 3 of a split GGUF; merge the parts into one file "
                "first (llama-gguf-split --merge FIRST_PART OUT.gguf, FIRST_PART the one named ...-00001-of-00003.gguf) "
                "and import that");
  qlora::remove_tree(dir);
}

TEST(ImportGguf, NotAModelGgufRefusedByItsType) {
  QLORA_REQUIRE_FIXTURE(adapter, "gguf/lora_adapter.gguf");
  QLORA_REQUIRE_FIXTURE(vocab_only, "gguf/vocab_only.gguf");
  const fs::path dir = qlora::test::fresh_temp_dir("import_not_model");
  const std::vector<std::pair<fs::path, std::string>> cases = {
      {adapter, ": metadata key 'general.type': 'adapter': this is a LoRA adapter GGUF (adapter.type 'lora'), not a "
                "model; import-gguf needs the base model's GGUF (converting adapter GGUFs is not supported)"},
      {vocab_only, ": the file has no tensors (a vocab-only GGUF?); import-gguf needs a model GGUF with its weights"}};
  for (const auto& [path, want] : cases) {
    try {
      qlora::import_gguf({path.string(), (dir / "out").string(), "fp32"});
      ADD_FAILURE() << path << ": accepted";
    } catch (const qlora::Error& e) {
      EXPECT_EQ(std::string(e.what()), path.string() + want);
    }
    const CliRun r = run_cli({"import-gguf", path.string(), "--out", (dir / "out").string()}, dir / "log");
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_EQ(r.out, "error: " + path.string() + want + "\n");
    EXPECT_FALSE(fs::exists(dir / "out"));
  }
  qlora::remove_tree(dir);
}

// Tiny llama: the permutation moves rows as llama.cpp's permute inverse; tied; tokenizer variant
// with a pre-tokenizer regex (tokenizer.ggml.pre = qwen2) and control tokens.
TEST(ImportGguf, TinyLlamaPermutationAndTokenizer) {
  const fs::path dir = qlora::test::fresh_temp_dir("import_tiny");
  const fs::path p = dir / "tiny.gguf";
  std::ofstream(p, std::ios::binary) << qlora::test::tiny_llama_gguf(false).bytes();
  const auto r = qlora::import_gguf({p.string(), (dir / "out").string(), "fp32"});
  EXPECT_FALSE(r.tied_embeddings);
  qlora::gguf::GgufFile g(p.string());
  qlora::st::SafetensorsFile st((dir / "out" / "model.safetensors").string());
  EXPECT_TRUE(st.contains("lm_head.weight"));
  // llama.cpp: w.reshape(heads, 2, d, cols).swapaxes(1, 2) -> GGUF row h*2d + 2i + s holds HF
  // row h*2d + s*d + i. Check it row by row for q (2 heads) and k (1 head), head_dim 4 (d = 2).
  for (const auto& [gn, hn, heads] : std::vector<std::tuple<std::string, std::string, int>>{
           {"blk.1.attn_q.weight", "model.layers.1.self_attn.q_proj.weight", 2},
           {"blk.1.attn_k.weight", "model.layers.1.self_attn.k_proj.weight", 1}}) {
    const auto* gt = g.find_tensor(gn);
    const float* src = reinterpret_cast<const float*>(g.data(*gt));
    const float* dst = reinterpret_cast<const float*>(st.data(st.info(hn)));
    const int64_t cols = 8, d = 2;
    for (int h = 0; h < heads; ++h)
      for (int s = 0; s < 2; ++s)
        for (int i = 0; i < d; ++i)
          EXPECT_EQ(std::memcmp(dst + ((h * 2 + s) * d + i) * cols, src + ((h * d + i) * 2 + s) * cols, cols * 4), 0)
              << hn << " head " << h << " s " << s << " i " << i;
  }
  const json tok = read_json(dir / "out" / "tokenizer.json");
  EXPECT_EQ(tok["pre_tokenizer"]["type"], "Sequence");
  EXPECT_EQ(tok["pre_tokenizer"]["pretokenizers"][0]["type"], "Split");
  EXPECT_EQ(tok["added_tokens"].size(), 2u);
  EXPECT_EQ(tok["added_tokens"][1]["content"], "<|im_end|>");
  EXPECT_EQ(tok["model"]["merges"][1], json::array({"\xc4\xa0", "a"}));
  const json cfg = read_json(dir / "out" / "config.json");
  EXPECT_EQ(cfg["tie_word_embeddings"], false);
  EXPECT_FALSE(cfg.contains("head_dim"));  // no rope.dimension_count in this file
  qlora::remove_tree(dir);
}

// Tiny qwen2: biases mapped, no permutation, Qwen2 architecture in config.json.
TEST(ImportGguf, TinyQwen2BiasesNoPermutation) {
  const fs::path dir = qlora::test::fresh_temp_dir("import_tiny_qwen2");
  const fs::path p = dir / "tiny.gguf";
  std::ofstream(p, std::ios::binary) << qlora::test::tiny_llama_gguf(true, "qwen2").bytes();
  const auto r = qlora::import_gguf({p.string(), (dir / "out").string(), "fp32"});
  EXPECT_EQ(r.tensors, 2 + 2 * 12);
  qlora::gguf::GgufFile g(p.string());
  qlora::st::SafetensorsFile st((dir / "out" / "model.safetensors").string());
  for (const auto& [gn, hn] : std::vector<std::pair<std::string, std::string>>{
           {"blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"},
           {"blk.0.attn_k.bias", "model.layers.0.self_attn.k_proj.bias"}}) {
    const auto* gt = g.find_tensor(gn);
    ASSERT_TRUE(st.contains(hn)) << hn;
    EXPECT_EQ(std::memcmp(st.data(st.info(hn)), g.data(*gt), gt->nbytes), 0) << hn;
  }
  const json cfg = read_json(dir / "out" / "config.json");
  EXPECT_EQ(cfg["architectures"], json::array({"Qwen2ForCausalLM"}));
  EXPECT_EQ(cfg["model_type"], "qwen2");
  qlora::remove_tree(dir);
}

// Tiny qwen3: q/k norms mapped, no biases, no permutation, head_dim from attention.key_length.
TEST(ImportGguf, TinyQwen3QkNormsNoPermutation) {
  const fs::path dir = qlora::test::fresh_temp_dir("import_tiny_qwen3");
  const fs::path p = dir / "tiny.gguf";
  std::ofstream(p, std::ios::binary) << qlora::test::tiny_llama_gguf(true, "qwen3").bytes();
  const auto r = qlora::import_gguf({p.string(), (dir / "out").string(), "fp32"});
  EXPECT_EQ(r.tensors, 2 + 2 * 11);
  EXPECT_TRUE(r.tied_embeddings);
  qlora::gguf::GgufFile g(p.string());
  qlora::st::SafetensorsFile st((dir / "out" / "model.safetensors").string());
  for (const auto& [gn, hn] : std::vector<std::pair<std::string, std::string>>{
           {"blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"},
           {"blk.1.attn_k.weight", "model.layers.1.self_attn.k_proj.weight"},
           {"blk.0.attn_q_norm.weight", "model.layers.0.self_attn.q_norm.weight"},
           {"blk.1.attn_k_norm.weight", "model.layers.1.self_attn.k_norm.weight"}}) {
    const auto* gt = g.find_tensor(gn);
    ASSERT_TRUE(st.contains(hn)) << hn;
    EXPECT_EQ(std::memcmp(st.data(st.info(hn)), g.data(*gt), gt->nbytes), 0) << hn;
  }
  EXPECT_FALSE(st.contains("model.layers.0.self_attn.q_proj.bias"));
  const json cfg = read_json(dir / "out" / "config.json");
  EXPECT_EQ(cfg["architectures"], json::array({"Qwen3ForCausalLM"}));
  EXPECT_EQ(cfg["model_type"], "qwen3");
  EXPECT_EQ(cfg["head_dim"], 4);
  EXPECT_EQ(cfg["attention_bias"], false);
  qlora::remove_tree(dir);
}

}  // namespace
