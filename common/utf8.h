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

/// True when `s` is valid UTF-8 (first_invalid_utf8 finds nothing).
inline bool is_valid_utf8(const std::string& s) { return first_invalid_utf8(s) == std::string::npos; }

}  // namespace qlora
