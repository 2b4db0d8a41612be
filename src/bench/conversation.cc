#include "bench/conversation.h"

#include <utility>

namespace strata::bench {

Status validate(const ConversationShape& s) {
  auto range = [](const char* what, int64_t lo, int64_t hi) -> Status {
    if (lo < 1 || hi < lo) {
      return make_error(ErrorCode::kInvalidArgument,
                        std::string(what) + " token range must satisfy 1 <= min <= max, got " +
                            std::to_string(lo) + ".." + std::to_string(hi));
    }
    return {};
  };
  if (auto st = range("system prompt", s.system_min_tokens, s.system_max_tokens); !st) return st;
  if (auto st = range("user turn", s.user_min_tokens, s.user_max_tokens); !st) return st;
  if (auto st = range("assistant turn", s.assistant_min_tokens, s.assistant_max_tokens); !st) {
    return st;
  }
  if (s.min_turns < 1 || s.max_turns < s.min_turns) {
    return make_error(ErrorCode::kInvalidArgument,
                      "turns per conversation must satisfy 1 <= min <= max, got " +
                          std::to_string(s.min_turns) + ".." + std::to_string(s.max_turns));
  }
  return {};
}

Result<Conversation> make_conversation(uint64_t seed, const std::string& stream, uint64_t index,
                                       const ConversationShape& shape,
                                       const TokenCounter& counter) {
  if (auto st = validate(shape); !st) return std::unexpected(st.error());
  TextGenerator gen(derive_seed(seed, stream, index), counter);
  Conversation c;
  c.id = stream + "-" + std::to_string(index);
  auto system = gen.text_in_range(shape.system_min_tokens, shape.system_max_tokens);
  if (!system) return std::unexpected(system.error());
  c.system = std::move(system->text);
  c.system_tokens = system->tokens;
  const int64_t turns = gen.rng().uniform_int(shape.min_turns, shape.max_turns);
  for (int64_t t = 0; t < turns; ++t) {
    auto user = gen.text_in_range(shape.user_min_tokens, shape.user_max_tokens);
    if (!user) return std::unexpected(user.error());
    auto reply = gen.text_in_range(shape.assistant_min_tokens, shape.assistant_max_tokens);
    if (!reply) return std::unexpected(reply.error());
    c.turns.push_back(
        Turn{std::move(user->text), std::move(reply->text), user->tokens, reply->tokens});
  }
  return c;
}

nlohmann::ordered_json chat_messages(const Conversation& c, size_t num_answered_turns,
                                     bool next_user) {
  using ojson = nlohmann::ordered_json;
  ojson messages = ojson::array();
  messages.push_back(ojson{{"role", "system"}, {"content", c.system}});
  for (size_t t = 0; t < num_answered_turns && t < c.turns.size(); ++t) {
    messages.push_back(ojson{{"role", "user"}, {"content", c.turns[t].user}});
    messages.push_back(ojson{{"role", "assistant"}, {"content", c.turns[t].assistant}});
  }
  if (next_user && num_answered_turns < c.turns.size()) {
    messages.push_back(ojson{{"role", "user"}, {"content", c.turns[num_answered_turns].user}});
  }
  return messages;
}

ConversationSource::ConversationSource(uint64_t seed, std::string stream, ConversationShape shape,
                                       TokenCounter counter)
    : seed_(seed), stream_(std::move(stream)), shape_(shape), counter_(std::move(counter)) {}

Result<std::shared_ptr<const Conversation>> ConversationSource::get(uint64_t index) {
  std::lock_guard lock(mutex_);
  if (auto it = made_.find(index); it != made_.end()) return it->second;
  // Called with mutex_ held (from make_conversation below).
  TokenCounter memo = [this](std::string_view piece) -> Result<int64_t> {
    if (auto it = piece_counts_.find(piece); it != piece_counts_.end()) return it->second;
    auto n = counter_(piece);
    if (n) piece_counts_.emplace(std::string(piece), *n);
    return n;
  };
  auto c = make_conversation(seed_, stream_, index, shape_, memo);
  if (!c) return std::unexpected(c.error());
  auto shared = std::make_shared<const Conversation>(std::move(*c));
  made_.emplace(index, shared);
  return shared;
}

double ConversationSource::mean_new_tokens_per_turn() const {
  return 0.5 * static_cast<double>(shape_.user_min_tokens + shape_.user_max_tokens +
                                   shape_.assistant_min_tokens + shape_.assistant_max_tokens);
}

}  // namespace strata::bench
