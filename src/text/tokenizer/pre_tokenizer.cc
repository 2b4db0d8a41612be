#include "text/tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

#include "text/tokenizer/component_config.h"

namespace strata {
namespace {

// The regex of the reference's ByteLevel pre-tokenizer when use_regex is on (GPT-2's).
constexpr std::string_view kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view kPunctuationClass =
    "\\p{P}\\u0021-\\u002F\\u003A-\\u0040\\u005B-\\u0060\\u007B-\\u007E";

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
  const std::string type = component_type(config);
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
    const bool invert = component_truthy(config, "invert");
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
    step.add_prefix_space = component_truthy(config, "add_prefix_space");
    const auto it = config.find("use_regex");
    const bool use_regex =
        it == config.end() || it->is_null() || component_truthy(config, "use_regex");
    if (use_regex) {
      auto pattern = Pattern::regex(kGpt2Regex);
      if (!pattern) return std::unexpected(pattern.error());
      step.pattern.emplace(std::move(*pattern));
    }
  } else if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    step.add_prefix_space = component_truthy(config, "add_prefix_space");
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
    const bool individual = component_truthy(config, "individual_digits");
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

Result<bool> PreTokenizer::apply(size_t step_index, std::string_view piece, int section_index,
                                 const PieceSink& sink) const {
  if (step_index == steps_.size()) return sink(piece);
  const Step& step = steps_[step_index];
  // The next step (or the sink) for one piece of this step.
  const auto next = [this, step_index, section_index, &sink](std::string_view sub) -> Result<bool> {
    return apply(step_index + 1, sub, section_index, sink);
  };
  // A failure inside a sink is kept here and reported after the scan stops. The lambdas
  // handed to the scans capture two references, so their std::function holds them without
  // allocating (one piece must not cost an allocation).
  std::optional<Error> failed;
  const auto forward = [&next, &failed](std::string_view sub) {
    auto r = next(sub);
    if (!r) {
      failed = r.error();
      return false;
    }
    return *r;
  };
  auto finish = [&failed](Result<bool> scanned) -> Result<bool> {
    if (failed) return std::unexpected(*failed);
    return scanned;
  };
  switch (step.kind) {
    case Kind::kSplitMatch:
      return finish(step.pattern->for_each_match(piece, [&piece, &forward](TextSpan m) {
        return m.end <= m.begin || forward(piece.substr(m.begin, m.size()));
      }));
    case Kind::kSplitRemoved:
      return finish(step.pattern->for_each_split(piece, forward));
    case Kind::kSplitIsolated: {
      // regexSplit in the reference: the gaps and the (non-empty) matches, in order.
      struct Cursor {
        std::string_view text;
        size_t prev = 0;  // end of the last match
      } cursor{piece};
      auto scanned = step.pattern->for_each_match(piece, [&cursor, &forward](TextSpan m) {
        if (cursor.prev < m.begin &&
            !forward(cursor.text.substr(cursor.prev, m.begin - cursor.prev))) {
          return false;
        }
        if (m.end > m.begin && !forward(cursor.text.substr(m.begin, m.size()))) return false;
        cursor.prev = m.end;
        return true;
      });
      if (!scanned || !*scanned || failed) return finish(scanned);
      if (cursor.prev < piece.size()) return next(piece.substr(cursor.prev));
      return true;
    }
    case Kind::kByteLevel: {
      std::string_view text = piece;
      std::string prefixed;
      if (step.add_prefix_space && !text.starts_with(' ')) {
        prefixed.reserve(piece.size() + 1);
        prefixed.push_back(' ');
        prefixed.append(piece);
        text = prefixed;
      }
      if (!step.pattern) return next(text);
      return finish(step.pattern->for_each_match(text, [&text, &forward](TextSpan m) {
        return m.end <= m.begin || forward(text.substr(m.begin, m.size()));
      }));
    }
    case Kind::kMetaspace: {
      std::string text = replace_all_literal(piece, " ", step.str_rep);
      const bool scheme_allows =
          !step.prepend_never && (!step.prepend_first_only || section_index == 0);
      if (step.add_prefix_space && !std::string_view(text).starts_with(step.replacement) &&
          scheme_allows) {
        text.insert(0, step.str_rep);
      }
      return next(text);
    }
  }
  return true;
}

Result<bool> PreTokenizer::pre_tokenize(std::string_view text, int section_index,
                                        const PieceSink& sink) const {
  return apply(0, text, section_index, sink);
}

}  // namespace strata
