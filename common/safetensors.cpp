#include "common/safetensors.h"
#include "common/safetensors_stream.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.h"
#include "common/json_file.h"
#include "common/files.h"

namespace qlora::st {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
struct DTypeEntry {
  DType d;
  const char* name;
  size_t size;
};
constexpr DTypeEntry kDTypes[] = {
    {DType::BOOL, "BOOL", 1}, {DType::U8, "U8", 1},   {DType::I8, "I8", 1},
    {DType::I16, "I16", 2},   {DType::I32, "I32", 4}, {DType::I64, "I64", 8},
    {DType::F16, "F16", 2},   {DType::BF16, "BF16", 2}, {DType::F32, "F32", 4},
    {DType::F64, "F64", 8},
};
}  // namespace

size_t dtype_size(DType d) {
  for (const auto& e : kDTypes)
    if (e.d == d) return e.size;
  return 0;
}

const char* dtype_name(DType d) {
  for (const auto& e : kDTypes)
    if (e.d == d) return e.name;
  return "?";
}

bool parse_dtype(const std::string& s, DType* out) {
  for (const auto& e : kDTypes)
    if (s == e.name) {
      *out = e.d;
      return true;
    }
  return false;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------------------------------------
MappedFile::MappedFile(const std::string& path) : path_(path) {
  check_regular_file(path);  // before open(2): a FIFO would block it
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK);
  if (fd < 0) fail(path, ": cannot open: ", std::strerror(errno));
  struct stat sb {};
  if (::fstat(fd, &sb) != 0) {
    int err = errno;
    ::close(fd);
    fail(path, ": cannot stat: ", std::strerror(err));
  }
  if (!S_ISREG(sb.st_mode)) {
    ::close(fd);
    fail(path, ": not a regular file");
  }
  size_ = static_cast<size_t>(sb.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      fail(path, ": cannot mmap: ", std::strerror(err));
    }
    data_ = static_cast<uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
}

// ---------------------------------------------------------------------------------------------
namespace {

// Multiplies with an overflow check against the buffer-size bound (all sizes stay below 2^63).
bool mul_ok(uint64_t a, uint64_t b, uint64_t* out) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) return false;
  *out = a * b;
  return true;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path)
    : file_(std::make_shared<MappedFile>(path)) {
  const uint8_t* base = file_->data();
  const uint64_t size = file_->size();
  check_not_git_lfs_pointer({reinterpret_cast<const char*>(base), static_cast<size_t>(std::min<uint64_t>(size, 64))}, path,
                            "safetensors file");
  QLORA_CHECK(size >= 8, path, ": not a safetensors file: ", size,
              " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | base[i];  // little-endian u64
  QLORA_CHECK(n <= kMaxHeaderBytes, path, ": header length ", n, " bytes exceeds the ",
              kMaxHeaderBytes, "-byte limit");
  QLORA_CHECK(n <= size - 8, path, ": header length ", n, " bytes runs past the end of the file (",
              size, " bytes)");
  QLORA_CHECK(n >= 2 && base[8] == '{', path, ": header is not a JSON object");
  const char* hbeg = reinterpret_cast<const char*>(base + 8);

  // Parse, rejecting duplicate keys in the top-level object (nlohmann would keep the last silently).
  std::set<std::string> seen;
  std::string dup;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::key && depth == 1) {
      const std::string k = parsed.get<std::string>();
      if (!seen.insert(k).second && dup.empty()) dup = k;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(hbeg, hbeg + n, cb);
  } catch (const json::exception& e) {
    fail(path, ": header is not valid JSON: ", e.what());
  }
  QLORA_CHECK(dup.empty(), path, ": tensor '", dup, "': duplicate name in header");
  QLORA_CHECK(header.is_object(), path, ": header is not a JSON object");

  buffer_ = base + 8 + n;
  const uint64_t buf_size = size - 8 - n;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      QLORA_CHECK(v.is_object(), path, ": __metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        QLORA_CHECK(m.value().is_string(), path, ": __metadata__ '", m.key(),
                    "': value is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) { fail(path, ": tensor '", name, "': ", what); };
    if (!v.is_object()) bad("entry is not an object");
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) bad("missing or non-string 'dtype'");
    if (sh == v.end() || !sh->is_array()) bad("missing or non-array 'shape'");
    if (off == v.end() || !off->is_array() || off->size() != 2) bad("'data_offsets' is not [begin, end]");
    TensorInfo t;
    t.name = name;
    if (!parse_dtype(dt->get<std::string>(), &t.dtype))
      bad("unknown dtype '" + dt->get<std::string>() + "'");
    uint64_t numel = 1;
    for (const json& d : *sh) {
      if (!d.is_number_unsigned()) bad("shape has a non-integer or negative dimension");
      const uint64_t dim = d.get<uint64_t>();
      if (!mul_ok(numel, dim, &numel) || numel > (uint64_t{1} << 62)) bad("shape overflows");
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    for (const json& o : *off)
      if (!o.is_number_unsigned()) bad("'data_offsets' has a non-integer or negative value");
    t.begin = (*off)[0].get<uint64_t>();
    t.end = (*off)[1].get<uint64_t>();
    if (t.begin > t.end) bad("data_offsets begin " + std::to_string(t.begin) + " > end " + std::to_string(t.end));
    if (t.end > buf_size)
      bad("data_offsets end " + std::to_string(t.end) + " is past the data buffer (" +
          std::to_string(buf_size) + " bytes)");
    uint64_t expect = 0;
    if (!mul_ok(numel, dtype_size(t.dtype), &expect) || expect != t.end - t.begin)
      bad("byte size " + std::to_string(t.end - t.begin) + " != numel " + std::to_string(numel) +
          " x " + std::to_string(dtype_size(t.dtype)) + " bytes (" + dtype_name(t.dtype) + ")");
    tensors_.push_back(std::move(t));
  }
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < tensors_.size(); ++i) {
    const TensorInfo& p = tensors_[i - 1];
    const TensorInfo& c = tensors_[i];
    // Zero-byte tensors may share an offset with anything.
    if (c.begin < p.end && c.nbytes() > 0 && p.nbytes() > 0)
      fail(path, ": tensor '", c.name, "': data overlaps tensor '", p.name, "'");
  }
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) fail(path(), ": no tensor named '", name, "'");
  return tensors_[it->second];
}

// ---------------------------------------------------------------------------------------------
bool SafetensorsCheckpoint::present_in(const std::string& dir, const std::string& stem) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / stem, ec) || fs::exists(fs::path(dir) / (stem + ".index.json"), ec);
}

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string& dir, const std::string& stem)
    : dir_(dir) {
  QLORA_CHECK(fs::is_directory(dir), dir, ": not a directory");
  const fs::path index = fs::path(dir) / (stem + ".index.json");
  const fs::path single = fs::path(dir) / stem;
  if (fs::exists(index)) {
    const json j = read_json_object_file(index.string());
    auto wm = j.find("weight_map");
    QLORA_CHECK(wm != j.end() && wm->is_object(), index.string(),
                ": missing object 'weight_map'");
    std::map<std::string, size_t> shard_idx;
    std::map<std::string, std::string> wanted;  // tensor -> shard
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      QLORA_CHECK(it.value().is_string(), index.string(), ": weight_map['", it.key(),
                  "'] is not a string");
      const std::string shard = it.value().get<std::string>();
      QLORA_CHECK(!shard.empty() && shard.find('/') == std::string::npos && shard != "." &&
                      shard != "..",
                  index.string(), ": weight_map['", it.key(), "'] names '", shard,
                  "', which is not a file in this directory");
      wanted[it.key()] = shard;
      if (!shard_idx.count(shard)) {
        shard_idx[shard] = files_.size();
        files_.push_back(std::make_unique<SafetensorsFile>((fs::path(dir) / shard).string()));
      }
    }
    for (const auto& [name, shard] : wanted) {
      const SafetensorsFile& f = *files_[shard_idx[shard]];
      QLORA_CHECK(f.contains(name), index.string(), ": tensor '", name, "' is mapped to ", shard,
                  ", which does not contain it");
      where_[name] = shard_idx[shard];
    }
    for (size_t i = 0; i < files_.size(); ++i)
      for (const TensorInfo& t : files_[i]->tensors()) {
        auto it = where_.find(t.name);
        QLORA_CHECK(it == where_.end() || it->second == i, files_[i]->path(), ": tensor '",
                    t.name, "' also appears in ", files_[it->second]->path());
        where_[t.name] = i;
      }
  } else if (fs::exists(single)) {
    files_.push_back(std::make_unique<SafetensorsFile>(single.string()));
    for (const TensorInfo& t : files_[0]->tensors()) where_[t.name] = 0;
  } else {
    const std::string hint = stem == "model.safetensors" ? other_weights_hint(dir) : "";
    fail(dir, ": no ", stem, " or ", stem, ".index.json", hint.empty() ? "" : " (" + hint + ")");
  }
}

std::string other_weights_hint(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("pytorch_model", 0) == 0)
      return name + " is a pickle checkpoint, which is not read: save the model as safetensors "
                    "(transformers: model.save_pretrained(dir), safetensors is its default)";
    if (e.path().extension() == ".gguf")
      return name + " is a GGUF file: qlora import-gguf " + e.path().string() + " --out DIR, then use DIR";
  }
  return "";
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& kv : where_) out.push_back(kv.first);
  return out;
}

const SafetensorsFile& SafetensorsCheckpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) fail(dir_, ": no tensor named '", name, "' in the checkpoint");
  return *files_[it->second];
}

// ---------------------------------------------------------------------------------------------
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_safetensors_streaming(
      path, tensors, [&](size_t i) { return tensors[i].data; }, metadata);
}

void write_safetensors_streaming(const std::string& path, const std::vector<TensorToWrite>& tensors,
                                 const std::function<const void*(size_t)>& fill,
                                 const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const TensorToWrite& t : tensors) {
    QLORA_CHECK(!header.contains(t.name) && t.name != "__metadata__", path, ": tensor '", t.name,
                "': duplicate name");
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      QLORA_CHECK(d >= 0, path, ": tensor '", t.name, "': negative dimension");
      numel *= static_cast<uint64_t>(d);
    }
    QLORA_CHECK(numel * dtype_size(t.dtype) == t.nbytes, path, ": tensor '", t.name, "': ",
                t.nbytes, " bytes given, shape needs ", numel * dtype_size(t.dtype));
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape},
                      {"data_offsets", {off, off + t.nbytes}}};
    off += t.nbytes;
  }
  std::string h = header.dump();
  h.append((8 - (h.size() % 8)) % 8, ' ');  // buffer starts 8-byte aligned
  atomic_write(path, [&](std::FILE* f) {
    uint8_t len[8];
    uint64_t n = h.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
    bool ok = std::fwrite(len, 1, 8, f) == 8 && std::fwrite(h.data(), 1, h.size(), f) == h.size();
    QLORA_CHECK(ok, "cannot write ", path, ": ", std::strerror(errno));
    for (size_t i = 0; i < tensors.size(); ++i) {
      const TensorToWrite& t = tensors[i];
      const void* data = fill(i);
      ok = t.nbytes == 0 || std::fwrite(data, 1, t.nbytes, f) == t.nbytes;
      QLORA_CHECK(ok, "cannot write ", path, ": ", std::strerror(errno));
    }
  });
}

}  // namespace qlora::st
