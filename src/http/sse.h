// Server-sent events (the text/event-stream format of the WHATWG HTML standard, as OpenAI
// compatible servers stream completions): splits a byte stream into the `data` of each
// event, whatever the chunking of the bytes.
//
// Covered: "data:" lines (one optional space after the colon is dropped; several data lines
// of one event are joined with "\n"; a bare "data" line adds an empty line), LF and CRLF line
// ends, and a blank line ending an event. Comments (":") and the other fields (event:, id:,
// retry:) are skipped: nothing that calls it needs them. An event without data lines is not
// delivered, nor is an unfinished one when the bytes stop. Lines ended by a lone CR are not
// recognised (no server we talk to sends them).
//
// Bound: one line, and one event's joined data, may hold at most max_event_bytes; past it
// feed() fails and the parser stays failed, so a hostile server cannot grow memory without
// end by never ending a line or an event.
//
// Threads: a value per stream, used by one thread at a time.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "common/result.h"

namespace strata::http {

class SseParser {
 public:
  static constexpr size_t kDefaultMaxEventBytes = size_t{16} << 20;

  // max_event_bytes >= 1: the longest line and the largest event data accepted.
  explicit SseParser(size_t max_event_bytes = kDefaultMaxEventBytes);

  // Feeds the next bytes of the stream; calls on_data(data) for every event they complete,
  // in order (the view is valid during the call only). kResourceExhausted once a line or an
  // event went over the bound, on this call and every later one.
  Status feed(std::string_view bytes, const std::function<void(std::string_view data)>& on_data);

  // True when bytes of an unfinished line or event are buffered (a stream that ends now
  // ended mid-event).
  bool mid_event() const { return !line_.empty() || has_data_; }

 private:
  Status take_line(std::string_view line, const std::function<void(std::string_view)>& on_data);
  Status overflow();

  size_t max_event_bytes_;
  std::string line_;  // an incomplete line
  std::string data_;  // data lines of the current event
  bool has_data_ = false;
  bool failed_ = false;
};

}  // namespace strata::http
