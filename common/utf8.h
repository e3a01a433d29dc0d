// qlora-cpp: UTF-8 validation, one definition for every reader of untrusted text (configs,
// datasets, tokenizer files), on utf8proc's decoder (utf8proc_iterate).
#pragma once
#include <cstddef>
#include <string>

namespace qlora {

/// Byte offset of the first byte of `s` that does not start a valid UTF-8 sequence, or
/// std::string::npos. Invalid: stray continuation bytes, truncated sequences, overlong forms,
/// surrogates (U+D800..U+DFFF) and code points above U+10FFFF (Unicode 15, 3.9, table 3-7).
size_t first_invalid_utf8(const std::string& s);

/// Byte length (1..4) of the UTF-8 sequence whose lead byte is `c`, from the lead byte alone
/// (RFC 3629 §3); 1 for a byte that cannot start one (ASCII counts 1 too). Callers bound it by
/// the bytes left.
inline size_t utf8_sequence_length(unsigned char c) {
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 1;
}

/// Throws qlora::Error "<what>: invalid UTF-8 at byte offset N" (N: first_invalid_utf8) unless
/// `s` is valid UTF-8: the check for text given on the command line (tokenize --text, generate
/// --prompt / --system / --stop), which the tokenizers would otherwise see as U+FFFD.
void require_utf8(const std::string& s, const std::string& what);

/// True when `s` is valid UTF-8 (first_invalid_utf8 finds nothing).
inline bool is_valid_utf8(const std::string& s) { return first_invalid_utf8(s) == std::string::npos; }

}  // namespace qlora
