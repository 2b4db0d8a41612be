// Turns generated token ids into text for a client: incremental detokenization that
// never emits a broken UTF-8 sequence, and stop strings, which end the text before
// their first occurrence and are never shown, even in part, while streaming.
#pragma once

#include <string>
#include <vector>

#include "text/tokenizer/tokenizer.h"

namespace strata {

class TextStream {
 public:
  TextStream(const Tokenizer& tokenizer, std::vector<std::string> stops)
      : decoder_(tokenizer.stream_decoder()), stops_(std::move(stops)) {
    for (const auto& s : stops_) hold_ = std::max(hold_, s.size() > 0 ? s.size() - 1 : 0);
  }

  // Feeds one token; returns the text that may be shown now. After a stop string was
  // found, returns nothing more (stopped() is true).
  std::string push(int32_t token) {
    if (stopped_) return {};
    std::string piece;
    if (!decoder_.push(token, piece)) return {};  // an id without text adds nothing
    pending_ += piece;
    return release(false);
  }
  // The rest of the text at the end of generation.
  std::string finish() {
    if (stopped_) return {};
    pending_ += decoder_.finish();
    return release(true);
  }
  bool stopped() const { return stopped_; }
  // The stop string that ended the text ("" while not stopped).
  const std::string& stop_found() const { return stop_found_; }

 private:
  std::string release(bool final) {
    size_t cut = std::string::npos;
    const std::string* found = nullptr;
    for (const auto& s : stops_) {
      const size_t at = pending_.find(s);
      if (at != std::string::npos && at < cut) {
        cut = at;
        found = &s;
      }
    }
    if (cut != std::string::npos) {
      stopped_ = true;
      stop_found_ = *found;
      std::string out = pending_.substr(0, cut);
      pending_.clear();
      return out;
    }
    size_t keep = final ? 0 : std::min(hold_, pending_.size());
    size_t emit = pending_.size() - keep;
    // Never split a UTF-8 sequence between what is shown and what is held back.
    while (emit > 0 && emit < pending_.size() &&
           (static_cast<unsigned char>(pending_[emit]) & 0xC0) == 0x80) {
      --emit;
    }
    std::string out = pending_.substr(0, emit);
    pending_.erase(0, emit);
    return out;
  }

  StreamDecoder decoder_;
  std::vector<std::string> stops_;
  size_t hold_ = 0;
  std::string pending_;
  bool stopped_ = false;
  std::string stop_found_;
};

}  // namespace strata
