#include "bench/text_generator.h"

#include <algorithm>
#include <cctype>

namespace strata::bench {

uint64_t BenchRng::next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

int64_t BenchRng::uniform_int(int64_t lo, int64_t hi) {
  if (hi <= lo) return lo;
  const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  // The modulo bias is below 2^-40 for the spans used here (token counts, list sizes).
  return lo + static_cast<int64_t>(next() % span);
}

double BenchRng::uniform01() {
  return static_cast<double>(next() >> 11) * 0x1.0p-53;
}

uint64_t derive_seed(uint64_t seed, std::string_view stream, uint64_t index) {
  // FNV-1a over the stream name, mixed with the seed and index through SplitMix64.
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : stream) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  BenchRng mix(seed ^ h ^ (index * 0xd6e8feb86659fd93ull));
  mix.next();
  return mix.next();
}

const std::vector<std::string_view>& bench_words() {
  static const std::vector<std::string_view> words = {
      "the",       "of",         "and",        "to",          "in",         "is",
      "that",      "for",        "it",         "as",          "with",       "was",
      "on",        "be",         "at",         "by",          "this",       "had",
      "not",       "are",        "but",        "from",        "or",         "have",
      "an",        "they",       "which",      "one",         "you",        "were",
      "her",       "all",        "she",        "there",       "would",      "their",
      "we",        "him",        "been",       "has",         "when",       "who",
      "will",      "more",       "no",         "if",          "out",        "so",
      "said",      "what",       "up",         "its",         "about",      "into",
      "than",      "them",       "can",        "only",        "other",      "new",
      "some",      "could",      "time",       "these",       "two",        "may",
      "then",      "do",         "first",      "any",         "my",         "now",
      "such",      "like",       "our",        "over",        "man",        "me",
      "even",      "most",       "made",       "after",       "also",       "did",
      "many",      "before",     "must",       "through",     "back",       "years",
      "where",     "much",       "your",       "way",         "well",       "down",
      "should",    "because",    "each",       "just",        "those",      "people",
      "how",       "too",        "little",     "state",       "good",       "very",
      "make",      "world",      "still",      "own",         "see",        "men",
      "work",      "long",       "get",        "here",        "between",    "both",
      "life",      "being",      "under",      "never",       "day",        "same",
      "another",   "know",       "while",      "last",        "might",      "us",
      "great",     "old",        "year",       "off",         "come",       "since",
      "against",   "go",         "came",       "right",       "used",       "take",
      "three",     "himself",    "few",        "house",       "use",        "during",
      "without",   "again",      "place",      "around",      "however",    "home",
      "small",     "found",      "thought",    "went",        "say",        "part",
      "once",      "general",    "high",       "upon",        "school",     "every",
      "does",      "got",        "united",     "left",        "number",     "course",
      "war",       "until",      "always",     "away",        "something",  "fact",
      "though",    "water",      "less",       "public",      "put",        "think",
      "almost",    "hand",       "enough",     "far",         "took",       "head",
      "yet",       "government", "system",     "better",      "set",        "told",
      "nothing",   "night",      "end",        "why",         "called",     "didn't",
      "eyes",      "find",       "going",      "look",        "asked",      "later",
      "knew",      "point",      "next",       "program",     "city",       "business",
      "give",      "group",      "toward",     "young",       "days",       "let",
      "room",      "president",  "side",       "social",      "given",      "present",
      "several",   "order",      "national",   "possible",    "rather",     "second",
      "face",      "per",        "among",      "form",        "important",  "often",
      "things",    "looked",     "early",      "white",       "case",       "john",
      "become",    "large",      "big",        "need",        "four",       "within",
      "felt",      "along",      "children",   "saw",         "best",       "church",
      "ever",      "least",      "power",      "development", "light",      "thing",
      "seemed",    "family",     "interest",   "want",        "members",    "mind",
      "country",   "area",       "others",     "done",        "turned",     "although",
      "open",      "god",        "service",    "certain",     "kind",       "problem",
      "began",     "different",  "door",       "thus",        "help",       "sense",
      "means",     "whole",      "matter",     "perhaps",     "itself",     "york",
      "times",     "law",        "human",      "line",        "above",      "name",
      "example",   "action",     "company",    "hands",       "local",      "show",
      "whether",   "five",       "history",    "gave",        "today",      "either",
      "act",       "feet",       "across",     "taken",       "past",       "quite",
      "anything",  "seen",       "having",     "death",       "experience", "body",
      "word",      "half",       "really",     "field",       "week",       "car",
      "words",     "already",    "themselves", "information", "tell",       "together",
      "college",   "shall",      "money",      "period",      "held",       "keep",
      "sure",      "free",       "seems",      "political",   "real",       "behind",
      "miss",      "question",   "air",        "office",      "making",     "brought",
      "whose",     "special",    "major",      "heard",       "problems",   "federal",
      "became",    "study",      "ago",        "moment",      "available",  "known",
      "result",    "street",     "economic",   "boy",         "position",   "reason",
      "change",    "south",      "board",      "individual",  "job",        "areas",
      "society",   "west",       "close",      "turn",        "love",       "community",
      "true",      "court",      "force",      "full",        "seem",       "am",
      "wife",      "age",        "future",     "voice",       "center",     "woman",
      "control",   "common",     "policy",     "necessary",   "following",  "front",
      "sometimes", "six",        "girl",       "clear",       "further",    "land",
      "run",       "students",   "provide",    "feel",        "party",      "able",
      "mother",    "music",      "education",  "university",  "child",      "effect",
      "level",     "stood",      "military",   "town",        "short",      "morning",
      "total",     "outside",    "rate",       "figure",      "class",      "art",
      "century",   "washington", "north",      "usually",     "leave",      "therefore",
      "evidence",  "million",    "sound",      "top",         "black",      "strong",
      "hard",      "various",    "says",       "believe",     "type",       "value",
      "play",      "surface",    "soon",       "mean",        "near",       "lines",
      "table",     "peace",      "modern",     "tax",         "road",       "red",
      "book",      "personal",   "process",    "situation",   "minutes",    "increase",
      "schools",   "idea",       "english",    "alone",       "women",      "gone",
      "nor",       "fire",       "cost",       "river",       "garden",     "signal",
      "engine",    "harbor",     "lantern",    "meadow",      "orchard",    "pattern",
      "quarter",   "record",     "season",     "shadow",      "silver",     "stone",
      "summer",    "theory",     "thunder",    "valley",      "village",    "winter",
      "wonder",    "yellow",     "bridge",     "cabinet",     "canvas",     "circle",
      "cluster",   "compass",    "corner",     "cotton",      "crystal",    "current",
      "desert",    "detail",     "engineer",   "factory",     "feather",    "forest",
      "fortune",   "gather",     "glacier",    "harvest",     "horizon",    "island",
      "journey",   "kitchen",    "ladder",     "library",     "machine",    "marble",
      "measure",   "memory",     "mirror",     "mountain",    "network",    "notice",
      "ocean",     "package",    "painter",    "planet",      "pocket",     "question",
      "rabbit",    "rhythm",     "saddle",     "sailor",      "scatter",    "segment",
      "shelter",   "sketch",     "spiral",     "station",     "storage",    "stream",
      "symbol",    "teacher",    "thread",     "timber",      "tunnel",     "update",
      "vector",    "velvet",     "weather",    "whisper",     "window",     "balance",
      "careful",   "cheerful",   "distant",    "eager",       "fragile",    "gentle",
      "hollow",    "narrow",     "patient",    "quiet",       "rapid",      "steady",
      "tender",    "vivid",      "wooden",     "explain",     "measure",    "notice",
      "observe",   "prepare",    "recall",     "request",     "respond",    "review",
      "select",    "suggest",    "support",    "travel",      "verify",     "wander",
      "collect",   "compare",    "deliver",    "describe"};
  return words;
}

namespace {

std::string capitalized(std::string_view w) {
  std::string s(w);
  if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  return s;
}

}  // namespace

TextGenerator::TextGenerator(uint64_t seed, TokenCounter counter)
    : rng_(seed), counter_(std::move(counter)) {}

Result<int64_t> TextGenerator::piece_tokens(const std::string& piece) {
  if (auto it = piece_tokens_.find(piece); it != piece_tokens_.end()) return it->second;
  auto n = counter_(piece);
  if (!n) return std::unexpected(n.error());
  piece_tokens_.emplace(piece, *n);
  return *n;
}

std::string TextGenerator::next_word(bool capitalize) {
  const auto& words = bench_words();
  const std::string_view w =
      words[static_cast<size_t>(rng_.uniform_int(0, static_cast<int64_t>(words.size()) - 1))];
  return capitalize ? capitalized(w) : std::string(w);
}

Result<GeneratedText> TextGenerator::text(int64_t tokens) {
  GeneratedText out;
  tokens = std::max<int64_t>(tokens, 1);
  int64_t sentence_left = 0;   // words left in the current sentence
  int64_t paragraph_left = 0;  // sentences left in the current paragraph
  bool line_start = true;      // no space before the next word
  // Appends `piece` if it fits the budget; a piece that does not fit is skipped.
  auto append = [&](const std::string& piece) -> Result<bool> {
    auto n = piece_tokens(piece);
    if (!n) return std::unexpected(n.error());
    if (out.tokens + *n > tokens) return false;
    out.text += piece;
    out.tokens += *n;
    return true;
  };
  int misses = 0;  // consecutive words that did not fit: the budget is (nearly) spent
  while (out.tokens < tokens && misses < 32) {
    if (paragraph_left == 0) paragraph_left = rng_.uniform_int(3, 6);
    const bool sentence_start = sentence_left == 0;
    if (sentence_start) sentence_left = rng_.uniform_int(6, 18);
    std::string word = next_word(sentence_start);
    if (rng_.uniform01() < 0.03) word = std::to_string(rng_.uniform_int(2, 2048));
    auto added = append(line_start ? word : " " + word);
    if (!added) return std::unexpected(added.error());
    if (!*added) {
      ++misses;
      if (sentence_start) sentence_left = 0;
      continue;
    }
    misses = 0;
    line_start = false;
    if (--sentence_left > 0) {
      if (rng_.uniform01() < 0.08) {
        if (auto r = append(","); !r) return std::unexpected(r.error());
      }
      continue;
    }
    const bool paragraph_end = --paragraph_left == 0;
    const std::string stop = rng_.uniform01() < 0.1 ? "?" : ".";
    auto ended = append(paragraph_end ? stop + "\n\n" : stop);
    if (!ended) return std::unexpected(ended.error());
    if (*ended && paragraph_end) line_start = true;
  }
  return out;
}

Result<GeneratedText> TextGenerator::text_in_range(int64_t min_tokens, int64_t max_tokens) {
  const int64_t lo = std::max<int64_t>(1, std::min(min_tokens, max_tokens));
  const int64_t hi = std::max(lo, max_tokens);
  return text(rng_.uniform_int(lo, hi));
}

}  // namespace strata::bench
