// Renders Strata's chat-template corpus with the reference implementation,
// @huggingface/jinja 0.5.11 (the package itself, not the older copy inside
// @lenml/tokenizers), and prints the results as JSON on stdout.
//
//   node render_reference.mjs <node_modules dir> <tests/text/jinja dir>
//
// Output: {"version", "pairs": {"<template>|<conversation>|<agp>": R}, "snippets": {"<name>": R},
//          "generated": {"seed", "context", "cases": [{"template", "result": R}]}}
// where R is {"ok": true, "text": ...} or {"ok": false, "error": ...}. jinja_tests runs this
// script and compares every R with Strata's rendering byte for byte.
//
// strftime_now() must be deterministic: Date is replaced by one whose "now" is
// 2024-07-26 13:45:00 local time (the C++ side passes the same broken-down time).

import fs from "node:fs";
import path from "node:path";
import url from "node:url";

import { generateCases, kContext } from "./generate_cases.mjs";

const [nodeModules, dataDir] = process.argv.slice(2);
if (!nodeModules || !dataDir) {
  console.error("usage: node render_reference.mjs <node_modules dir> <data dir>");
  process.exit(2);
}

const kExpectedVersion = "0.5.11";
const jinjaDir = path.join(nodeModules, "@huggingface", "jinja");
const pkg = JSON.parse(fs.readFileSync(path.join(jinjaDir, "package.json"), "utf8"));
if (pkg.version !== kExpectedVersion) {
  console.error(`@huggingface/jinja is ${pkg.version}, expected ${kExpectedVersion}`);
  process.exit(3);
}
const { Template } = await import(url.pathToFileURL(path.join(jinjaDir, "dist", "index.js")).href);

const kNow = [2024, 6, 26, 13, 45, 0];
const RealDate = Date;
globalThis.Date = class extends RealDate {
  constructor(...args) {
    if (args.length === 0) super(...kNow);
    else super(...args);
  }
  static now() {
    return new RealDate(...kNow).getTime();
  }
};

function render(source, context) {
  try {
    return { ok: true, text: new Template(source).render(context) };
  } catch (e) {
    return { ok: false, error: String(e && e.message !== undefined ? e.message : e) };
  }
}

const readJson = (p) => JSON.parse(fs.readFileSync(p, "utf8"));
const manifest = readJson(path.join(dataDir, "templates", "manifest.json"));
const conversations = readJson(path.join(dataDir, "conversations.json")).conversations;
const snippets = readJson(path.join(dataDir, "snippets.json")).snippets;

const templates = manifest.templates.map((t) => {
  if (t.npm) {
    const config = readJson(path.join(nodeModules, t.npm, "models", "tokenizer_config.json"));
    return { name: t.name, source: config.chat_template, bos: config.bos_token, eos: config.eos_token };
  }
  return {
    name: t.name,
    source: fs.readFileSync(path.join(dataDir, "templates", t.file), "utf8"),
    bos: t.bos_token,
    eos: t.eos_token,
  };
});

const pairs = {};
for (const t of templates) {
  for (const c of conversations) {
    for (const agp of [false, true]) {
      // The variables transformers' apply_chat_template passes: tools is None when absent,
      // special tokens only when the tokenizer has them, then chat_template_kwargs.
      const context = { messages: c.messages, tools: c.tools ?? null, add_generation_prompt: agp };
      if (t.bos !== null && t.bos !== undefined) context.bos_token = t.bos;
      if (t.eos !== null && t.eos !== undefined) context.eos_token = t.eos;
      Object.assign(context, c.extra ?? {});
      pairs[`${t.name}|${c.name}|${agp}`] = render(t.source, context);
    }
  }
}

const snippetResults = {};
for (const s of snippets) snippetResults[s.name] = render(s.template, s.context ?? {});

const kSeed = 20240726;
const kGeneratedCases = 3000;
const generated = generateCases(kSeed, kGeneratedCases).map((template) => ({
  template,
  result: render(template, kContext),
}));

process.stdout.write(
  JSON.stringify({
    version: pkg.version,
    pairs,
    snippets: snippetResults,
    generated: { seed: kSeed, context: kContext, cases: generated },
  }),
);
