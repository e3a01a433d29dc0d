// qlora-cpp chat templates: Record -> segments (text or one special id, each trainable or not)
// -> token ids + labels. Exact strings are listed in docs/data.md.
//
// Two kinds of templates:
//  - the qlora-cpp templates alpaca, chatml, llama2, vicuna, none: strings of our own (docs/data.md;
//    the Python equivalents used as the reference live in tests/fixtures/make_data_refs.py);
//    BOS first from the tokenizer, EOS after each assistant turn when add_eos.
//  - the model-family templates smollm2, qwen2.5, qwen3, llama3, llama3.1, llama3.2, mistral: each
//    renders exactly what transformers' apply_chat_template renders with that family's real jinja template (kept in
//    tests/fixtures/chat_templates/, checked by tests/data/test_templates.cpp). The template writes
//    its own BOS (llama3*, mistral) or none (smollm2, qwen*), and its own closing token of each turn
//    (<|im_end|>, <|eot_id|>, </s>), which is the learned end of each assistant turn; add_eos does
//    not apply (no second EOS).
//
// Tokenisation of a rendered example (how ids stay equal to transformers' tokenisation of the
// rendered string): tokenizer.json: the whole rendered string in one pass (the tokenizer splits
// added tokens out itself, as HF does); sentencepiece: the segments between two special ids form
// one chunk, each tokenised in one pass exactly as HF tokenises text between special tokens
// (legacy Llama: a "▁" prefix per chunk; legacy=false: only a chunk with nothing before it,
// Tokenizer::prefix_after_special()). Each token takes the label of the segment holding its
// first byte.
// Labels are therefore computed while rendering, from the segment spans, never by searching
// strings in the tokenised output. A token that straddles a segment boundary (only whitespace
// runs can) belongs to the segment where it starts.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/reader.h"
#include "data/tokenizer.h"

namespace qlora::data {

/// Label value of a token that is not trained on.
constexpr int32_t kIgnoreIndex = -100;

/// One piece of a rendered example: either `text` (special_id < 0) or one special token id.
/// A `control` segment's text is one control token ("<|im_start|>", "<|eot_id|>", "</s>"): it
/// becomes that single id when the vocabulary has the piece, else it is tokenised as text.
struct Segment {
  std::string text;
  int32_t special_id = -1;
  bool trainable = false;  ///< assistant content, its template suffix and its EOS
  bool control = false;
  /// Never trained, not even under train_on_inputs: an assistant turn of `weight: 0` (Axolotl
  /// masks such a turn whole, its role header too).
  bool masked = false;
};

/// A tokenised example. input_ids and labels have the same length; labels[i] is input_ids[i]
/// or kIgnoreIndex (HF convention: the loss shifts, labels are not pre-shifted).
struct Example {
  TokenIds input_ids;
  std::vector<int32_t> labels;
  int64_t id = 0;  ///< index of the example in its dataset (what Batch::example_ids reports)
  /// Index of the record it came from among the records its files gave, in load order (a split
  /// raw text's pieces share it); -1 = not from a record. The val_set_size hold-out draws records.
  int64_t record = -1;
  /// Its length in tokens before data.truncation: truncate cut it to data.sequence_len; 0 when it
  /// was not cut (data preview's example header says "cut from N").
  int64_t untruncated_len = 0;
};

/// The template names: alpaca, chatml, llama2, vicuna, none, smollm2, qwen2.5, qwen3, llama3,
/// llama3.1, llama3.2, mistral.
const std::vector<std::string>& template_names();

/// Throws qlora::Error "<key>: unknown template '<name>' (alpaca|chatml|...)" unless `name` is one
/// of template_names() or of `also` (names the caller resolves itself: generate's auto and raw),
/// listed after them. The one check behind data.template's render error and generate --template.
void check_template_name(const std::string& name, const std::string& key, const std::vector<std::string>& also = {});

/// The system message template `name` renders when a conversation has no system turn, as its
/// jinja writes it: smollm2's "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
/// and qwen2.5's "You are Qwen, created by Alibaba Cloud. You are a helpful assistant." (the same
/// strings render_family writes, so render() of a record without a system turn equals render() of
/// the record with this text as its system turn). "" for every other template (llama3.1 / llama3.2
/// still write their "Cutting Knowledge Date" header, with an empty system text). Never throws.
std::string template_default_system(const std::string& name);

/// True for the model-family templates (smollm2, qwen2.5, qwen3, llama3, llama3.1, llama3.2, mistral).
bool is_family_template(const std::string& name);

/// True when template `name` renders a record's `tools` (function schemas): qwen2.5, qwen3,
/// llama3.1, llama3.2, mistral, as their models' chat templates do under transformers'
/// apply_chat_template(tools=...). The others drop them: smollm2's and llama3's jinjas ignore
/// `tools`, and the generic templates (alpaca, chatml, llama2, vicuna, none) have no place for
/// them. The one list render_family() consults (it drops the tools of the others).
bool template_renders_tools(const std::string& name);

/// True when template `name` renders an assistant message's `reasoning_content`: qwen3 only (its
/// jinja writes it as <think>\n...\n</think>\n\n before the content, for the assistant turns after
/// the last user query). Every other family jinja (smollm2, qwen2.5, llama3*, mistral) ignores the
/// field, and the generic templates have no place for it: build_examples counts such records
/// (DataStats::reasoning_not_rendered) for a per-file warning.
bool template_renders_reasoning(const std::string& name);

/// Renders a record with template `name`: exactly one BOS first, EOS after every assistant turn
/// when add_eos (family templates: see the file comment). Raw text (completion) renders as
/// BOS text [EOS], all trainable. Throws qlora::Error for an unknown template name, and (family
/// templates) `file:line: template NAME: problem` for a conversation the jinja template would
/// refuse (mistral: roles not alternating, a call id or tool_call_id not 9 characters, glaive-form
/// tools) or a malformed tools list, and for a mistral message with both content and tool calls
/// (its jinja would drop the content). An assistant turn's tool calls (Turn::tool_calls) render
/// in the template's tool-call syntax (qwen2.5, qwen3, llama3.1/3.2, mistral), else as JSON text after the
/// content, one call a line (docs/data.md "Formats"). An assistant turn of Axolotl `weight: 0`
/// (Turn::train false) renders the same text, every segment of it `masked` (and not trainable).
std::vector<Segment> render(const Record& r, const std::string& name, const Tokenizer& tok, bool add_eos);

/// The family templates without a tokenizer: `bos` / `eos` are the tokenizer's bos_token and
/// eos_token strings ("" = none). Same throws as render(). What tests compare with
/// apply_chat_template(tokenize=False).
std::vector<Segment> render_family(const Record& r, const std::string& name, const std::string& bos,
                                   const std::string& eos);

/// `data.template: auto`: the named family template whose jinja text equals the model's own
/// (`<model_dir>/chat_template.jinja`, else tokenizer_config.json `chat_template`), compared
/// after removing whitespace and "\n" escapes. Any other name is returned unchanged.
/// Throws qlora::Error naming the file when the model has no chat template or an unknown one
/// (the message lists the named templates and says to set data.template: NAME; for a jinja that a
/// named template renders with a documented difference, Meta's Llama-2-chat, it names that one).
std::string resolve_template(const std::string& name, const std::string& model_dir);

/// "" unless the model has a chat template that is one of the named family templates and `name`
/// (already resolved) is another one; then one line for a warning: the model was tuned on its own
/// format ("data.template chatml, but the model's chat template (<file>) is smollm2's; ...").
/// Never throws (a model without a readable or known template gives "").
std::string template_mismatch_note(const std::string& name, const std::string& model_dir);

/// "" unless template `name` writes turn markers that its family's tokenizers have as single
/// special tokens (chatml, smollm2, qwen2.5, qwen3: <|im_start|> <|im_end|>; llama3*:
/// <|start_header_id|> <|end_header_id|> <|eot_id|>) and `tok` encodes one of them as several
/// pieces (chatml on a Llama 2 vocabulary: text the model must learn, never a stop token); then one
/// line naming each such marker and its piece count. Never throws.
std::string template_tokens_note(const std::string& name, const Tokenizer& tok);

/// "" or, when `add_eos` is false and `name` is a family template (is_family_template), the note that
/// data.add_eos: false does not change its conversations: the family format closes every assistant
/// turn with its own token, trained as the turn's end (trial 26: silently no effect under mistral).
/// Never throws.
std::string add_eos_note(const std::string& name, bool add_eos);

/// The warnings train, eval and data preview print about `name` (resolved) for the model at
/// `model_dir` with tokenizer `tok`, conversations rendered with data.add_eos `add_eos`:
/// template_mismatch_note (not with `model_dir` ""), template_tokens_note, add_eos_note, the
/// non-empty ones in that order. Never throws.
std::vector<std::string> template_warnings(const std::string& name, const std::string& model_dir, const Tokenizer& tok,
                                           bool add_eos);

/// The hash that resolve_template compares: 64-bit FNV-1a of the jinja's output-deciding form, as
/// transformers' Jinja environment (trim_blocks, lstrip_blocks, no trailing newline) lexes it: the
/// text between tags with Jinja's whitespace control applied, kept exactly; each tag's code with
/// the whitespace outside its string literals removed; string literals with their escapes decoded
/// ("\n" = a newline). Templates that differ only in layout hash alike; any change to text that
/// is output (a literal, a separator, a newline between turns) changes the hash (jinja2/lexer.py).
/// Exposed for the test that checks the known table against tests/fixtures/chat_templates/*.jinja.
uint64_t template_text_hash(const std::string& jinja);

/// json.dumps(x, ensure_ascii=False) of Python (", " and ": " separators, key order kept): the
/// `tojson` filter of transformers' chat templates. `json_text` is parsed with key order kept.
/// Throws qlora::Error when json_text is not JSON.
std::string py_tojson(const std::string& json_text);

/// Python str.strip() (Unicode whitespace, as jinja's `trim` filter) of UTF-8 text.
std::string py_strip(const std::string& s);

/// Tokenises rendered segments (see the file comment). train_on_inputs = true labels every token
/// but those of `masked` segments.
Example tokenize(const std::vector<Segment>& segs, const Tokenizer& tok, bool train_on_inputs);

/// [start, end) of the last run of trained labels of `ex`: its last assistant turn (answer,
/// template suffix and closing token). {0, 0} when the example has none.
std::pair<size_t, size_t> last_answer_span(const Example& ex);

/// The ids a model is prompted with to answer `user` (after a system turn of `system`'s text when
/// it has a value, an empty one included, as a {"role": "system", "content": ""} message) in template
/// `name`: the conversation rendered and tokenised as training does, with an empty assistant turn,
/// cut before that turn's trained span (the prompt `eval --metric exact_match` uses; for the family
/// templates the string of transformers' apply_chat_template(add_generation_prompt=True), for
/// qwen3 with enable_thinking=False; mistral: the user-last conversation, its jinja having no
/// generation prompt). BOS as the template writes it. Throws qlora::Error as
/// render() does (unknown template, a family template on another family's tokenizer).
TokenIds chat_prompt(const Tokenizer& tok, const std::string& name, const std::optional<std::string>& system,
                     const std::string& user);

/// The rendered string HF would tokenise: special ids written as their pieces ("<s>", "</s>").
std::string render_string(const std::vector<Segment>& segs, const Tokenizer& tok);

}  // namespace qlora::data
