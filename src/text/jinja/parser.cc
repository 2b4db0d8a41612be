#include "text/jinja/parser.h"

#include <algorithm>
#include <charconv>
#include <initializer_list>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "text/jinja/error.h"

namespace strata::jinja {
namespace {

// Nesting limit for blocks and expressions: real templates nest a handful of levels; the
// limit keeps hostile input from exhausting the stack.
constexpr int kMaxNestingDepth = 256;

// Jinja statements the reference does not implement either; named in the error so that an
// unsupported template fails clearly instead of rendering wrongly.
constexpr std::string_view kUnsupportedStatements[] = {
    "include", "extends", "block", "import", "from", "with", "raw", "autoescape", "do", "trans",
};

// Number(literal) for the lexer's numeric literals: digits with an optional sign and
// fraction. from_chars is locale-independent, unlike strtod.
double parse_number_literal(std::string_view text) {
  bool negative = false;
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) {
    negative = text[0] == '-';
    text.remove_prefix(1);
  }
  double value = 0;
  std::from_chars(text.data(), text.data() + text.size(), value);
  return negative ? -value : value;
}

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, size_t source_size)
      : tokens_(tokens), end_offset_(source_size) {}

  std::unique_ptr<Program> run() {
    auto program = std::make_unique<Program>(0);
    while (current_ < tokens_.size()) program->body.push_back(parse_any());
    return program;
  }

 private:
  // RAII nesting counter.
  class DepthGuard {
   public:
    DepthGuard(Parser& p, size_t offset) : p_(p) {
      if (++p_.depth_ > kMaxNestingDepth) {
        throw_syntax("template nesting is deeper than " + std::to_string(kMaxNestingDepth), offset);
      }
    }
    ~DepthGuard() { --p_.depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;

   private:
    Parser& p_;
  };

  // Counts the links of an operator chain (`a ~ b ~ c`, `x|f|g`, `a.b.c`) towards the
  // nesting limit: each link deepens the tree, and evaluation recurses over it.
  class ChainGuard {
   public:
    explicit ChainGuard(Parser& p) : p_(p) {}
    ~ChainGuard() { p_.depth_ -= links_; }
    ChainGuard(const ChainGuard&) = delete;
    ChainGuard& operator=(const ChainGuard&) = delete;
    void link(size_t offset) {
      ++links_;
      if (++p_.depth_ > kMaxNestingDepth) {
        throw_syntax("template nesting is deeper than " + std::to_string(kMaxNestingDepth), offset);
      }
    }

   private:
    Parser& p_;
    int links_ = 0;
  };

  size_t offset() const {
    return current_ < tokens_.size() ? tokens_[current_].offset : end_offset_;
  }

  const Token& peek() const {
    if (current_ >= tokens_.size()) throw_syntax("Unexpected end of template", end_offset_);
    return tokens_[current_];
  }

  const Token& next() {
    const Token& t = peek();
    ++current_;
    return t;
  }

  bool is(TokenType type, size_t ahead = 0) const {
    return current_ + ahead < tokens_.size() && tokens_[current_ + ahead].type == type;
  }

  bool is_identifier(std::string_view name, size_t ahead = 0) const {
    return is(TokenType::kIdentifier, ahead) && tokens_[current_ + ahead].value == name;
  }

  bool is_statement(std::initializer_list<std::string_view> names) const {
    if (!is(TokenType::kOpenStatement) || !is(TokenType::kIdentifier, 1)) return false;
    const std::string& name = tokens_[current_ + 1].value;
    return std::find(names.begin(), names.end(), name) != names.end();
  }

  const Token& expect(TokenType type, std::string_view error) {
    if (current_ >= tokens_.size()) {
      throw_syntax("Parser Error: " + std::string(error) +
                       ". Unexpected end of template, expected " +
                       std::string(token_type_name(type)) + ".",
                   end_offset_);
    }
    const Token& t = tokens_[current_++];
    if (t.type != type) {
      throw_syntax("Parser Error: " + std::string(error) + ". " +
                       std::string(token_type_name(t.type)) +
                       " !== " + std::string(token_type_name(type)) + ".",
                   t.offset);
    }
    return t;
  }

  void expect_identifier(std::string_view name) {
    if (!is_identifier(name)) throw_syntax("Expected " + std::string(name), offset());
    ++current_;
  }

  // Parses statements until one of `names` opens the next statement.
  NodeList parse_until(std::initializer_list<std::string_view> names, std::string_view opener,
                       size_t opener_offset) {
    NodeList body;
    while (!is_statement(names)) {
      if (current_ >= tokens_.size()) {
        std::string expected;
        for (std::string_view n : names) {
          if (!expected.empty()) expected += " or ";
          expected += "{% " + std::string(n) + " %}";
        }
        throw_syntax(
            "Unexpected end of template: {% " + std::string(opener) + " %} needs " + expected,
            opener_offset);
      }
      body.push_back(parse_any());
    }
    return body;
  }

  NodePtr parse_any() {
    const Token& t = peek();
    switch (t.type) {
      case TokenType::kComment:
        ++current_;
        return std::make_unique<Comment>(t.offset, t.value);
      case TokenType::kText:
        ++current_;
        return std::make_unique<StringLiteral>(t.offset, t.value);
      case TokenType::kOpenStatement:
        return parse_statement();
      case TokenType::kOpenExpression:
        return parse_expression_tag();
      default:
        throw_syntax("Unexpected token type: " + std::string(token_type_name(t.type)), t.offset);
    }
  }

  NodePtr parse_statement() {
    const size_t start =
        expect(TokenType::kOpenStatement, "Expected opening statement token").offset;
    DepthGuard guard(*this, start);
    const Token& name_token = peek();
    if (name_token.type != TokenType::kIdentifier) {
      throw_syntax("Unknown statement, got " + std::string(token_type_name(name_token.type)),
                   name_token.offset);
    }
    const std::string& name = name_token.value;
    if (name == "set") {
      ++current_;
      return parse_set(start);
    }
    if (name == "if") {
      ++current_;
      NodePtr result = parse_if(start);
      expect(TokenType::kOpenStatement, "Expected {% token");
      expect_identifier("endif");
      expect(TokenType::kCloseStatement, "Expected %} token");
      return result;
    }
    if (name == "macro") {
      ++current_;
      NodePtr result = parse_macro(start);
      expect(TokenType::kOpenStatement, "Expected {% token");
      expect_identifier("endmacro");
      expect(TokenType::kCloseStatement, "Expected %} token");
      return result;
    }
    if (name == "for") {
      ++current_;
      NodePtr result = parse_for(start);
      expect(TokenType::kOpenStatement, "Expected {% token");
      expect_identifier("endfor");
      expect(TokenType::kCloseStatement, "Expected %} token");
      return result;
    }
    if (name == "call") {
      ++current_;
      auto statement = std::make_unique<CallStatement>(start);
      if (is(TokenType::kOpenParen)) statement->caller_args = parse_args(/*parameters=*/true);
      const size_t callee_offset = offset();
      NodePtr callee = parse_primary();
      if (callee->kind != NodeKind::kIdentifier) {
        throw_syntax("Expected identifier following call statement", callee_offset);
      }
      statement->call = std::make_unique<CallExpression>(callee_offset);
      statement->call->callee = std::move(callee);
      statement->call->args = parse_args(/*parameters=*/false);
      expect(TokenType::kCloseStatement, "Expected closing statement token");
      statement->body = parse_until({"endcall"}, "call", start);
      expect(TokenType::kOpenStatement, "Expected '{%'");
      expect_identifier("endcall");
      expect(TokenType::kCloseStatement, "Expected closing statement token");
      return statement;
    }
    if (name == "break" || name == "continue") {
      ++current_;
      expect(TokenType::kCloseStatement, "Expected closing statement token");
      if (name == "break") return std::make_unique<Break>(start);
      return std::make_unique<Continue>(start);
    }
    if (name == "filter") {
      ++current_;
      auto statement = std::make_unique<FilterStatement>(start);
      NodePtr filter = parse_primary();
      if (filter->kind == NodeKind::kIdentifier && is(TokenType::kOpenParen)) {
        filter = parse_call(std::move(filter));
      }
      statement->filter = std::move(filter);
      expect(TokenType::kCloseStatement, "Expected closing statement token");
      statement->body = parse_until({"endfilter"}, "filter", start);
      expect(TokenType::kOpenStatement, "Expected '{%'");
      expect_identifier("endfilter");
      expect(TokenType::kCloseStatement, "Expected '%}'");
      return statement;
    }
    for (std::string_view unsupported : kUnsupportedStatements) {
      if (name == unsupported) {
        throw_unsupported("unsupported statement '{% " + name + " %}'", name_token.offset);
      }
    }
    throw_syntax("Unknown statement type: " + name, name_token.offset);
  }

  NodePtr parse_expression_tag() {
    expect(TokenType::kOpenExpression, "Expected opening expression token");
    NodePtr result = parse_expression();
    expect(TokenType::kCloseExpression, "Expected closing expression token");
    return result;
  }

  NodePtr parse_set(size_t start) {
    auto statement = std::make_unique<SetStatement>(start);
    statement->assignee = parse_expression_sequence(/*primary=*/false);
    if (is(TokenType::kEquals)) {
      ++current_;
      statement->value = parse_expression_sequence(/*primary=*/false);
    } else {
      expect(TokenType::kCloseStatement, "Expected %} token");
      statement->body = parse_until({"endset"}, "set", start);
      expect(TokenType::kOpenStatement, "Expected {% token");
      expect_identifier("endset");
    }
    expect(TokenType::kCloseStatement, "Expected closing statement token");
    return statement;
  }

  NodePtr parse_if(size_t start) {
    auto statement = std::make_unique<If>(start);
    statement->test = parse_expression();
    expect(TokenType::kCloseStatement, "Expected closing statement token");
    statement->body = parse_until({"elif", "else", "endif"}, "if", start);
    if (is_statement({"elif"})) {
      const size_t elif_start = offset();
      current_ += 2;
      statement->alternate.push_back(parse_if(elif_start));
    } else if (is_statement({"else"})) {
      current_ += 2;
      expect(TokenType::kCloseStatement, "Expected closing statement token");
      statement->alternate = parse_until({"endif"}, "if", start);
    }
    return statement;
  }

  NodePtr parse_macro(size_t start) {
    auto statement = std::make_unique<Macro>(start);
    const size_t name_offset = offset();
    NodePtr name = parse_primary();
    if (name->kind != NodeKind::kIdentifier) {
      throw_syntax("Expected identifier following macro statement", name_offset);
    }
    statement->name = name->as<Identifier>().value;
    statement->args = parse_args(/*parameters=*/true);
    expect(TokenType::kCloseStatement, "Expected closing statement token");
    statement->body = parse_until({"endmacro"}, "macro", start);
    return statement;
  }

  NodePtr parse_expression_sequence(bool primary) {
    const size_t start = offset();
    NodePtr first = primary ? parse_primary() : parse_expression();
    if (!is(TokenType::kComma)) return first;
    auto tuple = std::make_unique<TupleLiteral>(start);
    tuple->items.push_back(std::move(first));
    while (true) {
      ++current_;  // the comma
      tuple->items.push_back(primary ? parse_primary() : parse_expression());
      if (!is(TokenType::kComma)) break;
    }
    return tuple;
  }

  NodePtr parse_for(size_t start) {
    auto statement = std::make_unique<For>(start);
    const size_t var_offset = offset();
    statement->loopvar = parse_expression_sequence(/*primary=*/true);
    if (statement->loopvar->kind != NodeKind::kIdentifier &&
        statement->loopvar->kind != NodeKind::kTupleLiteral) {
      throw_syntax("Expected identifier/tuple for the loop variable", var_offset);
    }
    if (!is_identifier("in"))
      throw_syntax("Expected `in` keyword following loop variable", offset());
    ++current_;
    statement->iterable = parse_expression();
    expect(TokenType::kCloseStatement, "Expected closing statement token");
    statement->body = parse_until({"endfor", "else"}, "for", start);
    if (is_statement({"else"})) {
      current_ += 2;
      expect(TokenType::kCloseStatement, "Expected closing statement token");
      statement->default_block = parse_until({"endfor"}, "for", start);
    }
    return statement;
  }

  NodePtr parse_expression() {
    DepthGuard guard(*this, offset());
    return parse_if_expression();
  }

  NodePtr parse_if_expression() {
    const size_t start = offset();
    NodePtr a = parse_logical_or();
    if (!is_identifier("if")) return a;
    ++current_;
    NodePtr test = parse_logical_or();
    if (is_identifier("else")) {
      ++current_;
      auto ternary = std::make_unique<Ternary>(start);
      ternary->condition = std::move(test);
      ternary->true_expr = std::move(a);
      ternary->false_expr = parse_if_expression();
      return ternary;
    }
    auto select = std::make_unique<SelectExpression>(start);
    select->lhs = std::move(a);
    select->test = std::move(test);
    return select;
  }

  NodePtr make_binary(BinaryOp op, std::string text, NodePtr left, NodePtr right, size_t off) {
    auto node = std::make_unique<BinaryExpression>(off);
    node->op = op;
    node->op_text = std::move(text);
    node->left = std::move(left);
    node->right = std::move(right);
    return node;
  }

  NodePtr parse_logical_or() {
    NodePtr left = parse_logical_and();
    ChainGuard chain(*this);
    while (is_identifier("or")) {
      chain.link(offset());
      const size_t off = tokens_[current_++].offset;
      left = make_binary(BinaryOp::kOr, "or", std::move(left), parse_logical_and(), off);
    }
    return left;
  }

  NodePtr parse_logical_and() {
    NodePtr left = parse_logical_not();
    ChainGuard chain(*this);
    while (is_identifier("and")) {
      chain.link(offset());
      const size_t off = tokens_[current_++].offset;
      left = make_binary(BinaryOp::kAnd, "and", std::move(left), parse_logical_not(), off);
    }
    return left;
  }

  NodePtr parse_logical_not() {
    NodePtr right;
    while (is_identifier("not")) {
      DepthGuard guard(*this, offset());
      auto unary = std::make_unique<UnaryExpression>(tokens_[current_++].offset);
      unary->op = "not";
      unary->argument = parse_logical_not();
      right = std::move(unary);
    }
    return right ? std::move(right) : parse_comparison();
  }

  NodePtr parse_comparison() {
    NodePtr left = parse_additive();
    ChainGuard chain(*this);
    while (true) {
      chain.link(offset());
      BinaryOp op;
      std::string text;
      size_t off = offset();
      if (is_identifier("not") && is_identifier("in", 1)) {
        op = BinaryOp::kNotIn;
        text = "not in";
        current_ += 2;
      } else if (is_identifier("in")) {
        op = BinaryOp::kIn;
        text = "in";
        ++current_;
      } else if (is(TokenType::kComparisonBinaryOperator)) {
        text = tokens_[current_++].value;
        if (text == "==")
          op = BinaryOp::kEqual;
        else if (text == "!=")
          op = BinaryOp::kNotEqual;
        else if (text == "<")
          op = BinaryOp::kLess;
        else if (text == ">")
          op = BinaryOp::kGreater;
        else if (text == "<=")
          op = BinaryOp::kLessEqual;
        else
          op = BinaryOp::kGreaterEqual;
      } else {
        break;
      }
      left = make_binary(op, std::move(text), std::move(left), parse_additive(), off);
    }
    return left;
  }

  NodePtr parse_additive() {
    NodePtr left = parse_multiplicative();
    ChainGuard chain(*this);
    while (is(TokenType::kAdditiveBinaryOperator)) {
      chain.link(offset());
      const Token& t = tokens_[current_++];
      const BinaryOp op = t.value == "+"   ? BinaryOp::kAdd
                          : t.value == "-" ? BinaryOp::kSubtract
                                           : BinaryOp::kConcat;
      left = make_binary(op, t.value, std::move(left), parse_multiplicative(), t.offset);
    }
    return left;
  }

  NodePtr parse_multiplicative() {
    NodePtr left = parse_power();
    ChainGuard chain(*this);
    while (is(TokenType::kMultiplicativeBinaryOperator)) {
      chain.link(offset());
      const Token& t = tokens_[current_++];
      const BinaryOp op = t.value == "*"    ? BinaryOp::kMultiply
                          : t.value == "/"  ? BinaryOp::kDivide
                          : t.value == "//" ? BinaryOp::kFloorDivide
                                            : BinaryOp::kModulo;
      left = make_binary(op, t.value, std::move(left), parse_power(), t.offset);
    }
    return left;
  }

  NodePtr parse_power() {
    NodePtr left = parse_test();
    ChainGuard chain(*this);
    while (is(TokenType::kExponentiationBinaryOperator)) {
      chain.link(offset());
      const Token& t = tokens_[current_++];
      left = make_binary(BinaryOp::kPower, "**", std::move(left), parse_test(), t.offset);
    }
    return left;
  }

  // True when the next token can start a test argument written without parentheses
  // (`x is divisibleby 3`): what Jinja2 accepts, minus the keywords that may follow a test.
  bool starts_bare_test_argument() const {
    if (is(TokenType::kNumericLiteral) || is(TokenType::kStringLiteral) ||
        is(TokenType::kOpenSquareBracket) || is(TokenType::kOpenCurlyBracket)) {
      return true;
    }
    if (!is(TokenType::kIdentifier)) return false;
    static const std::set<std::string, std::less<>> kKeywords = {"else", "or", "and", "if",
                                                                 "is",   "in", "not"};
    return !kKeywords.contains(tokens_[current_].value);
  }

  NodePtr parse_test() {
    NodePtr operand = parse_filter();
    ChainGuard chain(*this);
    while (is_identifier("is")) {
      chain.link(offset());
      const size_t off = tokens_[current_++].offset;
      auto test = std::make_unique<TestExpression>(off);
      test->negate = is_identifier("not");
      if (test->negate) ++current_;
      const size_t name_offset = offset();
      NodePtr name = parse_primary();
      if (name->kind != NodeKind::kIdentifier) {
        throw_syntax("Expected identifier for the test", name_offset);
      }
      test->test = name->as<Identifier>().value;
      if (is(TokenType::kOpenParen)) {
        test->args = parse_args(/*parameters=*/false);
      } else if (starts_bare_test_argument()) {
        test->args.push_back(parse_member(parse_primary()));
      }
      test->operand = std::move(operand);
      operand = std::move(test);
    }
    return operand;
  }

  NodePtr parse_filter() {
    NodePtr operand = parse_unary_sign();
    ChainGuard chain(*this);
    while (is(TokenType::kPipe)) {
      chain.link(offset());
      const size_t off = tokens_[current_++].offset;
      const size_t name_offset = offset();
      NodePtr filter = parse_primary();
      if (filter->kind != NodeKind::kIdentifier) {
        throw_syntax("Expected identifier for the filter", name_offset);
      }
      if (is(TokenType::kOpenParen)) filter = parse_call(std::move(filter));
      auto node = std::make_unique<FilterExpression>(off);
      node->operand = std::move(operand);
      node->filter = std::move(filter);
      operand = std::move(node);
    }
    return operand;
  }

  NodePtr parse_unary_sign() {
    if (current_ < tokens_.size()) {
      const Token& t = tokens_[current_];
      if ((t.type == TokenType::kUnaryOperator || t.type == TokenType::kAdditiveBinaryOperator) &&
          (t.value == "-" || t.value == "+")) {
        DepthGuard guard(*this, t.offset);
        ++current_;
        auto unary = std::make_unique<UnaryExpression>(t.offset);
        unary->op = t.value;
        unary->argument = parse_unary_sign();
        return unary;
      }
    }
    NodePtr member = parse_member(parse_primary());
    if (is(TokenType::kOpenParen)) return parse_call(std::move(member));
    return member;
  }

  NodePtr parse_call(NodePtr callee) {
    DepthGuard guard(*this, callee->offset);
    auto call = std::make_unique<CallExpression>(callee->offset);
    call->callee = std::move(callee);
    call->args = parse_args(/*parameters=*/false);
    NodePtr expression = parse_member(std::move(call));
    if (is(TokenType::kOpenParen)) expression = parse_call(std::move(expression));
    return expression;
  }

  NodeList parse_args(bool parameters) {
    expect(TokenType::kOpenParen, "Expected opening parenthesis for arguments list");
    NodeList args = parse_arguments_list(parameters);
    expect(TokenType::kCloseParen, "Expected closing parenthesis for arguments list");
    return args;
  }

  NodeList parse_arguments_list(bool parameters) {
    NodeList args;
    std::set<std::string, std::less<>> parameter_names;
    bool saw_keyword_or_default = false;
    bool saw_spread = false;
    while (!is(TokenType::kCloseParen)) {
      const size_t arg_offset = offset();
      if (current_ >= tokens_.size()) {
        throw_syntax("Unexpected end of template in an argument list", end_offset_);
      }
      const bool keyword_spread = is(TokenType::kExponentiationBinaryOperator);
      const bool positional_spread =
          is(TokenType::kMultiplicativeBinaryOperator) && tokens_[current_].value == "*";
      if (parameters && (keyword_spread || positional_spread)) {
        throw_syntax("Argument unpacking is not allowed in parameter declarations", arg_offset);
      }
      if (keyword_spread) {
        ++current_;
        auto spread = std::make_unique<KeywordSpreadExpression>(arg_offset);
        spread->argument = parse_expression();
        args.push_back(std::move(spread));
        if (is(TokenType::kComma)) ++current_;
        if (!is(TokenType::kCloseParen)) {
          throw_syntax("Expected closing parenthesis: `**` must be applied to the final argument",
                       offset());
        }
        break;
      }
      NodePtr argument;
      if (positional_spread) {
        if (saw_spread) throw_syntax("Only one `*` argument unpacking is allowed", arg_offset);
        saw_spread = true;
        ++current_;
        auto spread = std::make_unique<SpreadExpression>(arg_offset);
        spread->argument = parse_expression();
        argument = std::move(spread);
      } else {
        argument = parse_expression();
        if (is(TokenType::kEquals)) {
          ++current_;
          if (argument->kind != NodeKind::kIdentifier) {
            throw_syntax(parameters ? "Expected identifier for parameter declaration"
                                    : "Expected identifier for keyword argument",
                         arg_offset);
          }
          auto keyword = std::make_unique<KeywordArgumentExpression>(arg_offset);
          keyword->key = argument->as<Identifier>().value;
          keyword->value = parse_expression();
          argument = std::move(keyword);
        }
        if (parameters) {
          std::string name;
          if (argument->kind == NodeKind::kIdentifier) {
            name = argument->as<Identifier>().value;
          } else if (argument->kind == NodeKind::kKeywordArgumentExpression) {
            name = argument->as<KeywordArgumentExpression>().key;
          } else {
            throw_syntax("Expected identifier for parameter declaration", arg_offset);
          }
          if (parameter_names.contains(name)) {
            throw_syntax("Duplicate parameter name: " + name, arg_offset);
          }
          parameter_names.insert(name);
        }
        if (argument->kind == NodeKind::kKeywordArgumentExpression) {
          saw_keyword_or_default = true;
        } else if (saw_keyword_or_default) {
          throw_syntax(parameters ? "Non-default argument follows default argument"
                                  : "Positional arguments must come before keyword arguments",
                       arg_offset);
        } else if (saw_spread) {
          throw_syntax("Positional arguments must not follow `*` argument unpacking", arg_offset);
        }
      }
      args.push_back(std::move(argument));
      if (is(TokenType::kComma)) ++current_;
    }
    return args;
  }

  // The inside of [...]: a subscript or a slice with up to three parts.
  NodePtr parse_subscript(size_t open_offset) {
    std::vector<NodePtr> parts;
    bool is_slice = false;
    while (!is(TokenType::kCloseSquareBracket)) {
      if (current_ >= tokens_.size())
        throw_syntax("Unexpected end of template in [...]", end_offset_);
      if (is(TokenType::kColon)) {
        parts.push_back(nullptr);
        ++current_;
        is_slice = true;
      } else {
        parts.push_back(parse_expression());
        if (is(TokenType::kColon)) {
          ++current_;
          is_slice = true;
        }
      }
    }
    if (parts.empty()) {
      throw_syntax("Expected at least one argument for member/slice expression", open_offset);
    }
    if (!is_slice) return std::move(parts[0]);
    if (parts.size() > 3) throw_syntax("Expected 0-3 arguments for slice expression", open_offset);
    auto slice = std::make_unique<SliceExpression>(open_offset);
    slice->start = std::move(parts[0]);
    if (parts.size() > 1) slice->stop = std::move(parts[1]);
    if (parts.size() > 2) slice->step = std::move(parts[2]);
    return slice;
  }

  NodePtr parse_member(NodePtr object) {
    ChainGuard chain(*this);
    while (is(TokenType::kDot) || is(TokenType::kOpenSquareBracket)) {
      chain.link(offset());
      const Token& op = tokens_[current_++];
      auto member = std::make_unique<MemberExpression>(op.offset);
      member->computed = op.type == TokenType::kOpenSquareBracket;
      if (member->computed) {
        DepthGuard guard(*this, op.offset);
        member->property = parse_subscript(op.offset);
        expect(TokenType::kCloseSquareBracket, "Expected closing square bracket");
      } else {
        const size_t prop_offset = offset();
        member->property = parse_primary();
        if (member->property->kind != NodeKind::kIdentifier &&
            member->property->kind != NodeKind::kIntegerLiteral) {
          throw_syntax("Expected identifier or integer following dot operator", prop_offset);
        }
      }
      member->object = std::move(object);
      object = std::move(member);
    }
    return object;
  }

  NodePtr parse_primary() {
    const Token& t = next();
    switch (t.type) {
      case TokenType::kNumericLiteral: {
        const double value = parse_number_literal(t.value);
        if (t.value.find('.') != std::string::npos)
          return std::make_unique<FloatLiteral>(t.offset, value);
        return std::make_unique<IntegerLiteral>(t.offset, value);
      }
      case TokenType::kStringLiteral: {
        std::string value = t.value;
        while (is(TokenType::kStringLiteral)) value += tokens_[current_++].value;
        return std::make_unique<StringLiteral>(t.offset, std::move(value));
      }
      case TokenType::kIdentifier:
        return std::make_unique<Identifier>(t.offset, t.value);
      case TokenType::kOpenParen: {
        DepthGuard guard(*this, t.offset);
        NodePtr expression = parse_expression_sequence(/*primary=*/false);
        expect(TokenType::kCloseParen, "Expected closing parenthesis");
        return expression;
      }
      case TokenType::kOpenSquareBracket: {
        DepthGuard guard(*this, t.offset);
        auto array = std::make_unique<ArrayLiteral>(t.offset);
        while (!is(TokenType::kCloseSquareBracket)) {
          if (current_ >= tokens_.size())
            throw_syntax("Unexpected end of template in [...]", end_offset_);
          array->items.push_back(parse_expression());
          if (is(TokenType::kComma)) ++current_;
        }
        ++current_;
        return array;
      }
      case TokenType::kOpenCurlyBracket: {
        DepthGuard guard(*this, t.offset);
        auto object = std::make_unique<ObjectLiteral>(t.offset);
        while (!is(TokenType::kCloseCurlyBracket)) {
          if (current_ >= tokens_.size())
            throw_syntax("Unexpected end of template in {...}", end_offset_);
          NodePtr key = parse_expression();
          expect(TokenType::kColon, "Expected colon between key and value in object literal");
          NodePtr value = parse_expression();
          object->entries.emplace_back(std::move(key), std::move(value));
          if (is(TokenType::kComma)) ++current_;
        }
        ++current_;
        return object;
      }
      default:
        throw_syntax("Unexpected token: " + std::string(token_type_name(t.type)), t.offset);
    }
  }

  const std::vector<Token>& tokens_;
  size_t end_offset_;
  size_t current_ = 0;
  int depth_ = 0;
};

}  // namespace

std::unique_ptr<Program> parse(const std::vector<Token>& tokens, size_t source_size) {
  return Parser(tokens, source_size).run();
}

}  // namespace strata::jinja
