// Black-box tests of `strata route` in front of workers that hash blocks as vLLM does
// (`--prefix-caching-hash-algo sha256_cbor`, docs/block-hashes.md): the router keys its
// index by its own hash of the events' token ids and maps the workers' hashes to it, as it
// does for vLLM workers, so a repeated prefix still goes to the worker that cached it, and
// a pin through the router by messages lands on it. A worker's tree (GET
// /cache/state?detail=tree) names its blocks by the worker's hashes and holds no tokens to
// hash again: the router does not read it for these workers (/server_info's
// block_hash_algo), and says so once per read it skips.
// Run by CTest: node --test tests/router/hash_modes.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { startServer, startRouter, waitFor, workerList, allJoined, words, STRATA } from '../server/server_harness.mjs';

const KEY = 'router-test-key';
const ADMIN = { authorization: 'Bearer ' + KEY };
const workers = [];
let router;

before(async () => {
  for (let i = 0; i < 2; i++) {
    workers.push(await startServer(['--kv-cache-tokens', '4096', '--admin-api-key', KEY,
      '--kv-events-endpoint', 'tcp://127.0.0.1:*', '--kv-events-replay-endpoint', 'tcp://127.0.0.1:*',
      '--prefix-caching-hash-algo', 'sha256_cbor', '--prefix-caching-hash-seed', '0']));
  }
  router = await startRouter(['--admin-api-key', KEY, '--load-poll-ms', '50',
    ...workers.flatMap((w) => ['--worker', w.base])], { logLevel: 'info' });
  await allJoined(router, 2);
  await waitFor(() => [0, 1].every((id) => router.log().includes(`worker ${id} (${workers[id].base}): its blocks are hashed with sha256_cbor`)),
    'the join to skip both trees');
  assert.ok(!router.log().includes('KV index rebuilt from its tree'), router.log());
});

after(async () => {
  if (router) await router.stop();
  for (const w of workers) await w.stop();
});

const chat = (system, user) => ({
  messages: [{ role: 'system', content: system }, { role: 'user', content: user }], max_tokens: 2, temperature: 0,
});

test('a repeated prefix goes to the worker that cached it, whose hashes are vLLM\'s', async () => {
  const system = 'You answer briefly. ' + words(300, 9);
  const first = await router.post('/v1/chat/completions', chat(system, 'first question'));
  assert.equal(first.status, 200, first.text);
  const home = first.headers.get('x-strata-worker');
  assert.ok(home);
  const id = (await workerList(router)).find((w) => w.url === home).id;
  await waitFor(async () => (await workerList(router)).find((w) => w.id === id).index_blocks >= 16, 'the events');
  for (const q of ['second question', 'third question']) {
    const r = await router.post('/v1/chat/completions', chat(system, q));
    assert.equal(r.status, 200, r.text);
    assert.equal(r.headers.get('x-strata-worker'), home);
    assert.equal(r.headers.get('x-strata-route'), 'cache');
    assert.ok(r.json.usage.prompt_tokens_details.cached_tokens >= 256, JSON.stringify(r.json.usage));
  }
  // A pin by messages through the router lands on that worker and pins its blocks.
  const pin = await router.post('/cache/pin', { messages: [{ role: 'system', content: system }] }, ADMIN);
  assert.equal(pin.status, 200, pin.text);
  const answered = pin.json.workers.find((w) => w.url === home);
  assert.ok(answered && answered.status === 200, pin.text);
  const st = await workers.find((w) => w.base === home).get('/cache/state', ADMIN);
  assert.ok(st.json.device.pinned_blocks >= 16, st.text);
});

// The router's block hashes are its own (Strata's) whatever its workers' are: a pin by
// block_hashes through the router reaches a sha256_cbor worker as that worker's hashes of the
// same blocks (the index maps them), and the router marks the blocks the worker pinned.
test('a pin by the router\'s block hashes lands on a sha256_cbor worker as its own hashes', async () => {
  const system = 'You pin what you are told. ' + words(300, 21);
  const first = await router.post('/v1/chat/completions', chat(system, 'a question'));
  assert.equal(first.status, 200, first.text);
  const home = first.headers.get('x-strata-worker');
  const worker = workers.find((w) => w.base === home);
  const id = (await workerList(router)).find((w) => w.url === home).id;
  const tokens = (await worker.post('/tokenize', { messages: [{ role: 'system', content: system }],
    add_generation_prompt: false })).json.tokens;
  // The hashes as text: 64-bit integers, which a JavaScript number would round.
  const printed = execFileSync(STRATA, ['block-hashes', '--page-size', '16', ...tokens.map(String)]).toString();
  const list = printed.match(/"block_hashes":\s*(\[[^\]]*\])/)[1];
  const hashes = list.slice(1, -1).split(',');
  assert.ok(hashes.length >= 16, `${tokens.length} tokens`);
  await waitFor(async () => {
    const st = await router.get('/cache/state', ADMIN);
    return st.json.index.workers.find((w) => w.worker === id)?.blocks >= hashes.length;
  }, 'the events of the prompt');
  const before = (await worker.get('/cache/state', ADMIN)).json.device.pinned_blocks;
  const pin = await router.post('/cache/pin', `{"block_hashes":${list}}`, ADMIN);
  assert.equal(pin.status, 200, pin.text);
  const answered = pin.json.workers.find((w) => w.url === home);
  assert.ok(answered && answered.status === 200, pin.text);
  const after = (await worker.get('/cache/state', ADMIN)).json.device.pinned_blocks;
  assert.ok(after >= before + hashes.length - 1, `pinned ${before} -> ${after} of ${hashes.length}: ${pin.text}`);
  const marks = (await router.get('/cache/state', ADMIN)).json.index.workers.find((w) => w.worker === id);
  assert.ok(marks.pinned_blocks >= hashes.length - 1, JSON.stringify(marks));
});
