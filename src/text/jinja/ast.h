// The syntax tree, node for node the one @huggingface/jinja's parser builds (ast.ts).
// Nodes own their children; every node records the byte offset of the token it starts at
// in the original source, so errors can name a line and column.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace strata::jinja {

enum class NodeKind {
  // statements
  kProgram,
  kIf,
  kFor,
  kBreak,
  kContinue,
  kSet,
  kMacro,
  kComment,
  kCallStatement,
  kFilterStatement,
  // expressions
  kMemberExpression,
  kCallExpression,
  kIdentifier,
  kIntegerLiteral,
  kFloatLiteral,
  kStringLiteral,
  kArrayLiteral,
  kTupleLiteral,
  kObjectLiteral,
  kBinaryExpression,
  kFilterExpression,
  kSelectExpression,
  kTestExpression,
  kUnaryExpression,
  kSliceExpression,
  kKeywordArgumentExpression,
  kSpreadExpression,
  kKeywordSpreadExpression,
  kTernary,
};

struct Node {
  Node(NodeKind k, size_t off) : kind(k), offset(off) {}
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  template <typename T>
  const T& as() const {
    return static_cast<const T&>(*this);
  }

  NodeKind kind;
  size_t offset;
};

using NodePtr = std::unique_ptr<Node>;
using NodeList = std::vector<NodePtr>;

struct Program : Node {
  explicit Program(size_t off) : Node(NodeKind::kProgram, off) {}
  NodeList body;
};

struct If : Node {
  explicit If(size_t off) : Node(NodeKind::kIf, off) {}
  NodePtr test;
  NodeList body;
  NodeList alternate;  // an elif is a nested If here
};

struct For : Node {
  explicit For(size_t off) : Node(NodeKind::kFor, off) {}
  NodePtr loopvar;   // Identifier or TupleLiteral
  NodePtr iterable;  // a SelectExpression is the `for x in xs if cond` filter
  NodeList body;
  NodeList default_block;
};

struct Break : Node {
  explicit Break(size_t off) : Node(NodeKind::kBreak, off) {}
};

struct Continue : Node {
  explicit Continue(size_t off) : Node(NodeKind::kContinue, off) {}
};

struct SetStatement : Node {
  explicit SetStatement(size_t off) : Node(NodeKind::kSet, off) {}
  NodePtr assignee;
  NodePtr value;  // null for a block set ({% set x %}...{% endset %})
  NodeList body;
};

struct Identifier : Node {
  Identifier(size_t off, std::string v) : Node(NodeKind::kIdentifier, off), value(std::move(v)) {}
  std::string value;
};

struct Macro : Node {
  explicit Macro(size_t off) : Node(NodeKind::kMacro, off) {}
  std::string name;
  NodeList args;  // Identifier or KeywordArgumentExpression (a default)
  NodeList body;
};

struct Comment : Node {
  Comment(size_t off, std::string v) : Node(NodeKind::kComment, off), value(std::move(v)) {}
  std::string value;
};

struct CallExpression : Node {
  explicit CallExpression(size_t off) : Node(NodeKind::kCallExpression, off) {}
  NodePtr callee;
  NodeList args;
};

struct CallStatement : Node {
  explicit CallStatement(size_t off) : Node(NodeKind::kCallStatement, off) {}
  std::unique_ptr<CallExpression> call;
  std::optional<NodeList> caller_args;
  NodeList body;
};

struct FilterStatement : Node {
  explicit FilterStatement(size_t off) : Node(NodeKind::kFilterStatement, off) {}
  NodePtr filter;  // Identifier or CallExpression
  NodeList body;
};

struct MemberExpression : Node {
  explicit MemberExpression(size_t off) : Node(NodeKind::kMemberExpression, off) {}
  NodePtr object;
  NodePtr property;
  bool computed = false;
};

struct IntegerLiteral : Node {
  IntegerLiteral(size_t off, double v) : Node(NodeKind::kIntegerLiteral, off), value(v) {}
  double value;
};

struct FloatLiteral : Node {
  FloatLiteral(size_t off, double v) : Node(NodeKind::kFloatLiteral, off), value(v) {}
  double value;
};

struct StringLiteral : Node {
  StringLiteral(size_t off, std::string v)
      : Node(NodeKind::kStringLiteral, off),
        value(std::make_shared<const std::string>(std::move(v))) {}
  std::shared_ptr<const std::string> value;  // shared with the runtime values it produces
};

struct ArrayLiteral : Node {
  explicit ArrayLiteral(size_t off) : Node(NodeKind::kArrayLiteral, off) {}
  NodeList items;
};

struct TupleLiteral : Node {
  explicit TupleLiteral(size_t off) : Node(NodeKind::kTupleLiteral, off) {}
  NodeList items;
};

struct ObjectLiteral : Node {
  explicit ObjectLiteral(size_t off) : Node(NodeKind::kObjectLiteral, off) {}
  std::vector<std::pair<NodePtr, NodePtr>> entries;
};

enum class BinaryOp {
  kAnd,
  kOr,
  kEqual,
  kNotEqual,
  kLess,
  kGreater,
  kLessEqual,
  kGreaterEqual,
  kIn,
  kNotIn,
  kAdd,
  kSubtract,
  kConcat,  // ~
  kMultiply,
  kDivide,
  kFloorDivide,
  kModulo,
  kPower,
};

struct BinaryExpression : Node {
  explicit BinaryExpression(size_t off) : Node(NodeKind::kBinaryExpression, off) {}
  BinaryOp op = BinaryOp::kAdd;
  std::string op_text;  // as written, for error messages
  NodePtr left;
  NodePtr right;
};

struct FilterExpression : Node {
  explicit FilterExpression(size_t off) : Node(NodeKind::kFilterExpression, off) {}
  NodePtr operand;
  NodePtr filter;  // Identifier or CallExpression
};

struct SelectExpression : Node {
  explicit SelectExpression(size_t off) : Node(NodeKind::kSelectExpression, off) {}
  NodePtr lhs;
  NodePtr test;
};

struct TestExpression : Node {
  explicit TestExpression(size_t off) : Node(NodeKind::kTestExpression, off) {}
  NodePtr operand;
  bool negate = false;
  std::string test;
  // Test arguments (`is divisibleby(3)`, `is eq 2`): an extension over the reference, whose
  // parser accepts no arguments.
  NodeList args;
};

struct UnaryExpression : Node {
  explicit UnaryExpression(size_t off) : Node(NodeKind::kUnaryExpression, off) {}
  std::string op;  // "not", "-" or "+"
  NodePtr argument;
};

struct SliceExpression : Node {
  explicit SliceExpression(size_t off) : Node(NodeKind::kSliceExpression, off) {}
  NodePtr start;  // each may be null
  NodePtr stop;
  NodePtr step;
};

struct KeywordArgumentExpression : Node {
  explicit KeywordArgumentExpression(size_t off)
      : Node(NodeKind::kKeywordArgumentExpression, off) {}
  std::string key;
  NodePtr value;
};

struct SpreadExpression : Node {
  explicit SpreadExpression(size_t off) : Node(NodeKind::kSpreadExpression, off) {}
  NodePtr argument;
};

struct KeywordSpreadExpression : Node {
  explicit KeywordSpreadExpression(size_t off) : Node(NodeKind::kKeywordSpreadExpression, off) {}
  NodePtr argument;
};

struct Ternary : Node {
  explicit Ternary(size_t off) : Node(NodeKind::kTernary, off) {}
  NodePtr condition;
  NodePtr true_expr;
  NodePtr false_expr;
};

}  // namespace strata::jinja
