// `qlora data preview CONFIG` (rendered examples, masked spans, statistics) and `qlora train CONFIG`.
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "common/error.h"
#include "common/log.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "model/model_config.h"
#include "cli/commands.h"
#include "config/config.h"
#include "trainer/distributed.h"
#include "trainer/train.h"

namespace qlora {

std::string cmd_data_preview(const DataPreviewOptions& o) {
  const Config cfg = load_config(o.config_path, o.overrides);
  for (const std::string& w : config_warnings(cfg)) log::warn(w);
  const std::string tok_src = check_config_inputs(cfg, /*need_weights=*/false);
  const data::Tokenizer tok = data::Tokenizer::from_pretrained(tok_src);
  log::info("tokenizer: ", tok.describe());
  // sequence_len past the model's positions, as train and estimate warn (trial 23); the preview
  // itself needs no model config: one it cannot read is train's error to give
  if (!cfg.model.path.empty() && std::filesystem::is_regular_file(std::filesystem::path(cfg.model.path) / "config.json")) {
    try {
      if (const std::string note = positions_note(cfg.data.sequence_len, load_model_config(cfg.model.path)); !note.empty())
        log::warn("data.sequence_len: ", note);
    } catch (const Error&) {
    }
  }
  QLORA_CHECK(o.n >= 0, "data preview: --n must be >= 0, got ", o.n);
  data::DataOptions dopts = cfg.data;
  const std::string preview = with_key_sources(cfg, [&] {
    dopts.template_name = data::resolve_template(dopts.template_name, tok_src);  // "auto" -> a name
    const data::BatchPlan plan{cfg.training.micro_batch_size, cfg.training.gradient_accumulation_steps,
                               cfg.training.num_epochs, cfg.training.max_steps};
    return data::render_preview(dopts, tok, o.n, &plan, tok_src);
  });
  return preview;
}

void check_train_options(const TrainCliOptions& o) {
  QLORA_CHECK(o.max_time_s >= 0, "--max-time ", o.max_time_s,
              ": expected a budget in seconds >= 0 (0: no limit); a budget already spent is not a run");
}

void cmd_train(const TrainCliOptions& o) {
  check_train_options(o);
  RunOptions run;
  run.dist = read_dist_env();  // RANK / WORLD_SIZE / ... (docs/distributed.md): checked before anything else
  if (run.dist.rank > 0) log::setup(log::Level::warn);  // rank 0 tells the story; the others warn and fail
  run.force = o.force;
  run.max_time_s = o.max_time_s;
  run.overwrite_output_dir = o.overwrite_output_dir;
  // The resume command of the interrupt message: this command without --overwrite-output-dir.
  run.command = "qlora train " + shell_quote(o.config_path);
  run.command_without_resume = run.command;
  run.estimate_command = "qlora estimate --config " + shell_quote(o.config_path);
  for (const std::string& ov : o.overrides) {
    run.command += " --set " + shell_quote(ov);
    run.estimate_command += " --set " + shell_quote(ov);
    if (ov.rfind("checkpoint.resume=", 0) != 0 && ov.rfind("checkpoint.resume_from_dir=", 0) != 0)
      run.command_without_resume += " --set " + shell_quote(ov);
  }
  std::string tail;
  if (o.force) tail += " --force";
  if (o.max_time_s > 0) {
    std::ostringstream t;
    t << std::setprecision(15) << o.max_time_s;  // "15", not std::to_string's "15.000000"
    tail += " --max-time " + shell_quote(t.str());
  }
  if (const char* n = std::getenv("QLORA_LAUNCHED_NPROC"); n && *n) {  // a rank of `--nproc-per-node N`
    tail += " --nproc-per-node " + shell_quote(n);
    run.launched = true;
  }
  run.command += tail;
  run.command_without_resume += tail;
  Config cfg = load_config(o.config_path, o.overrides);
  if (run.dist.rank == 0)
    for (const std::string& w : config_warnings(cfg)) log::warn(w);
  Trainer trainer(std::move(cfg), run);
  trainer.setup();
  trainer.train();
}

}  // namespace qlora
