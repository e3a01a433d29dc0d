// qlora-cpp: streaming safetensors writer (torch-free): one tensor in memory at a time.
// Same format, checks and atomicity as write_safetensors (common/safetensors.h), which is this
// function with every tensor already in memory.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/safetensors.h"

namespace qlora::st {

/// Writes `path` atomically (temporary file, fsync, rename, fsync of the directory). The header is
/// built from `tensors` (their `data` is ignored); then tensor i's bytes are requested with
/// `fill(i)`, in order, and written at once, so only one tensor needs to exist in memory at a time.
/// `fill(i)` returns a pointer to tensors[i].nbytes bytes that stays valid until the next call; it
/// may throw, and then the temporary file is removed and `path` is untouched.
/// Throws qlora::Error on duplicate names, a size mismatch, or an I/O error (naming the path).
void write_safetensors_streaming(const std::string& path, const std::vector<TensorToWrite>& tensors,
                                 const std::function<const void*(size_t)>& fill,
                                 const std::map<std::string, std::string>& metadata = {});

}  // namespace qlora::st
