// qlora-cpp: GGUF file reader (versions 2 and 3, little-endian). Torch-free.
//
// Format (ggml docs/gguf.md, ggml/src/gguf.cpp gguf_init_from_file_impl; gguf-py gguf_reader.py):
//   u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv × { string key | u32 value type | value }       string = u64 length + UTF-8 bytes
//        value types 0 u8 1 i8 2 u16 3 i16 4 u32 5 i32 6 f32 7 bool 8 string 9 array 10 u64 11 i64
//        12 f64; an array is u32 element type + u64 count + elements (arrays of arrays refused)
//   n_tensors × { string name | u32 n_dims (1..4) | u64 ne[n_dims] (ne[0] = row length, fastest) |
//                 u32 ggml type | u64 offset (relative to the data section, aligned) }
//   padding to `general.alignment` (u32 power of two, default 32) | data section
// Every file is untrusted: counts, lengths, sizes and offsets are checked against the bytes that are
// there before anything is allocated or read; tensors must lie inside the data section, be aligned
// and not overlap. Every error is a qlora::Error "<path>: <key or tensor '<name>'>: <problem>".
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/gguf_types.h"
#include "common/safetensors.h"  // st::MappedFile

namespace qlora::gguf {

/// Metadata value types (gguf_type).
enum class ValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
/// "UINT32", "STRING", ...
const char* value_type_name(ValueType t);

/// One metadata value. Scalars: integers (and bool) in `i` (`u` for UINT64), floats in `f`,
/// strings in `s`. Arrays: `elem` is the element type and exactly one of `strings`, `ints`,
/// `floats` holds the elements (integers and bools in `ints`, UINT64 values reinterpreted).
struct Value {
  ValueType type = ValueType::UINT8;
  ValueType elem = ValueType::UINT8;
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  std::string s;
  std::vector<std::string> strings;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  /// Number of array elements (0 for a scalar).
  uint64_t count() const;
  bool is_integer() const;  ///< scalar of an integer type (not bool)
};

/// One tensor info. `ne` in ggml order (ne[0] = the contiguous row); `shape()` is the row-major
/// (PyTorch/HF) order, i.e. ne reversed. `offset` is relative to the data section.
struct TensorInfo {
  std::string name;
  std::vector<int64_t> ne;
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;
  uint64_t nbytes = 0;
  int64_t numel() const;
  std::vector<int64_t> shape() const { return {ne.rbegin(), ne.rend()}; }
};

/// Limits beyond which a file is refused as malformed (far above any real model).
constexpr uint64_t kMaxStringBytes = 1ull << 30;   ///< one string
constexpr uint64_t kMaxTensors = 1ull << 20;       ///< tensor infos
constexpr uint64_t kMaxKeys = 1ull << 20;          ///< metadata keys

/// A validated GGUF file mapped read-only. Construction parses and checks everything:
/// magic "GGUF"; version 2 or 3 (1 and big-endian files refused by name); n_tensors ≤ 2^20 and
/// n_kv ≤ 2^20 and each fits in the remaining bytes; strings ≤ 1 GiB inside the file and valid
/// lengths; known value types; no duplicate keys or tensor names; general.alignment a u32 power of
/// two; tensors with 1..4 dims, each ≥ 0, numel < 2^62, a known ggml type, ne[0] a multiple of its
/// block size, offset aligned, data inside the file, no two tensors overlapping.
/// Throws qlora::Error "<path>: ..." naming the key or tensor.
class GgufFile {
 public:
  explicit GgufFile(const std::string& path);

  const std::string& path() const { return file_->path(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  /// Byte offset of the data section in the file.
  uint64_t data_offset() const { return data_offset_; }

  /// Metadata in file order of keys (std::map: sorted by key).
  const std::map<std::string, Value>& metadata() const { return kv_; }
  const Value* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }
  /// Typed accessors; each throws "<path>: metadata key '<key>': missing" or "...: expected <what>,
  /// got <type>" (a negative value for get_uint, a non-integer for the integer getters).
  uint64_t get_uint(const std::string& key) const;
  double get_float(const std::string& key) const;  ///< FLOAT32/FLOAT64 (or an integer type)
  bool get_bool(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;
  const std::vector<std::string>& get_string_array(const std::string& key) const;
  const std::vector<int64_t>& get_int_array(const std::string& key) const;
  /// ARRAY of FLOAT32/FLOAT64 (e.g. tokenizer.ggml.scores), as doubles holding the stored values exactly.
  const std::vector<double>& get_float_array(const std::string& key) const;

  /// Tensors in file (info) order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(const std::string& name) const;
  /// First byte of a tensor's data in the mapping (valid while this object lives).
  const uint8_t* data(const TensorInfo& t) const { return file_->data() + data_offset_ + t.offset; }
  /// Drops the mapping's resident pages of `t` (madvise DONTNEED): streaming readers keep their
  /// peak RSS bounded by what they process at once. The data stay readable (re-read on access).
  void release(const TensorInfo& t) const;

 private:
  std::shared_ptr<st::MappedFile> file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, Value> kv_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
};

/// True when `path` is a regular file whose first 4 bytes are GGUF's magic "GGUF" (any name: Ollama
/// keeps models as blobs/sha256-<hex>). Reads at most 4 bytes; throws nothing.
bool has_gguf_magic(const std::string& path);

/// "" or what to do for a GGUF given where a Hugging Face model directory is needed (generate,
/// inspect, merge, tokenize, train's model.path): for such a file "<path> is a GGUF file (llama.cpp
/// / Ollama), not a Hugging Face model directory: import it first: qlora import-gguf <path> --out
/// DIR"; for a directory holding *.gguf files but no config.json (a GGUF repo as TheBloke or
/// bartowski publish them) "; it holds the GGUF file <name> [(and N more)]: import it first: ...".
/// Throws nothing.
std::string gguf_instead_of_model_dir(const std::string& path);

}  // namespace qlora::gguf
