// qlora-cpp: this process's memory as the kernel reports it in /proc/self/status (Linux; torch-free).
#pragma once
#include <cstdint>
#include <string>

namespace qlora {

/// A "Key:   1234 kB" line of /proc/self/status in bytes (e.g. key "VmRSS", "VmHWM"); 0 when the
/// file or the key is absent (not Linux).
int64_t proc_status_bytes(const std::string& key);

/// This process's peak resident set (VmHWM) in bytes; 0 when unavailable.
inline int64_t peak_rss_bytes() { return proc_status_bytes("VmHWM"); }

/// This process's resident set (VmRSS) in bytes; 0 when unavailable.
inline int64_t rss_bytes() { return proc_status_bytes("VmRSS"); }

}  // namespace qlora
