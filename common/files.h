// qlora-cpp: file helpers that must not lose data: atomic replace, fsync, SHA-256 (OpenSSL).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace qlora {

/// Writes a file atomically: `write(fd_path)` fills a temporary file next to `path`
/// ("<path>.tmp.<pid>"), which is fsync'd, renamed over `path`, and the directory fsync'd.
/// On any exception the temporary file is removed and `path` is untouched.
/// Throws qlora::Error naming the path on an I/O failure.
void atomic_write(const std::string& path, const std::function<void(std::FILE*)>& write);

/// atomic_write of a whole string.
void atomic_write_string(const std::string& path, const std::string& bytes);

/// fsync of a directory (so a rename inside it is durable). Throws qlora::Error on failure.
void fsync_dir(const std::string& dir);

/// Reads a whole file. Throws qlora::Error "cannot read <path>: <reason>".
std::string read_file(const std::string& path);

/// Lowercase hex SHA-256 of a file's bytes (OpenSSL EVP). Throws qlora::Error naming the path.
std::string sha256_file(const std::string& path);

/// Lowercase hex SHA-256 of `bytes`.
std::string sha256_hex(const std::string& bytes);

}  // namespace qlora
