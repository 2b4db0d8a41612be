#include "text/tokenizer/normalizer.h"

#include <nlohmann/json.hpp>

#include "text/tokenizer/component_config.h"
#include "text/tokenizer/js_string.h"

namespace strata {

Result<Normalizer> Normalizer::from_json(const nlohmann::json& config) {
  Normalizer n;
  if (config.is_null()) return n;
  if (auto st = add_steps(config, n.steps_); !st) return std::unexpected(st.error());
  return n;
}

Status Normalizer::add_steps(const nlohmann::json& config, std::vector<Step>& steps) {
  if (!config.is_object()) {
    return make_error(ErrorCode::kCorrupt, "normalizer must be an object or null");
  }
  const std::string type = component_type(config);
  Step step;
  if (type == "Sequence") {
    for (const auto& child : config.at("normalizers")) {
      if (auto st = add_steps(child, steps); !st) return st;
    }
    return {};
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    step.kind = Kind::kUnicode;
    step.form = type == "NFC"    ? unicode::NormalizationForm::kNfc
                : type == "NFD"  ? unicode::NormalizationForm::kNfd
                : type == "NFKC" ? unicode::NormalizationForm::kNfkc
                                 : unicode::NormalizationForm::kNfkd;
  } else if (type == "Prepend") {
    step.kind = Kind::kPrepend;
    step.text = config.at("prepend").get<std::string>();
  } else if (type == "Replace") {
    step.kind = Kind::kReplace;
    step.text = config.at("content").get<std::string>();
    if (step.text.find('$') != std::string::npos) {
      return make_error(ErrorCode::kUnsupported,
                        "Replace normalizer content with '$' (a JS replacement pattern)");
    }
    auto pattern = Pattern::from_json(config.at("pattern"));
    if (!pattern) return std::unexpected(pattern.error());
    step.pattern.emplace(std::move(*pattern));
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    step.strip_left = config.value("strip_left", false);
    step.strip_right = config.value("strip_right", false);
  } else if (type == "StripAccents") {
    step.kind = Kind::kStripAccents;
    auto pattern = Pattern::regex("\\p{M}");
    if (!pattern) return std::unexpected(pattern.error());
    step.pattern.emplace(std::move(*pattern));
  } else {
    return make_error(ErrorCode::kUnsupported, "normalizer type '" + type + "' is not supported");
  }
  steps.push_back(std::move(step));
  return {};
}

Status Normalizer::normalize(std::string_view text, std::string& out) const {
  out.assign(text);
  std::string scratch;
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::kUnicode:
        out = unicode::normalize(out, step.form);
        break;
      case Kind::kPrepend:
        out.insert(0, step.text);
        break;
      case Kind::kReplace:
      case Kind::kStripAccents:
        if (auto st = step.pattern->replace_all(out, step.kind == Kind::kReplace ? step.text : "",
                                                scratch);
            !st) {
          return st;
        }
        out.swap(scratch);
        break;
      case Kind::kStrip: {
        std::string_view v = out;
        if (step.strip_left) v = js::trim_start(v);
        if (step.strip_right) v = js::trim_end(v);
        out = std::string(v);
        break;
      }
    }
  }
  return {};
}

}  // namespace strata
