#include "common/gguf.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "common/error.h"
#include "common/files.h"

namespace qlora::gguf {
namespace {

// Bytes of one scalar of type t (0 for STRING/ARRAY/unknown).
uint64_t scalar_size(uint32_t t) {
  switch (static_cast<ValueType>(t)) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::BOOL: return 1;
    case ValueType::UINT16: case ValueType::INT16: return 2;
    case ValueType::UINT32: case ValueType::INT32: case ValueType::FLOAT32: return 4;
    case ValueType::UINT64: case ValueType::INT64: case ValueType::FLOAT64: return 8;
    default: return 0;
  }
}

bool known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::FLOAT64); }

// What a read past the end most often means (an interrupted `ollama pull` / download).
constexpr const char* kCutShort = "; the file is cut short (an interrupted download?): fetch it again";

// A bounds-checked little-endian reader over the mapping. `where` names what is being read for
// the error message ("metadata key 'x'", "tensor 'w'"); every read past the end throws.
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* data, uint64_t size)
      : path_(path), data_(data), size_(size) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  void need(uint64_t n, const std::string& where, const char* what) const {
    QLORA_CHECK(n <= left(), path_, ": ", where, ": ", what, " (", n, " bytes at offset ", pos_,
                ") runs past the end of the file (", size_, " bytes)", kCutShort);
  }
  template <typename T>
  T read(const std::string& where, const char* what) {
    need(sizeof(T), where, what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));  // GGUF v2/v3 as read here: little-endian host
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const std::string& where, const char* what) {
    const uint64_t n = read<uint64_t>(where, what);
    QLORA_CHECK(n <= kMaxStringBytes, path_, ": ", where, ": ", what, " length ", n,
                " exceeds the ", kMaxStringBytes, "-byte limit");
    need(n, where, what);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }

 private:
  const std::string& path_;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

int64_t read_int(Cursor& c, uint32_t t, const std::string& where, uint64_t* u) {
  *u = 0;
  switch (static_cast<ValueType>(t)) {
    case ValueType::UINT8: return c.read<uint8_t>(where, "value");
    case ValueType::INT8: return c.read<int8_t>(where, "value");
    case ValueType::BOOL: return c.read<uint8_t>(where, "value");
    case ValueType::UINT16: return c.read<uint16_t>(where, "value");
    case ValueType::INT16: return c.read<int16_t>(where, "value");
    case ValueType::UINT32: return c.read<uint32_t>(where, "value");
    case ValueType::INT32: return c.read<int32_t>(where, "value");
    case ValueType::INT64: return c.read<int64_t>(where, "value");
    case ValueType::UINT64: *u = c.read<uint64_t>(where, "value"); return static_cast<int64_t>(*u);
    default: return 0;
  }
}

double read_float(Cursor& c, uint32_t t, const std::string& where) {
  if (static_cast<ValueType>(t) == ValueType::FLOAT32) return c.read<float>(where, "value");
  return c.read<double>(where, "value");
}

bool is_float(uint32_t t) {
  return t == static_cast<uint32_t>(ValueType::FLOAT32) || t == static_cast<uint32_t>(ValueType::FLOAT64);
}

}  // namespace

const char* value_type_name(ValueType t) {
  static const char* kNames[] = {"UINT8", "INT8",   "UINT16", "INT16",  "UINT32", "INT32", "FLOAT32",
                                 "BOOL",  "STRING", "ARRAY",  "UINT64", "INT64",  "FLOAT64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? kNames[i] : "?";
}

uint64_t Value::count() const {
  if (type != ValueType::ARRAY) return 0;
  return elem == ValueType::STRING ? strings.size() : is_float(static_cast<uint32_t>(elem)) ? floats.size() : ints.size();
}

bool Value::is_integer() const {
  return type != ValueType::BOOL && scalar_size(static_cast<uint32_t>(type)) > 0 &&
         !is_float(static_cast<uint32_t>(type));
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

// ---------------------------------------------------------------------------------------------
GgufFile::GgufFile(const std::string& path) : file_(std::make_shared<st::MappedFile>(path)) {
  Cursor c(file_->path(), file_->data(), file_->size());
  const std::string hdr = "header";
  QLORA_CHECK(file_->size() >= 4, path, ": not a GGUF file: ", file_->size(),
              " bytes, shorter than the 4-byte magic");
  if (std::memcmp(file_->data(), "GGUF", 4) != 0) {
    check_not_git_lfs_pointer({reinterpret_cast<const char*>(file_->data()), std::min<size_t>(file_->size(), 64)}, path,
                              "GGUF file");
    // the bytes found, printable ones as themselves, and what the common ones are
    const std::string magic(reinterpret_cast<const char*>(file_->data()), 4);
    std::string shown;
    for (const unsigned char ch : magic) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", ch);
      shown += ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\' ? std::string(1, static_cast<char>(ch)) : hex;
    }
    const bool ggml = magic == "tjgg" || magic == "fmgg" || magic == "lmgg";  // GGJT / GGMF / GGML, little-endian
    const bool html = magic == "<!DO" || magic == "<!do" || magic == "<htm" || magic == "<HTM";
    fail(path, ": not a GGUF file: bad magic \"", shown, "\" (expected \"GGUF\")",
         ggml ? ": a pre-GGUF llama.cpp file (GGML / GGJT), which current llama.cpp no longer reads either; get the "
                "model's GGUF"
              : html ? ": an HTML page (a download that saved a web page, e.g. a login or error page?)" : "");
  }
  c.read<uint32_t>(hdr, "magic");
  version_ = c.read<uint32_t>(hdr, "version");
  if (version_ != 2 && version_ != 3) {
    if ((version_ & 0xffff) == 0 && version_ != 0)
      fail(path, ": big-endian GGUF files are not supported (version field ", version_, ")");
    fail(path, ": GGUF version ", version_, " is not supported (expected 2 or 3)");
  }
  const uint64_t n_tensors = c.read<uint64_t>(hdr, "tensor count");
  const uint64_t n_kv = c.read<uint64_t>(hdr, "metadata key count");
  // Minimal encoded sizes: a key/value is >= 8+4+1 bytes, a tensor info >= 8+4+8+4+8.
  QLORA_CHECK(n_kv <= kMaxKeys && n_kv <= c.left() / 13, path, ": metadata key count ", n_kv,
              " is impossible for a file of ", file_->size(), " bytes", kCutShort);
  QLORA_CHECK(n_tensors <= kMaxTensors && n_tensors <= c.left() / 32, path, ": tensor count ",
              n_tensors, " is impossible for a file of ", file_->size(), " bytes", kCutShort);

  for (uint64_t k = 0; k < n_kv; ++k) {
    const std::string entry = "metadata entry #" + std::to_string(k);
    std::string key = c.read_string(entry, "key");
    const std::string where = "metadata key '" + key + "'";
    QLORA_CHECK(!kv_.count(key), path, ": ", where, ": duplicate key");
    Value v;
    const uint32_t t = c.read<uint32_t>(where, "value type");
    QLORA_CHECK(known_value_type(t), path, ": ", where, ": unknown value type ", t);
    v.type = static_cast<ValueType>(t);
    if (v.type == ValueType::STRING) {
      v.s = c.read_string(where, "string");
    } else if (v.type == ValueType::ARRAY) {
      const uint32_t et = c.read<uint32_t>(where, "array element type");
      QLORA_CHECK(known_value_type(et), path, ": ", where, ": unknown array element type ", et);
      QLORA_CHECK(et != static_cast<uint32_t>(ValueType::ARRAY), path, ": ", where,
                  ": arrays of arrays are not supported");
      v.elem = static_cast<ValueType>(et);
      const uint64_t n = c.read<uint64_t>(where, "array length");
      const uint64_t min_elem = et == static_cast<uint32_t>(ValueType::STRING) ? 8 : scalar_size(et);
      QLORA_CHECK(n <= c.left() / min_elem, path, ": ", where, ": array length ", n,
                  " runs past the end of the file (", c.left(), " bytes left)", kCutShort);
      if (v.elem == ValueType::STRING) {
        v.strings.reserve(n);
        for (uint64_t i = 0; i < n; ++i) v.strings.push_back(c.read_string(where, "array string"));
      } else if (is_float(et)) {
        v.floats.reserve(n);
        for (uint64_t i = 0; i < n; ++i) v.floats.push_back(read_float(c, et, where));
      } else {
        v.ints.reserve(n);
        uint64_t u;
        for (uint64_t i = 0; i < n; ++i) v.ints.push_back(read_int(c, et, where, &u));
      }
    } else if (is_float(t)) {
      v.f = read_float(c, t, where);
    } else {
      v.i = read_int(c, t, where, &v.u);
      if (v.type != ValueType::UINT64) v.u = static_cast<uint64_t>(v.i);
      if (v.type == ValueType::BOOL)
        QLORA_CHECK(v.i == 0 || v.i == 1, path, ": ", where, ": bool value ", v.i, " is not 0 or 1");
    }
    kv_.emplace(std::move(key), std::move(v));
  }

  if (const Value* a = find("general.alignment")) {
    QLORA_CHECK(a->type == ValueType::UINT32, path, ": metadata key 'general.alignment': expected UINT32, got ",
                value_type_name(a->type));
    QLORA_CHECK(a->u > 0 && (a->u & (a->u - 1)) == 0, path,
                ": metadata key 'general.alignment': ", a->u, " is not a power of two");
    alignment_ = a->u;
  }

  tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    TensorInfo t;
    t.name = c.read_string("tensor info #" + std::to_string(k), "name");
    const std::string where = "tensor '" + t.name + "'";
    QLORA_CHECK(!index_.count(t.name), path, ": ", where, ": duplicate tensor name");
    const uint32_t nd = c.read<uint32_t>(where, "dimension count");
    QLORA_CHECK(nd >= 1 && nd <= 4, path, ": ", where, ": ", nd, " dimensions (expected 1..4)");
    uint64_t numel = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      const uint64_t ne = c.read<uint64_t>(where, "dimension");
      QLORA_CHECK(ne < (uint64_t{1} << 62) && (ne == 0 || numel <= (uint64_t{1} << 62) / ne), path,
                  ": ", where, ": shape overflows (dimension ", d, " = ", ne, ")");
      numel *= ne;
      t.ne.push_back(static_cast<int64_t>(ne));
    }
    const uint32_t ty = c.read<uint32_t>(where, "type");
    const GgmlTypeInfo* ti = ggml_type_info(ty);
    QLORA_CHECK(ti != nullptr, path, ": ", where, ": unknown ggml type ", ty);
    t.type = ti->type;
    QLORA_CHECK(t.ne[0] % ti->block == 0, path, ": ", where, ": row length ", t.ne[0],
                " is not a multiple of the ", ti->name, " block size ", ti->block);
    const uint64_t blocks = numel / static_cast<uint64_t>(ti->block);
    QLORA_CHECK(blocks <= file_->size() / static_cast<uint64_t>(ti->type_size), path, ": ", where, ": ",
                numel, " elements of ", ti->name, " do not fit in a file of ", file_->size(), " bytes");
    t.nbytes = blocks * static_cast<uint64_t>(ti->type_size);
    t.offset = c.read<uint64_t>(where, "data offset");
    QLORA_CHECK(t.offset % alignment_ == 0, path, ": ", where, ": data offset ", t.offset,
                " is not a multiple of the alignment ", alignment_);
    index_[t.name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }

  data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  const uint64_t data_size = data_offset_ <= file_->size() ? file_->size() - data_offset_ : 0;
  QLORA_CHECK(n_tensors == 0 || data_offset_ <= file_->size(), path, ": data section starts at ",
              data_offset_, ", past the end of the file (", file_->size(), " bytes)", kCutShort);
  for (const TensorInfo& t : tensors_)
    QLORA_CHECK(t.offset <= data_size && t.nbytes <= data_size - t.offset, path, ": tensor '",
                t.name, "': data [", t.offset, ", +", t.nbytes,
                ") runs past the end of the data section (", data_size, " bytes)", kCutShort);
  std::vector<const TensorInfo*> by_off;
  for (const TensorInfo& t : tensors_) by_off.push_back(&t);
  std::sort(by_off.begin(), by_off.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->offset != b->offset ? a->offset < b->offset : a->nbytes < b->nbytes;
  });
  for (size_t i = 1; i < by_off.size(); ++i) {
    const TensorInfo& p = *by_off[i - 1];
    const TensorInfo& q = *by_off[i];
    QLORA_CHECK(p.nbytes == 0 || q.nbytes == 0 || q.offset >= p.offset + p.nbytes, path,
                ": tensor '", q.name, "': data overlaps tensor '", p.name, "'");
  }
}

const Value* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

namespace {
const Value& must(const GgufFile& f, const std::string& key) {
  const Value* v = f.find(key);
  if (!v) fail(f.path(), ": metadata key '", key, "': missing");
  return *v;
}
[[noreturn]] void wrong(const GgufFile& f, const std::string& key, const char* want, const Value& v) {
  fail(f.path(), ": metadata key '", key, "': expected ", want, ", got ", value_type_name(v.type),
       v.type == ValueType::ARRAY ? std::string(" of ") + value_type_name(v.elem) : std::string());
}
}  // namespace

uint64_t GgufFile::get_uint(const std::string& key) const {
  const Value& v = must(*this, key);
  if (!v.is_integer()) wrong(*this, key, "an unsigned integer", v);
  if (v.type != ValueType::UINT64 && v.i < 0)
    fail(path(), ": metadata key '", key, "': negative value ", v.i);
  return v.u;
}

double GgufFile::get_float(const std::string& key) const {
  const Value& v = must(*this, key);
  if (is_float(static_cast<uint32_t>(v.type))) return v.f;
  if (v.is_integer()) return static_cast<double>(v.i);
  wrong(*this, key, "a number", v);
}

bool GgufFile::get_bool(const std::string& key) const {
  const Value& v = must(*this, key);
  if (v.type != ValueType::BOOL) wrong(*this, key, "BOOL", v);
  return v.i != 0;
}

const std::string& GgufFile::get_string(const std::string& key) const {
  const Value& v = must(*this, key);
  if (v.type != ValueType::STRING) wrong(*this, key, "STRING", v);
  return v.s;
}

const std::vector<std::string>& GgufFile::get_string_array(const std::string& key) const {
  const Value& v = must(*this, key);
  if (v.type != ValueType::ARRAY || v.elem != ValueType::STRING) wrong(*this, key, "ARRAY of STRING", v);
  return v.strings;
}

const std::vector<int64_t>& GgufFile::get_int_array(const std::string& key) const {
  const Value& v = must(*this, key);
  if (v.type != ValueType::ARRAY || v.elem == ValueType::STRING || is_float(static_cast<uint32_t>(v.elem)))
    wrong(*this, key, "ARRAY of integers", v);
  return v.ints;
}

const std::vector<double>& GgufFile::get_float_array(const std::string& key) const {
  const Value& v = must(*this, key);
  if (v.type != ValueType::ARRAY || !is_float(static_cast<uint32_t>(v.elem))) wrong(*this, key, "ARRAY of floats", v);
  return v.floats;
}

const TensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void GgufFile::release(const TensorInfo& t) const {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(data(t));
  const uintptr_t lo = (begin + page - 1) / page * page;  // whole pages inside the tensor only
  const uintptr_t hi = (begin + t.nbytes) / page * page;
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

bool has_gguf_magic(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

std::string gguf_instead_of_model_dir(const std::string& path) {
  namespace fs = std::filesystem;
  if (has_gguf_magic(path))
    return path + " is a GGUF file (llama.cpp / Ollama), not a Hugging Face model directory: import it first: qlora "
                  "import-gguf " + path + " --out DIR";
  std::error_code ec;
  if (!fs::is_directory(path, ec) || fs::exists(fs::path(path) / "config.json", ec)) return "";
  std::vector<std::string> found;
  for (const fs::directory_entry& e : fs::directory_iterator(path, ec))
    if (has_gguf_magic(e.path().string())) found.push_back(e.path().filename().string());
  if (found.empty()) return "";
  std::sort(found.begin(), found.end());
  return "; it holds the GGUF file " + found[0] +
         (found.size() > 1 ? " (and " + std::to_string(found.size() - 1) + " more)" : std::string()) +
         ": import it first: qlora import-gguf " + (fs::path(path) / found[0]).string() + " --out DIR";
}

}  // namespace qlora::gguf
