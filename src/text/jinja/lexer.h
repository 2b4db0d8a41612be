// The Jinja lexer, token for token the one of @huggingface/jinja 0.5.11.
//
// Preprocessing first applies what the reference's Template constructor applies: drop one
// trailing newline, lstrip_blocks (spaces/tabs before `{%`, `{#` or `{-` at a line start),
// trim_blocks (the newline after `%}`, `#}` or `-}`), and removal of transformers'
// `{% generation %}` / `{% endgeneration %}` tags. Tokenizing then follows the reference,
// including `{%-`/`-%}` whitespace control, unary-minus number literals and string escapes.
// Each token records the byte offset in the original source it came from, for error messages.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace strata::jinja {

enum class TokenType {
  kText,
  kNumericLiteral,
  kStringLiteral,
  kIdentifier,
  kEquals,
  kOpenParen,
  kCloseParen,
  kOpenStatement,
  kCloseStatement,
  kOpenExpression,
  kCloseExpression,
  kOpenSquareBracket,
  kCloseSquareBracket,
  kOpenCurlyBracket,
  kCloseCurlyBracket,
  kComma,
  kDot,
  kColon,
  kPipe,
  kAdditiveBinaryOperator,
  kMultiplicativeBinaryOperator,
  kExponentiationBinaryOperator,
  kComparisonBinaryOperator,
  kUnaryOperator,
  kComment,
};

// The reference's name of a token type ("OpenParen", ...), used in error messages.
std::string_view token_type_name(TokenType type);

struct Token {
  TokenType type;
  std::string value;
  size_t offset;  // byte offset in the original template source
};

// The preprocessed source and, for every byte of it, its offset in the original source.
struct Preprocessed {
  std::string text;
  std::vector<size_t> origin;  // origin.size() == text.size() + 1 (last: end of source)
};

Preprocessed preprocess(std::string_view source);

// Tokenizes a template. Throws TemplateError (kSyntax) on malformed input.
std::vector<Token> tokenize(std::string_view source);

// 1-based line and column (in bytes) of a byte offset.
struct SourceLocation {
  size_t line;
  size_t column;
};
SourceLocation locate(std::string_view source, size_t offset);

}  // namespace strata::jinja
