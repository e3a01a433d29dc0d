// The system message a chat template writes on its own, for a conversation that has none. Its own
// header (not data/template.h) so that a caller needing only this string does not depend on
// template.h's Example and rendering types.
#pragma once
#include <string>

namespace qlora::data {

/// The system message template `name` renders when a conversation has no system turn, as its
/// jinja writes it: smollm2's "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
/// and qwen2.5's "You are Qwen, created by Alibaba Cloud. You are a helpful assistant." (the same
/// strings render_family writes, so render() of a record without a system turn equals render() of
/// the record with this text as its system turn). "" for every other template (llama3.1 / llama3.2
/// still write their "Cutting Knowledge Date" header, with an empty system text). Never throws.
std::string template_default_system(const std::string& name);

}  // namespace qlora::data
