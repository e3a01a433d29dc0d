// qlora-cpp: safetensors reading (mmap, single file or sharded directory) and writing. Torch-free.
//
// Format (https://github.com/huggingface/safetensors, README "Format"): 8 bytes little-endian u64 N,
// then N bytes of UTF-8 JSON header {"name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]},
// "__metadata__": {str: str}}, then the data buffer; offsets are relative to the buffer start.
// Every file is treated as untrusted: the header is bounds-checked before any byte is used.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace qlora::st {

/// Element types of the safetensors format that qlora-cpp reads and writes.
enum class DType { BOOL, U8, I8, I16, I32, I64, F16, BF16, F32, F64 };

/// Bytes per element of `d`.
size_t dtype_size(DType d);
/// Format spelling ("F32", "BF16", ...).
const char* dtype_name(DType d);
/// Parses a format spelling; returns false for an unknown one.
bool parse_dtype(const std::string& s, DType* out);

/// One tensor's header entry. `begin`/`end` are byte offsets into the data buffer.
struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

/// A read-only view of a whole file through mmap (private copy-on-write mapping, so a zero-copy
/// tensor that is written to never changes the file). Throws qlora::Error naming the path.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

/// Largest header accepted, in bytes (the reference implementation's limit).
constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;

/// One validated .safetensors file. Construction checks: file ≥ 8 bytes; header length ≤ 100 MB
/// and inside the file; header is a JSON object without duplicate names; each entry has a known
/// dtype, a shape of non-negative integers, data_offsets [begin, end] with begin ≤ end ≤ buffer size
/// and end − begin = numel × dtype size; entries do not overlap; `__metadata__` maps strings to
/// strings. Any violation throws qlora::Error "<path>: tensor '<name>': <problem>".
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return file_->path(); }
  /// Tensors in file order of their data offsets.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  /// Throws qlora::Error when `name` is not in the file.
  const TensorInfo& info(const std::string& name) const;
  /// Pointer to the first byte of the tensor's data inside the mapping (valid while mapping() lives).
  const uint8_t* data(const TensorInfo& t) const { return buffer_ + t.begin; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The mapping, shared so zero-copy views can keep it alive.
  std::shared_ptr<MappedFile> mapping() const { return file_; }

 private:
  std::shared_ptr<MappedFile> file_;
  const uint8_t* buffer_ = nullptr;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

/// What a model directory without safetensors weights holds instead, as the hint its error gives:
/// "pytorch_model.bin is a pickle checkpoint, which is not read: save the model as safetensors
/// (...)" for a pytorch_model*.bin, "m.gguf is a GGUF file: qlora import-gguf ... --out DIR" for
/// a .gguf; "" when there is neither. Never throws but std::bad_alloc.
std::string other_weights_hint(const std::string& dir);

/// A checkpoint directory: `model.safetensors`, or shards listed by `model.safetensors.index.json`
/// (`weight_map`: tensor name → shard file). Every shard is mapped at open (a mapping costs address
/// space, not memory) and validated as SafetensorsFile is. Throws qlora::Error for a missing directory or file, a malformed
/// index, a shard named outside the directory, a tensor the index names but its shard lacks, or a
/// name present in two shards.
class SafetensorsCheckpoint {
 public:
  explicit SafetensorsCheckpoint(const std::string& dir,
                                 const std::string& stem = "model.safetensors");
  /// True when `dir` holds what the constructor opens: `stem` or `stem`.index.json (whether they
  /// are valid is the constructor's to say). Never throws.
  static bool present_in(const std::string& dir, const std::string& stem = "model.safetensors");
  /// All tensor names, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const SafetensorsFile& file_of(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const { return file_of(name).info(name); }
  size_t num_shards() const { return files_.size(); }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;
};

/// A tensor to write: raw little-endian bytes of `nbytes` = numel × dtype_size.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

/// Writes a .safetensors file atomically (temporary file, fsync, rename, fsync of the directory):
/// on any failure the previous file at `path` is untouched. Tensors are laid out in the given order;
/// the header is padded with spaces so the data buffer starts 8-byte aligned.
/// Throws qlora::Error on duplicate names, a size mismatch, or an I/O error (naming the path).
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace qlora::st
