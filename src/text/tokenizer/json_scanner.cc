#include "text/tokenizer/json_scanner.h"

#include <vector>

#include "text/tokenizer/hex_digit.h"
#include "text/tokenizer/utf8.h"

namespace strata {

std::unexpected<Error> JsonScanner::error(std::string_view what) const {
  return make_error(ErrorCode::kCorrupt, std::string(what) + " at byte " + std::to_string(pos_));
}

void JsonScanner::skip_whitespace() {
  while (pos_ < text_.size()) {
    const char c = text_[pos_];
    if (c != ' ' && c != '\n' && c != '\r' && c != '\t') break;
    ++pos_;
  }
}

char JsonScanner::peek() {
  skip_whitespace();
  return pos_ < text_.size() ? text_[pos_] : '\0';
}

bool JsonScanner::at_end() {
  skip_whitespace();
  return pos_ >= text_.size();
}

bool JsonScanner::consume(char c) {
  if (peek() != c) return false;
  ++pos_;
  return true;
}

Status JsonScanner::expect(char c) {
  if (consume(c)) return {};
  return error(std::string("expected '") + c + "'");
}

Status JsonScanner::read_string(std::string& out) {
  out.clear();
  if (!consume('"')) return error("expected a string");
  while (true) {
    // Copy the run up to the next quote, backslash or control character at once.
    size_t run = pos_;
    while (run < text_.size()) {
      const auto c = static_cast<unsigned char>(text_[run]);
      if (c == '"' || c == '\\' || c < 0x20) break;
      ++run;
    }
    out.append(text_, pos_, run - pos_);
    pos_ = run;
    if (pos_ >= text_.size()) return error("unterminated string");
    const char c = text_[pos_++];
    if (c == '"') return {};
    if (c != '\\') return error("control character in string");
    if (pos_ >= text_.size()) return error("unterminated escape");
    const char e = text_[pos_++];
    switch (e) {
      case '"':
      case '\\':
      case '/':
        out.push_back(e);
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'u': {
        auto read_hex4 = [this]() -> long {
          if (pos_ + 4 > text_.size()) return -1;
          long v = 0;
          for (int k = 0; k < 4; ++k) {
            const int h = hex_value(text_[pos_ + static_cast<size_t>(k)]);
            if (h < 0) return -1;
            v = v * 16 + h;
          }
          pos_ += 4;
          return v;
        };
        long cp = read_hex4();
        if (cp < 0) return error("bad \\u escape");
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          if (pos_ + 2 > text_.size() || text_[pos_] != '\\' || text_[pos_ + 1] != 'u') {
            return error("lone surrogate escape");
          }
          pos_ += 2;
          const long low = read_hex4();
          if (low < 0xDC00 || low > 0xDFFF) return error("lone surrogate escape");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
          return error("lone surrogate escape");
        }
        utf8::append(out, static_cast<char32_t>(cp));
        break;
      }
      default:
        return error("bad escape in string");
    }
  }
}

Status JsonScanner::skip_string() {
  if (!consume('"')) return error("expected a string");
  while (pos_ < text_.size()) {
    const auto c = static_cast<unsigned char>(text_[pos_++]);
    if (c == '"') return {};
    if (c == '\\') {
      if (pos_ >= text_.size()) break;
      ++pos_;
    } else if (c < 0x20) {
      return error("control character in string");
    }
  }
  return error("unterminated string");
}

Result<int64_t> JsonScanner::read_integer() {
  skip_whitespace();
  const size_t start = pos_;
  bool negative = false;
  if (pos_ < text_.size() && text_[pos_] == '-') {
    negative = true;
    ++pos_;
  }
  int64_t value = 0;
  size_t digits = 0;
  while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
    if (value > (INT64_MAX - 9) / 10) return error("integer out of range");
    value = value * 10 + (text_[pos_] - '0');
    ++pos_;
    ++digits;
  }
  if (digits == 0 ||
      (pos_ < text_.size() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E'))) {
    pos_ = start;
    return error("expected an integer");
  }
  return negative ? -value : value;
}

Result<std::string_view> JsonScanner::skip_value() {
  skip_whitespace();
  const size_t start = pos_;
  std::vector<char> closers;
  do {
    skip_whitespace();
    if (pos_ >= text_.size()) return error("unexpected end of JSON");
    const char c = text_[pos_];
    if (c == '"') {
      if (auto st = skip_string(); !st) return std::unexpected(st.error());
    } else if (c == '{' || c == '[') {
      closers.push_back(c == '{' ? '}' : ']');
      ++pos_;
      continue;
    } else if (c == '}' || c == ']') {
      if (closers.empty() || closers.back() != c) return error("unbalanced brackets");
      closers.pop_back();
      ++pos_;
    } else if (c == ',' || c == ':') {
      if (closers.empty()) return error("unexpected separator");
      ++pos_;
      continue;
    } else {
      // A number or a literal: up to the next delimiter.
      while (pos_ < text_.size()) {
        const char d = text_[pos_];
        if (d == ',' || d == ']' || d == '}' || d == ' ' || d == '\n' || d == '\r' || d == '\t') {
          break;
        }
        ++pos_;
      }
    }
  } while (!closers.empty());
  return text_.substr(start, pos_ - start);
}

}  // namespace strata
