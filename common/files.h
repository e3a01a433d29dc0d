// qlora-cpp: file helpers that must not lose data: atomic replace, fsync, SHA-256 (OpenSSL).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <system_error>

namespace qlora {

/// Writes a file atomically: `write(fd_path)` fills a temporary file next to `path`
/// ("<path>.tmp.<pid>"), which is fsync'd, renamed over `path`, and the directory fsync'd.
/// On any exception the temporary file is removed and `path` is untouched.
/// Throws qlora::Error naming the path on an I/O failure.
void atomic_write(const std::string& path, const std::function<void(std::FILE*)>& write);

/// atomic_write of a whole string.
void atomic_write_string(const std::string& path, const std::string& bytes);

/// Checks, before slow work whose result goes to `path`, that the file can be created there
/// (atomic_write's temporary next to it, missing parent folders made): `path` is not a directory
/// and its nearest existing ancestor is a directory this process may write into (access(2) W_OK |
/// X_OK, which also fails on a read-only mount or an immutable folder). Creates nothing.
/// Throws qlora::Error "<what> <path>: cannot write there: <reason>" otherwise.
void check_can_create(const std::string& path, const std::string& what);

/// fsync of a directory (so a rename inside it is durable). Throws qlora::Error on failure.
void fsync_dir(const std::string& dir);

/// Throws qlora::Error "PATH: is a FIFO (named pipe), not a file" (or a character device, block
/// device, socket, directory; "PATH: a loop of symbolic links") when `path`, links followed, exists
/// and is not a regular file: what every reader of an input file checks before opening it, since
/// opening a FIFO blocks until something writes to it (an uploaded tar can carry one; trial 27: a
/// FIFO in place of config.json hung inspect) and a device never ends. Does nothing for a regular
/// file or a missing path (the caller says "not found" in its own words).
void check_regular_file(const std::string& path);

/// Removes `path` and, for a directory, everything under it, without following symbolic links
/// (a link is removed, not its target), as std::filesystem::remove_all does; returns the number of
/// entries removed, 0 when `path` does not exist. Every program here uses this instead of
/// std::filesystem::remove_all: the torch wheels export their own copy of std::filesystem, a
/// program linked with libtorch binds to it, and torch 2.11.0+cu130's remove_all calls a null
/// pointer (segfault on the H200, first GPU run 2026-12-04; tests/common/files_test.cpp keeps the
/// sources free of it). POSIX openat / fdopendir / unlinkat only.
/// Throws qlora::Error "cannot remove <entry>: <reason>" naming the entry that failed; the
/// error_code form sets `ec` instead and returns static_cast<uintmax_t>(-1).
std::uintmax_t remove_tree(const std::filesystem::path& path);
std::uintmax_t remove_tree(const std::filesystem::path& path, std::error_code& ec) noexcept;

/// Reads a whole file (check_regular_file first). Throws qlora::Error "cannot read <path>:
/// <reason>", and check_regular_file's errors.
std::string read_file(const std::string& path);

/// Lowercase hex SHA-256 of a file's bytes (OpenSSL EVP). Throws qlora::Error naming the path.
std::string sha256_file(const std::string& path);

/// A cheap identity of a large file, for "is this the same file?" checks (e.g. a model moved to
/// another mount point): "sha256:<hex>" of the whole file when it is at most 2 MiB, else
/// "sampled-sha256:<hex>" over its size (8 bytes, little-endian), its first 1 MiB (a safetensors
/// header: every tensor's name, dtype, shape and offsets) and 16 chunks of 64 KiB at evenly spaced
/// offsets, the last one ending at the file's end: about 2 MiB read, whatever the size (the idea of
/// imohash). Two files of other content almost surely differ in it (a fine-tune of the same
/// architecture changes every sampled chunk); an edit outside the samples is not seen.
/// Throws qlora::Error naming the path when it cannot be read.
std::string sampled_file_digest(const std::string& path);

/// For a "not found" message about `path`: "" when it is absolute, else " (relative to the working
/// directory CWD)": a relative path in a config or on the command line is resolved against the
/// process's working directory, not the config file's (docs/config.md), and a job started in
/// another directory (a scheduler, a container's WORKDIR) misses it. Never throws.
std::string relative_path_note(const std::string& path);

/// Throws qlora::Error "PATH: a Git LFS pointer file, not the WHAT itself: the repository was
/// cloned without git-lfs (run `git lfs pull` in it)" when `head`, the first bytes of the file at
/// `path`, begin with a Git LFS pointer's first line "version https://git-lfs" (the Git LFS
/// specification, docs/spec.md: a pointer is a ~130-byte text file that stands in for a large file
/// in a clone without git-lfs; Hugging Face model repositories keep *.safetensors, *.gguf,
/// tokenizer.model and large tokenizer.json files in LFS). Does nothing otherwise.
void check_not_git_lfs_pointer(std::string_view head, const std::string& path, const std::string& what);

/// Lowercase hex SHA-256 of `bytes`.
std::string sha256_hex(const std::string& bytes);

}  // namespace qlora
