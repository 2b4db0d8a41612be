// Who may pin what (engine/pin_policy.h), against a real server with an admin key:
// without the key a message's cache_control makes only soft pins with a capped TTL inside
// the clients' own budget; with it, hard pins; the Authorization scheme is case-insensitive.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, words } from './server_harness.mjs';

const KEY = 'secret';
const ADMIN = { authorization: `Bearer ${KEY}` };

async function pins(server) {
  const s = await server.get('/cache/state', ADMIN);
  assert.equal(s.status, 200);
  return { pinned: s.json.device.pinned_blocks, soft: s.json.device.soft_pinned_blocks };
}

function pinnedChat(system, ttl) {
  const cache_control = ttl === undefined ? { type: 'pin' } : { type: 'pin', ttl_s: ttl };
  return {
    messages: [{ role: 'system', content: system, cache_control }, { role: 'user', content: 'hi' }],
    max_tokens: 2, temperature: 0,
  };
}

test('without the key a cache_control pin is soft and TTL-capped; with it, hard', async () => {
  const server = await startServer(['--admin-api-key', KEY, '--max-client-pin-ttl-s', '60']);
  try {
    // The finding: an unauthenticated hard pin request (no ttl_s).
    const r = await server.post('/v1/chat/completions', pinnedChat(words(300, 7)));
    assert.equal(r.status, 200, r.text);
    let p = await pins(server);
    assert.ok(p.pinned > 0, 'the client pin was applied');
    assert.equal(p.soft, p.pinned, 'every pin a client made is soft');
    // The tree reports them per node too (the dashboard draws soft pins apart).
    const tree = await server.get('/cache/state?detail=tree', ADMIN);
    const softNodes = tree.json.nodes.filter((n) => n.soft_pinned_blocks > 0);
    assert.ok(softNodes.length > 0, 'nodes carry soft_pinned_blocks');
    assert.equal(softNodes.reduce((a, n) => a + n.soft_pinned_blocks, 0), p.soft);
    // The cache-control API itself stays closed without the key.
    assert.equal((await server.post('/cache/pin', { block_hashes: [1] })).status, 401);
    assert.equal((await server.post('/cache/flush', {})).status, 401);
    assert.equal((await server.post('/session/tool_start', { session_id: 'x' })).status, 401);
    assert.equal((await server.post('/hicache/pin_blocks', { block_hashes: [1] })).status, 401);
    // With the key, the same request form makes a hard pin.
    const a = await server.post('/v1/chat/completions', pinnedChat(words(300, 8)), ADMIN);
    assert.equal(a.status, 200, a.text);
    p = await pins(server);
    assert.ok(p.pinned - p.soft > 0, 'an admin pin without ttl_s is hard');
  } finally {
    await server.stop();
  }
});

test('client pins live inside their own budget; refusals are counted, the request succeeds', async () => {
  // The tiny model's pool: 65,536 tokens = 4,096 pages of 16; 0.002 of it is 8 pages.
  const server = await startServer(['--admin-api-key', KEY, '--max-client-pinned-ratio', '0.002']);
  try {
    const r = await server.post('/v1/chat/completions', pinnedChat(words(600, 9), 100));
    assert.equal(r.status, 200, r.text);
    assert.equal((await pins(server)).pinned, 0, 'over the client budget: nothing pinned');
    const m = await server.get('/metrics');
    assert.match(m.text, /strata_cache_control_pins_refused_total 1\b/);
    // An admin pin of the same content is not held to the clients' budget.
    const a = await server.post('/cache/pin', {
      messages: [{ role: 'system', content: words(600, 9) }],
    }, ADMIN);
    assert.equal(a.status, 200, a.text);
    assert.ok(a.json.pinned_count > 8);
  } finally {
    await server.stop();
  }
});

test('the Authorization scheme is case-insensitive and a wrong key is refused', async () => {
  const server = await startServer(['--admin-api-key', KEY]);
  try {
    for (const scheme of ['Bearer', 'bearer', 'BEARER', 'bEaReR']) {
      const r = await server.get('/cache/state', { authorization: `${scheme} ${KEY}` });
      assert.equal(r.status, 200, scheme);
    }
    for (const value of [`Bearer ${KEY}x`, `Bearer ${KEY.slice(0, -1)}`, `Basic ${KEY}`, KEY, '']) {
      const r = await server.get('/cache/state', { authorization: value });
      assert.equal(r.status, 401, value);
      assert.equal(r.json.error.code, 'unauthenticated');
    }
  } finally {
    await server.stop();
  }
});
