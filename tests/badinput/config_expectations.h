// The bad-config corpus (tests/badinput/configs/): for each file, the line and the message
// fragment (key + problem) its error must name. Shared by test_badinput (load_config) and
// test_trainer (`qlora train` on each file with a valid model and data beside it).
#pragma once
#include <map>
#include <string>

namespace qlora::test {

struct BadConfigExpect {
  int line;              ///< 1-based line named in the message; 0 = the message names no line
  const char* fragment;  ///< must appear in the message
};

/// One entry per file in tests/badinput/configs/ (the test fails on a file without an entry).
inline const std::map<std::string, BadConfigExpect>& bad_config_expectations() {
  static const std::map<std::string, BadConfigExpect> table = {
      {"axolotl_adapter.yaml", {1, "adapter: unknown key; Axolotl / Hugging Face's \"adapter\" is \"quantization.method\" here (adapter: qlora is method: nf4, adapter: lora is method: none)"}},
      {"axolotl_save_total_limit.yaml", {8, "checkpoint.save_total_limit: unknown key; Axolotl / Hugging Face's \"save_total_limit\" is \"checkpoint.keep_last\" here"}},
      {"alias_bomb.yaml", {7, "YAML error: more than 100000 nodes (after expanding aliases)"}},
      {"blocksize_not_power_of_two.yaml", {8, "quantization.blocksize: expected a power of two in [32, 4096], got 100"}},
      {"colon_in_plain_value.yaml", {1, "YAML syntax error"}},
      {"control_character.yaml", {3, "YAML error: control characters are not allowed"}},
      {"data_train_empty_list.yaml", {5, "data.train: expected at least one file (a path, or a list of files each a path or {path: FILE, format: ..., field_map: {...}, role_map: {...}}), got an empty list"}},
      {"data_train_entry_bad_format.yaml", {7, "data.train[0].format: expected one of auto|alpaca|sharegpt|messages|completion, got \"alpacca\"; did you mean \"alpaca\"?"}},
      {"data_train_entry_missing_path.yaml", {7, "data.train[1].path: required key is missing"}},
      {"data_train_entry_unknown_key.yaml", {8, "data.train[1].type: unknown key; Axolotl's \"type\" is \"format\" here"}},
      {"data_train_map.yaml", {5, "data.train: expected a path, or a list of files each a path or {path: FILE, format: ..., field_map: {...}, role_map: {...}}, got a map"}},
      {"data_train_missing.yaml", {4, "data.train: required key is missing"}},
      {"deep_nesting.yaml", {2, "YAML error: nested deeper than 256 levels"}},
      {"dropout_one.yaml", {7, "lora.dropout: expected a number in [0, 1), got 1.0"}},
      {"dtype_float64.yaml", {4, "model.dtype: expected one of bf16|fp16|fp32|auto (or torch's bfloat16|float16|float32), got \"float64\""}},
      {"duplicate_key.yaml", {9, "training.learning_rate: duplicate key (first set on line 7)"}},
      {"duplicate_top_level.yaml", {6, "output_dir: duplicate key (first set on line 1)"}},
      {"empty.yaml", {0, "the config is empty"}},
      {"field_map_value_list.yaml", {6, "data.field_map.instruction: expected a name, got a list"}},
      {"integer_overflow.yaml", {6, "data.sequence_len: expected a token count in 1..2147483647"}},
      {"keep_best_no_eval.yaml", {7, "checkpoint.keep_best: no eval data, so no checkpoint has an eval_loss"}},
      {"keep_last_zero.yaml", {7, "checkpoint.keep_last: expected an integer >= 1, got 0"}},
      {"leading_comma.yaml", {2, "YAML syntax error: did not find expected node content"}},
      {"lora_alpha_string.yaml", {8, "lora.alpha: expected a positive number, got \"32\" (a quoted string)"}},
      {"lora_r_negative.yaml", {7, "lora.r: expected a positive integer, got -8"}},
      {"malformed_indent.yaml", {5, "YAML syntax error"}},
      {"malformed_unclosed_flow.yaml", {3, "YAML syntax error"}},
      {"micro_batch_size_string.yaml", {7, "training.micro_batch_size: expected a positive integer, got \"four\""}},
      {"micro_batch_size_zero.yaml", {7, "training.micro_batch_size: expected a positive integer, got 0"}},
      {"misspelt_learning_rate.yaml", {8, "training.lerning_rate: unknown key; did you mean \"learning_rate\"?"}},
      {"model_missing.yaml", {0, "model: required section is missing"}},
      {"negative_learning_rate.yaml", {7, "training.learning_rate: expected a positive number, got -2e-4"}},
      {"non_utf8_value.yaml", {5, "not valid UTF-8"}},  // found by fuzz_config
      {"nothing_to_train.yaml", {8, "nothing to train"}},
      {"only_comment.yaml", {0, "the config is empty"}},
      {"preset_without_random_init.yaml", {3, "model.preset: a preset has no weights; set model.init: random"}},
      {"section_not_a_map.yaml", {6, "lora: expected a map of keys, got a list"}},
      {"sequence_len_zero.yaml", {6, "data.sequence_len: expected a token count in 1..2147483647, got 0"}},
      // fits int64 but not the batches' int32 positions (data preview passed it, trial 23)
      {"sequence_len_past_int32.yaml", {6, "data.sequence_len: expected a token count in 1..2147483647, got 99999999999"}},
      {"split_with_conversations.yaml", {7, "data.truncation: split cuts raw text (format completion) into pieces; data.format is sharegpt"}},
      {"stray_flow_end.yaml", {2, "YAML syntax error"}},
      {"tab_indentation.yaml", {3, "a tab in the indentation"}},
      {"top_level_list.yaml", {1, "expected a map of sections at the top level, got a list"}},
      {"top_level_scalar.yaml", {1, "expected a map of sections at the top level, got \"just a string\""}},
      {"two_documents.yaml", {7, "expected one YAML document, found 2"}},
      {"undefined_alias.yaml", {7, "YAML syntax error: alias *"}},
      {"unknown_quant_method.yaml", {7, "quantization.method: expected one of nf4|fp4|none, got \"int4\""}},
      {"unknown_scheduler.yaml", {7, "training.lr_scheduler: expected one of constant|linear|cosine|constant_with_warmup|polynomial|cosine_with_restarts (transformers' defaults each: cosine and linear decay to 0; cosine_with_min_lr, warmup_stable_decay, inverse_sqrt and reduce_lr_on_plateau are not supported), got \"inverse_sqrt\""}},
      {"unknown_target_module.yaml", {7, "lora.target_modules[1]: unknown module \"v_prj\"; did you mean \"v_proj\"?"}},
      {"undefined_env_variable.yaml", {5, "data.train: environment variable QLORA_TEST_UNDEFINED_VARIABLE_16 is not defined"}},
      {"unknown_template.yaml", {6, "data.template: expected one of alpaca|chatml|llama2|vicuna|none|smollm2|qwen2.5|qwen3|llama3|llama3.1|llama3.2|mistral|auto, got \"chatlm\"; did you mean \"chatml\"?"}},
      {"unknown_top_level_key.yaml", {6, "frobnicate: unknown key"}},
      {"yaml11_boolean.yaml", {7, "training.gradient_checkpointing: expected true or false, got \"yes\""}},
  };
  return table;
}

}  // namespace qlora::test
