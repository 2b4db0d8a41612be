// Black-box tests of a simulated worker (`strata serve --simulate PROFILE`,
// docs/simulation.md): the same API, cache, pins and metrics as a real worker, with the
// forward pass replaced by the profile's times and deterministic words.
// Run by CTest: node --test tests/server/simulate.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { writeFileSync, mkdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { spawnSync } from 'node:child_process';
import { startServer, words, waitFor, tinyQwen3Model, STRATA, SOURCE_DIR, WORK_DIR } from './server_harness.mjs';

const require = createRequire(path.join(SOURCE_DIR, 'tools/js/package.json'));
const OpenAI = require('openai').default ?? require('openai');

const ADMIN = { authorization: 'Bearer test-admin-key' };
const DECODE_MS = 4;
const dir = path.join(WORK_DIR, 'simulate');
mkdirSync(dir, { recursive: true });

function profile(overrides = {}) {
  return {
    format: 'strata-timing-profile', version: 1, model: 'tiny-qwen3', machine: 'test',
    source: 'written by hand for tests/server/simulate.test.mjs',
    prefill: { new_tokens: [1, 1024], context_tokens: [0, 4096], ms: [[5, 6], [15, 16]] },
    decode: { batch_size: [1, 64], context_tokens: [0, 4096], ms: [[DECODE_MS, DECODE_MS + 1], [8, 9]] },
    ...overrides,
  };
}
const profilePath = path.join(dir, 'profile.json');
writeFileSync(profilePath, JSON.stringify(profile()));

let server;
let client;

before(async () => {
  server = await startServer(['--simulate', profilePath, '--kv-cache-tokens', '4096',
    '--admin-api-key', 'test-admin-key']);
  client = new OpenAI({ baseURL: server.base + '/v1', apiKey: 'unused' });
});

after(async () => {
  if (server) await server.stop();
});

async function complete(prompt, extra = {}) {
  const r = await server.post('/v1/completions', { prompt, max_tokens: 4, temperature: 0, ...extra });
  assert.equal(r.status, 200, r.text);
  return r.json;
}

test('chat completions run to max_tokens with words, the same for the same prompt', async () => {
  const ask = () => client.chat.completions.create({
    model: 'tiny-qwen3', messages: [{ role: 'user', content: 'Say hello.' }], max_tokens: 12, temperature: 0.8,
  });
  const started = Date.now();
  const a = await ask();
  const elapsed = Date.now() - started;
  assert.equal(a.object, 'chat.completion');
  assert.equal(a.choices[0].finish_reason, 'length');  // no end token: max_tokens ends it
  assert.equal(a.usage.completion_tokens, 12);
  assert.match(a.choices[0].message.content, /^ ?[A-Za-z]+( ?[A-Za-z]+)*$/);
  // One prefill pass and 11 decode steps at least (the simulator never runs early).
  assert.ok(elapsed >= 11 * DECODE_MS, `took ${elapsed} ms`);
  const b = await ask();
  assert.equal(b.choices[0].message.content, a.choices[0].message.content);
  // Streaming gives the same words.
  const stream = await client.chat.completions.create({
    model: 'tiny-qwen3', messages: [{ role: 'user', content: 'Say hello.' }], max_tokens: 12, stream: true,
  });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  assert.equal(text, a.choices[0].message.content);
});

test('a repeated prompt is served from the cache', async () => {
  const prompt = words(300, 11);
  const a = await complete(prompt);
  assert.equal(a.usage.prompt_tokens_details.cached_tokens, 0);
  const b = await complete(prompt);
  assert.ok(b.usage.prompt_tokens_details.cached_tokens >= Math.floor((b.usage.prompt_tokens - 1) / 16) * 16,
    `cached ${b.usage.prompt_tokens_details.cached_tokens} of ${b.usage.prompt_tokens}`);
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
    await Promise.all(Array.from({ length: 16 }, (_, i) => complete(words(400, seed0 + i))));
  };
  await flood(1000);
  const s = (await server.get('/cache/state', ADMIN)).json;
  assert.ok(s.evictions.evicted_pages_total > 0, 'the flood evicted');
  const hit = await complete(vip);
  assert.ok(hit.usage.prompt_tokens_details.cached_tokens >= Math.floor((ids.length - 1) / 16) * 16);
  const unpin = await server.post('/cache/unpin', { token_ids: ids }, ADMIN);
  assert.equal(unpin.json.unpinned_count, full);
  await flood(2000);
  await flood(3000);
  const miss = await complete(vip);
  assert.equal(miss.usage.prompt_tokens_details.cached_tokens, 0);
});

// A prompt the pool evicted for room and then computed again: the worker counts the pages
// computed twice (/cache/state, /metrics) and adds those of the last seconds to the pages
// in use of the load a router reads (GET /load, docs/router.md "Load").
test('pages computed again after eviction for room read as load in GET /load', async () => {
  const before = (await server.get('/cache/state', ADMIN)).json.evictions.recomputed_pages_total;
  const a = words(600, 41);
  await complete(a);
  await Promise.all(Array.from({ length: 16 }, (_, i) => complete(words(400, 4000 + i))));
  const again = await complete(a);
  assert.ok(again.usage.prompt_tokens_details.cached_tokens < again.usage.prompt_tokens - 16,
    'the flood evicted the prompt');
  const s = (await server.get('/cache/state', ADMIN)).json;
  const recomputed = s.evictions.recomputed_pages_total - before;
  assert.ok(recomputed > 0, JSON.stringify(s.evictions));
  const metrics = await server.get('/metrics');
  assert.match(metrics.text, /strata_kv_recomputed_pages_total \d+/);
  let load;
  await waitFor(async () => {
    load = (await server.get('/load')).json;
    return load.device.recomputed_pages_recent > 0;
  }, 'the recomputed pages in the load gauge');
  assert.ok(load.device.recomputed_pages_recent <= s.evictions.recomputed_pages_total, JSON.stringify(load));
  const inUse = load.device.total_pages - load.device.free_pages - load.device.evictable_pages;
  assert.ok(load.load_fraction >= (inUse + load.device.recomputed_pages_recent) / load.device.total_pages - 1e-9,
    JSON.stringify(load));
});

test('/metrics and /cache/state read as on a real worker', async () => {
  const metrics = await server.get('/metrics');
  assert.equal(metrics.status, 200);
  assert.match(metrics.text, /strata_kv_pages\{state="free"\}/);
  assert.match(metrics.text, /strata_time_to_first_token_seconds_bucket/);
  assert.match(metrics.text, /strata_prefill_budget_tokens/);
  const s = await server.get('/cache/state', ADMIN);
  assert.equal(s.status, 200, s.text);
  assert.equal(s.json.requests.running, 0);
});

test('a bad profile is refused at start-up, the field named', () => {
  const bad = path.join(dir, 'bad.json');
  writeFileSync(bad, JSON.stringify(profile({
    decode: { batch_size: [4, 1], context_tokens: [0], ms: [[1], [2]] },
  })));
  const r = spawnSync(STRATA, ['serve', '--model', tinyQwen3Model(), '--port', '0', '--simulate', bad],
    { encoding: 'utf8', timeout: 60000 });
  assert.equal(r.status, 2, r.stderr);
  assert.match(r.stderr, /decode\.batch_size must increase strictly/);
  const missing = spawnSync(STRATA, ['serve', '--model', tinyQwen3Model(), '--port', '0', '--simulate',
    path.join(dir, 'absent.json')], { encoding: 'utf8', timeout: 60000 });
  assert.equal(missing.status, 2);
  assert.match(missing.stderr, /no such file/);
});

test('device flags that cannot run are refused at start-up, named', () => {
  const serve = (...args) => spawnSync(STRATA, ['serve', '--model', tinyQwen3Model(), '--port', '0', ...args],
    { encoding: 'utf8', timeout: 60000 });
  const both = serve('--device', 'cuda', '--simulate', path.join(dir, 'absent.json'));
  assert.equal(both.status, 2, both.stderr);
  assert.match(both.stderr, /--device cuda and --simulate exclude each other/);
  const fraction = serve('--mem-fraction-static', '0.8');
  assert.equal(fraction.status, 2, fraction.stderr);
  assert.match(fraction.stderr, /--mem-fraction-static needs --device cuda/);
  // The copy kernel is the GPU's: the CPU engine's copy threads have no other path.
  const kernel = serve('--enable-hierarchical-cache', '--hicache-io-backend', 'kernel');
  assert.equal(kernel.status, 2, kernel.stderr);
  assert.match(kernel.stderr, /--hicache-io-backend kernel needs --device cuda/);
  const alone = serve('--hicache-io-backend', 'kernel');
  assert.equal(alone.status, 2, alone.stderr);
  assert.match(alone.stderr, /--hicache-io-backend needs --enable-hierarchical-cache/);
  const dma = serve('--enable-hierarchical-cache', '--hicache-io-backend', 'dma');
  assert.notEqual(dma.status, 0);
  assert.match(dma.stderr, /unknown I\/O backend 'dma' \(direct or kernel\)/);
  const unknown = serve('--device', 'tpu');
  assert.notEqual(unknown.status, 0);
  // How host hits load back: named values only, and only with a host tier.
  const overlap = serve('--enable-hierarchical-cache', '--hicache-load-overlap', 'sometimes');
  assert.notEqual(overlap.status, 0);
  assert.match(overlap.stderr, /unknown load overlap 'sometimes' \(layer or none\)/);
  const parked = serve('--hicache-load-overlap', 'none');
  assert.equal(parked.status, 2, parked.stderr);
  assert.match(parked.stderr, /--hicache-load-overlap needs --enable-hierarchical-cache/);
});
