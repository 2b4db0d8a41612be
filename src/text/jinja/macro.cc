#include "text/jinja/macro.h"

#include <optional>
#include <string_view>
#include <utility>

#include "text/jinja/error.h"

namespace strata::jinja {
namespace {

class SpecialArgumentFinder {
 public:
  SpecialArguments find(const NodeList& parameters, const NodeList& body) {
    for (const NodePtr& p : parameters) declare_parameter(*p);
    visit_list(body);
    return accessed_;
  }

 private:
  static bool special(std::string_view name) { return name == "kwargs" || name == "varargs"; }

  void declare_name(std::string_view name) {
    if (name == "kwargs") declared_.kwargs = true;
    if (name == "varargs") declared_.varargs = true;
  }

  void declare_target(const Node& target) {
    if (target.kind == NodeKind::kIdentifier) {
      declare_name(target.as<Identifier>().value);
    } else if (target.kind == NodeKind::kTupleLiteral) {
      for (const NodePtr& item : target.as<TupleLiteral>().items) declare_target(*item);
    }
  }

  void declare_parameter(const Node& p) {
    if (p.kind == NodeKind::kIdentifier) declare_name(p.as<Identifier>().value);
    if (p.kind == NodeKind::kKeywordArgumentExpression) {
      declare_name(p.as<KeywordArgumentExpression>().key);
    }
  }

  void visit_defaults(const NodeList& parameters) {
    for (const NodePtr& p : parameters) {
      if (p->kind == NodeKind::kKeywordArgumentExpression) {
        visit(p->as<KeywordArgumentExpression>().value.get());
      }
    }
  }

  void visit_filter(const Node& filter) {
    if (filter.kind == NodeKind::kCallExpression) visit_list(filter.as<CallExpression>().args);
  }

  void visit_list(const NodeList& nodes) {
    for (const NodePtr& n : nodes) visit(n.get());
  }

  void visit(const Node* node) {
    if (node == nullptr) return;
    switch (node->kind) {
      case NodeKind::kFor: {
        const For& f = node->as<For>();
        declare_target(*f.loopvar);
        if (f.iterable->kind == NodeKind::kSelectExpression) {
          const SelectExpression& select = f.iterable->as<SelectExpression>();
          visit(select.lhs.get());
          visit_list(f.body);
          visit_list(f.default_block);
          visit(select.test.get());
          return;
        }
        visit(f.iterable.get());
        visit_list(f.body);
        visit_list(f.default_block);
        return;
      }
      case NodeKind::kSet: {
        const SetStatement& s = node->as<SetStatement>();
        declare_target(*s.assignee);
        visit(s.value.get());
        visit_list(s.body);
        return;
      }
      case NodeKind::kMacro: {
        const Macro& m = node->as<Macro>();
        for (const NodePtr& p : m.args) declare_parameter(*p);
        visit_defaults(m.args);
        visit_list(m.body);
        return;
      }
      case NodeKind::kCallStatement: {
        const CallStatement& c = node->as<CallStatement>();
        visit(c.call.get());
        if (c.caller_args) {
          for (const NodePtr& p : *c.caller_args) declare_parameter(*p);
          visit_defaults(*c.caller_args);
        }
        visit_list(c.body);
        return;
      }
      case NodeKind::kFilterStatement: {
        const FilterStatement& f = node->as<FilterStatement>();
        visit_list(f.body);
        visit_filter(*f.filter);
        return;
      }
      case NodeKind::kIdentifier: {
        const std::string& name = node->as<Identifier>().value;
        if (name == "kwargs" && !declared_.kwargs) accessed_.kwargs = true;
        if (name == "varargs" && !declared_.varargs) accessed_.varargs = true;
        return;
      }
      case NodeKind::kMemberExpression: {
        const MemberExpression& m = node->as<MemberExpression>();
        visit(m.object.get());
        if (m.computed) visit(m.property.get());
        return;
      }
      case NodeKind::kFilterExpression: {
        const FilterExpression& f = node->as<FilterExpression>();
        visit(f.operand.get());
        visit_filter(*f.filter);
        return;
      }
      case NodeKind::kTestExpression: {
        const TestExpression& t = node->as<TestExpression>();
        visit(t.operand.get());
        visit_list(t.args);
        return;
      }
      case NodeKind::kSelectExpression: {
        const SelectExpression& s = node->as<SelectExpression>();
        visit(s.test.get());
        visit(s.lhs.get());
        return;
      }
      case NodeKind::kKeywordArgumentExpression:
        visit(node->as<KeywordArgumentExpression>().value.get());
        return;
      case NodeKind::kProgram:
        visit_list(node->as<Program>().body);
        return;
      case NodeKind::kIf: {
        const If& i = node->as<If>();
        visit(i.test.get());
        visit_list(i.body);
        visit_list(i.alternate);
        return;
      }
      case NodeKind::kCallExpression: {
        const CallExpression& c = node->as<CallExpression>();
        visit(c.callee.get());
        visit_list(c.args);
        return;
      }
      case NodeKind::kBinaryExpression: {
        const BinaryExpression& b = node->as<BinaryExpression>();
        visit(b.left.get());
        visit(b.right.get());
        return;
      }
      case NodeKind::kUnaryExpression:
        visit(node->as<UnaryExpression>().argument.get());
        return;
      case NodeKind::kArrayLiteral:
        visit_list(node->as<ArrayLiteral>().items);
        return;
      case NodeKind::kTupleLiteral:
        visit_list(node->as<TupleLiteral>().items);
        return;
      case NodeKind::kObjectLiteral:
        for (const auto& [k, v] : node->as<ObjectLiteral>().entries) {
          visit(k.get());
          visit(v.get());
        }
        return;
      case NodeKind::kSliceExpression: {
        const SliceExpression& s = node->as<SliceExpression>();
        visit(s.start.get());
        visit(s.stop.get());
        visit(s.step.get());
        return;
      }
      case NodeKind::kSpreadExpression:
        visit(node->as<SpreadExpression>().argument.get());
        return;
      case NodeKind::kKeywordSpreadExpression:
        visit(node->as<KeywordSpreadExpression>().argument.get());
        return;
      case NodeKind::kTernary: {
        const Ternary& t = node->as<Ternary>();
        visit(t.condition.get());
        visit(t.true_expr.get());
        visit(t.false_expr.get());
        return;
      }
      case NodeKind::kBreak:
      case NodeKind::kContinue:
      case NodeKind::kComment:
      case NodeKind::kIntegerLiteral:
      case NodeKind::kFloatLiteral:
      case NodeKind::kStringLiteral:
        return;
    }
  }

  SpecialArguments declared_;
  SpecialArguments accessed_;
};

// Parameter name and default-value node of a macro parameter.
std::pair<std::string_view, const Node*> parameter_descriptor(const Node& p) {
  if (p.kind == NodeKind::kIdentifier) return {p.as<Identifier>().value, nullptr};
  const KeywordArgumentExpression& k = p.as<KeywordArgumentExpression>();
  return {k.key, k.value.get()};
}

}  // namespace

SpecialArguments find_special_arguments(const NodeList& parameters, const NodeList& body) {
  return SpecialArgumentFinder().find(parameters, body);
}

void bind_macro_arguments(Interpreter& interpreter, const std::string& display_name,
                          const NodeList& parameters, SpecialArguments special,
                          const std::vector<Value>& args, const EnvPtr& scope) {
  std::vector<Value> positional = args;
  Object keyword;
  if (!positional.empty() && positional.back().is_kwargs()) {
    keyword = positional.back().object();
    positional.pop_back();
  }
  std::vector<std::pair<std::string_view, const Node*>> pending_defaults;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const auto [name, default_value] = parameter_descriptor(*parameters[i]);
    std::optional<Value> value;
    if (i < positional.size()) value = positional[i];
    if (!value) {
      if (const Value* kw = keyword.find(name)) {
        value = *kw;
        keyword.erase(name);
      }
    }
    if (!value && default_value != nullptr) pending_defaults.emplace_back(name, default_value);
    scope->set(name, value.value_or(Value()));
  }
  if (special.kwargs) {
    scope->set("kwargs", Value::object(std::move(keyword)));
  } else if (!keyword.empty()) {
    throw_runtime("macro " + display_name + " takes no keyword argument '" +
                  keyword.entries().front().first + "'");
  }
  if (special.varargs) {
    Array rest;
    for (size_t i = parameters.size(); i < positional.size(); ++i) rest.push_back(positional[i]);
    scope->set("varargs", Value::array(std::move(rest)));
  } else if (positional.size() > parameters.size()) {
    throw_runtime("macro " + display_name + " takes not more than " +
                  std::to_string(parameters.size()) + " argument(s)");
  }
  for (const auto& [name, default_value] : pending_defaults) {
    scope->set(name, interpreter.evaluate(*default_value, scope));
  }
}

}  // namespace strata::jinja
