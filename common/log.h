// qlora-cpp logging: a thin façade over spdlog, so translation units that include torch (which
// ships its own, newer fmt headers) never include spdlog's fmt. Messages are concatenated with
// operator<<: log::info("step ", step, " loss ", loss).
#pragma once
#include <sstream>
#include <string>

namespace qlora::log {

enum class Level { debug, info, warn, error };

/// Sets the threshold and the pattern "[YYYY-MM-DD HH:MM:SSZ] message" (UTC) on stderr (a warning's message reads
/// "warning: message": the pattern shows no level).
void setup(Level level);
/// Writes one line at `level` (spdlog's default logger, stderr).
void write(Level level, const std::string& msg);

template <typename... A>
std::string cat(const A&... a) {
  std::ostringstream os;
  (os << ... << a);
  return os.str();
}
template <typename... A> void debug(const A&... a) { write(Level::debug, cat(a...)); }
template <typename... A> void info(const A&... a) { write(Level::info, cat(a...)); }
template <typename... A> void warn(const A&... a) { write(Level::warn, cat(a...)); }
template <typename... A> void error(const A&... a) { write(Level::error, cat(a...)); }

}  // namespace qlora::log
