// common/json_file.h: the one error format of every JSON file read from a model, tokenizer or
// adapter directory ("PATH:LINE:COLUMN: invalid JSON: ..."), and Git LFS pointers named as such.
#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "common/files.h"
#include "common/json_file.h"

namespace qlora {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_json_file(text, "d/x.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JsonFile, SyntaxErrorsNameLineAndColumn) {
  EXPECT_EQ(error_of("{\"a\": 1}"), "");
  // the byte where the parser stopped, 1-based line and column (the 'x' at line 3, column 8)
  EXPECT_EQ(error_of("{\n  \"a\": 1,\n  \"b\": x\n}\n"),
            "d/x.json:3:8: invalid JSON: syntax error while parsing value - invalid literal; last read: '\"b\": x'");
  // cut short (an interrupted copy): said, at the column after the last byte
  EXPECT_EQ(error_of("{\n  \"a\": [1, 2"),
            "d/x.json:2:13: invalid JSON: syntax error while parsing array - unexpected end of input; expected ']'; "
            "the file ends there (cut short?)");
  EXPECT_EQ(error_of(""), "d/x.json: empty file, not JSON");
  EXPECT_EQ(error_of(" \n\t\n"), "d/x.json: empty file, not JSON");
  EXPECT_EQ(error_of("{\"a\": 1e999}"), "d/x.json: invalid JSON: number overflow parsing '1e999'");
  EXPECT_EQ(error_of("{\"a\": 1} 2"), "d/x.json:1:10: invalid JSON: syntax error while parsing value - unexpected "
                                     "number literal; expected end of input");
  // a long token is not echoed whole: one line of at most 160 bytes of reason
  const std::string e = error_of("{\"a\": \"" + std::string(100000, 'z') + "\n\"}");
  EXPECT_EQ(e.find('\n'), std::string::npos);
  EXPECT_LT(e.size(), 220u) << e;
}

// Nesting past kMaxJsonDepth (256) is refused at the bracket that goes past it, before the parse
// (trial 27: a 10,000-deep pre_tokenizer took 3 GB); brackets inside strings do not count.
TEST(JsonFile, NestingPastTheLimitIsRefusedAtItsBracket) {
  auto nested = [](int n) { return std::string(n, '[') + std::string(n, ']'); };
  EXPECT_EQ(error_of(nested(256)), "");
  EXPECT_EQ(error_of(nested(257)), "d/x.json:1:257: JSON nested deeper than 256 levels (no model, tokenizer or "
                                   "adapter file is; a corrupt or hostile file?)");
  EXPECT_EQ(error_of("{\"a\":\n " + nested(10000) + "}"),
            "d/x.json:2:257: JSON nested deeper than 256 levels (no model, tokenizer or adapter file is; a corrupt "
            "or hostile file?)");
  EXPECT_EQ(error_of("{\"a\": \"" + std::string(1000, '[') + "\\\"{\"}"), "");  // in a string (and after \")
}

// A clone without git-lfs leaves ~130-byte pointer files (Git LFS spec) where the model's large
// files were; each reader says so instead of "invalid JSON" / "bad magic" / "header length".
TEST(JsonFile, GitLfsPointersAreNamed) {
  const std::string ptr =
      "version https://git-lfs.github.com/spec/v1\n"
      "oid sha256:4d1b5e3a8b1f0f6e1c9a2f3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f\nsize 17209920\n";
  EXPECT_EQ(error_of(ptr), "d/x.json: a Git LFS pointer file, not the JSON file itself: the repository was cloned "
                           "without git-lfs (run `git lfs pull` in it)");
  EXPECT_NO_THROW(check_not_git_lfs_pointer("version 2", "p", "file"));
  EXPECT_NO_THROW(check_not_git_lfs_pointer("", "p", "file"));
}

}  // namespace
}  // namespace qlora
