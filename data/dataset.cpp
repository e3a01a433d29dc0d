// qlora-cpp dataset pipeline: records -> examples, length policy, split, stats, preview.
#include "data/dataset.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <unordered_map>

#include "common/error.h"
#include "common/files.h"
#include "data/batch.h"
#include "data/template.h"

namespace qlora::data {

int64_t trained_targets(const std::vector<int32_t>& labels) {
  if (labels.size() < 2) return 0;
  return std::count_if(labels.begin() + 1, labels.end(), [](int32_t l) { return l != kIgnoreIndex; });
}

namespace {
// Keys of DataStats::listed, in the order listed_records prints them.
constexpr const char* kDropped = "dropped";
constexpr const char* kTruncatedAway = "truncated away";
constexpr const char* kNoTrainable = "no trainable token";
constexpr const char* kTruncated = "truncated";
constexpr const char* kDuplicate = "duplicate";      // data.deduplicate dropped it
constexpr const char* kInTrain = "also in data.train";  // data.deduplicate dropped this data.eval record

void list(DataStats* st, const char* reason, const Record& r, const std::string& what) {
  auto& v = st->listed[reason];
  if (v.size() < DataStats::kListedPerReason) v.push_back(r.file + ":" + std::to_string(r.line) + ": " + what);
}
}  // namespace

std::vector<Example> build_examples(const std::vector<Record>& records, const DataOptions& opts,
                                    const Tokenizer& tok, DataStats* st) {
  QLORA_CHECK(opts.sequence_len > 0, "data.sequence_len: must be > 0, got ", opts.sequence_len);
  QLORA_CHECK(opts.truncation == "drop" || opts.truncation == "truncate" || opts.truncation == "split",
              "data.truncation: must be drop|truncate|split, got '", opts.truncation, "'");
  const int64_t L = opts.sequence_len;
  const std::string Ls = std::to_string(L);
  st->sequence_len = L;
  if (st->length_hist.empty()) st->length_hist.assign(8, 0);
  std::vector<Example> out;
  out.reserve(records.size());
  for (size_t ri = 0; ri < records.size(); ++ri) {
    const Record& r = records[ri];
    if (!r.is_text && !r.tools.empty() && !template_renders_tools(opts.template_name)) ++st->tools_not_rendered;
    if (!r.is_text && !template_renders_reasoning(opts.template_name) &&
        std::any_of(r.turns.begin(), r.turns.end(), [](const Turn& t) { return t.has_reasoning && !t.reasoning_content.empty(); }))
      ++st->reasoning_not_rendered;
    if (std::any_of(r.turns.begin(), r.turns.end(), [](const Turn& t) { return t.role == "system"; }))
      ++st->system_records;
    QLORA_CHECK(opts.truncation != "split" || r.is_text, r.file, ":", r.line,
                ": data.truncation: split cuts raw text (format completion) into pieces; this record is a "
                "conversation (a piece would train an answer without its prompt): use drop or truncate");
    // A token covers at most 16 bytes of Llama-family text: far longer records cannot fit, so
    // they are dropped before paying for their tokenisation (a 10 MB line costs nothing).
    size_t bytes = r.text.size();
    for (const Turn& t : r.turns) {
      bytes += t.content.size() + t.reasoning_content.size();
      for (const ToolCall& c : t.tool_calls) bytes += c.name.size() + c.arguments.size();
    }
    if (opts.truncation == "drop" && bytes > size_t(L) * 64) {
      ++st->dropped_too_long;
      list(st, kDropped, r, "longer than sequence_len " + Ls + " (" + std::to_string(bytes) + " bytes, not tokenised)");
      continue;
    }
    std::vector<Segment> segs;
    try {
      segs = render(r, opts.template_name, tok, opts.add_eos);
    } catch (const Error& e) {
      // A record the template refuses (mistral's jinja: roles that do not alternate, tool call ids
      // not 9 characters) is a malformed record for this template: data.skip_invalid skips and
      // counts it as it does one the reader refuses (trial 26); errors about no record are kept.
      const std::string m = e.what(), at = r.file + ":" + std::to_string(r.line) + ": ";
      if (!opts.skip_invalid || m.rfind(at, 0) != 0) throw;
      ++st->read.skipped_invalid;
      ++st->read.skip_reasons["template " + opts.template_name + " refuses it"];
      if (st->read.skip_examples.size() < 5) st->read.skip_examples.push_back(m);
      continue;
    }
    Example ex = tokenize(segs, tok, opts.train_on_inputs);
    const bool had_trainable = trained_targets(ex.labels) > 0;
    const int64_t n = int64_t(ex.input_ids.size());
    const std::string ntok = " (" + std::to_string(n) + " tokens)";
    if (n > L && opts.truncation == "split") {
      // Consecutive pieces [k·L, min((k+1)·L, n)): their concatenation is the unsplit example.
      ++st->split_documents;
      for (int64_t b = 0; b < n; b += L) {
        const int64_t e = std::min(n, b + L);
        if (e - b < 2) {  // a 1-token tail: no next token to predict inside it
          ++st->split_tails_dropped;
          break;
        }
        Example piece;
        piece.input_ids.assign(ex.input_ids.begin() + b, ex.input_ids.begin() + e);
        piece.labels.assign(ex.labels.begin() + b, ex.labels.begin() + e);  // raw text: all but a BOS trained
        piece.id = int64_t(out.size());
        piece.record = int64_t(ri);
        out.push_back(std::move(piece));
        ++st->split_pieces;
      }
      continue;
    }
    if (n > L) {
      if (opts.truncation == "drop") {
        ++st->dropped_too_long;
        list(st, kDropped, r, "longer than sequence_len " + Ls + ntok);
        continue;
      }
      ex.untruncated_len = n;
      ex.input_ids.resize(size_t(L));
      ex.labels.resize(size_t(L));
      if (trained_targets(ex.labels) > 0) {  // kept, cut (one cut to nothing is "truncated away" below)
        ++st->truncated;
        list(st, kTruncated, r, "cut to its first " + Ls + " tokens" + ntok);
      }
    }
    if (trained_targets(ex.labels) == 0) {
      if (had_trainable) {
        ++st->dropped_truncated_away;
        list(st, kTruncatedAway, r, "every trainable token past sequence_len " + Ls + ntok);
      } else {
        ++st->dropped_no_trainable;
        st->dropped_nothing_to_predict += r.is_text;
        list(st, kNoTrainable, r, (r.is_text ? "nothing to predict" : "no assistant turn") + ntok);
      }
      continue;
    }
    ex.id = int64_t(out.size());
    ex.record = int64_t(ri);
    out.push_back(std::move(ex));
  }
  return out;
}

std::string record_digest(const Record& r) {
  std::string b;
  const auto put = [&b](const std::string& x) {  // length-prefixed: no two field splits read the same
    b += std::to_string(x.size());
    b += ':';
    b += x;
  };
  b += r.is_text ? 'T' : 'C';
  put(r.text);
  put(r.tools);
  for (const Turn& t : r.turns) {
    b += 't';
    put(t.role);
    put(t.content);
    put(t.tool_call_id);
    b += t.has_reasoning ? 'R' : '-';
    put(t.reasoning_content);
    b += t.train ? '1' : '0';
    for (const ToolCall& c : t.tool_calls) {
      b += 'c';
      put(c.name);
      b += c.arguments_is_string ? 's' : 'j';
      put(c.arguments);
      put(c.id);
    }
  }
  return sha256_hex(b);
}

std::string listed_records(const DataStats& st) {
  const std::pair<const char*, int64_t> reasons[] = {{kDuplicate, st.duplicates},
                                                     {kInTrain, st.eval_in_train},
                                                     {kDropped, st.dropped_too_long},
                                                     {kTruncatedAway, st.dropped_truncated_away},
                                                     {kNoTrainable, st.dropped_no_trainable},
                                                     {kTruncated, st.truncated}};
  std::ostringstream o;
  for (const auto& [reason, total] : reasons) {
    const auto it = st.listed.find(reason);
    if (it == st.listed.end()) continue;
    for (const std::string& line : it->second) o << "  " << reason << ": " << line << "\n";
    if (total > int64_t(it->second.size()))
      o << "  " << reason << ": (and " << total - int64_t(it->second.size()) << " more)\n";
  }
  return o.str();
}

std::string source_key(bool is_eval, size_t n, size_t i) {
  const std::string key = is_eval ? "data.eval" : "data.train";
  return n == 1 ? key : key + "[" + std::to_string(i) + "]";
}

namespace {
void count(const std::vector<Example>& v, DataStats* st) {
  const int64_t bin = (st->sequence_len + 7) / 8;
  for (const Example& e : v) {
    const int64_t n = int64_t(e.input_ids.size());
    st->tokens_total += n;
    st->tokens_trainable += trained_targets(e.labels);
    st->max_len = std::max(st->max_len, n);
    st->length_hist[std::min<int64_t>(7, n / std::max<int64_t>(1, bin))]++;
  }
}
}  // namespace

namespace {
/// Adds one file's reads and drops to the running total of a list (`into` starts as the first
/// file's): counts summed, the lists kept to their caps, formats named once each, in order.
void add_stats(DataStats* into, const DataStats& from) {
  ReadStats& r = into->read;
  const ReadStats& f = from.read;
  r.records_read += f.records_read;
  r.skipped_invalid += f.skipped_invalid;
  for (const auto& [reason, n] : f.skip_reasons) r.skip_reasons[reason] += n;
  for (const std::string& m : f.skip_examples)
    if (r.skip_examples.size() < 5) r.skip_examples.push_back(m);  // the reader's cap
  bool named = false;  // f.format already one of r.format's ", "-joined names
  for (size_t b = 0, e = 0; e != std::string::npos && !named; b = e + 2) {
    e = r.format.find(", ", b);
    named = r.format.compare(b, e == std::string::npos ? std::string::npos : e - b, f.format) == 0;
  }
  if (!named) r.format += ", " + f.format;
  if (r.placeholder_first.empty()) r.placeholder_first = f.placeholder_first;
  r.placeholder_records += f.placeholder_records;
  for (const std::string& n : f.placeholder_names)
    if (r.placeholder_names.size() < 5 && std::find(r.placeholder_names.begin(), r.placeholder_names.end(), n) ==
                                              r.placeholder_names.end())
      r.placeholder_names.push_back(n);
  into->dropped_too_long += from.dropped_too_long;
  into->truncated += from.truncated;
  into->dropped_no_trainable += from.dropped_no_trainable;
  into->dropped_nothing_to_predict += from.dropped_nothing_to_predict;
  into->dropped_truncated_away += from.dropped_truncated_away;
  into->split_documents += from.split_documents;
  into->split_pieces += from.split_pieces;
  into->split_tails_dropped += from.split_tails_dropped;
  into->tools_not_rendered += from.tools_not_rendered;
  into->reasoning_not_rendered += from.reasoning_not_rendered;
  into->system_records += from.system_records;
  into->duplicates += from.duplicates;
  into->eval_in_train += from.eval_in_train;
  if (into->duplicate_first.empty()) into->duplicate_first = from.duplicate_first;
  if (into->eval_in_train_first.empty()) into->eval_in_train_first = from.eval_in_train_first;
  for (const auto& [reason, lines] : from.listed)
    for (const std::string& l : lines)
      if (into->listed[reason].size() < DataStats::kListedPerReason) into->listed[reason].push_back(l);
}

namespace fs = std::filesystem;

}  // namespace

void check_files_exist(const DataOptions& opts) {
  std::vector<std::string> bad;
  for (const bool is_eval : {false, true}) {
    const std::vector<DataSource>& v = is_eval ? opts.eval : opts.train;
    for (size_t i = 0; i < v.size(); ++i) {
      std::error_code ec;
      const fs::file_status st = fs::status(v[i].path, ec);
      if (!fs::exists(st)) bad.push_back(source_key(is_eval, v.size(), i) + ": no such file: " + v[i].path +
                                         relative_path_note(v[i].path));
      else if (fs::is_directory(st))
        bad.push_back(source_key(is_eval, v.size(), i) + ": " + v[i].path +
                      " is a directory, expected a data file (.json, .jsonl or .txt)");
    }
  }
  if (bad.size() == 1) throw Error(bad[0]);
  if (bad.size() > 1) throw ErrorList(bad);
}

namespace {

/// The records of a list seen so far (by record_digest) and where each was first: what
/// data.deduplicate compares a record with.
class RecordIndex {
 public:
  /// "FILE:LINE" of the earlier record with digest `key`, or "" when there is none.
  std::string find(const std::string& key) const {
    const auto it = first_.find(key);
    return it == first_.end() ? "" : files_[it->second.first] + ":" + std::to_string(it->second.second);
  }
  /// find(key); when "", `r` becomes the first record with that digest.
  std::string find_or_add(const std::string& key, const Record& r) {
    std::string at = find(key);
    if (!at.empty()) return at;
    if (files_.empty() || files_.back() != r.file) files_.push_back(r.file);
    first_.emplace(key, std::make_pair(files_.size() - 1, r.line));
    return "";
  }

 private:
  std::vector<std::string> files_;  // the files in the order first seen (a list's files each once)
  std::unordered_map<std::string, std::pair<size_t, int64_t>> first_;  // digest -> (files_ index, line)
};

/// The records of one file a list keeps: each record's digest is looked up in `train` (data.eval
/// files: the data.train records; counted in eval_in_train) and else in `seen` (the list's earlier
/// records, `r` added when new; counted in duplicates); with opts.deduplicate a record found is
/// dropped. `digests` gets each kept record's digest.
std::vector<Record> keep_records(std::vector<Record> recs, const DataOptions& opts, RecordIndex* seen,
                                 const RecordIndex* train, DataStats* st, std::vector<std::string>* digests) {
  std::vector<Record> kept;
  kept.reserve(recs.size());
  st->deduplicate = opts.deduplicate;
  for (Record& r : recs) {
    std::string key = record_digest(r);
    const std::string here = r.file + ":" + std::to_string(r.line);
    std::string at = train ? train->find(key) : "";
    if (!at.empty()) {
      ++st->eval_in_train;
      if (st->eval_in_train_first.empty()) st->eval_in_train_first = here + " = " + at;
      if (opts.deduplicate) {
        list(st, kInTrain, r, "the same record as " + at);
        continue;
      }
    } else if (!(at = seen->find_or_add(key, r)).empty()) {
      ++st->duplicates;
      if (st->duplicate_first.empty()) st->duplicate_first = here + " = " + at;
      if (opts.deduplicate) {
        list(st, kDuplicate, r, "the same record as " + at);
        continue;
      }
    }
    if (digests) digests->push_back(std::move(key));
    kept.push_back(std::move(r));
  }
  return kept;
}

/// Reads and tokenises each file of `sources` on its own (options_for: its format, field_map,
/// role_map), refuses a file that gives no example, and concatenates the examples in list order
/// with ids 0..n-1 and Example::record numbered over all the files' kept records (`records` gets
/// their count; `digests`, when given, their record_digest, numbered alike). Duplicates are
/// counted or dropped (keep_records) against `seen` (this list's records: filled) and `train` (for
/// data.eval: the data.train records; else nullptr). `total` gets the files' stats together
/// (add_stats), `per` each file's.
std::vector<Example> load_sources(const std::vector<DataSource>& sources, const DataOptions& opts, const Tokenizer& tok,
                                  bool is_eval, DataStats* total, std::vector<SourceStats>* per, int64_t* records,
                                  RecordIndex* seen, const RecordIndex* train, std::vector<std::string>* digests) {
  std::vector<Example> all;
  *records = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    SourceStats fs{sources[i], {}, 0, 0, {}};
    // Its messages name the entry's own field_map / role_map / format as data.train[i].field_map.
    const DataOptions o = options_for(opts, fs.source, source_key(is_eval, sources.size(), i));
    const std::vector<Record> recs =
        keep_records(read_records(fs.source.path, o, &fs.stats.read), o, seen, train, &fs.stats, digests);
    std::vector<Example> ex = build_examples(recs, o, tok, &fs.stats);
    for (Example& e : ex) e.record += *records;
    fs.first_record = *records;
    fs.record_lines.reserve(recs.size());
    for (const Record& r : recs) fs.record_lines.push_back(r.line);
    *records += int64_t(recs.size());
    const DataStats& st = fs.stats;
    // A file whose every record repeats an earlier one (data.deduplicate dropped them all) is not
    // refused: per-file notes say so, and an eval list left with nothing is refused as a whole.
    if (!recs.empty() && !is_eval)
      QLORA_CHECK(!ex.empty(), fs.source.path, ": no example has a trainable token (", drop_reasons(st), ")",
                  st.dropped_truncated_away > 0 ? "; raise data.sequence_len or use data.truncation: drop" : "");
    else if (!recs.empty())
      QLORA_CHECK(!ex.empty(), fs.source.path, ": data.eval: no eval example is left (", drop_reasons(st), ")",
                  st.dropped_truncated_away > 0 ? "; raise data.sequence_len or use data.truncation: drop"
                                                : "; fix the file or unset data.eval");
    fs.examples = int64_t(ex.size());
    if (all.empty()) {
      all = std::move(ex);  // ids already 0..n-1
    } else {
      for (Example& e : ex) {
        e.id = int64_t(all.size());
        all.push_back(std::move(e));
      }
    }
    if (i == 0) *total = fs.stats;
    else add_stats(total, fs.stats);
    per->push_back(std::move(fs));
  }
  return all;
}
}  // namespace

Datasets load_datasets(const DataOptions& opts, const Tokenizer& tok) {
  // No train file with an eval list: `qlora eval` of a config's data.eval where its training files are absent.
  QLORA_CHECK(!opts.train.empty() || !opts.eval.empty(), "data.train: no training file given");
  check_files_exist(opts);
  Datasets d;
  int64_t records = 0;
  RecordIndex train_seen;
  std::vector<std::string> digests;  // of each kept train record, numbered as Example::record
  std::vector<Example> all =
      load_sources(opts.train, opts, tok, false, &d.stats, &d.train_sources, &records, &train_seen, nullptr, &digests);
  if (!opts.eval.empty()) {
    DataStats& est = d.eval_stats;
    int64_t eval_records = 0;
    RecordIndex eval_seen;
    d.eval = load_sources(opts.eval, opts, tok, true, &est, &d.eval_sources, &eval_records, &eval_seen, &train_seen,
                          nullptr);
    QLORA_CHECK(!d.eval.empty(), source_paths(opts.eval), ": data.eval: no eval example is left (", drop_reasons(est),
                "); fix the file or unset data.eval");
    est.eval_examples = int64_t(d.eval.size());
    d.train = std::move(all);
  } else if (opts.val_set_size > 0) {
    QLORA_CHECK(opts.val_set_size < 1 || std::floor(opts.val_set_size) == opts.val_set_size,
                "data.val_set_size: a fraction (< 1) or a whole count (>= 1), got ", opts.val_set_size);
    // The hold-out is drawn over the records, before the drops (as Axolotl splits the dataset
    // before its sequence-length filter): the same records for a given data.seed whatever
    // sequence_len, truncation or template drop, and a split raw text's pieces all on one side.
    const int64_t n = records;
    const int64_t k = val_set_count(opts.val_set_size, n);  // ceil(fraction * n), as HF datasets' train_test_split
    QLORA_CHECK(k < n, "data.val_set_size: ", opts.val_set_size, " leaves no training record out of ", n);
    // Held-out records: the first k of a permutation from a stream separate from the epochs'.
    const auto perm = epoch_permutation(n, opts.seed ^ 0x5EED0A15ull, 0, true);
    std::vector<char> is_eval(size_t(n), 0);
    for (int64_t i = 0; i < k; ++i) is_eval[size_t(perm[i])] = 1;
    for (Example& e : all) (is_eval[size_t(e.record)] ? d.eval : d.train).push_back(std::move(e));
    // Which records, for `data preview`; and those whose twin stayed in train (deduplicate off:
    // eval_loss then partly measures memorisation; on, no two records are equal).
    std::unordered_map<std::string, int64_t> train_side;  // digest -> its first record left for training
    for (int64_t r = 0; r < n; ++r)
      if (!is_eval[size_t(r)]) train_side.emplace(digests[size_t(r)], r);
    for (int64_t r = 0; r < n; ++r) {
      if (!is_eval[size_t(r)]) continue;
      if (d.stats.held_out_listed.size() < DataStats::kListedPerReason)
        d.stats.held_out_listed.push_back(record_location(d.train_sources, r));
      const auto twin = train_side.find(digests[size_t(r)]);
      if (twin == train_side.end()) continue;
      if (d.stats.held_out_in_train++ == 0)
        d.stats.held_out_in_train_first =
            record_location(d.train_sources, r) + " = " + record_location(d.train_sources, twin->second);
    }
    QLORA_CHECK(!d.train.empty(), "data.val_set_size: ", opts.val_set_size, " holds out every record that gave a ",
                "training example (", k, " of ", n, " records held out)");
    QLORA_CHECK(!d.eval.empty(), "data.val_set_size: none of the ", k, " held-out records gives an eval example (",
                drop_reasons(d.stats), "); raise data.val_set_size or data.sequence_len");
    for (size_t i = 0; i < d.train.size(); ++i) d.train[i].id = int64_t(i);
    for (size_t i = 0; i < d.eval.size(); ++i) d.eval[i].id = int64_t(i);
    d.stats.held_out_records = k;
  } else {
    d.train = std::move(all);
  }
  d.stats.train_examples = int64_t(d.train.size());
  d.stats.eval_examples = int64_t(d.eval.size());
  count(d.train, &d.stats);
  return d;
}

std::string record_location(const std::vector<SourceStats>& sources, int64_t record) {
  for (const SourceStats& f : sources)
    if (record >= f.first_record && record - f.first_record < int64_t(f.record_lines.size()))
      return f.source.path + ":" + std::to_string(f.record_lines[size_t(record - f.first_record)]);
  return "";
}

std::string drop_reasons(const DataStats& st) {
  std::ostringstream o;
  o << st.read.records_read << " records read, " << st.dropped_too_long << " longer than sequence_len "
    << st.sequence_len << " (dropped), " << st.dropped_truncated_away << " whose trainable tokens were all past sequence_len "
    << st.sequence_len << " (truncated away), " << st.dropped_no_trainable - st.dropped_nothing_to_predict
    << " without an assistant turn";
  if (st.dropped_nothing_to_predict > 0)
    o << ", " << st.dropped_nothing_to_predict << " raw texts of one token (nothing to predict)";
  if (st.read.skipped_invalid > 0) o << ", " << st.read.skipped_invalid << " skipped as invalid";
  if (st.deduplicate && st.duplicates > 0)
    o << ", " << st.duplicates << " duplicates of an earlier record (data.deduplicate)";
  if (st.deduplicate && st.eval_in_train > 0) o << ", " << st.eval_in_train << " also in data.train (data.deduplicate)";
  return o.str();
}

std::string unused_records_note(const DataStats& st) {
  const int64_t unused = st.dropped_too_long + st.dropped_truncated_away + st.dropped_no_trainable +
                         st.read.skipped_invalid + (st.deduplicate ? st.duplicates + st.eval_in_train : 0);
  if (unused == 0) return "";
  std::ostringstream o;
  o << unused << " of " << st.read.records_read << " records not used (" << drop_reasons(st)
    << "); `qlora data preview` lists the first " << DataStats::kListedPerReason << " of each kind";
  if (st.dropped_too_long > 0) {
    if (st.read.format == "completion")
      o << "; data.truncation: split trains on all of a long text (in sequence_len pieces), truncate on its start, "
           "or raise data.sequence_len";
    else
      o << "; data.truncation: truncate keeps long ones cut, or raise data.sequence_len";
  }
  return o.str();
}

std::string placeholder_note(const ReadStats& st) {
  if (st.placeholder_records == 0) return "";
  std::string names;
  for (const std::string& n : st.placeholder_names) names += (names.empty() ? "" : ", ") + n;
  return std::to_string(st.placeholder_records) + " of " + std::to_string(st.records_read) +
         " records hold template placeholders (" + names + "; the first at " + st.placeholder_first +
         "): they are trained as written; replace them first (LLaMA-Factory's identity.json expects you to)";
}

std::string tools_note(const DataStats& st, const std::string& template_name) {
  if (st.tools_not_rendered == 0) return "";
  std::string renderers;
  for (const std::string& n : template_names())
    if (template_renders_tools(n)) renderers += (renderers.empty() ? "" : ", ") + n;
  return std::to_string(st.tools_not_rendered) + (st.tools_not_rendered == 1 ? " record carries" : " records carry") +
         " tools that template " + template_name + " does not render (" +
         (is_family_template(template_name) ? "its chat template ignores them, as transformers' apply_chat_template does"
                                            : "it has no place for them") +
         "); use a template that renders tools (" + renderers + ") or put the schemas in the system message";
}

std::string reasoning_note(const DataStats& st, const std::string& template_name) {
  if (st.reasoning_not_rendered == 0) return "";
  return std::to_string(st.reasoning_not_rendered) +
         (st.reasoning_not_rendered == 1 ? " record carries" : " records carry") +
         " reasoning_content on an assistant message that template " + template_name + " does not render (" +
         (is_family_template(template_name) ? "its chat template ignores the field, as transformers' apply_chat_template does"
                                            : "it has no place for it") +
         "): the thinking is not trained; use qwen3 (the one template that renders it), or write it into the content";
}

std::string duplicates_note(const Datasets& d) {
  if (d.stats.deduplicate) return "";
  std::vector<std::string> parts;
  const auto add = [&parts](int64_t n, const std::string& one, const std::string& many, const std::string& first) {
    if (n > 0) parts.push_back(std::to_string(n) + (n == 1 ? one : many) + " (first: " + first + ")");
  };
  add(d.stats.duplicates, " record duplicates an earlier one", " records duplicate an earlier one", d.stats.duplicate_first);
  add(d.stats.held_out_in_train, " held-out record (val_set_size) also appears in train",
      " held-out records (val_set_size) also appear in train", d.stats.held_out_in_train_first);
  add(d.eval_stats.eval_in_train, " data.eval record also appears in data.train",
      " data.eval records also appear in data.train", d.eval_stats.eval_in_train_first);
  add(d.eval_stats.duplicates, " data.eval record duplicates an earlier one", " data.eval records duplicate an earlier one",
      d.eval_stats.duplicate_first);
  if (parts.empty()) return "";
  std::string out;
  for (const std::string& p : parts) out += p + "; ";
  return out + "set data.deduplicate: true to drop them";
}

std::string truncated_note(const DataStats& st) {
  if (st.truncated == 0) return "";
  std::ostringstream o;
  o << st.truncated << (st.truncated == 1 ? " record" : " records") << " longer than sequence_len " << st.sequence_len
    << (st.truncated == 1 ? " was" : " were") << " cut to it (data.truncation: truncate): their tokens past "
    << st.sequence_len << " are left out (not trained on; not scored by eval); `qlora data preview` lists them";
  return o.str();
}

namespace {
/// Mistral v0.3's jinja writes the system message into the last message only when that is a user
/// message ("loop.last"): a training conversation ends with an answer, so its system message is
/// not rendered (apply_chat_template drops it too; trial 26: 100 of 300 records lost it unsaid).
std::string system_note(const DataStats& st, const std::string& template_name) {
  if (template_name != "mistral" || st.system_records == 0) return "";
  return std::to_string(st.system_records) + (st.system_records == 1 ? " record has" : " records have") +
         " a system message that template mistral does not render: Mistral v0.3's chat template writes it only "
         "into a conversation's last message when that is a user message, never into one that ends with an answer "
         "(as transformers' apply_chat_template does); put it into the first user message, or use a template that "
         "renders it";
}
}  // namespace

namespace {
/// The notes on what template_name makes of a file's records (tools, reasoning, system messages),
/// non-empty ones only: the tail of file_notes, and what data preview warns per file.
std::vector<std::string> template_notes(const DataStats& st, const std::string& template_name) {
  std::vector<std::string> notes;
  for (std::string note : {tools_note(st, template_name), reasoning_note(st, template_name), system_note(st, template_name)})
    if (!note.empty()) notes.push_back(std::move(note));
  return notes;
}
}  // namespace

std::vector<std::string> file_notes(const DataStats& st, const std::string& template_name) {
  std::vector<std::string> notes;
  for (std::string note : {unused_records_note(st), truncated_note(st), placeholder_note(st.read)})
    if (!note.empty()) notes.push_back(std::move(note));
  for (std::string& note : template_notes(st, template_name)) notes.push_back(std::move(note));
  return notes;
}

std::string DataStats::summary() const {
  std::ostringstream o;
  o << "format: " << read.format << "\n"
    << "records read: " << read.records_read << ", skipped invalid: " << read.skipped_invalid;
  for (const auto& [reason, n] : read.skip_reasons) o << " [" << reason << ": " << n << "]";
  o << "\n";
  for (const auto& m : read.skip_examples) o << "  skipped: " << m << "\n";
  if (read.skipped_invalid > int64_t(read.skip_examples.size()))
    o << "  skipped: (and " << read.skipped_invalid - int64_t(read.skip_examples.size()) << " more)\n";
  o << "dropped: " << dropped_too_long << " longer than sequence_len " << sequence_len << ", "
    << dropped_no_trainable << " without trainable tokens, " << dropped_truncated_away
    << " whose trainable tokens were all truncated away";
  if (deduplicate) o << ", " << duplicates << " duplicates (data.deduplicate)";
  o << "; truncated: " << truncated << "\n"
    << listed_records(*this);
  if (split_documents > 0)
    o << "split: " << split_documents << " documents longer than sequence_len " << sequence_len << " into "
      << split_pieces << " pieces of <= " << sequence_len << " tokens (" << split_tails_dropped
      << " single-token tails dropped)\n";
  o
    << "examples: " << train_examples << " train, " << eval_examples << " eval";
  if (held_out_records > 0)
    o << " (val_set_size: " << held_out_records << " records held out, before the drops)";
  o << "\n";
  if (held_out_records > 0) {
    o << "  held out:";
    for (size_t i = 0; i < held_out_listed.size(); ++i) o << (i ? ", " : " ") << held_out_listed[i];
    if (held_out_records > int64_t(held_out_listed.size()))
      o << " (and " << held_out_records - int64_t(held_out_listed.size()) << " more)";
    o << "\n";
  }
  o
    << "tokens (train): " << tokens_total << " total, " << tokens_trainable << " trainable";
  if (tokens_total > 0) o << " (" << (100.0 * double(tokens_trainable) / double(tokens_total)) << "%)";
  o << ", max length " << max_len << "\n";
  o << "length histogram (tokens):\n";
  const int64_t bin = (sequence_len + 7) / 8;
  int64_t peak = 1;
  for (int64_t c : length_hist) peak = std::max(peak, c);
  for (size_t i = 0; i < length_hist.size(); ++i) {
    o << "  [" << int64_t(i) * bin << ", " << (i + 1 == length_hist.size() ? sequence_len + 1 : int64_t(i + 1) * bin)
      << ") " << length_hist[i] << " " << std::string(size_t(40 * length_hist[i] / peak), '#') << "\n";
  }
  return o.str();
}

std::string render_masked(const Example& ex, const Tokenizer& tok) {
  std::string out;
  if (tok.is_hf_json()) {
    // tokenizer.json pieces are byte-level ("Ġ", "Ċ") or metaspace: each run of equal label state
    // is shown as decode(ids up to its end) minus decode(ids before it), special tokens written
    // out, so the runs concatenate to decode(all ids). Decoding a run alone would differ where the
    // decoder looks at position: Llama 2's Strip(" ", 1, 0) drops the leading space of every run
    // ("[/INST]]]The" for "[/INST] The"). Where the shorter decode is not a prefix of the longer
    // (a UTF-8 character split across the boundary), the run is decoded alone.
    std::string before;  // decode(ids[0, i))
    for (size_t i = 0; i < ex.input_ids.size();) {
      const bool m = ex.labels[i] == kIgnoreIndex;
      const size_t start = i;
      for (; i < ex.input_ids.size() && (ex.labels[i] == kIgnoreIndex) == m; ++i) {}
      const std::string upto = tok.decode(TokenIds(ex.input_ids.begin(), ex.input_ids.begin() + i), false);
      const std::string text =
          upto.compare(0, before.size(), before) == 0
              ? upto.substr(before.size())
              : tok.decode(TokenIds(ex.input_ids.begin() + start, ex.input_ids.begin() + i), false);
      before = upto;
      out += m ? "[[" + text + "]]" : text;
    }
    return out;
  }
  bool masked = false;
  std::string bytes;  // pending byte-fallback bytes
  auto flush_bytes = [&]() { out += bytes; bytes.clear(); };
  for (size_t i = 0; i < ex.input_ids.size(); ++i) {
    const bool m = ex.labels[i] == kIgnoreIndex;
    if (m != masked) {
      flush_bytes();
      out += m ? "[[" : "]]";
      masked = m;
    }
    const std::string p = tok.id_to_piece(ex.input_ids[i]);
    if (tok.is_special(ex.input_ids[i])) {
      flush_bytes();
      out += p.empty() ? "<" + std::to_string(ex.input_ids[i]) + ">" : p;
    } else if (p.size() == 6 && p.compare(0, 3, "<0x") == 0 && p[5] == '>') {
      bytes.push_back(char(std::stoi(p.substr(3, 2), nullptr, 16)));
    } else {
      flush_bytes();
      for (size_t k = 0; k < p.size();) {
        if (p.compare(k, 3, "\xe2\x96\x81") == 0) { out += ' '; k += 3; }
        else out += p[k++];
      }
    }
  }
  flush_bytes();
  if (masked) out += "]]";
  return out;
}

BatchingStats batching_stats(const std::vector<Example>& train, int64_t micro_batch_size, const DataOptions& opts,
                             int32_t pad_id, uint64_t epoch) {
  QLORA_CHECK(micro_batch_size >= 1, "micro_batch_size must be >= 1, got ", micro_batch_size);
  BatchingStats st;
  if (train.empty()) return st;
  DataLoader loader(&train, micro_batch_size, opts, pad_id, SamplerState{epoch, 0, opts.seed});
  st.micro_batches = loader.batches_in_epoch(epoch);
  for (int64_t i = 0; i < st.micro_batches; ++i) {
    const Batch b = loader.next();
    st.rows += b.batch_size;
    st.examples += static_cast<int64_t>(b.example_ids.size());
    st.positions += b.batch_size * b.seq_len;
    st.tokens += std::count(b.attention_mask.begin(), b.attention_mask.end(), 1);
    // As the trainer's loss counts them (count_targets): label t is a target when position t - 1
    // holds the same example (no target across a packed boundary, from padding, or at a row start).
    for (int64_t r = 0; r < b.batch_size; ++r)
      for (int64_t t = 1; t < b.seq_len; ++t)
        st.trained += b.labels[size_t(b.at(r, t))] != kIgnoreIndex &&
                      b.segment_ids[size_t(b.at(r, t))] == b.segment_ids[size_t(b.at(r, t - 1))];
  }
  return st;
}

namespace {
std::string batching_summary(const Datasets& d, const DataOptions& opts, const Tokenizer& tok, const BatchPlan& p) {
  const int32_t pad_id = tok.batch_pad_id();
  const BatchingStats b = batching_stats(d.train, p.micro_batch_size, opts, pad_id);
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(1);
  const double pos = static_cast<double>(std::max<int64_t>(1, b.positions));
  o << "batches (epoch 1 as `qlora train` draws it on one rank; micro_batch_size " << p.micro_batch_size
    << ", sample_packing " << (opts.sample_packing ? "true" : "false") << "): " << b.micro_batches
    << " micro-batches, " << b.rows << " rows holding " << b.examples << " examples";
  if (opts.sample_packing) {
    o.precision(2);
    o << " (" << static_cast<double>(b.examples) / static_cast<double>(std::max<int64_t>(1, b.rows)) << " a row)";
    o.precision(1);
  }
  o << "\n  " << b.positions << " batch positions: " << b.tokens << " tokens (" << 100.0 * b.tokens / pos << "%), "
    << b.positions - b.tokens << " padding (" << 100.0 * (b.positions - b.tokens) / pos << "%), " << b.trained
    << " trained (" << 100.0 * b.trained / pos << "%)\n";
  const int64_t ga = std::max<int64_t>(1, p.gradient_accumulation_steps);
  int64_t steps = 0;  // counted as Trainer::setup does: one loader, each epoch's batch count
  const DataLoader loader(&d.train, p.micro_batch_size, opts, pad_id, SamplerState{0, 0, opts.seed});
  for (int64_t e = 0; e < std::max<int64_t>(1, p.num_epochs); ++e)
    steps += (loader.batches_in_epoch(static_cast<uint64_t>(e)) + ga - 1) / ga;
  o << "optimizer steps on one rank (gradient_accumulation_steps " << ga << "): "
    << (b.micro_batches + ga - 1) / ga << " in epoch 1, " << steps << " in " << std::max<int64_t>(1, p.num_epochs)
    << " epoch" << (p.num_epochs > 1 ? "s" : "");
  if (p.max_steps > 0) o << "; max_steps " << p.max_steps << " runs " << p.max_steps;
  o << " (N data-parallel ranks: about 1/N as many)\n";
  return o.str();
}
}  // namespace

namespace {
/// With several files, one line each: "  data.train[1] PATH (format sharegpt): K examples; <drop_reasons>"
/// after a header line; one file: "" (the summary says it all).
std::string sources_summary(const std::vector<SourceStats>& v, const char* key) {
  if (v.size() < 2) return "";
  std::ostringstream o;
  o << key << ": " << v.size() << " files, their examples concatenated in this order:\n";
  for (size_t i = 0; i < v.size(); ++i)
    o << "  " << key << "[" << i << "] " << v[i].source.path << " (format " << v[i].stats.read.format << "): "
      << v[i].examples << " examples; " << drop_reasons(v[i].stats) << "\n";
  return o.str();
}
}  // namespace

std::string render_preview(const DataOptions& opts, const Tokenizer& tok, int n, const BatchPlan* plan,
                           const std::string& model_dir) {
  const Datasets d = load_datasets(opts, tok);
  std::ostringstream o;
  if (d.stats.read.format == "completion") {
    // render(): raw text is [BOS, where the tokenizer adds one] text [EOS] whatever data.template
    // names; train_on_inputs only labels the BOS, a position the shifted loss never predicts.
    o << "format: completion, sequence_len " << opts.sequence_len << ", truncation " << opts.truncation
      << "  (raw text: data.template does not apply; every text token trained"
      << (opts.add_eos ? ", EOS last" : "")
      << "; train_on_inputs only labels the BOS, which no position predicts; [[masked]] = label -100)\n";
  } else {
    for (const std::string& note : template_warnings(opts.template_name, model_dir, tok, opts.add_eos)) o << "warning: " << note << "\n";
    o << "template: " << opts.template_name << ", sequence_len " << opts.sequence_len << ", truncation "
      << opts.truncation << ", train_on_inputs " << (opts.train_on_inputs ? "true" : "false")
      << "  ([[masked]] = label -100)\n";
  }
  if (const std::string note = placeholder_note(d.stats.read); !note.empty()) o << "warning: " << note << "\n";
  if (const std::string note = duplicates_note(d); !note.empty()) o << "warning: data: " << note << "\n";
  for (const std::vector<SourceStats>* v : {&d.train_sources, &d.eval_sources})  // per file, as train / eval warn
    for (const SourceStats& f : *v)
      for (const std::string& note : template_notes(f.stats, opts.template_name))
        o << "warning: data: " << f.source.path << ": " << note << "\n";
  // The first n examples of each train file (several files: each file's, so a later file's
  // format and template rendering is seen too), each headed by the file:line of its record.
  const size_t files = std::max<size_t>(d.train_sources.size(), 1);
  std::vector<int> shown(files, 0);
  for (const Example& e : d.train) {
    size_t f = 0;  // the file of its record: the last whose first record is at or before it
    while (f + 1 < d.train_sources.size() && e.record >= d.train_sources[f + 1].first_record) ++f;
    if (shown[f] >= n) continue;
    if (shown[f]++ == 0 && d.train_sources.size() > 1)
      o << "==== data.train[" << f << "] " << d.train_sources[f].source.path << ": its first " << n << (n == 1 ? " example\n" : " examples\n");
    const std::string where = record_location(d.train_sources, e.record);
    o << "---- example " << e.id << ": " << e.input_ids.size() << " tokens"
      << (e.untruncated_len > 0 ? " (cut from " + std::to_string(e.untruncated_len) + ")" : "") << ", "
      << trained_targets(e.labels)
      << " trainable" << (where.empty() ? "" : " (" + where + ")") << "\n"
      << render_masked(e, tok) << "\n";
  }
  o << "----\n" << d.stats.summary();
  o << sources_summary(d.train_sources, "data.train");
  if (plan) o << batching_summary(d, opts, tok, *plan);
  if (!opts.eval.empty())
    o << "eval " << source_paths(opts.eval) << ": " << d.eval.size() << " examples kept; " << drop_reasons(d.eval_stats)
      << "\n" << listed_records(d.eval_stats) << sources_summary(d.eval_sources, "data.eval");
  return o.str();
}

}  // namespace qlora::data
