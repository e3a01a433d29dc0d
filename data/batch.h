// qlora-cpp batches, sampler and loader (torch-free).
//
// Batch contract (what the model side relies on), all arrays row-major [batch_size, seq_len]:
//   input_ids       int32; padding positions hold pad_id (tokenizer pad, or eos when none)
//   labels          int32; == input_ids where trained, -100 elsewhere (padding, masked prompt);
//                   NOT shifted: the loss compares logits[t] with labels[t + 1] within a row
//   attention_mask  int32 0/1; 0 exactly at padding
//   position_ids    int32; 0, 1, 2, ... restarting at 0 at the start of every example; 0 at padding
//   segment_ids     int32; 0 = padding, k = the k-th example (1-based) in the row
//   example_ids     int64, one per example in the batch, in row order (Example::id)
// Packing (sample_packing): several examples share a row. The model MUST build a
// block-diagonal causal mask: token i may attend to token j iff j <= i and
// segment_ids[i] == segment_ids[j] != 0, and use position_ids for RoPE. The loss must not
// predict across examples either: the label at the first token of segment k+1 is never used
// as the target of the last token of segment k (callers mask targets where
// segment_ids[t] != segment_ids[t + 1]). Without packing every row holds one example and the
// mask is the usual causal mask times attention_mask.
// Padding: to the longest row in the micro-batch, right (default) or left.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "data/options.h"
#include "data/template.h"

namespace qlora::data {

struct Batch {
  int64_t batch_size = 0, seq_len = 0;
  std::vector<int32_t> input_ids, labels, attention_mask, position_ids, segment_ids;
  std::vector<int64_t> example_ids;
  /// Element (row, col) of a [batch_size, seq_len] array.
  int64_t at(int64_t row, int64_t col) const { return row * seq_len + col; }
};

/// Collates rows (each a list of examples laid end to end) into a Batch padded with `pad_id`
/// to the longest row; left_pad puts padding first.
Batch collate(const std::vector<std::vector<const Example*>>& rows, int32_t pad_id, bool left_pad);

/// Everything that decides the next batch. Serialised with every checkpoint.
struct SamplerState {
  uint64_t epoch = 0;   ///< epochs completed
  uint64_t cursor = 0;  ///< examples of this epoch's permutation already consumed
  uint64_t seed = 42;
  bool operator==(const SamplerState& o) const { return epoch == o.epoch && cursor == o.cursor && seed == o.seed; }
};
void to_json(nlohmann::json& j, const SamplerState& s);
/// Throws qlora::Error when a field is missing or not an unsigned integer.
void from_json(const nlohmann::json& j, SamplerState& s);

/// The order of epoch `epoch`: Fisher-Yates over 0..n-1 driven by splitmix64 seeded from
/// (seed, epoch), bounded draws by rejection; identity when !shuffle. Same on every platform.
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, uint64_t epoch, bool shuffle);

/// Yields batches of `batch_size` rows forever, epoch after epoch. A batch never spans two
/// epochs (the last batch of an epoch may have fewer rows). With sample_packing, examples are
/// laid greedily in permutation order into rows of at most sequence_len tokens (a row closes
/// when the next example does not fit). Restoring state() taken after any batch continues with
/// exactly the batch an uninterrupted run would produce next.
class DataLoader {
 public:
  /// `examples` must outlive the loader. pad_id < 0 is an error.
  DataLoader(const std::vector<Example>* examples, int64_t batch_size, const DataOptions& opts,
             int32_t pad_id, SamplerState state);
  Batch next();
  const SamplerState& state() const { return state_; }
  /// Number of batches epoch `epoch` yields (packing makes it depend on the permutation).
  int64_t batches_in_epoch(uint64_t epoch) const;

 private:
  // Rows of the batch starting at `cursor` in `perm`; returns the cursor after it.
  uint64_t take(const std::vector<int64_t>& perm, uint64_t cursor,
                std::vector<std::vector<const Example*>>* rows) const;
  const std::vector<Example>* ex_;
  int64_t batch_size_;
  DataOptions opts_;
  int32_t pad_id_;
  SamplerState state_;
  std::vector<int64_t> perm_;
  uint64_t perm_epoch_ = ~0ull;
};

}  // namespace qlora::data
