#include "model/gguf_tokenizer.h"

#include <nlohmann/json.hpp>

#include "model/model_files.h"

namespace strata {

namespace {

using nlohmann::json;

// Hugging Face's Split regexes of the pre-tokenizers GGUF names.
constexpr const char* kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

constexpr int kTypeControl = 3;
constexpr int kTypeUserDefined = 4;
constexpr int kTypeUnused = 5;

json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", false},
          {"trim_offsets", false},
          {"use_regex", use_regex}};
}

json split_then_bytes(const char* regex) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern", {{"Regex", regex}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            byte_level(false)}}};
}

Error unsupported(const GgufFile& f, const std::string& what) {
  std::string m = f.description();
  m.append(": ").append(what).append(
      "; give a Hugging Face tokenizer folder beside the file (strata serve --tokenizer DIR)");
  return Error{ErrorCode::kUnsupported, std::move(m)};
}

}  // namespace

Result<HfTokenizerTexts> gguf_tokenizer_json(const GgufFile& f) {
  auto model = f.get_string("tokenizer.ggml.model");
  if (!model) return std::unexpected(model.error());
  if (*model != "gpt2") {
    return std::unexpected(unsupported(
        f, "tokenizer.ggml.model '" + *model + "' is not supported (" +
               (*model == "llama" ? std::string("a SentencePiece vocabulary; ") : std::string()) +
               "Strata reads the byte-level BPE 'gpt2' family)"));
  }
  std::string pre = "default";
  if (auto p = f.get_string("tokenizer.ggml.pre"); p) pre = *p;
  json normalizer = nullptr;
  json pre_tokenizer;
  if (pre == "default" || pre == "gpt2") {
    pre_tokenizer = byte_level(true);
  } else if (pre == "qwen2") {
    normalizer = {{"type", "NFC"}};
    pre_tokenizer = split_then_bytes(kQwen2Regex);
  } else if (pre == "llama3" || pre == "llama-bpe") {
    pre_tokenizer = split_then_bytes(kLlama3Regex);
  } else {
    return std::unexpected(
        unsupported(f, "pre-tokenizer '" + pre +
                           "' (tokenizer.ggml.pre) is not supported (gpt2, default, "
                           "qwen2, llama3, llama-bpe)"));
  }
  const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
  if (tokens == nullptr || tokens->strings.empty()) {
    return make_error(ErrorCode::kNotFound, f.description() + ": no tokenizer.ggml.tokens");
  }
  const GgufValue* types = f.find("tokenizer.ggml.token_type");
  const GgufValue* merges = f.find("tokenizer.ggml.merges");
  json vocab = json::object();
  json added = json::array();
  json added_decoder = json::object();
  for (size_t id = 0; id < tokens->strings.size(); ++id) {
    const int64_t type = types != nullptr && id < types->integers.size() ? types->integers[id] : 1;
    const std::string& text = tokens->strings[id];
    if (type == kTypeControl || type == kTypeUserDefined) {
      json entry = {{"id", id},
                    {"content", text},
                    {"single_word", false},
                    {"lstrip", false},
                    {"rstrip", false},
                    {"normalized", false},
                    {"special", type == kTypeControl}};
      added.push_back(entry);
      entry.erase("id");
      added_decoder[std::to_string(id)] = entry;
    } else if (!vocab.contains(text)) {
      vocab[text] = id;
    }
  }
  json merge_list = json::array();
  if (merges != nullptr) {
    for (const std::string& m : merges->strings) {
      const size_t space = m.find(' ');
      if (space == std::string::npos) {
        return make_error(ErrorCode::kCorrupt, f.description() + ": tokenizer.ggml.merges entry '" +
                                                   m + "' has no space");
      }
      merge_list.push_back(json::array({m.substr(0, space), m.substr(space + 1)}));
    }
  }
  const json tokenizer = {{"version", "1.0"},
                          {"truncation", nullptr},
                          {"padding", nullptr},
                          {"added_tokens", added},
                          {"normalizer", normalizer},
                          {"pre_tokenizer", pre_tokenizer},
                          {"post_processor", nullptr},
                          {"decoder", byte_level(false)},
                          {"model",
                           {{"type", "BPE"},
                            {"dropout", nullptr},
                            {"unk_token", nullptr},
                            {"continuing_subword_prefix", nullptr},
                            {"end_of_word_suffix", nullptr},
                            {"fuse_unk", false},
                            {"byte_fallback", false},
                            {"ignore_merges", false},
                            {"vocab", vocab},
                            {"merges", merge_list}}}};
  json config = {{"added_tokens_decoder", added_decoder},
                 {"clean_up_tokenization_spaces", false},
                 {"tokenizer_class", "PreTrainedTokenizerFast"}};
  auto token_text = [&](const char* key) -> std::optional<std::string> {
    auto id = f.get_int(key);
    if (!id || *id < 0 || static_cast<size_t>(*id) >= tokens->strings.size()) return std::nullopt;
    return tokens->strings[static_cast<size_t>(*id)];
  };
  if (auto t = token_text("tokenizer.ggml.bos_token_id")) config["bos_token"] = *t;
  if (auto t = token_text("tokenizer.ggml.eos_token_id")) config["eos_token"] = *t;
  if (auto t = token_text("tokenizer.ggml.padding_token_id")) config["pad_token"] = *t;
  auto add_bos = f.get_int("tokenizer.ggml.add_bos_token");
  config["add_bos_token"] = add_bos && *add_bos != 0;
  config["add_eos_token"] = false;
  if (auto tmpl = f.get_string("tokenizer.chat_template"); tmpl) config["chat_template"] = *tmpl;
  return HfTokenizerTexts{tokenizer.dump(), config.dump()};
}

Result<GgufTokenizerData> gguf_tokenizer_from_hf(const std::filesystem::path& dir,
                                                 int32_t vocab_size) {
  auto t = read_json_file(dir / "tokenizer.json");
  if (!t) return std::unexpected(t.error());
  json config = json::object();
  if (std::filesystem::exists(dir / "tokenizer_config.json")) {
    auto c = read_json_file(dir / "tokenizer_config.json");
    if (!c) return std::unexpected(c.error());
    config = std::move(*c);
  }
  const json& model = (*t)["model"];
  if (!model.is_object() || model.value("type", "") != "BPE" || !model["vocab"].is_object()) {
    return make_error(ErrorCode::kUnsupported, dir.string() + ": not a BPE tokenizer");
  }
  GgufTokenizerData out;
  const json& pre = (*t)["pre_tokenizer"];
  if (pre.is_object() && pre.value("type", "") == "ByteLevel" && pre.value("use_regex", true)) {
    out.pre = "gpt2";
  } else if (pre.is_object() && pre.value("type", "") == "Sequence" &&
             pre["pretokenizers"].is_array() && !pre["pretokenizers"].empty() &&
             pre["pretokenizers"][0]["pattern"].is_object()) {
    const std::string regex = pre["pretokenizers"][0]["pattern"].value("Regex", "");
    if (regex == kQwen2Regex) out.pre = "qwen2";
    if (regex == kLlama3Regex) out.pre = "llama-bpe";
  }
  if (out.pre.empty()) {
    return make_error(ErrorCode::kUnsupported,
                      dir.string() + ": its pre-tokenizer has no GGUF name Strata knows");
  }
  out.tokens.assign(static_cast<size_t>(vocab_size), std::string());
  out.token_types.assign(static_cast<size_t>(vocab_size), kTypeUnused);
  auto place = [&](int64_t id, const std::string& text, int type) -> Status {
    if (id < 0 || id >= vocab_size) {
      return make_error(ErrorCode::kInvalidArgument,
                        dir.string() + ": token id " + std::to_string(id) +
                            " outside the model's vocabulary of " + std::to_string(vocab_size));
    }
    out.tokens[static_cast<size_t>(id)] = text;
    out.token_types[static_cast<size_t>(id)] = type;
    return {};
  };
  for (const auto& [text, id] : model["vocab"].items()) {
    if (auto s = place(id.get<int64_t>(), text, 1); !s) return std::unexpected(s.error());
  }
  if ((*t)["added_tokens"].is_array()) {
    for (const json& a : (*t)["added_tokens"]) {
      const int type = a.value("special", false) ? kTypeControl : kTypeUserDefined;
      if (auto s = place(a.value("id", int64_t{-1}), a.value("content", ""), type); !s) {
        return std::unexpected(s.error());
      }
    }
  }
  for (size_t id = 0; id < out.tokens.size(); ++id) {
    if (out.tokens[id].empty()) out.tokens[id] = "[PAD" + std::to_string(id) + "]";
  }
  for (const json& m : model["merges"]) {
    if (m.is_string()) {
      out.merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2) {
      out.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    }
  }
  auto id_of = [&](const char* key) -> std::optional<int32_t> {
    if (!config.contains(key)) return std::nullopt;
    const json& v = config[key];
    const std::string text = v.is_string()   ? v.get<std::string>()
                             : v.is_object() ? v.value("content", "")
                                             : "";
    for (size_t id = 0; id < out.tokens.size(); ++id) {
      if (!text.empty() && out.tokens[id] == text) return static_cast<int32_t>(id);
    }
    return std::nullopt;
  };
  out.bos_id = id_of("bos_token");
  out.eos_id = id_of("eos_token");
  out.padding_id = id_of("pad_token");
  out.add_bos = config.value("add_bos_token", false);
  if (config.contains("chat_template") && config["chat_template"].is_string()) {
    out.chat_template = config["chat_template"].get<std::string>();
  }
  return out;
}

}  // namespace strata
