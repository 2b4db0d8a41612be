// GPT-2's byte-level alphabet (bytes_to_unicode): every byte is shown as a printable code
// point so that BPE vocabularies can be stored as text. Byte-level tokenizers (Qwen,
// Llama 3, GPT-2) store their vocabulary and merges in this alphabet.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace strata::byte_level {

// The code point that stands for byte `b`.
char32_t byte_to_char(uint8_t b);

// The byte that code point `cp` stands for, or -1 when `cp` is not in the alphabet.
int char_to_byte(char32_t cp);

// Raw bytes of a byte-level string (valid UTF-8), or nullopt when it contains a code point
// outside the alphabet.
std::optional<std::string> to_bytes(std::string_view text);

// The byte-level string (UTF-8) for raw bytes.
std::string from_bytes(std::string_view bytes);

}  // namespace strata::byte_level
