#include "text/tokenizer/byte_level.h"

#include <array>

#include "text/tokenizer/utf8.h"

namespace strata::byte_level {
namespace {

struct Tables {
  std::array<char32_t, 256> byte_to_char{};
  std::array<int16_t, 324> char_to_byte{};  // the alphabet lies in [0x21, 0x143]
};

Tables build() {
  Tables t;
  t.char_to_byte.fill(-1);
  auto printable = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  int next = 0;
  for (int b = 0; b < 256; ++b) {
    const char32_t cp =
        printable(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
    t.byte_to_char[b] = cp;
    t.char_to_byte[cp] = static_cast<int16_t>(b);
  }
  return t;
}

const Tables& tables() {
  static const Tables t = build();
  return t;
}

}  // namespace

char32_t byte_to_char(uint8_t b) {
  return tables().byte_to_char[b];
}

int char_to_byte(char32_t cp) {
  const Tables& t = tables();
  return cp < t.char_to_byte.size() ? t.char_to_byte[cp] : -1;
}

std::optional<std::string> to_bytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const int b = char_to_byte(utf8::decode_valid(text, pos));
    if (b < 0) return std::nullopt;
    out.push_back(static_cast<char>(b));
  }
  return out;
}

std::string from_bytes(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) utf8::append(out, byte_to_char(static_cast<uint8_t>(c)));
  return out;
}

}  // namespace strata::byte_level
