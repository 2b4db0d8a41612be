#include "text/tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "text/tokenizer/added_tokens.h"
#include "text/tokenizer/js_string.h"
#include "text/tokenizer/json_scanner.h"
#include "text/tokenizer/normalizer.h"
#include "text/tokenizer/pre_tokenizer.h"
#include "text/tokenizer/utf8.h"

namespace strata {
namespace {

using nlohmann::json;

// A TemplateProcessing "single" template: special token ids and the sequence.
struct TemplateItem {
  bool is_sequence = false;
  TokenId id = 0;  // special token
};
using Template = std::vector<TemplateItem>;

Result<std::string> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::kIoError, "cannot open " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return make_error(ErrorCode::kIoError, "cannot read " + path.string());
  return std::move(ss).str();
}

Result<json> parse_json(std::string_view text, std::string_view file) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return make_error(ErrorCode::kCorrupt, std::string(file) + " is not valid JSON");
  }
  if (!j.is_object()) {
    return make_error(ErrorCode::kCorrupt, std::string(file) + " must hold a JSON object");
  }
  return j;
}

// The reference's getToken: a string, or an {"__type": "AddedToken", "content"} object
// (objects with a "content" string are accepted too, as Python transformers does).
Result<std::optional<std::string>> config_token(const json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) {
    if (it->get_ref<const std::string&>().empty()) return std::optional<std::string>();
    return std::optional<std::string>(it->get<std::string>());
  }
  if (it->is_object()) {
    const auto content = it->find("content");
    if (content != it->end() && content->is_string()) {
      return std::optional<std::string>(content->get<std::string>());
    }
  }
  return make_error(ErrorCode::kCorrupt,
                    std::string("tokenizer_config.json: ") + key + " must be a string or token");
}

std::optional<bool> config_bool(const json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end() || !it->is_boolean()) return std::nullopt;
  return it->get<bool>();
}

void append_unique(std::vector<TokenId>& ids, TokenId id) {
  if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
}

// Reads "vocab": {"token": id, ...} into `tables`.
Status read_vocab(JsonScanner& scanner, BpeTables& tables) {
  if (auto st = scanner.expect('{'); !st) return st;
  tables.has_vocab = true;
  if (scanner.consume('}')) return {};
  std::string token;
  while (true) {
    if (auto st = scanner.read_string(token); !st) return st;
    if (auto st = scanner.expect(':'); !st) return st;
    auto id = scanner.read_integer();
    if (!id)
      return make_error(ErrorCode::kCorrupt, "vocab id of '" + token + "' is not an integer");
    if (*id < 0 || *id > INT32_MAX) {
      return make_error(ErrorCode::kCorrupt, "vocab id of '" + token + "' is out of range");
    }
    tables.vocab.emplace_back(token, static_cast<TokenId>(*id));
    if (scanner.consume(',')) continue;
    return scanner.expect('}');
  }
}

// Reads "merges": ["a b", ...] or [["a", "b"], ...] into `tables`.
Status read_merges(JsonScanner& scanner, BpeTables& tables) {
  if (auto st = scanner.expect('['); !st) return st;
  tables.has_merges = true;
  if (scanner.consume(']')) return {};
  std::string s;
  std::string right;
  while (true) {
    if (scanner.peek() == '"') {
      if (auto st = scanner.read_string(s); !st) return st;
      // "a b": the reference splits with x.split(" ", 2), keeping the first two parts.
      const size_t space = s.find(' ');
      if (space == std::string::npos) {
        return make_error(ErrorCode::kCorrupt, "merge '" + s + "' has no space");
      }
      const size_t second = s.find(' ', space + 1);
      tables.merges.emplace_back(s.substr(0, space), s.substr(space + 1, second == std::string::npos
                                                                             ? std::string::npos
                                                                             : second - space - 1));
    } else if (scanner.consume('[')) {
      if (auto st = scanner.read_string(s); !st) return st;
      if (auto st = scanner.expect(','); !st) return st;
      if (auto st = scanner.read_string(right); !st) return st;
      if (auto st = scanner.expect(']'); !st) return st;
      tables.merges.emplace_back(std::move(s), std::move(right));
    } else {
      return scanner.error("a merge must be \"a b\" or [\"a\", \"b\"]");
    }
    if (scanner.consume(',')) continue;
    return scanner.expect(']');
  }
}

// Copies the members of the object at the scanner into `out` (JSON text) except that the
// members `big` handles are consumed by it (it returns true when it took the member).
template <typename Big>
Status copy_object(JsonScanner& scanner, std::string& out, Big&& big) {
  if (auto st = scanner.expect('{'); !st) return st;
  out.push_back('{');
  if (scanner.consume('}')) {
    out.push_back('}');
    return {};
  }
  std::string key;
  bool first = true;
  while (true) {
    if (auto st = scanner.read_string(key); !st) return st;
    if (auto st = scanner.expect(':'); !st) return st;
    auto taken = big(key, scanner, out, first);
    if (!taken) return std::unexpected(taken.error());
    if (!*taken) {
      auto raw = scanner.skip_value();
      if (!raw) return std::unexpected(raw.error());
      if (!first) out.push_back(',');
      out.append(json(key).dump()).push_back(':');
      out.append(*raw);
      first = false;
    }
    if (scanner.consume(',')) continue;
    if (auto st = scanner.expect('}'); !st) return st;
    out.push_back('}');
    return {};
  }
}

// Parses tokenizer.json: the model's vocab and merges go to `tables` without a DOM, the
// rest becomes `out`.
Status parse_tokenizer_json(std::string_view text, json& out, BpeTables& tables) {
  if (!utf8::is_valid(text)) {
    return make_error(ErrorCode::kCorrupt, "tokenizer.json is not valid UTF-8");
  }
  JsonScanner scanner(text);
  if (scanner.peek() != '{') {
    return make_error(ErrorCode::kCorrupt, "tokenizer.json must hold a JSON object");
  }
  std::string rest;
  auto model_member = [&tables](const std::string& key, JsonScanner& sc, std::string& o,
                                bool& first) -> Result<bool> {
    if (key != "model" || sc.peek() != '{') return false;
    if (!first) o.push_back(',');
    o.append("\"model\":");
    first = false;
    auto st = copy_object(
        sc, o,
        [&tables](const std::string& k, JsonScanner& s, std::string&, bool&) -> Result<bool> {
          if (k == "vocab" && s.peek() == '{') {
            if (auto r = read_vocab(s, tables); !r) return std::unexpected(r.error());
            return true;
          }
          if (k == "merges" && s.peek() == '[') {
            if (auto r = read_merges(s, tables); !r) return std::unexpected(r.error());
            return true;
          }
          return false;
        });
    if (!st) return std::unexpected(st.error());
    return true;
  };
  if (auto st = copy_object(scanner, rest, model_member); !st) {
    return make_error(st.error().code, "tokenizer.json: " + st.error().message);
  }
  if (!scanner.at_end()) {
    return make_error(ErrorCode::kCorrupt, "tokenizer.json: trailing data after the object");
  }
  out = json::parse(rest, nullptr, /*allow_exceptions=*/false);
  if (out.is_discarded())
    return make_error(ErrorCode::kCorrupt, "tokenizer.json is not valid JSON");
  return {};
}

}  // namespace

struct Tokenizer::Impl {
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  DecodePipeline decode_pipeline;
  std::vector<AddedToken> added_tokens;
  std::unique_ptr<AddedTokenSplitter> splitter;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> added_by_content;
  StringIdMap token_to_id;          // tokenizer.json strings: vocab, then added tokens
  std::vector<Template> templates;  // TemplateProcessing post-processors, in order
  std::optional<TokenId> config_eos_id;
  bool clean_up_spaces = true;
  bool remove_space = false;
  bool llama_non_legacy = false;
  std::optional<TokenId> metaspace_id;
};

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::filesystem::path& dir) {
  const auto tokenizer_path = dir / "tokenizer.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(tokenizer_path, ec)) {
    return make_error(ErrorCode::kNotFound, tokenizer_path.string() + " does not exist");
  }
  auto tokenizer_json = read_file(tokenizer_path);
  if (!tokenizer_json) return std::unexpected(tokenizer_json.error());
  std::string config_text;
  std::string generation_text;
  for (auto [name, target] : {std::pair{"tokenizer_config.json", &config_text},
                              std::pair{"generation_config.json", &generation_text}}) {
    const auto path = dir / name;
    if (!std::filesystem::exists(path, ec)) continue;
    auto text = read_file(path);
    if (!text) return std::unexpected(text.error());
    *target = std::move(*text);
  }
  auto tokenizer = from_json_text(*tokenizer_json, config_text, generation_text);
  if (!tokenizer) {
    return make_error(tokenizer.error().code, dir.string() + ": " + tokenizer.error().message);
  }
  return tokenizer;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_json_text(
    std::string_view tokenizer_json, std::string_view tokenizer_config_json,
    std::string_view generation_config_json) {
  Result<json> tj = json();
  BpeTables tables;
  if (auto st = parse_tokenizer_json(tokenizer_json, *tj, tables); !st) {
    return std::unexpected(st.error());
  }
  json tc = json::object();
  if (!tokenizer_config_json.empty()) {
    auto parsed = parse_json(tokenizer_config_json, "tokenizer_config.json");
    if (!parsed) return std::unexpected(parsed.error());
    tc = std::move(*parsed);
  }
  json gc = json::object();
  if (!generation_config_json.empty()) {
    auto parsed = parse_json(generation_config_json, "generation_config.json");
    if (!parsed) return std::unexpected(parsed.error());
    gc = std::move(*parsed);
  }

  auto t = std::unique_ptr<Tokenizer>(new Tokenizer());
  Impl& impl = *t->impl_;
  const char* section = "tokenizer.json";
  try {
    // The reference picks a class from tokenizer_class; only LlamaTokenizer behaves
    // differently, and only with "legacy": false.
    std::string cls = tc.value("tokenizer_class", std::string());
    if (cls.ends_with("Fast")) cls.resize(cls.size() - 4);
    impl.llama_non_legacy = cls == "LlamaTokenizer" && config_bool(tc, "legacy") == false;

    section = "tokenizer.json normalizer";
    if (!impl.llama_non_legacy) {
      auto normalizer = Normalizer::from_json(tj->value("normalizer", json()));
      if (!normalizer) return std::unexpected(normalizer.error());
      impl.normalizer = std::move(*normalizer);
    }
    section = "tokenizer.json pre_tokenizer";
    if (impl.llama_non_legacy) {
      impl.pre_tokenizer = PreTokenizer::llama_non_legacy();
    } else {
      auto pre = PreTokenizer::from_json(tj->value("pre_tokenizer", json()));
      if (!pre) return std::unexpected(pre.error());
      impl.pre_tokenizer = std::move(*pre);
    }
    section = "tokenizer.json model";
    if (!tj->contains("model"))
      return make_error(ErrorCode::kCorrupt, "tokenizer.json has no model");
    auto model =
        BpeModel::from_json(tj->at("model"), std::move(tables), impl.pre_tokenizer.byte_level());
    if (!model) return std::unexpected(model.error());
    impl.model = std::move(*model);

    TokenId max_id = -1;
    impl.token_to_id.reserve(impl.model->vocab_entries().size() + 1024);
    for (const auto& [token, id] : impl.model->vocab_entries()) {
      impl.token_to_id[token] = id;
      max_id = std::max(max_id, id);
    }

    section = "tokenizer.json added_tokens";
    if (const auto it = tj->find("added_tokens"); it != tj->end() && !it->is_null()) {
      for (const auto& entry : *it) {
        AddedToken token;
        token.content = entry.at("content").get<std::string>();
        const auto id = entry.at("id").get<int64_t>();
        if (id < 0 || id > INT32_MAX) {
          return make_error(ErrorCode::kCorrupt,
                            "added token '" + token.content + "' has a bad id");
        }
        token.id = static_cast<TokenId>(id);
        token.single_word = entry.value("single_word", false);
        token.lstrip = entry.value("lstrip", false);
        token.rstrip = entry.value("rstrip", false);
        token.normalized = entry.value("normalized", false);
        token.special = entry.value("special", false);
        impl.model->add_token(token.content, token.id);
        impl.token_to_id[token.content] = token.id;
        impl.added_by_content[token.content] = static_cast<int32_t>(impl.added_tokens.size());
        max_id = std::max(max_id, token.id);
        impl.added_tokens.push_back(std::move(token));
      }
    }
    impl.splitter = std::make_unique<AddedTokenSplitter>(impl.added_tokens);

    section = "tokenizer.json decoder";
    auto pipeline = DecodePipeline::from_json(tj->value("decoder", json()));
    if (!pipeline) return std::unexpected(pipeline.error());
    impl.decode_pipeline = std::move(*pipeline);

    section = "tokenizer.json post_processor";
    const json post = tj->value("post_processor", json());
    std::vector<const json*> processors;
    if (post.is_object() && post.value("type", std::string()) == "Sequence") {
      for (const auto& p : post.at("processors")) processors.push_back(&p);
    } else if (!post.is_null()) {
      processors.push_back(&post);
    }
    for (const json* p : processors) {
      const std::string type = p->value("type", std::string());
      if (type == "ByteLevel") continue;  // the reference passes tokens through
      if (type != "TemplateProcessing") {
        return make_error(ErrorCode::kUnsupported,
                          "post_processor type '" + type + "' is not supported");
      }
      Template tmpl;
      for (const auto& item : p->at("single")) {
        if (item.contains("SpecialToken")) {
          const std::string name = item.at("SpecialToken").at("id").get<std::string>();
          const auto found = impl.token_to_id.find(name);
          if (found == impl.token_to_id.end()) {
            return make_error(ErrorCode::kCorrupt,
                              "post_processor special token '" + name + "' is not in the vocab");
          }
          tmpl.push_back(TemplateItem{false, found->second});
        } else if (item.contains("Sequence")) {
          // A single text only uses sequence A; a B item has no tokens then.
          if (item.at("Sequence").at("id").get<std::string>() == "A") {
            tmpl.push_back(TemplateItem{true, 0});
          }
        }
      }
      impl.templates.push_back(std::move(tmpl));
    }

    section = "tokenizer_config.json";
    SpecialTokenStrings& s = t->special_strings_;
    for (auto [key, target] :
         {std::pair{"bos_token", &s.bos_token}, std::pair{"eos_token", &s.eos_token},
          std::pair{"unk_token", &s.unk_token}, std::pair{"sep_token", &s.sep_token},
          std::pair{"pad_token", &s.pad_token}, std::pair{"cls_token", &s.cls_token},
          std::pair{"mask_token", &s.mask_token}}) {
      auto value = config_token(tc, key);
      if (!value) return std::unexpected(value.error());
      *target = std::move(*value);
    }
    if (const auto it = tc.find("additional_special_tokens"); it != tc.end() && it->is_array()) {
      for (const auto& v : *it) {
        // The reference compares these with token strings, so only strings count.
        if (v.is_string()) s.additional_special_tokens.push_back(v.get<std::string>());
      }
    }
    t->add_bos_token_ = config_bool(tc, "add_bos_token");
    t->add_eos_token_ = config_bool(tc, "add_eos_token");
    impl.clean_up_spaces = config_bool(tc, "clean_up_tokenization_spaces").value_or(true);
    impl.remove_space = config_bool(tc, "remove_space").value_or(false);
    if (config_bool(tc, "do_lowercase_and_remove_accent").value_or(false)) {
      return make_error(ErrorCode::kUnsupported, "do_lowercase_and_remove_accent is not supported");
    }
    if (const auto it = tc.find("chat_template"); it != tc.end() && !it->is_null()) {
      if (it->is_string()) {
        t->chat_templates_.emplace_back("default", it->get<std::string>());
      } else if (it->is_array()) {
        t->chat_template_is_list_ = true;
        for (const auto& entry : *it) {
          if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
              !entry.at("name").is_string() || !entry.at("template").is_string()) {
            return make_error(ErrorCode::kCorrupt,
                              "chat_template list entries need string name and template");
          }
          t->chat_templates_.emplace_back(entry.at("name").get<std::string>(),
                                          entry.at("template").get<std::string>());
        }
      } else {
        return make_error(ErrorCode::kCorrupt, "chat_template must be a string or a list");
      }
    }

    // Decoder vocabulary: the model's strings, overwritten by added tokens.
    DecoderVocab& vocab = t->decoder_vocab_;
    const size_t size = static_cast<size_t>(max_id + 1);
    vocab.tokens.assign(size, std::string());
    vocab.flags.assign(size, 0);
    for (const auto& [token, id] : impl.model->vocab_entries()) {
      vocab.tokens[static_cast<size_t>(id)] = token;
      vocab.flags[static_cast<size_t>(id)] = DecoderVocab::kAssigned;
    }
    std::unordered_map<std::string, bool, StringHash, std::equal_to<>> special_strings;
    for (const AddedToken& token : impl.added_tokens) {
      vocab.tokens[static_cast<size_t>(token.id)] = token.content;
      vocab.flags[static_cast<size_t>(token.id)] = DecoderVocab::kAssigned;
      vocab.added_contents.insert(token.content);
      if (token.special) special_strings[token.content] = true;
    }
    for (const std::string& extra : s.additional_special_tokens) special_strings[extra] = true;
    for (size_t id = 0; id < size; ++id) {
      if ((vocab.flags[id] & DecoderVocab::kAssigned) != 0 &&
          special_strings.contains(vocab.tokens[id])) {
        vocab.flags[id] |= DecoderVocab::kSkippable;
      }
    }

    // Ids the server needs.
    auto id_of = [&impl](const std::optional<std::string>& token) -> std::optional<TokenId> {
      if (!token) return std::nullopt;
      const auto it = impl.token_to_id.find(*token);
      return it == impl.token_to_id.end() ? std::nullopt : std::optional<TokenId>(it->second);
    };
    t->bos_id_ = id_of(s.bos_token);
    impl.config_eos_id = id_of(s.eos_token);
    if (impl.config_eos_id) append_unique(t->eos_ids_, *impl.config_eos_id);
    t->pad_id_ = id_of(s.pad_token ? s.pad_token : s.eos_token);
    impl.metaspace_id = id_of(std::string(kMetaspaceChar));

    section = "generation_config.json";
    auto valid_id = [size](int64_t id) { return id >= 0 && static_cast<size_t>(id) < size; };
    if (const auto it = gc.find("eos_token_id"); it != gc.end() && !it->is_null()) {
      const json list = it->is_array() ? *it : json::array({*it});
      for (const auto& v : list) {
        if (!v.is_number_integer() || !valid_id(v.get<int64_t>())) {
          return make_error(ErrorCode::kCorrupt,
                            "generation_config.json: eos_token_id holds a bad id: " + v.dump());
        }
        append_unique(t->eos_ids_, static_cast<TokenId>(v.get<int64_t>()));
      }
    }
    if (const auto it = gc.find("bos_token_id");
        !t->bos_id_ && it != gc.end() && it->is_number_integer() && valid_id(it->get<int64_t>())) {
      t->bos_id_ = static_cast<TokenId>(it->get<int64_t>());
    }
  } catch (const json::exception& e) {
    return make_error(ErrorCode::kCorrupt, std::string(section) + ": " + e.what());
  }
  return t;
}

Status Tokenizer::encode_text(std::string_view text, size_t max_tokens,
                              std::vector<TokenId>& out) const {
  const Impl& impl = *impl_;
  auto too_many = [max_tokens] {
    return make_error(ErrorCode::kResourceExhausted,
                      "the text has more than " + std::to_string(max_tokens) + " tokens");
  };
  std::vector<AddedTokenSplitter::Section> sections;
  impl.splitter->split(text, sections);
  // lstrip / rstrip: trim JS whitespace next to the token (the neighbour may be a token).
  for (size_t i = 0; i < sections.size(); ++i) {
    if (sections[i].token < 0) continue;
    const AddedToken& token = impl.added_tokens[static_cast<size_t>(sections[i].token)];
    if (token.lstrip && i > 0) sections[i - 1].text = js::trim_end(sections[i - 1].text);
    if (token.rstrip && i + 1 < sections.size()) {
      sections[i + 1].text = js::trim_start(sections[i + 1].text);
    }
  }
  std::string collapsed;
  std::string normalized;
  for (size_t i = 0; i < sections.size(); ++i) {
    if (max_tokens > 0 && out.size() > max_tokens) return too_many();
    std::string_view x = sections[i].text;
    if (x.empty()) continue;
    if (sections[i].token >= 0) {
      // A token section that trimming changed is whatever its new text is.
      const auto& content = impl.added_tokens[static_cast<size_t>(sections[i].token)].content;
      if (x == content || impl.added_by_content.contains(x)) {
        out.push_back(impl.token_to_id.find(x)->second);
        continue;
      }
    }
    if (impl.remove_space) {
      // x.trim().split(/\s+/).join(" ")
      collapsed.clear();
      std::string_view rest = js::trim(x);
      bool in_space = false;
      for (size_t pos = 0; pos < rest.size();) {
        const size_t at = pos;
        const char32_t cp = utf8::decode_valid(rest, pos);
        if (js::is_whitespace(cp)) {
          in_space = true;
          continue;
        }
        if (in_space) collapsed.push_back(' ');
        in_space = false;
        collapsed.append(rest, at, pos - at);
      }
      x = collapsed;
    }
    if (!impl.normalizer.is_identity()) {
      if (auto st = impl.normalizer.normalize(x, normalized); !st) return st;
      x = normalized;
    }
    if (x.empty()) continue;
    const size_t section_start = out.size();
    const BpeModel& model = *impl.model;
    // Each piece goes to BPE as the pre-tokenizer finds it; with a limit, a piece whose
    // ids certainly overflow it stops the encoding before BPE runs on it.
    struct Sink {
      const BpeModel& model;
      std::vector<TokenId>& out;
      size_t max_tokens;
      size_t oversized_piece = 0;  // bytes of a piece BPE cannot index, 0: none
    } sink{model, out, max_tokens};
    auto finished =
        impl.pre_tokenizer.pre_tokenize(x, static_cast<int>(i), [&sink](std::string_view piece) {
          if (piece.size() > BpeModel::kMaxPieceBytes) {
            sink.oversized_piece = piece.size();
            return false;
          }
          if (sink.max_tokens > 0 &&
              sink.out.size() + sink.model.min_ids(piece) > sink.max_tokens) {
            return false;
          }
          sink.model.encode_word(piece, sink.out);
          return true;
        });
    if (!finished) return std::unexpected(finished.error());
    if (sink.oversized_piece > 0) {
      return make_error(ErrorCode::kInvalidArgument,
                        "a word of " + std::to_string(sink.oversized_piece) +
                            " bytes is longer than the tokenizer supports");
    }
    if (!*finished) return too_many();
    model.fuse_unknowns(out, section_start);
  }
  if (max_tokens > 0 && out.size() > max_tokens) return too_many();
  return {};
}

void Tokenizer::post_process(std::vector<TokenId>& ids, bool add_special_tokens) const {
  const Impl& impl = *impl_;
  if (!add_special_tokens) return;
  if (!impl.templates.empty()) {
    for (const Template& tmpl : impl.templates) {
      std::vector<TokenId> processed;
      processed.reserve(ids.size() + tmpl.size());
      for (const TemplateItem& item : tmpl) {
        if (item.is_sequence) {
          processed.insert(processed.end(), ids.begin(), ids.end());
        } else {
          processed.push_back(item.id);
        }
      }
      ids.swap(processed);
    }
    return;
  }
  // No TemplateProcessing: tokenizer_config.json's flags (as Python transformers' Llama
  // tokenizers build their template from them).
  if (add_bos_token_.value_or(false) && bos_id_) ids.insert(ids.begin(), *bos_id_);
  if (add_eos_token_.value_or(false) && impl.config_eos_id) ids.push_back(*impl.config_eos_id);
}

Result<std::vector<TokenId>> Tokenizer::encode(std::string_view text, EncodeOptions options) const {
  std::string sanitized;
  if (!utf8::is_valid(text)) {
    sanitized = utf8::sanitize(text);
    text = sanitized;
  }
  std::vector<TokenId> ids;
  size_t expected_ids = text.size() / 3 + 4;
  if (options.max_tokens > 0) expected_ids = std::min(expected_ids, options.max_tokens + 8);
  ids.reserve(expected_ids);
  if (impl_->llama_non_legacy) {
    // The reference's LlamaTokenizer._encode_text with legacy == false.
    if (!text.empty()) {
      std::string prefixed(kMetaspaceChar);
      size_t prev = 0;
      while (true) {
        const size_t hit = text.find(kMetaspaceChar, prev);
        if (hit == std::string_view::npos) break;
        prefixed.append(text.substr(prev, hit - prev)).push_back(' ');
        prev = hit + kMetaspaceChar.size();
      }
      prefixed.append(text.substr(prev));
      if (auto st = encode_text(prefixed, options.max_tokens, ids); !st) {
        return std::unexpected(st.error());
      }
      if (ids.size() > 1 && ids[0] == impl_->metaspace_id && is_special(ids[1])) {
        ids.erase(ids.begin());
      }
    }
  } else if (auto st = encode_text(text, options.max_tokens, ids); !st) {
    return std::unexpected(st.error());
  }
  post_process(ids, options.add_special_tokens);
  if (options.max_tokens > 0 && ids.size() > options.max_tokens) {
    return make_error(ErrorCode::kResourceExhausted,
                      "the text has more than " + std::to_string(options.max_tokens) + " tokens");
  }
  return ids;
}

StreamDecoder Tokenizer::stream_decoder(DecodeOptions options) const {
  return StreamDecoder(impl_->decode_pipeline, decoder_vocab_, options.skip_special_tokens,
                       options.clean_up_tokenization_spaces.value_or(impl_->clean_up_spaces));
}

Result<std::string> Tokenizer::decode(std::span<const TokenId> ids, DecodeOptions options) const {
  for (const TokenId id : ids) {
    if (!id_to_token(id)) {
      return make_error(ErrorCode::kInvalidArgument,
                        "token id " + std::to_string(id) + " is not in the vocabulary");
    }
  }
  StreamDecoder decoder = stream_decoder(options);
  std::string out;
  for (const TokenId id : ids) {
    if (auto st = decoder.push(id, out); !st) return std::unexpected(st.error());
  }
  decoder.finish(out);
  return out;
}

void Tokenizer::clear_cache() const {
  impl_->model->clear_cache();
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  const auto it = impl_->token_to_id.find(token);
  if (it == impl_->token_to_id.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string_view> Tokenizer::id_to_token(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= decoder_vocab_.tokens.size() ||
      (decoder_vocab_.flags[static_cast<size_t>(id)] & DecoderVocab::kAssigned) == 0) {
    return std::nullopt;
  }
  return decoder_vocab_.tokens[static_cast<size_t>(id)];
}

bool Tokenizer::is_special(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < decoder_vocab_.flags.size() &&
         (decoder_vocab_.flags[static_cast<size_t>(id)] & DecoderVocab::kSkippable) != 0;
}

std::optional<std::string_view> Tokenizer::chat_template(bool with_tools) const {
  if (chat_templates_.empty()) return std::nullopt;
  if (!chat_template_is_list_) return chat_templates_.front().second;
  // With repeated names the last one counts, as in the reference's dict.
  auto named = [this](std::string_view name) -> std::optional<std::string_view> {
    std::optional<std::string_view> found;
    for (const auto& [n, tmpl] : chat_templates_) {
      if (n == name) found = tmpl;
    }
    return found;
  };
  if (with_tools) {
    if (auto tool_use = named("tool_use")) return tool_use;
  }
  return named("default");
}

}  // namespace strata
