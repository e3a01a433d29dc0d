// Input paths that are not regular files: a FIFO (an uploaded tar can carry one), a device, a
// directory, a loop of symbolic links. Every reader refuses them with one line naming the path and
// what it is, before opening: opening a FIFO blocks until a writer comes (trial 27: inspect, train,
// import-gguf hung on one) and a device never ends. Each call runs in a child process that is
// killed after 20 s, so a reader that still blocks fails here instead of hanging the suite.
// Torch-free; also runs under ASan+UBSan.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "common/error.h"
#include "common/files.h"
#include "common/gguf.h"
#include "common/safetensors.h"
#include "config/config.h"
#include "data/options.h"
#include "data/reader.h"
#include "data/tokenizer.h"
#include "test_util.h"

namespace {
namespace fs = std::filesystem;

/// Runs `f` in a forked child and returns the qlora::Error message it threw ("" if it returned,
/// "TIMEOUT" if it was still running after `seconds`, "CRASH" if it died otherwise).
std::string error_in_child(const std::function<void()>& f, int seconds = 20) {
  int fds[2];
  if (::pipe(fds) != 0) return "PIPE";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::string msg;
    try {
      f();
    } catch (const qlora::Error& e) {
      msg = e.what();
    } catch (const std::exception& e) {
      msg = std::string("OTHER: ") + e.what();
    }
    const ssize_t n = ::write(fds[1], msg.data(), msg.size());
    ::_exit(n == static_cast<ssize_t>(msg.size()) ? 0 : 3);
  }
  ::close(fds[1]);
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ::close(fds[0]);
      return "TIMEOUT";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::string msg;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) msg.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return "CRASH";
  return msg;
}

TEST(BadInputFiles, FifoDeviceAndLinkLoopAreNamedNotOpened) {
  const qlora::test::TempDir d("bad_files");
  const fs::path fifo = d.path / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const fs::path loop_a = d.path / "loop_a", loop_b = d.path / "loop_b";
  fs::create_symlink(loop_b, loop_a);
  fs::create_symlink(loop_a, loop_b);
  const std::string dev = "/dev/zero";

  struct Reader {
    const char* name;
    std::function<void(const std::string&)> read;
  };
  const std::vector<Reader> readers = {
      {"read_file", [](const std::string& p) { qlora::read_file(p); }},
      {"sha256_file", [](const std::string& p) { qlora::sha256_file(p); }},
      {"safetensors", [](const std::string& p) { qlora::st::SafetensorsFile f(p); }},
      {"gguf", [](const std::string& p) { qlora::gguf::GgufFile f(p); }},
      {"config yaml", [](const std::string& p) { qlora::load_config(p, {}); }},
      {"tokenizer file", [](const std::string& p) { qlora::data::Tokenizer::from_pretrained(p); }},
      {"data file",
       [](const std::string& p) {
         qlora::data::DataOptions o;
         qlora::data::ReadStats st;
         qlora::data::read_records(p, o, &st);
       }},
  };
  const std::vector<std::pair<std::string, std::string>> inputs = {
      {fifo.string(), ": is a FIFO (named pipe), not a file"},
      {dev, ": is a character device, not a file"},
      {loop_a.string(), ": a loop of symbolic links, not a file"},
  };
  for (const Reader& r : readers)
    for (const auto& [path, what] : inputs) {
      // a tokenizer path is a file or a model dir: only the loop and the FIFO/device by name
      const std::string msg = error_in_child([&] { r.read(path); });
      EXPECT_EQ(msg.rfind(path + ":", 0), 0u) << r.name << " on " << path << ": " << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << r.name << " on " << path << ": " << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << r.name << ": not one line: " << msg;
    }
  // a model directory whose tokenizer.json / config.json is a FIFO
  const fs::path model = d.path / "model";
  fs::create_directories(model);
  ASSERT_EQ(::mkfifo((model / "tokenizer.json").c_str(), 0600), 0);
  const std::string msg = error_in_child([&] { qlora::data::Tokenizer::from_pretrained(model.string()); });
  EXPECT_NE(msg.find((model / "tokenizer.json").string() + ": is a FIFO (named pipe), not a file"), std::string::npos)
      << msg;
}

}  // namespace
