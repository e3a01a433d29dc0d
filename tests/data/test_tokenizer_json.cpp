// HF tokenizer.json parity with the Rust `tokenizers` library (reference: tests/fixtures/
// make_tokenizer_refs.py): for each fixture tokenizer and each of the >= 2,000 corpus strings,
// encode without / with special tokens and decode (skip_special_tokens true / false) of the
// reference ids must be identical. Plus: Llama 2 tokenizer.json == our sentencepiece path, offsets,
// precedence of tokenizer.json over tokenizer.model, special ids and the eos list.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/error.h"
#include "data/tokenizer.h"
#include "tests/test_util.h"

using qlora::data::TokenIds;
using qlora::data::Tokenizer;
namespace fs = std::filesystem;

namespace {

struct Case {
  std::string kind, text;  // text: raw bytes (invalid UTF-8 cases from hex)
};

std::vector<Case> load_corpus(const fs::path& p) {
  const auto j = nlohmann::json::parse(std::ifstream(p));
  std::vector<Case> out;
  for (const auto& c : j["cases"]) {
    Case k;
    k.kind = c["kind"];
    if (c.contains("hex")) {
      const std::string h = c["hex"];
      for (size_t i = 0; i + 1 < h.size(); i += 2) k.text += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
    } else {
      k.text = c["text"];
    }
    out.push_back(std::move(k));
  }
  return out;
}

std::string show(const std::string& s) { return s.size() > 80 ? s.substr(0, 80) + "..." : s; }

struct Side {
  const char* what;    // "tokenizers" (the file) / "AutoTokenizer" (the dir)
  const char* prefix;  // refs key prefix whose values override the plain ones ("" / "auto_")
};

// Encodes and decodes every corpus string with `tok` and compares with the refs of one side: the
// plain keys, overridden by `side.prefix` keys where the fixture script wrote them. Every mismatch
// is counted (first 5 in detail).
void compare(const std::string& name, const Tokenizer& tok, const nlohmann::json& refs,
             const std::vector<Case>& corpus, const Side& side, bool decode) {
  int bad_enc = 0, bad_sp = 0, bad_dec = 0, bad_skip = 0, shown = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const auto& r = refs["cases"][i];
    auto ref = [&](const std::string& key) { return r.value(side.prefix + key, r[key]); };
    const std::string& text = corpus[i].text;
    const TokenIds want = ref("ids").get<TokenIds>(), want_sp = ref("ids_special").get<TokenIds>();
    const TokenIds got = tok.encode(text), got_sp = tok.encode_with_special_tokens(text);
    const std::string dec = decode ? tok.decode(want_sp, false) : "", dec_skip = decode ? tok.decode(want_sp, true) : "";
    const bool e1 = got != want, e2 = got_sp != want_sp, e3 = decode && dec != ref("decode").get<std::string>(),
               e4 = decode && dec_skip != ref("decode_skip").get<std::string>();
    bad_enc += e1;
    bad_sp += e2;
    bad_dec += e3;
    bad_skip += e4;
    if ((e1 || e2 || e3 || e4) && shown++ < 5) {
      ADD_FAILURE() << name << " vs " << side.what << ", case " << i << " (" << corpus[i].kind << ") '" << show(text)
                    << "': encode " << (e1 ? "DIFFERS" : "ok") << ", encode+special " << (e2 ? "DIFFERS" : "ok")
                    << ", decode " << (e3 ? "DIFFERS got '" + show(dec) + "'" : "ok") << ", decode skip "
                    << (e4 ? "DIFFERS got '" + show(dec_skip) + "'" : "ok");
    }
  }
  EXPECT_EQ(bad_enc, 0) << name << " vs " << side.what;
  EXPECT_EQ(bad_sp, 0) << name << " vs " << side.what;
  EXPECT_EQ(bad_dec, 0) << name << " vs " << side.what;
  EXPECT_EQ(bad_skip, 0) << name << " vs " << side.what;
}

// Two contracts per fixture dir: Tokenizer(<dir>/tokenizer.json) = the Rust `tokenizers` library on
// the file; Tokenizer::from_pretrained(<dir>) = transformers 5 AutoTokenizer.from_pretrained(<dir>)
// (which differs for a LlamaTokenizer config, tokenizer.h). Returns the number of strings checked
// and the number where the two references differ.
void check_parity(const std::string& name, size_t* checked, int* auto_differs) {
  const fs::path dir = qlora::test::fixtures_dir() / "tokenizers" / name;
  const fs::path refs_path = qlora::test::fixtures_dir() / "tokenizers" / (name + "_refs.json");
  const fs::path corpus_path = qlora::test::fixtures_dir() / "tokenizers" / "corpus.json";
  ASSERT_TRUE(fs::exists(refs_path) && fs::exists(corpus_path) && fs::exists(dir / "tokenizer.json"))
      << "missing fixture " << refs_path << " (made by tests/fixtures/make_tokenizer_refs.py; run scripts/test.sh)";
  const auto corpus = load_corpus(corpus_path);
  const auto refs = nlohmann::json::parse(std::ifstream(refs_path));
  ASSERT_EQ(refs["cases"].size(), corpus.size());
  const Tokenizer file((dir / "tokenizer.json").string()), auto_tok = Tokenizer::from_pretrained(dir.string());
  EXPECT_TRUE(file.is_hf_json());
  EXPECT_TRUE(auto_tok.is_hf_json());
  EXPECT_EQ(file.vocab_size(), refs["vocab_size"].get<int>());
  EXPECT_EQ(auto_tok.vocab_size(), refs["vocab_size"].get<int>());
  compare(name, file, refs, corpus, {"tokenizers", ""}, true);
  compare(name, auto_tok, refs, corpus, {"AutoTokenizer", "auto_"}, true);
  *checked = corpus.size();
  *auto_differs = refs["auto_differs"].get<int>();
}

}  // namespace

// `auto_differs`: corpus strings where transformers 5 AutoTokenizer and `tokenizers` give
// different results (docs/data.md); 0 for every class but LlamaTokenizer.
void expect_parity(const std::string& name, int auto_differs) {
  size_t n = 0;
  int differs = -1;
  check_parity(name, &n, &differs);
  EXPECT_EQ(n, 2173u) << name;  // the corpus of make_tokenizer_refs.py (docs/data.md)
  EXPECT_EQ(differs, auto_differs) << name;
}

TEST(TokenizerJson, SmolLM2MatchesTokenizers) { expect_parity("smollm2", 0); }
TEST(TokenizerJson, Llama3StyleBpeMatchesTokenizers) { expect_parity("llama3_bpe", 0); }
TEST(TokenizerJson, Qwen2StyleBpeMatchesTokenizers) { expect_parity("qwen2_bpe", 0); }

// LlamaTokenizer configs (transformers 5 rebuilds the pipeline): legacy absent = false, so the
// prepend scheme is "first" whatever the file says.
TEST(TokenizerJson, Llama2ConvertedMatchesTokenizers) { expect_parity("llama2_hf", 42); }
// The Llama 2 hub file's form: Prepend + Replace normalizer, no pre-tokenizer.
TEST(TokenizerJson, Llama2OlderConversionFormMatchesTokenizers) { expect_parity("llama2_legacy_norm", 151); }
// Mistral-style file: Metaspace prepend_scheme "first", split true (transformers: split false).
TEST(TokenizerJson, MetaspaceFirstSplitMatchesTokenizers) { expect_parity("llama2_first", 283); }
// The hub form under `"legacy": true` (scheme "always"): still differs from the file where its
// Prepend normalizer adds a second "▁" in front of text that starts with a space.
TEST(TokenizerJson, LegacyTrueConfigMatchesTransformers) { expect_parity("llama2_legacy_true", 129); }
// `"add_prefix_space": false` (scheme "never", no Strip decoder): nearly every string differs.
TEST(TokenizerJson, NoPrefixSpaceConfigMatchesTransformers) { expect_parity("llama2_no_prefix", 2171); }

// transformers 5 also reads config.json to pick the class: `tokenizer_class` there when
// tokenizer_config.json has none (the LlamaTokenizer pipeline, as llama2_legacy_norm) ...
TEST(TokenizerJson, LlamaClassInConfigJsonMatchesTransformers) { expect_parity("llama2_class_in_config", 151); }
// ... a Mistral `model_type` (TokenizersBackend: the file as written, whatever the class) ...
TEST(TokenizerJson, MistralDirReadsTheFileAsWritten) { expect_parity("mistral_hf", 0); }
// ... and a byte-level tokenizer.json under LlamaTokenizerFast (Llama 3-style dirs) as written too.
TEST(TokenizerJson, ByteLevelFileUnderLlamaClassReadsTheFileAsWritten) { expect_parity("llama3_llama_class", 0); }
// ... and a `qwen2` model_type loads Qwen2Tokenizer whatever the hub class, which rebuilds NFC +
// Qwen2's regex in place of the file's (before: the file as written; "\n\n" was [198, 198], not
// transformers' [1116]): SmolLM2's files, and a Llama 3-style byte-level file under
// LlamaTokenizerFast with BOS (DeepSeek-R1-Distill-Qwen's layout).
TEST(TokenizerJson, Qwen2ModelTypeRebuildsQwen2Pipeline) {
  expect_parity("smollm2_as_qwen2", 494);
  expect_parity("llama3_as_qwen2", 509);
}

// NFC + Replace normalizers, Split behaviours (Contiguous, MergedWithNext, MergedWithPrevious,
// Removed + invert), Digits, Metaspace split, unk / fuse_unk / subword prefix / word suffix /
// byte_fallback, decoders ByteFallback / Replace / Metaspace / Strip / Fuse, BOS+EOS template.
TEST(TokenizerJson, ComponentsBpeMatchesTokenizers) { expect_parity("components_bpe", 0); }

// The docs' example (docs/data.md, "Llama 2 / Mistral dirs"): the Llama 2 hub file's form after
// "<s>": "▁Hello" read alone, "Hello" as transformers 5 reads the dir (legacy absent = false).
TEST(TokenizerJson, LlamaDirDropsThePrefixAfterASpecialToken) {
  QLORA_REQUIRE_FIXTURE(dir, "tokenizers/llama2_legacy_norm/tokenizer.json");
  const Tokenizer file(dir.string()), auto_tok = Tokenizer::from_pretrained(dir.parent_path().string());
  EXPECT_EQ(file.encode("<s>Hello"), (TokenIds{1, 15043}));
  EXPECT_EQ(auto_tok.encode("<s>Hello"), (TokenIds{1, 10994}));
  EXPECT_EQ(auto_tok.id_to_piece(10994), "Hello");
  EXPECT_EQ(auto_tok.id_to_piece(15043), "\xe2\x96\x81Hello");
}

// The same file in a Mistral dir: "<s>Hello" keeps its "▁Hello" (docs/data.md).
TEST(TokenizerJson, MistralDirKeepsThePrefixAfterASpecialToken) {
  QLORA_REQUIRE_FIXTURE(dir, "tokenizers/mistral_hf/config.json");
  EXPECT_EQ(Tokenizer::from_pretrained(dir.parent_path().string()).encode("<s>Hello"), (TokenIds{1, 15043}));
}

// tokenizer.model alone under a LlamaTokenizer config: from_pretrained = AutoTokenizer (transformers
// 5 converts the model: scheme from legacy, add_bos_token default false) on every corpus string the
// is valid UTF-8, "<s>" / "</s>" / "<unk>" typed in the text included (split out as their ids, as
// transformers' converted tokenizer does, since session 18; a trial found them read as text).
void expect_spm_parity(const std::string& name, int want_checked) {
  const fs::path dir = qlora::test::fixtures_dir() / "tokenizers" / name;
  QLORA_REQUIRE_FIXTURE(refs_path, "tokenizers/" + name + "_refs.json");
  QLORA_REQUIRE_FIXTURE(corpus_path, "tokenizers/corpus.json");
  const Tokenizer tok = Tokenizer::from_pretrained(dir.string());
  ASSERT_FALSE(tok.is_hf_json());
  const auto refs = nlohmann::json::parse(std::ifstream(refs_path));
  const auto corpus = load_corpus(corpus_path);
  ASSERT_EQ(refs["cases"].size(), corpus.size());
  int n = 0, bad = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const Case& c = corpus[i];
    if (c.kind == "invalid_utf8") continue;
    ++n;
    const auto& r = refs["cases"][i];
    const bool e1 = tok.encode(c.text) != r["ids"].get<TokenIds>(),
               e2 = tok.encode_with_special_tokens(c.text) != r["ids_special"].get<TokenIds>();
    if ((e1 || e2) && bad++ < 5) ADD_FAILURE() << name << ": differs: '" << show(c.text) << "'";
  }
  EXPECT_EQ(bad, 0) << name;
  EXPECT_EQ(n, want_checked) << name;
}

TEST(TokenizerSpm, LlamaTokenizerConfigMatchesTransformers) {
  expect_spm_parity("llama2_spm", 2154);
  expect_spm_parity("llama2_spm_legacy", 2154);
  // added_tokens_decoder's tokens past tokenizer.model's pieces are split out of text by id as
  // AutoTokenizer splits them (they were read as text: "<|im_start|>" was 7 pieces, trial 24); the
  // corpus holds the ChatML markers (36 strings), and decode writes them back
  expect_spm_parity("llama2_spm_added", 2154);
  const Tokenizer added = Tokenizer::from_pretrained((qlora::test::fixtures_dir() / "tokenizers/llama2_spm_added").string());
  EXPECT_EQ(added.encode("<|im_start|>user"), (TokenIds{32000, 1792}));
  EXPECT_EQ(added.encode("a<|sep|>b"), (TokenIds{263, 32002, 29890}));
  EXPECT_EQ(added.vocab_size(), 32003);
  EXPECT_EQ(added.decode({32000, 1792, 32001}, true), "user");
  EXPECT_EQ(added.decode({32000, 1792, 32002}, false), "<|im_start|>user<|sep|>");
  // the two configs differ where it shows: BOS by default, and "▁" after a special id
  const Tokenizer first = Tokenizer::from_pretrained((qlora::test::fixtures_dir() / "tokenizers/llama2_spm").string());
  const Tokenizer legacy =
      Tokenizer::from_pretrained((qlora::test::fixtures_dir() / "tokenizers/llama2_spm_legacy").string());
  EXPECT_FALSE(first.add_bos_default());
  EXPECT_TRUE(legacy.add_bos_default());
  EXPECT_TRUE(legacy.add_eos_default());
  EXPECT_FALSE(first.prefix_after_special());
  EXPECT_TRUE(legacy.prefix_after_special());
}

// tokenizer.model alone in a Mistral dir (config.json model_type "mistral"): transformers 5 makes a
// TokenizersBackend from it, which prepends no "▁" (" lead" -> [▁lead], "Hello" -> [Hello]) and adds
// BOS by add_bos_token (true here); `legacy: true` in the config is not read.
TEST(TokenizerSpm, MistralDirMatchesTransformers) {
  expect_spm_parity("mistral_spm", 2154);
  const Tokenizer t = Tokenizer::from_pretrained((qlora::test::fixtures_dir() / "tokenizers/mistral_spm").string());
  EXPECT_TRUE(t.add_bos_default());
  EXPECT_FALSE(t.prefix_after_special());
  EXPECT_EQ(t.encode_with_special_tokens("Hello world"), (TokenIds{1, 10994, 3186}));
}

// (c): the Llama 2 tokenizer.json transformers converts from tokenizer.model gives the ids of our
// sentencepiece path on every corpus string that is valid UTF-8 and names no special token (after
// one the two differ by design: the file alone reads as legacy LlamaTokenizer, "▁" after a special
// token; the dir as transformers 5 reads it, legacy false; invalid bytes go to byte fallback
// there, to U+FFFD in tokenizers; qlora's inputs are UTF-8 checked before).
TEST(TokenizerJson, Llama2JsonEqualsSentencepiecePath) {
  QLORA_REQUIRE_SHARED(model, "tokenizers/llama2/tokenizer.model");
  QLORA_REQUIRE_FIXTURE(corpus_path, "tokenizers/corpus.json");
  const Tokenizer spm(model.string());
  const Tokenizer hf = Tokenizer::from_pretrained((qlora::test::fixtures_dir() / "tokenizers/llama2_hf").string());
  ASSERT_FALSE(spm.is_hf_json());
  ASSERT_TRUE(hf.is_hf_json());
  EXPECT_EQ(spm.vocab_size(), hf.vocab_size());
  int n = 0, bad = 0;
  for (const auto& c : load_corpus(corpus_path)) {
    if (c.kind == "invalid_utf8" || c.text.find("<s>") != std::string::npos ||
        c.text.find("</s>") != std::string::npos || c.text.find("<unk>") != std::string::npos)
      continue;
    ++n;
    if (spm.encode(c.text) != hf.encode(c.text) && bad++ < 5) ADD_FAILURE() << "differs: '" << show(c.text) << "'";
    if (spm.encode_with_special_tokens(c.text) != hf.encode_with_special_tokens(c.text)) ++bad;
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(n, 2083);  // docs/data.md
}

// Byte length of the text a byte-level token stands for: GPT-2 alphabet characters are one byte
// each (printable bytes map to themselves, the rest to U+0100..U+0143), others their own UTF-8.
size_t byte_level_len(const std::string& piece) {
  size_t n = 0;
  for (size_t i = 0; i < piece.size();) {
    const unsigned char c = static_cast<unsigned char>(piece[i]);
    const int k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
    int32_t cp = k == 1 ? c : k == 2 ? ((c & 0x1F) << 6) | (piece[i + 1] & 0x3F) : -1;
    const bool in_alphabet = (cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xFF && cp != 0xAD) ||
                             (cp >= 0x100 && cp <= 0x143);
    n += in_alphabet ? 1 : k;
    i += k;
  }
  return n;
}

// Offsets: for byte-level tokenizers without a normalizer every token covers exactly the bytes it
// stands for, so offset[i] = sum of the byte lengths of tokens before i, and they add up to the
// text (added tokens: their matched text).
TEST(TokenizerJson, OffsetsCoverTheTextForByteLevel) {
  QLORA_REQUIRE_FIXTURE(corpus_path, "tokenizers/corpus.json");
  for (const std::string name : {"smollm2", "llama3_bpe"}) {
    const Tokenizer tok = Tokenizer::from_pretrained((qlora::test::fixtures_dir() / "tokenizers" / name).string());
    int n = 0, bad = 0;
    for (const auto& c : load_corpus(corpus_path)) {
      // <mask> strips the spaces around it (lstrip/rstrip): its match is longer than its text
      if (c.kind == "invalid_utf8" || c.text.find("<mask>") != std::string::npos) continue;
      std::vector<int64_t> offs;
      const TokenIds ids = tok.encode_with_offsets(c.text, &offs);
      ASSERT_EQ(ids.size(), offs.size());
      ASSERT_EQ(ids, tok.encode(c.text));
      size_t at = 0;
      bool ok = true;
      for (size_t i = 0; i < ids.size() && ok; ++i) {
        ok = offs[i] == int64_t(at);
        at += byte_level_len(tok.id_to_piece(ids[i]));
      }
      ok = ok && at == c.text.size();
      if (!ok && bad++ < 5) ADD_FAILURE() << name << ": offsets wrong for '" << show(c.text) << "'";
      ++n;
    }
    EXPECT_EQ(bad, 0) << name;
    EXPECT_GT(n, 2000) << name;
  }
}

TEST(TokenizerJson, AddedTokenOffsetsAndContinuation) {
  QLORA_REQUIRE_FIXTURE(dir, "tokenizers/llama2_hf");
  const Tokenizer tok = Tokenizer::from_pretrained(dir.string());
  std::vector<int64_t> offs;
  // "Hello <s>world": [▁Hello, ▁, <s>, ▁world]; "world" after <s> gets "▁" (prepend_scheme always)
  const TokenIds ids = tok.encode_with_offsets("Hello <s>world", &offs);
  ASSERT_EQ(ids, tok.encode("Hello <s>world"));
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(ids[2], 1);
  EXPECT_EQ(offs, (std::vector<int64_t>{0, 5, 6, 9}));
  // prefix=false: no "▁" before the first piece of continuing text
  EXPECT_EQ(tok.encode_with_offsets("Hello", &offs, false), (TokenIds{tok.piece_to_id("Hello")}));
  EXPECT_EQ(tok.encode_with_offsets("Hello", &offs, true), (TokenIds{tok.piece_to_id("\xe2\x96\x81Hello")}));
}

TEST(TokenizerJson, SpecialsFlagsAndEosList) {
  QLORA_REQUIRE_FIXTURE(l3, "tokenizers/llama3_bpe");
  const Tokenizer t = Tokenizer::from_pretrained(l3.string());
  EXPECT_EQ(t.id_to_piece(t.bos_id()), "<|begin_of_text|>");
  EXPECT_EQ(t.id_to_piece(t.eos_id()), "<|eot_id|>");
  EXPECT_EQ(t.id_to_piece(t.pad_id()), "<|end_of_text|>");
  EXPECT_TRUE(t.add_bos_default());
  EXPECT_FALSE(t.add_eos_default());
  const int32_t eot = t.piece_to_id("<|eot_id|>"), eot_text = t.piece_to_id("<|end_of_text|>");
  EXPECT_EQ(t.eos_ids(), (std::vector<int32_t>{eot_text, eot}));  // generation_config.json order
  EXPECT_TRUE(t.is_special(t.piece_to_id("<|start_header_id|>")));
  EXPECT_FALSE(t.is_special(t.piece_to_id("wordtok")));
  EXPECT_EQ(t.piece_to_id("no such piece"), -1);
  EXPECT_EQ(t.id_to_piece(-5), "");
  EXPECT_EQ(t.encode_with_special_tokens(""), (TokenIds{t.bos_id()}));

  QLORA_REQUIRE_FIXTURE(smol, "tokenizers/smollm2");
  const Tokenizer s = Tokenizer::from_pretrained(smol.string());
  EXPECT_EQ(s.id_to_piece(s.eos_id()), "<|im_end|>");
  EXPECT_FALSE(s.add_bos_default());
  EXPECT_FALSE(s.add_eos_default());
  EXPECT_EQ(s.encode_with_special_tokens("Hi"), s.encode("Hi"));
  EXPECT_EQ(s.vocab_size(), 49152);

  QLORA_REQUIRE_FIXTURE(qw, "tokenizers/qwen2_bpe");
  const Tokenizer q = Tokenizer::from_pretrained(qw.string());
  EXPECT_EQ(q.bos_id(), -1);
  EXPECT_EQ(q.eos_ids(), (std::vector<int32_t>{q.piece_to_id("<|im_end|>"), q.piece_to_id("<|endoftext|>")}));
  EXPECT_FALSE(q.is_special(q.piece_to_id("<tool_call>")));
  EXPECT_EQ(q.encode("<tool_call>").size(), 1u);
}

TEST(TokenizerJson, TokenizerJsonTakesPrecedenceOverModel) {
  QLORA_REQUIRE_SHARED(model, "tokenizers/llama2/tokenizer.model");
  QLORA_REQUIRE_FIXTURE(src, "tokenizers/llama2_hf");
  const fs::path dir = qlora::test::fresh_temp_dir("tok_precedence");
  fs::copy_file(model, dir / "tokenizer.model");
  EXPECT_FALSE(Tokenizer::from_pretrained(dir.string()).is_hf_json());
  // the line train / eval / data preview log: which file, and the special tokens transformers'
  // LlamaTokenizer gives this model (bos <s> 1, eos </s> 2, pad None, len 32000)
  EXPECT_EQ(Tokenizer::from_pretrained(dir.string()).describe(),
            (dir / "tokenizer.model").string() + " (sentencepiece), 32000 ids, bos '<s>' 1, eos '</s>' 2, pad none");
  fs::copy_file(src / "tokenizer.json", dir / "tokenizer.json");
  const Tokenizer t = Tokenizer::from_pretrained(dir.string());
  EXPECT_TRUE(t.is_hf_json());
  EXPECT_EQ(t.path(), (dir / "tokenizer.json").string());
  // no tokenizer_config.json beside it: AutoTokenizer (TokenizersBackend) has bos_token, eos_token
  // and pad_token None too, though the post-processor writes id 1 first ('hi' -> [1, 7251])
  EXPECT_EQ(t.describe(), (dir / "tokenizer.json").string() + " (tokenizer.json), 32000 ids, bos none, eos none, pad none");
  // A file path picks its format by extension.
  EXPECT_TRUE(Tokenizer((dir / "tokenizer.json").string()).is_hf_json());
  qlora::remove_tree(dir);
}

// Invalid UTF-8 becomes U+FFFD per maximal invalid subpart (tokenizers on the lossy-decoded
// string, covered by the parity corpus); offsets still point into the raw bytes.
TEST(TokenizerJson, InvalidUtf8OffsetsPointIntoRawBytes) {
  QLORA_REQUIRE_FIXTURE(smol, "tokenizers/smollm2");
  const Tokenizer t = Tokenizer::from_pretrained(smol.string());
  std::vector<int64_t> offs;
  const TokenIds ids = t.encode_with_offsets("x \xe2\x82 y<|im_end|>z", &offs);
  ASSERT_EQ(ids.size(), 6u);
  EXPECT_EQ(t.id_to_piece(ids[2]), "\xc3\xaf\xc2\xbf\xc2\xbd");  // U+FFFD in the byte-level alphabet
  EXPECT_EQ(offs, (std::vector<int64_t>{0, 1, 2, 4, 6, 16}));
  EXPECT_EQ(t.encode("x \xe2\x82 y"), t.encode("x \xef\xbf\xbd y"));
  EXPECT_EQ(t.decode(t.encode("a\xff" "b")), "a\xef\xbf\xbd" "b");
}
