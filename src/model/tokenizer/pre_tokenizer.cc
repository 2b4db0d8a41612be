#include "model/tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

namespace strata {
namespace {

// The regex of the reference's ByteLevel pre-tokenizer when use_regex is on (GPT-2's).
constexpr std::string_view kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view kPunctuationClass =
    "\\p{P}\\u0021-\\u002F\\u003A-\\u0040\\u005B-\\u0060\\u007B-\\u007E";
constexpr std::string_view kMetaspaceChar = "\xE2\x96\x81";  // U+2581

std::string type_of(const nlohmann::json& config) {
  const auto it = config.find("type");
  return it != config.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// JavaScript truthiness of an optional boolean-ish field.
bool truthy(const nlohmann::json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return false;
  if (it->is_boolean()) return it->get<bool>();
  if (it->is_number()) return it->get<double>() != 0;
  if (it->is_string()) return !it->get<std::string>().empty();
  return true;
}

std::string replace_all_literal(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size() + 8);
  size_t prev = 0;
  while (true) {
    const size_t hit = text.find(from, prev);
    if (hit == std::string_view::npos) break;
    out.append(text.substr(prev, hit - prev));
    out.append(to);
    prev = hit + from.size();
  }
  out.append(text.substr(prev));
  return out;
}

}  // namespace

Result<PreTokenizer> PreTokenizer::from_json(const nlohmann::json& config) {
  PreTokenizer p;
  if (config.is_null()) return p;
  if (auto st = add_steps(config, p.steps_); !st) return std::unexpected(st.error());
  for (size_t i = 0; i < p.steps_.size(); ++i) {
    if (p.steps_[i].kind == Kind::kByteLevel) {
      if (i + 1 != p.steps_.size()) {
        return make_error(ErrorCode::kUnsupported,
                          "a ByteLevel pre-tokenizer followed by other pre-tokenizers");
      }
      p.byte_level_ = true;
    }
  }
  return p;
}

PreTokenizer PreTokenizer::llama_non_legacy() {
  PreTokenizer p;
  Step step;
  step.kind = Kind::kMetaspace;
  step.add_prefix_space = true;
  step.replacement = std::string(kMetaspaceChar);
  step.str_rep = step.replacement;
  step.prepend_first_only = true;
  p.steps_.push_back(std::move(step));
  return p;
}

Status PreTokenizer::add_steps(const nlohmann::json& config, std::vector<Step>& steps) {
  if (!config.is_object()) {
    return make_error(ErrorCode::kCorrupt, "pre_tokenizer must be an object or null");
  }
  const std::string type = type_of(config);
  Step step;
  auto set_match_regex = [&](std::string_view regex) -> Status {
    auto pattern = Pattern::regex(regex);
    if (!pattern) return std::unexpected(pattern.error());
    step.kind = Kind::kSplitMatch;
    step.pattern.emplace(std::move(*pattern));
    return {};
  };
  if (type == "Sequence") {
    for (const auto& child : config.at("pretokenizers")) {
      if (auto st = add_steps(child, steps); !st) return st;
    }
    return {};
  }
  if (type == "Split") {
    const bool invert = truthy(config, "invert");
    auto pattern = Pattern::from_json(config.at("pattern"), invert);
    if (!pattern) return std::unexpected(pattern.error());
    step.pattern.emplace(std::move(*pattern));
    std::string behavior = config.value("behavior", std::string());
    std::transform(behavior.begin(), behavior.end(), behavior.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    // The reference implements invert, "removed" and, for every other behaviour, isolated.
    step.kind = invert                  ? Kind::kSplitMatch
                : behavior == "removed" ? Kind::kSplitRemoved
                                        : Kind::kSplitIsolated;
  } else if (type == "ByteLevel") {
    step.kind = Kind::kByteLevel;
    step.add_prefix_space = truthy(config, "add_prefix_space");
    const auto it = config.find("use_regex");
    const bool use_regex = it == config.end() || it->is_null() || truthy(config, "use_regex");
    if (use_regex) {
      auto pattern = Pattern::regex(kGpt2Regex);
      if (!pattern) return std::unexpected(pattern.error());
      step.pattern.emplace(std::move(*pattern));
    }
  } else if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    step.add_prefix_space = truthy(config, "add_prefix_space");
    step.replacement = config.at("replacement").get<std::string>();
    const auto rep = config.find("str_rep");
    step.str_rep = rep != config.end() && rep->is_string() && !rep->get<std::string>().empty()
                       ? rep->get<std::string>()
                       : step.replacement;
    if (step.str_rep.find('$') != std::string::npos) {
      return make_error(ErrorCode::kUnsupported, "Metaspace replacement containing '$'");
    }
    const auto scheme = config.find("prepend_scheme");
    const std::string prepend =
        scheme != config.end() && scheme->is_string() ? scheme->get<std::string>() : "always";
    step.prepend_first_only = prepend == "first";
    step.prepend_never = prepend != "always" && prepend != "first";
  } else if (type == "Digits") {
    const bool individual = truthy(config, "individual_digits");
    if (auto st = set_match_regex(individual ? "[^\\d]+|\\d" : "[^\\d]+|\\d+"); !st) return st;
  } else if (type == "Whitespace") {
    if (auto st = set_match_regex("\\w+|[^\\w\\s]+"); !st) return st;
  } else if (type == "WhitespaceSplit") {
    if (auto st = set_match_regex("\\S+"); !st) return st;
  } else if (type == "Punctuation") {
    const std::string regex =
        "[^" + std::string(kPunctuationClass) + "]+|[" + std::string(kPunctuationClass) + "]+";
    if (auto st = set_match_regex(regex); !st) return st;
  } else {
    return make_error(ErrorCode::kUnsupported,
                      "pre_tokenizer type '" + type + "' is not supported");
  }
  steps.push_back(std::move(step));
  return {};
}

Status PreTokenizer::apply(const Step& step, std::string_view piece, int section_index,
                           std::vector<std::string_view>& out, PieceList& storage) const {
  thread_local std::vector<TextSpan> matches;
  switch (step.kind) {
    case Kind::kSplitMatch: {
      matches.clear();
      if (auto st = step.pattern->find_all(piece, matches); !st) return st;
      for (const TextSpan& m : matches) {
        if (m.end > m.begin) out.push_back(piece.substr(m.begin, m.size()));
      }
      return {};
    }
    case Kind::kSplitRemoved:
      return step.pattern->split(piece, out);
    case Kind::kSplitIsolated: {
      // regexSplit in the reference: the gaps and the (non-empty) matches, in order.
      matches.clear();
      if (auto st = step.pattern->find_all(piece, matches); !st) return st;
      size_t prev = 0;
      for (const TextSpan& m : matches) {
        if (prev < m.begin) out.push_back(piece.substr(prev, m.begin - prev));
        if (m.end > m.begin) out.push_back(piece.substr(m.begin, m.size()));
        prev = m.end;
      }
      if (prev < piece.size()) out.push_back(piece.substr(prev));
      return {};
    }
    case Kind::kByteLevel: {
      std::string_view text = piece;
      if (step.add_prefix_space && !text.starts_with(' ')) {
        std::string prefixed;
        prefixed.reserve(piece.size() + 1);
        prefixed.push_back(' ');
        prefixed.append(piece);
        text = storage.own(std::move(prefixed));
      }
      if (!step.pattern) {
        out.push_back(text);
        return {};
      }
      matches.clear();
      if (auto st = step.pattern->find_all(text, matches); !st) return st;
      for (const TextSpan& m : matches) {
        if (m.end > m.begin) out.push_back(text.substr(m.begin, m.size()));
      }
      return {};
    }
    case Kind::kMetaspace: {
      std::string text = replace_all_literal(piece, " ", step.str_rep);
      const bool scheme_allows =
          !step.prepend_never && (!step.prepend_first_only || section_index == 0);
      if (step.add_prefix_space && !std::string_view(text).starts_with(step.replacement) &&
          scheme_allows) {
        text.insert(0, step.str_rep);
      }
      out.push_back(storage.own(std::move(text)));
      return {};
    }
  }
  return {};
}

Status PreTokenizer::pre_tokenize(std::string_view text, int section_index, PieceList& out) const {
  if (steps_.empty()) {
    out.pieces.push_back(text);
    return {};
  }
  thread_local std::vector<std::string_view> current;
  thread_local std::vector<std::string_view> next;
  current.assign(1, text);
  for (const Step& step : steps_) {
    next.clear();
    for (const std::string_view piece : current) {
      if (auto st = apply(step, piece, section_index, next, out); !st) return st;
    }
    current.swap(next);
  }
  out.pieces.insert(out.pieces.end(), current.begin(), current.end());
  return {};
}

}  // namespace strata
