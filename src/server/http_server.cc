#include "server/http_server.h"

#include <httplib.h>

#include <chrono>
#include <ctime>
#include <limits>
#include <thread>
#include <unordered_set>

#include "common/log.h"
#include "server/request_parsing.h"
#include "server/text_stream.h"

namespace strata {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using WallClock = std::chrono::steady_clock;

int http_status(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kResourceExhausted:
    case ErrorCode::kUnsupported:
      return 400;
    case ErrorCode::kUnauthenticated:
      return 401;
    case ErrorCode::kNotFound:
      return 404;
    case ErrorCode::kFailedPrecondition:
      return 409;
    case ErrorCode::kTimeout:
      return 504;
    case ErrorCode::kOutOfPages:
      return 503;  // no room now (a restore): retry later
    default:
      return 500;
  }
}

// A response that ends with a tool call in the Hermes/Qwen format the chat templates use.
bool ends_with_tool_call(std::string_view text) {
  while (!text.empty() && (text.back() == ' ' || text.back() == '\n' || text.back() == '\r' ||
                           text.back() == '\t')) {
    text.remove_suffix(1);
  }
  return text.ends_with("</tool_call>");
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, int status, const std::string& message,
                const std::string& code) {
  const std::string type = status >= 500 ? "server_error" : "invalid_request_error";
  send_json(res, status, json{{"error", {{"message", message}, {"type", type}, {"code", code}}}});
}

void send_error(httplib::Response& res, const Error& e) {
  send_error(res, http_status(e.code), e.message, std::string(error_code_name(e.code)));
}

int64_t unix_time_s() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

json usage_json(const RequestUsage& u) {
  return json{
      {"prompt_tokens", u.prompt_tokens},
      {"completion_tokens", u.completion_tokens},
      {"total_tokens", u.prompt_tokens + u.completion_tokens},
      {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}},
      {"cached_tokens_details",
       {{"device", u.cached_device}, {"host", u.cached_host}, {"storage", u.cached_storage}}}};
}

json bytes_of(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

std::string finish_name(FinishReason r) {
  return r == FinishReason::kLength ? "length" : "stop";
}

}  // namespace

HttpServer::HttpServer(ServerOptions options, Engine& engine, const Tokenizer& tokenizer,
                       const ChatTemplate* chat, Metrics& metrics)
    : options_(std::move(options)),
      engine_(engine),
      tokenizer_(tokenizer),
      chat_(chat),
      metrics_(metrics),
      http_(std::make_unique<httplib::Server>()) {
  routes();
}

HttpServer::~HttpServer() {
  stop();
}

Status HttpServer::bind() {
  const int threads = std::max(4, options_.http_threads);
  http_->new_task_queue = [threads] {
    return new httplib::ThreadPool(static_cast<size_t>(threads));
  };
  http_->set_payload_max_length(64ULL << 20);
  http_->set_read_timeout(300, 0);
  http_->set_write_timeout(300, 0);
  if (options_.port == 0) {
    port_ = http_->bind_to_any_port(options_.host);
  } else {
    port_ = http_->bind_to_port(options_.host, options_.port) ? options_.port : -1;
  }
  if (port_ <= 0) {
    return make_error(ErrorCode::kIoError, "cannot listen on " + options_.host + ":" +
                                               std::to_string(options_.port) +
                                               " (address in use, or not an address here)");
  }
  return {};
}

void HttpServer::run() {
  http_->listen_after_bind();
}

void HttpServer::stop() {
  if (http_) http_->stop();
}

bool HttpServer::authorized(const httplib::Request& req, httplib::Response& res) {
  if (options_.admin_api_key.empty()) return true;
  const std::string expected = "Bearer " + options_.admin_api_key;
  if (req.get_header_value("Authorization") == expected) return true;
  send_error(res, 401, "this endpoint needs 'Authorization: Bearer <admin key>'",
             "unauthenticated");
  return false;
}

ChatRenderOptions HttpServer::render_options(const ojson* tools, bool add_generation_prompt,
                                             const ojson& template_kwargs) const {
  ChatRenderOptions o;
  if (tools != nullptr) o.tools = *tools;
  o.add_generation_prompt = add_generation_prompt;
  const SpecialTokenStrings& sp = tokenizer_.special_token_strings();
  o.bos_token = sp.bos_token;
  o.eos_token = sp.eos_token;
  o.extra_variables = template_kwargs.is_object() ? template_kwargs : ojson::object();
  return o;
}

Result<std::vector<int32_t>> HttpServer::chat_tokens(const ojson& messages, const ojson* tools,
                                                     bool add_generation_prompt,
                                                     const ojson& template_kwargs) const {
  if (chat_ == nullptr) {
    return make_error(ErrorCode::kInvalidArgument,
                      "this model has no chat template: use /v1/completions");
  }
  auto text =
      chat_->render(messages, render_options(tools, add_generation_prompt, template_kwargs));
  if (!text)
    return make_error(ErrorCode::kInvalidArgument, "chat template: " + text.error().message);
  // The template writes the special tokens itself (as transformers' apply_chat_template).
  return tokenizer_.encode(*text, EncodeOptions{.add_special_tokens = false});
}

void HttpServer::routes() {
  httplib::Server& s = *http_;
  s.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        STRATA_LOG_ERROR("handler fault: {}", what);
        send_error(res, 500, "internal error: " + what, "internal");
      });
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) {
      send_error(res, 404, "no route for " + req.method + " " + req.path, "not_found");
    } else if (res.status == 413) {
      send_error(res, 413, "the request body is too large", "payload_too_large");
    } else if (res.status >= 400) {
      send_error(res, res.status, "bad request", "invalid_request");
    }
  });
  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics_.requests(req.path.size() > 64 ? "other" : req.path, std::to_string(res.status))
        .Increment();
  });

  s.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, json{{"status", "ok"}});
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    send_json(
        res, 200,
        json{{"object", "list"},
             {"data", json::array({json{
                          {"id", options_.model_name},
                          {"object", "model"},
                          {"created", unix_time_s()},
                          {"owned_by", "strata"},
                          {"max_model_len", engine_.model().config().max_position_embeddings}}})}});
  });
  s.Get("/metrics",
        [this](const httplib::Request& req, httplib::Response& res) { handle_metrics(req, res); });
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_completions(req, res, false);
  });
  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_completions(req, res, true);
  });
  s.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    handle_tokenize(req, res);
  });
  s.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    handle_detokenize(req, res);
  });
  auto admin = [this](auto fn) {
    return [this, fn](const httplib::Request& req, httplib::Response& res) {
      if (authorized(req, res)) fn(req, res);
    };
  };
  s.Post("/cache/pin", admin([this](const httplib::Request& q, httplib::Response& r) {
           handle_pin(q, r, true, false);
         }));
  s.Post("/cache/unpin", admin([this](const httplib::Request& q, httplib::Response& r) {
           handle_pin(q, r, false, false);
         }));
  s.Post("/hicache/pin_blocks", admin([this](const httplib::Request& q, httplib::Response& r) {
           handle_pin(q, r, true, true);
         }));
  s.Post("/hicache/unpin_blocks", admin([this](const httplib::Request& q, httplib::Response& r) {
           handle_pin(q, r, false, true);
         }));
  s.Post("/cache/evict",
         admin([this](const httplib::Request& q, httplib::Response& r) { handle_evict(q, r); }));
  s.Post("/cache/flush",
         admin([this](const httplib::Request& q, httplib::Response& r) { handle_flush(q, r); }));
  s.Post("/flush_cache",
         admin([this](const httplib::Request& q, httplib::Response& r) { handle_flush(q, r); }));
  s.Get("/cache/state",
        admin([this](const httplib::Request& q, httplib::Response& r) { handle_state(q, r); }));
  s.Post("/session/tool_start", admin([this](const httplib::Request& q, httplib::Response& r) {
           handle_tool_session(q, r, true);
         }));
  s.Post("/session/tool_end", admin([this](const httplib::Request& q, httplib::Response& r) {
           handle_tool_session(q, r, false);
         }));
  s.Get("/session/kv_meta",
        admin([this](const httplib::Request& q, httplib::Response& r) { handle_kv_meta(q, r); }));
}

void HttpServer::handle_metrics(const httplib::Request&, httplib::Response& res) {
  const CacheGaugeValues v =
      engine_
          .call([](EngineState& s) {
            CacheGaugeValues g;
            const TreeStats t = s.tree.stats();
            g.pages_total = s.device_pages.num_pages();
            g.pages_free = s.device_pages.num_free();
            g.pages_used = s.device_pages.num_allocated();
            g.pages_cached = t.cached_pages;
            g.pages_pinned = t.pinned_blocks;
            g.pages_protected = t.protected_pages;
            g.pages_evictable = t.cached_pages - t.protected_pages;
            g.running = s.counters.running;
            g.waiting = s.counters.waiting;
            g.evicted_pages_total = t.evicted_pages_total;
            g.auto_unpinned_blocks_total = s.counters.auto_unpinned_blocks;
            g.expired_pins_total = t.expired_pins_total;
            if (s.host_pages != nullptr) {
              g.host_pages = {
                  {"total", s.host_pages->num_pages()},  {"free", s.host_pages->num_free()},
                  {"cached", t.host_cached_pages},       {"host_only", t.host_only_pages},
                  {"protected", t.host_protected_pages}, {"evictable", t.host_evictable_pages}};
            }
            const EngineCounters& c = s.counters;
            g.tier_events = {{"demoted_pages", t.demoted_pages_total},
                             {"backed_up_pages", t.backed_up_pages_total},
                             {"loaded_pages", t.loaded_pages_total},
                             {"host_evicted_pages", t.host_evicted_pages_total},
                             {"cached_host_tokens", c.cached_host_tokens},
                             {"cached_storage_tokens", c.cached_storage_tokens},
                             {"storage_pages_written", c.storage_pages_written},
                             {"storage_faults", c.storage_faults},
                             {"prefetch_pages_read", c.prefetch_pages_read},
                             {"prefetch_timeouts", c.prefetch_timeouts},
                             {"tool_sessions_expired", c.tool_sessions_expired}};
            return g;
          })
          .get();
  metrics_.set_cache(v);
  res.set_content(metrics_.serialize(), "text/plain; version=0.0.4");
}

void HttpServer::handle_tokenize(const httplib::Request& req, httplib::Response& res) {
  auto body = parse_json_object(req.body);
  if (!body) return send_error(res, body.error());
  auto add_special = get_bool(*body, "add_special_tokens");
  if (!add_special) return send_error(res, add_special.error());
  Result<std::vector<int32_t>> tokens;
  if (body->contains("messages")) {
    const ojson full = ojson::parse(req.body);
    if (auto v = validate_messages((*body)["messages"]); !v) return send_error(res, v.error());
    auto add_gen = get_bool(*body, "add_generation_prompt");
    if (!add_gen) return send_error(res, add_gen.error());
    const ojson* tools =
        full.contains("tools") && full["tools"].is_array() ? &full["tools"] : nullptr;
    if (full.contains("tools") && !full["tools"].is_null() && tools == nullptr) {
      return send_error(res, 400, "'tools' must be an array", "invalid_argument");
    }
    tokens = chat_tokens(full["messages"], tools, add_gen->value_or(true),
                         full.value("chat_template_kwargs", ojson::object()));
    if (tokens && add_special->value_or(false) && tokenizer_.bos_id() &&
        (tokens->empty() || tokens->front() != *tokenizer_.bos_id())) {
      tokens->insert(tokens->begin(), *tokenizer_.bos_id());
    }
  } else {
    auto prompt = get_string(*body, "prompt");
    if (!prompt) return send_error(res, prompt.error());
    if (!*prompt)
      return send_error(res, 400, "'prompt' (a string) or 'messages' is required",
                        "invalid_argument");
    tokens = tokenizer_.encode(**prompt,
                               EncodeOptions{.add_special_tokens = add_special->value_or(true)});
  }
  if (!tokens) return send_error(res, tokens.error());
  send_json(res, 200,
            json{{"tokens", *tokens},
                 {"count", tokens->size()},
                 {"max_model_len", engine_.model().config().max_position_embeddings}});
}

void HttpServer::handle_detokenize(const httplib::Request& req, httplib::Response& res) {
  auto body = parse_json_object(req.body);
  if (!body) return send_error(res, body.error());
  if (!body->contains("tokens"))
    return send_error(res, 400, "'tokens' is required", "invalid_argument");
  auto ids = parse_token_ids((*body)["tokens"], "tokens");
  if (!ids) return send_error(res, ids.error());
  for (int32_t id : *ids) {
    if (id >= static_cast<int32_t>(tokenizer_.vocab_size())) {
      return send_error(res, 400, "token id " + std::to_string(id) + " is outside the vocabulary",
                        "invalid_argument");
    }
  }
  auto text = tokenizer_.decode(*ids);
  if (!text) return send_error(res, text.error());
  send_json(res, 200, json{{"prompt", *text}});
}

void HttpServer::handle_completions(const httplib::Request& req, httplib::Response& res,
                                    bool chat) {
  const auto t_start = WallClock::now();
  auto body = parse_json_object(req.body);
  if (!body) return send_error(res, body.error());
  auto params = parse_generation_params(*body, chat);
  if (!params) return send_error(res, params.error());

  RequestSpec spec;
  std::optional<MessagesInfo> msg_info;
  ojson messages;
  const ojson* tools = nullptr;
  ojson template_kwargs = ojson::object();
  ojson full;
  size_t session_prev = 0;
  if (chat) {
    if (!body->contains("messages"))
      return send_error(res, 400, "'messages' is required", "invalid_argument");
    auto info = validate_messages((*body)["messages"]);
    if (!info) return send_error(res, info.error());
    msg_info = *info;
    full = ojson::parse(req.body);
    messages = full["messages"];
    if (full.contains("tools") && !full["tools"].is_null()) {
      if (!full["tools"].is_array())
        return send_error(res, 400, "'tools' must be an array", "invalid_argument");
      tools = &full["tools"];
    }
    if (full.contains("chat_template_kwargs") && !full["chat_template_kwargs"].is_null()) {
      if (!full["chat_template_kwargs"].is_object()) {
        return send_error(res, 400, "'chat_template_kwargs' must be an object", "invalid_argument");
      }
      template_kwargs = full["chat_template_kwargs"];
    }
    // A session continues from its exact tokens when the conversation extends it.
    bool continued = false;
    if (!params->session_id.empty() && chat_ != nullptr) {
      std::optional<SessionRecord> rec;
      {
        std::lock_guard lock(sessions_mutex_);
        auto it = sessions_.find(params->session_id);
        if (it != sessions_.end()) rec = it->second;
      }
      if (rec && rec->cache_salt == params->cache_salt && messages.size() > rec->num_messages + 1 &&
          messages[rec->num_messages].value("role", "") == "assistant") {
        const ojson& echoed = messages[rec->num_messages];
        const std::string echoed_text = echoed.contains("content") && echoed["content"].is_string()
                                            ? echoed["content"].get<std::string>()
                                            : "";
        // The client must echo what was generated (the tail of it: clients often drop a
        // reasoning block); an edited turn is rendered afresh.
        const bool echoes =
            rec->completion_text.size() >= echoed_text.size() &&
            rec->completion_text.compare(rec->completion_text.size() - echoed_text.size(),
                                         echoed_text.size(), echoed_text) == 0;
        if (echoes) {
          auto cont = chat_->render_continuation(messages, rec->num_messages, rec->stop_text,
                                                 render_options(tools, true, template_kwargs));
          if (cont) {
            auto more =
                tokenizer_.encode(cont->continuation, EncodeOptions{.add_special_tokens = false});
            if (more) {
              spec.prompt = rec->tokens;
              spec.prompt.insert(spec.prompt.end(), more->begin(), more->end());
              continued = true;
            }
          }
        }
      }
    }
    if (!continued) {
      auto tokens = chat_tokens(messages, tools, true, template_kwargs);
      if (!tokens) return send_error(res, tokens.error());
      spec.prompt = std::move(*tokens);
    }
    session_prev = messages.size();
  } else {
    auto prompt = parse_completion_prompt(*body);
    if (!prompt) return send_error(res, prompt.error());
    if (prompt->text) {
      auto tokens = tokenizer_.encode(*prompt->text);
      if (!tokens) return send_error(res, tokens.error());
      spec.prompt = std::move(*tokens);
    } else {
      spec.prompt = std::move(prompt->token_ids);
    }
  }
  spec.sampling = params->sampling;
  if (!params->ignore_eos) {
    for (int32_t e : tokenizer_.eos_ids()) spec.sampling.stop_token_ids.push_back(e);
  }
  const int64_t context = engine_.model().config().max_position_embeddings;
  spec.max_tokens = static_cast<int32_t>(params->max_tokens.value_or(
      options_.default_max_tokens > 0 ? options_.default_max_tokens : context));
  spec.cache_salt = params->cache_salt;
  spec.session_id = params->session_id;
  const std::vector<int32_t> prompt_tokens = spec.prompt;

  auto submitted = engine_.submit(std::move(spec));
  if (!submitted) return send_error(res, submitted.error());
  std::shared_ptr<RequestStream> stream = *submitted;

  const std::string id = std::string(chat ? "chatcmpl-" : "cmpl-") + std::to_string(stream->id());
  const int64_t created = unix_time_s();
  const std::string model = options_.model_name;
  const bool want_logprobs = params->sampling.logprobs;

  auto logprob_entry = [this, chat](const GeneratedToken& t) {
    const std::string piece = tokenizer_.decode(std::vector<int32_t>{t.token}).value_or("");
    json top = chat ? json::array() : json::object();
    for (const auto& alt : t.top_logprobs) {
      const std::string s = tokenizer_.decode(std::vector<int32_t>{alt.token}).value_or("");
      if (chat) {
        top.push_back(json{{"token", s}, {"logprob", alt.logprob}, {"bytes", bytes_of(s)}});
      } else {
        top[s] = alt.logprob;
      }
    }
    return std::make_tuple(piece, top);
  };

  // After the turn: remember the session's exact tokens, and apply a cache_control pin.
  auto after_finish = [this, chat, prompt_tokens, session_prev, msg_info, messages, tools,
                       template_kwargs, session_id = params->session_id, salt = params->cache_salt](
                          const StreamItem& fin, const std::vector<int32_t>& generated,
                          const std::string& text, bool stop_string) {
    if (!chat) return;
    if (!session_id.empty()) {
      std::lock_guard lock(sessions_mutex_);
      // The turn ends with the stop token the model sampled or, when it was cut off by
      // max_tokens, with the end-of-turn token the template closes every turn with.
      std::optional<int32_t> stop =
          fin.stop_token >= 0 ? std::optional<int32_t>(fin.stop_token) : std::nullopt;
      if (!stop && fin.finish == FinishReason::kLength) {
        if (const auto& eos = tokenizer_.special_token_strings().eos_token; eos) {
          stop = tokenizer_.token_to_id(*eos);
        }
      }
      // A stop string cut the text inside the generated tokens: no exact record then.
      if (!stop_string &&
          (fin.finish == FinishReason::kStop || fin.finish == FinishReason::kLength) && stop) {
        SessionRecord rec;
        rec.num_messages = session_prev;
        rec.tokens = prompt_tokens;
        rec.tokens.insert(rec.tokens.end(), generated.begin(), generated.end());
        rec.tokens.push_back(*stop);
        rec.stop_text = std::string(tokenizer_.id_to_token(*stop).value_or(""));
        rec.completion_text = text;
        rec.cache_salt = salt;
        sessions_[session_id] = std::move(rec);
      } else {
        sessions_.erase(session_id);
      }
    }
    // --auto-tool-offload: a turn that ends in a tool call parks the session on the host
    // until its next request (which restores it by itself).
    if (options_.auto_tool_offload && !session_id.empty() && ends_with_tool_call(text)) {
      auto r =
          engine_.call([id = session_id](EngineState& s) { return s.sessions->tool_start(id); })
              .get();
      if (!r) STRATA_LOG_DEBUG("auto tool offload of '{}': {}", session_id, r.error().message);
    }
    if (msg_info && msg_info->pin_through >= 0) {
      ojson upto = ojson::array();
      for (int32_t k = 0; k <= msg_info->pin_through; ++k)
        upto.push_back(messages[static_cast<size_t>(k)]);
      auto tokens = chat_tokens(upto, tools, false, template_kwargs);
      if (!tokens) return;
      const int32_t ps = engine_.options().page_size;
      auto hashes = hash_blocks(*tokens, ps, salt);
      const int64_t ttl_ms = msg_info->pin_ttl_s * 1000;
      engine_
          .call([hashes, ttl_ms](EngineState& s) {
            s.tree.pin(hashes, PinOptions{.ttl_ms = ttl_ms});
            return 0;
          })
          .get();
    }
  };

  if (!params->stream) {
    TextStream text(tokenizer_, params->stop);
    std::string out;
    std::vector<int32_t> generated;
    json content_logprobs = json::array();
    json c_tokens = json::array(), c_lps = json::array(), c_top = json::array(),
         c_off = json::array();
    StreamItem fin;
    bool first = true;
    auto last = t_start;
    for (;;) {
      bool done = false;
      for (StreamItem& item : stream->wait(100)) {
        for (const GeneratedToken& t : item.tokens) {
          const auto now = WallClock::now();
          if (first) {
            metrics_.ttft_s().Observe(std::chrono::duration<double>(now - t_start).count());
            first = false;
          } else {
            metrics_.inter_token_s().Observe(std::chrono::duration<double>(now - last).count());
          }
          last = now;
          if (text.stopped()) continue;
          generated.push_back(t.token);
          const size_t offset = out.size();
          out += text.push(t.token);
          if (want_logprobs && !text.stopped()) {
            auto [piece, top] = logprob_entry(t);
            if (chat) {
              content_logprobs.push_back(json{{"token", piece},
                                              {"logprob", t.logprob},
                                              {"bytes", bytes_of(piece)},
                                              {"top_logprobs", top}});
            } else {
              c_tokens.push_back(piece);
              c_lps.push_back(t.logprob);
              c_top.push_back(top);
              c_off.push_back(offset);
            }
          }
          if (text.stopped()) stream->cancel();  // a stop string: no need to go on
        }
        if (item.finish) {
          fin = std::move(item);
          done = true;
        }
      }
      if (done) break;
    }
    if (fin.finish == FinishReason::kError)
      return send_error(res, 500, "generation failed: " + fin.error, "internal");
    out += text.finish();
    const std::string reason = text.stopped() ? "stop" : finish_name(*fin.finish);
    metrics_.e2e_s().Observe(std::chrono::duration<double>(WallClock::now() - t_start).count());
    metrics_.prompt_tokens().Increment(fin.usage.prompt_tokens);
    metrics_.generation_tokens().Increment(fin.usage.completion_tokens);
    metrics_.cache_hit_tokens().Increment(fin.usage.cached_tokens);
    after_finish(fin, generated, out, text.stopped());
    json choice;
    if (chat) {
      choice =
          json{{"index", 0},
               {"message", {{"role", "assistant"}, {"content", out}}},
               {"logprobs", want_logprobs ? json{{"content", content_logprobs}} : json(nullptr)},
               {"finish_reason", reason}};
    } else {
      choice = json{{"index", 0},
                    {"text", out},
                    {"logprobs", want_logprobs ? json{{"tokens", c_tokens},
                                                      {"token_logprobs", c_lps},
                                                      {"top_logprobs", c_top},
                                                      {"text_offset", c_off}}
                                               : json(nullptr)},
                    {"finish_reason", reason}};
    }
    send_json(res, 200,
              json{{"id", id},
                   {"object", chat ? "chat.completion" : "text_completion"},
                   {"created", created},
                   {"model", model},
                   {"choices", json::array({choice})},
                   {"usage", usage_json(fin.usage)}});
    return;
  }

  // Streaming: server-sent events, one chunk per piece of text.
  struct StreamState {
    std::shared_ptr<RequestStream> stream;
    TextStream text;
    std::vector<int32_t> generated;
    std::string all_text;
    bool sent_role = false;
    bool first = true;
    WallClock::time_point last;
    bool finished = false;
  };
  auto st = std::make_shared<StreamState>(StreamState{
      stream, TextStream(tokenizer_, params->stop), {}, {}, false, true, t_start, false});
  const bool include_usage = params->include_usage;
  auto chunk = [id, created, model, chat](json delta_or_text, const json& finish,
                                          const json& logprobs) {
    json choice = chat ? json{{"index", 0},
                              {"delta", delta_or_text},
                              {"logprobs", logprobs},
                              {"finish_reason", finish}}
                       : json{{"index", 0},
                              {"text", delta_or_text},
                              {"logprobs", logprobs},
                              {"finish_reason", finish}};
    return json{{"id", id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", model},
                {"choices", json::array({choice})}};
  };
  auto sse = [](const json& j) {
    return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
  };

  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, st, chunk, sse, chat, include_usage, want_logprobs, logprob_entry, after_finish,
       t_start](size_t, httplib::DataSink& sink) -> bool {
        if (st->finished) {
          sink.done();
          return true;
        }
        if (!sink.is_writable()) {
          st->stream->cancel();
          return false;
        }
        std::string out;
        if (chat && !st->sent_role) {
          out += sse(chunk(json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr));
          st->sent_role = true;
        }
        for (StreamItem& item : st->stream->wait(50)) {
          for (const GeneratedToken& t : item.tokens) {
            const auto now = WallClock::now();
            if (st->first) {
              metrics_.ttft_s().Observe(std::chrono::duration<double>(now - t_start).count());
              st->first = false;
            } else {
              metrics_.inter_token_s().Observe(
                  std::chrono::duration<double>(now - st->last).count());
            }
            st->last = now;
            if (st->text.stopped()) continue;
            st->generated.push_back(t.token);
            const std::string piece = st->text.push(t.token);
            st->all_text += piece;
            json lp = nullptr;
            if (want_logprobs && !st->text.stopped()) {
              auto [tok_text, top] = logprob_entry(t);
              lp = chat ? json{{"content", json::array({json{{"token", tok_text},
                                                             {"logprob", t.logprob},
                                                             {"bytes", bytes_of(tok_text)},
                                                             {"top_logprobs", top}}})}}
                        : json{{"tokens", {tok_text}},
                               {"token_logprobs", {t.logprob}},
                               {"top_logprobs", {top}}};
            }
            if (!piece.empty() || !lp.is_null()) {
              out += sse(chunk(chat ? json{{"content", piece}} : json(piece), nullptr, lp));
            }
            if (st->text.stopped()) st->stream->cancel();
          }
          if (item.finish) {
            if (*item.finish == FinishReason::kError) {
              out += sse(json{{"error",
                               {{"message", "generation failed: " + item.error},
                                {"type", "server_error"},
                                {"code", "internal"}}}});
            } else {
              const std::string tail = st->text.finish();
              st->all_text += tail;
              const std::string reason = st->text.stopped() ? "stop" : finish_name(*item.finish);
              out += sse(chunk(chat ? json{{"content", tail}} : json(tail), reason, nullptr));
              if (include_usage) {
                json u = chunk(chat ? json::object() : json(""), nullptr, nullptr);
                u["choices"] = json::array();
                u["usage"] = usage_json(item.usage);
                out += sse(u);
              }
              metrics_.prompt_tokens().Increment(item.usage.prompt_tokens);
              metrics_.generation_tokens().Increment(item.usage.completion_tokens);
              metrics_.cache_hit_tokens().Increment(item.usage.cached_tokens);
              metrics_.e2e_s().Observe(
                  std::chrono::duration<double>(WallClock::now() - t_start).count());
              after_finish(item, st->generated, st->all_text, st->text.stopped());
            }
            out += "data: [DONE]\n\n";
            st->finished = true;
          }
        }
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          st->stream->cancel();
          return false;
        }
        if (st->finished) sink.done();
        return true;
      },
      [st](bool success) {
        if (!success || !st->finished) st->stream->cancel();
      });
}

Result<std::vector<BlockHash>> HttpServer::hashes_from_body(const json& body,
                                                            const std::string& raw_body) const {
  auto salt = get_string(body, "cache_salt");
  if (!salt) return std::unexpected(salt.error());
  const int32_t ps = engine_.options().page_size;
  const int forms = static_cast<int>(body.contains("block_hashes")) +
                    static_cast<int>(body.contains("token_ids")) +
                    static_cast<int>(body.contains("messages"));
  if (forms != 1) {
    return make_error(ErrorCode::kInvalidArgument,
                      "give exactly one of 'block_hashes', 'token_ids' or 'messages'");
  }
  if (body.contains("block_hashes")) return parse_block_hashes(body["block_hashes"]);
  if (body.contains("token_ids")) {
    auto ids = parse_token_ids(body["token_ids"], "token_ids");
    if (!ids) return std::unexpected(ids.error());
    return hash_blocks(*ids, ps, salt->value_or(""));
  }
  if (auto v = validate_messages(body["messages"]); !v) return std::unexpected(v.error());
  const ojson full = ojson::parse(raw_body);
  const ojson* tools =
      full.contains("tools") && full["tools"].is_array() ? &full["tools"] : nullptr;
  auto add_gen = get_bool(body, "add_generation_prompt");
  if (!add_gen) return std::unexpected(add_gen.error());
  auto ids = chat_tokens(full["messages"], tools, add_gen->value_or(false),
                         full.value("chat_template_kwargs", ojson::object()));
  if (!ids) return std::unexpected(ids.error());
  return hash_blocks(*ids, ps, salt->value_or(""));
}

void HttpServer::handle_pin(const httplib::Request& req, httplib::Response& res, bool pin,
                            bool legacy) {
  auto body = parse_json_object(req.body);
  if (!body) return send_error(res, body.error());
  if (legacy && !body->contains("block_hashes")) {
    return send_error(res, 400, "'block_hashes' is required", "invalid_argument");
  }
  auto hashes = hashes_from_body(*body, req.body);
  if (!hashes) return send_error(res, hashes.error());
  if (!pin) {
    const UnpinResult r =
        engine_.call([h = *hashes](EngineState& s) { return s.tree.unpin(h); }).get();
    return send_json(res, 200,
                     json{{"unpinned_count", r.unpinned},
                          {"unknown_count", r.unknown},
                          {"not_pinned_count", r.not_pinned}});
  }
  auto ttl = get_int(*body, "ttl_s", 0, 365LL * 24 * 3600);
  if (!ttl) return send_error(res, ttl.error());
  auto priority = get_int(*body, "priority", -100, 100);
  if (!priority) return send_error(res, priority.error());
  const PinOptions opts{.ttl_ms = ttl->value_or(0) * 1000,
                        .priority = static_cast<int32_t>(priority->value_or(0))};
  auto result =
      engine_
          .call([h = *hashes, opts](EngineState& s) -> Result<PinResult> {
            // --max-pinned-ratio: count the blocks this call would newly pin.
            std::unordered_set<BlockHash> fresh;
            for (BlockHash x : h) {
              if (s.tree.contains(x) && s.tree.pin_count(x) == 0) fresh.insert(x);
            }
            const int64_t budget = s.pin_budget_pages;
            const int32_t pool_pages =
                s.host_pages != nullptr ? s.host_pages->num_pages() : s.device_pages.num_pages();
            const int64_t pinned = s.tree.stats().pinned_blocks;
            if (pinned + static_cast<int64_t>(fresh.size()) > budget) {
              return make_error(ErrorCode::kResourceExhausted,
                                "pin refused: " + std::to_string(pinned) +
                                    " blocks are pinned and this call adds " +
                                    std::to_string(fresh.size()) + "; --max-pinned-ratio allows " +
                                    std::to_string(budget) + " of " + std::to_string(pool_pages) +
                                    (s.host_pages != nullptr ? " host pages" : " pages"));
            }
            PinResult r = s.tree.pin(h, opts);
            s.tree.back_up(h);  // a pinned block gets its host (and storage) copy now
            return r;
          })
          .get();
  if (!result) return send_error(res, 400, result.error().message, "pin_budget_exceeded");
  send_json(res, 200, json{{"pinned_count", result->pinned}, {"unknown_count", result->unknown}});
}

void HttpServer::handle_evict(const httplib::Request& req, httplib::Response& res) {
  auto body = parse_json_object(req.body);
  if (!body) return send_error(res, body.error());
  if (!body->contains("block_hashes"))
    return send_error(res, 400, "'block_hashes' is required", "invalid_argument");
  auto hashes = parse_block_hashes((*body)["block_hashes"]);
  if (!hashes) return send_error(res, hashes.error());
  auto desc = get_bool(*body, "descendants");
  if (!desc) return send_error(res, desc.error());
  const EvictBlocksResult r = engine_
                                  .call([h = *hashes, d = desc->value_or(false)](EngineState& s) {
                                    return s.tree.evict_blocks(h, d);
                                  })
                                  .get();
  send_json(res, 200,
            json{{"evicted_blocks", r.evicted_blocks},
                 {"skipped_locked", r.skipped_locked},
                 {"skipped_pinned", r.skipped_pinned},
                 {"skipped_has_children", r.skipped_has_children},
                 {"unknown", r.unknown}});
}

void HttpServer::handle_flush(const httplib::Request& req, httplib::Response& res) {
  if (!req.body.empty()) {
    auto body = parse_json_object(req.body);
    if (!body) return send_error(res, body.error());
  }
  const FlushResult r = engine_.call([](EngineState& s) { return s.tree.flush(); }).get();
  send_json(res, 200,
            json{{"evicted",
                  {{"device", r.evicted_pages}, {"host", r.evicted_host_pages}, {"storage", 0}}},
                 {"pinned_preserved", r.pinned_preserved},
                 {"locked_skipped", r.locked_skipped}});
}

void HttpServer::handle_state(const httplib::Request& req, httplib::Response& res) {
  const std::string detail = req.get_param_value("detail");
  if (!detail.empty() && detail != "tree") {
    return send_error(res, 400, "'detail' must be 'tree'", "invalid_argument");
  }
  const bool tree = detail == "tree";
  json out =
      engine_
          .call([tree](EngineState& s) {
            const TreeStats t = s.tree.stats();
            json j;
            j["page_size"] = t.page_size;
            j["device"] = {
                {"capacity_pages", s.device_pages.num_pages()},
                {"capacity_tokens", static_cast<int64_t>(s.device_pages.num_pages()) * t.page_size},
                {"free_pages", s.device_pages.num_free()},
                {"used_pages", s.device_pages.num_allocated()},
                {"cached_pages", t.cached_pages},
                {"request_pages", s.request_private_pages},
                {"pinned_blocks", t.pinned_blocks},
                {"soft_pinned_blocks", t.soft_pinned_blocks},
                {"protected_pages", t.protected_pages},
                {"evictable_pages", t.cached_pages - t.protected_pages},
                {"locked_nodes", t.locked_nodes}};
            j["host"] = nullptr;
            j["storage"] = nullptr;
            if (s.host_pages != nullptr) {
              j["host"] = {
                  {"capacity_pages", s.host_pages->num_pages()},
                  {"capacity_tokens",
                   static_cast<int64_t>(s.host_pages->num_pages()) * t.page_size},
                  {"free_pages", s.host_pages->num_free()},
                  {"used_pages", s.host_pages->num_allocated()},
                  {"cached_pages", t.host_cached_pages},
                  {"host_only_pages", t.host_only_pages},
                  {"protected_pages", t.host_protected_pages},
                  {"evictable_pages", t.host_evictable_pages},
                  {"write_policy", std::string(write_policy_name(s.options.hicache.write_policy))},
                  {"mem_layout", std::string(host_layout_name(s.options.hicache.layout))},
                  {"transfers_in_flight", t.io_pending_nodes}};
            }
            if (s.storage != nullptr) {
              const StorageStats st = s.storage->stats();
              j["storage"] = {{"backend", std::string(s.storage->name())},
                              {"stored_pages_known", t.stored_pages},
                              {"pages_written_total", s.counters.storage_pages_written},
                              {"prefetches_total", s.counters.prefetches_started},
                              {"prefetch_pages_read_total", s.counters.prefetch_pages_read},
                              {"prefetch_timeouts_total", s.counters.prefetch_timeouts},
                              {"faults_total", s.counters.storage_faults},
                              {"get_hits", st.get_hits},
                              {"get_misses", st.get_misses},
                              {"get_errors", st.get_errors},
                              {"corrupt_values", st.corrupt_values},
                              {"set_written", st.set_written},
                              {"set_skipped_existing", st.set_skipped_existing},
                              {"set_errors", st.set_errors},
                              {"bytes_read", st.bytes_read},
                              {"bytes_written", st.bytes_written}};
            }
            j["nodes_count"] = t.num_nodes;
            j["hits"] = {{"match_calls", t.match_calls},
                         {"matched_tokens_total",
                          t.matched_pages_total * static_cast<uint64_t>(t.page_size)},
                         {"cached_prompt_tokens_total", s.counters.cached_prompt_tokens},
                         {"cached_host_tokens_total", s.counters.cached_host_tokens},
                         {"cached_storage_tokens_total", s.counters.cached_storage_tokens},
                         {"prompt_tokens_total", s.counters.prompt_tokens}};
            j["evictions"] = {{"evicted_pages_total", t.evicted_pages_total},
                              {"demoted_pages_total", t.demoted_pages_total},
                              {"host_evicted_pages_total", t.host_evicted_pages_total},
                              {"backed_up_pages_total", t.backed_up_pages_total},
                              {"loaded_pages_total", t.loaded_pages_total},
                              {"backups_skipped_total", t.backups_skipped_total},
                              {"loads_failed_total", s.counters.loads_failed},
                              {"auto_unpinned_blocks_total", s.counters.auto_unpinned_blocks},
                              {"expired_pins_total", t.expired_pins_total}};
            j["requests"] = {{"running", s.counters.running}, {"waiting", s.counters.waiting}};
            if (tree) {
              json nodes = json::array();
              for (const NodeSnapshot& n : s.tree.snapshot()) {
                json hs = json::array();
                for (BlockHash h : n.block_hashes) hs.push_back(block_hash_to_wire(h));
                json tiers = json::array();
                if (n.on_device) tiers.push_back("device");
                if (n.on_host) tiers.push_back("host");
                if (n.in_storage) tiers.push_back("storage");
                nodes.push_back(json{{"id", n.id},
                                     {"parent", n.parent_id},
                                     {"tokens", n.num_tokens},
                                     {"block_hashes", hs},
                                     {"tiers", tiers},
                                     {"lock_ref", n.lock_ref},
                                     {"pin_counts", n.pin_counts},
                                     {"pin_ref", n.pin_ref},
                                     {"last_access_ms", n.last_access_ms},
                                     {"hit_count", n.hit_count},
                                     {"loading", n.loading},
                                     {"session_protected", n.host_ref > 0},
                                     {"evictable", n.evictable}});
              }
              j["nodes"] = std::move(nodes);
            }
            return j;
          })
          .get();
  send_json(res, 200, out);
}

namespace {

json session_json(const SessionView& v) {
  return json{{"state", std::string(session_state_name(v.state))},
              {"tier", v.tier},
              {"epoch", v.epoch},
              {"tokens", v.tokens},
              {"since", v.since_ms}};
}

bool transitional(SessionState s) {
  return s == SessionState::kOffloading || s == SessionState::kRestoring;
}

}  // namespace

// Waits (on this HTTP thread, never the scheduler's) until the session's copies landed,
// so that the answer says where its KV is.
Result<SessionView> HttpServer::settle_session(const std::string& id, SessionView v) {
  const auto deadline = WallClock::now() + std::chrono::seconds(30);
  while (transitional(v.state) && WallClock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    auto now = engine_.call([id](EngineState& s) { return s.sessions->kv_meta(id); }).get();
    if (!now) return now;
    const int64_t moved = v.moved_tokens;
    v = *now;
    v.moved_tokens = moved;
  }
  return v;
}

void HttpServer::handle_tool_session(const httplib::Request& req, httplib::Response& res,
                                     bool start) {
  auto body = parse_json_object(req.body);
  if (!body) return send_error(res, body.error());
  for (const auto& [key, value] : body->items()) {
    if (key != "session_id" && key != "epoch") {
      return send_error(res, 400, "unknown field '" + key + "'", "invalid_argument");
    }
  }
  auto id = get_string(*body, "session_id");
  if (!id) return send_error(res, id.error());
  if (!id->has_value() || (*id)->empty() || (*id)->size() > 256) {
    return send_error(res, 400, "'session_id' (1 to 256 characters) is required",
                      "invalid_argument");
  }
  std::optional<int64_t> epoch;
  if (!start) {
    auto e = get_int(*body, "epoch", 0, std::numeric_limits<int64_t>::max());
    if (!e) return send_error(res, e.error());
    if (!e->has_value()) return send_error(res, 400, "'epoch' is required", "invalid_argument");
    epoch = **e;
  } else if (body->contains("epoch")) {
    return send_error(res, 400, "tool_start takes no 'epoch'", "invalid_argument");
  }
  const std::string sid = **id;
  auto call = [&] {
    return engine_
        .call([sid, start, epoch](EngineState& s) {
          return start ? s.sessions->tool_start(sid)
                       : s.sessions->tool_end(sid, static_cast<uint64_t>(*epoch));
        })
        .get();
  };
  auto r = call();
  // A restore that found no device room now (running requests hold the pool) is retried
  // for a while as their pages come back; the session stays OFFLOADED in between.
  const auto retry_until = WallClock::now() + std::chrono::seconds(10);
  while (!start && !r && r.error().code == ErrorCode::kOutOfPages &&
         WallClock::now() < retry_until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    r = call();
  }
  if (!r) return send_error(res, r.error());
  auto v = settle_session(sid, *r);
  if (!v) return send_error(res, v.error());
  json out = session_json(*v);
  out[start ? "offloaded_tokens" : "restored_tokens"] = v->moved_tokens;
  send_json(res, 200, out);
}

void HttpServer::handle_kv_meta(const httplib::Request& req, httplib::Response& res) {
  const std::string id = req.get_param_value("session_id");
  if (id.empty() || id.size() > 256) {
    return send_error(res, 400, "'session_id' (1 to 256 characters) is required",
                      "invalid_argument");
  }
  auto r = engine_.call([id](EngineState& s) { return s.sessions->kv_meta(id); }).get();
  if (!r) return send_error(res, r.error());
  send_json(res, 200, session_json(*r));
}

}  // namespace strata
