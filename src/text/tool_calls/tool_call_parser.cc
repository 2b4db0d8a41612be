#include "text/tool_calls/tool_call_parser.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <random>

#include "text/tool_calls/call_scanner.h"

namespace strata {
namespace {

using tool_calls::CallScanner;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralOpen = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";
// A function name before Mistral's [ARGS] is at most this long (OpenAI allows 64).
constexpr size_t kMaxMistralName = 64;

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

// OpenAI's rule for function names: ^[a-zA-Z0-9_-]{1,64}$ (and dots, which some models use).
bool is_function_name(std::string_view s) {
  if (s.empty() || s.size() > kMaxMistralName) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.';
  });
}

bool all_space(std::string_view s) {
  return std::all_of(s.begin(), s.end(), is_space);
}

// Whether `text` ends with a proper prefix of `marker`; the length of the longest.
size_t partial_suffix(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

std::string random_tool_call_id(ToolCallFormat format) {
  static constexpr char kAlphabet[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, sizeof(kAlphabet) - 2);
  const bool mistral = format == ToolCallFormat::kMistral;
  std::string id = mistral ? "" : "call_";
  for (int i = 0; i < (mistral ? 9 : 24); ++i) id.push_back(kAlphabet[pick(rng)]);
  return id;
}

// The machine. `buf_` holds what was pushed and not consumed yet; each phase consumes
// from its front, or waits for more when a marker may still be completing.
struct ToolCallStreamParser::Impl {
  enum class Phase {
    kStart,        // llama3_json: the reply's first bytes decide
    kContent,      // outside markup, looking for an opening marker
    kPlain,        // everything left is content (no format, or after a failure)
    kOpen,         // after an opening marker (or a separator): a call should follow
    kMistralName,  // Mistral's name[ARGS]: reading the name
    kCall,         // inside a call's JSON
    kClose,        // after a call: its closing marker, a separator, or content
  };

  explicit Impl(ToolCallParserOptions o) : options(std::move(o)) {
    switch (options.format) {
      case ToolCallFormat::kNone:
        phase = Phase::kPlain;
        break;
      case ToolCallFormat::kLlama3Json:
        phase = Phase::kStart;
        break;
      case ToolCallFormat::kHermes:
        open_marker = kHermesOpen;
        break;
      case ToolCallFormat::kMistral:
        open_marker = kMistralOpen;
        break;
    }
  }

  // ---- output ----
  void out_content(std::string_view text) {
    if (text.empty()) return;
    if (!events.empty() && !events.back().call) {
      events.back().content.append(text);
    } else {
      events.push_back(ToolCallEvent{.content = std::string(text)});
    }
  }
  void out_call(ToolCallDelta d) {
    if (!events.empty() && events.back().call && events.back().call->index == d.index &&
        d.id.empty()) {
      events.back().call->arguments += d.arguments;
    } else {
      events.push_back(ToolCallEvent{.call = std::move(d)});
    }
  }
  // Content outside markup: a segment's leading whitespace waits until text follows (it
  // is dropped when a call comes first).
  void content(std::string_view text) {
    if (text.empty()) return;
    if (!segment_has_text) {
      if (all_space(text)) {
        held_space.append(text);
        return;
      }
      segment_has_text = true;
      out_content(held_space);
      held_space.clear();
    }
    out_content(text);
  }
  void new_segment() {
    held_space.clear();
    segment_has_text = false;
  }

  // ---- calls ----
  void start_call(CallScanner::Mode mode) {
    scanner.emplace(mode);
    committed = false;
    args_sent = 0;
  }
  // Shows the call once its name is known and allowed; false when the name is refused.
  bool maybe_commit(const std::string& name) {
    if (committed) return true;
    if (name.empty()) return false;
    if (!options.function_names.empty() &&
        std::find(options.function_names.begin(), options.function_names.end(), name) ==
            options.function_names.end()) {
      return false;
    }
    committed = true;
    current_index = calls.size();
    current.name = name;
    current.id =
        options.make_id ? options.make_id(current_index) : random_tool_call_id(options.format);
    current.arguments.clear();
    ++num_committed;
    new_segment();  // the whitespace before the markup is not content
    out_call(ToolCallDelta{.index = current_index, .id = current.id, .name = name});
    return true;
  }
  // Sends the arguments' bytes read since the last call, but the last `exclude` bytes.
  void send_args(size_t exclude = 0) {
    if (!committed || !scanner || !scanner->args_begin()) return;
    const std::string& t = scanner->text();
    const size_t end = scanner->args_end().value_or(t.size() - std::min(exclude, t.size()));
    const size_t begin = *scanner->args_begin() + args_sent;
    if (end <= begin) return;
    std::string piece = t.substr(begin, end - begin);
    args_sent += piece.size();
    current.arguments += piece;
    out_call(ToolCallDelta{.index = current_index, .arguments = std::move(piece)});
  }
  // The scanner closed the call's JSON.
  void complete_call() {
    const std::string& t = scanner->text();
    if (scanner->name()) maybe_commit(*scanner->name());
    if (!committed) return fail();
    send_args();
    if (!scanner->args_begin()) {
      current.arguments = "{}";
      out_call(ToolCallDelta{.index = current_index, .arguments = "{}"});
    }
    const nlohmann::json j = nlohmann::json::parse(t, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) malformed = true;  // committed: stays a call
    calls.push_back(current);
    scanner.reset();
    committed = false;
    markup.clear();
    phase = Phase::kClose;
  }
  // The markup cannot be a call. Before its call was shown, it is content from its marker
  // on; after, the call ends with what was sent. Either way the rest is content.
  void fail() {
    malformed = true;
    if (committed) {
      calls.push_back(current);
      out_content(buf);
    } else {
      segment_has_text = true;
      out_content(held_space);
      out_content(markup);
      out_content(buf);
    }
    held_space.clear();
    segment_has_text = true;
    buf.clear();
    markup.clear();
    scanner.reset();
    committed = false;
    phase = Phase::kPlain;
  }
  void consume(size_t n) {
    markup.append(buf, 0, n);
    buf.erase(0, n);
  }
  // Skips whitespace at the front of buf (kept in the markup); true when some text is left.
  bool skip_space() {
    size_t n = 0;
    while (n < buf.size() && is_space(buf[n])) ++n;
    consume(n);
    return !buf.empty();
  }

  // ---- phases: each returns false when it needs more input ----
  bool step(bool final) {
    switch (phase) {
      case Phase::kPlain:
        content(buf);
        buf.clear();
        return false;
      case Phase::kStart: {
        size_t n = 0;
        while (n < buf.size() && is_space(buf[n])) ++n;
        const std::string_view rest = std::string_view(buf).substr(n);
        if (rest.starts_with(kPythonTag)) {
          held_space.append(buf, 0, n);
          buf.erase(0, n);
          markup.clear();
          consume(kPythonTag.size());
          phase = Phase::kOpen;
          return true;
        }
        if (rest.starts_with("{")) {
          held_space.append(buf, 0, n);
          buf.erase(0, n);
          markup.clear();
          phase = Phase::kOpen;
          return true;
        }
        if (!final && (rest.empty() || kPythonTag.starts_with(rest))) return false;
        phase = Phase::kPlain;
        return true;
      }
      case Phase::kContent: {
        if (open_marker.empty()) {  // llama3_json after its calls: content only
          content(buf);
          buf.clear();
          return false;
        }
        const size_t at = buf.find(open_marker);
        if (at != std::string::npos) {
          content(std::string_view(buf).substr(0, at));
          buf.erase(0, at);
          markup.clear();
          consume(open_marker.size());
          phase = Phase::kOpen;
          in_array = false;
          return true;
        }
        const size_t hold = final ? 0 : partial_suffix(buf, open_marker);
        content(std::string_view(buf).substr(0, buf.size() - hold));
        buf.erase(0, buf.size() - hold);
        return false;
      }
      case Phase::kOpen: {
        if (!skip_space()) {
          if (final) fail();
          return false;
        }
        const char c = buf[0];
        if (c == '{') {
          start_call(CallScanner::Mode::kCallObject);
          phase = Phase::kCall;
          return true;
        }
        if (options.format == ToolCallFormat::kMistral && !in_array && c == '[') {
          in_array = true;
          consume(1);
          return true;
        }
        if (options.format == ToolCallFormat::kMistral && !in_array) {
          phase = Phase::kMistralName;
          return true;
        }
        fail();
        return false;
      }
      case Phase::kMistralName: {
        const size_t at = buf.find(kMistralArgs);
        if (at == std::string::npos) {
          if (final || buf.size() > kMaxMistralName + kMistralArgs.size()) fail();
          return false;
        }
        std::string name = buf.substr(0, at);
        while (!name.empty() && is_space(name.back())) name.pop_back();
        consume(at + kMistralArgs.size());
        start_call(CallScanner::Mode::kArgsOnly);
        if (!is_function_name(name) || !maybe_commit(name)) {
          fail();
          return false;
        }
        phase = Phase::kCall;
        return true;
      }
      case Phase::kCall: {
        size_t used = 0;
        CallScanner::Step s = CallScanner::Step::kMore;
        while (used < buf.size() && s == CallScanner::Step::kMore) {
          s = scanner->feed(buf[used++]);
          if (!committed && scanner->name() && !maybe_commit(*scanner->name())) {
            s = CallScanner::Step::kError;
          }
        }
        if (s == CallScanner::Step::kError) {
          if (committed) {
            send_args(/*exclude=*/1);
            buf.erase(0, used - 1);  // the byte that broke it is content
          } else {
            consume(used);
          }
          fail();
          return false;
        }
        consume(used);
        if (s == CallScanner::Step::kDone) {
          complete_call();
          return phase != Phase::kPlain;
        }
        send_args();
        if (final) {
          if (committed) {  // cut off inside a shown call
            malformed = true;
            calls.push_back(current);
            scanner.reset();
            committed = false;
            phase = Phase::kPlain;
          } else {
            fail();
          }
        }
        return false;
      }
      case Phase::kClose: {
        size_t n = 0;
        while (n < buf.size() && is_space(buf[n])) ++n;
        const std::string_view rest = std::string_view(buf).substr(n);
        if (rest.empty() && !final) return false;
        if (options.format == ToolCallFormat::kHermes) {
          if (rest.starts_with(kHermesClose)) {
            buf.erase(0, n + kHermesClose.size());
            new_segment();
            phase = Phase::kContent;
            return true;
          }
          if (!final && kHermesClose.starts_with(rest)) return false;
          if (final && kHermesClose.starts_with(rest)) {  // the reply ended in the tag
            buf.clear();
            return false;
          }
        } else if (options.format == ToolCallFormat::kMistral && in_array) {
          if (!rest.empty() && (rest[0] == ',' || rest[0] == ']')) {
            const bool more = rest[0] == ',';
            buf.erase(0, n + 1);
            markup.clear();
            if (more) {
              phase = Phase::kOpen;
            } else {
              in_array = false;
              new_segment();
              phase = Phase::kContent;
            }
            return true;
          }
        } else if (options.format == ToolCallFormat::kLlama3Json) {
          if (!rest.empty() && rest[0] == ';') {
            buf.erase(0, n + 1);
            markup.clear();
            phase = Phase::kOpen;
            return true;
          }
        }
        // Anything else: content after the calls (a Hermes call without its closing tag,
        // a Mistral array never closed, text after Llama's calls).
        in_array = false;
        new_segment();
        phase = Phase::kContent;
        return true;
      }
    }
    return false;
  }

  std::vector<ToolCallEvent> run(bool final) {
    while (step(final)) {
    }
    if (final) {
      if (phase == Phase::kContent || phase == Phase::kPlain || phase == Phase::kStart) {
        content(buf);
        buf.clear();
      }
      if (num_committed == 0) out_content(held_space);
      held_space.clear();
      finished = true;
    }
    std::vector<ToolCallEvent> out = std::move(events);
    events.clear();
    return out;
  }

  ToolCallParserOptions options;
  std::string_view open_marker;
  Phase phase = Phase::kContent;
  std::string buf;
  std::string markup;  // the current markup's text consumed so far (content if it fails)
  std::string held_space;
  bool segment_has_text = false;
  bool in_array = false;  // Mistral: inside [TOOL_CALLS][...]
  std::optional<CallScanner> scanner;
  bool committed = false;  // the current call was shown
  size_t args_sent = 0;    // bytes of its arguments shown
  ToolCall current;
  size_t current_index = 0;  // its position in the reply
  std::vector<ToolCall> calls;
  size_t num_committed = 0;
  bool malformed = false;
  bool finished = false;
  std::vector<ToolCallEvent> events;
};

ToolCallStreamParser::ToolCallStreamParser(ToolCallParserOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}
ToolCallStreamParser::~ToolCallStreamParser() = default;
ToolCallStreamParser::ToolCallStreamParser(ToolCallStreamParser&&) noexcept = default;
ToolCallStreamParser& ToolCallStreamParser::operator=(ToolCallStreamParser&&) noexcept = default;

std::vector<ToolCallEvent> ToolCallStreamParser::push(std::string_view text) {
  if (impl_->finished) return {};
  impl_->buf.append(text);
  return impl_->run(false);
}

std::vector<ToolCallEvent> ToolCallStreamParser::finish() {
  if (impl_->finished) return {};
  return impl_->run(true);
}

const std::vector<ToolCall>& ToolCallStreamParser::calls() const {
  return impl_->calls;
}
size_t ToolCallStreamParser::num_committed() const {
  return impl_->num_committed;
}
bool ToolCallStreamParser::malformed() const {
  return impl_->malformed;
}

ParsedToolCalls merge_tool_call_events(const std::vector<ToolCallEvent>& events) {
  ParsedToolCalls out;
  for (const ToolCallEvent& e : events) {
    if (!e.call) {
      out.content += e.content;
      continue;
    }
    if (e.call->index >= out.calls.size()) out.calls.resize(e.call->index + 1);
    ToolCall& c = out.calls[e.call->index];
    if (!e.call->id.empty()) c.id = e.call->id;
    if (!e.call->name.empty()) c.name = e.call->name;
    c.arguments += e.call->arguments;
  }
  return out;
}

ParsedToolCalls parse_tool_calls(std::string_view text, const ToolCallParserOptions& options) {
  ToolCallStreamParser parser(options);
  std::vector<ToolCallEvent> events = parser.push(text);
  std::vector<ToolCallEvent> tail = parser.finish();
  events.insert(events.end(), std::make_move_iterator(tail.begin()),
                std::make_move_iterator(tail.end()));
  if (parser.malformed()) {
    return ParsedToolCalls{.content = std::string(text), .calls = {}, .malformed = true};
  }
  ParsedToolCalls out = merge_tool_call_events(events);
  out.calls = parser.calls();
  return out;
}

}  // namespace strata
