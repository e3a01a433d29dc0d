// qlora-cpp chat templates: Record -> segments (text or one special id, each trainable or not)
// -> token ids + labels. Exact strings are listed in docs/data.md; the jinja equivalents used as
// the reference live in tests/fixtures/make_data_refs.py.
//
// Tokenisation of a rendered example (how ids stay equal to transformers' tokenisation of the
// rendered string): the segments between two special ids form one chunk; each chunk is
// tokenised in one pass exactly as HF tokenises text between special tokens (legacy Llama: a
// "▁" prefix per chunk), and each token takes the label of the segment holding its first byte.
// Labels are therefore computed while rendering, from the segment spans, never by searching
// strings in the tokenised output. A token that straddles a segment boundary (only whitespace
// runs can) belongs to the segment where it starts.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/reader.h"
#include "data/tokenizer.h"

namespace qlora::data {

/// Label value of a token that is not trained on.
constexpr int32_t kIgnoreIndex = -100;

/// One piece of a rendered example: either `text` (special_id < 0) or one special token id.
struct Segment {
  std::string text;
  int32_t special_id = -1;
  bool trainable = false;  ///< assistant content, its template suffix and its EOS
};

/// A tokenised example. input_ids and labels have the same length; labels[i] is input_ids[i]
/// or kIgnoreIndex (HF convention: the loss shifts, labels are not pre-shifted).
struct Example {
  TokenIds input_ids;
  std::vector<int32_t> labels;
  int64_t id = 0;  ///< index of the example in its dataset (what Batch::example_ids reports)
};

/// The template names: alpaca, chatml, llama2, mistral, vicuna, none.
const std::vector<std::string>& template_names();

/// Renders a record with template `name`: exactly one BOS first, EOS after every assistant turn
/// when add_eos. Raw text (completion) renders as BOS text [EOS], all trainable.
/// Throws qlora::Error for an unknown template name.
std::vector<Segment> render(const Record& r, const std::string& name, const Tokenizer& tok, bool add_eos);

/// Tokenises rendered segments (see the file comment). train_on_inputs = true labels every token.
Example tokenize(const std::vector<Segment>& segs, const Tokenizer& tok, bool train_on_inputs);

/// The rendered string HF would tokenise: special ids written as their pieces ("<s>", "</s>").
std::string render_string(const std::vector<Segment>& segs, const Tokenizer& tok);

}  // namespace qlora::data
