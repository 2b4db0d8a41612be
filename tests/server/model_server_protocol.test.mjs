// Black-box tests of the model-server protocol (the Gateway API Inference Extension's
// 003-model-server-protocol; docs/model-server-protocol.md): a worker's /metrics answers
// vLLM's names, and under load they say what GET /load and GET /cache/state say.
// Run by CTest: node --test tests/server/model_server_protocol.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { writeFileSync, mkdirSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { startServer, words, waitFor, tinyQwen3Model, STRATA, WORK_DIR } from './server_harness.mjs';

const ADMIN = { authorization: 'Bearer test-admin-key' };
const MAX_RUNNING = 2;
const dir = path.join(WORK_DIR, 'model-server-protocol');
mkdirSync(dir, { recursive: true });

// A simulated worker whose decode steps take 20 ms: requests of 150 tokens stay running
// (or waiting) for a few seconds, long enough to read the gauges while they do.
const profilePath = path.join(dir, 'profile.json');
writeFileSync(profilePath, JSON.stringify({
  format: 'strata-timing-profile', version: 1, model: 'tiny-qwen3', machine: 'test',
  source: 'written by hand for tests/server/model_server_protocol.test.mjs',
  prefill: { new_tokens: [1, 1024], context_tokens: [0, 4096], ms: [[5, 6], [15, 16]] },
  decode: { batch_size: [1, 64], context_tokens: [0, 4096], ms: [[20, 21], [22, 23]] },
}));

let server;

before(async () => {
  server = await startServer(['--simulate', profilePath, '--kv-cache-tokens', '4096',
    '--max-running-requests', String(MAX_RUNNING), '--admin-api-key', 'test-admin-key']);
});

after(async () => {
  if (server) await server.stop();
});

// Prometheus text as {name: [{labels, value}]}; the # TYPE lines as {name: type}.
function parseMetrics(text) {
  const samples = {};
  const types = {};
  for (const line of text.split('\n')) {
    const type = line.match(/^# TYPE (\S+) (\S+)$/);
    if (type) types[type[1]] = type[2];
    if (line === '' || line.startsWith('#')) continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/);
    assert.ok(m, `not a sample line: ${line}`);
    const labels = {};
    for (const l of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    (samples[m[1]] ??= []).push({ labels, value: Number(m[3]) });
  }
  return { samples, types };
}

// The one sample of `name` (vLLM's labels: model_name, engine).
function only(parsed, name) {
  const s = parsed.samples[name];
  assert.ok(s && s.length === 1, `${name}: ${JSON.stringify(s)}`);
  return s[0];
}

async function metrics() {
  const r = await server.get('/metrics');
  assert.equal(r.status, 200, r.text);
  return parseMetrics(r.text);
}

// vLLM's figures beside /load's, read when /load said the same before and after /metrics
// (the gauges move with every scheduler step; only a reading between two equal ones is
// comparable). `ok` says which readings to take (under load, at rest).
async function consistentReading(ok, what) {
  return waitFor(async () => {
    const before = (await server.get('/load')).json;
    const m = await metrics();
    const state = (await server.get('/cache/state', ADMIN)).json;
    const afterLoad = (await server.get('/load')).json;
    const same = ['running', 'waiting'].every((k) => before[k] === afterLoad[k]) &&
      ['free_pages', 'evictable_pages'].every((k) => before.device[k] === afterLoad.device[k]);
    return same && ok(before) ? { load: before, m, state } : null;
  }, what, 60000);
}

function usageOf(load) {
  const d = load.device;
  return (d.total_pages - d.free_pages - d.evictable_pages) / d.total_pages;
}

test('/metrics answers the protocol\'s names as gauges, with vLLM\'s labels', async () => {
  const m = await metrics();
  for (const name of ['vllm:num_requests_waiting', 'vllm:num_requests_running', 'vllm:kv_cache_usage_perc',
    'vllm:cache_config_info']) {
    assert.equal(m.types[name], 'gauge', name);
  }
  const waiting = only(m, 'vllm:num_requests_waiting');
  assert.deepEqual(waiting.labels, { model_name: 'tiny-qwen3', engine: '0' });
  // The cache's configuration: block size and blocks as /server_info and /cache/state say.
  const info = (await server.get('/server_info')).json;
  const state = (await server.get('/cache/state', ADMIN)).json;
  const config = only(m, 'vllm:cache_config_info');
  assert.equal(config.value, 1);
  assert.equal(Number(config.labels.block_size), info.page_size);
  assert.equal(Number(config.labels.num_gpu_blocks), state.device.capacity_pages);
  assert.equal(Number(config.labels.num_cpu_blocks), 0);  // no host tier
  assert.equal(config.labels.enable_prefix_caching, 'True');
  assert.equal(config.labels.prefix_caching_hash_algo, 'strata');
  // Strata's own names stay beside them.
  assert.ok(m.samples.strata_requests_waiting, 'strata_requests_waiting');
  assert.ok(m.samples.strata_kv_pages, 'strata_kv_pages');
});

test('under load the running and waiting requests and the usage are /load\'s', async () => {
  // Five long requests on a batch of two: two run, three wait.
  const requests = [];
  for (let i = 0; i < 5; i++) {
    requests.push(server.post('/v1/completions', { prompt: words(200, 100 + i), max_tokens: 150, temperature: 0 }));
  }
  const busy = await consistentReading((l) => l.running === MAX_RUNNING && l.waiting > 0, 'a full batch and a queue');
  assert.equal(only(busy.m, 'vllm:num_requests_running').value, busy.load.running);
  assert.equal(only(busy.m, 'vllm:num_requests_waiting').value, busy.load.waiting);
  assert.equal(only(busy.m, 'strata_requests_running').value, busy.load.running);
  const usage = only(busy.m, 'vllm:kv_cache_usage_perc').value;
  assert.ok(Math.abs(usage - usageOf(busy.load)) < 1e-9, `${usage} against ${JSON.stringify(busy.load)}`);
  // The running requests hold pages: in use, not free.
  assert.ok(usage > 0 && usage <= 1, String(usage));
  // /cache/state's pool: without a host tier its evictable pages are the reclaimable ones.
  const d = busy.state.device;
  assert.equal(d.capacity_pages, busy.load.device.total_pages);
  for (const r of await Promise.all(requests)) assert.equal(r.status, 200, r.text);
  // At rest: nothing runs or waits, and the cache the requests left is evictable, so free
  // in vLLM's sense (its evictable cached blocks sit in its free queue).
  const idle = await consistentReading((l) => l.running === 0 && l.waiting === 0, 'the worker at rest');
  assert.equal(only(idle.m, 'vllm:num_requests_running').value, 0);
  assert.equal(only(idle.m, 'vllm:num_requests_waiting').value, 0);
  assert.ok(idle.state.device.cached_pages > 0, 'the requests left their pages cached');
  assert.equal(only(idle.m, 'vllm:kv_cache_usage_perc').value, 0);
  assert.equal(idle.state.device.evictable_pages, idle.load.device.evictable_pages);
});

test('pinned pages are in use, as /cache/state counts them; unpinned they are free again', async () => {
  const prompt = words(300, 7);
  const done = await server.post('/v1/completions', { prompt, max_tokens: 2, temperature: 0 });
  assert.equal(done.status, 200, done.text);
  const ids = (await server.post('/tokenize', { prompt })).json.tokens;
  const pin = await server.post('/cache/pin', { token_ids: ids }, ADMIN);
  assert.equal(pin.status, 200, pin.text);
  const pinned = pin.json.pinned_count;
  assert.ok(pinned > 0, pin.text);
  const reading = await consistentReading(
    (l) => l.running === 0 && l.waiting === 0 && usageOf(l) > 0, 'the pinned pages in the load');
  const d = reading.state.device;
  assert.equal(d.pinned_blocks, pinned);
  const usage = only(reading.m, 'vllm:kv_cache_usage_perc').value;
  // In use: neither free nor evictable, exactly the pinned pages (nothing else runs).
  assert.ok(Math.abs(usage - (d.capacity_pages - d.free_pages - d.evictable_pages) / d.capacity_pages) < 1e-9,
    `${usage} against ${JSON.stringify(d)}`);
  assert.ok(Math.abs(usage - pinned / d.capacity_pages) < 1e-9, `${usage}, ${pinned} pinned of ${d.capacity_pages}`);
  const unpin = await server.post('/cache/unpin', { token_ids: ids }, ADMIN);
  assert.equal(unpin.status, 200, unpin.text);
  await consistentReading((l) => l.running === 0 && usageOf(l) === 0, 'the unpinned pages free again');
  assert.equal(only(await metrics(), 'vllm:kv_cache_usage_perc').value, 0);
});

// llm-d's precise prefix scorer and Dynamo's router compute block hashes from a request's
// tokens: a worker that hashes as vLLM does (docs/block-hashes.md) names its blocks as
// `strata block-hashes --prefix-caching-hash-algo sha256_cbor` computes them, and says so.
test('a worker that hashes as vLLM names its blocks with vLLM\'s hashes and says so', async () => {
  const env = { ...process.env };
  delete env.PYTHONHASHSEED;
  const noSeed = spawnSync(STRATA, ['serve', '--model', tinyQwen3Model(), '--port', '0',
    '--prefix-caching-hash-algo', 'sha256_cbor'], { encoding: 'utf8', env });
  assert.equal(noSeed.status, 2);
  assert.match(noSeed.stderr, /sha256_cbor needs the seed .*PYTHONHASHSEED/);
  const unknown = spawnSync(STRATA, ['serve', '--model', tinyQwen3Model(), '--port', '0',
    '--prefix-caching-hash-algo', 'sha256'], { encoding: 'utf8' });
  assert.notEqual(unknown.status, 0);
  assert.match(unknown.stderr, /unknown block-hash algorithm 'sha256' \(strata or sha256_cbor\)/);

  const vllm = await startServer(['--simulate', profilePath, '--kv-cache-tokens', '4096',
    '--prefix-caching-hash-algo', 'sha256_cbor', '--prefix-caching-hash-seed', '7',
    '--admin-api-key', 'test-admin-key']);
  try {
    const prompt = words(120, 3);
    const done = await vllm.post('/v1/completions', { prompt, max_tokens: 1, temperature: 0, cache_salt: 'tenant-a' });
    assert.equal(done.status, 200, done.text);
    const ids = (await vllm.post('/tokenize', { prompt })).json.tokens;
    const want = JSON.parse(spawnSync(STRATA, ['block-hashes', '--prefix-caching-hash-algo', 'sha256_cbor',
      '--prefix-caching-hash-seed', '7', '--cache-salt', 'tenant-a', ...ids.map(String)],
    { encoding: 'utf8' }).stdout.replace(/(-?\d{16,})/g, '"$1"')).block_hashes;
    assert.ok(want.length >= 2, `${ids.length} tokens`);
    const tree = (await vllm.getExact('/cache/state?detail=tree', ADMIN)).json;
    const held = new Set(tree.nodes.flatMap((n) => n.block_hashes.map(String)));
    for (const h of want) assert.ok(held.has(h), `block ${h} is not in the tree`);
    // A pin by tokens names the same blocks.
    const pin = await vllm.post('/cache/pin', { token_ids: ids, cache_salt: 'tenant-a' }, ADMIN);
    assert.equal(pin.status, 200, pin.text);
    assert.equal(pin.json.pinned_count, want.length);
    const m = parseMetrics((await vllm.get('/metrics')).text);
    assert.equal(only(m, 'vllm:cache_config_info').labels.prefix_caching_hash_algo, 'sha256_cbor');
  } finally {
    await vllm.stop();
  }
});
