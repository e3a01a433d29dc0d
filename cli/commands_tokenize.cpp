// `qlora tokenize`: ids and pieces of a text, or one conversation rendered as training sees it.
#include <algorithm>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "common/files.h"
#include "common/utf8.h"
#include "data/dataset.h"
#include "data/reader.h"
#include "data/template.h"
#include "data/tokenizer.h"
#include "cli/commands.h"

namespace qlora {

namespace {

/// A piece as a JSON string literal, so spaces, newlines and control bytes are visible.
std::string quoted(const std::string& piece) {
  return nlohmann::json(piece).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

/// How many records a --chat file holds when it is a data file rather than one record: a JSON
/// array's length, or the number of JSONL lines when there are two or more non-blank lines and
/// each is a JSON value; 0 otherwise (one JSON object, or text whose error the reader reports).
/// "kind" is set to "a JSON array" or "JSONL lines".
size_t data_file_records(const std::string& text, std::string* kind) {
  const nlohmann::json whole = nlohmann::json::parse(text, nullptr, false);
  if (!whole.is_discarded()) {
    *kind = "a JSON array";
    return whole.is_array() ? whole.size() : 0;
  }
  size_t lines = 0;
  std::istringstream is(text);
  for (std::string line; std::getline(is, line);) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (nlohmann::json::parse(line, nullptr, false).is_discarded()) return 0;
    ++lines;
  }
  *kind = "JSONL lines";
  return lines >= 2 ? lines : 0;
}

/// The text of --file (a UTF-16 / UTF-32 byte-order mark, a NUL byte or invalid UTF-8 refused as
/// data files refuse them, a UTF-8 byte-order mark skipped: data::check_encoding) or of --text,
/// which must be UTF-8: sentencepiece and `tokenizers` would encode invalid bytes as U+FFFD, never
/// as the byte tokens we would give them. Throws qlora::Error naming --file's path and line, or
/// --text, and the byte offset.
std::string tokenize_input_text(const TokenizeOptions& o) {
  if (o.file.empty()) {
    require_utf8(o.text, "tokenize: --text");
    return o.text;
  }
  const std::string buf = read_file(o.file);
  return buf.substr(data::check_encoding(o.file, buf, /*skip_invalid=*/false, "tokenize --file reads UTF-8 text"));
}
}  // namespace

std::string cmd_tokenize(const TokenizeOptions& o) {
  const int sources = int(o.has_text || !o.text.empty()) + int(!o.file.empty()) + int(!o.chat.empty());
  QLORA_CHECK(sources == 1, "tokenize: give exactly one of --text, --file, --chat");
  QLORA_CHECK(o.chat.empty() || !o.template_name.empty(), "tokenize: --chat needs --template NAME (or auto)");
  QLORA_CHECK(!o.chat.empty() || o.template_name.empty(), "tokenize: --template applies to --chat only");
  const data::Tokenizer tok = data::Tokenizer::from_pretrained(o.model_dir);
  data::TokenIds ids;
  std::vector<int32_t> labels;
  std::string masked_view;
  std::string template_used;  // --chat: the template rendered with ("auto" resolved)
  std::string warning;        // --chat: what the template drops (reasoning_content), "" = nothing
  if (!o.chat.empty()) {
    data::DataOptions dopts;  // training's defaults: add_eos, train_on_inputs = false
    dopts.format = "auto";
    const std::string bytes = read_file(o.chat);
    // A data file (a JSON array, or JSONL) is not one record: said with its count, not as the JSON
    // syntax error of its second line (issue: a README-only trial).
    std::string kind;
    const size_t n = data_file_records(bytes.substr(data::check_encoding(o.chat, bytes, false)), &kind);
    QLORA_CHECK(n == 0, o.chat, " holds ", n, " record", n == 1 ? "" : "s", " (", kind,
                "); --chat takes one record (a JSON object): use `qlora data preview CONFIG.yaml --set data.train=",
                o.chat, "` for a data file");
    const data::Record r = data::record_from_json(bytes, o.chat, dopts);
    QLORA_CHECK(!r.is_text, o.chat, ":1: expected a conversation ({\"messages\": [...]}), got a text record");
    template_used = data::resolve_template(o.template_name, o.model_dir);
    const std::string& name = template_used;
    const data::Example ex = data::tokenize(data::render(r, name, tok, dopts.add_eos), tok, dopts.train_on_inputs);
    ids = ex.input_ids;
    labels = ex.labels;
    masked_view = data::render_masked(ex, tok);
    data::DataStats dropped;  // the per-file warning of train / eval, for this one record
    dropped.reasoning_not_rendered =
        !data::template_renders_reasoning(name) &&
        std::any_of(r.turns.begin(), r.turns.end(), [](const data::Turn& t) { return t.has_reasoning && !t.reasoning_content.empty(); });
    warning = data::reasoning_note(dropped, name);
  } else {
    const std::string text = tokenize_input_text(o);
    ids = o.no_special ? tok.encode(text) : tok.encode_with_special_tokens(text);
  }
  std::ostringstream os;
  if (o.json) {
    nlohmann::json j;
    j["ids"] = ids;
    std::vector<std::string> pieces;
    for (int32_t id : ids) pieces.push_back(tok.id_to_piece(id));
    j["pieces"] = pieces;
    if (!template_used.empty()) j["template"] = template_used;
    if (!warning.empty()) j["warning"] = warning;
    if (!labels.empty()) {
      j["labels"] = labels;
      std::vector<bool> trained;
      for (int32_t l : labels) trained.push_back(l != data::kIgnoreIndex);
      j["trained"] = trained;
    }
    os << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return os.str();
  }
  if (!template_used.empty()) os << "template: " << template_used << "\n";
  if (!warning.empty()) os << "warning: " << warning << "\n";
  os << ids.size() << " tokens";
  if (!labels.empty()) {
    const auto n = std::count_if(labels.begin(), labels.end(), [](int32_t l) { return l != data::kIgnoreIndex; });
    os << ", " << n << " trained  ([[masked]] = label -100)\n" << masked_view;
  }
  os << "\n";
  for (size_t i = 0; i < ids.size(); ++i) {
    os << std::setw(6) << i << std::setw(8) << ids[i] << "  ";
    if (!labels.empty()) os << (labels[i] == data::kIgnoreIndex ? "masked   " : "trained  ");
    os << quoted(tok.id_to_piece(ids[i])) << "\n";
  }
  return os.str();
}

}  // namespace qlora
