#include "model/make_tokenizer.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>

#include "common/utf8.h"
#include "model/model_files.h"

namespace strata {

namespace {

using nlohmann::json;

// The text the generated tokenizer's merges are learned from: plain English about
// everyday things, conversation, numbers and a little code, so that common words and
// chat phrases become single tokens.
constexpr const char* kCorpus = R"corpus(
The quick brown fox jumps over the lazy dog. The dog sleeps in the sun while the fox runs into the forest.
Once upon a time there was a small village by the sea. The people of the village were fishermen and farmers.
Every morning they went to work, and every evening they came back home to eat with their families.
The children played in the streets and the old men told stories about the great storms of the past.
One day a stranger arrived in the village. He said that he was looking for a place to stay for the winter.
The people welcomed him, and he lived with them until the spring came and the birds returned to the trees.
Hello! How are you today? I am fine, thank you. What would you like to talk about?
Can you help me with my homework? Of course, I would be happy to help. What is the question?
Please explain how a computer works. A computer reads instructions from memory and executes them one by one.
The processor has registers, caches and a clock. Memory is organised in pages, and programs are made of functions.
I think that the answer is correct, but let me check it again. Yes, the result is the same.
Could you write a short poem about the ocean? The ocean is wide and deep, its waves never sleep.
What is the capital of France? The capital of France is Paris. What is the largest planet? It is Jupiter.
The weather today is sunny with a few clouds. Tomorrow it will rain in the north and the south.
You are a helpful assistant. The user asks a question and the assistant answers it clearly and politely.
The system prompt describes the rules of the conversation. The model should follow the instructions.
Language models predict the next token from the previous tokens. A transformer has attention layers and
feed forward layers. The attention layer looks at every earlier token and the cache keeps their keys and values.
A serving engine schedules many requests at the same time. It reuses the cached prefix of a prompt, so that
a second request with the same system prompt starts faster. The cache is stored in pages of sixteen tokens.
When memory is full, the least recently used pages are evicted, unless they are pinned by the operator.
Numbers: one, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, twenty, thirty, hundred.
0 1 2 3 4 5 6 7 8 9 10 11 12 16 20 32 64 100 128 256 512 1000 1024 2048 4096 2024 2025 3.14 0.5 99%
Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and Sunday are the days of the week.
January, February, March, April, May, June, July, August, September, October, November, December.
The history of science is the story of people who asked questions and tested their ideas with experiments.
Water boils at one hundred degrees and freezes at zero. The earth moves around the sun once every year.
She opened the door and looked outside. It was dark, but she could see the lights of the city in the distance.
They walked along the river for a long time, talking about their plans for the future and the things they had seen.
He was not sure what to do next, so he decided to ask his friend for advice. His friend listened and smiled.
We should always try to understand the other point of view before we make a decision about something important.
def main():
    for i in range(10):
        print("hello world", i)
    return 0

int main(int argc, char** argv) {
  std::vector<int> values = {1, 2, 3};
  for (int value : values) {
    if (value > 1) return value;
  }
  return 0;
}

function add(a, b) { return a + b; }
const result = await fetch("https://example.com/api/v1/items?limit=10");
{"name": "get_weather", "arguments": {"city": "London", "unit": "celsius"}}
The function returns an error when the input is not valid. Check the status code and the message.
If the request fails, the client should retry after a short delay. Do not retry more than three times.
Thank you for your question. Here is a summary of the main points: first, second, third, and finally.
In conclusion, the results show that the new method is faster and uses less memory than the old one.
The report was written by a team of engineers who measured the performance of the system under load.
Good morning, everyone. Today we are going to learn about the structure of the human body and its organs.
The heart pumps blood through the body. The lungs take in air, and the brain controls everything we do.
It is important to eat healthy food, to drink enough water, and to get enough sleep every night.
The book on the table belongs to my sister. She reads a lot and she likes stories about travel and adventure.
Where are you going? I am going to the market to buy some bread, some cheese, some apples and a bottle of milk.
How much does it cost? It costs five dollars. That is not very expensive. I will take two of them, please.
The train leaves at nine o'clock and arrives in the city at noon. We have to hurry or we will miss it.
There are many different kinds of animals in the world: birds, fish, insects, mammals and reptiles.
Some of them live in the water, some live on land, and some can fly high above the mountains and the clouds.
What do you think about this idea? I think it is a good idea, but we need more time to think about the details.
Let's start with a simple example and then move on to the more difficult problems in the next section.
The first step is to read the data. The second step is to clean it. The third step is to train the model.
Don't worry, everything will be fine. You've done a great job, and we're all very proud of you. It's true.
I'm sorry, I can't answer that question. Is there anything else I can help you with? Yes, there is one more thing.
)corpus";

// GPT-2's byte-to-unicode table: printable bytes map to themselves, the others to
// code points from 256 on, so that every byte is a visible character.
std::array<std::string, 256> byte_symbols() {
  std::array<std::string, 256> out;
  std::array<bool, 256> direct{};
  for (int b = '!'; b <= '~'; ++b) direct[static_cast<size_t>(b)] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[static_cast<size_t>(b)] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[static_cast<size_t>(b)] = true;
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const int code_point = direct[static_cast<size_t>(b)] ? b : next++;
    utf8::append(out[static_cast<size_t>(b)], static_cast<char32_t>(code_point));
  }
  return out;
}

// Splits text like GPT-2's pre-tokenizer does for ASCII: contractions, an optional
// space followed by letters, digits or punctuation, and runs of whitespace.
std::vector<std::string> pre_tokenize(std::string_view text) {
  std::vector<std::string> words;
  size_t i = 0;
  auto is_letter = [](char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; };
  auto is_digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
  auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (i < text.size()) {
    const size_t start = i;
    if (text[i] == '\'' && i + 1 < text.size() && is_letter(text[i + 1])) {
      // 's 't 're 've 'm 'll 'd
      for (std::string_view c : {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"}) {
        if (text.substr(i, c.size()) == c) {
          words.emplace_back(c);
          i += c.size();
          break;
        }
      }
      if (i != start) continue;
    }
    size_t j = i;
    if (text[j] == ' ' && j + 1 < text.size() && !is_space(text[j + 1])) ++j;
    if (j < text.size() && is_letter(text[j])) {
      while (j < text.size() && is_letter(text[j])) ++j;
    } else if (j < text.size() && is_digit(text[j])) {
      while (j < text.size() && is_digit(text[j])) ++j;
    } else if (j < text.size() && !is_space(text[j])) {
      while (j < text.size() && !is_space(text[j]) && !is_letter(text[j]) && !is_digit(text[j]))
        ++j;
    } else {
      j = i;
      while (j < text.size() && is_space(text[j])) ++j;
      // Leave one space to prefix the next word, as GPT-2's \s+(?!\S) does.
      if (j < text.size() && j - i > 1 && text[j - 1] == ' ') --j;
    }
    words.emplace_back(text.substr(i, j - i));
    i = j;
  }
  return words;
}

json added_token(int32_t id, const std::string& content) {
  return json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
              {"rstrip", false}, {"normalized", false}, {"special", true}};
}

constexpr const char* kChatTemplate =
    "{{- bos_token }}\n"
    "{%- if tools %}\n"
    "{{- '<|im_start|>system\\n' }}\n"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif "
    "%}\n"
    "{{- 'You may call one or more functions. Function signatures are inside <tools></tools>:\\n"
    "<tools>' }}\n"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}\n"
    "{{- '\\n</tools>\\nFor each call, return a JSON object with the function name and arguments "
    "inside <tool_call></tool_call>.<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "{%- if not (tools and loop.first and message['role'] == 'system') %}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}\n"
    "{%- if message['content'] %}{{- message['content'] }}{%- endif %}\n"
    "{%- if message['tool_calls'] %}{%- for call in message['tool_calls'] %}\n"
    "{{- '<tool_call>\\n' }}{{- call['function'] | tojson }}{{- '\\n</tool_call>' }}\n"
    "{%- endfor %}{%- endif %}\n"
    "{{- '<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}\n";

// A special token's text in tokenizer_config.json: a string or {"content": ...}.
std::optional<std::string> token_text(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

GeneratedTokenizer make_byte_level_bpe_tokenizer(int64_t model_max_length) {
  const std::array<std::string, 256> bytes = byte_symbols();
  std::vector<std::string> symbols(bytes.begin(), bytes.end());
  std::map<std::string, int32_t> vocab;
  for (int32_t i = 0; i < 256; ++i) vocab.emplace(symbols[static_cast<size_t>(i)], i);

  // Unique words with counts, each as a sequence of symbol ids.
  std::map<std::string, int64_t> word_counts;
  for (const std::string& w : pre_tokenize(kCorpus)) ++word_counts[w];
  struct Word {
    std::vector<int32_t> ids;
    int64_t count;
  };
  std::vector<Word> words;
  for (const auto& [text, count] : word_counts) {
    Word w{{}, count};
    for (unsigned char c : text) w.ids.push_back(c);
    words.push_back(std::move(w));
  }

  std::vector<std::string> merges;
  while (static_cast<int32_t>(vocab.size()) < kGeneratedRegularTokens) {
    std::unordered_map<uint64_t, int64_t> pair_counts;
    for (const Word& w : words) {
      for (size_t i = 0; i + 1 < w.ids.size(); ++i) {
        const uint64_t key =
            (static_cast<uint64_t>(w.ids[i]) << 32) | static_cast<uint32_t>(w.ids[i + 1]);
        pair_counts[key] += w.count;
      }
    }
    if (pair_counts.empty()) break;
    uint64_t best = 0;
    int64_t best_count = -1;
    for (const auto& [key, count] : pair_counts) {
      if (count > best_count || (count == best_count && key < best)) {
        best = key;
        best_count = count;
      }
    }
    const int32_t left = static_cast<int32_t>(best >> 32);
    const int32_t right = static_cast<int32_t>(best & 0xffffffffu);
    const std::string merged =
        symbols[static_cast<size_t>(left)] + symbols[static_cast<size_t>(right)];
    int32_t merged_id;
    if (auto it = vocab.find(merged); it != vocab.end()) {
      merged_id = it->second;
    } else {
      merged_id = static_cast<int32_t>(symbols.size());
      symbols.push_back(merged);
      vocab.emplace(merged, merged_id);
    }
    merges.push_back(symbols[static_cast<size_t>(left)] + " " +
                     symbols[static_cast<size_t>(right)]);
    for (Word& w : words) {
      std::vector<int32_t> out;
      out.reserve(w.ids.size());
      for (size_t i = 0; i < w.ids.size(); ++i) {
        if (i + 1 < w.ids.size() && w.ids[i] == left && w.ids[i + 1] == right) {
          out.push_back(merged_id);
          ++i;
        } else {
          out.push_back(w.ids[i]);
        }
      }
      w.ids = std::move(out);
    }
  }

  const int32_t first_special = static_cast<int32_t>(symbols.size());
  const std::array<std::string, 4> specials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>",
                                               "<|begin_of_text|>"};
  json added = json::array();
  json added_decoder = json::object();
  for (size_t i = 0; i < specials.size(); ++i) {
    const int32_t id = first_special + static_cast<int32_t>(i);
    added.push_back(added_token(id, specials[i]));
    json entry = added.back();
    entry.erase("id");
    added_decoder[std::to_string(id)] = entry;
  }
  json vocab_json = json::object();
  for (const auto& [text, id] : vocab) vocab_json[text] = id;

  GeneratedTokenizer out;
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", true}};
  out.tokenizer = {{"version", "1.0"},
                   {"truncation", nullptr},
                   {"padding", nullptr},
                   {"added_tokens", added},
                   {"normalizer", nullptr},
                   {"pre_tokenizer", byte_level},
                   {"post_processor",
                    {{"type", "ByteLevel"},
                     {"add_prefix_space", false},
                     {"trim_offsets", false},
                     {"use_regex", true}}},
                   {"decoder", byte_level},
                   {"model",
                    {{"type", "BPE"},
                     {"dropout", nullptr},
                     {"unk_token", nullptr},
                     {"continuing_subword_prefix", nullptr},
                     {"end_of_word_suffix", nullptr},
                     {"fuse_unk", false},
                     {"byte_fallback", false},
                     {"ignore_merges", false},
                     {"vocab", vocab_json},
                     {"merges", merges}}}};
  out.tokenizer_config = {{"add_bos_token", false},
                          {"add_eos_token", false},
                          {"add_prefix_space", false},
                          {"added_tokens_decoder", added_decoder},
                          {"bos_token", "<|begin_of_text|>"},
                          {"eos_token", "<|im_end|>"},
                          {"pad_token", "<|endoftext|>"},
                          {"unk_token", nullptr},
                          {"clean_up_tokenization_spaces", false},
                          {"model_max_length", model_max_length},
                          {"tokenizer_class", "PreTrainedTokenizerFast"},
                          {"chat_template", kChatTemplate}};
  out.info.vocab_size = first_special + static_cast<int32_t>(specials.size());
  out.info.bos_id = first_special + 3;
  out.info.eos_ids = {first_special + 2, first_special};
  out.info.pad_id = first_special;
  return out;
}

Result<TokenizerInfo> inspect_tokenizer_dir(const std::filesystem::path& dir) {
  auto tokenizer = read_json_file(dir / "tokenizer.json");
  if (!tokenizer) return std::unexpected(tokenizer.error());
  const json& t = *tokenizer;
  std::map<std::string, int32_t> ids;  // token text -> id (vocabulary and added tokens)
  int64_t max_id = -1;
  if (t.contains("model") && t["model"].is_object() && t["model"].contains("vocab") &&
      t["model"]["vocab"].is_object()) {
    for (auto it = t["model"]["vocab"].begin(); it != t["model"]["vocab"].end(); ++it) {
      if (!it->is_number_integer()) continue;
      const int64_t id = it->get<int64_t>();
      max_id = std::max(max_id, id);
      ids[it.key()] = static_cast<int32_t>(id);
    }
  }
  if (t.contains("added_tokens") && t["added_tokens"].is_array()) {
    for (const json& a : t["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string()) {
        continue;
      }
      const int64_t id = a["id"].get<int64_t>();
      max_id = std::max(max_id, id);
      ids[a["content"].get<std::string>()] = static_cast<int32_t>(id);
    }
  }
  if (max_id < 0 || max_id >= (int64_t{1} << 24)) {
    return make_error(ErrorCode::kCorrupt,
                      (dir / "tokenizer.json").string() + " has no usable vocabulary");
  }
  TokenizerInfo info;
  info.vocab_size = static_cast<int32_t>(max_id + 1);
  json config = json::object();
  if (std::filesystem::exists(dir / "tokenizer_config.json")) {
    auto c = read_json_file(dir / "tokenizer_config.json");
    if (!c) return std::unexpected(c.error());
    config = std::move(*c);
  }
  auto lookup = [&](const std::optional<std::string>& text) -> std::optional<int32_t> {
    if (!text) return std::nullopt;
    auto it = ids.find(*text);
    if (it == ids.end()) return std::nullopt;
    return it->second;
  };
  info.bos_id = lookup(token_text(config, "bos_token"));
  info.pad_id = lookup(token_text(config, "pad_token"));
  if (auto eos = lookup(token_text(config, "eos_token"))) info.eos_ids.push_back(*eos);
  // End-of-turn markers of the common chat formats, so generation stops at them too.
  for (const char* marker :
       {"<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end_of_text|>", "</s>"}) {
    if (auto id = lookup(std::string(marker))) {
      if (std::find(info.eos_ids.begin(), info.eos_ids.end(), *id) == info.eos_ids.end()) {
        info.eos_ids.push_back(*id);
      }
    }
  }
  return info;
}

Status copy_tokenizer_files(const std::filesystem::path& from, const std::filesystem::path& to) {
  std::error_code ec;
  const std::set<std::string> extra = {"special_tokens_map.json", "vocab.json", "merges.txt",
                                       "added_tokens.json"};
  bool copied_json = false;
  for (const auto& entry : std::filesystem::directory_iterator(from, ec)) {
    if (!entry.is_regular_file()) continue;
    const std::string name = entry.path().filename().string();
    if (name.rfind("tokenizer", 0) != 0 && extra.count(name) == 0) continue;
    std::filesystem::copy_file(entry.path(), to / name,
                               std::filesystem::copy_options::overwrite_existing, ec);
    if (ec) {
      return make_error(ErrorCode::kIoError,
                        "cannot copy " + entry.path().string() + ": " + ec.message());
    }
    if (name == "tokenizer.json") copied_json = true;
  }
  if (ec)
    return make_error(ErrorCode::kIoError, "cannot read " + from.string() + ": " + ec.message());
  if (!copied_json) {
    return make_error(ErrorCode::kNotFound, "no tokenizer.json in " + from.string());
  }
  return {};
}

}  // namespace strata
