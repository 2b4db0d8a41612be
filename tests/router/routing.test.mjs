// Black-box tests of `strata route` in front of three real `strata serve` workers on
// loopback (docs/router.md): placement by cache, sessions, spreading, pins through the
// router, hostile input, a killed worker, and the official openai client through it.
// Run by CTest: node --test tests/router/routing.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { writeFileSync, mkdtempSync } from 'node:fs';
import os from 'node:os';
import { createRequire } from 'node:module';
import { startServer, startRouter as startRouterProcess, waitFor, workerList, allJoined, words, STRATA, SOURCE_DIR, tinyQwen3Model } from '../server/server_harness.mjs';

const require = createRequire(path.join(SOURCE_DIR, 'tools/js/package.json'));
const OpenAI = require('openai').default ?? require('openai');
const AnthropicModule = require('@anthropic-ai/sdk');
const Anthropic = AnthropicModule.default ?? AnthropicModule.Anthropic ?? AnthropicModule;

const KEY = 'router-test-key';
const ADMIN = { authorization: 'Bearer ' + KEY };
const workers = [];
let router;

async function startWorker(extra = []) {
  return startServer(['--kv-cache-tokens', '4096', '--admin-api-key', KEY,
    '--kv-events-endpoint', 'tcp://127.0.0.1:*', '--kv-events-replay-endpoint', 'tcp://127.0.0.1:*',
    '--enable-hierarchical-cache', '--hicache-ratio', '2', ...extra]);
}

function startRouter(args) {
  return startRouterProcess(['--admin-api-key', KEY, '--load-poll-ms', '50', ...args]);
}


function chat(system, user, extra = {}) {
  return { messages: [{ role: 'system', content: system }, { role: 'user', content: user }], max_tokens: 2,
    temperature: 0, ...extra };
}

// How many chat requests each worker served (its own request counter).
async function servedCounts() {
  const out = [];
  for (const w of workers) {
    const m = await w.get('/metrics');
    let n = 0;
    for (const line of m.text.split('\n')) {
      if (line.startsWith('strata_http_requests_total') && line.includes('/v1/chat/completions')) {
        n += Number(line.split(' ').pop());
      }
    }
    out.push(n);
  }
  return out;
}

before(async () => {
  for (let i = 0; i < 3; i++) workers.push(await startWorker());
  router = await startRouter(workers.flatMap((w) => ['--worker', w.base]));
  await allJoined(router, 3);
});

after(async () => {
  if (router) await router.stop();
  for (const w of workers) await w.stop();
});

test('a worker describes itself: GET /server_info and GET /load', async () => {
  const info = await workers[0].get('/server_info');
  assert.equal(info.status, 200, info.text);
  assert.equal(info.json.engine, 'strata');
  assert.equal(info.json.page_size, 16);
  assert.equal(info.json.role, 'mixed');
  assert.match(info.json.kv_events.endpoint, /^tcp:\/\/127\.0\.0\.1:\d+$/);
  assert.match(info.json.kv_events.replay_endpoint, /^tcp:\/\/127\.0\.0\.1:\d+$/);
  assert.equal(info.json.device.capacity_tokens, 4096);
  assert.ok(info.json.host.capacity_pages > 0);
  const load = await workers[0].get('/load');
  assert.equal(load.status, 200, load.text);
  for (const k of ['running', 'waiting', 'load_fraction', 'saturated', 'recommended_pause_ms', 'queued_prefill_tokens']) {
    assert.ok(k in load.json, k);
  }
  assert.equal(load.json.device.total_pages, 256);
  assert.equal(load.json.device.recomputed_pages_recent, 0);
  assert.equal(load.json.saturated, false);
});

test('a repeated prefix goes to the worker that cached it and is a cache hit', async () => {
  const system = 'You answer briefly. ' + words(300, 5);
  const first = await router.post('/v1/chat/completions', chat(system, 'first question'));
  assert.equal(first.status, 200, first.text);
  const home = first.headers.get('x-strata-worker');
  assert.ok(home);
  const id = (await workerList(router)).find((w) => w.url === home).id;
  await waitFor(async () => (await workerList(router)).find((w) => w.id === id).index_blocks >= 16, 'the events');
  for (const q of ['second question', 'third question', 'fourth one']) {
    const r = await router.post('/v1/chat/completions', chat(system, q));
    assert.equal(r.status, 200, r.text);
    assert.equal(r.headers.get('x-strata-worker'), home);
    assert.equal(r.headers.get('x-strata-route'), 'cache');
    assert.ok(r.json.usage.prompt_tokens_details.cached_tokens >= 256, JSON.stringify(r.json.usage));
  }
});

test('a session sticks to its worker across turns and a tool pause', async () => {
  const session = 'agent-sticky';
  const msgs = [{ role: 'system', content: 'Tools agent. ' + words(120, 9) }, { role: 'user', content: 'call the tool' }];
  const t1 = await router.post('/v1/chat/completions', { messages: msgs, max_tokens: 3, temperature: 0, session_id: session });
  assert.equal(t1.status, 200, t1.text);
  const home = t1.headers.get('x-strata-worker');
  const start = await router.post('/session/tool_start', { session_id: session }, ADMIN);
  assert.equal(start.status, 200, start.text);
  assert.equal(start.headers.get('x-strata-worker'), home);
  const meta = await router.get('/session/kv_meta?session_id=' + session, ADMIN);
  assert.equal(meta.status, 200, meta.text);
  const end = await router.post('/session/tool_end', { session_id: session, epoch: start.json.epoch }, ADMIN);
  assert.equal(end.status, 200, end.text);
  assert.equal(end.json.state, 'RUNNABLE');
  const t2 = await router.post('/v1/chat/completions', {
    messages: [...msgs, { role: 'assistant', content: t1.json.choices[0].message.content },
      { role: 'tool', content: 'result 42' }], max_tokens: 3, temperature: 0 }, { 'x-session-id': session });
  assert.equal(t2.status, 200, t2.text);
  assert.equal(t2.headers.get('x-strata-worker'), home);
  assert.ok(t2.json.usage.prompt_tokens_details.cached_tokens > 0);
  const unknown = await router.post('/session/tool_start', { session_id: 'never-seen' }, ADMIN);
  assert.equal(unknown.status, 404);
});

test('new sessions sharing a system prompt spread over all workers', async () => {
  const system = 'Shared boilerplate for every agent. ' + words(200, 21);
  const per = new Map();
  for (let i = 0; i < 9; i++) {
    const r = await router.post('/v1/chat/completions', chat(system, `task number ${i}`, { session_id: `spread-${i}` }));
    assert.equal(r.status, 200, r.text);
    const w = r.headers.get('x-strata-worker');
    per.set(w, (per.get(w) ?? 0) + 1);
  }
  assert.equal(per.size, 3, JSON.stringify([...per]));
  for (const [w, n] of per) assert.ok(n >= 2, `${w} got ${n} of 9 new sessions`);
});

test('hostile requests get a 4xx at the router and reach no worker', async () => {
  const before = await servedCounts();
  const cases = [
    ['{"messages": [', 400],
    ['[1, 2, 3]', 400],
    [JSON.stringify({ max_tokens: 3 }), 400],
    [JSON.stringify({ messages: 'hi' }), 400],
    [JSON.stringify({ messages: [] }), 400],
    [JSON.stringify({ messages: [{ content: 'no role' }] }), 400],
    [JSON.stringify({ messages: [{ role: 'user', content: 'x' }], stream: 'yes' }), 400],
    [JSON.stringify({ messages: [{ role: 'user', content: 'x' }], session_id: 'x'.repeat(300) }), 400],
    [JSON.stringify({ messages: [{ role: 'user', content: 'x' }], tools: 'none' }), 400],
  ];
  for (const [body, status] of cases) {
    const r = await router.post('/v1/chat/completions', body);
    assert.equal(r.status, status, body + ' -> ' + r.text);
    assert.equal(r.headers.get('x-strata-worker'), null);
    assert.ok(r.json.error.message.length > 0);
  }
  const comp = await router.post('/v1/completions', JSON.stringify({ prompt: { text: 'x' } }));
  assert.equal(comp.status, 400);
  const big = await fetch(router.base + '/v1/chat/completions', { method: 'POST',
    headers: { 'content-type': 'application/json', 'x-filler': 'y'.repeat(40000) }, body: '{}' });
  assert.equal(big.status, 431);
  assert.equal((await router.post('/workers', { url: 'http://127.0.0.1:1' })).status, 401);
  assert.equal((await router.post('/cache/flush', {})).status, 401);
  assert.equal((await router.post('/cache/pin', 'not json', ADMIN)).status, 400);
  assert.equal((await router.post('/cache/pin', { block_hashes: [1], token_ids: [1] }, ADMIN)).status, 400);
  assert.equal((await router.post('/workers', { url: 'ftp://x' }, ADMIN)).status, 400);
  assert.equal((await router.post('/workers', { url: 'http://127.0.0.1:9', kind: 'vllm' }, ADMIN)).status, 400);
  assert.equal((await router.del('/workers?url=http://127.0.0.1:9', ADMIN)).status, 404);
  assert.deepEqual(await servedCounts(), before);
});

test('a prefix pinned through the router survives a flood on its worker', async () => {
  const system = 'VIP conversation. ' + words(250, 33);
  const first = await router.post('/v1/chat/completions', chat(system, 'hello'));
  assert.equal(first.status, 200, first.text);
  const home = first.headers.get('x-strata-worker');
  const homeWorker = workers.find((w) => w.base === home);
  const id = (await workerList(router)).find((w) => w.url === home).id;
  await waitFor(async () => (await workerList(router)).find((w) => w.id === id).index_blocks >= 16, 'the events');
  const pin = await router.post('/cache/pin', { messages: [{ role: 'system', content: system }] }, ADMIN);
  assert.equal(pin.status, 200, pin.text);
  const answered = pin.json.workers.find((w) => w.url === home);
  assert.ok(answered && answered.status === 200, pin.text);
  // The flood: distinct long prompts straight to that worker, several times its pool.
  for (let i = 0; i < 24; i++) {
    const r = await homeWorker.post('/v1/completions', { prompt: words(600, 1000 + i), max_tokens: 1 });
    assert.equal(r.status, 200, r.text);
  }
  const st = await homeWorker.get('/cache/state', ADMIN);
  assert.ok(st.json.evictions.evicted_pages_total + st.json.evictions.demoted_pages_total > 256, st.text);
  const again = await router.post('/v1/chat/completions', chat(system, 'hello again'));
  assert.equal(again.status, 200, again.text);
  assert.equal(again.headers.get('x-strata-worker'), home);
  // Pinned blocks stay cached (on the host tier when the device pool is flooded).
  assert.ok(again.json.usage.prompt_tokens_details.cached_tokens >= 240, JSON.stringify(again.json.usage));
  const unpin = await router.post('/cache/unpin', { messages: [{ role: 'system', content: system }] }, ADMIN);
  assert.equal(unpin.status, 200, unpin.text);
});

test('the cluster view and the metrics', async () => {
  const st = await router.get('/cache/state', ADMIN);
  assert.equal(st.status, 200, st.text);
  assert.equal(st.json.workers.length, 3);
  assert.ok(st.json.index.distinct_blocks > 0);
  const m = await router.get('/metrics');
  assert.equal(m.status, 200);
  assert.match(m.text, /strata_router_decisions_total\{.*reason="cache"/);
  assert.match(m.text, /strata_router_predicted_cached_tokens_total \d+/);
  assert.match(m.text, /strata_router_reported_cached_tokens_total \d+/);
});

test('the official openai client works through the router, streaming and not', async () => {
  const client = new OpenAI({ baseURL: router.base + '/v1', apiKey: 'unused' });
  const r = await client.chat.completions.create({ model: 'tiny-qwen3', messages: [{ role: 'user', content: 'hello' }],
    max_tokens: 4, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.usage.completion_tokens, 4);
  const stream = await client.chat.completions.create({ model: 'tiny-qwen3', messages: [{ role: 'user', content: 'hello' }],
    max_tokens: 4, temperature: 0, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.choices.length > 0) text += chunk.choices[0].delta.content ?? '';
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(text, r.choices[0].message.content);
  assert.equal(usage.completion_tokens, 4);
  const c = await client.completions.create({ model: 'tiny-qwen3', prompt: 'once upon', max_tokens: 3, temperature: 0 });
  assert.equal(c.usage.completion_tokens, 3);
  const models = await client.models.list();
  assert.ok(models.data.length >= 1);
  const tok = await router.post('/tokenize', { prompt: 'hello world' });
  assert.equal(tok.status, 200, tok.text);
});

// Anthropic's Messages API through the router: read as the worker reads it, so a repeated
// system prompt goes to the worker that cached it; streams keep their named events (the SDK
// reads them); the router's own refusals use Anthropic's error shape.
test('the official Anthropic client works through the router: cache placement, streaming, errors', async () => {
  const client = new Anthropic({ baseURL: router.base, apiKey: 'unused', maxRetries: 0 });
  const system = 'You are a careful assistant. ' + words(300, 21);
  const ask = (q) => ({ model: 'tiny-qwen3', max_tokens: 3, temperature: 0, system,
    messages: [{ role: 'user', content: q }] });
  const first = await client.messages.create(ask('first question'));
  assert.equal(first.type, 'message');
  assert.equal(first.usage.output_tokens, 3);
  const raw = await router.post('/v1/messages', ask('first question, again'));
  assert.equal(raw.status, 200, raw.text);
  const home = raw.headers.get('x-strata-worker');
  const id = (await workerList(router)).find((w) => w.url === home).id;
  await waitFor(async () => (await workerList(router)).find((w) => w.id === id).index_blocks >= 16, 'the events');
  const again = await router.post('/v1/messages', ask('second question'));
  assert.equal(again.status, 200, again.text);
  assert.equal(again.headers.get('x-strata-worker'), home);
  assert.equal(again.headers.get('x-strata-route'), 'cache');
  assert.ok(again.json.usage.cache_read_input_tokens >= 256, JSON.stringify(again.json.usage));

  const stream = client.messages.stream(ask('second question'));
  let text = '';
  stream.on('text', (t) => { text += t; });
  const final = await stream.finalMessage();
  assert.equal(final.usage.output_tokens, 3);
  assert.equal(text, again.json.content[0].text);

  const bad = await router.post('/v1/messages', { model: 'tiny-qwen3', messages: [] });
  assert.equal(bad.status, 400, bad.text);
  assert.equal(bad.json.type, 'error');
  assert.equal(bad.json.error.type, 'invalid_request_error');
  const count = await client.messages.countTokens({ model: 'tiny-qwen3', system,
    messages: [{ role: 'user', content: 'second question' }] });
  assert.ok(count.input_tokens > 300, JSON.stringify(count));
});

test('a worker joins after the router saw traffic: its cached blocks are indexed', async () => {
  // A second router comes up after the first one's traffic: it reads each worker's tree
  // when it joins, so a repeated prefix is a cache hit on its first request.
  const system = 'Indexed before the router came. ' + words(200, 44);
  const r1 = await router.post('/v1/chat/completions', chat(system, 'one'));
  const home = r1.headers.get('x-strata-worker');
  const late = await startRouter(workers.flatMap((w) => ['--worker', w.base]));
  try {
    await allJoined(late, 3);
    await waitFor(async () => (await workerList(late)).find((w) => w.url === home).index_blocks >= 12, 'the rebuild');
    const r2 = await late.post('/v1/chat/completions', chat(system, 'two'));
    assert.equal(r2.status, 200, r2.text);
    assert.equal(r2.headers.get('x-strata-worker'), home);
    assert.equal(r2.headers.get('x-strata-route'), 'cache');
  } finally {
    await late.stop();
  }
});

test('workers are added, drained and removed at run time', async () => {
  const extra = await startWorker();
  try {
    const add = await router.post('/workers', { url: extra.base }, ADMIN);
    assert.equal(add.status, 201, add.text);
    assert.equal((await router.post('/workers', { url: extra.base }, ADMIN)).status, 409);
    await allJoined(router, 4);
    const drain = await router.del('/workers?url=' + encodeURIComponent(extra.base), ADMIN);
    assert.equal(drain.status, 200, drain.text);
    await waitFor(async () => (await workerList(router)).length === 3, 'the drained worker to go');
  } finally {
    await extra.stop();
  }
});

test('--workers-file: workers come and go as the file changes; --policy approximate', async () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'strata-router-'));
  const file = path.join(dir, 'workers.json');
  // A worker listed without its events: scored from what the router sent it.
  writeFileSync(file, JSON.stringify([{ url: workers[0].base, kind: 'strata' }]));
  const r = await startRouter(['--workers-file', file, '--policy', 'approximate']);
  try {
    await allJoined(r, 1);
    writeFileSync(file, JSON.stringify([{ url: workers[0].base, kind: 'strata' }, { url: workers[1].base, kind: 'strata' }]));
    await allJoined(r, 2);
    const system = 'Approximate routing. ' + words(150, 55);
    const first = await r.post('/v1/chat/completions', chat(system, 'a'));
    assert.equal(first.status, 200, first.text);
    for (const q of ['b', 'c', 'd']) {
      const again = await r.post('/v1/chat/completions', chat(system, q));
      assert.equal(again.headers.get('x-strata-worker'), first.headers.get('x-strata-worker'));
      assert.equal(again.headers.get('x-strata-route'), 'cache');
    }
    writeFileSync(file, JSON.stringify([{ url: workers[1].base, kind: 'strata' }]));
    await waitFor(async () => {
      const ws = await workerList(r);
      return ws.length === 1 && ws[0].url === workers[1].base;
    }, 'the file change');
  } finally {
    await r.stop();
  }
});

test('a killed worker: its traffic moves on, no request that had not started fails', async () => {
  const victim = workers[2];
  const sessions = [];
  for (let i = 0; i < 12; i++) {
    const r = await router.post('/v1/chat/completions', chat('Kill test. ' + words(40, 70 + i), 'q', { session_id: `kill-${i}` }));
    assert.equal(r.status, 200, r.text);
    if (r.headers.get('x-strata-worker') === victim.base) sessions.push(`kill-${i}`);
  }
  assert.ok(sessions.length > 0, 'some sessions were bound to the victim');
  // A stream running on the victim when it dies ends with an error event, then the end.
  const streaming = await fetch(router.base + '/v1/chat/completions', { method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...chat('Kill test. ' + words(40, 70), 'stream', { session_id: sessions[0] }),
      max_tokens: 4000, ignore_eos: true, stream: true }) });
  assert.equal(streaming.headers.get('x-strata-worker'), victim.base);
  const reader = streaming.body.getReader();
  let seen = new TextDecoder().decode((await reader.read()).value);
  process.kill(victim.pid, 'SIGKILL');
  await new Promise((r) => victim.proc.on('exit', r));
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    seen += new TextDecoder().decode(value);
  }
  assert.match(seen, /data: \{"error":\{"code":"upstream_error"/);
  const results = await Promise.all(sessions.map((s, i) =>
    router.post('/v1/chat/completions', chat('Kill test. ' + words(40, 70 + i), 'again', { session_id: s }))));
  for (const r of results) {
    assert.equal(r.status, 200, r.text);
    assert.notEqual(r.headers.get('x-strata-worker'), victim.base);
  }
  await waitFor(async () => !(await workerList(router)).find((w) => w.url === victim.base).eligible, 'the victim to be ineligible');
  const h = await router.get('/health');
  assert.equal(h.status, 200);
  assert.equal(h.json.eligible_workers, 2);
});
