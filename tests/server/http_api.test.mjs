// Black-box tests of `strata serve` over HTTP, with the official `openai` npm client and
// plain fetch. Run by CTest: node --test tests/server/http_api.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { createRequire } from 'node:module';
import { execFileSync } from 'node:child_process';
import { startServer, words, SOURCE_DIR } from './server_harness.mjs';

const require = createRequire(path.join(SOURCE_DIR, 'tools/js/package.json'));
const OpenAI = require('openai').default ?? require('openai');

const ADMIN = { authorization: 'Bearer test-admin-key' };
let server;
let client;

before(async () => {
  server = await startServer(['--kv-cache-tokens', '4096', '--admin-api-key', 'test-admin-key',
    '--max-running-requests', '40']);
  client = new OpenAI({ baseURL: server.base + '/v1', apiKey: 'unused' });
});

after(async () => {
  if (server) await server.stop();
});

async function state() {
  const r = await server.get('/cache/state', ADMIN);
  assert.equal(r.status, 200, r.text);
  return r.json;
}

async function settle() {
  // Waits until no request runs and no request holds pages.
  for (let i = 0; i < 200; i++) {
    const s = await state();
    if (s.requests.running === 0 && s.requests.waiting === 0 && s.device.request_pages === 0) return s;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.fail('requests did not settle');
}

async function complete(prompt, extra = {}) {
  const r = await server.post('/v1/completions', { prompt, max_tokens: 4, temperature: 0, ...extra });
  assert.equal(r.status, 200, r.text);
  return r.json;
}

test('openai client: chat, non-streaming, with usage', async () => {
  const r = await client.chat.completions.create({
    model: 'tiny-qwen3', messages: [{ role: 'user', content: 'Say hello.' }], max_tokens: 6, temperature: 0,
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 0);
  assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 6);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
  assert.deepEqual(Object.keys(r.usage.cached_tokens_details).sort(), ['device', 'host', 'storage']);
});

test('openai client: chat streaming with include_usage', async () => {
  const stream = await client.chat.completions.create({
    model: 'tiny-qwen3', messages: [{ role: 'user', content: 'Count to three.' }], max_tokens: 8,
    temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let usage = null;
  let finish = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta?.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.ok(usage, 'usage chunk');
  assert.ok(usage.completion_tokens > 0);
  assert.ok(['stop', 'length'].includes(finish));
  // The same request without streaming gives the same greedy text.
  const r = await client.chat.completions.create({
    model: 'tiny-qwen3', messages: [{ role: 'user', content: 'Count to three.' }], max_tokens: 8, temperature: 0,
  });
  assert.equal(r.choices[0].message.content, text);
});

test('openai client: completions, streaming and not, logprobs', async () => {
  const r = await client.completions.create({ model: 'x', prompt: 'The quick brown fox', max_tokens: 5,
    temperature: 0, logprobs: 2 });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices[0].logprobs.tokens.length, r.usage.completion_tokens);
  for (const lp of r.choices[0].logprobs.token_logprobs) assert.ok(lp <= 0);
  const stream = await client.completions.create({ model: 'x', prompt: 'The quick brown fox', max_tokens: 5,
    temperature: 0, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, r.choices[0].text);
  const chat = await client.chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'hi' }],
    max_tokens: 3, temperature: 0, logprobs: true, top_logprobs: 3 });
  const content = chat.choices[0].logprobs.content;
  assert.equal(content.length, chat.usage.completion_tokens);
  assert.equal(content[0].top_logprobs.length, 3);
  assert.ok(content[0].top_logprobs[0].logprob >= content[0].top_logprobs[2].logprob);
});

test('models, health, tokenize and detokenize', async () => {
  const models = await client.models.list();
  assert.equal(models.data.length, 1);
  assert.equal((await server.get('/health')).json.status, 'ok');
  const t = await server.post('/tokenize', { prompt: 'Hello world' });
  assert.equal(t.status, 200);
  assert.equal(t.json.count, t.json.tokens.length);
  const d = await server.post('/detokenize', { tokens: t.json.tokens });
  assert.equal(d.json.prompt, 'Hello world');
  const m = await server.post('/tokenize', { messages: [{ role: 'user', content: 'Hi' }] });
  assert.equal(m.status, 200);
  const text = (await server.post('/detokenize', { tokens: m.json.tokens })).json.prompt;
  assert.equal(text, '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n');
  const metrics = await server.get('/metrics');
  assert.match(metrics.text, /strata_kv_pages\{state="free"\}/);
  assert.match(metrics.text, /strata_time_to_first_token_seconds_bucket/);
});

test('a repeated prompt is served from the cache with the same greedy output', async () => {
  const prompt = words(300, 11);
  const a = await complete(prompt);
  const b = await complete(prompt);
  assert.ok(b.usage.prompt_tokens_details.cached_tokens > 0);
  assert.equal(b.usage.prompt_tokens_details.cached_tokens, b.usage.cached_tokens_details.device);
  assert.ok(b.usage.prompt_tokens_details.cached_tokens >= Math.floor((b.usage.prompt_tokens - 1) / 16) * 16);
  assert.equal(b.choices[0].text, a.choices[0].text);
});

test('a pinned prefix survives a flood; unpinned it does not', async () => {
  const vip = words(600, 21);
  const ids = (await server.post('/tokenize', { prompt: vip })).json.tokens;
  await complete(vip);
  const pin = await server.post('/cache/pin', { token_ids: ids }, ADMIN);
  assert.equal(pin.status, 200, pin.text);
  const full = Math.floor(ids.length / 16);
  assert.equal(pin.json.pinned_count, full);
  const flood = async (seed0) => {
    for (let i = 0; i < 16; i++) await complete(words(400, seed0 + i));
  };
  await flood(1000);
  const s = await state();
  assert.ok(s.evictions.evicted_pages_total > 0, 'the flood evicted');
  const hit = await complete(vip);
  assert.ok(hit.usage.prompt_tokens_details.cached_tokens >= Math.floor((ids.length - 1) / 16) * 16,
    `cached ${hit.usage.prompt_tokens_details.cached_tokens} of ${ids.length}`);
  const unpin = await server.post('/cache/unpin', { token_ids: ids }, ADMIN);
  assert.equal(unpin.json.unpinned_count, full);
  await flood(2000);
  const miss = await complete(vip);
  assert.equal(miss.usage.prompt_tokens_details.cached_tokens, 0);
});

test('evict with descendants and flush do what they say; pins survive flush', async () => {
  await server.post('/cache/flush', {}, ADMIN);
  const base = words(200, 31);
  const ids = (await server.post('/tokenize', { prompt: base })).json.tokens;
  await complete(base);
  await complete(base + ' ' + words(100, 32));
  // A router computes the hashes itself (docs/block-hashes.md); they match the server's.
  const out = execFileSync(process.env.STRATA_BIN, ['block-hashes', '--page-size', '16',
    ...ids.slice(0, 32).map(String)]).toString();
  const [h0, h1] = JSON.parse(out.replace(/(-?\d{16,})/g, '"$1"')).block_hashes;
  const tree = (await server.getExact('/cache/state?detail=tree', ADMIN)).json;
  const all = new Set(tree.nodes.flatMap((n) => n.block_hashes));
  assert.ok(all.has(h0) && all.has(h1), 'router-side hashes match the server');
  const total = all.size;
  // Evict the second block and everything below it: only the first block stays.
  const ev = await server.post('/cache/evict', { block_hashes: [h1], descendants: true }, ADMIN);
  assert.equal(ev.status, 200, ev.text);
  assert.equal(ev.json.evicted_blocks, total - 1);
  const left = (await server.getExact('/cache/state?detail=tree', ADMIN)).json.nodes.flatMap((n) => n.block_hashes);
  assert.deepEqual(left, [h0]);
  // Fill again, pin the first block, flush: only the pinned block stays.
  await complete(base);
  const pin = await server.post('/cache/pin', { block_hashes: [h0] }, ADMIN);
  assert.equal(pin.json.pinned_count, 1);
  const fl = await server.post('/cache/flush', {}, ADMIN);
  assert.equal(fl.status, 200);
  assert.equal(fl.json.pinned_preserved, 1);
  assert.ok(fl.json.evicted.device > 0);
  const after2 = (await server.getExact('/cache/state?detail=tree', ADMIN)).json;
  assert.deepEqual(after2.nodes.flatMap((n) => n.block_hashes), [h0]);
  const legacy = await server.post('/hicache/unpin_blocks', { block_hashes: [h0] }, ADMIN);
  assert.equal(legacy.json.unpinned_count, 1);
  assert.equal((await server.post('/flush_cache', {}, ADMIN)).status, 200);
  assert.equal((await state()).device.cached_pages, 0);
});

test('cache_salt isolates tenants', async () => {
  const p = words(100, 41);
  await complete(p, { cache_salt: 'tenant-a' });
  const b = await complete(p, { cache_salt: 'tenant-b' });
  assert.equal(b.usage.prompt_tokens_details.cached_tokens, 0);
  const a2 = await complete(p, { cache_salt: 'tenant-a' });
  assert.ok(a2.usage.prompt_tokens_details.cached_tokens > 0);
});

test('cache_control on a message pins the prefix through it', async () => {
  const system = words(300, 51);
  const r = await server.post('/v1/chat/completions', {
    messages: [{ role: 'system', content: system, cache_control: { type: 'pin', ttl_s: 600 } },
      { role: 'user', content: 'hi' }], max_tokens: 2, temperature: 0,
  });
  assert.equal(r.status, 200, r.text);
  const s = await state();
  assert.ok(s.device.soft_pinned_blocks > 0);
  await server.post('/cache/unpin', { messages: [{ role: 'system', content: system }] }, ADMIN);
});

test('the admin key guards cache control', async () => {
  assert.equal((await server.get('/cache/state')).status, 401);
  assert.equal((await server.post('/cache/flush', {})).status, 401);
  assert.equal((await server.post('/cache/flush', {}, { authorization: 'Bearer wrong' })).status, 401);
});

test('pins beyond --max-pinned-ratio are refused and change nothing', async () => {
  const cap = (await state()).device.capacity_pages;
  // Fill the pool (4096 tokens) with distinct prompts, then try to pin everything cached.
  for (let i = 0; i < 12; i++) await complete(words(330, 900 + i));
  const before = await state();
  const hashes = (await server.getExact('/cache/state?detail=tree', ADMIN)).json.nodes.flatMap((n) => n.block_hashes);
  const budget = Math.floor(cap * 0.8);
  assert.ok(hashes.length - before.device.pinned_blocks > budget, `only ${hashes.length} cached blocks`);
  const r = await server.post('/cache/pin', { block_hashes: hashes }, ADMIN);
  assert.equal(r.status, 400, r.text);
  assert.match(r.json.error.message, /max-pinned-ratio/);
  assert.equal((await state()).device.pinned_blocks, before.device.pinned_blocks);
  // Within the budget it is accepted.
  const ok = await server.post('/cache/pin', { block_hashes: hashes.slice(0, 10) }, ADMIN);
  assert.equal(ok.status, 200);
  assert.equal(ok.json.pinned_count, 10);
  await server.post('/cache/unpin', { block_hashes: hashes.slice(0, 10) }, ADMIN);
});

test('32 concurrent streaming clients, some disconnecting: no page leaks', async () => {
  const tasks = [];
  for (let i = 0; i < 32; i++) {
    tasks.push((async () => {
      const ctrl = new AbortController();
      const r = await fetch(server.base + '/v1/chat/completions', {
        method: 'POST', headers: { 'content-type': 'application/json' }, signal: ctrl.signal,
        body: JSON.stringify({ messages: [{ role: 'user', content: words(30 + i, 700 + i) }],
          max_tokens: i % 2 === 0 ? 400 : 12, stream: true, temperature: 0.7, seed: i }),
      });
      assert.equal(r.status, 200);
      const reader = r.body.getReader();
      let chunks = 0;
      let text = '';
      try {
        for (;;) {
          const { done, value } = await reader.read();
          if (done) break;
          text += new TextDecoder().decode(value);
          chunks++;
          if (i % 2 === 0 && chunks >= 3) { ctrl.abort(); return 'cancelled'; }
        }
      } catch (e) {
        if (e.name === 'AbortError') return 'cancelled';
        throw e;
      }
      assert.match(text, /data: \[DONE\]/);
      return 'done';
    })());
  }
  const results = await Promise.all(tasks);
  assert.equal(results.filter((x) => x === 'done').length, 16);
  const s = await settle();
  assert.equal(s.device.request_pages, 0);
  assert.equal(s.device.used_pages, s.device.cached_pages, 'every used page is in the tree');
  assert.equal((await server.get('/health')).status, 200);
});

test('a 16-turn session keeps every previous prompt and completion cached', async () => {
  const system = words(1800, 61);
  const messages = [{ role: 'system', content: system }];
  let prev = null;
  for (let turn = 0; turn < 16; turn++) {
    messages.push({ role: 'user', content: words(25, 100 + turn) });
    const r = await server.post('/v1/chat/completions', { messages, max_tokens: 20, temperature: 0,
      session_id: 'conversation-1' });
    assert.equal(r.status, 200, r.text);
    const u = r.json.usage;
    if (prev) {
      const covered = u.prompt_tokens_details.cached_tokens / (prev.prompt_tokens + prev.completion_tokens);
      assert.ok(covered >= 0.99, `turn ${turn}: cached ${u.prompt_tokens_details.cached_tokens} of ` +
        `${prev.prompt_tokens + prev.completion_tokens} (${(100 * covered).toFixed(1)}%)`);
    }
    prev = u;
    messages.push({ role: 'assistant', content: r.json.choices[0].message.content });
  }
});
