// qlora-cpp: YAML text -> a plain node tree, on libyaml (the C reference parser behind PyYAML,
// continuously fuzzed by OSS-Fuzz). Untrusted YAML (training configs, the config stored in a
// checkpoint) is parsed only here: yaml-cpp 0.7's parser could loop forever on a few malformed
// inputs (tests/fuzz/corpus/crashes/config/), libyaml's returns an error on each.
//
// The tree keeps what a schema walk needs: the kind, scalar text, whether a scalar is plain and
// untagged (so "5" and '5' can be told apart, YAML 1.2 core schema), and where each node starts.
// Scalars are not resolved here (no int/bool/null typing): the schema does that (config/).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"

namespace qlora::yaml {

/// A position in the text; 0-based like libyaml's, line < 0 when unknown.
struct Mark {
  int64_t line = -1;
  int64_t column = -1;
  bool is_null() const { return line < 0; }
};

/// What parse_all throws: a qlora::Error whose message names the source and the 1-based line,
/// plus the 0-based position (column < 0 when only the line is known), so a caller can look at
/// the offending line without parsing the message.
class ParseError : public Error {
 public:
  ParseError(const std::string& msg, Mark where) : Error(msg), mark(where) {}
  Mark mark;
};

/// One YAML node. kUndefined stands for "absent" (a default-constructed Node).
struct Node {
  enum class Kind { kUndefined, kScalar, kSequence, kMap };
  Kind kind = Kind::kUndefined;
  std::string value;  ///< scalar text (kScalar only)
  bool plain = false; ///< kScalar written plain with no tag: its type is resolved by the schema
  Mark mark;          ///< where the node starts
  std::vector<Node> items;                     ///< kSequence
  std::vector<std::pair<Node, Node>> entries;  ///< kMap, in document order (duplicates kept)

  bool is_defined() const { return kind != Kind::kUndefined; }
  bool is_scalar() const { return kind == Kind::kScalar; }
  bool is_sequence() const { return kind == Kind::kSequence; }
  bool is_map() const { return kind == Kind::kMap; }
  /// Absent, or a plain untagged scalar "", "~", "null", "Null" or "NULL" (YAML 1.2 core null).
  bool is_null() const;
  /// A map's value for the first entry whose key is the scalar `key`; nullptr when none (or not a map).
  const Node* find(const std::string& key) const;
  Node* find(const std::string& key);
  /// A new map node.
  static Node map();
};

/// Parses every document of `text` (UTF-8). An empty document is a plain "" scalar, like libyaml.
/// Aliases are expanded as copies; more than `max_nodes` nodes after expansion is an error (so
/// "billion laughs" input is refused, not expanded).
/// Throws ParseError "<source>:<line>: YAML syntax error: <libyaml's problem> ..." (1-based line).
std::vector<Node> parse_all(const std::string& text, const std::string& source, int64_t max_nodes = 100000);

/// The node in YAML flow style, for one-line display: scalars as written ("a", "5"), quoted
/// (JSON-style double quotes) when not plain; sequences "[a, b]", maps "{k: v}".
std::string to_flow(const Node& n);

}  // namespace qlora::yaml
