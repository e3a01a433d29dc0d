// qlora-cpp batches, sampler and loader. See batch.h for the contract.
#include "data/batch.h"

#include <algorithm>

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
  j = nlohmann::json{{"epoch", s.epoch}, {"cursor", s.cursor}, {"seed", s.seed}};
}

void from_json(const nlohmann::json& j, SamplerState& s) {
  for (const char* k : {"epoch", "cursor", "seed"})
    QLORA_CHECK(j.is_object() && j.contains(k) && j[k].is_number_unsigned(), "sampler state: field '", k,
                "' missing or not an unsigned integer");
  s.epoch = j["epoch"].get<uint64_t>();
  s.cursor = j["cursor"].get<uint64_t>();
  s.seed = j["seed"].get<uint64_t>();
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
}

uint64_t DataLoader::take(const std::vector<int64_t>& perm, uint64_t cursor,
                          std::vector<std::vector<const Example*>>* rows) const {
  rows->clear();
  const uint64_t n = perm.size();
  if (!opts_.sample_packing) {
    for (; cursor < n && int64_t(rows->size()) < batch_size_; ++cursor) rows->push_back({&(*ex_)[perm[cursor]]});
    return cursor;
  }
  int64_t used = 0;
  while (cursor < n) {
    const Example* e = &(*ex_)[perm[cursor]];
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
  if (perm_epoch_ != state_.epoch) {
    perm_ = epoch_permutation(int64_t(ex_->size()), state_.seed, state_.epoch, opts_.shuffle);
    perm_epoch_ = state_.epoch;
  }
  std::vector<std::vector<const Example*>> rows;
  state_.cursor = take(perm_, state_.cursor, &rows);
  if (state_.cursor >= perm_.size()) {
    ++state_.epoch;
    state_.cursor = 0;
  }
  return collate(rows, pad_id_, opts_.padding_side == PaddingSide::kLeft);
}

int64_t DataLoader::batches_in_epoch(uint64_t epoch) const {
  const auto perm = epoch_permutation(int64_t(ex_->size()), state_.seed, epoch, opts_.shuffle);
  std::vector<std::vector<const Example*>> rows;
  int64_t count = 0;
  for (uint64_t c = 0; c < perm.size(); ++count) c = take(perm, c, &rows);
  return count;
}

}  // namespace qlora::data
