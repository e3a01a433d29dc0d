// qlora-cpp: YAML text -> node tree on libyaml's event parser (common/yaml.h).
#include "common/yaml.h"

#include <yaml.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>

#include "common/error.h"

namespace qlora::yaml {
namespace {

/// Throws ParseError at the 0-based `line` / `column` with the concatenated message.
template <typename... Args>
[[noreturn]] void raise_at(int64_t line, int64_t column, const Args&... args) {
  std::ostringstream os;
  detail::cat(os, args...);
  throw ParseError(os.str(), Mark{line, column});
}

constexpr size_t kMaxDepth = 256;  // deeper nesting is refused (the tree is freed recursively)

std::string quote_json(const std::string& s) {
  static const char* hex = "0123456789abcdef";
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += static_cast<char>(c);
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20) out += "\\u00", out += hex[c >> 4], out += hex[c & 15];
    else out += static_cast<char>(c);
  }
  return out + "\"";
}

/// Owns a libyaml parser and the current event.
struct Parser {
  yaml_parser_t p{};
  yaml_event_t ev{};
  bool have_event = false;
  const std::string& text;
  explicit Parser(const std::string& t) : text(t) {
    QLORA_CHECK(yaml_parser_initialize(&p) == 1, "libyaml: cannot initialize a parser (out of memory)");
    yaml_parser_set_input_string(&p, reinterpret_cast<const unsigned char*>(text.data()), text.size());
    yaml_parser_set_encoding(&p, YAML_UTF8_ENCODING);
  }
  ~Parser() {
    if (have_event) yaml_event_delete(&ev);
    yaml_parser_delete(&p);
  }
  Parser(const Parser&) = delete;
  Parser& operator=(const Parser&) = delete;

  /// The next event; throws the parser's error naming `source` and the line.
  const yaml_event_t& next(const std::string& source) {
    if (have_event) yaml_event_delete(&ev), have_event = false;
    if (yaml_parser_parse(&p, &ev) != 1) {
      const yaml_mark_t& m = p.problem_mark;
      std::string msg = p.problem ? p.problem : "unknown error";
      if (p.error == YAML_READER_ERROR) {
        const size_t at = std::min(p.problem_offset, text.size());
        const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n');
        raise_at(line - 1, -1, source, ":", line, ": YAML error: ", msg, " (byte ", p.problem_offset, ")");
      }
      if (p.context) {
        msg += std::string(" (") + p.context + " on line " + std::to_string(p.context_mark.line + 1) + ")";
      }
      raise_at(m.line, m.column, source, ":", m.line + 1, ": YAML syntax error: ", msg, " at column ", m.column + 1);
    }
    have_event = true;
    return ev;
  }
};

Mark mark_of(const yaml_event_t& e) {
  return Mark{static_cast<int64_t>(e.start_mark.line), static_cast<int64_t>(e.start_mark.column)};
}

std::string anchor_of(const yaml_char_t* a) { return a ? reinterpret_cast<const char*>(a) : std::string(); }

int64_t count_nodes(const Node& n) {
  int64_t c = 1;
  for (const auto& i : n.items) c += count_nodes(i);
  for (const auto& [k, v] : n.entries) c += count_nodes(k) + count_nodes(v);
  return c;
}

/// Builds one document's tree from the events after DOCUMENT-START, without recursion.
class Builder {
 public:
  Builder(Parser& parser, const std::string& source, int64_t max_nodes)
      : parser_(parser), source_(source), max_nodes_(max_nodes) {}

  Node document() {
    // Frames of open collections; a map frame holds a pending key between key and value.
    struct Frame {
      Node node;
      std::string anchor;
      bool have_key = false;
      Node key;
    };
    std::vector<Frame> stack;
    Node root;
    bool done = false;
    auto add = [&](Node n, const std::string& anchor) {
      nodes_ += 1;
      if (!anchor.empty()) anchors_[anchor] = n;  // a later anchor of the same name wins (YAML 1.2, 3.2.2.2)
      if (stack.empty()) {
        root = std::move(n);
        done = true;
        return;
      }
      Frame& f = stack.back();
      if (f.node.is_sequence()) {
        f.node.items.push_back(std::move(n));
      } else if (!f.have_key) {
        f.key = std::move(n);
        f.have_key = true;
      } else {
        f.node.entries.emplace_back(std::move(f.key), std::move(n));
        f.key = Node();
        f.have_key = false;
      }
    };
    while (!done) {
      const yaml_event_t& e = parser_.next(source_);
      if (nodes_ > max_nodes_)
        raise_at(e.start_mark.line, e.start_mark.column, source_, ":", e.start_mark.line + 1, ": YAML error: more than ", max_nodes_,
             " nodes (after expanding aliases)");
      switch (e.type) {
        case YAML_SCALAR_EVENT: {
          Node n;
          n.kind = Node::Kind::kScalar;
          n.value.assign(reinterpret_cast<const char*>(e.data.scalar.value), e.data.scalar.length);
          n.plain = e.data.scalar.style == YAML_PLAIN_SCALAR_STYLE && e.data.scalar.tag == nullptr;
          n.mark = mark_of(e);
          add(std::move(n), anchor_of(e.data.scalar.anchor));
          break;
        }
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT: {
          if (stack.size() >= kMaxDepth)
            raise_at(e.start_mark.line, e.start_mark.column, source_, ":", e.start_mark.line + 1, ": YAML error: nested deeper than ", kMaxDepth, " levels");
          Frame f;
          const bool seq = e.type == YAML_SEQUENCE_START_EVENT;
          f.node.kind = seq ? Node::Kind::kSequence : Node::Kind::kMap;
          f.node.mark = mark_of(e);
          f.anchor = anchor_of(seq ? e.data.sequence_start.anchor : e.data.mapping_start.anchor);
          stack.push_back(std::move(f));
          break;
        }
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT: {
          Frame f = std::move(stack.back());
          stack.pop_back();
          add(std::move(f.node), f.anchor);
          break;
        }
        case YAML_ALIAS_EVENT: {
          // libyaml reports an alias whose anchor is unknown as a parse error only in its loader,
          // not in the event parser, so it is checked here.
          const std::string name = anchor_of(e.data.alias.anchor);
          const auto it = anchors_.find(name);
          if (it == anchors_.end())
            raise_at(e.start_mark.line, e.start_mark.column, source_, ":", e.start_mark.line + 1, ": YAML syntax error: alias *", name, " names no anchor before it");
          nodes_ += count_nodes(it->second) - 1;
          if (nodes_ > max_nodes_)
            raise_at(e.start_mark.line, e.start_mark.column, source_, ":", e.start_mark.line + 1, ": YAML error: more than ", max_nodes_,
                 " nodes (after expanding aliases)");
          Node copy = it->second;
          copy.mark = mark_of(e);
          add(std::move(copy), "");
          break;
        }
        default:
          raise_at(e.start_mark.line, e.start_mark.column, source_, ":", e.start_mark.line + 1, ": YAML error: unexpected event ", static_cast<int>(e.type));
      }
    }
    return root;
  }

 private:
  Parser& parser_;
  const std::string& source_;
  int64_t max_nodes_;
  int64_t nodes_ = 0;
  std::map<std::string, Node> anchors_;
};

}  // namespace

bool Node::is_null() const {
  if (kind == Kind::kUndefined) return true;
  return kind == Kind::kScalar && plain &&
         (value.empty() || value == "~" || value == "null" || value == "Null" || value == "NULL");
}

const Node* Node::find(const std::string& key) const {
  for (const auto& [k, v] : entries)
    if (k.is_scalar() && k.value == key) return &v;
  return nullptr;
}

Node* Node::find(const std::string& key) {
  return const_cast<Node*>(static_cast<const Node*>(this)->find(key));
}

Node Node::map() {
  Node n;
  n.kind = Kind::kMap;
  return n;
}

std::vector<Node> parse_all(const std::string& text, const std::string& source, int64_t max_nodes) {
  Parser parser(text);
  std::vector<Node> docs;
  for (;;) {
    const yaml_event_t& e = parser.next(source);
    if (e.type == YAML_STREAM_END_EVENT) break;
    if (e.type != YAML_DOCUMENT_START_EVENT) continue;  // STREAM-START
    Builder b(parser, source, max_nodes);
    docs.push_back(b.document());
    const yaml_event_t& end = parser.next(source);
    QLORA_CHECK(end.type == YAML_DOCUMENT_END_EVENT, source, ": YAML error: document does not end");
  }
  return docs;
}

std::string to_flow(const Node& n) {
  switch (n.kind) {
    case Node::Kind::kUndefined: return "~";
    case Node::Kind::kScalar: return n.plain ? n.value : quote_json(n.value);
    case Node::Kind::kSequence: {
      std::string s = "[";
      for (size_t i = 0; i < n.items.size(); ++i) s += (i ? ", " : "") + to_flow(n.items[i]);
      return s + "]";
    }
    case Node::Kind::kMap: {
      std::string s = "{";
      for (size_t i = 0; i < n.entries.size(); ++i)
        s += (i ? ", " : "") + to_flow(n.entries[i].first) + ": " + to_flow(n.entries[i].second);
      return s + "}";
    }
  }
  return "";
}

}  // namespace qlora::yaml
