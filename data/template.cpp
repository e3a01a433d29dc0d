// qlora-cpp chat templates. The strings here are documented verbatim in docs/data.md.
#include "data/template.h"

#include "common/error.h"

namespace qlora::data {

namespace {

const char* kAlpacaSystem =
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.";
const char* kVicunaSystem =
    "A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
    "detailed, and polite answers to the user's questions.";

struct Builder {
  std::vector<Segment> segs;
  void text(const std::string& t, bool train) {
    if (!t.empty()) segs.push_back({t, -1, train});
  }
  void special(int32_t id, bool train) {
    if (id >= 0) segs.push_back({"", id, train});
  }
};

// System turns are folded into the next user turn (llama2, mistral) or the preamble.
std::string leading_system(const Record& r, size_t* first) {
  std::string sys;
  size_t k = 0;
  for (; k < r.turns.size() && r.turns[k].role == "system"; ++k) sys += (sys.empty() ? "" : "\n") + r.turns[k].content;
  *first = k;
  return sys;
}

}  // namespace

const std::vector<std::string>& template_names() {
  static const std::vector<std::string> k = {"alpaca", "chatml", "llama2", "mistral", "vicuna", "none"};
  return k;
}

std::vector<Segment> render(const Record& r, const std::string& name, const Tokenizer& tok, bool add_eos) {
  Builder b;
  const int32_t eos = add_eos ? tok.eos_id() : -1;
  b.special(tok.bos_id(), false);
  if (r.is_text) {
    b.text(r.text, true);
    b.special(eos, true);
    return b.segs;
  }
  size_t k = 0;
  std::string sys = leading_system(r, &k);
  if (name == "chatml") {
    // <|im_start|>{role}\n{content}<|im_end|>\n ; assistant: header masked, content+<|im_end|>+EOS trained
    for (const Turn& t : r.turns) {
      if (t.role == "assistant") {
        b.text("<|im_start|>assistant\n", false);
        b.text(t.content + "<|im_end|>", true);
        b.special(eos, true);
        b.text("\n", false);
      } else {
        b.text("<|im_start|>" + t.role + "\n" + t.content + "<|im_end|>\n", false);
      }
    }
  } else if (name == "llama2" || name == "mistral") {
    // llama2:  [INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] + " {assistant} " EOS
    // mistral: [INST] {system}\n\n{user} [/INST]               + " {assistant}" EOS
    const bool l2 = name == "llama2";
    for (; k < r.turns.size(); ++k) {
      const Turn& t = r.turns[k];
      if (t.role == "assistant") {
        b.text(" " + t.content + (l2 ? " " : ""), true);
        b.special(eos, true);
      } else if (t.role == "system") {
        sys += (sys.empty() ? "" : "\n") + t.content;
      } else {
        std::string u = t.content;
        if (!sys.empty()) u = l2 ? "<<SYS>>\n" + sys + "\n<</SYS>>\n\n" + u : sys + "\n\n" + u;
        sys.clear();
        b.text("[INST] " + u + " [/INST]", false);
      }
    }
  } else if (name == "vicuna") {
    // {system} USER: {user} ASSISTANT: + " {assistant}" EOS ; next turns "USER: ..."
    b.text((sys.empty() ? std::string(kVicunaSystem) : sys) + " ", false);
    for (; k < r.turns.size(); ++k) {
      const Turn& t = r.turns[k];
      if (t.role == "assistant") {
        b.text(" " + t.content, true);
        b.special(eos, true);
      } else if (t.role == "system") {
        b.text(t.content + " ", false);
      } else {
        b.text("USER: " + t.content + " ASSISTANT:", false);
      }
    }
  } else if (name == "alpaca") {
    // {system}\n\n### Instruction:\n{user}\n\n### Response:\n + "{assistant}" EOS
    b.text((sys.empty() ? std::string(kAlpacaSystem) : sys) + "\n\n", false);
    for (; k < r.turns.size(); ++k) {
      const Turn& t = r.turns[k];
      if (t.role == "assistant") {
        b.text(t.content, true);
        b.special(eos, true);
      } else if (t.role == "system") {
        b.text(t.content + "\n\n", false);
      } else {
        b.text("### Instruction:\n" + t.content + "\n\n### Response:\n", false);
      }
    }
  } else if (name == "none") {
    // contents concatenated as they are; assistant content + EOS trained
    for (const Turn& t : r.turns) {
      b.text(t.content, t.role == "assistant");
      if (t.role == "assistant") b.special(eos, true);
    }
  } else {
    fail("data.template: unknown template '", name, "' (alpaca|chatml|llama2|mistral|vicuna|none)");
  }
  return b.segs;
}

Example tokenize(const std::vector<Segment>& segs, const Tokenizer& tok, bool train_on_inputs) {
  Example ex;
  std::string chunk;
  std::vector<std::pair<size_t, bool>> starts;  // (byte offset where a segment starts, trainable)
  std::vector<int64_t> offs;
  auto flush = [&]() {
    if (chunk.empty()) return;
    const TokenIds ids = tok.encode_with_offsets(chunk, &offs, true);
    size_t s = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      while (s + 1 < starts.size() && starts[s + 1].first <= size_t(offs[i])) ++s;
      ex.input_ids.push_back(ids[i]);
      ex.labels.push_back(train_on_inputs || starts[s].second ? ids[i] : kIgnoreIndex);
    }
    chunk.clear();
    starts.clear();
  };
  for (const Segment& seg : segs) {
    if (seg.special_id >= 0) {
      flush();
      ex.input_ids.push_back(seg.special_id);
      ex.labels.push_back(train_on_inputs || seg.trainable ? seg.special_id : kIgnoreIndex);
    } else if (!seg.text.empty()) {
      starts.emplace_back(chunk.size(), seg.trainable);
      chunk += seg.text;
    }
  }
  flush();
  return ex;
}

std::string render_string(const std::vector<Segment>& segs, const Tokenizer& tok) {
  std::string s;
  for (const Segment& seg : segs) s += seg.special_id >= 0 ? tok.id_to_piece(seg.special_id) : seg.text;
  return s;
}

}  // namespace qlora::data
