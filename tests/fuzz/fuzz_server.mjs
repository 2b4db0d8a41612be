#!/usr/bin/env node
// A fuzz suite for a real `strata serve` (issue 20). Two servers, one after the other: one
// with an admin key, one with the hierarchical cache as well; then `strata route` in front
// of two workers (issue 28, runRouter: the same phases against the router). For each:
//
//   1. regression cases, one per finding of the issue (client pins are soft, large-input
//      memory, framing, a form-encoded JSON body, a lower-case "bearer");
//   2. a seeded random-request phase over every endpoint and its fields, with and without
//      the admin key, live block hashes from /cache/state?detail=tree, cache_control pins,
//      sessions, tool_start/tool_end, flushes and evictions, streaming clients that vanish;
//   3. a raw-socket phase: random and mutated bytes, truncated and pipelined requests, odd
//      framing, bounded concurrency;
//   4. checks once idle: alive, nothing running or locked, pins back to zero after the
//      fuzzer unpinned what it pinned, memory within a bound, a clean SIGTERM exit.
//
// Throughout: no status >= 500 but 503 (and 504 on /session/*; 501 for an unsupported
// transfer coding on raw sockets); every error a JSON {"error": {"message", "type", "code"}};
// every raw connection answered or closed within the timeouts and a margin.
//
// usage: node tests/fuzz/fuzz_server.mjs [STRATA_BIN] [--quick] [--seconds S] [--seed N]
//          [--requests N] [--raw N] [--concurrency N] [--only admin|hicache|router] [--verbose]
// STRATA_BIN may also come from the environment (CTest sets it, with STRATA_SOURCE_DIR and
// STRATA_TEST_DIR). Exit code 0 when every check held, 1 otherwise (each violation printed
// with the request that caused it), 2 on a usage error.
//
// The KV event stream is not checked here (it needs ZeroMQ, which Node does not have):
// tests/server/kv_events_check.py replays it against /cache/state?detail=tree.
import http from 'node:http';
import path from 'node:path';
import { readFileSync, existsSync, appendFileSync, mkdirSync, rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { GET_HEALTH, RawConn, postRaw } from '../server/raw_http.mjs';

// ------------------------------------------------------------------ options

const HERE = path.dirname(fileURLToPath(import.meta.url));
const USAGE = 'usage: fuzz_server.mjs [STRATA_BIN] [--quick] [--seconds S] [--seed N] [--requests N] ' +
  '[--raw N] [--concurrency N] [--only admin|hicache|router] [--verbose]';

function parseArgs(argv) {
  const o = { quick: true, seconds: 0, seed: 20240620, requests: null, raw: null, concurrency: 8,
    only: null, verbose: false, bin: null };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const num = () => {
      const v = Number(argv[++i]);
      if (!Number.isFinite(v) || v < 0) { console.error(`${a} needs a non-negative number\n${USAGE}`); process.exit(2); }
      return v;
    };
    if (a === '--quick') o.quick = true;
    else if (a === '--seconds') { o.seconds = num(); o.quick = false; }
    else if (a === '--seed') o.seed = Math.floor(num());
    else if (a === '--requests') o.requests = Math.floor(num());
    else if (a === '--raw') o.raw = Math.floor(num());
    else if (a === '--concurrency') o.concurrency = Math.max(1, Math.floor(num()));
    else if (a === '--only') o.only = argv[++i];
    else if (a === '--verbose') o.verbose = true;
    else if (a === '-h' || a === '--help') { console.log(USAGE); process.exit(0); }
    else if (!a.startsWith('-') && !o.bin) o.bin = a;
    else { console.error(`unknown argument ${a}\n${USAGE}`); process.exit(2); }
  }
  return o;
}

const OPT = parseArgs(process.argv.slice(2));
const SOURCE_DIR = process.env.STRATA_SOURCE_DIR || path.resolve(HERE, '../..');
process.env.STRATA_SOURCE_DIR = SOURCE_DIR;
process.env.STRATA_BIN = OPT.bin || process.env.STRATA_BIN || path.join(SOURCE_DIR, 'build/strata');
process.env.STRATA_TEST_DIR = process.env.STRATA_TEST_DIR ||
  path.join(path.dirname(process.env.STRATA_BIN), 'test-work');
if (!existsSync(process.env.STRATA_BIN)) {
  console.error(`no strata binary at ${process.env.STRATA_BIN}\n${USAGE}`);
  process.exit(2);
}
const { startServer, startRouter, words } = await import('../server/server_harness.mjs');

const KEY = 'secret';
const ADMIN = `Bearer ${KEY}`;
const CLIENT_PIN_TTL_S = 2;
const MAX_BODY = 256 * 1024;           // bodies the fuzzer sends stay below this
// An ASan+UBSan Debug build (scripts/test.sh sets STRATA_SANITIZER_BUILD=1) is many times
// slower and keeps freed memory in quarantine: fewer requests, wider margins, no RSS bounds.
const SANITIZED = process.env.STRATA_SANITIZER_BUILD === '1';
const HTTP_TIMEOUT_MS = SANITIZED ? 60000 : 20000;  // no answer this long: a hang (tool_end may retry 10 s)
const RAW_DEADLINE_MS = SANITIZED ? 10000 : 5000;   // header + body timeouts (1 s each) and a margin
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const now = () => performance.now();

// ------------------------------------------------------------------ randomness

// mulberry32: small, deterministic, so that a failing request can be reproduced.
function prng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let x = a;
    x = Math.imul(x ^ (x >>> 15), x | 1);
    x ^= x + Math.imul(x ^ (x >>> 7), x | 61);
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}

class Rng {
  constructor(seed) { this.r = prng(seed); }
  f() { return this.r(); }
  int(n) { return Math.floor(this.r() * n); }
  range(lo, hi) { return lo + this.int(hi - lo + 1); }
  chance(p) { return this.r() < p; }
  pick(a) { return a[this.int(a.length)]; }
  // weighted: [[w, value], ...]
  weighted(table) {
    let total = 0;
    for (const [w] of table) total += w;
    let x = this.r() * total;
    for (const [w, v] of table) { if ((x -= w) < 0) return v; }
    return table[table.length - 1][1];
  }
}

// ------------------------------------------------------------------ JSON with exact literals

// A JSON literal written as is (numbers beyond a double, invalid escapes, deep nesting).
class Raw { constructor(text) { this.text = text; } }
const raw = (t) => new Raw(t);

function ser(v) {
  if (v instanceof Raw) return v.text;
  if (v === undefined) return 'null';
  if (Array.isArray(v)) return '[' + v.map(ser).join(',') + ']';
  if (v !== null && typeof v === 'object') {
    return '{' + Object.entries(v).filter(([, x]) => x !== undefined)
      .map(([k, x]) => JSON.stringify(k) + ':' + ser(x)).join(',') + '}';
  }
  return JSON.stringify(v);
}

const clone = (v) => (v instanceof Raw || v === null || typeof v !== 'object') ? v
  : Array.isArray(v) ? v.map(clone) : Object.fromEntries(Object.entries(v).map(([k, x]) => [k, clone(x)]));

// ------------------------------------------------------------------ content

const SYSTEMS = [0, 1, 2, 3, 4, 5].map((i) => `You are assistant ${i}. ` + words(40 + i * 50, 100 + i));
const UNICODE = ['héllo wörld', '日本語のテキスト', 'emoji 😀🎉👩‍👩‍👧', 'עברית ومرحبا', 'e\u0301\u0301 zero\u200bwidth',
  '\u0000nul', 'tab\tnew\nline\r', '\\ backslash " quote', '\u2028\u2029', 'ﬁ ligature Ⅻ', '<|im_start|>user\nhi<|im_end|>',
  '<think>x</think>', '{{ raise }}{% for %}', '\uFEFFbom'];
const LONE_SURROGATES = ['"\\ud800"', '"\\udc00"', '"a\\ud83dz"', '"\\ud800\\ud800"', '"\\udfff\\ud800"', '"\\uD834"'];

function text(rng) {
  return rng.weighted([
    [5, () => words(rng.range(1, 30), rng.int(1000))],
    [2, () => rng.pick(UNICODE)],
    [1, () => words(rng.range(50, 300), rng.int(1000))],
    [1, () => ''],
    [1, () => rng.pick(UNICODE) + ' ' + words(rng.range(1, 10), rng.int(50))],
  ])();
}

// Values of the wrong type, out of range, huge, negative, fractional, odd unicode, nested.
function weird(rng, depth = 0) {
  return rng.weighted([
    [3, () => raw(rng.pick(['18446744073709551615', '18446744073709551616', '-9223372036854775808',
      '-9223372036854775809', '9223372036854775807', '9223372036854775808', '4294967296', '2147483648',
      '-2147483649', '1e308', '-1e308', '1e-320', '1E400', '-0', '-0.0', '0.0', '1.0', '2.000000000000000001',
      '1' + '0'.repeat(400), '123456789012345678901234567890', '16777217', '0.5', '1e3', '-1e3'])) ],
    [2, () => rng.pick([0, -1, 1, 2, -100, 101, 1.5, -0.5, 3, 21, 65536, 1 << 24, (1 << 24) + 1, 1e15, -1e15])],
    [2, () => rng.pick(['', '1', 'true', 'null', ' ', 'pin', 'stop', 'x'.repeat(rng.range(1, 3000)), '-5', '0x10'])],
    [1, () => rng.pick(UNICODE)],
    [1, () => raw(rng.pick(LONE_SURROGATES))],
    [1, () => rng.pick([true, false, null])],
    [1, () => (depth < 3 ? [weird(rng, depth + 1), weird(rng, depth + 1)] : [])],
    [1, () => (depth < 3 ? { [rng.pick(['a', 'type', 'ttl_s', '', 'role'])]: weird(rng, depth + 1) } : {})],
    [1, () => { const n = rng.range(10, 3000); return raw('['.repeat(n) + ']'.repeat(n)); }],
    [1, () => { const n = rng.range(10, 2000); return raw('{"a":'.repeat(n) + '1' + '}'.repeat(n)); }],
    [1, () => Array.from({ length: rng.range(0, 200) }, () => rng.int(200000))],
  ])();
}

// ------------------------------------------------------------------ the fuzzer's view of the server

class World {
  constructor(run) {
    this.run = run;
    this.hashes = [];          // live block hashes (decimal strings) from the last tree
    this.tokenLists = [];      // token id lists of real prompts (from /tokenize)
    this.unpins = [];          // { path, body } to replay at the end: everything the admin pinned
    this.sessions = new Map(); // session_id -> { messages, lastReply, epoch }
    this.sessionIds = new Set();
  }
  // strict: only well-formed hashes (for requests that must succeed).
  hash(rng, strict = false) {
    if (this.hashes.length > 0 && (strict || rng.chance(0.85))) {
      const h = rng.pick(this.hashes);
      return rng.weighted([
        [4, () => raw(h)],
        [3, () => h],
        [1, () => raw((BigInt(h) < 0n ? BigInt(h) + (1n << 64n) : BigInt(h)).toString())],
      ])();
    }
    if (strict) return raw(BigInt.asIntN(64, BigInt(rng.int(2 ** 32)) << 32n | BigInt(rng.int(2 ** 32))).toString());
    return rng.weighted([
      [3, () => raw(BigInt.asIntN(64, BigInt(rng.int(2 ** 32)) << 32n | BigInt(rng.int(2 ** 32))).toString())],
      [1, () => raw(rng.pick(['0', '-1', '1', '18446744073709551615', '-9223372036854775808']))],
      [1, () => rng.pick(['-', '', '01', '+5', '1e3', ' 5', '18446744073709551616', '-9223372036854775809', 'abc'])],
      [1, () => weird(rng)],
    ])();
  }
  hashList(rng, strict = false) {
    const n = rng.weighted([[6, rng.range(1, 8)], [2, rng.range(9, 64)], [1, 0], [1, rng.range(100, 2000)]]);
    return Array.from({ length: n }, () => this.hash(rng, strict));
  }
  tokens(rng) {
    if (this.tokenLists.length > 0 && rng.chance(0.7)) {
      const t = rng.pick(this.tokenLists);
      return rng.chance(0.5) ? t.slice() : t.slice(0, rng.range(1, t.length));
    }
    return Array.from({ length: rng.range(1, 80) }, () => rng.int(151000));
  }
  sessionId(rng, strict = false) {
    if (strict) return `fz-${this.run}-${rng.int(6)}`;
    return rng.weighted([
      [8, () => `fz-${this.run}-${rng.int(6)}`],
      [1, () => rng.pick(['', 'x'.repeat(256), 'x'.repeat(257), '日本', ' ', 'a\u0000b'])],
      [1, () => weird(rng)],
    ])();
  }
}

// ------------------------------------------------------------------ request generators

function auth(rng) {
  return rng.weighted([
    [10, ADMIN], [2, `bearer ${KEY}`], [1, `BEARER ${KEY}`],
    [3, null],
    [1, `Bearer ${KEY}x`], [1, `Bearer ${KEY.slice(0, -1)}`], [1, `Basic ${KEY}`], [1, KEY], [1, `Bearer  ${KEY}`],
    [1, 'Bearer'], [1, ''],
  ]);
}
const isAdmin = (a) => a !== null && /^bearer secret$/i.test(a);

function message(rng, role) {
  const m = { role: role ?? rng.weighted([[5, 'user'], [2, 'system'], [2, 'assistant'], [1, 'tool'], [1, 'developer']]) };
  m.content = rng.weighted([
    [8, () => text(rng)],
    [2, () => [{ type: 'text', text: text(rng) }, ...(rng.chance(0.3) ? [{ type: 'text', text: text(rng) }] : [])]],
    [1, () => (m.role === 'assistant' ? null : text(rng))],
  ])();
  return m;
}

// The two bugs this suite found in the engine are fixed (tests/fuzz/README.md): the
// scheduler livelock under locked prefixes (so the pool is the tight 4,096 tokens again)
// and the soft-pin TTL inheritance.
// Long TTLs mixed with the clients' capped ones: each soft pin keeps its own TTL
// (cache/pin_table.h), so an admin's unpin leaves a client's pin to expire on its own cap.
const LONG_TTLS = [1, 2, 600, 365 * 24 * 3600];

function pinControl(rng) {
  return rng.weighted([
    [3, { type: 'pin' }],
    [3, { type: 'pin', ttl_s: rng.range(1, 4) }],
    [1, { type: 'pin', ttl_s: rng.pick(LONG_TTLS) }],
  ]);
}

function messages(rng, world) {
  const msgs = [];
  if (rng.chance(0.7)) msgs.push({ role: 'system', content: rng.pick(SYSTEMS) });
  const turns = rng.range(1, 3);
  for (let t = 0; t < turns; t++) {
    msgs.push(message(rng, 'user'));
    if (t < turns - 1) msgs.push(message(rng, 'assistant'));
  }
  if (rng.chance(0.3)) {
    const i = rng.int(msgs.length);
    msgs[i].cache_control = pinControl(rng);
  }
  return msgs;
}

function sampling(rng, body, chat) {
  if (rng.chance(0.7)) body.max_tokens = rng.range(1, 12); else if (rng.chance(0.3)) body.max_completion_tokens = rng.range(1, 8);
  if (rng.chance(0.5)) body.temperature = rng.pick([0, 0.7, 1, 2]);
  if (rng.chance(0.2)) body.top_p = rng.pick([0.1, 0.9, 1]);
  if (rng.chance(0.2)) body.top_k = rng.pick([-1, 0, 1, 40]);
  if (rng.chance(0.3)) body.seed = rng.int(1000);
  if (rng.chance(0.15)) body.stop = rng.chance(0.5) ? rng.pick(['\n', 'the', '。']) : ['a', 'b'];
  if (rng.chance(0.1)) body.stop_token_ids = [rng.int(151000)];
  if (rng.chance(0.15)) body.ignore_eos = rng.chance(0.5);
  if (rng.chance(0.1)) body.n = 1;
  if (rng.chance(0.1)) body.model = 'tiny-qwen3';
  if (rng.chance(0.15)) body.cache_salt = rng.pick(['t1', 't2', '']);
  if (chat) {
    if (rng.chance(0.15)) { body.logprobs = true; if (rng.chance(0.5)) body.top_logprobs = rng.range(0, 5); }
    if (rng.chance(0.1)) body.chat_template_kwargs = { enable_thinking: rng.chance(0.5) };
    if (rng.chance(0.08)) {
      body.tools = [{ type: 'function', function: { name: 'get_weather', description: 'weather',
        parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
    }
  } else if (rng.chance(0.15)) {
    body.logprobs = rng.range(0, 5);
  }
  if (rng.chance(0.25)) {
    body.stream = true;
    if (rng.chance(0.5)) body.stream_options = { include_usage: rng.chance(0.7) };
  }
}

// Changes a valid body: 1 to 3 of drop a field, set one to a weird value, add one.
function mutate(rng, body) {
  const b = clone(body);
  const paths = [];
  const walk = (v, p, depth) => {
    if (depth > 4 || v instanceof Raw || v === null || typeof v !== 'object') return;
    for (const k of Object.keys(v)) { paths.push([...p, k]); walk(v[k], [...p, k], depth + 1); }
  };
  for (let n = rng.range(1, 3); n > 0; n--) {
    paths.length = 0;
    walk(b, [], 0);
    const op = rng.int(3);
    if (paths.length === 0 || op === 2) {
      const target = paths.length > 0 && rng.chance(0.3) ? get(b, rng.pick(paths)) : b;
      if (target !== null && typeof target === 'object' && !(target instanceof Raw) && !Array.isArray(target)) {
        target[rng.pick(['extra', 'max_tokens', 'messages', 'prompt', 'ttl_s', 'priority', 'block_hashes',
          'token_ids', 'epoch', 'session_id', 'descendants', 'cache_control', 'stream', 'content', 'role',
          'add_generation_prompt', 'add_special_tokens', 'tokens', '', '\u00e9'])] = weird(rng);
      }
      continue;
    }
    const p = rng.pick(paths);
    const parent = get(b, p.slice(0, -1));
    if (op === 0) {
      if (Array.isArray(parent)) parent.splice(Number(p[p.length - 1]), 1); else delete parent[p[p.length - 1]];
    } else {
      parent[p[p.length - 1]] = weird(rng);
    }
  }
  return b;
}
function get(v, p) { for (const k of p) v = v[k]; return v; }

// Text-level damage to a serialized body.
function damage(rng, s) {
  return rng.weighted([
    [2, () => s.slice(0, rng.int(s.length))],
    [1, () => ''],
    [1, () => ' \n\t '],
    [1, () => s + rng.pick(['}', ']', 'x', ',', '\u0000', ' {}'])],
    [1, () => '\uFEFF' + s],
    [1, () => s.replace('{', '{"max_tokens":"x","max_tokens":3,')],
    [1, () => s.replace(/"([a-z_]+)":/, '"$1":1,"$1":')],
    [1, () => { const i = rng.int(s.length + 1); return s.slice(0, i) + rng.pick(['"', '\\', '\u0001', '\\u', '\\ud800', 'NaN', 'Infinity', '\'']) + s.slice(i); }],
    [1, () => rng.pick(['[]', 'null', '1', '"str"', 'true', '{}', '[{}]', '{"":""}', '{"a":1}{"b":2}'])],
    [1, () => s.replace(/"([^"\\]*)"/, '\'$1\'')],
    [1, () => { const b = Buffer.from(s); for (let k = rng.range(1, 3); k > 0 && b.length; k--) b[rng.int(b.length)] = 0x80 + rng.int(128); return b; }],
    [1, () => Buffer.concat([Buffer.from(s.slice(0, -1)), Buffer.from([rng.pick([0xc0, 0xff, 0xed, 0xf4]), 0xa0, 0x80]), Buffer.from(s.slice(-1))])],
  ])();
}

// One request of the random phase. Returns { method, path, headers, body, expect, kind, stream, vanish, after }.
function generate(rng, world, i) {
  const a = auth(rng);
  const headers = {};
  if (a !== null) headers.authorization = a;
  const ct = rng.weighted([[12, 'application/json'], [1, null], [1, 'text/plain'], [1, 'application/x-www-form-urlencoded'],
    [1, 'application/json; charset=utf-8'], [1, 'multipart/form-data; boundary=x']]);
  if (ct) headers['content-type'] = ct;
  const admin = isAdmin(a);

  const endpoint = rng.weighted([
    [20, 'chat'], [11, 'completions'], [2, 'models'], [7, 'tokenize'], [4, 'detokenize'],
    [8, 'pin'], [5, 'unpin'], [5, 'evict'], [2, 'flush'], [5, 'state'], [3, 'hipin'], [2, 'hiunpin'],
    [1, 'flush_cache'], [4, 'tool_start'], [4, 'tool_end'], [3, 'kv_meta'], [2, 'health'], [2, 'metrics'],
    [2, 'nowhere'], [5, 'vanish'],
  ]);
  const valid = rng.chance(0.5);
  const req = { i, kind: endpoint, method: 'POST', headers, valid, admin };
  const finish = (path, body, { adminOnly = false, expectValid = [200] } = {}) => {
    req.path = path;
    // Content parts and a null assistant content pass validation, but Qwen3's chat template
    // renders neither (a 400 "chat template: ..."; see the README of tests/fuzz).
    if (expectValid && expectValid.includes(200) && body && typeof body === 'object' && Array.isArray(body.messages) &&
        body.messages.some((m) => typeof m.content !== 'string')) {
      expectValid = [...expectValid, 400];
    }
    let b = body;
    if (b !== undefined && !valid) b = mutate(rng, b);
    req.obj = b;
    let s = b === undefined ? undefined : ser(b);
    if (s !== undefined && !valid && rng.chance(0.3)) s = damage(rng, s);
    if (s !== undefined && Buffer.byteLength(s) > MAX_BODY) s = s.slice(0, MAX_BODY / 4);
    req.body = s;
    if (adminOnly && !admin) req.expect = [401];
    else if (valid && !(req.body instanceof Buffer)) req.expect = expectValid;
    return req;
  };

  switch (endpoint) {
    case 'chat':
    case 'vanish': {
      const body = { messages: messages(rng, world) };
      sampling(rng, body, true);
      if (rng.chance(0.3)) {
        const sid = world.sessionId(rng, valid || endpoint === 'vanish');
        body.session_id = sid;
        const s = typeof sid === 'string' ? world.sessions.get(sid) : null;
        // Continue the conversation (while it stays well inside the 4,096-token pool).
        if (s && s.lastReply !== null && ser(s.messages).length < 6000 && rng.chance(0.7)) {
          body.messages = [...s.messages, { role: 'assistant', content: s.lastReply }, message(rng, 'user')];
        }
      }
      if (endpoint === 'vanish') {
        body.stream = rng.chance(0.8);
        body.max_tokens = rng.range(16, 200);
        body.ignore_eos = true;
        req.vanish = body.stream ? { events: rng.range(1, 4) } : { afterMs: rng.range(2, 60) };
        req.valid = true;
        const r = finish('/v1/chat/completions', body);
        req.body = ser(body);  // never mutated: it must start streaming
        req.obj = body;
        req.expect = undefined;
        return r;
      }
      // Prompts with a pinned message made by the admin: hard pins to undo at the end.
      return finish('/v1/chat/completions', body, { expectValid: [200] });
    }
    case 'completions': {
      const body = {};
      body.prompt = rng.weighted([[5, () => rng.pick(SYSTEMS).slice(0, rng.range(10, 400)) + text(rng)],
        [2, () => world.tokens(rng)], [1, () => [text(rng) || 'x']]])();
      sampling(rng, body, false);
      return finish('/v1/completions', body);
    }
    case 'models': req.method = 'GET'; return finish('/v1/models', undefined);
    case 'health': req.method = 'GET'; return finish('/health', undefined);
    case 'metrics': req.method = 'GET'; return finish('/metrics', undefined);
    case 'tokenize': {
      const body = rng.chance(0.5) ? { prompt: rng.chance(0.5) ? rng.pick(SYSTEMS) : text(rng) }
        : { messages: messages(rng, world), add_generation_prompt: rng.chance(0.5) };
      if (rng.chance(0.3)) body.add_special_tokens = rng.chance(0.5);
      if (body.messages && rng.chance(0.1)) body.chat_template_kwargs = { enable_thinking: false };
      req.collectTokens = true;
      return finish('/tokenize', body);
    }
    case 'detokenize':
      return finish('/detokenize', { tokens: world.tokens(rng) });
    case 'pin':
    case 'unpin':
    case 'hipin':
    case 'hiunpin': {
      const legacy = endpoint === 'hipin' || endpoint === 'hiunpin';
      const form = legacy ? 'block_hashes' : rng.weighted([[5, 'block_hashes'], [2, 'token_ids'], [2, 'messages']]);
      const body = {};
      if (form === 'block_hashes') body.block_hashes = world.hashList(rng, valid);
      else if (form === 'token_ids') body.token_ids = world.tokens(rng);
      else { body.messages = messages(rng, world); if (rng.chance(0.3)) body.add_generation_prompt = rng.chance(0.5); }
      if (form !== 'block_hashes' && rng.chance(0.2)) body.cache_salt = rng.pick(['t1', 't2']);
      if (endpoint === 'pin' || endpoint === 'hipin') {
        if (rng.chance(0.4)) body.ttl_s = rng.pick([0, 1, 2, 60, 365 * 24 * 3600]);
        if (rng.chance(0.3)) body.priority = rng.range(-100, 100);
        req.pin = true;
      }
      const p = { pin: '/cache/pin', unpin: '/cache/unpin', hipin: '/hicache/pin_blocks', hiunpin: '/hicache/unpin_blocks' }[endpoint];
      // A pin may be refused by the budget (400 pin_budget_exceeded).
      return finish(p, body, { adminOnly: true, expectValid: req.pin ? [200, 400] : [200] });
    }
    case 'evict': {
      const body = { block_hashes: world.hashList(rng, valid) };
      if (rng.chance(0.5)) body.descendants = rng.chance(0.5);
      return finish('/cache/evict', body, { adminOnly: true });
    }
    case 'flush':
    case 'flush_cache': {
      const r = finish(endpoint === 'flush' ? '/cache/flush' : '/flush_cache', rng.chance(0.5) ? {} : undefined,
        { adminOnly: true });
      return r;
    }
    case 'state': {
      req.method = 'GET';
      const q = valid ? rng.pick(['', '?detail=tree']) : rng.pick(['?detail=all', '?detail=', '?detail=tree&detail=x',
        '?x=1', '?detail=%74ree', '?detail=tree#frag', '?%ff=%00', '?detail']);
      const r = finish('/cache/state' + q, undefined, { adminOnly: true });
      req.collectHashes = q === '?detail=tree';
      if (q === '?detail=' || q === '?x=1' || q === '?detail' || q === '?detail=tree#frag') req.expect = admin ? undefined : [401];
      return r;
    }
    case 'tool_start':
    case 'tool_end': {
      const sid = world.sessionId(rng);
      const body = { session_id: sid };
      if (endpoint === 'tool_end') {
        const s = typeof sid === 'string' ? world.sessions.get(sid) : null;
        body.epoch = s && s.epoch !== null && rng.chance(0.8) ? s.epoch : rng.pick([0, 1, 2, 99]);
      }
      if (typeof sid === 'string') world.sessionIds.add(sid);
      req.session = sid;
      // Valid or not, the state machine decides (404, 409, 503 on no room): no fixed answer.
      const r = finish('/session/' + endpoint, body, { adminOnly: true, expectValid: undefined });
      if (admin && valid) req.expect = undefined;
      return r;
    }
    case 'kv_meta': {
      req.method = 'GET';
      const sid = world.sessionId(rng);
      const q = typeof sid === 'string' && rng.chance(0.8) ? '?session_id=' + encodeURIComponent(sid)
        : rng.pick(['', '?session_id=', '?session_id=%ZZ', '?session_id=' + 'x'.repeat(300), '?sid=1']);
      const r = finish('/session/kv_meta' + q, undefined, { adminOnly: true, expectValid: undefined });
      if (admin) req.expect = undefined;
      return r;
    }
    default: {  // unknown paths and methods
      const kind = rng.int(3);
      if (kind === 0) {
        req.method = rng.pick(['GET', 'POST']);
        const r = finish(rng.pick(['/', '/v1', '/v1/chat', '/cache', '/cache/pin/', '/health/', '/v2/models', '/%2e%2e/etc',
          '/v1/chat/completions/x', '//health', '/cache/state/']), undefined);
        req.expect = [404];
        return r;
      }
      if (kind === 1) {
        req.method = rng.pick(['PUT', 'DELETE', 'PATCH', 'OPTIONS']);
        const r = finish(rng.pick(['/health', '/v1/chat/completions', '/cache/pin', '/metrics']), undefined);
        req.expect = [405];
        return r;
      }
      req.method = 'GET';
      const r = finish(rng.pick(['/v1/chat/completions', '/tokenize', '/cache/flush']), undefined);
      req.expect = [405];
      return r;
    }
  }
}

// ------------------------------------------------------------------ HTTP client

// One request on the pooled keep-alive agent (or a fresh connection). Resolves
// { status, headers, text, ms } or { error }; never rejects.
function send(port, agent, req) {
  return new Promise((resolve) => {
    const t0 = now();
    const headers = {};
    for (const [k, v] of Object.entries(req.headers ?? {})) if (v !== undefined && v !== null) headers[k] = v;
    let body = req.body;
    if (body !== undefined) {
      body = Buffer.isBuffer(body) ? body : Buffer.from(body);
      headers['content-length'] = body.length;
    } else if (req.method === 'POST') {
      headers['content-length'] = 0;
    }
    let done = false;
    const finish = (v) => { if (!done) { done = true; clearTimeout(timer); resolve({ ...v, ms: now() - t0 }); } };
    const r = http.request({ host: '127.0.0.1', port, method: req.method, path: req.path, headers,
      agent: req.vanish ? false : agent }, (res) => {
      const chunks = [];
      let events = 0;
      res.on('data', (d) => {
        chunks.push(d);
        if (req.vanish?.events !== undefined && res.statusCode === 200) {
          events += (d.toString('latin1').match(/\n\n/g) || []).length;
          if (events >= req.vanish.events) {
            r.destroy();
            finish({ status: res.statusCode, headers: res.headers, text: Buffer.concat(chunks).toString('utf8'), vanished: true });
          }
        }
      });
      res.on('end', () => finish({ status: res.statusCode, headers: res.headers, text: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', (e) => finish({ error: e, status: res.statusCode }));
      res.on('aborted', () => finish({ error: new Error('response aborted'), status: res.statusCode }));
    });
    r.on('error', (e) => finish({ error: e }));
    // A client that goes away before the answer (afterMs), or a request with no answer at all.
    const timer = setTimeout(() => {
      r.destroy();
      if (req.vanish?.afterMs !== undefined) finish({ vanished: true });
      else finish({ error: new Error(`no answer in ${HTTP_TIMEOUT_MS} ms`), hang: true });
    }, req.vanish?.afterMs ?? HTTP_TIMEOUT_MS);
    r.end(body);
  });
}

// Null when `r` is an acceptable answer to `req`, else what is wrong with it.
function judge(req, r) {
  if (r.vanished) return null;
  if (r.error) return `${r.hang ? 'hang' : 'connection error'}: ${r.error.message}`;
  const sessionPath = req.path.startsWith('/session/');
  if (r.status >= 500 && r.status !== 503 && !(r.status === 504 && sessionPath)) return `status ${r.status}`;
  if (r.status >= 400) {
    const problem = errorShape(r.text);
    if (problem) return `status ${r.status}: ${problem}`;
  }
  if (req.expect && !req.expect.includes(r.status)) {
    return `expected ${req.expect.join(' or ')}, got ${r.status}: ${r.text.slice(0, 200)}`;
  }
  if (r.status === 200) {
    const ctype = r.headers['content-type'] ?? '';
    if (ctype.includes('text/event-stream')) return sseProblem(r.text);
    if (req.path === '/metrics') return r.text.includes('strata_') ? null : 'metrics without strata_ series';
    try { JSON.parse(r.text); } catch { return `200 with a body that is not JSON: ${r.text.slice(0, 200)}`; }
  }
  return null;
}

function errorShape(text) {
  let j;
  try { j = JSON.parse(text); } catch { return `error body is not JSON: ${JSON.stringify(text.slice(0, 200))}`; }
  const e = j?.error;
  if (!e || typeof e !== 'object' || typeof e.message !== 'string' || typeof e.type !== 'string' || !('code' in e)) {
    return `error body is not {"error": {"message", "type", "code"}}: ${text.slice(0, 200)}`;
  }
  return null;
}

// A complete event stream: JSON events, no error event, [DONE] last.
function sseProblem(text) {
  const events = text.split('\n\n').filter((e) => e.trim() !== '');
  if (events.length === 0) return 'an empty event stream';
  for (const ev of events) {
    for (const line of ev.split('\n')) {
      if (!line.startsWith('data:')) continue;
      const data = line.slice(5).trim();
      if (data === '[DONE]') continue;
      let j;
      try { j = JSON.parse(data); } catch { return `an event that is not JSON: ${data.slice(0, 200)}`; }
      if (j.error) return `an error event in the stream: ${data.slice(0, 300)}`;
    }
  }
  if (!events[events.length - 1].includes('data: [DONE]')) return `the stream does not end with [DONE]: ${events[events.length - 1].slice(0, 200)}`;
  return null;
}

// The response's first JSON payload (for a stream: the content deltas joined).
function replyText(r) {
  if ((r.headers?.['content-type'] ?? '').includes('text/event-stream')) {
    let out = '';
    for (const line of r.text.split('\n')) {
      if (!line.startsWith('data:') || line.includes('[DONE]')) continue;
      try { out += JSON.parse(line.slice(5)).choices?.[0]?.delta?.content ?? ''; } catch { /* checked elsewhere */ }
    }
    return out;
  }
  try { return JSON.parse(r.text).choices?.[0]?.message?.content ?? null; } catch { return null; }
}

// JSON whose 64-bit integers (block hashes) come back as exact decimal strings.
function parseExact(text) {
  return JSON.parse(text.replace(/(?<=[[,:]\s*)(-?\d{16,})(?=\s*[\],}])/g, '"$1"'));
}

// ------------------------------------------------------------------ raw sockets

// Raw-socket acceptable answers: 2xx, 4xx, 501, 503; errors as JSON.
function rawProblem(r) {
  const ok = (r.status >= 100 && r.status < 300) || (r.status >= 400 && r.status < 500) || r.status === 501 || r.status === 503;
  if (!ok) return `status ${r.status}`;
  if (r.status < 400) return null;
  return errorShape(r.body);
}

const TOKENIZE = '{"prompt":"hello world"}';
const parses = (r) => { try { return JSON.parse(r.body); } catch { return {}; } };

// Valid requests, each with a check of its own answer (for pipelining: which is which).
const VALID = [
  [GET_HEALTH, (r) => parses(r).status === 'ok'],
  ['GET /v1/models HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n', (r) => parses(r).object === 'list'],
  [postRaw('/tokenize', TOKENIZE), (r) => Array.isArray(parses(r).tokens)],
  [postRaw('/detokenize', '{"tokens":[1,2,3]}'), (r) => typeof parses(r).prompt === 'string'],
  [postRaw('/v1/completions', '{"prompt":"hi","max_tokens":1,"temperature":0}'), (r) => parses(r).object === 'text_completion'],
  ['GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n', (r) => r.body.includes('strata_')],
  [`GET /cache/state HTTP/1.1\r\nHost: x\r\nAuthorization: ${ADMIN}\r\n\r\n`, (r) => parses(r).page_size === 16],
  [postRaw('/cache/evict', '{"block_hashes":[1]}', `Authorization: bearer ${KEY}\r\n`), (r) => parses(r).unknown === 1],
  ['POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"pro\r\n13;ext=1\r\nmpt":"hello world"}\r\n0\r\nX-Trailer: y\r\n\r\n',
    (r) => Array.isArray(parses(r).tokens)],
  [postRaw('/tokenize', TOKENIZE, 'Expect: 100-continue\r\n'), (r) => Array.isArray(parses(r).tokens)],
];

// The same through `strata route`: its /cache/state and relayed /cache/evict answer per worker.
const ROUTER_VALID = VALID.map(([bytes, check]) => [bytes,
  bytes.includes('/cache/state') || bytes.includes('/cache/evict') ? (r) => Array.isArray(parses(r).workers) : check]);

// HEAD, then GET on the same connection: the GET's answer must follow the HEAD's header.
const HEAD_CASE = { kind: 'head', heads: 1, bytes: 'HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n' + GET_HEALTH,
  check: (conn, responses) => (responses.length >= 2 && responses[1].status === 200 && VALID[0][1](responses[1]) ? null
    : `${responses.length} answers: ${responses.map((r) => r.status).join(', ')}`) };

// Framings with a required answer; `closes`: the connection must also close promptly.
const FRAMINGS = [
  { name: 'Content-Length: -1', status: 400,
    bytes: `POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n${TOKENIZE}` },
  { name: 'Content-Length: 10000000000 with a short body', status: 413,
    bytes: `POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n\r\n${TOKENIZE}` },
  { name: 'Transfer-Encoding: chunked with a plain body (ended by CRLF)', status: 400,
    bytes: `POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n${TOKENIZE}\r\n` },
  { name: 'Transfer-Encoding: gzip', status: 501,
    bytes: `POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n${TOKENIZE}` },
  { name: 'Transfer-Encoding: gzip, chunked', status: 501,
    bytes: `POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n` },
  { name: 'GARBAGE', status: 400, closes: true, bytes: 'GARBAGE\r\n\r\n' },
  { name: 'Content-Length and Transfer-Encoding', status: 400,
    bytes: `POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 24\r\nTransfer-Encoding: chunked\r\n\r\n${TOKENIZE}` },
  { name: 'a header over the limit', status: 431, bytes: `GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20000)}\r\n\r\n` },
];

// Malformed framings with no single right answer: any acceptable answer, or a close.
const ODD_FRAMINGS = [
  `POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 24\r\n\r\n${TOKENIZE}`,
  `POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n${TOKENIZE}`,
  `POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n${TOKENIZE}`,
  `POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: +24\r\n\r\n${TOKENIZE}`,
  `POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 24, 24\r\n\r\n${TOKENIZE}`,
  `POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 0x18\r\n\r\n${TOKENIZE}`,
  `POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n${TOKENIZE}`,
  `POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n${TOKENIZE}\r\n0\r\n\r\n`,
  `POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"pro\r\n0\r\n\r\n`,
  `POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\nx\r\n0\r\n\r\n`,
  `POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n`,
  `POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\n${TOKENIZE}`,
  `POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n`,
  `POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: GARBAGE\r\n\r\n${TOKENIZE}`,
  `POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n${TOKENIZE}`,
  `POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n${TOKENIZE}`,  // stalls: the body timeout
  'GET /health HTTP/1.1\r\nHost: x\r\n  folded: value\r\n\r\n',
  'GET /health HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n',
  'GET /health HTTP/1.1\nHost: x\n\n',
  'GET /health HTTP/1.1\r\nHost: x\r\nX-Nul: a\0b\r\n\r\n',
  'GET /health HTTP/9.9\r\nHost: x\r\n\r\n',
  'GET /health HTTP/1.0\r\n\r\n',
  'GET /health\r\n\r\n',
  'GET  /health  HTTP/1.1\r\nHost: x\r\n\r\n',
  'GET http://x/health HTTP/1.1\r\nHost: x\r\n\r\n',
  'GET * HTTP/1.1\r\nHost: x\r\n\r\n',
  'CONNECT x:443 HTTP/1.1\r\nHost: x\r\n\r\n',
  'GET /health?%%%%=%% HTTP/1.1\r\nHost: x\r\n\r\n',
  'GET /cache/state?detail=tree HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\nAuthorization: Bearer secret\r\n\r\n',
  `GET /${'a'.repeat(20000)} HTTP/1.1\r\nHost: x\r\n\r\n`,
  `GET /health HTTP/1.1\r\n${'X-A: b\r\n'.repeat(2000)}\r\n`,
  'GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nGARBAGE\r\n\r\n',
  'GET /health HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n',
  '\r\n\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n',
  `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 70\r\n\r\n{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true}`,
  postRaw('/v1/chat/completions', '{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}', 'Connection: close\r\n'),
];

function rawCases(rng, n, valid = VALID) {
  const cases = [];
  for (let i = 0; i < n; i++) {
    const r = rng.f();
    if (r < 0.12) {
      const b = Buffer.alloc(1 + rng.int(300));
      for (let k = 0; k < b.length; k++) b[k] = rng.int(256);
      cases.push({ kind: 'random bytes', bytes: rng.chance(0.5) ? Buffer.concat([b, Buffer.from('\r\n\r\n')]) : b });
    } else if (r < 0.2) {
      const lines = [];
      for (let l = 1 + rng.int(6); l > 0; l--) {
        lines.push(Array.from({ length: rng.int(40) }, () => String.fromCharCode(32 + rng.int(95))).join(''));
      }
      cases.push({ kind: 'random text', bytes: lines.join('\r\n') + (rng.chance(0.5) ? '\r\n\r\n' : '') });
    } else if (r < 0.32) {
      const v = Buffer.from(rng.pick(valid)[0]);
      cases.push({ kind: 'truncated', bytes: v.subarray(0, 1 + rng.int(v.length - 1)) });
    } else if (r < 0.55) {
      const v = Buffer.from(rng.pick(valid)[0]);
      for (let k = 1 + rng.int(3); k > 0; k--) {
        const at = rng.int(v.length);
        v[at] = rng.chance(0.5) ? rng.int(256) : rng.pick([0x0d, 0x0a, 0x20, 0x3a, 0x00, 0x7f]);
      }
      cases.push({ kind: 'mutated', bytes: v });
    } else if (r < 0.63) {
      cases.push({ kind: 'framing', ...rng.pick(FRAMINGS) });
    } else if (r < 0.75) {
      cases.push({ kind: 'odd framing', bytes: rng.pick(ODD_FRAMINGS) });
    } else if (r < 0.88) {
      const k = rng.range(2, 4);
      const picks = Array.from({ length: k }, () => rng.pick(valid));
      cases.push({ kind: 'pipelined', bytes: picks.map((p) => p[0]).join(''), expect: picks.map((p) => p[1]) });
    } else if (r < 0.93) {  // a valid request, then garbage: the first answered, then 400 (or a close)
      const a = rng.pick(valid);
      cases.push({ kind: 'valid + garbage', bytes: a[0] + rng.pick(['GARBAGE\r\n\r\n', 'GET / HTTP/1.1\r\nbad\r\n\r\n', '\u0000\u0001\r\n\r\n']),
        expect: [a[1]], after: 400 });
    } else if (r < 0.94) {
      cases.push(HEAD_CASE);
    } else if (r < 0.96) {  // one request split into small writes
      const a = rng.pick(valid);
      cases.push({ kind: 'split writes', bytes: a[0], expect: [a[1]], piece: rng.range(1, 16) });
    } else {
      const a = rng.pick(valid);
      cases.push({ kind: 'valid', bytes: a[0], expect: [a[1]] });
    }
  }
  return cases;
}

// Runs one raw case on a fresh connection. Returns null, or what went wrong.
async function runRaw(port, c) {
  const conn = new RawConn(port);
  try {
    if (!(await conn.connected)) return `connect failed: ${conn.error?.message}`;
    if (c.piece) {
      const b = Buffer.from(c.bytes);
      for (let off = 0; off < b.length && !conn.closed; off += c.piece) {
        conn.write(b.subarray(off, off + c.piece));
        await sleep(1);
      }
    } else {
      conn.write(c.bytes);
    }
    const heads = c.heads ?? 0;
    const want = (c.expect?.length ?? 1) + (c.after ? 1 : 0) + (c.heads ?? 0);
    const t0 = now();
    // Final answers only: an Expect: 100-continue request also gets a "100 Continue".
    const finals = () => conn.responses(heads).responses.filter((r) => r.status >= 200).length;
    await conn.until(() => conn.closed || conn.responses(heads).bad || finals() >= want, RAW_DEADLINE_MS);
    if (!conn.closed && finals() >= want && !c.closes) {
      await conn.until(() => conn.closed, 50);
    }
    if (c.closes && !conn.closed) await conn.until(() => conn.closed, Math.max(0, t0 + 2000 - now()));
    const { responses, rest, bad } = conn.responses(heads);
    if (bad && c.heads) return `the answer to HEAD carried a body (RFC 9110 §9.3.2): ${JSON.stringify(bad)} where the next response should start`;
    if (bad) return `not an HTTP response: ${JSON.stringify(bad)}`;
    for (const r of responses) {
      const problem = rawProblem(r);
      if (problem) return problem;
    }
    if (responses.length === 0 && !conn.closed) return `no answer and still open after ${RAW_DEADLINE_MS} ms`;
    if (conn.closed && rest > 0 && !c.heads) return `closed in the middle of a response (${rest} bytes)`;
    if (c.status !== undefined && responses[0]?.status !== c.status) {
      return `expected ${c.status}, got ${responses.map((x) => x.status).join(', ') || 'a close'}`;
    }
    if (c.closes && !conn.closed) return 'the connection stayed open 2 s after the error (expected a prompt close)';
    if (c.expect) {
      const final = responses.filter((r) => r.status >= 200);
      if (final.length < c.expect.length) return `${final.length} of ${c.expect.length} answers`;
      for (const [k, check] of c.expect.entries()) {
        const r = final[k];
        let ok = false;
        try { ok = r.status === 200 && check(r); } catch { /* not JSON */ }
        if (!ok) return `answer ${k + 1} is not the answer to request ${k + 1} (${r.status}): ${r.body.slice(0, 120)}`;
      }
      if (c.after && final.length > c.expect.length && final[c.expect.length].status !== c.after) {
        return `after the valid request, expected ${c.after}, got ${final[c.expect.length].status}`;
      }
    }
    if (c.check) return c.check(conn, responses);
    return null;
  } finally {
    conn.destroy();
  }
}

// ------------------------------------------------------------------ one server

// Every violation, with the whole request that caused it, also goes to this file.
const FAILURES = path.join(process.env.STRATA_TEST_DIR, 'fuzz-failures.jsonl');
const violations = [];
function violation(run, what, req) {
  const v = { run, what, req: req ? describe(req) : '' };
  violations.push(v);
  try {
    mkdirSync(path.dirname(FAILURES), { recursive: true });
    const full = req && typeof req === 'object' ? { method: req.method, path: req.path, headers: req.headers,
      body: Buffer.isBuffer(req.body) ? req.body.toString('base64') : req.body, bodyBase64: Buffer.isBuffer(req.body) } : req;
    appendFileSync(FAILURES, JSON.stringify({ seed: OPT.seed, run, what, request: full }) + '\n');
  } catch { /* best effort */ }
  console.log(`  VIOLATION [${run}] ${what}${v.req ? `\n    <- ${v.req}` : ''}`);
}
function describe(req) {
  if (typeof req === 'string') return req;
  const body = req.body === undefined ? '' : Buffer.isBuffer(req.body) ? req.body.toString('latin1') : req.body;
  const auth = req.headers?.authorization !== undefined ? ` [authorization: ${JSON.stringify(req.headers.authorization)}]` : '';
  const ct = req.headers?.['content-type'] !== undefined ? ` [content-type: ${req.headers['content-type']}]` : '';
  return `#${req.i ?? '-'} ${req.method} ${req.path}${auth}${ct} body(${Buffer.byteLength(body)} B): ` +
    JSON.stringify(body.slice(0, 400)) + (body.length > 400 ? '…' : '');
}

function rssKb(pid) {
  try {
    const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)\s+kB/);
    return m ? Number(m[1]) : null;
  } catch { return null; }
}

class Counts {
  constructor() { this.m = new Map(); }
  add(k) { this.m.set(k, (this.m.get(k) ?? 0) + 1); }
  toString() { return [...this.m.entries()].sort((a, b) => String(a[0]).localeCompare(String(b[0]))).map(([k, v]) => `${k}×${v}`).join(' '); }
}

async function runServer(cfg, budget) {
  const name = cfg.name;
  console.log(`[${name}] strata serve ${cfg.args.join(' ')}`);
  const server = await startServer(cfg.args);
  const port = Number(new URL(server.base).port);
  console.log(`[${name}] pid ${server.pid}, ${server.base}`);
  let exited = null;
  server.proc.on('exit', (code, sig) => { exited = code ?? sig; });
  const agent = new http.Agent({ keepAlive: true, maxSockets: OPT.concurrency + 4 });
  const call = (method, p, body, headers = {}) => send(port, agent, {
    method, path: p, body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
    headers: { 'content-type': 'application/json', authorization: ADMIN, ...headers } });
  const stateOf = async () => {
    const r = await call('GET', '/cache/state');
    if (r.status !== 200) throw new Error(`/cache/state answered ${r.status ?? r.error?.message}: ${r.text ?? ''}`);
    return JSON.parse(r.text);
  };
  const world = new World(name);
  const t0 = now();
  try {
    // ---------------------------------------------------------------- 1. regressions
    let passed = 0;
    const check = (ok, what, req) => { if (ok) passed++; else violation(name, `regression: ${what}`, req); };

    // (1) an unauthenticated chat whose system message asks for a hard pin gets soft pins only.
    {
      const body = { messages: [{ role: 'system', content: words(300, 7), cache_control: { type: 'pin' } },
        { role: 'user', content: 'hi' }], max_tokens: 2, temperature: 0 };
      const r = await call('POST', '/v1/chat/completions', body, { authorization: undefined });
      const s = await stateOf();
      check(r.status === 200 && s.device.pinned_blocks > 0 && s.device.soft_pinned_blocks === s.device.pinned_blocks,
        `(1) a client cache_control pin must be soft: status ${r.status}, pinned ${s.device.pinned_blocks}, ` +
        `soft ${s.device.soft_pinned_blocks}`, { method: 'POST', path: '/v1/chat/completions', body: JSON.stringify(body) });
    }
    // (5) the Authorization scheme is case-insensitive.
    for (const scheme of ['bearer', 'BEARER', 'bEaReR']) {
      const r = await call('GET', '/cache/state', undefined, { authorization: `${scheme} ${KEY}` });
      check(r.status === 200, `(5) "${scheme} ${KEY}" on /cache/state answered ${r.status}`);
    }
    // (3) framing, on raw sockets.
    for (const f of FRAMINGS) {
      const problem = await runRaw(port, { kind: 'framing', ...f });
      check(problem === null, `(3) ${f.name}: ${problem}`, JSON.stringify(f.bytes.slice(0, 120)));
    }
    {
      const problem = await runRaw(port, { kind: 'pipelined', bytes: GET_HEALTH + GET_HEALTH, expect: [VALID[0][1], VALID[0][1]] });
      check(problem === null, `(3) two pipelined GET /health in one write: ${problem}`);
    }
    // Not one of the issue's findings: an answer to HEAD carries no body (RFC 9110 §9.3.2),
    // else a keep-alive client reads the body as the next response.
    {
      const problem = await runRaw(port, HEAD_CASE);
      check(problem === null, `HEAD /health then GET /health on one connection: ${problem}`, JSON.stringify(HEAD_CASE.bytes));
    }
    // (4) a `curl -d @file` request: form-encoded Content-Type, a 100 KB JSON chat body.
    {
      const chat = JSON.stringify({ messages: [{ role: 'user', content: words(200, 11) }], max_tokens: 2, temperature: 0 });
      const body = '{' + ' '.repeat(100 * 1024 - chat.length) + chat.slice(1);
      const r = await call('POST', '/v1/chat/completions', body, { 'content-type': 'application/x-www-form-urlencoded', authorization: undefined });
      check(r.status === 200, `(4) a 100 KB form-encoded JSON chat answered ${r.status}: ${(r.text ?? r.error?.message ?? '').slice(0, 200)}`);
    }
    // (2) large input memory: a 2 MB one-word string through /tokenize, twice.
    {
      await call('POST', '/tokenize', { prompt: 'warm up' });
      const before = rssKb(server.pid);
      const big = JSON.stringify({ prompt: 'a'.repeat(2 * 1024 * 1024) });
      let slow = null;
      let failed = null;
      for (let k = 0; k < 2 && !slow && !failed; k++) {
        const r = await send(port, false, { method: 'POST', path: '/tokenize', body: big, headers: { 'content-type': 'application/json' },
          vanish: { afterMs: 10000 } });
        if (r.vanished) slow = 'no answer in 10 s';
        else if (r.status !== 200) failed = `status ${r.status}: ${(r.text ?? r.error?.message ?? '').slice(0, 200)}`;
        else if (r.ms > 5000) slow = `${(r.ms / 1000).toFixed(1)} s`;
      }
      const after = rssKb(server.pid);
      const grew = (after - before) / 1024;
      if (SANITIZED) {
        console.log(`[${name}] regression (2) SKIPPED: no memory bound in a sanitizer build (RSS grew ${grew.toFixed(0)} MB)`);
      } else if (slow) {
        console.log(`[${name}] regression (2) SKIPPED: tokenizing a 2 MB word took ${slow} (the tokenizer fix has not landed?)`);
      } else {
        check(!failed && grew <= 60, `(2) /tokenize of a 2 MB word twice: ${failed ?? `RSS grew ${grew.toFixed(0)} MB (bound 60 MB)`}`);
      }
    }
    // Nothing else pinned yet: let the soft pin of (1) expire so it does not count later.
    console.log(`[${name}] regression: ${passed} checks passed in ${((now() - t0) / 1000).toFixed(1)} s`);

    // Tokens of real prompts, for the token_ids forms.
    for (const sys of SYSTEMS.slice(0, 3)) {
      const r = await call('POST', '/tokenize', { messages: [{ role: 'system', content: sys }], add_generation_prompt: false });
      if (r.status === 200) world.tokenLists.push(JSON.parse(r.text).tokens);
    }
    const rssWarm = rssKb(server.pid);

    // ---------------------------------------------------------------- 2. random requests
    {
      const tp = now();
      const counts = new Counts();
      let sent = 0;
      let vanished = 0;
      let next = 0;
      const deadline = budget.httpMs ? tp + budget.httpMs : Infinity;
      const total = budget.http ?? Infinity;
      const refreshTree = async () => {
        const r = await call('GET', '/cache/state?detail=tree');
        if (r.status === 200) {
          const j = parseExact(r.text);
          world.hashes = j.nodes.flatMap((nd) => nd.block_hashes.map(String)).slice(0, 4000);
        }
      };
      await refreshTree();
      let diagnosed = false;
      const diagnose = async (req) => {
        if (diagnosed) return;
        diagnosed = true;
        const st = await send(port, false, { method: 'GET', path: '/cache/state?detail=tree', headers: { authorization: ADMIN } });
        let summary = st.text ?? st.error?.message;
        try {
          const j = parseExact(st.text);
          const locked = j.nodes.filter((nd) => nd.lock_ref > 0).map((nd) => ({ id: nd.id, tokens: nd.tokens, lock_ref: nd.lock_ref, pin_ref: nd.pin_ref, tiers: nd.tiers }));
          delete j.nodes;
          summary = JSON.stringify({ ...j, locked_nodes: locked });
        } catch { /* as is */ }
        const m = await send(port, false, { method: 'GET', path: '/metrics', headers: {} });
        const metrics = (m.text ?? '').split('\n').filter((l) => /^strata_(requests_running|requests_waiting|scheduler|pages|auto_unpinned|cache_control|http_open)/.test(l)).join('; ');
        console.log(`  [${name}] request #${req.i} unanswered after 10 s (${req.method} ${req.path}); /cache/state: ${summary}\n  metrics: ${metrics}`);
      };
      const worker = async () => {
        while (next < total && now() < deadline && exited === null) {
          const i = next++;
          if (i % 25 === 0) await refreshTree();
          const rng = new Rng((OPT.seed * 1000003 + i * 7919 + (name === 'hicache' ? 17 : 0)) >>> 0);
          const req = generate(rng, world, i);
          // A request still unanswered after 10 s: note the server's state once (for a hang report).
          const slow = setTimeout(() => diagnose(req), 10000);
          const r = await send(port, agent, req);
          clearTimeout(slow);
          sent++;
          if (r.vanished) vanished++;
          counts.add(r.vanished ? (r.status ? `${r.status}-vanished` : 'vanished') : r.error ? 'error' : r.status);
          const problem = judge(req, r);
          if (problem) violation(name, problem, req);
          else if (OPT.verbose) console.log(`  #${i} ${req.method} ${req.path} -> ${r.status ?? (r.vanished ? 'vanished' : r.error?.message)}`);
          learn(world, req, r);
        }
      };
      await Promise.all(Array.from({ length: OPT.concurrency }, worker));
      console.log(`[${name}] http: ${sent} requests in ${((now() - tp) / 1000).toFixed(1)} s (seed ${OPT.seed}, ` +
        `${vanished} clients vanished): ${counts}`);
    }
    if (exited !== null) throw new Error(`the server exited (${exited}) during the random phase: ${server.stderr().slice(-2000)}`);

    // ---------------------------------------------------------------- 3. raw sockets
    {
      const tr = now();
      const rng = new Rng((OPT.seed ^ 0x5eed) + (name === 'hicache' ? 1 : 0));
      const counts = new Counts();
      let done = 0;
      const deadline = budget.rawMs ? tr + budget.rawMs : Infinity;
      const total = budget.raw ?? Infinity;
      const batch = [];
      let next = 0;
      const nextCase = () => {
        if (next >= total || now() >= deadline) return null;
        if (batch.length === 0) batch.push(...rawCases(rng, 256).reverse());
        next++;
        return { i: next - 1, c: batch.pop() };
      };
      await Promise.all(Array.from({ length: 32 }, async () => {
        for (let item = nextCase(); item && exited === null; item = nextCase()) {
          const problem = await runRaw(port, item.c);
          done++;
          counts.add(problem ? 'failed' : item.c.kind.replace(/ /g, '-'));
          if (problem) violation(name, `raw #${item.i} ${item.c.kind}: ${problem}`, JSON.stringify(Buffer.from(item.c.bytes).toString('latin1').slice(0, 300)));
        }
      }));
      console.log(`[${name}] raw: ${done} inputs in ${((now() - tr) / 1000).toFixed(1)} s: ${counts}`);
    }
    if (exited !== null) throw new Error(`the server exited (${exited}) during the raw phase: ${server.stderr().slice(-2000)}`);

    // ---------------------------------------------------------------- 4. the end state
    {
      const te = now();
      const health = await call('GET', '/health');
      if (health.status !== 200) violation(name, `/health answered ${health.status ?? health.error?.message} after the fuzz`);
      const idle = (s) => s.requests.running === 0 && s.requests.waiting === 0 && s.device.request_pages === 0 &&
        s.device.locked_nodes === 0 && (s.host === null || s.host.transfers_in_flight === 0);
      const line = (s) => `running ${s.requests.running}, waiting ${s.requests.waiting}, request_pages ${s.device.request_pages}, ` +
        `locked_nodes ${s.device.locked_nodes}, pinned ${s.device.pinned_blocks} (soft ${s.device.soft_pinned_blocks})` +
        (s.host ? `, host protected ${s.host.protected_pages}, transfers ${s.host.transfers_in_flight}` : '');
      let s = await stateOf();
      for (const end = now() + 5000; !idle(s) && now() < end; s = await stateOf()) await sleep(50);
      if (!idle(s)) violation(name, `not idle 5 s after the fuzz: ${line(s)}`);

      // Sessions left offloaded: bring them back (their host protection goes).
      for (const sid of world.sessionIds) {
        const m = await call('GET', '/session/kv_meta?session_id=' + encodeURIComponent(sid));
        if (m.status !== 200) continue;
        const meta = JSON.parse(m.text);
        if (meta.state === 'OFFLOADED') {
          const r = await call('POST', '/session/tool_end', { session_id: sid, epoch: meta.epoch });
          if (r.status !== 200) violation(name, `tool_end of offloaded session ${sid} (epoch ${meta.epoch}) answered ${r.status}: ${r.text}`);
        }
      }
      // Undo every pin the admin made (extra unpins of a block with no pin change nothing).
      for (const u of world.unpins) {
        const r = await call('POST', u.path, u.body);
        // A prefix the chat template cannot render alone was never pinned either.
        const unrenderable = r.status === 400 && /"chat template: /.test(r.text ?? '');
        if (r.status !== 200 && !unrenderable) violation(name, `unpin replay answered ${r.status}: ${(r.text ?? r.error?.message ?? '').slice(0, 200)}`, { method: 'POST', path: u.path, body: u.body });
      }
      // Client pins are soft with a TTL of at most CLIENT_PIN_TTL_S: they expire by themselves.
      s = await stateOf();
      for (const end = now() + (CLIENT_PIN_TTL_S + 4) * 1000; s.device.pinned_blocks > 0 && now() < end; s = await stateOf()) await sleep(100);
      if (s.device.pinned_blocks !== 0 || s.device.soft_pinned_blocks !== 0) {
        const tree = parseExact((await call('GET', '/cache/state?detail=tree')).text);
        const pinned = tree.nodes.filter((nd) => nd.pin_ref > 0 || (Array.isArray(nd.pin_counts) && nd.pin_counts.some((c) => c > 0)));
        violation(name, `${s.device.pinned_blocks} blocks still pinned (${s.device.soft_pinned_blocks} soft) after unpinning ` +
          `everything the fuzzer pinned (${world.unpins.length} unpins) and ${CLIENT_PIN_TTL_S + 4} s for client pins to expire; ` +
          `pinned nodes: ${JSON.stringify(pinned.slice(0, 3))}`);
      }
      if (s.host && s.host.protected_pages !== 0 && s.device.pinned_blocks === 0) {
        violation(name, `host.protected_pages is ${s.host.protected_pages} with no pin and no offloaded session left`);
      }
      if (!idle(s)) violation(name, `not idle at the end: ${line(s)}`);
      const rssEnd = rssKb(server.pid);
      const bound = 2 * rssWarm + 200 * 1024;
      if (rssEnd > bound && !SANITIZED) violation(name, `RSS ${(rssEnd / 1024).toFixed(0)} MB at the end, over 2 × ${(rssWarm / 1024).toFixed(0)} MB + 200 MB`);
      const faults = server.stderr().split('\n').filter((l) => /handler fault|\berror\b.*\b(fault|exception|terminate)|AddressSanitizer|runtime error|terminate called|Assertion/i.test(l));
      for (const l of faults.slice(0, 5)) violation(name, `server log: ${l.slice(0, 300)}`);
      console.log(`[${name}] end: ${line(s)}; RSS ${(rssWarm / 1024).toFixed(0)} MB after warm-up, ${(rssEnd / 1024).toFixed(0)} MB at the end; ` +
        `${world.unpins.length} unpins replayed; checked in ${((now() - te) / 1000).toFixed(1)} s`);
    }
  } finally {
    agent.destroy();
    const code = await stopServer(server);
    if (code !== 0) violation(name, `the server did not exit 0 on SIGTERM (${code}); stderr: ${server.stderr().slice(-1500)}`);
    console.log(`[${name}] done in ${((now() - t0) / 1000).toFixed(1)} s`);
  }
}

// `strata route` in front of two workers (issue 28): the router's own regressions (an agent
// loop echoed as the openai SDK echoes it, tool-call arguments in every form, decimal-string
// hashes, pins of unknown hashes, a non-UTF-8 x-session-id, wrongly typed fields, a large
// refused body), then the random and raw phases against the router, then its end state:
// alive, workers idle, no pin mark the workers do not hold, memory within a bound, clean exit.
async function runRouter(cfg, budget) {
  const name = cfg.name;
  const workers = [];
  for (let k = 0; k < 2; k++) {
    workers.push(await startServer([...cfg.args, '--kv-events-endpoint', 'tcp://127.0.0.1:*',
      '--kv-events-replay-endpoint', 'tcp://127.0.0.1:*']));
  }
  const router = await startRouter(['--admin-api-key', KEY, '--load-poll-ms', '100',
    '--http-header-timeout-s', '1', '--http-body-timeout-s', '1', ...workers.flatMap((w) => ['--worker', w.base])]);
  const port = Number(new URL(router.base).port);
  console.log(`[${name}] strata route pid ${router.proc.pid}, ${router.base}, workers ${workers.map((w) => w.base).join(' ')}`);
  let exited = null;
  router.proc.on('exit', (code, sig) => { exited = code ?? sig; });
  const agent = new http.Agent({ keepAlive: true, maxSockets: OPT.concurrency + 4 });
  const callAt = (p0, method, p, body, headers = {}) => send(p0, agent, {
    method, path: p, body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
    headers: { 'content-type': 'application/json', authorization: ADMIN, ...headers } });
  const call = (...a) => callAt(port, ...a);
  const workerPort = (w) => Number(new URL(w.base).port);
  const marks = async () => {
    const r = await call('GET', '/cache/state');
    return JSON.parse(r.text).index.workers;
  };
  const world = new World(name);
  const t0 = now();
  try {
    for (const end = now() + 20000; now() < end; await sleep(100)) {
      const w = await call('GET', '/workers');
      if (w.status === 200 && JSON.parse(w.text).workers.every((x) => x.joined && x.reachable)) break;
    }
    // ---------------------------------------------------------------- 1. regressions
    let passed = 0;
    const check = (ok, what, req) => { if (ok) passed++; else violation(name, `regression: ${what}`, req); };
    const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
    const loop = (args, content) => ({ tools, max_tokens: 2, temperature: 0, messages: [
      { role: 'system', content: SYSTEMS[4] }, { role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: args } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '{"temp_c": 18}' }] });
    for (const [what, body] of [
      ['content null, compact string arguments', loop('{"city":"Paris"}', null)],
      ['content null, spaced string arguments', loop('{"city": "Paris"}', null)],
      ['content null, object arguments', loop({ city: 'Paris' }, null)],
      ['content "", string arguments', loop('{"city":"Paris"}', '')],
    ]) {
      const r = await call('POST', '/v1/chat/completions', body);
      const direct = await callAt(workerPort(workers[0]), 'POST', '/v1/chat/completions', body);
      const tokens = (x) => { try { return JSON.parse(x.text).usage.prompt_tokens; } catch { return null; } };
      check(r.status === 200 && direct.status === 200 && tokens(r) === tokens(direct),
        `an agent loop (${what}) through the router: ${r.status} (${tokens(r)} prompt tokens), directly ${direct.status} (${tokens(direct)}): ${(r.text ?? '').slice(0, 200)}`,
        { method: 'POST', path: '/v1/chat/completions', body: JSON.stringify(body) });
    }
    {
      const before = (await marks()).reduce((n, w) => n + w.pinned_blocks, 0);
      for (const body of [{ block_hashes: ['18446744073709551615', '-2', '12345678901234567'] }, { block_hashes: [7, 8, 9] }]) {
        const r = await call('POST', '/cache/pin', body);
        check(r.status === 200, `a pin of unknown hashes ${JSON.stringify(body)} answered ${r.status}: ${(r.text ?? '').slice(0, 200)}`);
      }
      const after = (await marks()).reduce((n, w) => n + w.pinned_blocks, 0);
      check(after === before, `pins of unknown hashes grew the router's pin marks from ${before} to ${after}`);
    }
    for (const [p, body] of [
      ['/cache/pin', { messages: [{ role: 'user', content: 'x' }], add_generation_prompt: 'yes' }],
      ['/cache/pin', { block_hashes: ['1x'] }],
      ['/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], stream: 1 }],
      ['/v1/completions', { prompt: [1, -1] }],
    ]) {
      const r = await call('POST', p, body);
      let type = null;
      try { type = JSON.parse(r.text).error.type; } catch { /* checked below */ }
      check(r.status === 400 && type === 'invalid_request_error', `${p} ${JSON.stringify(body)}: ${r.status} ${(r.text ?? '').slice(0, 200)}`);
    }
    {
      const chat = '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}';
      const raw = Buffer.concat([Buffer.from('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nx-session-id: '),
        Buffer.from([0xff, 0xc0, 0x80]), Buffer.from(`\r\nContent-Length: ${chat.length}\r\n\r\n${chat}`)]);
      const problem = await runRaw(port, { kind: 'framing', name: 'non-UTF-8 x-session-id', status: 400, bytes: raw });
      check(problem === null, `a non-UTF-8 x-session-id: ${problem}`);
    }
    {
      const idx = async () => JSON.parse((await call('GET', '/cache/state')).text).index.predicted_entries;
      const before = await idx();
      const r = await send(port, false, { method: 'POST', path: '/v1/chat/completions', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ messages: [{ role: 'user', content: words(400000, 3) }], max_tokens: 2 }) });
      const after = await idx();
      check(r.status === 400 && after <= before, `a 2 MB prompt over the workers' limit: ${r.status}, predicted entries ${before} -> ${after}`);
    }
    console.log(`[${name}] regression: ${passed} checks passed in ${((now() - t0) / 1000).toFixed(1)} s`);
    for (const sys of SYSTEMS.slice(0, 3)) {
      const r = await call('POST', '/tokenize', { messages: [{ role: 'system', content: sys }], add_generation_prompt: false });
      if (r.status === 200) world.tokenLists.push(JSON.parse(r.text).tokens);
    }
    const rssWarm = rssKb(router.proc.pid);

    // ---------------------------------------------------------------- 2. random requests
    {
      const tp = now();
      const counts = new Counts();
      let sent = 0;
      let next = 0;
      const deadline = budget.httpMs ? tp + budget.httpMs : Infinity;
      const total = budget.http ?? Infinity;
      const refreshTree = async () => {
        const r = await call('GET', '/cache/state?detail=tree');
        if (r.status !== 200) return;
        const j = parseExact(r.text);
        world.hashes = j.workers.flatMap((w) => (w.state?.nodes ?? []).flatMap((nd) => nd.block_hashes.map(String))).slice(0, 4000);
      };
      await refreshTree();
      const worker = async () => {
        while (next < total && now() < deadline && exited === null) {
          const i = next++;
          if (i % 25 === 0) await refreshTree();
          const rng = new Rng((OPT.seed * 1000003 + i * 7919 + 29) >>> 0);
          const req = generate(rng, world, i);
          const r = await send(port, agent, req);
          sent++;
          counts.add(r.vanished ? (r.status ? `${r.status}-vanished` : 'vanished') : r.error ? 'error' : r.status);
          // The router answers for endpoints of its own (the seed's /hicache paths are not
          // among them): only the rules every answer follows are checked, not the status.
          const problem = judge({ ...req, expect: undefined }, r);
          if (problem) violation(name, problem, req);
          learn(world, req, r);
        }
      };
      await Promise.all(Array.from({ length: OPT.concurrency }, worker));
      console.log(`[${name}] http: ${sent} requests in ${((now() - tp) / 1000).toFixed(1)} s: ${counts}`);
    }
    if (exited !== null) throw new Error(`the router exited (${exited}) during the random phase: ${router.stderr().slice(-2000)}`);

    // ---------------------------------------------------------------- 3. raw sockets
    {
      const tr = now();
      const rng = new Rng((OPT.seed ^ 0x5eed) + 2);
      const counts = new Counts();
      const cases = rawCases(rng, budget.raw ?? 200, ROUTER_VALID);
      let next = 0;
      await Promise.all(Array.from({ length: 16 }, async () => {
        while (next < cases.length && exited === null) {
          const i = next++;
          const problem = await runRaw(port, cases[i]);
          counts.add(problem ? 'failed' : cases[i].kind.replace(/ /g, '-'));
          if (problem) violation(name, `raw #${i} ${cases[i].kind}: ${problem}`, JSON.stringify(Buffer.from(cases[i].bytes).toString('latin1').slice(0, 300)));
        }
      }));
      console.log(`[${name}] raw: ${cases.length} inputs in ${((now() - tr) / 1000).toFixed(1)} s: ${counts}`);
    }
    if (exited !== null) throw new Error(`the router exited (${exited}) during the raw phase: ${router.stderr().slice(-2000)}`);

    // ---------------------------------------------------------------- 4. the end state
    {
      const health = await call('GET', '/health');
      if (health.status !== 200) violation(name, `/health answered ${health.status ?? health.error?.message} after the fuzz`);
      for (const u of world.unpins) {
        if (u.path === '/cache/unpin') await call('POST', u.path, u.body);
      }
      await sleep((CLIENT_PIN_TTL_S + 2) * 1000);
      const index = await marks();
      const ws = JSON.parse((await call('GET', '/workers')).text).workers;
      for (const w of workers) {
        const st = JSON.parse((await callAt(workerPort(w), 'GET', '/cache/state')).text);
        if (st.requests.running !== 0 || st.requests.waiting !== 0) violation(name, `worker ${w.base} not idle: ${JSON.stringify(st.requests)}`);
        const id = ws.find((x) => x.url === w.base)?.id;
        const mine = index.find((x) => x.worker === id)?.pinned_blocks ?? 0;
        if (mine > st.device.pinned_blocks) {
          violation(name, `the router marks ${mine} blocks pinned on ${w.base}, which pins ${st.device.pinned_blocks}`);
        }
      }
      const rssEnd = rssKb(router.proc.pid);
      if (rssEnd > 2 * rssWarm + 200 * 1024 && !SANITIZED) violation(name, `router RSS ${(rssEnd / 1024).toFixed(0)} MB at the end, over 2 × ${(rssWarm / 1024).toFixed(0)} MB + 200 MB`);
      const faults = router.stderr().split('\n').filter((l) => /handler fault|AddressSanitizer|runtime error|terminate called|Assertion/i.test(l));
      for (const l of faults.slice(0, 5)) violation(name, `router log: ${l.slice(0, 300)}`);
      console.log(`[${name}] end: router RSS ${(rssWarm / 1024).toFixed(0)} MB after warm-up, ${(rssEnd / 1024).toFixed(0)} MB at the end; ` +
        `pin marks ${index.map((x) => x.pinned_blocks).join('/')}`);
    }
  } finally {
    agent.destroy();
    const code = await stopServer({ ...router, pid: router.proc.pid });
    if (code !== 0) violation(name, `the router did not exit 0 on SIGTERM (${code}); stderr: ${router.stderr().slice(-1500)}`);
    for (const w of workers) await stopServer(w);
    console.log(`[${name}] done in ${((now() - t0) / 1000).toFixed(1)} s`);
  }
}

// What a response teaches the fuzzer: token lists, sessions, and the pins to undo.
function learn(world, req, r) {
  const ok = r.status === 200 && !r.error;
  const unknown = r.vanished || r.error;
  if (req.collectTokens && ok) {
    try {
      const t = JSON.parse(r.text).tokens;
      if (Array.isArray(t) && t.length > 0 && t.length < 4000 && world.tokenLists.length < 24) world.tokenLists.push(t);
    } catch { /* judged elsewhere */ }
  }
  // Sessions: the conversation so far, and the epoch of its last tool_start.
  if (req.path === '/v1/chat/completions' && ok && req.obj && typeof req.obj.session_id === 'string') {
    const reply = replyText(r);
    world.sessions.set(req.obj.session_id, { ...(world.sessions.get(req.obj.session_id) ?? { epoch: null }),
      messages: req.obj.messages, lastReply: typeof reply === 'string' ? reply : null });
    world.sessionIds.add(req.obj.session_id);
  }
  if (!req.admin) return;
  // The admin's pins (the cache-control API and the seed's path): the same body unpins them.
  if (req.pin && (ok || unknown) && typeof req.body === 'string') {
    world.unpins.push({ path: req.path === '/hicache/pin_blocks' ? '/hicache/unpin_blocks' : '/cache/unpin', body: req.body });
  }
  // A chat of the admin with a cache_control message: pins through the last such message.
  if (req.path === '/v1/chat/completions' && (ok || unknown) && req.obj && Array.isArray(req.obj.messages)) {
    const msgs = req.obj.messages;
    let through = -1;
    msgs.forEach((m, k) => { if (m && typeof m === 'object' && m.cache_control != null) through = k; });
    if (through >= 0) {
      const body = { messages: msgs.slice(0, through + 1) };
      for (const f of ['tools', 'chat_template_kwargs', 'cache_salt']) if (req.obj[f] != null) body[f] = req.obj[f];
      world.unpins.push({ path: '/cache/unpin', body: ser(body) });
    }
  }
  if (req.path === '/session/tool_start' && ok && typeof req.session === 'string') {
    try {
      const e = JSON.parse(r.text).epoch;
      const s = world.sessions.get(req.session) ?? { messages: [], lastReply: null };
      world.sessions.set(req.session, { ...s, epoch: e });
    } catch { /* judged elsewhere */ }
  }
}

// Stops a server by its pid (SIGTERM); one still running after `ms` is killed.
async function stopServer(server, ms = 20000) {
  if (server.proc.exitCode !== null || server.proc.signalCode !== null) return server.proc.exitCode ?? server.proc.signalCode;
  let timer;
  const killed = new Promise((resolve) => {
    timer = setTimeout(() => {
      try { process.kill(server.pid, 'SIGKILL'); } catch { /* gone */ }
      resolve(`still running ${ms / 1000} s after SIGTERM (killed)`);
    }, ms);
  });
  try { return await Promise.race([server.stop(), killed]); } finally { clearTimeout(timer); }
}

// ------------------------------------------------------------------ main

const COMMON = ['--admin-api-key', KEY, '--max-client-pin-ttl-s', String(CLIENT_PIN_TTL_S),
  '--http-header-timeout-s', '1', '--http-body-timeout-s', '1', '--kv-cache-tokens', '4096',
  '--default-max-tokens', '16'];
const RUNS = [
  { name: 'admin', args: [...COMMON], http: 900, raw: 600 },
  { name: 'hicache', args: [...COMMON, '--enable-hierarchical-cache', '--hicache-ratio', '2'], http: 600, raw: 400 },
  { name: 'router', router: true, args: [...COMMON], http: 500, raw: 200 },
].filter((r) => !OPT.only || r.name === OPT.only);

const started = now();
rmSync(FAILURES, { force: true });
console.log(`fuzz_server: ${OPT.quick ? 'quick' : `${OPT.seconds} s`} run, seed ${OPT.seed}, ${process.env.STRATA_BIN}`);
for (const run of RUNS) {
  let budget;
  if (OPT.quick) {
    const scale = SANITIZED ? 0.3 : 1;
    budget = { http: OPT.requests ?? Math.round(run.http * scale), raw: OPT.raw ?? Math.round(run.raw * scale) };
  } else {
    const share = OPT.seconds * 1000 / RUNS.length;
    budget = { httpMs: share * 0.7, rawMs: share * 0.2, http: OPT.requests ?? undefined, raw: OPT.raw ?? undefined };
  }
  try {
    await (run.router ? runRouter(run, budget) : runServer(run, budget));
  } catch (e) {
    violation(run.name, `aborted: ${e.stack ?? e}`);
  }
}
const secs = ((now() - started) / 1000).toFixed(1);
if (violations.length > 0) {
  console.log(`\nFAILED: ${violations.length} violations in ${secs} s (seed ${OPT.seed}; rerun: node tests/fuzz/fuzz_server.mjs --seed ${OPT.seed}${OPT.quick ? '' : ` --seconds ${OPT.seconds}`})`);
  for (const v of violations.slice(0, 25)) console.log(`- [${v.run}] ${v.what}${v.req ? `\n    <- ${v.req}` : ''}`);
  process.exit(1);
}
console.log(`\nPASSED in ${secs} s (seed ${OPT.seed})`);
process.exit(0);
