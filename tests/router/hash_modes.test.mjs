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
import { startServer, startRouter, waitFor, workerList, allJoined, words } from '../server/server_harness.mjs';

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
