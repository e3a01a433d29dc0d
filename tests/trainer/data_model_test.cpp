// Data pipeline × model: a packed example's logits equal its logits alone (micro-batch 1 and 4),
// and left vs right padding give identical per-token losses. Tiny fixture model with the Llama 2
// tokenizer (tests/fixtures/make_models.py), fp32; tolerances as in the transformers parity tests.
#include <gtest/gtest.h>

#include "data/batch.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "test_util.h"
#include "trainer/batch_tensors.h"
#include "model/model.h"

namespace qlora {
namespace {
using torch::indexing::Slice;

std::vector<data::Record> conversations() {
  const char* qs[] = {"What is the capital of France?", "Name three primary colours.",
                      "Translate 'good morning' to German.", "What is 7 times 8?",
                      "Write a haiku about rain.", "Who wrote Hamlet?", "Give me a synonym for fast.",
                      "How many legs does a spider have?", "Summarise: the cat sat on the mat all day long."};
  const char* as[] = {"Paris.", "Red, yellow and blue.", "Guten Morgen.", "56.",
                      "Soft rain on the roof / the garden drinks in silence / clouds move on again",
                      "William Shakespeare.", "Quick.", "Eight.", "A cat rested on a mat."};
  std::vector<data::Record> out;
  for (int i = 0; i < 9; ++i) {
    data::Record r;
    r.turns = {{"user", qs[i]}, {"assistant", as[i]}};
    r.index = i;
    r.line = i + 1;
    r.file = "inline";
    out.push_back(r);
  }
  return out;
}

struct Fixture {
  LlamaModel model;
  data::Tokenizer tok;
  std::vector<data::Example> examples;
};

Fixture setup(const std::filesystem::path& dir, data::DataOptions opts) {
  Fixture s{LlamaModel::load(dir.string(), torch::kFloat32, torch::kCPU),
          data::Tokenizer::from_pretrained(dir.string()), {}};
  data::DataStats stats;
  s.examples = data::build_examples(conversations(), opts, s.tok, &stats);
  return s;
}

data::DataOptions base_opts() {
  data::DataOptions o;
  o.template_name = "chatml";
  o.sequence_len = 128;
  o.shuffle = true;
  o.seed = 7;
  return o;
}

torch::Tensor alone(const LlamaModel& m, const data::Example& ex) {
  std::vector<int64_t> ids(ex.input_ids.begin(), ex.input_ids.end());
  return m.forward({torch::tensor(ids).unsqueeze(0), {}, {}, {}})[0];
}

class Packing : public ::testing::TestWithParam<int> {};

TEST_P(Packing, PackedLogitsEqualUnpacked) {
  QLORA_REQUIRE_FIXTURE(dir, "models/llama_gqa/tokenizer.model");
  data::DataOptions o = base_opts();
  o.sample_packing = true;
  Fixture s = setup(dir.parent_path(), o);
  torch::NoGradGuard ng;
  data::DataLoader loader(&s.examples, GetParam(), o, s.tok.batch_pad_id(), {});
  int checked = 0, packed_rows = 0;
  for (int64_t bi = 0; bi < loader.batches_in_epoch(0); ++bi) {
    data::Batch b = loader.next();
    torch::Tensor logits = s.model.forward(batch_inputs(b, torch::kCPU));
    size_t ex_i = 0;
    for (int64_t row = 0; row < b.batch_size; ++row) {
      int64_t start = 0;
      int segs = 0;
      while (start < b.seq_len && b.segment_ids[b.at(row, start)] != 0) {
        const int32_t seg = b.segment_ids[b.at(row, start)];
        int64_t end = start;
        while (end < b.seq_len && b.segment_ids[b.at(row, end)] == seg) ++end;
        const data::Example& ex = s.examples[b.example_ids[ex_i++]];
        ASSERT_EQ(end - start, static_cast<int64_t>(ex.input_ids.size()));
        const double d = (logits[row].index({Slice(start, end)}) - alone(s.model, ex)).abs().max().item<double>();
        EXPECT_LE(d, 1e-4) << "example " << ex.id << " row " << row;
        ++checked;
        ++segs;
        start = end;
      }
      packed_rows += segs > 1;
    }
  }
  EXPECT_EQ(checked, 9);
  EXPECT_GT(packed_rows, 0) << "no row packed more than one example: the test would prove nothing";
}

INSTANTIATE_TEST_SUITE_P(MicroBatch, Packing, ::testing::Values(1, 4));

TEST(Padding, LeftAndRightGiveIdenticalPerTokenLoss) {
  QLORA_REQUIRE_FIXTURE(dir, "models/llama_gqa/tokenizer.model");
  std::map<int64_t, torch::Tensor> per_example[2];
  int side_i = 0;
  for (const data::PaddingSide side : {data::PaddingSide::kRight, data::PaddingSide::kLeft}) {
    data::DataOptions o = base_opts();
    o.padding_side = side;
    Fixture s = setup(dir.parent_path(), o);
    torch::NoGradGuard ng;
    data::DataLoader loader(&s.examples, 4, o, s.tok.eos_id(), {});
    for (int64_t bi = 0; bi < loader.batches_in_epoch(0); ++bi) {
      data::Batch b = loader.next();
      ForwardInputs in = batch_inputs(b, torch::kCPU);
      auto [loss, counted] = token_losses(s.model.forward(in), batch_labels(b, torch::kCPU), in.segment_ids);
      for (int64_t row = 0; row < b.batch_size; ++row)
        per_example[side_i][b.example_ids[row]] = loss[row].index({counted[row]});
    }
    ++side_i;
  }
  ASSERT_EQ(per_example[0].size(), 9u);
  for (const auto& [id, l] : per_example[0]) {
    const torch::Tensor& r = per_example[1].at(id);
    ASSERT_EQ(l.numel(), r.numel()) << id;
    ASSERT_GT(l.numel(), 0) << id;
    EXPECT_LE((l - r).abs().max().item<double>(), 1e-5) << "example " << id;
  }
}

}  // namespace
}  // namespace qlora
