// The benchmark's conversations: a system prompt and scripted user/assistant turns of
// realistic lengths, generated deterministically from a seed (see text_generator.h), and
// the OpenAI `messages` arrays that replay them.
//
// Threads: ConversationSource is thread-safe (flood workers share one); a Conversation is
// an immutable value once made.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/text_generator.h"
#include "common/result.h"

namespace strata::bench {

// Lengths in tokens; every range is inclusive, min <= max, min >= 1.
struct ConversationShape {
  int64_t system_min_tokens = 300;
  int64_t system_max_tokens = 800;
  int64_t user_min_tokens = 30;
  int64_t user_max_tokens = 200;
  int64_t assistant_min_tokens = 50;
  int64_t assistant_max_tokens = 300;
  int32_t min_turns = 20;
  int32_t max_turns = 30;
};

Status validate(const ConversationShape& shape);

struct Turn {
  std::string user;
  std::string assistant;  // the scripted reply, as the client keeps it in the history
  int64_t user_tokens = 0;
  int64_t assistant_tokens = 0;
};

struct Conversation {
  std::string id;
  std::string system;
  int64_t system_tokens = 0;
  std::vector<Turn> turns;
};

// Makes conversation number `index` of `stream` under `seed`: the same arguments give the
// same bytes, whatever else was generated before.
Result<Conversation> make_conversation(uint64_t seed, const std::string& stream, uint64_t index,
                                       const ConversationShape& shape, const TokenCounter& counter);

// [system, user 0, assistant 0, ..., user n-1, assistant n-1] then, when `next_user`,
// user n: the request that asks for turn n's reply. n <= turns.size() (n < with next_user).
nlohmann::ordered_json chat_messages(const Conversation& c, size_t num_answered_turns,
                                     bool next_user);

// Conversations of one stream, made on demand and kept, shared by threads. The token
// counts of repeated pieces are cached across conversations (one counter call each).
class ConversationSource {
 public:
  ConversationSource(uint64_t seed, std::string stream, ConversationShape shape,
                     TokenCounter counter);
  // Conversation `index` (made on first use).
  Result<std::shared_ptr<const Conversation>> get(uint64_t index);
  const ConversationShape& shape() const { return shape_; }
  // Mean tokens one request of these conversations adds to the cache: the previous
  // scripted reply and the new user turn (the shape's midpoints).
  double mean_new_tokens_per_turn() const;

 private:
  const uint64_t seed_;
  const std::string stream_;
  const ConversationShape shape_;
  const TokenCounter counter_;
  std::mutex mutex_;
  std::map<std::string, int64_t, std::less<>> piece_counts_;      // GUARDED_BY(mutex_)
  std::map<uint64_t, std::shared_ptr<const Conversation>> made_;  // GUARDED_BY(mutex_)
};

}  // namespace strata::bench
