#include "common/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include "common/error.h"

namespace qlora {
namespace fs = std::filesystem;

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) fail("cannot open directory ", dir, ": ", std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) fail("cannot fsync directory ", dir, ": ", std::strerror(err));
}

void atomic_write(const std::string& path, const std::function<void(std::FILE*)>& write) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("cannot write ", path, ": ", std::strerror(errno));
  try {
    write(f);
    if (std::fflush(f) != 0 || ::fsync(fileno(f)) != 0)
      fail("cannot write ", path, ": ", std::strerror(errno));
    if (std::fclose(f) != 0) {
      f = nullptr;
      fail("cannot write ", path, ": ", std::strerror(errno));
    }
    f = nullptr;
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      fail("cannot rename ", tmp, " to ", path, ": ", std::strerror(errno));
  } catch (...) {
    if (f) std::fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
  fsync_dir(fs::path(path).parent_path().string());
}

void atomic_write_string(const std::string& path, const std::string& bytes) {
  atomic_write(path, [&](std::FILE* f) {
    if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size())
      fail("cannot write ", path, ": ", std::strerror(errno));
  });
}

void check_can_create(const std::string& path, const std::string& what) {
  std::error_code ec;
  QLORA_CHECK(!fs::is_directory(path, ec), what, " ", path, ": cannot write there: it is a directory");
  fs::path dir = fs::path(path).parent_path();
  while (!dir.empty() && !fs::exists(dir, ec)) dir = dir.parent_path();
  if (dir.empty()) dir = ".";
  QLORA_CHECK(fs::is_directory(dir, ec), what, " ", path, ": cannot write there: ", dir.string(), " is not a directory");
  QLORA_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, what, " ", path, ": cannot write there: ", dir.string(), ": ",
              std::strerror(errno));
}

std::string relative_path_note(const std::string& path) {
  if (path.empty() || std::filesystem::path(path).is_absolute()) return "";
  std::error_code ec;
  const std::filesystem::path cwd = std::filesystem::current_path(ec);
  return ec ? std::string(" (relative to the working directory)") : " (relative to the working directory " + cwd.string() + ")";
}

void check_regular_file(const std::string& path) {
  struct stat sb {};
  if (::stat(path.c_str(), &sb) != 0) {
    if (errno == ELOOP) fail(path, ": a loop of symbolic links, not a file");
    return;  // missing (or unreadable: the open that follows says why)
  }
  const char* kind = S_ISREG(sb.st_mode)    ? nullptr
                     : S_ISDIR(sb.st_mode)  ? "a directory"
                     : S_ISFIFO(sb.st_mode) ? "a FIFO (named pipe)"
                     : S_ISCHR(sb.st_mode)  ? "a character device"
                     : S_ISBLK(sb.st_mode)  ? "a block device"
                     : S_ISSOCK(sb.st_mode) ? "a socket"
                                            : "an unknown kind of file";
  if (kind) fail(path, ": is ", kind, ", not a file");
}

std::string read_file(const std::string& path) {
  check_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read ", path, ": ", std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("cannot read ", path, ": I/O error");
  return ss.str();
}

namespace {
std::string to_hex(const unsigned char* d, unsigned n) {
  static const char* k = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (unsigned i = 0; i < n; ++i) {
    s[2 * i] = k[d[i] >> 4];
    s[2 * i + 1] = k[d[i] & 15];
  }
  return s;
}

struct MdCtx {
  EVP_MD_CTX* c = EVP_MD_CTX_new();
  ~MdCtx() { EVP_MD_CTX_free(c); }
};
}  // namespace

std::string sha256_hex(const std::string& bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  if (!EVP_Digest(bytes.data(), bytes.size(), md, &n, EVP_sha256(), nullptr))
    fail("SHA-256 failed");
  return to_hex(md, n);
}

std::string sha256_file(const std::string& path) {
  check_regular_file(path);
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("cannot read ", path, ": ", std::strerror(errno));
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> guard(f, &std::fclose);
  MdCtx ctx;
  if (!ctx.c || !EVP_DigestInit_ex(ctx.c, EVP_sha256(), nullptr)) fail("SHA-256 init failed");
  std::vector<char> buf(1 << 20);
  size_t got;
  while ((got = std::fread(buf.data(), 1, buf.size(), f)) > 0) EVP_DigestUpdate(ctx.c, buf.data(), got);
  if (std::ferror(f)) fail("cannot read ", path, ": I/O error");
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  EVP_DigestFinal_ex(ctx.c, md, &n);
  return to_hex(md, n);
}

std::string sampled_file_digest(const std::string& path) {
  constexpr uint64_t kWhole = 2u << 20, kHead = 1u << 20, kChunk = 64u << 10, kChunks = 16;
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) fail("cannot read ", path, ": ", ec.message());
  if (size <= kWhole) return "sha256:" + sha256_file(path);
  check_regular_file(path);
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("cannot read ", path, ": ", std::strerror(errno));
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> guard(f, &std::fclose);
  MdCtx ctx;
  if (!ctx.c || !EVP_DigestInit_ex(ctx.c, EVP_sha256(), nullptr)) fail("SHA-256 init failed");
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(size >> (8 * i));
  EVP_DigestUpdate(ctx.c, le, sizeof le);
  std::vector<char> buf(kHead);
  auto take = [&](uint64_t offset, uint64_t n) {
    if (::fseeko(f, static_cast<off_t>(offset), SEEK_SET) != 0 || std::fread(buf.data(), 1, n, f) != n)
      fail("cannot read ", path, ": ", std::ferror(f) ? "I/O error" : "file shorter than its size (changed while read?)");
    EVP_DigestUpdate(ctx.c, buf.data(), n);
  };
  take(0, kHead);
  for (uint64_t i = 0; i < kChunks; ++i) take((size - kChunk) * i / (kChunks - 1), kChunk);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  EVP_DigestFinal_ex(ctx.c, md, &n);
  return "sampled-sha256:" + to_hex(md, n);
}

void check_not_git_lfs_pointer(std::string_view head, const std::string& path, const std::string& what) {
  QLORA_CHECK(head.substr(0, 23) != "version https://git-lfs", path, ": a Git LFS pointer file, not the ", what,
              " itself: the repository was cloned without git-lfs (run `git lfs pull` in it)");
}

namespace {

// Removes `name` in the directory `dirfd` and, for a directory (not a link to one), everything
// under it first. Returns the entries removed, or -1 with errno set and `failed` naming the entry.
int64_t remove_entry(int dirfd, const std::string& name, const std::string& shown, std::string& failed) {
  struct stat st {};
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return 0;
    failed = shown;
    return -1;
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlinkat(dirfd, name.c_str(), 0) == 0) return 1;
    if (errno == ENOENT) return 0;
    failed = shown;
    return -1;
  }
  const int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    failed = shown;
    return -1;
  }
  DIR* dir = ::fdopendir(fd);
  if (dir == nullptr) {
    const int e = errno;
    ::close(fd);
    failed = shown;
    errno = e;
    return -1;
  }
  std::vector<std::string> names;  // read first: removing while reading leaves readdir unspecified
  errno = 0;
  while (const dirent* d = ::readdir(dir)) {
    if (std::strcmp(d->d_name, ".") != 0 && std::strcmp(d->d_name, "..") != 0) names.emplace_back(d->d_name);
    errno = 0;
  }
  if (errno != 0) {
    const int e = errno;
    ::closedir(dir);
    failed = shown;
    errno = e;
    return -1;
  }
  int64_t removed = 0;
  for (const std::string& n : names) {
    const int64_t r = remove_entry(::dirfd(dir), n, shown + "/" + n, failed);
    if (r < 0) {
      const int e = errno;
      ::closedir(dir);
      errno = e;
      return -1;
    }
    removed += r;
  }
  ::closedir(dir);
  if (::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) != 0) {
    if (errno == ENOENT) return removed;
    failed = shown;
    return -1;
  }
  return removed + 1;
}

}  // namespace

std::uintmax_t remove_tree(const std::filesystem::path& path, std::error_code& ec) noexcept {
  ec.clear();
  try {
    std::string failed;
    const int64_t r = remove_entry(AT_FDCWD, path.string(), path.string(), failed);
    if (r < 0) {
      ec.assign(errno, std::generic_category());
      return static_cast<std::uintmax_t>(-1);
    }
    return static_cast<std::uintmax_t>(r);
  } catch (const std::bad_alloc&) {
    ec = std::make_error_code(std::errc::not_enough_memory);
    return static_cast<std::uintmax_t>(-1);
  }
}

std::uintmax_t remove_tree(const std::filesystem::path& path) {
  std::string failed;
  const int64_t r = remove_entry(AT_FDCWD, path.string(), path.string(), failed);
  if (r < 0) {
    const int e = errno;
    fail("cannot remove ", failed, ": ", std::strerror(e));
  }
  return static_cast<std::uintmax_t>(r);
}

}  // namespace qlora
