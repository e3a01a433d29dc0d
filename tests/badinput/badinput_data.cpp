// Bad-input corpus for the data readers (tests/badinput/data/*): every file fails with
// `file:line: problem`, or with skip_invalid is skipped and counted. Torch-free; also run
// under ASan+UBSan by scripts/test.sh.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/files.h"
#include "common/error.h"
#include "data/reader.h"
#include "tests/test_util.h"

using namespace qlora::data;
namespace fs = std::filesystem;

namespace {
fs::path corpus(const std::string& name) { return qlora::test::source_dir() / "tests/badinput/data" / name; }

std::string error_of(const fs::path& p, DataOptions o = {}) {
  ReadStats st;
  try {
    read_records(p.string(), o, &st);
  } catch (const qlora::Error& e) {
    return e.what();
  }
  return "";
}

void expect_error(const std::string& name, const std::string& line_and_problem) {
  const fs::path p = corpus(name);
  const std::string msg = error_of(p);
  EXPECT_EQ(msg.rfind(p.string() + ":" + line_and_problem, 0), 0u) << name << " -> " << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
}

int64_t skipped(const std::string& name, const std::string& reason, size_t* kept) {
  DataOptions o;
  o.skip_invalid = true;
  ReadStats st;
  *kept = read_records(corpus(name).string(), o, &st).size();
  EXPECT_EQ(st.skip_reasons[reason], st.skipped_invalid) << name;
  return st.skipped_invalid;
}
}  // namespace

TEST(BadInputData, EachFileNamesFileLineAndProblem) {
  expect_error("malformed_line.jsonl", "2: invalid JSON");
  expect_error("wrong_type.json", "3: field 'instruction' must be a string, got number");
  expect_error("missing_field.jsonl", "2: missing field 'output'");
  expect_error("empty_string.jsonl", "1: conversations[1].value is an empty string");
  expect_error("non_utf8.jsonl", "2: invalid UTF-8 at byte offset ");
  expect_error("non_utf8.txt", "3: invalid UTF-8 at byte offset ");
  expect_error("empty.json", "1: empty file (no records)");
  expect_error("unterminated.json", "3: unterminated string");
  expect_error("number_overflow.jsonl", "2: invalid JSON: number overflow");  // found by fuzz_dataset
  // pretty-printed records: the line of the value at fault, not of the record's '{' (decoys in
  // strings, brackets in strings and an escaped key on the way)
  expect_error("pretty_sharegpt.json", "15: unknown role 'bot'");
  expect_error("pretty_alpaca.json", "9: field 'output' must be a string, got number");
  // malformed tool calls (the OpenAI form and the glaive function_call form)
  expect_error("tool_calls.json", "7: messages[1].tool_calls must be an array of calls, got object");
  expect_error("tool_call_no_name.jsonl", "2: messages[1].tool_calls[0].function: missing field 'name' (the function called)");
  expect_error("tool_call_bad_arguments.json",
               "13: messages[1].tool_calls[0].function.arguments must be an object or a string holding JSON, got number");
  expect_error("tool_call_arguments_not_json.jsonl",
               "2: messages[1].tool_calls[0].function.arguments is a string that is not JSON (OpenAI writes the arguments "
               "object as JSON text)");
  expect_error("function_call_not_json.jsonl",
               "1: conversations[1].value: a function_call turn's content must be JSON: a call {\"name\": ..., "
               "\"arguments\": ...} or an array of calls");
  EXPECT_NE(error_of("/nonexistent/x.json").find("/nonexistent/x.json: dataset file not found"), std::string::npos);
}

// data.field_map written the wrong way round ({question: instruction}: the file's name -> ours) is
// said so, with the map to write, where the format cannot be detected or a mapped field is missing.
TEST(BadInputData, SwappedFieldMapIsNamed) {
  const fs::path p = corpus("field_map_swapped.jsonl");
  DataOptions o;
  o.field_map = {{"question", "instruction"}, {"answer", "output"}};
  const std::string swapped = "data.field_map {answer: output, question: instruction} looks swapped (it maps our "
                              "field name to the name in your file): write {output: answer, instruction: question}";
  EXPECT_EQ(error_of(p, o), p.string() + ":1: cannot detect the format from the keys [question, answer]; " + swapped);
  o.format = "alpaca";
  EXPECT_EQ(error_of(p, o), p.string() + ":1: missing field 'instruction'; " + swapped);
  // the right way round reads the file; a map that is not swapped keeps the generic advice
  o.field_map = {{"instruction", "question"}, {"output", "answer"}};
  ReadStats st;
  const auto recs = read_records(p.string(), o, &st);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].turns.back().content, "4");
  o.format = "auto";
  o.field_map = {{"prompt", "instruction"}};
  EXPECT_EQ(error_of(p, o), p.string() + ":1: cannot detect the format from the keys [question, answer]; a "
                                         "{\"question\", \"answer\"} record reads as alpaca with data.field_map: "
                                         "{instruction: question, output: answer} (the question masked, the answer "
                                         "trained); format completion here means raw text, a \"text\" field trained whole");
}

// The map of an entry of data.train / data.eval is named by its own key (options_for's entry_key),
// not data.field_map: the section's map is not the one at fault (found in a README-only trial).
TEST(BadInputData, EntryFieldMapAndRoleMapAreNamedByTheirEntry) {
  const fs::path p = corpus("field_map_swapped.jsonl");
  DataOptions section;
  section.field_map = {{"instruction", "prompt"}};
  const std::map<std::string, std::string> swapped = {{"question", "instruction"}, {"answer", "output"}};
  const DataSource entry{p.string(), std::nullopt, swapped};
  EXPECT_EQ(error_of(p, options_for(section, entry, "data.train[1]")),
            p.string() + ":1: cannot detect the format from the keys [question, answer]; data.train[1].field_map "
                         "{answer: output, question: instruction} looks swapped (it maps our field name to the name "
                         "in your file): write {output: answer, instruction: question}");
  const DataSource with_format{p.string(), std::string("alpaca"), swapped};
  EXPECT_EQ(error_of(p, options_for(section, with_format, "data.eval[0]")),
            p.string() + ":1: missing field 'instruction'; data.eval[0].field_map {answer: output, question: "
                         "instruction} looks swapped (it maps our field name to the name in your file): write {output: "
                         "answer, instruction: question}");
  // An entry that sets no map of its own reads with the section's: that one is named.
  DataOptions swapped_section;
  swapped_section.field_map = swapped;
  EXPECT_NE(error_of(p, options_for(swapped_section, DataSource{p.string()}, "data.train[1]"))
                .find("; data.field_map {answer: output, question: instruction} looks swapped"),
            std::string::npos);
  // Without a map to blame, the advice names the entry's keys when the entry set the format or map.
  const DataSource own_format{p.string(), std::string("auto"), std::map<std::string, std::string>{}};
  EXPECT_EQ(error_of(p, options_for(section, own_format, "data.train[2]")),
            p.string() + ":1: cannot detect the format from the keys [question, answer]; a {\"question\", "
                         "\"answer\"} record reads as alpaca with data.train[2].field_map: {instruction: question, "
                         "output: answer} (the question masked, the answer trained); format completion here means raw "
                         "text, a \"text\" field trained whole");
  // role_map: the entry's own.
  const qlora::test::TempDir tmp("entry_role_map");
  const fs::path sg = tmp.path;
  std::ofstream(sg / "chats.jsonl") << R"({"conversations": [{"from": "client", "value": "ping"}, {"from": "gpt", "value": "pong"}]})"
                                    << "\n";
  const DataSource chats{(sg / "chats.jsonl").string(), std::nullopt, std::nullopt,
                         std::map<std::string, std::string>{{"customer", "user"}}};
  EXPECT_EQ(error_of(sg / "chats.jsonl", options_for(section, chats, "data.train[0]")),
            (sg / "chats.jsonl").string() + ":1: unknown role 'client' (map it with data.train[0].role_map to "
                                             "system|user|assistant|tool)");
}

TEST(BadInputData, SkipInvalidCounts) {
  size_t kept = 0;
  EXPECT_EQ(skipped("malformed_line.jsonl", "invalid JSON", &kept), 1);
  EXPECT_EQ(kept, 1u);
  EXPECT_EQ(skipped("wrong_type.json", "wrong type", &kept), 1);
  EXPECT_EQ(skipped("missing_field.jsonl", "missing field", &kept), 1);
  EXPECT_EQ(skipped("non_utf8.jsonl", "invalid UTF-8", &kept), 1);
  EXPECT_EQ(skipped("non_utf8.txt", "invalid UTF-8", &kept), 1);
  EXPECT_EQ(kept, 1u);
  EXPECT_EQ(skipped("tool_call_no_name.jsonl", "missing field", &kept), 1);
  EXPECT_EQ(kept, 1u);
  EXPECT_EQ(skipped("tool_call_bad_arguments.json", "wrong type", &kept), 1);
  EXPECT_EQ(skipped("tool_call_arguments_not_json.jsonl", "invalid tool call", &kept), 1);
  EXPECT_EQ(kept, 1u);
  DataOptions o;
  o.skip_invalid = true;
  ReadStats st;  // every record invalid: still an error
  EXPECT_THROW(read_records(corpus("empty_string.jsonl").string(), o, &st), qlora::Error);
}

TEST(BadInputData, TenMegabyteLine) {
  const qlora::test::TempDir tmp("bad_big_line");
  const fs::path& dir = tmp.path;
  const std::string big(10 << 20, 'x');
  {
    std::ofstream(dir / "big_ok.jsonl") << R"({"text": ")" << big << "\"}\n";
    std::ofstream(dir / "big_bad.jsonl") << "{\"text\": \"ok\"}\n{\"text\": \"" << big << "\n";
  }
  ReadStats st;
  const auto recs = read_records((dir / "big_ok.jsonl").string(), DataOptions{}, &st);
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].text.size(), big.size());
  const std::string msg = error_of(dir / "big_bad.jsonl");
  EXPECT_EQ(msg.rfind((dir / "big_bad.jsonl").string() + ":2: invalid JSON", 0), 0u) << msg.substr(0, 300);
  EXPECT_LT(msg.size(), 1000u) << "the message must not echo the 10 MB line";
}

// Encodings (issue 16): a UTF-8 byte-order mark is skipped in every format; UTF-16/32 (with or
// without a mark) and invalid UTF-8 give one line naming the file and the byte offset.
TEST(BadInputData, EncodingsBomUtf16Utf32InvalidUtf8) {
  const fs::path dir = qlora::test::fresh_temp_dir("encodings");
  const std::string bom = "\xEF\xBB\xBF";
  struct Same {
    const char* name;
    std::string text;
  };
  const std::vector<Same> files = {
      {"a.json", R"([{"instruction": "caf\u00e9 \u2603", "output": "ok"}, {"instruction": "b", "output": "c"}])"},
      {"a.jsonl", "{\"instruction\": \"x\", \"output\": \"y\"}\n{\"instruction\": \"z\", \"output\": \"w\"}\n"},
      {"s.jsonl", R"({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]})" "\n"},
      {"m.jsonl", R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})" "\n"},
      {"t.txt", "first doc\nline two\n\nsecond doc\n"},
  };
  for (const Same& f : files) {
    std::ofstream(dir / f.name, std::ios::binary) << f.text;
    std::ofstream(dir / (std::string("bom_") + f.name), std::ios::binary) << bom << f.text;
    ReadStats a, b;
    const auto plain = read_records((dir / f.name).string(), DataOptions{}, &a);
    const auto with_bom = read_records((dir / (std::string("bom_") + f.name)).string(), DataOptions{}, &b);
    ASSERT_EQ(plain.size(), with_bom.size()) << f.name;
    EXPECT_EQ(a.format, b.format) << f.name;
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_EQ(plain[i].text, with_bom[i].text) << f.name;
      EXPECT_EQ(plain[i].line, with_bom[i].line) << f.name;
      ASSERT_EQ(plain[i].turns.size(), with_bom[i].turns.size()) << f.name;
      for (size_t k = 0; k < plain[i].turns.size(); ++k)
        EXPECT_EQ(plain[i].turns[k].content, with_bom[i].turns[k].content) << f.name;
    }
  }
  // UTF-16 / UTF-32 of the same JSONL (as Windows tools write them), with and without a mark.
  auto widen = [](const std::string& s, int width, bool big) {
    std::string o;
    for (char c : s) {
      std::string unit(size_t(width), '\0');
      unit[big ? size_t(width - 1) : 0] = c;
      o += unit;
    }
    return o;
  };
  const std::string jl = files[1].text;
  struct Bad {
    const char* name;
    std::string bytes;
    std::string error;
  };
  const std::vector<Bad> bad = {
      {"u16le.jsonl", "\xFF\xFE" + widen(jl, 2, false), ": the file is UTF-16LE (byte-order mark FF FE at byte offset 0)"},
      {"u16be.jsonl", "\xFE\xFF" + widen(jl, 2, true), ": the file is UTF-16BE (byte-order mark FE FF at byte offset 0)"},
      {"u32le.json", std::string("\xFF\xFE\0\0", 4) + widen(jl, 4, false),
       ": the file is UTF-32LE (byte-order mark FF FE 00 00 at byte offset 0)"},
      {"u32be.txt", std::string("\0\0\xFE\xFF", 4) + widen("text\n", 4, true),
       ": the file is UTF-32BE (byte-order mark 00 00 FE FF at byte offset 0)"},
      {"u16le_nobom.jsonl", widen(jl, 2, false), ":1: NUL byte at byte offset 1: the file looks like UTF-16 or UTF-32"},
      {"u16be_nobom.txt", widen("abc\n", 2, true), ":1: NUL byte at byte offset 0: the file looks like UTF-16 or UTF-32"},
      {"latin1.jsonl", "{\"instruction\": \"x\", \"output\": \"y\"}\n{\"instruction\": \"caf\xE9\", \"output\": \"y\"}\n",
       ":2: invalid UTF-8 at byte offset 56 (byte 0xE9)"},
      {"overlong.txt", "ok\n\xC0\xAF\n", ":2: invalid UTF-8 at byte offset 3 (byte 0xC0)"},
      {"bom_then_bad.json", bom + "[{\"instruction\": \"\xFF\", \"output\": \"y\"}]", ":1: invalid UTF-8 at byte offset 21 (byte 0xFF)"},
  };
  for (const Bad& b : bad) {
    const fs::path p = dir / b.name;
    std::ofstream(p, std::ios::binary) << b.bytes;
    const std::string msg = error_of(p);
    EXPECT_EQ(msg.rfind(p.string() + b.error, 0), 0u) << b.name << " -> " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  // skip_invalid still skips an invalid-UTF-8 record (and counts it) instead of failing the file.
  DataOptions o;
  o.skip_invalid = true;
  ReadStats st;
  EXPECT_EQ(read_records((dir / "latin1.jsonl").string(), o, &st).size(), 1u);
  EXPECT_EQ(st.skip_reasons["invalid UTF-8"], 1);
  qlora::remove_tree(dir);
}

// Real exports that are not JSON Lines (trial 14): each is one line naming the file, what it is and
// what to do, not the JSON parser's (or the UTF-16 guess's) error of its first bytes.
TEST(BadInputData, ExportsThatAreNotJsonLinesAreNamedWithWhatToDo) {
  const fs::path dir = qlora::test::fresh_temp_dir("exports");
  const std::string jl = "{\"instruction\": \"x\", \"output\": \"y\"}\n{\"instruction\": \"z\", \"output\": \"w\"}\n";
  std::ofstream(dir / "plain.jsonl", std::ios::binary) << jl;
  // a real gzip file, as `gzip` writes it (HF load_dataset reads .jsonl.gz; we do not)
  ASSERT_EQ(std::system(("gzip -k " + (dir / "plain.jsonl").string()).c_str()), 0);
  struct Bad {
    const char* name;
    std::string bytes;  // "" = already written
    std::string error;
  };
  const std::string nul(1, '\0');
  const std::vector<Bad> bad = {
      {"plain.jsonl.gz", "", ": the file is gzip-compressed (magic 1f 8b), not text (data files are UTF-8 JSON, JSON "
                             "Lines or .txt); decompress it first: gunzip -k "},
      {"x.jsonl.zst", std::string("\x28\xB5\x2F\xFD") + nul + "x", ": the file is zstd-compressed (magic 28 b5 2f fd)"},
      {"x.jsonl.bz2", "BZh91AY&SY" + nul, ": the file is bzip2-compressed"},
      {"x.jsonl.xz", std::string("\xFD" "7zXZ") + nul + nul, ": the file is xz-compressed"},
      {"x.zip", "PK\x03\x04\x14" + nul, ": the file is a zip archive"},
      {"train.parquet", "PAR1\x15\x04\x15" + nul + nul + "PAR1", ": the file is Apache Parquet (magic \"PAR1\"), not text"},
      {"data.arrow", "ARROW1" + nul + nul, ": the file is an Apache Arrow file"},
      {"t.csv", "instruction,output\nx,y\n", ": CSV is not read (data files are JSON, JSON Lines or .txt); convert it to "
                                            "JSON Lines, e.g. python3 -c \"import csv, json, sys;"},
      {"t.tsv", "instruction\toutput\nx\ty\n", ": TSV is not read"},
      // a JSON object export over several lines (json.dumps(..., indent=1)): its records are a list under a key
      {"wrapped.json", "{\n \"version\": \"1.0\",\n \"data\": [\n  {\"instruction\": \"a\", \"output\": \"b\"},\n"
                       "  {\"instruction\": \"c\", \"output\": \"d\"}\n ]\n}\n",
       ":1: the file is one JSON object over lines 1-7, not JSON Lines (one record per line) or a JSON array of records; "
       "'data' holds a list of 2 objects: if those are the records, write them one per line (jq -c '.[\"data\"][]' "},
      // the same on one line: the format error says where the records are
      {"wrapped1.jsonl", "{\"version\": \"1.0\", \"data\": [{\"instruction\": \"a\", \"output\": \"b\"}]}\n",
       ":1: cannot detect the format from the keys [version, data]; 'data' holds a list of 1 objects: if those are the "
       "records"},
      // pretty-printed records one after another (json.dumps(r, indent=2) per record)
      {"pretty.jsonl", "{\n  \"instruction\": \"a\",\n  \"output\": \"b\"\n}\n{\n  \"instruction\": \"c\",\n  \"output\": \"d\"\n}\n",
       ":1: the first record spans lines 1-4 (pretty-printed JSON?): JSON Lines needs one record per line; rewrite it, "
       "e.g. jq -c . "},
  };
  for (const Bad& b : bad) {
    const fs::path p = dir / b.name;
    if (!b.bytes.empty()) std::ofstream(p, std::ios::binary) << b.bytes;
    for (const bool skip : {false, true}) {  // not a record's problem: skip_invalid does not skip a whole file
      if (skip && std::string(b.name) == "wrapped1.jsonl") continue;  // that one is a record's: skipped
      DataOptions o;
      o.skip_invalid = skip;
      const std::string msg = error_of(p, o);
      EXPECT_EQ(msg.rfind(p.string() + b.error, 0), 0u) << b.name << " -> " << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
  // what the remedies say gives records: gunzip -k, and the CSV command (csv.DictReader) for t.csv
  ASSERT_EQ(std::system(("cd " + dir.string() + " && rm plain.jsonl && gunzip -k plain.jsonl.gz").c_str()), 0);
  EXPECT_EQ(read_records((dir / "plain.jsonl").string(), DataOptions{}, nullptr).size(), 2u);
  qlora::remove_tree(dir);
}

// A file whose records change format part way (merged exports; trial 14): the record's error says
// the file's format was detected from its first record and what this one's keys are.
TEST(BadInputData, AnotherFormatPartWayIsNamedWithTheDetectedOne) {
  const fs::path dir = qlora::test::fresh_temp_dir("mixed");
  std::ofstream(dir / "mixed.jsonl", std::ios::binary)
      << "{\"instruction\": \"a\", \"output\": \"b\"}\n{\"instruction\": \"c\", \"output\": \"d\"}\n"
      << R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "r"}]})" << "\n";
  EXPECT_EQ(error_of(dir / "mixed.jsonl"),
            (dir / "mixed.jsonl").string() +
                ":3: missing field 'instruction' (the file's format alpaca was detected from line 1; this record's keys "
                "are format messages: one file holds one format: split it and list the parts in data.train)");
  DataOptions o;  // a format set by the config: no detection to name
  o.format = "alpaca";
  EXPECT_EQ(error_of(dir / "mixed.jsonl", o), (dir / "mixed.jsonl").string() + ":3: missing field 'instruction'");
  qlora::remove_tree(dir);
}

// A null field is named as null, not as missing; an invalid-UTF-8 record skipped under skip_invalid
// is listed with the byte's offset, not the JSON parser's message echoing the raw byte (trial 14).
TEST(BadInputData, NullFieldAndSkippedInvalidUtf8AreNamedAsSuch) {
  const fs::path dir = qlora::test::fresh_temp_dir("nulls");
  std::ofstream(dir / "null.jsonl", std::ios::binary) << "{\"instruction\": \"a\", \"output\": null}\n";
  const std::string msg = error_of(dir / "null.jsonl");
  EXPECT_EQ(msg, (dir / "null.jsonl").string() + ":1: field 'output' is null (a string is needed)");
  std::ofstream(dir / "latin1.jsonl", std::ios::binary)
      << "{\"instruction\": \"x\", \"output\": \"y\"}\n{\"instruction\": \"caf\xE9\", \"output\": \"y\"}\n";
  DataOptions o;
  o.skip_invalid = true;
  ReadStats st;
  EXPECT_EQ(read_records((dir / "latin1.jsonl").string(), o, &st).size(), 1u);
  ASSERT_EQ(st.skip_examples.size(), 1u);
  EXPECT_EQ(st.skip_examples[0], (dir / "latin1.jsonl").string() +
                                     ":2: invalid UTF-8 (byte 0xE9 at byte offset 20 of the record); the file must be UTF-8");
  qlora::remove_tree(dir);
}

// Axolotl's per-message `weight` is 0 or 1 (null: absent); anything else is one line naming the file,
// the line and the message's JSON path. reasoning_content is a string on an assistant message.
TEST(BadInputData, WeightIsZeroOrOneAndReasoningContentAString) {
  const qlora::test::TempDir tmp("weight");
  const std::string ok = R"({"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}]})";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"2", "2"}, {"0.5", "0.5"}, {"\"1\"", "'1'"}, {"true", "true"}, {"-1", "-1"}, {"[0]", "[0]"},
      {"123456789012345678901234567890", "123456789012345678901234567890"}};  // beyond 64 bits: as written
  for (const auto& [value, shown] : bad) {
    const fs::path p = tmp.path / "w.jsonl";
    std::ofstream(p) << ok << "\n"
                     << R"({"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "BAD", "weight": )"
                     << value << "}]}\n";
    const std::string msg = error_of(p);
    EXPECT_EQ(msg, p.string() + ":2: conversations[1].weight must be 0 (do not train this turn) or 1 (train it), got " + shown)
        << value;
  }
  const fs::path good = tmp.path / "good.jsonl";
  std::ofstream(good) << R"({"messages": [{"role": "user", "content": "Q", "weight": 1}, {"role": "assistant", "content": "A", "weight": 0},)"
                      << R"( {"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "weight": 1.0},)"
                      << R"( {"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "weight": null}]})" << "\n";
  ReadStats st;
  const auto recs = read_records(good.string(), {}, &st);
  ASSERT_EQ(recs.size(), 1u);
  std::vector<bool> train;
  for (const Turn& t : recs[0].turns) train.push_back(t.train);
  EXPECT_EQ(train, (std::vector<bool>{true, false, true, true, true, true}));
  // pretty-printed: the line of the weight itself
  const fs::path pretty = tmp.path / "pretty.json";
  std::ofstream(pretty) << "[\n{\"messages\": [\n  {\"role\": \"user\", \"content\": \"Q\"},\n  {\"role\": \"assistant\",\n"
                           "   \"content\": \"A\",\n   \"weight\": 0.5}\n]}\n]\n";
  EXPECT_EQ(error_of(pretty), pretty.string() + ":6: messages[1].weight must be 0 (do not train this turn) or 1 (train it), got 0.5");
  const fs::path rc = tmp.path / "rc.jsonl";
  std::ofstream(rc) << R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "reasoning_content": 3}]})" << "\n";
  EXPECT_EQ(error_of(rc), rc.string() + ":1: messages[1].reasoning_content must be a string, got number");
  std::ofstream(rc) << R"({"messages": [{"role": "user", "content": "Q", "reasoning_content": "r"}, {"role": "assistant", "content": "A"}]})" << "\n";
  EXPECT_EQ(error_of(rc), rc.string() + ":1: messages[0].reasoning_content: only an assistant message has reasoning_content "
                                        "(this one is 'user')");
  // skip_invalid counts a bad weight like any wrong type
  DataOptions o;
  o.skip_invalid = true;
  std::ofstream(good) << ok << "\n" << R"({"conversations": [{"from": "gpt", "value": "A", "weight": 2}]})" << "\n";
  EXPECT_EQ(read_records(good.string(), o, &st).size(), 1u);
  EXPECT_EQ(st.skip_reasons["wrong type"], 1);
}

// Axolotl's migration hints followed literally (format messages, field_map {messages:
// conversations}) on sharegpt's {from, value} turns: the missing 'role' error says which settings
// read that layout (and the reverse), and the settings it names do read the file.
TEST(BadInputData, SharegptTurnsReadAsMessagesNameTheLayout) {
  const qlora::test::TempDir tmp("layout");
  const fs::path p = tmp.path / "sg.jsonl";
  std::ofstream(p) << R"({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]})" << "\n";
  DataOptions o;
  o.format = "messages";
  o.field_map = {{"messages", "conversations"}};
  EXPECT_EQ(error_of(p, o), p.string() + ":1: conversations[0]: missing field 'role' (this is sharegpt's layout {from, "
                                         "value}: set data.format: sharegpt, or data.field_map {messages: conversations, role: from, content: value})");
  o.format_key = "data.train[1].format";
  o.field_map_key = "data.train[1].field_map";
  EXPECT_EQ(error_of(p, o), p.string() + ":1: conversations[0]: missing field 'role' (this is sharegpt's layout {from, "
                                         "value}: set data.train[1].format: sharegpt, or data.train[1].field_map {messages: "
                                         "conversations, role: from, content: value})");
  ReadStats st;
  o.field_map = {{"messages", "conversations"}, {"role", "from"}, {"content", "value"}};  // the hint's map
  auto recs = read_records(p.string(), o, &st);
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].turns[1].role, "assistant");
  o.format = "sharegpt";  // the hint's format
  o.field_map = {{"messages", "conversations"}};
  recs = read_records(p.string(), o, &st);
  EXPECT_EQ(recs[0].turns[1].content, "yo");
  // the reverse: messages' {role, content} turns under format sharegpt
  const fs::path m = tmp.path / "m.jsonl";
  std::ofstream(m) << R"({"conversations": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})" << "\n";
  o.format = "sharegpt";
  o.format_key = "data.format";
  o.field_map_key = "data.field_map";
  o.field_map = {};
  EXPECT_EQ(error_of(m, o), m.string() + ":1: conversations[0]: missing field 'from' (this is the messages layout {role, "
                                         "content}: set data.format: messages with data.field_map {messages: conversations}, or "
                                         "data.field_map {from: role, value: content})");
  // a turn with neither layout: no hint
  std::ofstream(m) << R"({"conversations": [{"speaker": "user", "text": "hi"}]})" << "\n";
  EXPECT_EQ(error_of(m, o), m.string() + ":1: conversations[0]: missing field 'from'");
  // the other layout's list itself (trial 13: format messages on a plain sharegpt file said only
  // "missing field 'messages'"): the setting that reads it, by its first turn's keys
  o.format = "messages";
  EXPECT_EQ(error_of(p, o), p.string() + ":1: missing field 'messages' (the record has 'conversations' with sharegpt's "
                                         "{from, value} turns: set data.format: sharegpt)");
  std::ofstream(m) << R"({"conversations": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})" << "\n";
  EXPECT_EQ(error_of(m, o), m.string() + ":1: missing field 'messages' (the record has 'conversations' with {role, "
                                         "content} turns: set data.field_map {messages: conversations})");
  const fs::path msgs = tmp.path / "msgs.jsonl";
  std::ofstream(msgs) << R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})" << "\n";
  o.format = "sharegpt";
  EXPECT_EQ(error_of(msgs, o), msgs.string() + ":1: missing field 'conversations' (the record has 'messages' with "
                                               "{role, content} turns: set data.format: messages)");
  o.field_map = {{"messages", "conversations"}};  // the map the hint names reads it
  o.format = "messages";
  EXPECT_EQ(read_records(m.string(), o, &st).at(0).turns.at(1).content, "yo");
}
