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

/// How sample_packing lays an epoch's examples into rows of at most sequence_len tokens.
enum class Packer : uint8_t {
  /// Best-fit decreasing over the whole epoch (pack_best_fit_decreasing): rows ~96-99 % full on the
  /// alpaca demo, as TRL's pack_dataset "bfd" and Axolotl's multipack fill them. The default.
  kBestFitDecreasing,
  /// Next-fit in permutation order (a row closes when the next example does not fit; torchtune's
  /// PackedDataset): rows ~75 % full. Checkpoints written before session 24 resume with it.
  kNextFit,
};

/// Everything that decides the next batch. Serialised with every checkpoint.
struct SamplerState {
  uint64_t epoch = 0;   ///< epochs completed
  uint64_t cursor = 0;  ///< examples of this epoch's permutation already consumed
  uint64_t seed = 42;
  Packer packer = Packer::kBestFitDecreasing;  ///< with sample_packing; JSON "packer"
  bool operator==(const SamplerState& o) const {
    return epoch == o.epoch && cursor == o.cursor && seed == o.seed && packer == o.packer;
  }
};
void to_json(nlohmann::json& j, const SamplerState& s);
/// Throws qlora::Error when epoch / cursor / seed is missing or not an unsigned integer, or
/// "packer" is not "best_fit_decreasing" / "next_fit". No "packer" (a checkpoint written before
/// session 24) is next_fit, the packing that checkpoint's run used.
void from_json(const nlohmann::json& j, SamplerState& s);

/// Best-fit decreasing bin packing (Johnson 1973; the strategy "bfd" of TRL's pack_dataset):
/// items in decreasing length (ties: lower index first), each into the open row with the least room
/// that still holds it (ties: the row opened first), else into a new row; an item longer than
/// `capacity` gets a row of its own. Returns the rows as indices into `lengths`, each row ascending,
/// rows ordered by their first index, so a shuffled `lengths` order gives a shuffled row order.
/// `lengths`: tokens per item (>= 0), in permutation order; `capacity` > 0 tokens. O(n log n).
/// Throws qlora::Error when `capacity` <= 0 or a length is negative.
std::vector<std::vector<int64_t>> pack_best_fit_decreasing(const std::vector<int64_t>& lengths, int64_t capacity);

/// The order of epoch `epoch`: Fisher-Yates over 0..n-1 driven by splitmix64 seeded from
/// (seed, epoch), bounded draws by rejection; identity when !shuffle. Same on every platform.
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, uint64_t epoch, bool shuffle);

/// Yields batches of `batch_size` rows forever, epoch after epoch. A batch never spans two
/// epochs (the last batch of an epoch may have fewer rows). With sample_packing, the state's
/// packer lays each epoch's permutation into rows of at most sequence_len tokens (Packer), and a
/// batch is the next `batch_size` rows. Restoring state() taken after any batch continues with
/// exactly the batch an uninterrupted run would produce next; a cursor that is not a row boundary
/// of the epoch's packing (another dataset or sequence_len) throws qlora::Error.
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
  /// One epoch's order: its permutation and, with best-fit packing, its rows (positions in `perm`)
  /// with the examples before each row (`row_start`, one more entry than rows).
  struct EpochPlan {
    std::vector<int64_t> perm;
    std::vector<std::vector<int64_t>> rows;
    std::vector<uint64_t> row_start;
  };
  EpochPlan plan(uint64_t epoch) const;
  // Rows of the batch starting at `cursor` in `p`; returns the cursor after it.
  uint64_t take(const EpochPlan& p, uint64_t cursor, std::vector<std::vector<const Example*>>* rows) const;
  bool best_fit() const { return opts_.sample_packing && state_.packer == Packer::kBestFitDecreasing; }
  const std::vector<Example>* ex_;
  int64_t batch_size_;
  DataOptions opts_;
  int32_t pad_id_;
  SamplerState state_;
  EpochPlan plan_;
  uint64_t plan_epoch_ = ~0ull;
};

}  // namespace qlora::data
