// A table of malformed and hostile requests across the endpoints: each must get a 4xx
// with a clear message, change nothing, and leave the server healthy.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, words } from './server_harness.mjs';

const ADMIN = { authorization: 'Bearer k' };
let server;

before(async () => {
  server = await startServer(['--kv-cache-tokens', '2048', '--admin-api-key', 'k']);
});
after(async () => { if (server) await server.stop(); });

const chat = (extra) => JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, ...extra });
const CASES = [
  ['chat: not JSON', '/v1/chat/completions', '{"messages": [', 400],
  ['chat: a JSON array', '/v1/chat/completions', '[]', 400],
  ['chat: no messages', '/v1/chat/completions', '{}', 400],
  ['chat: messages is a string', '/v1/chat/completions', '{"messages": "hi"}', 400],
  ['chat: empty messages', '/v1/chat/completions', '{"messages": []}', 400],
  ['chat: unknown role', '/v1/chat/completions', '{"messages": [{"role": "wizard", "content": "x"}]}', 400],
  ['chat: user without content', '/v1/chat/completions', '{"messages": [{"role": "user"}]}', 400],
  ['chat: numeric content', '/v1/chat/completions', '{"messages": [{"role": "user", "content": 5}]}', 400],
  ['chat: image part', '/v1/chat/completions',
    '{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}', 400],
  ['chat: max_tokens 0', '/v1/chat/completions', chat({ max_tokens: 0 }), 400],
  ['chat: max_tokens negative', '/v1/chat/completions', chat({ max_tokens: -5 }), 400],
  ['chat: max_tokens a string', '/v1/chat/completions', chat({ max_tokens: 'ten' }), 400],
  ['chat: temperature 3', '/v1/chat/completions', chat({ temperature: 3 }), 400],
  ['chat: temperature a string', '/v1/chat/completions', chat({ temperature: 'hot' }), 400],
  ['chat: top_p 0', '/v1/chat/completions', chat({ top_p: 0 }), 400],
  ['chat: top_p 1.5', '/v1/chat/completions', chat({ top_p: 1.5 }), 400],
  ['chat: stream a string', '/v1/chat/completions', chat({ stream: 'yes' }), 400],
  ['chat: stop a number', '/v1/chat/completions', chat({ stop: 5 }), 400],
  ['chat: empty stop string', '/v1/chat/completions', chat({ stop: [''] }), 400],
  ['chat: top_logprobs 50', '/v1/chat/completions', chat({ logprobs: true, top_logprobs: 50 }), 400],
  ['chat: top_logprobs without logprobs', '/v1/chat/completions', chat({ top_logprobs: 2 }), 400],
  ['chat: n 2', '/v1/chat/completions', chat({ n: 2 }), 400],
  ['chat: session_id a number', '/v1/chat/completions', chat({ session_id: 123 }), 400],
  ['chat: priority 101', '/v1/chat/completions', chat({ priority: 101 }), 400],
  ['chat: priority -1000', '/v1/chat/completions', chat({ priority: -1000 }), 400],
  ['chat: priority a string', '/v1/chat/completions', chat({ priority: 'high' }), 400],
  ['chat: priority fractional', '/v1/chat/completions', chat({ priority: 1.5 }), 400],
  ['chat: cache_salt an object', '/v1/chat/completions', chat({ cache_salt: {} }), 400],
  ['chat: stream_options a string', '/v1/chat/completions', chat({ stream_options: 'x' }), 400],
  ['chat: seed a string', '/v1/chat/completions', chat({ seed: 'abc' }), 400],
  ['chat: tools an object', '/v1/chat/completions', chat({ tools: {} }), 400],
  ['chat: cache_control of another type', '/v1/chat/completions',
    '{"messages": [{"role": "user", "content": "x", "cache_control": {"type": "ephemeral"}}]}', 400],
  ['completions: no prompt', '/v1/completions', '{"max_tokens": 2}', 400],
  ['completions: empty prompt', '/v1/completions', '{"prompt": ""}', 400],
  ['completions: empty id list', '/v1/completions', '{"prompt": []}', 400],
  ['completions: negative token id', '/v1/completions', '{"prompt": [-1, 5]}', 400],
  ['completions: token id beyond the vocabulary', '/v1/completions', '{"prompt": [999999999]}', 400],
  ['completions: several prompts', '/v1/completions', '{"prompt": ["a", "b"]}', 400],
  ['completions: prompt longer than the cache can hold', '/v1/completions',
    JSON.stringify({ prompt: words(4000, 3), max_tokens: 1 }), 400],
  ['completions: logprobs 21', '/v1/completions', '{"prompt": "x", "logprobs": 21}', 400],
  ['tokenize: nothing to tokenize', '/tokenize', '{}', 400],
  ['tokenize: prompt a number', '/tokenize', '{"prompt": 7}', 400],
  ['detokenize: tokens a string', '/detokenize', '{"tokens": "abc"}', 400],
  ['detokenize: id beyond the vocabulary', '/detokenize', '{"tokens": [99999999]}', 400],
  ['pin: no content form', '/cache/pin', '{}', 400],
  ['pin: two content forms', '/cache/pin', '{"block_hashes": [1], "token_ids": [1]}', 400],
  ['pin: hashes a string', '/cache/pin', '{"block_hashes": "x"}', 400],
  ['pin: negative ttl', '/cache/pin', '{"block_hashes": [1], "ttl_s": -1}', 400],
  ['pin: priority out of range', '/cache/pin', '{"block_hashes": [1], "priority": 1000}', 400],
  ['pin: float hashes', '/cache/pin', '{"block_hashes": [1.5]}', 400],
  ['unpin: bad messages', '/cache/unpin', '{"messages": [{"role": "user"}]}', 400],
  ['evict: no hashes', '/cache/evict', '{}', 400],
  ['evict: descendants a string', '/cache/evict', '{"block_hashes": [1], "descendants": "yes"}', 400],
  ['legacy pin: content form', '/hicache/pin_blocks', '{"token_ids": [1, 2]}', 400],
  ['flush: not JSON', '/cache/flush', 'nope', 400],
];

test(`bad input: ${CASES.length} malformed requests get a 4xx with a clear message`, async () => {
  assert.ok(CASES.length >= 30);
  // Something cached to compare against.
  await server.post('/v1/completions', { prompt: words(100, 1), max_tokens: 2 });
  const before = (await server.get('/cache/state?detail=tree', ADMIN)).json;
  for (const [name, path, body, status] of CASES) {
    const r = await server.post(path, body, ADMIN);
    assert.equal(r.status, status, `${name}: got ${r.status} ${r.text}`);
    assert.ok(r.json && r.json.error && typeof r.json.error.message === 'string' && r.json.error.message.length > 5,
      `${name}: no clear error message: ${r.text}`);
    assert.equal(r.json.error.type, 'invalid_request_error', name);
  }
  // Invalid UTF-8 in the body.
  const raw = await fetch(server.base + '/v1/completions', { method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: Buffer.concat([Buffer.from('{"prompt": "'), Buffer.from([0xff, 0xfe]), Buffer.from('"}')]) });
  assert.equal(raw.status, 400);
  assert.match((await raw.json()).error.message, /UTF-8/);
  // Wrong routes and methods.
  assert.equal((await server.get('/v2/nothing')).status, 404);
  assert.equal((await server.get('/cache/state?detail=forest', ADMIN)).status, 400);
  // Nothing changed, and the server still serves.
  const after = (await server.get('/cache/state?detail=tree', ADMIN)).json;
  assert.deepEqual(after.nodes.map((n) => n.block_hashes), before.nodes.map((n) => n.block_hashes));
  assert.equal(after.device.pinned_blocks, before.device.pinned_blocks);
  assert.equal((await server.get('/health')).status, 200);
  const ok = await server.post('/v1/completions', { prompt: 'still alive', max_tokens: 2 });
  assert.equal(ok.status, 200);
});

test('unknown block hashes are skipped and counted, not an error', async () => {
  const r = await server.post('/cache/pin', { block_hashes: [12345, -6789] }, ADMIN);
  assert.equal(r.status, 200);
  assert.equal(r.json.pinned_count, 0);
  assert.equal(r.json.unknown_count, 2);
  const u = await server.post('/hicache/unpin_blocks', { block_hashes: [12345] }, ADMIN);
  assert.equal(u.json.unpinned_count, 0);
});

// Found by the request fuzzer: without max_tokens a request asks for the rest of the
// context, which is larger than the server's pool; it used to fail with 500 "the request
// cannot fit the KV pool". Output is capped by the pool: it ends with finish_reason
// "length" once prompt + output fill the pool. A server of its own with a 512-token pool
// (the case is the same at any size below the context; 2,048 generated tokens took 2.5 min
// under the sanitizers).
test('a request without max_tokens on a pool smaller than the context ends with length', async () => {
  const small = await startServer(['--kv-cache-tokens', '512']);
  try {
    const r = await small.post('/v1/completions', { prompt: words(40, 3), ignore_eos: true });
    assert.equal(r.status, 200, JSON.stringify(r.json));
    assert.equal(r.json.choices[0].finish_reason, 'length');
    const u = r.json.usage;
    assert.equal(u.prompt_tokens + u.completion_tokens, 512);
    const ok = await small.post('/v1/completions', { prompt: 'hi', max_tokens: 2, priority: -100 });
    assert.equal(ok.status, 200);
  } finally {
    await small.stop();
  }
});
