// qlora-cpp batches, sampler and loader. See batch.h for the contract.
#include "data/batch.h"

#include <algorithm>
#include <limits>
#include <set>

#include "common/error.h"

namespace qlora::data {

Batch collate(const std::vector<std::vector<const Example*>>& rows, int32_t pad_id, bool left_pad) {
  Batch b;
  b.batch_size = static_cast<int64_t>(rows.size());
  std::vector<int64_t> lens;
  for (const auto& row : rows) {
    int64_t n = 0;
    for (const Example* e : row) n += static_cast<int64_t>(e->input_ids.size());
    lens.push_back(n);
    b.seq_len = std::max(b.seq_len, n);
  }
  const size_t total = static_cast<size_t>(b.batch_size * b.seq_len);
  b.input_ids.assign(total, pad_id);
  b.labels.assign(total, kIgnoreIndex);
  b.attention_mask.assign(total, 0);
  b.position_ids.assign(total, 0);
  b.segment_ids.assign(total, 0);
  for (int64_t r = 0; r < b.batch_size; ++r) {
    int64_t col = left_pad ? b.seq_len - lens[r] : 0;
    int32_t seg = 0;
    for (const Example* e : rows[r]) {
      ++seg;
      b.example_ids.push_back(e->id);
      for (size_t t = 0; t < e->input_ids.size(); ++t, ++col) {
        const int64_t i = b.at(r, col);
        b.input_ids[i] = e->input_ids[t];
        b.labels[i] = e->labels[t];
        b.attention_mask[i] = 1;
        b.position_ids[i] = static_cast<int32_t>(t);
        b.segment_ids[i] = seg;
      }
    }
  }
  return b;
}

void to_json(nlohmann::json& j, const SamplerState& s) {
  j = nlohmann::json{{"epoch", s.epoch}, {"cursor", s.cursor}, {"seed", s.seed},
                     {"packer", s.packer == Packer::kNextFit ? "next_fit" : "best_fit_decreasing"}};
}

void from_json(const nlohmann::json& j, SamplerState& s) {
  for (const char* k : {"epoch", "cursor", "seed"})
    QLORA_CHECK(j.is_object() && j.contains(k) && j[k].is_number_unsigned(), "sampler state: field '", k,
                "' missing or not an unsigned integer");
  s.epoch = j["epoch"].get<uint64_t>();
  s.cursor = j["cursor"].get<uint64_t>();
  s.seed = j["seed"].get<uint64_t>();
  s.packer = Packer::kNextFit;  // written before session 24: its run packed next-fit
  if (j.contains("packer")) {
    const nlohmann::json& p = j["packer"];
    QLORA_CHECK(p == "best_fit_decreasing" || p == "next_fit", "sampler state: field 'packer' must be "
                "\"best_fit_decreasing\" or \"next_fit\", got ", p.dump());
    s.packer = p == "next_fit" ? Packer::kNextFit : Packer::kBestFitDecreasing;
  }
}

std::vector<std::vector<int64_t>> pack_best_fit_decreasing(const std::vector<int64_t>& lengths, int64_t capacity) {
  QLORA_CHECK(capacity > 0, "packing: row capacity must be > 0 tokens, got ", capacity);
  const int64_t n = static_cast<int64_t>(lengths.size());
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  std::vector<std::vector<int64_t>> rows;
  std::set<std::pair<int64_t, int64_t>> open;  // (room left, row): the best fit is the first with room >= length
  for (const int64_t i : order) {
    const int64_t len = lengths[i];
    QLORA_CHECK(len >= 0, "packing: item ", i, " has a negative length ", len);
    const auto fit = len > capacity ? open.end() : open.lower_bound({len, std::numeric_limits<int64_t>::min()});
    if (fit == open.end()) {
      rows.push_back({i});
      if (len <= capacity) open.insert({capacity - len, static_cast<int64_t>(rows.size()) - 1});
      continue;
    }
    const auto [room, row] = *fit;
    open.erase(fit);
    rows[row].push_back(i);
    open.insert({room - len, row});
  }
  for (std::vector<int64_t>& r : rows) std::sort(r.begin(), r.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.front() < b.front(); });
  return rows;
}

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, uint64_t epoch, bool shuffle) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  if (!shuffle || n < 2) return p;
  uint64_t state = seed;
  uint64_t mix = splitmix64(state) ^ (epoch * 0xD1B54A32D192ED03ull);
  state = mix;
  for (int64_t i = n - 1; i > 0; --i) {
    const uint64_t bound = static_cast<uint64_t>(i) + 1;
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;  // reject the biased tail
    uint64_t r;
    do r = splitmix64(state);
    while (r >= limit);
    std::swap(p[i], p[r % bound]);
  }
  return p;
}

DataLoader::DataLoader(const std::vector<Example>* examples, int64_t batch_size, const DataOptions& opts,
                       int32_t pad_id, SamplerState state)
    : ex_(examples), batch_size_(batch_size), opts_(opts), pad_id_(pad_id), state_(state) {
  QLORA_CHECK(ex_ && !ex_->empty(), "data: no training examples");
  QLORA_CHECK(batch_size_ > 0, "micro_batch_size: must be > 0, got ", batch_size_);
  QLORA_CHECK(pad_id_ >= 0, "data: pad id must be >= 0 (tokenizer has neither pad nor eos)");
  QLORA_CHECK(state_.cursor <= ex_->size(), "sampler state: cursor ", state_.cursor, " > dataset size ",
              ex_->size(), " (resuming with a different dataset?)");
  plan_ = plan(state_.epoch);
  plan_epoch_ = state_.epoch;
  if (best_fit())
    QLORA_CHECK(std::binary_search(plan_.row_start.begin(), plan_.row_start.end(), state_.cursor), "sampler state: cursor ",
                state_.cursor, " is not between two packed rows of epoch ", state_.epoch + 1,
                " (resuming with another dataset or sequence_len?)");
}

DataLoader::EpochPlan DataLoader::plan(uint64_t epoch) const {
  EpochPlan p;
  p.perm = epoch_permutation(int64_t(ex_->size()), state_.seed, epoch, opts_.shuffle);
  if (!best_fit()) return p;
  std::vector<int64_t> lengths;
  lengths.reserve(p.perm.size());
  for (const int64_t i : p.perm) lengths.push_back(static_cast<int64_t>((*ex_)[i].input_ids.size()));
  p.rows = pack_best_fit_decreasing(lengths, opts_.sequence_len);
  p.row_start.assign(1, 0);
  for (const auto& r : p.rows) p.row_start.push_back(p.row_start.back() + r.size());
  return p;
}

uint64_t DataLoader::take(const EpochPlan& p, uint64_t cursor, std::vector<std::vector<const Example*>>* rows) const {
  rows->clear();
  const uint64_t n = p.perm.size();
  if (!opts_.sample_packing) {
    for (; cursor < n && int64_t(rows->size()) < batch_size_; ++cursor) rows->push_back({&(*ex_)[p.perm[cursor]]});
    return cursor;
  }
  if (best_fit()) {
    const auto at = std::lower_bound(p.row_start.begin(), p.row_start.end(), cursor);  // a row boundary (constructor)
    for (size_t r = static_cast<size_t>(at - p.row_start.begin());
         r < p.rows.size() && int64_t(rows->size()) < batch_size_; ++r) {
      rows->emplace_back();
      for (const int64_t k : p.rows[r]) rows->back().push_back(&(*ex_)[p.perm[k]]);
      cursor = p.row_start[r + 1];
    }
    return cursor;
  }
  int64_t used = 0;  // next-fit
  while (cursor < n) {
    const Example* e = &(*ex_)[p.perm[cursor]];
    const int64_t len = static_cast<int64_t>(e->input_ids.size());
    if (rows->empty() || used + len > opts_.sequence_len) {
      if (int64_t(rows->size()) == batch_size_) break;
      rows->emplace_back();
      used = 0;
    }
    rows->back().push_back(e);
    used += len;
    ++cursor;
  }
  return cursor;
}

Batch DataLoader::next() {
  if (plan_epoch_ != state_.epoch) {
    plan_ = plan(state_.epoch);
    plan_epoch_ = state_.epoch;
  }
  std::vector<std::vector<const Example*>> rows;
  state_.cursor = take(plan_, state_.cursor, &rows);
  if (state_.cursor >= plan_.perm.size()) {
    ++state_.epoch;
    state_.cursor = 0;
  }
  return collate(rows, pad_id_, opts_.padding_side == PaddingSide::kLeft);
}

int64_t DataLoader::batches_in_epoch(uint64_t epoch) const {
  EpochPlan other;  // the plan held for the current epoch is not computed again (the trainer's epoch 0)
  const EpochPlan& p = epoch == plan_epoch_ ? plan_ : (other = plan(epoch));
  if (best_fit()) return (static_cast<int64_t>(p.rows.size()) + batch_size_ - 1) / batch_size_;
  std::vector<std::vector<const Example*>> rows;
  int64_t count = 0;
  for (uint64_t c = 0; c < p.perm.size(); ++count) c = take(p, c, &rows);
  return count;
}

}  // namespace qlora::data
