// qlora-cpp dataset pipeline: read -> render -> tokenise -> length policy -> train/eval split,
// with the statistics that `qlora data preview` prints.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "data/options.h"
#include "data/reader.h"
#include "data/template.h"
#include "data/tokenizer.h"

namespace qlora::data {

/// Counters of one load. Token counts are over the kept examples (after truncation).
struct DataStats {
  ReadStats read;                     ///< records read / skipped (reasons) and the format
  int64_t dropped_too_long = 0;       ///< truncation = drop and longer than sequence_len
  int64_t truncated = 0;              ///< truncation = truncate, cut and kept (not those truncated away)
  int64_t dropped_no_trainable = 0;   ///< no target even before truncation: no assistant turn, or (raw text) one token
  int64_t dropped_nothing_to_predict = 0;  ///< of dropped_no_trainable: raw texts of one token (nothing to predict)
  int64_t dropped_truncated_away = 0; ///< truncation = truncate cut every trainable token away
  int64_t split_documents = 0;        ///< truncation = split: raw texts longer than sequence_len, split
  int64_t split_pieces = 0;           ///< the examples those documents became (tails dropped not counted)
  int64_t split_tails_dropped = 0;    ///< single-token last pieces dropped (nothing to predict in them)
  int64_t tools_not_rendered = 0;     ///< conversations with `tools` the template does not render (template_renders_tools)
  /// conversations with an assistant `reasoning_content` (not "") the template does not render
  /// (template_renders_reasoning: all but qwen3)
  int64_t reasoning_not_rendered = 0;
  /// conversations with a system turn of their own (data.default_system_message not counted): a
  /// model tuned on them may need one at inference (what `generate`'s empty-answer hint tells)
  int64_t system_records = 0;
  /// The first kListedPerReason records of each reason that were not used ("dropped", "no
  /// trainable token", "truncated away", and with data.deduplicate "duplicate", "also in
  /// data.train") or were cut ("truncated"), each "file:line: reason (N tokens)" (a duplicate:
  /// "file:line: the same record as FILE:LINE"); what `qlora data preview` lists.
  std::map<std::string, std::vector<std::string>> listed;
  static constexpr size_t kListedPerReason = 5;
  /// Exact duplicates (record_digest equal) of an earlier record of the same list (data.train's
  /// files in order, or data.eval's): dropped before anything else when `deduplicate`, else only
  /// counted. A record of data.eval also in data.train counts in eval_in_train instead.
  int64_t duplicates = 0;
  /// data.eval records whose content is a data.train record's (eval stats only): dropped when `deduplicate`.
  int64_t eval_in_train = 0;
  /// "FILE:LINE = FILE:LINE": the first duplicate / eval_in_train record and the earlier record it
  /// repeats ("" when none).
  std::string duplicate_first, eval_in_train_first;
  bool deduplicate = false;  ///< data.deduplicate was on: duplicates and eval_in_train were dropped
  int64_t train_examples = 0, eval_examples = 0;
  /// val_set_size: the records held out (eval_examples are what of them survives the drops; 0 = no hold-out)
  int64_t held_out_records = 0;
  /// The first kListedPerReason held-out records' "FILE:LINE", in list / file order.
  std::vector<std::string> held_out_listed;
  /// Held-out records whose content is also a record left for training (only with deduplicate
  /// off: on, no two records are equal); held_out_in_train_first as duplicate_first.
  int64_t held_out_in_train = 0;
  std::string held_out_in_train_first;
  /// tokens_trainable: next-token targets the shifted loss uses (trained_targets: labels[1:] !=
  /// -100 per example), what a run's target_tokens counts per epoch.
  int64_t tokens_total = 0, tokens_trainable = 0;
  int64_t max_len = 0;
  std::vector<int64_t> length_hist;   ///< 8 bins of width ceil(sequence_len / 8) over example lengths
  int64_t sequence_len = 0;
  /// Multi-line human-readable summary.
  std::string summary() const;
};

/// The next-token targets one example trains: labels[t] != -100 for t >= 1 (position t - 1
/// predicts label t; no position predicts the first token, so its label never counts). Equals
/// transformers' `(labels[..., 1:] != -100).sum()` on the example, and what the trainer's loss
/// counts for it in a batch (padding and packing add none).
int64_t trained_targets(const std::vector<int32_t>& labels);

/// One file of data.train / data.eval and what its load did.
/// The config key of file `i` of `n` in data.train (data.eval when `is_eval`): "data.train" for the
/// only file, else "data.train[i]" (Config::key_sources knows both: with_key_sources puts the
/// entry's file:line in front of a message that starts with it). Throws nothing.
std::string source_key(bool is_eval, size_t n, size_t i);

struct SourceStats {
  DataSource source;      ///< the list entry (path and its overrides)
  DataStats stats;        ///< that file's reads and drops (token counts, histogram: not filled)
  int64_t examples = 0;   ///< the examples it gave (before a val_set_size hold-out)
  /// Example::record of this file's first record (records are numbered over the list's files in order)
  int64_t first_record = 0;
  std::vector<int64_t> record_lines;  ///< the 1-based line where each of its records starts
};

/// The SHA-256 (hex) of what record `r` holds, not where it is (file, line, index): is_text, the raw
/// text, the tools JSON and each turn's role, content, tool calls (name, arguments, id), tool_call_id,
/// reasoning_content and Axolotl weight, each length-prefixed. Records read from other files, or
/// written with other key order, spacing or escapes, or in another format (an alpaca record and the
/// same exchange as sharegpt), have the same digest when they normalise to the same record; a tool
/// call's arguments keep their key order (they are rendered as written). data.deduplicate's test
/// of "exact duplicate".
std::string record_digest(const Record& r);

/// "file:line" of the record Example::record `record` numbers among `sources` (the list the
/// example was loaded from: Datasets::train_sources for a train or val_set_size hold-out example,
/// eval_sources for a data.eval one); "" for -1 (not from a record) or a number outside the list.
std::string record_location(const std::vector<SourceStats>& sources, int64_t record);

struct Datasets {
  std::vector<Example> train, eval;
  /// The train files together (and a val_set_size hold-out): per-file counts summed, `listed` and
  /// skip examples the first few over the files in order, read.format the files' formats in list
  /// order, each once, joined by ", " ("alpaca, sharegpt"). One file: exactly that file's stats.
  DataStats stats;
  DataStats eval_stats;  ///< the data.eval files together (as `stats`): their reads and drops
  std::vector<SourceStats> train_sources, eval_sources;  ///< per file, in list order
};

/// "N records read, a longer than sequence_len L (dropped), b whose trainable tokens were all past
/// sequence_len L (truncated away), c without an assistant turn[, e raw texts of one token (nothing
/// to predict)], d skipped as invalid[, f duplicates of an earlier record (data.deduplicate)][, g also
/// in data.train (data.deduplicate)]": the drop reasons of one file, for the "no example" errors.
std::string drop_reasons(const DataStats& st);

/// "" when every record of the file became an example (duplicates count as not used only when
/// data.deduplicate dropped them); else "N of M records not used (<drop_reasons>);
/// `qlora data preview` lists the first 5 of each kind" for the warning `train` and `eval` log
/// (a silent drop of a third of the data is a wrong run nobody sees), plus a hint: for raw text
/// (format completion) data.truncation: split, else truncate or a larger data.sequence_len.
std::string unused_records_note(const DataStats& st);

/// "" when no record holds a `{{name}}` placeholder; else "N of M records hold template
/// placeholders ({{name}}, {{author}}; the first at file:line): they are trained as written; replace
/// them first (LLaMA-Factory's identity.json expects you to)": the warning `train`, `eval` and
/// `data preview` print.
std::string placeholder_note(const ReadStats& st);

/// "" when no record's `tools` were dropped; else "N records carry tools that template NAME does
/// not render (its chat template ignores them, as transformers' apply_chat_template does); use a
/// template that renders tools (qwen2.5, qwen3, llama3.1, llama3.2, mistral) or put the schemas in
/// the system message" (a generic template: "it has no place for them"): the warning `train`,
/// `eval` and `data preview` print per file. The assistant turns still hold the calls, so without
/// it the model learns to call functions it never saw defined. The list is template_renders_tools'.
std::string tools_note(const DataStats& st, const std::string& template_name);

/// "" when no record's reasoning_content was dropped; else "N records carry reasoning_content on an
/// assistant message that template NAME does not render (its chat template ignores the field, as
/// transformers' apply_chat_template does | it has no place for it): the thinking is not trained; use
/// qwen3, or write it into the content" — the per-file warning (as tools_note). The list is
/// template_renders_reasoning's.
std::string reasoning_note(const DataStats& st, const std::string& template_name);

/// "" when data.deduplicate is on (duplicates were dropped: unused_records_note says so per file) or
/// no record repeats another; else "N records duplicate an earlier one (first: FILE:LINE =
/// FILE:LINE); K held-out records also appear in train (first: ...); E data.eval records also
/// appear in data.train (first: ...); D data.eval records duplicate an earlier one (first: ...);
/// set data.deduplicate: true to drop them" (the parts that apply): the one warning `train` and
/// `data preview` print, since a hold-out sharing records with train measures memorisation.
std::string duplicates_note(const Datasets& d);

/// "" or, for records kept but cut (data.truncation: truncate), "N records longer than sequence_len
/// L were cut to it (data.truncation: truncate): their tokens past L are not trained; `qlora data
/// preview` lists them" (a trial: only data preview said so).
std::string truncated_note(const DataStats& st);

/// The warnings `train` and `eval` log for one file of data.train / data.eval, in this order:
/// unused_records_note, truncated_note, placeholder_note, tools_note, reasoning_note, and for template
/// mistral a note on its system messages (Mistral v0.3's jinja renders none in a conversation that ends
/// with an answer) (each only when non-empty). The caller prefixes
/// "data: <path>: ". Empty when the file needs no warning.
std::vector<std::string> file_notes(const DataStats& st, const std::string& template_name);

/// Tokenises the records of one file with opts (template, add_eos, train_on_inputs, length).
/// Examples get ids 0..n-1 in file order (a split document's pieces consecutive, in text order).
/// Stats are accumulated into `stats`.
/// Length policy (opts.truncation) for an example of n > L = sequence_len tokens:
///   drop: not used (counted); truncate: its first L tokens;
///   split (raw text only): pieces ids[0, L), ids[L, 2L), ... (BOS only in the first piece, EOS
///   only in the last, labels sliced with the ids); a last piece of 1 token is dropped (counted
///   in split_tails_dropped), as Axolotl's completion type does (min_sample_len 2).
/// Throws qlora::Error "file:line: data.truncation: split ..." when truncation is split and a
/// record is a conversation (splitting one would train answers without their prompt).
std::vector<Example> build_examples(const std::vector<Record>& records, const DataOptions& opts,
                                    const Tokenizer& tok, DataStats* stats);

/// Loads opts.train (and opts.eval, or holds out data::val_set_count(val_set_size, n) examples:
/// ceil(fraction * n) or a count, chosen by a seeded permutation) into tokenised examples.
/// Several files: each is read (its format detected, opts.format / field_map / role_map or the
/// entry's own: options_for) and tokenised on its own, then their examples are concatenated in
/// list order with ids 0..n-1, as Hugging Face datasets' concatenate_datasets; the hold-out and
/// the epoch shuffle see only the concatenation. One file gives what it gave before lists.
/// Exact duplicates (record_digest) are counted per file as they are read (DataStats::duplicates,
/// eval_in_train); with opts.deduplicate they are dropped there, the first in list / file order
/// kept, so the hold-out draws from distinct records and a data.eval file keeps none of train's
/// (Axolotl's dataset_exact_deduplication). stats.held_out_listed / held_out_in_train say which
/// records were held out and how many of them have a twin left in train.
/// Throws qlora::Error for reader errors (`file:line: problem`, the file's own), for a
/// val_set_size that leaves no training example, when a train file has no example with a trainable
/// token ("<file>: no example has a trainable token (<counts per drop reason>)"; in a list too: a
/// file that adds nothing is a mistake), and when a data.eval file is set but none of its
/// examples is left (same form: an eval set that silently evaluates nothing is refused). An empty
/// opts.train is taken only with a non-empty opts.eval (train is then empty and nothing is compared
/// with it); with neither it throws "data.train: no training file given".
Datasets load_datasets(const DataOptions& opts, const Tokenizer& tok);

/// Every file of opts.train and opts.eval exists and is not a directory (what load_datasets checks
/// first, before any file is read). Throws qlora::Error with one line per file at fault, each
/// starting with its key: "data.train[1]: no such file: /x/y.json" (qlora::ErrorList for several).
void check_files_exist(const DataOptions& opts);

/// The training run's batch settings that `qlora data preview` reports on (TrainingConfig's names).
struct BatchPlan {
  int64_t micro_batch_size = 1, gradient_accumulation_steps = 1, num_epochs = 1, max_steps = 0;
};

/// What the training loader (DataLoader, sampler seed opts.seed: the order `qlora train` uses on
/// one rank) makes of `train` in epoch `epoch`. Token counts are positions (tokens).
struct BatchingStats {
  int64_t micro_batches = 0, rows = 0, examples = 0;
  int64_t tokens = 0;     ///< real tokens (attention_mask 1)
  int64_t positions = 0;  ///< batch positions: rows × the micro-batch's padded length, summed
  int64_t trained = 0;    ///< next-token targets the loss uses (label != -100 at t, same example at t - 1)
};
/// Runs the loader over one epoch. Throws qlora::Error when micro_batch_size < 1 or pad_id < 0.
BatchingStats batching_stats(const std::vector<Example>& train, int64_t micro_batch_size, const DataOptions& opts,
                             int32_t pad_id, uint64_t epoch = 0);

/// "  dropped: file:line: reason (N tokens)" lines, the records `st.listed` holds, with
/// "(and N more)" where a reason has more than were listed. "" when none.
std::string listed_records(const DataStats& st);

/// Loads the data as load_datasets does and returns a header (format completion: "format:
/// completion, sequence_len L, truncation T (raw text: ...)", what applies to raw text; else
/// "template: NAME, sequence_len L, truncation T, train_on_inputs B"), the first `n` training
/// examples of each data.train file (several files: under a "==== data.train[i] PATH" line)
/// rendered with masked spans in [[double brackets]], their token counts and record's file:line, and
/// stats.summary() (with the first records of each drop reason: listed_records); with a
/// `plan`, also how the first epoch is batched (micro-batches, rows, examples a row, padding) and
/// the optimizer steps `qlora train` runs on one rank (as Trainer counts them: ceil(micro-batches /
/// gradient_accumulation_steps) per epoch, or max_steps). `pad_id`: the tokenizer's pad, else eos.
/// When the data is not raw text, first a "warning: " line for each of template_warnings (the
/// template is not the model's own: only with `model_dir`; its markers are not tokens of `tok`).
std::string render_preview(const DataOptions& opts, const Tokenizer& tok, int n, const BatchPlan* plan = nullptr,
                           const std::string& model_dir = "");

/// An example's tokens as text, masked runs wrapped in [[ ]] (special ids shown as pieces;
/// tokenizer.json: each run is decode(ids up to its end) minus decode(ids before it), so without the
/// markers the text is decode(all ids, skip_special_tokens=false), as transformers' decode).
std::string render_masked(const Example& ex, const Tokenizer& tok);

}  // namespace qlora::data
