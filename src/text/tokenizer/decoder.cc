#include "text/tokenizer/decoder.h"

#include <array>

#include <nlohmann/json.hpp>

#include "text/tokenizer/byte_level.h"
#include "text/tokenizer/component_config.h"
#include "text/tokenizer/js_string.h"

namespace strata {
namespace {

constexpr std::string_view kBom = "\xEF\xBB\xBF";

// The character a Strip decoder compares with: JS compares one UTF-16 unit with the
// content string, so only a single BMP code point can ever match.
char32_t strip_char_of(const std::string& content) {
  if (content.empty()) return 0;
  size_t pos = 0;
  const char32_t cp = utf8::decode_valid(content, pos);
  return pos == content.size() && cp < 0x10000 ? cp : 0;
}

int hex_digit(char32_t c) {
  if (c >= '0' && c <= '9') return static_cast<int>(c - '0');
  if (c >= 'a' && c <= 'f') return static_cast<int>(c - 'a' + 10);
  if (c >= 'A' && c <= 'F') return static_cast<int>(c - 'A' + 10);
  return -1;
}

// The reference's byte-token test: token.length === 6 (UTF-16 units), "<0x" ... ">", and
// parseInt(token.slice(3, 5), 16) not NaN; Uint8Array.from then takes the value mod 256.
std::optional<uint8_t> parse_byte_token(std::string_view token) {
  if (token.size() < 5 || !token.starts_with("<0x") || !token.ends_with(">")) {
    return std::nullopt;
  }
  const std::string_view middle = token.substr(3, token.size() - 4);
  std::array<char32_t, 2> units{};
  size_t count = 0;
  for (size_t pos = 0; pos < middle.size();) {
    const char32_t cp = utf8::decode_valid(middle, pos);
    if (cp >= 0x10000) {
      if (count > 0) return std::nullopt;
      units = {0xD800, 0xDC00};  // a surrogate pair: never whitespace, sign or digit
      count = 2;
      continue;
    }
    if (count == 2) return std::nullopt;
    units[count++] = cp;
  }
  if (count != 2) return std::nullopt;
  size_t i = 0;
  while (i < 2 && js::is_whitespace(units[i])) ++i;
  int sign = 1;
  if (i < 2 && (units[i] == '+' || units[i] == '-')) {
    sign = units[i] == '-' ? -1 : 1;
    ++i;
  }
  // parseInt with radix 16 drops a "0x" prefix first.
  if (i + 1 < 2 && units[i] == '0' && (units[i + 1] == 'x' || units[i + 1] == 'X')) i += 2;
  int value = 0;
  size_t digits = 0;
  for (; i < 2; ++i) {
    const int h = hex_digit(units[i]);
    if (h < 0) break;
    value = value * 16 + h;
    ++digits;
  }
  if (digits == 0) return std::nullopt;
  return static_cast<uint8_t>(((sign * value) % 256 + 256) % 256);
}

void replace_literal_all(std::string& text, std::string_view from, std::string_view to) {
  if (text.find(from) == std::string::npos) return;
  std::string out;
  out.reserve(text.size());
  size_t prev = 0;
  while (true) {
    const size_t hit = text.find(from, prev);
    if (hit == std::string::npos) break;
    out.append(text, prev, hit - prev);
    out.append(to);
    prev = hit + from.size();
  }
  out.append(text, prev, std::string::npos);
  text.swap(out);
}

}  // namespace

std::string clean_up_tokenization(std::string_view text) {
  std::string s(text);
  static constexpr std::array<std::pair<std::string_view, std::string_view>, 10> kRules = {{
      {" .", "."},
      {" ?", "?"},
      {" !", "!"},
      {" ,", ","},
      {" ' ", "'"},
      {" n't", "n't"},
      {" 'm", "'m"},
      {" 's", "'s"},
      {" 've", "'ve"},
      {" 're", "'re"},
  }};
  for (const auto& [from, to] : kRules) replace_literal_all(s, from, to);
  return s;
}

Result<DecodePipeline> DecodePipeline::from_json(const nlohmann::json& decoder) {
  DecodePipeline p;
  if (decoder.is_null()) {
    p.join_with_space_ = true;
    return p;
  }
  int phase = 0;
  if (auto st = add_step(decoder, p, phase); !st) return std::unexpected(st.error());
  return p;
}

// phase 0: per-token steps; 1: after the grouping step; 2: after Fuse.
Status DecodePipeline::add_step(const nlohmann::json& config, DecodePipeline& p, int& phase) {
  if (!config.is_object()) return make_error(ErrorCode::kCorrupt, "decoder must be an object");
  const std::string type = component_type(config);
  auto unsupported = [&](std::string_view why) {
    return make_error(ErrorCode::kUnsupported,
                      "decoder '" + type + "' " + std::string(why) + " is not supported");
  };
  if (type == "Sequence") {
    for (const auto& child : config.at("decoders")) {
      if (auto st = add_step(child, p, phase); !st) return st;
    }
    return {};
  }
  if (type == "Replace") {
    if (phase != 0) return unsupported("after ByteFallback, ByteLevel or Fuse");
    TokenStep step;
    step.kind = StepKind::kReplace;
    step.content = config.at("content").get<std::string>();
    if (step.content.find('$') != std::string::npos) return unsupported("with '$' in content");
    auto pattern = Pattern::from_json(config.at("pattern"));
    if (!pattern) return std::unexpected(pattern.error());
    step.pattern.emplace(std::move(*pattern));
    p.token_steps_.push_back(std::move(step));
    return {};
  }
  if (type == "Strip") {
    const char32_t c = strip_char_of(config.value("content", std::string(" ")));
    const int start = config.value("start", 0);
    const int stop = config.value("stop", 0);
    if (phase == 0) {
      TokenStep step;
      step.kind = StepKind::kStrip;
      step.strip_char = c;
      step.strip_start = start;
      step.strip_stop = stop;
      p.token_steps_.push_back(std::move(step));
      return {};
    }
    if (phase == 2) {
      p.final_strips_.push_back(StripStep{c, start, stop});
      return {};
    }
    return unsupported("between ByteFallback/ByteLevel and Fuse");
  }
  if (type == "Metaspace") {
    if (phase != 0) return unsupported("after ByteFallback, ByteLevel or Fuse");
    TokenStep step;
    step.kind = StepKind::kMetaspace;
    step.content = config.at("replacement").get<std::string>();
    step.add_prefix_space = component_truthy(config, "add_prefix_space");
    p.token_steps_.push_back(std::move(step));
    return {};
  }
  if (type == "ByteFallback" || type == "ByteLevel") {
    if (phase != 0) return unsupported("as a second grouping step or after Fuse");
    p.grouping_ = type == "ByteLevel" ? Grouping::kByteLevel : Grouping::kByteFallback;
    phase = 1;
    return {};
  }
  if (type == "Fuse") {
    phase = 2;
    return {};
  }
  return unsupported("(type)");
}

StreamDecoder::StreamDecoder(const DecodePipeline& pipeline, const DecoderVocab& vocab,
                             bool skip_special_tokens, bool clean_up_spaces)
    : pipeline_(&pipeline),
      vocab_(&vocab),
      skip_special_tokens_(skip_special_tokens),
      clean_up_spaces_(clean_up_spaces) {
  reset();
}

void StreamDecoder::reset() {
  first_token_ = true;
  utf8_ = utf8::Decoder();
  group_open_ = false;
  group_first_char_ = false;
  strips_.assign(pipeline_->final_strips_.size(), StripState{});
  for (size_t i = 0; i < strips_.size(); ++i) {
    strips_[i].leading_left = pipeline_->final_strips_[i].start;
  }
  cleanup_pending_.clear();
}

Status StreamDecoder::push(TokenId id, std::string& out) {
  if (id < 0 || static_cast<size_t>(id) >= vocab_->tokens.size() ||
      (vocab_->flags[static_cast<size_t>(id)] & DecoderVocab::kAssigned) == 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "token id " + std::to_string(id) + " is not in the vocabulary");
  }
  const auto index = static_cast<size_t>(id);
  if (skip_special_tokens_ && (vocab_->flags[index] & DecoderVocab::kSkippable) != 0) return {};
  const bool first = first_token_;
  first_token_ = false;

  std::string_view token = vocab_->tokens[index];
  std::string transformed;
  if (!pipeline_->token_steps_.empty()) {
    transformed.assign(token);
    std::string tmp;
    for (const auto& step : pipeline_->token_steps_) {
      switch (step.kind) {
        case DecodePipeline::StepKind::kReplace:
          if (auto st = step.pattern->replace_all(transformed, step.content, tmp); !st) return st;
          transformed.swap(tmp);
          break;
        case DecodePipeline::StepKind::kStrip: {
          // Strip per token: up to `start` leading and `stop` trailing strip characters.
          std::vector<std::pair<size_t, char32_t>> cps;
          for (size_t pos = 0; pos < transformed.size();) {
            const size_t at = pos;
            cps.emplace_back(at, utf8::decode_valid(transformed, pos));
          }
          size_t start_cut = 0;
          for (int i = 0; i < step.strip_start && static_cast<size_t>(i) < cps.size(); ++i) {
            if (cps[static_cast<size_t>(i)].second != step.strip_char) break;
            start_cut = static_cast<size_t>(i) + 1;
          }
          size_t stop_cut = cps.size();
          for (int i = 0; i < step.strip_stop && static_cast<size_t>(i) < cps.size(); ++i) {
            const size_t k = cps.size() - 1 - static_cast<size_t>(i);
            if (cps[k].second != step.strip_char) break;
            stop_cut = k;
          }
          const size_t end_cut = std::max(start_cut, stop_cut);
          const size_t b = start_cut < cps.size() ? cps[start_cut].first : transformed.size();
          const size_t e = end_cut < cps.size() ? cps[end_cut].first : transformed.size();
          transformed = transformed.substr(b, e - b);
          break;
        }
        case DecodePipeline::StepKind::kMetaspace:
          replace_literal_all(transformed, step.content, " ");
          if (step.add_prefix_space && first && transformed.starts_with(' ')) {
            transformed.erase(0, 1);
          }
          break;
      }
    }
    token = transformed;
  }

  switch (pipeline_->grouping_) {
    case DecodePipeline::Grouping::kNone:
      if (pipeline_->join_with_space_ && !first) emit_text(" ", out);
      emit_text(token, out);
      break;
    case DecodePipeline::Grouping::kByteLevel:
      scratch_.clear();
      if (vocab_->added_contents.contains(token)) {
        // Added tokens are not byte-decoded; the bytes before them end their run.
        utf8_.flush(scratch_);
        emit_text(scratch_, out);
        emit_text(token, out);
      } else {
        for (size_t pos = 0; pos < token.size();) {
          // Code points outside the byte alphabet become 0, as Uint8Array makes of
          // the reference's undefined lookups.
          const int b = byte_level::char_to_byte(utf8::decode_valid(token, pos));
          utf8_.push(static_cast<uint8_t>(b < 0 ? 0 : b), scratch_);
        }
        emit_text(scratch_, out);
      }
      break;
    case DecodePipeline::Grouping::kByteFallback:
      if (const auto byte = parse_byte_token(token)) {
        if (!group_open_) {
          group_open_ = true;
          group_first_char_ = true;
        }
        scratch_.clear();
        utf8_.push(*byte, scratch_);
        emit_group_output(scratch_, out);
      } else {
        if (group_open_) {
          scratch_.clear();
          utf8_.flush(scratch_);
          emit_group_output(scratch_, out);
          group_open_ = false;
        }
        emit_text(token, out);
      }
      break;
  }
  return {};
}

// ByteFallback decodes each run of byte tokens with a fresh TextDecoder whose ignoreBOM is
// off, so a U+FEFF at the start of a run is dropped.
void StreamDecoder::emit_group_output(std::string_view text, std::string& out) {
  if (text.empty()) return;
  if (group_first_char_) {
    group_first_char_ = false;
    if (text.starts_with(kBom)) text.remove_prefix(kBom.size());
  }
  emit_text(text, out);
}

void StreamDecoder::emit_text(std::string_view text, std::string& out) {
  if (text.empty()) return;
  if (strips_.empty()) {
    apply_cleanup(text, /*final=*/false, out);
    return;
  }
  apply_strips(text, 0, out);
}

void StreamDecoder::apply_strips(std::string_view text, size_t first_strip, std::string& out) {
  std::string current(text);
  std::string next;
  for (size_t k = first_strip; k < strips_.size(); ++k) {
    const auto& step = pipeline_->final_strips_[k];
    StripState& state = strips_[k];
    next.clear();
    for (size_t pos = 0; pos < current.size();) {
      const size_t at = pos;
      const char32_t cp = utf8::decode_valid(current, pos);
      const bool is_strip = step.strip_char != 0 && cp == step.strip_char;
      if (state.leading_left > 0) {
        if (is_strip) {
          --state.leading_left;
          continue;
        }
        state.leading_left = 0;
      }
      if (step.stop > 0) {
        if (is_strip) {
          if (state.held < step.stop) {
            ++state.held;
          } else {
            utf8::append(next, cp);  // the oldest held one is now certainly kept
          }
          continue;
        }
        for (; state.held > 0; --state.held) utf8::append(next, step.strip_char);
      }
      next.append(current, at, pos - at);
    }
    current.swap(next);
  }
  apply_cleanup(current, /*final=*/false, out);
}

void StreamDecoder::apply_cleanup(std::string_view text, bool final, std::string& out) {
  if (!clean_up_spaces_) {
    out.append(text);
    return;
  }
  cleanup_pending_.append(text);
  if (final) {
    out.append(clean_up_tokenization(cleanup_pending_));
    cleanup_pending_.clear();
    return;
  }
  // Every clean-up rule starts with a space and is at most 4 bytes long, so text can be
  // cleaned and released up to a cut whose 3 preceding bytes are not spaces: no rule
  // occurrence spans such a cut, in any of the sequential passes. Bytes before the
  // pending text were released under the same condition.
  const std::string& p = cleanup_pending_;
  size_t cut = 0;
  size_t run = 0;
  for (size_t j = p.size(); j > 0; --j) {
    if (p[j - 1] == ' ') {
      run = 0;
      continue;
    }
    if (++run == 3) {
      cut = j - 1 + 3;
      break;
    }
    if (j == 1) cut = run;  // a non-space prefix: preceded by released non-spaces
  }
  while (cut < p.size() && (static_cast<uint8_t>(p[cut]) & 0xC0) == 0x80) ++cut;
  if (cut == 0) return;
  out.append(clean_up_tokenization(std::string_view(p).substr(0, cut)));
  cleanup_pending_.erase(0, cut);
}

void StreamDecoder::finish(std::string& out) {
  scratch_.clear();
  utf8_.flush(scratch_);
  if (pipeline_->grouping_ == DecodePipeline::Grouping::kByteFallback) {
    emit_group_output(scratch_, out);
  } else {
    emit_text(scratch_, out);
  }
  // Held trailing strip characters are the ones a final Strip removes: drop them.
  apply_cleanup("", /*final=*/true, out);
  reset();
}

}  // namespace strata
