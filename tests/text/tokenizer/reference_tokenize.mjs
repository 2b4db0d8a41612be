// Reference tokenization for Strata's exactness tests: runs @lenml/tokenizers (a port of
// Hugging Face tokenizers to JavaScript) on a tokenizer folder.
//
//   node reference_tokenize.mjs NODE_MODULES_DIR TOKENIZER_DIR INPUT
//
// INPUT has one request per line; the output is {"results": [...]}, one entry per line:
//   "e HEX": encode the text whose bytes are HEX (possibly invalid UTF-8, decoded the way
//     TextDecoder does: each invalid subpart becomes U+FFFD, a leading BOM is kept) ->
//     {"ids", "ids_plain", "decoded", "decoded_skip"}: ids from encode(text) and
//     encode(text, {add_special_tokens: false}), and the decodes of `ids` without and with
//     skip_special_tokens (UTF-8 as hex; null when ids is empty).
//   "d ID,ID,...": decode the ids -> {"decoded", "decoded_skip"}.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [nodeModules, tokenizerDir, input] = process.argv.slice(2);
if (!nodeModules || !tokenizerDir || !input) {
  console.error("usage: reference_tokenize.mjs NODE_MODULES TOKENIZER_DIR INPUT");
  process.exit(2);
}
const entry = path.join(nodeModules, "@lenml", "tokenizers", "dist", "main.mjs");
if (!fs.existsSync(entry)) {
  console.error(`missing ${entry}: run scripts/install-deps.sh (npm ci in tools/js)`);
  process.exit(3);
}
const { TokenizerLoader } = await import(pathToFileURL(entry).href);
const readJson = (name) => JSON.parse(fs.readFileSync(path.join(tokenizerDir, name), "utf8"));
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: readJson("tokenizer.json"),
  tokenizerConfig: readJson("tokenizer_config.json"),
});

const toHex = (s) => Buffer.from(s, "utf8").toString("hex");
const decodeBoth = (ids) =>
  ids.length === 0
    ? { decoded: null, decoded_skip: null }
    : {
        decoded: toHex(tokenizer.decode(ids)),
        decoded_skip: toHex(tokenizer.decode(ids, { skip_special_tokens: true })),
      };

const lines = fs.readFileSync(input, "utf8").split("\n");
if (lines.length > 0 && lines[lines.length - 1] === "") lines.pop();
const textDecoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
const results = lines.map((line) => {
  const [kind, arg = ""] = [line.slice(0, 1), line.slice(2)];
  if (kind === "d") {
    const ids = arg === "" ? [] : arg.split(",").map(Number);
    return decodeBoth(ids);
  }
  if (kind !== "e") throw new Error(`bad request line: ${line}`);
  const text = textDecoder.decode(Buffer.from(arg, "hex"));
  const ids = tokenizer.encode(text);
  const idsPlain = tokenizer.encode(text, { add_special_tokens: false });
  return { ids, ids_plain: idsPlain, ...decodeBoth(ids) };
});
process.stdout.write(JSON.stringify({ node_unicode: process.versions.unicode, results }));
