// Black-box tests of the hierarchical cache through a real `strata serve`: the seed's V6
// scenario (warm, pin, flood, next turn from the host with identical greedy output), the
// same through Redis after a restart of Strata, and Redis stopped mid-run.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import net from 'node:net';
import { startServer, words } from './server_harness.mjs';

const ADMIN = { authorization: 'Bearer k' };
let reference;  // a plain server: what the model answers without any cache
let redis;
let redisPort;

async function freePort() {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.listen(0, '127.0.0.1', () => { const { port } = srv.address(); srv.close(() => resolve(port)); });
  });
}

async function startRedis(port) {
  const proc = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '',
    '--appendonly', 'no'], { stdio: 'ignore' });
  for (let i = 0; i < 100; i++) {
    const ok = await new Promise((resolve) => {
      const s = net.connect(port, '127.0.0.1', () => { s.end(); resolve(true); });
      s.on('error', () => resolve(false));
    });
    if (ok) return proc;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error('redis-server did not start (scripts/install-deps.sh installs it)');
}

function stopProc(proc) {
  return new Promise((resolve) => {
    if (proc.exitCode !== null) return resolve();
    proc.on('exit', () => resolve());
    process.kill(proc.pid, 'SIGTERM');
  });
}

before(async () => {
  reference = await startServer(['--kv-cache-tokens', '8192']);
  redisPort = await freePort();
  redis = await startRedis(redisPort);
});

after(async () => {
  if (reference) await reference.stop();
  if (redis) await stopProc(redis);
});

// A VIP conversation: a long system prompt and `turns` user/assistant exchanges.
function conversation(turns, seed) {
  const messages = [{ role: 'system', content: words(700, seed) }];
  for (let t = 0; t < turns; t++) {
    messages.push({ role: 'user', content: words(40, seed + 100 + t) });
    messages.push({ role: 'assistant', content: words(30, seed + 200 + t) });
  }
  messages.push({ role: 'user', content: words(40, seed + 999) });
  return messages;
}

async function chat(server, messages, extra = {}) {
  const r = await server.post('/v1/chat/completions', { messages, max_tokens: 8, temperature: 0, ...extra });
  assert.equal(r.status, 200, r.text);
  return r.json;
}

async function state(server) {
  const r = await server.get('/cache/state', ADMIN);
  assert.equal(r.status, 200, r.text);
  return r.json;
}

async function settle(server) {
  for (let i = 0; i < 400; i++) {
    const s = await state(server);
    if (s.requests.running === 0 && s.requests.waiting === 0 && (!s.host || s.host.transfers_in_flight === 0)) {
      return s;
    }
    await new Promise((r) => setTimeout(r, 25));
  }
  assert.fail('the server did not settle');
}

async function flood(server, n, seed) {
  for (let i = 0; i < n; i++) await chat(server, [{ role: 'user', content: words(350, seed + i) }], { max_tokens: 2 });
}

test('V6: pinned conversation leaves the device under a flood and the next turn comes from the host', async () => {
  const server = await startServer(['--kv-cache-tokens', '2048', '--enable-hierarchical-cache',
    '--hicache-ratio', '4', '--admin-api-key', 'k']);
  try {
    const warm = conversation(2, 7);
    await chat(server, warm);
    const pin = await server.post('/cache/pin', { messages: warm }, ADMIN);
    assert.equal(pin.status, 200, pin.text);
    assert.ok(pin.json.pinned_count > 30, pin.text);
    await flood(server, 16, 500);
    const s = await settle(server);
    assert.ok(s.evictions.evicted_pages_total > s.device.capacity_pages, 'the flood cycled the device pool');
    assert.ok(s.host.protected_pages >= pin.json.pinned_count, 'pinned blocks are on the host');
    const next = [...warm, { role: 'assistant', content: words(20, 3) }, { role: 'user', content: words(30, 4) }];
    const hit = await chat(server, next);
    const details = hit.usage.cached_tokens_details;
    assert.ok(details.host > 0, `served from the host: ${JSON.stringify(hit.usage)}`);
    assert.ok(hit.usage.prompt_tokens_details.cached_tokens >= pin.json.pinned_count * 16 - 16);
    const ref = await chat(reference, next);
    assert.equal(hit.choices[0].message.content, ref.choices[0].message.content, 'identical greedy output');
    // Flush drops the flood from every tier and keeps the pinned blocks on the host.
    const fl = await server.post('/cache/flush', {}, ADMIN);
    assert.equal(fl.status, 200, fl.text);
    assert.ok(fl.json.pinned_preserved >= pin.json.pinned_count);
    const after = await settle(server);
    assert.ok(after.host.protected_pages >= pin.json.pinned_count);
    assert.equal(after.device.pinned_blocks, pin.json.pinned_count);
    const again = await chat(server, next);
    assert.equal(again.choices[0].message.content, ref.choices[0].message.content);
    assert.ok(again.usage.cached_tokens_details.host > 0);
  } finally {
    await server.stop();
  }
});

test('bad hierarchical-cache options are refused at start with a clear message', async () => {
  for (const [args, msg] of [
    [['--enable-hierarchical-cache', '--hicache-ratio', '0.5'], /hicache-ratio/],
    [['--enable-hierarchical-cache', '--hicache-write-policy', 'sometimes'], /write policy/],
    [['--enable-hierarchical-cache', '--hicache-mem-layout', 'diagonal'], /layout/i],
    [['--hicache-storage-backend', 'file'], /enable-hierarchical-cache/],
    [['--enable-hierarchical-cache', '--hicache-storage-backend', 'redis',
      '--hicache-storage-backend-extra-config', '{"port": "six"}'], /port/],
  ]) {
    await assert.rejects(startServer(args), msg);
  }
});

test('Redis shares KV across a restart of Strata; Redis stopped mid-run degrades to computing', async () => {
  const redisArgs = ['--kv-cache-tokens', '2048', '--enable-hierarchical-cache', '--hicache-ratio', '4',
    '--admin-api-key', 'k', '--hicache-storage-backend', 'redis',
    '--hicache-storage-backend-extra-config', JSON.stringify({ port: redisPort, prefetch_threshold: 64 }),
    '--hicache-storage-prefetch-policy', 'wait_complete'];
  const convo = conversation(1, 17);
  const first = await startServer(redisArgs);
  try {
    await chat(first, convo);
    for (let i = 0; i < 400; i++) {
      const s = await state(first);
      if (s.storage.pages_written_total >= 40 && s.host.transfers_in_flight === 0) break;
      await new Promise((r) => setTimeout(r, 25));
    }
    assert.ok((await state(first)).storage.pages_written_total >= 40, 'the conversation reached Redis');
  } finally {
    await first.stop();
  }
  const second = await startServer(redisArgs);  // empty device and host pools
  try {
    const next = [...convo, { role: 'assistant', content: words(20, 5) }, { role: 'user', content: words(30, 6) }];
    const hit = await chat(second, next);
    assert.ok(hit.usage.cached_tokens_details.storage >= 40 * 16 - 16, JSON.stringify(hit.usage));
    const ref = await chat(reference, next);
    assert.equal(hit.choices[0].message.content, ref.choices[0].message.content, 'identical greedy output');
    // Redis goes away: requests still succeed (computed), faults are counted, nothing crashes.
    await stopProc(redis);
    redis = null;
    const other = conversation(1, 41);
    const r = await chat(second, other);
    assert.equal(r.usage.cached_tokens_details.storage, 0);
    const s = await settle(second);
    assert.ok(s.storage.faults_total + s.storage.get_errors > 0, JSON.stringify(s.storage));
    assert.equal((await second.get('/health')).status, 200);
    // Redis comes back on the same port: the tier works again.
    redis = await startRedis(redisPort);
    await chat(second, conversation(1, 43));
    for (let i = 0; i < 400; i++) {
      const st = await state(second);
      if (st.storage.set_written > 0) break;
      await new Promise((res) => setTimeout(res, 25));
    }
    assert.ok((await state(second)).storage.set_written > 0, 'writes resume after Redis returns');
  } finally {
    await second.stop();
  }
});

test('tool sessions: tool_start offloads, tool_end restores, bad calls get a clear 4xx', async () => {
  const server = await startServer(['--kv-cache-tokens', '2048', '--enable-hierarchical-cache',
    '--hicache-ratio', '4', '--admin-api-key', 'k']);
  try {
    const convo = conversation(1, 61);
    const first = await chat(server, convo, { session_id: 'agent-1' });
    const start = await server.post('/session/tool_start', { session_id: 'agent-1' }, ADMIN);
    assert.equal(start.status, 200, start.text);
    assert.equal(start.json.epoch, 1);
    assert.equal(start.json.tier, 'host');
    assert.equal(start.json.state, 'OFFLOADED');
    assert.ok(start.json.offloaded_tokens >= 700, start.text);
    const meta = await server.get('/session/kv_meta?session_id=agent-1', ADMIN);
    assert.equal(meta.status, 200);
    assert.deepEqual([meta.json.state, meta.json.tier, meta.json.epoch], ['OFFLOADED', 'host', 1]);
    assert.ok(meta.json.since > 1.7e12);
    // The gauge of sessions by state (the dashboard's chart) counts it as OFFLOADED.
    const metrics = (await server.get('/metrics')).text;
    assert.match(metrics, /strata_tool_sessions\{state="OFFLOADED"\} 1\b/);
    await flood(server, 10, 800);
    // Bad calls: each a clear 4xx, none changes the session.
    for (const [path, body, status] of [
      ['/session/tool_start', { session_id: 'nobody' }, 404],
      ['/session/tool_end', { session_id: 'nobody', epoch: 1 }, 404],
      ['/session/tool_start', { session_id: 'agent-1' }, 409],
      ['/session/tool_end', { session_id: 'agent-1', epoch: 9 }, 409],
      ['/session/tool_end', { session_id: 'agent-1' }, 400],
      ['/session/tool_end', { session_id: 'agent-1', epoch: 'one' }, 400],
      ['/session/tool_start', {}, 400],
      ['/session/tool_start', { session_id: 5 }, 400],
      ['/session/tool_start', { session_id: 'agent-1', colour: 'red' }, 400],
      ['/session/tool_start', '{"session_id": ', 400],
    ]) {
      const r = await server.post(path, body, ADMIN);
      assert.equal(r.status, status, `${path} ${JSON.stringify(body)}: ${r.text}`);
      assert.ok(r.json.error.message.length > 0);
    }
    assert.equal((await server.get('/session/kv_meta?session_id=nobody', ADMIN)).status, 404);
    assert.equal((await server.get('/session/kv_meta', ADMIN)).status, 400);
    assert.equal((await server.post('/session/tool_start', { session_id: 'agent-1' })).status, 401);
    const still = await server.get('/session/kv_meta?session_id=agent-1', ADMIN);
    assert.deepEqual([still.json.state, still.json.epoch], ['OFFLOADED', 1]);
    const end = await server.post('/session/tool_end', { session_id: 'agent-1', epoch: 1 }, ADMIN);
    assert.equal(end.status, 200, end.text);
    assert.equal(end.json.state, 'RUNNABLE');
    assert.equal(end.json.tier, 'device');
    assert.ok(end.json.restored_tokens >= 700, end.text);
    assert.equal((await server.post('/session/tool_end', { session_id: 'agent-1', epoch: 1 }, ADMIN)).status, 409);
    // The next turn of the agent is a device hit with the same output as a cold server.
    const next = [...convo, first.choices[0].message, { role: 'user', content: words(30, 62) }];
    const hit = await chat(server, next, { session_id: 'agent-1' });
    assert.ok(hit.usage.cached_tokens_details.device >= 700, JSON.stringify(hit.usage));
    const ref = await chat(reference, next);
    assert.equal(hit.choices[0].message.content, ref.choices[0].message.content);
  } finally {
    await server.stop();
  }
});

test('tool sessions need the host tier: a clear 409 without it', async () => {
  const server = await startServer(['--kv-cache-tokens', '2048']);
  try {
    await chat(server, conversation(0, 71), { session_id: 'x' });
    const r = await server.post('/session/tool_start', { session_id: 'x' });
    assert.equal(r.status, 409, r.text);
    assert.match(r.json.error.message, /enable-hierarchical-cache/);
  } finally {
    await server.stop();
  }
});
