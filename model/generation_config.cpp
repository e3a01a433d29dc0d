#include "model/generation_config.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "common/json_file.h"
#include "common/files.h"

namespace qlora {

void check_generate_options(const GenerateOptions& opts) {
  QLORA_CHECK(opts.max_new_tokens >= 1, "generate: --max-new-tokens must be >= 1, got ", opts.max_new_tokens);
  QLORA_CHECK(!opts.do_sample || opts.temperature > 0, "generate: --temperature must be > 0 when sampling, got ",
              opts.temperature);
  QLORA_CHECK(opts.top_k >= 0, "generate: --top-k must be >= 0 (0 = off), got ", opts.top_k);
  QLORA_CHECK(opts.top_p > 0 && opts.top_p <= 1, "generate: --top-p must be in (0, 1], got ", opts.top_p);
  QLORA_CHECK(opts.repetition_penalty > 0, "generate: --repetition-penalty must be > 0 (1 = off), got ",
              opts.repetition_penalty);
  for (const std::string& s : opts.stop_strings) QLORA_CHECK(!s.empty(), "generate: --stop must not be empty");
}

namespace {

using nlohmann::json;

std::optional<double> number_key(const json& j, const std::string& path, const char* key, double lo, bool lo_open,
                                 std::optional<double> hi, const char* range) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  const json& v = j[key];
  QLORA_CHECK(v.is_number(), path, ": ", key, ": must be a number ", range, ", got ", v.dump());
  const double x = v.get<double>();
  const bool ok = std::isfinite(x) && (lo_open ? x > lo : x >= lo) && (!hi || x <= *hi);
  QLORA_CHECK(ok, path, ": ", key, ": must be ", range, ", got ", v.dump());
  return x;
}

std::optional<int64_t> int_key(const json& j, const std::string& path, const char* key, int64_t lo) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  const json& v = j[key];
  const bool in_range = v.is_number_integer() &&
                        (v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max())
                                                : v.get<int64_t>() >= lo);
  QLORA_CHECK(in_range && v.get<int64_t>() >= lo, path, ": ", key, ": must be an integer >= ", lo, ", got ", v.dump());
  return v.get<int64_t>();
}

std::string fmt(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

}  // namespace

GenerationConfig parse_generation_config(const std::string& text, const std::string& path) {
  const json j = parse_json_file(text, path);  // a cut or hand-edited file: where it breaks (trial 21)
  QLORA_CHECK(j.is_object(), path, ":1: expected a JSON object at top level, got ", j.type_name());
  GenerationConfig c;
  if (j.contains("do_sample") && !j["do_sample"].is_null()) {
    // transformers: "Invalid value for `do_sample`: expected a boolean" (utils.py)
    QLORA_CHECK(j["do_sample"].is_boolean(), path, ": do_sample: must be true or false, got ", j["do_sample"].dump());
    c.do_sample = j["do_sample"].get<bool>();
  }
  c.temperature = number_key(j, path, "temperature", 0, false, std::nullopt, ">= 0");
  c.top_k = int_key(j, path, "top_k", 0);
  c.top_p = number_key(j, path, "top_p", 0, true, 1.0, "in (0, 1]");
  c.repetition_penalty = number_key(j, path, "repetition_penalty", 0, true, std::nullopt, "> 0");
  c.max_new_tokens = int_key(j, path, "max_new_tokens", 1);
  c.max_length = int_key(j, path, "max_length", 1);
  return c;
}

GenerationConfig read_generation_config(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "generation_config.json").string();
  if (!std::filesystem::exists(path)) return {};
  return parse_generation_config(read_file(path), path);
}

int64_t ResolvedGenerate::new_tokens_for(int64_t prompt_len) const {
  if (!max_length) return opts.max_new_tokens;
  QLORA_CHECK(prompt_len < *max_length, config_path, ": max_length: ", *max_length, " leaves no new token after a ",
              prompt_len, "-token prompt (transformers counts the prompt in max_length; pass --max-new-tokens)");
  return *max_length - prompt_len;
}

ResolvedGenerate resolve_generate_options(const GenerationConfig& flags, const GenerationConfig& file,
                                          const std::string& config_path) {
  {  // the flags' own ranges, named, whether or not the decoding uses them
    GenerateOptions f;
    f.max_new_tokens = flags.max_new_tokens.value_or(1);
    f.top_k = flags.top_k.value_or(0);
    f.top_p = flags.top_p.value_or(1.0);
    f.repetition_penalty = flags.repetition_penalty.value_or(1.0);
    check_generate_options(f);
    QLORA_CHECK(!flags.temperature || *flags.temperature >= 0, "generate: --temperature must be >= 0, got ",
                *flags.temperature);
  }
  // --temperature T > 0 samples and --temperature 0 is greedy (the CLI's meaning before
  // generation_config.json was read); with --greedy / --do-sample it must agree.
  if (flags.temperature && flags.do_sample) {
    QLORA_CHECK(*flags.do_sample == (*flags.temperature > 0), "generate: ",
                *flags.do_sample ? "--do-sample" : "--greedy", " contradicts --temperature ", fmt(*flags.temperature),
                " (--temperature 0 means greedy, > 0 sampling)");
  }
  ResolvedGenerate r;
  r.config_path = config_path;
  std::map<std::string, std::vector<std::string>> by_source;  // source -> "key value", in key order
  std::vector<std::string> order;
  const auto note = [&](const std::string& source, const std::string& item) {
    if (!by_source.count(source)) order.push_back(source);
    by_source[source].push_back(item);
  };
  const std::string from_file = config_path;
  const std::string dflt = "transformers' defaults";
  // do_sample: flag (--greedy / --do-sample, else --temperature's), else the file's, else False
  std::optional<bool> flag_sample = flags.do_sample;
  if (!flag_sample && flags.temperature) flag_sample = *flags.temperature > 0;
  GenerateOptions& o = r.opts;
  o.do_sample = flag_sample ? *flag_sample : file.do_sample.value_or(false);
  const auto src = [&](bool flag, bool in_file) { return flag ? std::string("flags") : in_file ? from_file : dflt; };
  note(src(flag_sample.has_value(), file.do_sample.has_value()), std::string("do_sample ") + (o.do_sample ? "true" : "false"));
  if (o.do_sample) {
    const bool t_flag = flags.temperature.has_value() && *flags.temperature > 0;
    o.temperature = t_flag ? *flags.temperature : file.temperature.value_or(1.0);
    QLORA_CHECK(o.temperature > 0, config_path, ": temperature: must be > 0 when sampling (do_sample true), got 0 "
                "(transformers' TemperatureLogitsWarper refuses it; pass --temperature T or --greedy)");
    note(src(t_flag, file.temperature.has_value()), "temperature " + fmt(o.temperature));
    o.top_k = flags.top_k ? *flags.top_k : file.top_k.value_or(kTransformersDefaultTopK);
    note(src(flags.top_k.has_value(), file.top_k.has_value()), "top_k " + std::to_string(o.top_k));
    o.top_p = flags.top_p ? *flags.top_p : file.top_p.value_or(1.0);
    note(src(flags.top_p.has_value(), file.top_p.has_value()), "top_p " + fmt(o.top_p));
  }
  o.repetition_penalty = flags.repetition_penalty ? *flags.repetition_penalty : file.repetition_penalty.value_or(1.0);
  note(src(flags.repetition_penalty.has_value(), file.repetition_penalty.has_value()),
       "repetition_penalty " + fmt(o.repetition_penalty));
  if (flags.max_new_tokens) {
    o.max_new_tokens = *flags.max_new_tokens;
    note("flags", "max_new_tokens " + std::to_string(o.max_new_tokens));
  } else if (file.max_new_tokens) {
    o.max_new_tokens = *file.max_new_tokens;
    note(from_file, "max_new_tokens " + std::to_string(o.max_new_tokens));
  } else if (file.max_length) {
    r.max_length = file.max_length;
    note(from_file, "max_length " + std::to_string(*file.max_length) + " (prompt + new tokens)");
  } else {
    o.max_new_tokens = kDefaultMaxNewTokens;
    note("qlora's default", "max_new_tokens " + std::to_string(o.max_new_tokens));
  }
  std::string s = o.do_sample ? "sampling (" : "greedy (";
  for (size_t i = 0; i < order.size(); ++i) {
    if (i) s += "; ";
    s += order[i] + ": ";
    const auto& items = by_source[order[i]];
    for (size_t k = 0; k < items.size(); ++k) s += (k ? ", " : "") + items[k];
  }
  r.summary = s + ")";
  return r;
}

}  // namespace qlora
