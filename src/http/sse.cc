#include "http/sse.h"

#include "common/check.h"

namespace strata::http {

SseParser::SseParser(size_t max_event_bytes) : max_event_bytes_(max_event_bytes) {
  STRATA_CHECK_MSG(max_event_bytes >= 1, "SseParser needs max_event_bytes >= 1");
}

Status SseParser::overflow() {
  failed_ = true;
  line_.clear();
  data_.clear();
  has_data_ = false;
  return make_error(ErrorCode::kResourceExhausted,
                    "a server-sent event (or one of its lines) is over " +
                        std::to_string(max_event_bytes_) + " bytes");
}

Status SseParser::feed(std::string_view bytes,
                       const std::function<void(std::string_view data)>& on_data) {
  if (failed_) return overflow();
  while (!bytes.empty()) {
    const size_t nl = bytes.find('\n');
    if (nl == std::string_view::npos) {
      if (line_.size() + bytes.size() > max_event_bytes_) return overflow();
      line_.append(bytes);
      return {};
    }
    // A whole line: straight from the input when nothing of it was buffered.
    std::string_view line = bytes.substr(0, nl);
    if (!line_.empty()) {
      if (line_.size() + line.size() > max_event_bytes_) return overflow();
      line_.append(line);
      line = line_;
    } else if (line.size() > max_event_bytes_) {
      return overflow();
    }
    bytes.remove_prefix(nl + 1);
    if (auto st = take_line(line, on_data); !st) return st;
    line_.clear();
  }
  return {};
}

Status SseParser::take_line(std::string_view line,
                            const std::function<void(std::string_view)>& on_data) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.empty()) {  // a blank line ends the event
    if (has_data_) on_data(data_);
    data_.clear();
    has_data_ = false;
    return {};
  }
  std::string_view value;
  if (line == "data") {
    value = {};
  } else if (line.starts_with("data:")) {
    value = line.substr(5);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  } else {
    return {};  // a comment or a field nobody here needs
  }
  if (data_.size() + value.size() + (has_data_ ? 1 : 0) > max_event_bytes_) return overflow();
  if (has_data_) data_ += '\n';
  data_ += value;
  has_data_ = true;
  return {};
}

}  // namespace strata::http
