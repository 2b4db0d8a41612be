#include "text/jinja/lexer.h"

#include <array>
#include <utility>

#include "common/utf8.h"
#include "text/jinja/error.h"
#include "text/jinja/unicode.h"

namespace strata::jinja {
namespace {

bool is_word(char c) {
  return unicode::is_ascii_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_hex(char c) {
  return unicode::is_ascii_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// Appends text[begin, end) and its origins.
void copy_span(const Preprocessed& in, size_t begin, size_t end, Preprocessed& out) {
  out.text.append(in.text, begin, end - begin);
  out.origin.insert(out.origin.end(), in.origin.begin() + static_cast<std::ptrdiff_t>(begin),
                    in.origin.begin() + static_cast<std::ptrdiff_t>(end));
}

void finish(const Preprocessed& in, Preprocessed& out) {
  out.origin.push_back(in.origin.back());
}

// /^[ \t]*({[#%-])/gm -> "$1": JavaScript's multiline ^ matches at the start and after
// \n, \r, U+2028 and U+2029.
Preprocessed lstrip_blocks(const Preprocessed& in) {
  const std::string& s = in.text;
  Preprocessed out;
  out.text.reserve(s.size());
  out.origin.reserve(s.size() + 1);
  size_t pos = 0;
  bool line_start = true;
  while (pos < s.size()) {
    if (line_start) {
      size_t q = pos;
      while (q < s.size() && (s[q] == ' ' || s[q] == '\t')) ++q;
      if (q + 1 < s.size() && s[q] == '{' &&
          (s[q + 1] == '#' || s[q + 1] == '%' || s[q + 1] == '-')) {
        pos = q;  // drop the indentation
      }
      line_start = false;
    }
    const unsigned char c = static_cast<unsigned char>(s[pos]);
    size_t len = 1;
    if (c == '\n' || c == '\r') {
      line_start = true;
    } else if (c == 0xE2 && pos + 2 < s.size() && static_cast<unsigned char>(s[pos + 1]) == 0x80 &&
               (static_cast<unsigned char>(s[pos + 2]) == 0xA8 ||
                static_cast<unsigned char>(s[pos + 2]) == 0xA9)) {
      line_start = true;  // U+2028 LINE SEPARATOR, U+2029 PARAGRAPH SEPARATOR
      len = 3;
    }
    copy_span(in, pos, pos + len, out);
    pos += len;
  }
  finish(in, out);
  return out;
}

// /([#%-]})\n/g -> "$1".
Preprocessed trim_blocks(const Preprocessed& in) {
  const std::string& s = in.text;
  Preprocessed out;
  out.text.reserve(s.size());
  out.origin.reserve(s.size() + 1);
  size_t pos = 0;
  while (pos < s.size()) {
    if (pos + 2 < s.size() && (s[pos] == '#' || s[pos] == '%' || s[pos] == '-') &&
        s[pos + 1] == '}' && s[pos + 2] == '\n') {
      copy_span(in, pos, pos + 2, out);
      pos += 3;
      continue;
    }
    copy_span(in, pos, pos + 1, out);
    ++pos;
  }
  finish(in, out);
  return out;
}

// Length of the whitespace code point that ends at s[end - 1], or 0.
size_t whitespace_length_before(std::string_view s, size_t end) {
  for (size_t len = 1; len <= 3 && len <= end; ++len) {
    if (unicode::whitespace_length_at(s, end - len) == len) return len;
  }
  return 0;
}

// Matches `{%(-?)\s*(?:end)?generation\s*(-?)%}` at pos; returns the end offset or 0.
size_t match_generation_tag(std::string_view s, size_t pos, bool& lstrip, bool& rstrip) {
  if (s.substr(pos, 2) != "{%") return 0;
  size_t i = pos + 2;
  lstrip = i < s.size() && s[i] == '-';
  if (lstrip) ++i;
  while (size_t len = unicode::whitespace_length_at(s, i)) i += len;
  if (s.substr(i, 3) == "end") i += 3;
  if (s.substr(i, 10) != "generation") {
    // "end" may also be the start of a failed match; "endgeneration" was tried above and
    // a plain "generation" cannot start with "end", so no backtracking is needed.
    return 0;
  }
  i += 10;
  while (size_t len = unicode::whitespace_length_at(s, i)) i += len;
  rstrip = i < s.size() && s[i] == '-';
  if (rstrip) ++i;
  if (s.substr(i, 2) != "%}") return 0;
  return i + 2;
}

// /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs -> (lstrip ? "" : $1) + (rstrip ? "" : $4).
Preprocessed remove_generation_tags(const Preprocessed& in) {
  const std::string& s = in.text;
  if (s.find("generation") == std::string::npos) return in;
  Preprocessed out;
  size_t last = 0;  // end of the previous match (the regex's lastIndex)
  size_t search = 0;
  while (true) {
    const size_t tag = s.find("{%", search);
    if (tag == std::string::npos) break;
    bool lstrip = false;
    bool rstrip = false;
    const size_t tag_end = match_generation_tag(s, tag, lstrip, rstrip);
    if (tag_end == 0) {
      search = tag + 1;
      continue;
    }
    size_t begin = tag;
    while (begin > last) {
      const size_t len = whitespace_length_before(s, begin);
      if (len == 0) break;
      begin -= len;
    }
    size_t end = tag_end;
    while (size_t len = unicode::whitespace_length_at(s, end)) end += len;
    copy_span(in, last, begin, out);
    if (!lstrip) copy_span(in, begin, tag, out);
    if (!rstrip) copy_span(in, tag_end, end, out);
    last = end;
    search = end;
  }
  copy_span(in, last, s.size(), out);
  finish(in, out);
  return out;
}

constexpr std::array<std::pair<std::string_view, TokenType>, 29> kMappingTable = {{
    {"{%", TokenType::kOpenStatement},
    {"%}", TokenType::kCloseStatement},
    {"{{", TokenType::kOpenExpression},
    {"}}", TokenType::kCloseExpression},
    {"(", TokenType::kOpenParen},
    {")", TokenType::kCloseParen},
    {"{", TokenType::kOpenCurlyBracket},
    {"}", TokenType::kCloseCurlyBracket},
    {"[", TokenType::kOpenSquareBracket},
    {"]", TokenType::kCloseSquareBracket},
    {",", TokenType::kComma},
    {".", TokenType::kDot},
    {":", TokenType::kColon},
    {"|", TokenType::kPipe},
    {"<=", TokenType::kComparisonBinaryOperator},
    {">=", TokenType::kComparisonBinaryOperator},
    {"==", TokenType::kComparisonBinaryOperator},
    {"!=", TokenType::kComparisonBinaryOperator},
    {"<", TokenType::kComparisonBinaryOperator},
    {">", TokenType::kComparisonBinaryOperator},
    {"+", TokenType::kAdditiveBinaryOperator},
    {"-", TokenType::kAdditiveBinaryOperator},
    {"~", TokenType::kAdditiveBinaryOperator},
    {"**", TokenType::kExponentiationBinaryOperator},
    {"*", TokenType::kMultiplicativeBinaryOperator},
    {"//", TokenType::kMultiplicativeBinaryOperator},
    {"/", TokenType::kMultiplicativeBinaryOperator},
    {"%", TokenType::kMultiplicativeBinaryOperator},
    {"=", TokenType::kEquals},
}};

class Lexer {
 public:
  explicit Lexer(Preprocessed pre) : pre_(std::move(pre)), src_(pre_.text) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) step();
    return std::move(tokens_);
  }

 private:
  char at(size_t i) const { return i < src_.size() ? src_[i] : '\0'; }
  bool starts_with(std::string_view s) const { return src_.substr(pos_, s.size()) == s; }
  size_t origin(size_t i) const { return pre_.origin[std::min(i, src_.size())]; }

  void push(TokenType type, std::string value, size_t start) {
    tokens_.push_back(Token{type, std::move(value), origin(start)});
  }

  [[noreturn]] void fail(std::string message, size_t at_pos) const {
    throw_syntax(std::move(message), origin(at_pos));
  }

  // The character at pos as text, for error messages.
  std::string char_at(size_t pos) const {
    size_t next = pos;
    const char32_t cp = unicode::decode(src_, next);
    std::string out;
    utf8::append(out, cp);
    return out;
  }

  void strip_trailing_whitespace() {
    if (tokens_.empty() || tokens_.back().type != TokenType::kText) return;
    Token& last = tokens_.back();
    last.value.resize(unicode::trim_end(last.value).size());
    if (last.value.empty()) tokens_.pop_back();
  }

  void skip_leading_whitespace() {
    while (pos_ < src_.size()) {
      const size_t len = unicode::whitespace_length_at(src_, pos_);
      if (len == 0) break;
      pos_ += len;
    }
  }

  // consumeWhile(isWhitespace): like skip_leading_whitespace, but reaching the end of the
  // input after consuming is an error (an unterminated tag).
  void consume_whitespace() {
    while (pos_ < src_.size()) {
      const size_t len = unicode::whitespace_length_at(src_, pos_);
      if (len == 0) return;
      pos_ += len;
      if (pos_ >= src_.size()) fail("Unexpected end of input", pos_);
    }
  }

  std::string consume_digits() {
    std::string out;
    while (unicode::is_ascii_digit(at(pos_))) {
      out.push_back(src_[pos_++]);
      if (pos_ >= src_.size()) fail("Unexpected end of input", pos_);
    }
    return out;
  }

  void append_hex_escape(std::string& out, uint32_t unit) {
    // String.fromCharCode: one UTF-16 code unit; a surrogate pair written as two \u escapes
    // forms one character.
    if (unit >= 0xD800 && unit <= 0xDBFF && pending_high_surrogate_ == 0) {
      pending_high_surrogate_ = unit;
      return;
    }
    flush_surrogate(out, unit);
  }

  void flush_surrogate(std::string& out, uint32_t next_unit) {
    if (pending_high_surrogate_ != 0) {
      if (next_unit >= 0xDC00 && next_unit <= 0xDFFF) {
        utf8::append(out,
                     0x10000 + ((pending_high_surrogate_ - 0xD800) << 10) + (next_unit - 0xDC00));
        pending_high_surrogate_ = 0;
        return;
      }
      utf8::append(out, unicode::kReplacementChar);
      pending_high_surrogate_ = 0;
      if (next_unit >= 0xD800 && next_unit <= 0xDBFF) {
        pending_high_surrogate_ = next_unit;
        return;
      }
    }
    if (next_unit != kNoUnit) utf8::append(out, next_unit);
  }

  // A string literal's body, with the reference's escapes. Extensions over the reference
  // (which rejects these): a backslash before a newline continues the line and an unknown
  // escape keeps its backslash, as Python's string escapes do.
  std::string consume_string(char quote) {
    std::string out;
    pending_high_surrogate_ = 0;
    while (at(pos_) != quote) {
      if (pos_ >= src_.size()) fail("Unexpected end of input", pos_);
      if (src_[pos_] == '\\') {
        const size_t escape_start = pos_;
        ++pos_;
        if (pos_ >= src_.size()) fail("Unexpected end of input", pos_);
        const char escaped = src_[pos_++];
        if (escaped == 'x' || escaped == 'u') {
          const size_t length = escaped == 'x' ? 2 : 4;
          const std::string_view hex = src_.substr(pos_, length);
          bool valid = hex.size() == length;
          for (char h : hex) valid = valid && is_hex(h);
          if (!valid) {
            fail("Invalid hexadecimal escape sequence: \\" + std::string(1, escaped) +
                     std::string(hex),
                 escape_start);
          }
          append_hex_escape(out, static_cast<uint32_t>(std::stoul(std::string(hex), nullptr, 16)));
          pos_ += length;
          continue;
        }
        flush_surrogate(out, kNoUnit);
        switch (escaped) {
          case 'n':
            out.push_back('\n');
            break;
          case 't':
            out.push_back('\t');
            break;
          case 'r':
            out.push_back('\r');
            break;
          case 'b':
            out.push_back('\b');
            break;
          case 'f':
            out.push_back('\f');
            break;
          case 'v':
            out.push_back('\v');
            break;
          case '\'':
          case '"':
          case '\\':
            out.push_back(escaped);
            break;
          case '\n':
            break;  // line continuation (extension)
          default:
            if (static_cast<unsigned char>(escaped) >= 0x80) {
              fail("Unexpected escaped character: " + char_at(pos_ - 1), escape_start);
            }
            out.push_back('\\');  // unknown escape kept verbatim (extension)
            out.push_back(escaped);
        }
        continue;
      }
      flush_surrogate(out, kNoUnit);
      out.push_back(src_[pos_++]);
      if (pos_ >= src_.size()) fail("Unexpected end of input", pos_);
    }
    flush_surrogate(out, kNoUnit);
    return out;
  }

  void step() {
    const bool text_mode = tokens_.empty() || tokens_.back().type == TokenType::kCloseStatement ||
                           tokens_.back().type == TokenType::kCloseExpression ||
                           tokens_.back().type == TokenType::kComment;
    if (text_mode) {
      const size_t start = pos_;
      while (pos_ < src_.size() &&
             !(src_[pos_] == '{' &&
               (at(pos_ + 1) == '%' || at(pos_ + 1) == '{' || at(pos_ + 1) == '#'))) {
        ++pos_;
      }
      if (pos_ > start) {
        push(TokenType::kText, std::string(src_.substr(start, pos_ - start)), start);
        return;
      }
    }

    if (at(pos_) == '{' && at(pos_ + 1) == '#') {
      const size_t start = pos_;
      pos_ += 2;
      const bool strip_before = at(pos_) == '-';
      if (strip_before) ++pos_;
      const size_t body = pos_;
      while (at(pos_) != '#' || at(pos_ + 1) != '}') {
        if (pos_ + 2 >= src_.size()) fail("Missing end of comment tag", start);
        ++pos_;
      }
      std::string comment(src_.substr(body, pos_ - body));
      const bool strip_after = !comment.empty() && comment.back() == '-';
      if (strip_after) comment.pop_back();
      if (strip_before) strip_trailing_whitespace();
      push(TokenType::kComment, std::move(comment), start);
      pos_ += 2;
      if (strip_after) skip_leading_whitespace();
      return;
    }

    if (starts_with("{%-")) {
      strip_trailing_whitespace();
      push(TokenType::kOpenStatement, "{%", pos_);
      pos_ += 3;
      return;
    }
    if (starts_with("{{-")) {
      strip_trailing_whitespace();
      push(TokenType::kOpenExpression, "{{", pos_);
      curly_depth_ = 0;
      pos_ += 3;
      return;
    }

    consume_whitespace();

    if (starts_with("-%}")) {
      push(TokenType::kCloseStatement, "%}", pos_);
      pos_ += 3;
      skip_leading_whitespace();
      return;
    }
    if (starts_with("-}}")) {
      push(TokenType::kCloseExpression, "}}", pos_);
      pos_ += 3;
      skip_leading_whitespace();
      return;
    }

    const char c = src_[pos_];
    const size_t start = pos_;
    if (c == '-' || c == '+') {
      if (tokens_.empty() || tokens_.back().type == TokenType::kText) {
        fail("Unexpected character: " + std::string(1, c), pos_);
      }
      switch (tokens_.back().type) {
        case TokenType::kIdentifier:
        case TokenType::kNumericLiteral:
        case TokenType::kStringLiteral:
        case TokenType::kCloseParen:
        case TokenType::kCloseSquareBracket:
          break;  // a binary operator: matched by the table below
        default: {
          ++pos_;
          std::string num = consume_digits();
          if (!num.empty() && at(pos_) == '.' && unicode::is_ascii_digit(at(pos_ + 1))) {
            ++pos_;
            num += "." + consume_digits();
          }
          if (num.empty()) {
            push(TokenType::kUnaryOperator, std::string(1, c), start);
          } else {
            push(TokenType::kNumericLiteral, std::string(1, c) + num, start);
          }
          return;
        }
      }
    }

    for (const auto& [seq, type] : kMappingTable) {
      if (seq == "}}" && curly_depth_ > 0) continue;
      if (!starts_with(seq)) continue;
      push(type, std::string(seq), pos_);
      if (type == TokenType::kOpenExpression) {
        curly_depth_ = 0;
      } else if (type == TokenType::kOpenCurlyBracket) {
        ++curly_depth_;
      } else if (type == TokenType::kCloseCurlyBracket) {
        --curly_depth_;
      }
      pos_ += seq.size();
      return;
    }

    if (c == '\'' || c == '"') {
      ++pos_;
      std::string str = consume_string(c);
      push(TokenType::kStringLiteral, std::move(str), start);
      ++pos_;
      return;
    }

    if (unicode::is_ascii_digit(c)) {
      std::string num = consume_digits();
      const bool after_dot = !tokens_.empty() && tokens_.back().type == TokenType::kDot;
      if (!after_dot && at(pos_) == '.' && unicode::is_ascii_digit(at(pos_ + 1))) {
        ++pos_;
        num += "." + consume_digits();
      }
      push(TokenType::kNumericLiteral, std::move(num), start);
      return;
    }
    if (is_word(c)) {
      std::string word;
      while (is_word(at(pos_))) {
        word.push_back(src_[pos_++]);
        if (pos_ >= src_.size()) fail("Unexpected end of input", pos_);
      }
      push(TokenType::kIdentifier, std::move(word), start);
      return;
    }
    fail("Unexpected character: " + char_at(pos_), pos_);
  }

  static constexpr uint32_t kNoUnit = 0xFFFFFFFF;

  Preprocessed pre_;
  std::string_view src_;
  size_t pos_ = 0;
  int curly_depth_ = 0;
  uint32_t pending_high_surrogate_ = 0;
  std::vector<Token> tokens_;
};

}  // namespace

std::string_view token_type_name(TokenType type) {
  switch (type) {
    case TokenType::kText:
      return "Text";
    case TokenType::kNumericLiteral:
      return "NumericLiteral";
    case TokenType::kStringLiteral:
      return "StringLiteral";
    case TokenType::kIdentifier:
      return "Identifier";
    case TokenType::kEquals:
      return "Equals";
    case TokenType::kOpenParen:
      return "OpenParen";
    case TokenType::kCloseParen:
      return "CloseParen";
    case TokenType::kOpenStatement:
      return "OpenStatement";
    case TokenType::kCloseStatement:
      return "CloseStatement";
    case TokenType::kOpenExpression:
      return "OpenExpression";
    case TokenType::kCloseExpression:
      return "CloseExpression";
    case TokenType::kOpenSquareBracket:
      return "OpenSquareBracket";
    case TokenType::kCloseSquareBracket:
      return "CloseSquareBracket";
    case TokenType::kOpenCurlyBracket:
      return "OpenCurlyBracket";
    case TokenType::kCloseCurlyBracket:
      return "CloseCurlyBracket";
    case TokenType::kComma:
      return "Comma";
    case TokenType::kDot:
      return "Dot";
    case TokenType::kColon:
      return "Colon";
    case TokenType::kPipe:
      return "Pipe";
    case TokenType::kAdditiveBinaryOperator:
      return "AdditiveBinaryOperator";
    case TokenType::kMultiplicativeBinaryOperator:
      return "MultiplicativeBinaryOperator";
    case TokenType::kExponentiationBinaryOperator:
      return "ExponentiationBinaryOperator";
    case TokenType::kComparisonBinaryOperator:
      return "ComparisonBinaryOperator";
    case TokenType::kUnaryOperator:
      return "UnaryOperator";
    case TokenType::kComment:
      return "Comment";
  }
  return "Unknown";
}

Preprocessed preprocess(std::string_view source) {
  Preprocessed pre;
  pre.text.assign(source);
  pre.origin.resize(source.size() + 1);
  for (size_t i = 0; i <= source.size(); ++i) pre.origin[i] = i;
  if (!pre.text.empty() && pre.text.back() == '\n') {
    pre.text.pop_back();
    pre.origin.erase(pre.origin.end() - 2);
  }
  return remove_generation_tags(trim_blocks(lstrip_blocks(pre)));
}

std::vector<Token> tokenize(std::string_view source) {
  return Lexer(preprocess(source)).run();
}

SourceLocation locate(std::string_view source, size_t offset) {
  offset = std::min(offset, source.size());
  size_t line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < offset; ++i) {
    if (source[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  size_t column = 1;
  size_t pos = line_start;
  while (pos < offset) {
    unicode::decode(source, pos);
    ++column;
  }
  return {line, column};
}

}  // namespace strata::jinja
