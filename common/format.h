// qlora-cpp: human-readable quantities and names for reports, logs and messages (torch-free).
#pragma once
#include <ctime>
#include <string>
#include <vector>

namespace qlora {

/// `bytes` in binary units, "1.23 GiB" style: B (no decimals), KiB, MiB, GiB, TiB (two decimals),
/// the largest unit not above |bytes| (TiB at most); a negative value keeps its sign ("-2.00 KiB").
std::string human_bytes(double bytes);

/// `t` (seconds since the Unix epoch; default: now) in UTC, formatted by std::strftime's `format`,
/// e.g. "%Y-%m-%dT%H:%M:%SZ" -> "2026-12-03T15:20:00Z" (ISO 8601, for JSON) or "%Y%m%dT%H%M%SZ"
/// (run ids). The result must fit 63 bytes; longer output comes back empty (strftime's limit).
/// Never throws but std::bad_alloc.
std::string utc_time(const char* format, std::time_t t = std::time(nullptr));

/// The first line of `s` (all of it when it has no newline): an exception's message for a one-line
/// error, as c10::Error's what() carries a backtrace after its first line.
inline std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

/// The candidate nearest `word` when it is near enough to be a likely typo, else "": the optimal
/// string alignment distance (Levenshtein plus adjacent transpositions, each edit 1) at most
/// max(2, |word| / 3) characters; ties go to the earlier candidate. For "did you mean" hints
/// (config keys and values, command names). Never throws but std::bad_alloc.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace qlora
