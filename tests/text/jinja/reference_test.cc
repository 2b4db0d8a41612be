// Strata's renderings against the reference implementation, @huggingface/jinja 0.5.11,
// byte for byte: every (template, conversation, add_generation_prompt) of the corpus and
// every language snippet. The reference runs in Node (render_reference.mjs); a missing
// Node or package fails the test, it never skips.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "jinja_test_util.h"
#include "text/jinja/chat_template.h"
#include "text/jinja/template.h"

namespace strata::jinja {
namespace {

using nlohmann::ordered_json;
using namespace strata::jinja::test_support;

struct Reference {
  bool ok = false;
  std::string problem;
  ordered_json results;
};

// Runs the reference once for the whole test binary.
const Reference& reference() {
  static const Reference ref = [] {
    Reference r;
    const CommandResult run =
        run_command(node_command(kDataDir + "/render_reference.mjs",
                                 shell_quote(kNodeModules) + " " + shell_quote(kDataDir)));
    if (run.exit_code != 0) {
      r.problem = "running the reference renderer failed (exit " + std::to_string(run.exit_code) +
                  "). Node 20 must be on PATH and tools/js/node_modules must contain "
                  "@huggingface/jinja 0.5.11 (npm ci in tools/js). stderr:\n" +
                  run.err;
      return r;
    }
    r.results = ordered_json::parse(run.out, nullptr, /*allow_exceptions=*/false);
    if (r.results.is_discarded()) {
      r.problem = "the reference renderer printed invalid JSON";
      return r;
    }
    r.ok = true;
    return r;
  }();
  return ref;
}

struct CorpusTemplate {
  std::string name;
  std::string source;
  std::optional<std::string> bos;
  std::optional<std::string> eos;
};

std::optional<std::string> optional_string(const ordered_json& j) {
  if (j.is_string()) return j.get<std::string>();
  return std::nullopt;
}

std::vector<CorpusTemplate> corpus_templates() {
  const ordered_json manifest =
      ordered_json::parse(read_file(kDataDir + "/templates/manifest.json"));
  std::vector<CorpusTemplate> out;
  for (const ordered_json& t : manifest["templates"]) {
    CorpusTemplate ct;
    ct.name = t["name"].get<std::string>();
    if (t.contains("npm")) {
      const ordered_json config = ordered_json::parse(read_file(
          kNodeModules + "/" + t["npm"].get<std::string>() + "/models/tokenizer_config.json"));
      ct.source = config["chat_template"].get<std::string>();
      ct.bos = optional_string(config["bos_token"]);
      ct.eos = optional_string(config["eos_token"]);
    } else {
      ct.source = read_file(kDataDir + "/templates/" + t["file"].get<std::string>());
      ct.bos = optional_string(t["bos_token"]);
      ct.eos = optional_string(t["eos_token"]);
    }
    out.push_back(std::move(ct));
  }
  return out;
}

// A readable account of where two renderings diverge.
std::string describe_difference(const std::string& expected, const std::string& actual) {
  size_t i = 0;
  while (i < expected.size() && i < actual.size() && expected[i] == actual[i]) ++i;
  const size_t from = i > 60 ? i - 60 : 0;
  return "first difference at byte " + std::to_string(i) + "\n  reference: ..." +
         ordered_json(expected.substr(from, 160)).dump() + "\n  strata:    ..." +
         ordered_json(actual.substr(from, 160)).dump();
}

TEST(ReferenceCorpus, EveryConversationRendersLikeTheReference) {
  const Reference& ref = reference();
  ASSERT_TRUE(ref.ok) << ref.problem;
  ASSERT_EQ(ref.results["version"], "0.5.11");
  const ordered_json corpus = ordered_json::parse(read_file(kDataDir + "/conversations.json"));
  const ordered_json& pairs = ref.results["pairs"];

  size_t compared = 0;
  size_t rendered = 0;
  std::vector<std::string> failures;
  for (const CorpusTemplate& t : corpus_templates()) {
    Result<ChatTemplate> parsed = ChatTemplate::parse(t.source);
    ASSERT_TRUE(parsed.has_value()) << t.name << ": " << parsed.error().message;
    for (const ordered_json& conversation : corpus["conversations"]) {
      const std::string conv_name = conversation["name"].get<std::string>();
      const bool extension = conversation.contains("extension_templates") &&
                             conversation["extension_templates"].contains(t.name);
      for (bool agp : {false, true}) {
        const std::string id = t.name + "|" + conv_name + "|" + (agp ? "true" : "false");
        ASSERT_TRUE(pairs.contains(id)) << "reference result missing for " << id;
        const ordered_json& expected = pairs[id];

        ChatRenderOptions options;
        if (conversation.contains("tools")) options.tools = conversation["tools"];
        options.add_generation_prompt = agp;
        options.bos_token = t.bos;
        options.eos_token = t.eos;
        if (conversation.contains("extra")) options.extra_variables = conversation["extra"];
        options.now = reference_now();
        const Result<std::string> actual = parsed->render(conversation["messages"], options);
        ++compared;

        if (extension) {
          // The reference fails (it lacks a filter the template uses); Strata renders.
          if (expected["ok"].get<bool>())
            failures.push_back(id + ": expected the reference to fail");
          if (!actual) failures.push_back(id + ": Strata failed: " + actual.error().message);
          continue;
        }
        if (expected["ok"].get<bool>()) {
          if (!actual) {
            failures.push_back(id + ": Strata failed: " + actual.error().message);
          } else if (*actual != expected["text"].get<std::string>()) {
            failures.push_back(id + ": " + describe_difference(expected["text"], *actual));
          } else {
            ++rendered;
          }
        } else if (actual) {
          failures.push_back(id + ": the reference fails (" + expected["error"].get<std::string>() +
                             ") but Strata rendered");
        } else if (actual.error().message.find("(at line") == std::string::npos &&
                   actual.error().message != expected["error"].get<std::string>()) {
          // A raise_exception() message must be exactly the template's.
          failures.push_back(id + ": raised message differs: " + actual.error().message);
        }
      }
    }
  }
  for (size_t i = 0; i < failures.size() && i < 20; ++i) ADD_FAILURE() << failures[i];
  EXPECT_TRUE(failures.empty()) << failures.size() << " of " << compared << " renderings differ";
  // The corpus is only meaningful if most pairs render (rather than fail in both).
  EXPECT_GT(rendered, compared * 3 / 4) << "only " << rendered << " of " << compared << " rendered";
  std::printf("[ corpus   ] %zu renderings compared, %zu identical texts, %zu failing in both\n",
              compared, rendered, compared - rendered - failures.size());
}

TEST(ReferenceSnippets, EveryLanguageSnippetMatchesTheReference) {
  const Reference& ref = reference();
  ASSERT_TRUE(ref.ok) << ref.problem;
  const ordered_json snippets = ordered_json::parse(read_file(kDataDir + "/snippets.json"));
  const ordered_json& results = ref.results["snippets"];
  size_t failures = 0;
  for (const ordered_json& s : snippets["snippets"]) {
    const std::string name = s["name"].get<std::string>();
    const ordered_json& expected = results[name];
    const ordered_json context = s.contains("context") ? s["context"] : ordered_json::object();
    Result<std::string> actual = [&]() -> Result<std::string> {
      Result<Template> t = Template::parse(s["template"].get<std::string>());
      if (!t) return std::unexpected(t.error());
      return t->render(context, TemplateRenderOptions{reference_now()});
    }();
    if (s.contains("extension")) {
      EXPECT_FALSE(expected["ok"].get<bool>())
          << name << ": the reference renders it; not an extension";
      if (!actual) {
        ADD_FAILURE() << name << ": Strata failed: " << actual.error().message;
        ++failures;
      } else if (*actual != s["extension"]["expect"].get<std::string>()) {
        ADD_FAILURE() << name << ": " << describe_difference(s["extension"]["expect"], *actual);
        ++failures;
      }
      continue;
    }
    if (expected["ok"].get<bool>()) {
      if (!actual) {
        ADD_FAILURE() << name << ": Strata failed: " << actual.error().message;
        ++failures;
      } else if (*actual != expected["text"].get<std::string>()) {
        ADD_FAILURE() << name << ": " << describe_difference(expected["text"], *actual);
        ++failures;
      }
    } else if (actual) {
      ADD_FAILURE() << name << ": the reference fails (" << expected["error"].get<std::string>()
                    << ") but Strata rendered " << ordered_json(*actual).dump();
      ++failures;
    }
  }
  std::printf("[ snippets ] %zu snippets, %zu differ\n", snippets["snippets"].size(), failures);
}

TEST(ReferenceGenerated, RandomTemplatesRenderLikeTheReference) {
  const Reference& ref = reference();
  ASSERT_TRUE(ref.ok) << ref.problem;
  const ordered_json& generated = ref.results["generated"];
  const ordered_json& context = generated["context"];
  size_t same = 0;
  size_t both_fail = 0;
  size_t failures = 0;
  for (const ordered_json& c : generated["cases"]) {
    const std::string source = c["template"].get<std::string>();
    const ordered_json& expected = c["result"];
    Result<std::string> actual = [&]() -> Result<std::string> {
      Result<Template> t = Template::parse(source);
      if (!t) return std::unexpected(t.error());
      return t->render(context, TemplateRenderOptions{reference_now()});
    }();
    const bool expected_ok = expected["ok"].get<bool>();
    if (expected_ok && actual && *actual == expected["text"].get<std::string>()) {
      ++same;
    } else if (!expected_ok && !actual) {
      ++both_fail;
    } else if (++failures <= 20) {
      ADD_FAILURE() << ordered_json(source).dump() << "\n  reference: " << expected.dump()
                    << "\n  strata:    "
                    << (actual ? ordered_json(*actual).dump() : "error: " + actual.error().message);
    }
  }
  EXPECT_EQ(failures, 0u);
  // Most generated templates must render, or the comparison says little.
  EXPECT_GT(same, generated["cases"].size() * 9 / 10);
  std::printf("[ generated] seed %s: %zu identical, %zu failing in both, %zu differ\n",
              generated["seed"].dump().c_str(), same, both_fail, failures);
}

}  // namespace
}  // namespace strata::jinja
