// qlora-cpp: human-readable quantities for reports and logs (torch-free).
#pragma once
#include <string>

namespace qlora {

/// `bytes` in binary units, "1.23 GiB" style: B (no decimals), KiB, MiB, GiB, TiB (two decimals),
/// the largest unit not above |bytes| (TiB at most); a negative value keeps its sign ("-2.00 KiB").
std::string human_bytes(double bytes);

}  // namespace qlora
