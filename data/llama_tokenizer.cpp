// LlamaTokenizer's pipeline and transformers' generate_merges; see llama_tokenizer.h.
#include "data/llama_tokenizer.h"

#include <algorithm>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "common/utf8.h"

namespace qlora::data {

nlohmann::json llama_pipeline(PrependScheme scheme) {
  const char* space = "\xe2\x96\x81";  // "▁"
  const char* name = scheme == PrependScheme::kAlways ? "always" : scheme == PrependScheme::kFirst ? "first" : "never";
  nlohmann::json decoders = {{{"type", "Replace"}, {"pattern", {{"String", space}}}, {"content", " "}},
                             {{"type", "ByteFallback"}},
                             {{"type", "Fuse"}}};
  if (scheme != PrependScheme::kNever)
    decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  return {{"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "Metaspace"}, {"replacement", space}, {"prepend_scheme", name}, {"split", false}}},
          {"decoder", {{"type", "Sequence"}, {"decoders", decoders}}}};
}

std::vector<MergeRule> generate_merges(const std::vector<std::string>& pieces, const std::vector<double>* scores,
                                       const std::vector<bool>* usable) {
  auto ok = [&](size_t i) { return !usable || (*usable)[i]; };
  std::unordered_map<std::string, size_t> index;  // last place of each usable piece
  for (size_t i = 0; i < pieces.size(); ++i)
    if (ok(i)) index[pieces[i]] = i;
  struct Cand {
    double key;  // score, or the merged index
    size_t llen, rlen;
    MergeRule rule;
  };
  std::vector<Cand> all;
  std::unordered_set<std::string> seen;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const std::string& p = pieces[i];
    if (!ok(i) || p.empty() || !seen.insert(p).second) continue;
    const size_t at = index.at(p);
    size_t total = 0;
    for (size_t k = 0; k < p.size(); k += utf8_sequence_length(static_cast<unsigned char>(p[k]))) ++total;
    size_t left = 0;
    // (Python also orders one piece's splits by the halves' ids first; the halves' lengths, part
    // of the rank key, already tell any two splits of one piece apart.)
    for (size_t k = utf8_sequence_length(static_cast<unsigned char>(p[0])); k < p.size();
         k += utf8_sequence_length(static_cast<unsigned char>(p[k]))) {
      ++left;
      auto l = index.find(p.substr(0, k)), r = index.find(p.substr(k));
      if (l != index.end() && r != index.end())
        all.push_back({scores ? (*scores)[at] : double(at), left, total - left,
                       {int32_t(l->second), int32_t(r->second), int32_t(at)}});
    }
  }
  if (scores) {
    std::stable_sort(all.begin(), all.end(), [](const Cand& a, const Cand& b) {
      return std::tie(a.key, a.llen, a.rlen) > std::tie(b.key, b.llen, b.rlen);
    });
  } else {
    std::stable_sort(all.begin(), all.end(), [](const Cand& a, const Cand& b) {
      return std::tie(a.key, a.llen, a.rlen) < std::tie(b.key, b.llen, b.rlen);
    });
  }
  std::vector<MergeRule> out;
  out.reserve(all.size());
  for (const Cand& c : all) out.push_back(c.rule);
  return out;
}

}  // namespace qlora::data
