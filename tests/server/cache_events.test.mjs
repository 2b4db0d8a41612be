// Black-box tests of what the cache dashboard reads from `strata serve` and `strata route`
// (docs/dashboard.md, docs/kv-events.md): GET /cache/events followed through requests, pins,
// evictions and a flush must rebuild exactly /cache/state's blocks; the admin key, the cap
// on subscribers, removal of a client that leaves, the end of streams at shutdown;
// GET /cache/node; the page and its assets (content types, ETags, 304, 404); the router's
// /dashboard/config and /workers/cache_state.
// Run by CTest: node --test tests/server/cache_events.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { startServer, words, STRATA, tinyQwen3Model } from './server_harness.mjs';
import { RawConn, destroyAllRawConns } from './raw_http.mjs';

const KEY = 'cache-events-key';
const ADMIN = { authorization: 'Bearer ' + KEY };
let server;
let router;

// 64-bit integers (block hashes) as decimal strings, exactly; smaller numbers as numbers.
function parseExact(text) {
  return JSON.parse(text.replace(/(?<=[[,:]\s*)(-?\d{16,})(?=\s*[\],}])/g, '"$1"'));
}
const hashKey = (h) => String(h);

// A client of GET /cache/events: reads the stream as it comes and keeps every event.
class EventStream {
  static async open(base, headers = ADMIN) {
    const ctrl = new AbortController();
    const r = await fetch(base + '/cache/events', { headers, signal: ctrl.signal });
    const s = new EventStream(r, ctrl);
    if (r.status === 200) s.pump();
    return s;
  }

  constructor(response, ctrl) {
    this.response = response;
    this.status = response.status;
    this.ctrl = ctrl;
    this.events = [];     // { event, data } in order ("message" when unnamed)
    this.comments = 0;
    this.ended = false;   // the server ended the stream cleanly
    this.error = null;    // the stream broke (or was aborted by us)
    this.waiters = new Set();
  }

  async pump() {
    const reader = this.response.body.getReader();
    const decoder = new TextDecoder();
    let buf = '';
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let end;
        while ((end = buf.indexOf('\n\n')) >= 0) {
          const block = buf.slice(0, end);
          buf = buf.slice(end + 2);
          let event = 'message';
          const data = [];
          for (const line of block.split('\n')) {
            if (line.startsWith(':')) this.comments++;
            else if (line.startsWith('event: ')) event = line.slice(7);
            else if (line.startsWith('data: ')) data.push(line.slice(6));
          }
          if (data.length > 0) this.events.push({ event, data: parseExact(data.join('\n')) });
        }
        this.poke();
      }
      this.ended = true;
    } catch (e) {
      this.error = e;
    }
    this.poke();
  }

  poke() { for (const w of this.waiters) w(); }

  // Resolves once pred() holds; fails the test after ms.
  async until(pred, what, ms = 20000) {
    if (pred()) return;
    await new Promise((resolve, reject) => {
      const check = () => { if (pred()) { done(); resolve(); } };
      const timer = setTimeout(() => { done(); reject(new Error('timed out waiting for ' + what)); }, ms);
      const done = () => { clearTimeout(timer); this.waiters.delete(check); };
      this.waiters.add(check);
    });
  }

  batches() { return this.events.filter((e) => e.event === 'message').map((e) => e.data); }
  close() { this.ctrl.abort(); }
}

// Applies batches to a set of block hashes, as a consumer of the stream would, checking
// that they make sense on the way.
function replay(batches, counts = {}) {
  const blocks = new Set();
  for (const b of batches) {
    assert.equal(typeof b.ts, 'number');
    for (const ev of b.events) {
      counts[ev.type] = (counts[ev.type] ?? 0) + 1;
      if (ev.type === 'BlockStored') {
        assert.equal(ev.medium, 'GPU');
        assert.equal(ev.block_size, 16);
        assert.equal(ev.lora_id, null);
        assert.equal(ev.token_ids.length, 16 * ev.block_hashes.length);
        assert.ok(ev.parent_block_hash === null || blocks.has(hashKey(ev.parent_block_hash)),
          'the parent of a stored block is unknown');
        for (const h of ev.block_hashes) {
          assert.ok(!blocks.has(hashKey(h)), `block ${h} stored twice`);
          blocks.add(hashKey(h));
        }
      } else if (ev.type === 'BlockRemoved') {
        assert.equal(ev.medium, 'GPU');
        for (const h of ev.block_hashes) {
          assert.ok(blocks.delete(hashKey(h)), `block ${h} removed but never stored`);
        }
      } else {
        assert.equal(ev.type, 'AllBlocksCleared');
        blocks.clear();
      }
    }
  }
  return blocks;
}

async function tree(s = server) {
  const r = await fetch(s.base + '/cache/state?detail=tree', { headers: ADMIN });
  assert.equal(r.status, 200);
  return parseExact(await r.text());
}

const treeBlocks = (t) => new Set(t.nodes.flatMap((n) => n.block_hashes.map(hashKey)));

async function complete(prompt) {
  const r = await server.post('/v1/completions', { prompt, max_tokens: 3, temperature: 0 });
  assert.equal(r.status, 200, r.text);
}

async function metric(name) {
  const m = await server.get('/metrics');
  for (const line of m.text.split('\n')) {
    if (line.startsWith(name + ' ')) return Number(line.split(' ').pop());
  }
  assert.fail(`no metric ${name}`);
}

async function waitFor(fn, what, ms = 20000) {
  const until = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > until) assert.fail('timed out waiting for ' + what);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const sameSet = (a, b) => a.size === b.size && [...a].every((x) => b.has(x));

before(async () => {
  // 1024 tokens (64 pages): a few prompts of ~300 tokens evict.
  server = await startServer(['--kv-cache-tokens', '1024', '--admin-api-key', KEY,
    '--shutdown-timeout-s', '20']);
});

after(async () => {
  destroyAllRawConns();
  if (router) await router.stop();
  if (server) await server.stop();
});

test('the event stream rebuilds the cache: requests, pins, evictions, a flush', async () => {
  const s = await EventStream.open(server.base);
  assert.equal(s.status, 200);
  assert.match(s.response.headers.get('content-type'), /^text\/event-stream/);
  assert.equal(s.response.headers.get('cache-control'), 'no-cache');
  await s.until(() => s.events.length > 0, 'hello');
  assert.equal(s.events[0].event, 'hello');
  assert.equal(s.events[0].data.seq, 0, 'a fresh server has published nothing');

  for (let i = 0; i < 6; i++) await complete(words(300, 40 + i));  // over the pool: evictions
  const t1 = await tree();
  const leaf = t1.nodes.find((n) => !t1.nodes.some((c) => c.parent === n.id));
  let r = await fetch(server.base + '/cache/evict', { method: 'POST', headers: { ...ADMIN, 'content-type': 'application/json' },
    body: `{"block_hashes": [${leaf.block_hashes.at(-1)}]}` });
  assert.equal(r.status, 200);
  assert.equal((await r.json()).evicted_blocks, 1);
  const pinned = (await tree()).nodes[0].block_hashes.slice(0, 2);
  r = await fetch(server.base + '/cache/pin', { method: 'POST', headers: { ...ADMIN, 'content-type': 'application/json' },
    body: `{"block_hashes": [${pinned.join(',')}]}` });
  assert.equal(r.status, 200);
  assert.equal((await r.json()).pinned_count, 2);
  r = await server.post('/cache/flush', {}, ADMIN);
  assert.equal(r.status, 200);
  await complete('after the flush ' + words(40, 99));

  // The stream lags the answers a little: wait until what it says is what the cache holds.
  let cached;
  await waitFor(async () => {
    cached = treeBlocks(await tree());
    return sameSet(replay(s.batches()), cached);
  }, 'the replayed blocks to equal /cache/state');
  const counts = {};
  replay(s.batches(), counts);
  assert.ok(counts.BlockStored > 0 && counts.BlockRemoved > 0, JSON.stringify(counts));
  for (const h of pinned) assert.ok(cached.has(hashKey(h)), 'a pinned block survives the flush');
  const seqs = s.batches().map((b) => b.seq);
  assert.deepEqual(seqs, seqs.map((_, i) => i), 'sequence numbers start at hello and have no gaps');
  // /cache/state and /load count the batches published (the next seq): a router replays
  // from a tree's count, and sees batches it lost in the load's.
  const next = (await tree()).kv_events_next_seq;
  assert.equal(next, seqs.length, 'the tree holds every batch before its count');
  assert.equal((await (await fetch(server.base + '/load')).json()).kv_events_next_seq, next);
  assert.equal(await metric('strata_cache_events_subscribers'), 1);
  s.close();
  await waitFor(async () => (await metric('strata_cache_events_subscribers')) === 0, 'the client to be removed');
  assert.equal(await metric('strata_cache_events_dropped_subscribers_total'), 0);
});

test('a client that joins late starts at the next batch', async () => {
  const s = await EventStream.open(server.base);
  await s.until(() => s.events.length > 0, 'hello');
  const start = s.events[0].data.seq;
  assert.ok(start > 0);
  await complete(words(50, 7));
  await s.until(() => s.batches().length > 0, 'a batch');
  assert.equal(s.batches()[0].seq, start);
  s.close();
});

test('the admin key guards /cache/events and /cache/node', async () => {
  for (const headers of [{}, { authorization: 'Bearer wrong' }]) {
    const s = await EventStream.open(server.base, headers);
    assert.equal(s.status, 401);
    assert.equal((await s.response.json()).error.code, 'unauthenticated');
    assert.equal((await server.get('/cache/node?id=1', headers)).status, 401);
  }
});

test('at most 32 clients follow at once; more get 503; those that leave are removed', async () => {
  const streams = [];
  for (let i = 0; i < 32; i++) streams.push(await EventStream.open(server.base));
  await Promise.all(streams.map((s) => s.until(() => s.events.length > 0, 'hello')));
  assert.ok(streams.every((s) => s.status === 200));
  assert.equal(await metric('strata_cache_events_subscribers'), 32);
  const extra = await EventStream.open(server.base);
  assert.equal(extra.status, 503);
  const body = await extra.response.json();
  assert.match(body.error.message, /32 clients/);
  streams.pop().close();
  await waitFor(async () => (await metric('strata_cache_events_subscribers')) === 31, 'one slot to free');
  const again = await EventStream.open(server.base);
  assert.equal(again.status, 200);
  streams.push(again);
  // Every client gets every batch.
  await complete(words(40, 11));
  await Promise.all(streams.map((s) => s.until(() => s.batches().length > 0, 'a batch')));
  for (const s of streams) s.close();
  await waitFor(async () => (await metric('strata_cache_events_subscribers')) === 0, 'every client to be removed');
});

test('/cache/node: one node with its tokens, text and hashes; 400 and 404', async () => {
  await complete(words(120, 5));
  const t = await tree();
  const node = t.nodes.find((n) => n.tokens > 0);
  const r = await fetch(server.base + `/cache/node?id=${node.id}`, { headers: ADMIN });
  assert.equal(r.status, 200);
  const n = parseExact(await r.text());
  assert.equal(n.id, node.id);
  assert.equal(n.parent, node.parent);
  assert.equal(n.tokens, node.tokens);
  assert.equal(n.token_ids.length, node.tokens);
  assert.deepEqual(n.block_hashes.map(hashKey), node.block_hashes.map(hashKey));
  for (const k of ['on_device', 'on_host', 'in_storage', 'session_protected']) assert.equal(typeof n[k], 'boolean', k);
  for (const k of ['pin_ref', 'lock_ref', 'hit_count', 'last_access_ms']) assert.equal(typeof n[k], 'number', k);
  assert.equal(n.on_device, true);
  const d = await server.post('/detokenize', { tokens: n.token_ids });
  if (d.status === 200) assert.equal(n.text, d.json.prompt);
  else assert.equal(n.text, null, d.text);
  for (const q of ['', '?id=', '?id=abc', '?id=-1', '?id=1x', '?id=1.5', '?id=99999999999999999999999']) {
    const bad = await server.get('/cache/node' + q, ADMIN);
    assert.equal(bad.status, 400, q);
    assert.equal(bad.json.error.code, 'invalid_argument');
  }
  for (const id of [0, 999999999]) {
    const missing = await server.get(`/cache/node?id=${id}`, ADMIN);
    assert.equal(missing.status, 404, String(id));
    assert.equal(missing.json.error.code, 'not_found');
  }
});

test('the page and its assets: content types, ETags, 304, 404, no key needed', async () => {
  for (const p of ['/dashboard', '/dashboard/', '/dashboard/index.html']) {
    const r = await fetch(server.base + p);
    assert.equal(r.status, 200, p);
    assert.equal(r.headers.get('content-type'), 'text/html; charset=utf-8');
    assert.match(await r.text(), /<html/i);
  }
  const d3 = await fetch(server.base + '/dashboard/d3.min.js');
  assert.equal(d3.status, 200);
  assert.equal(d3.headers.get('content-type'), 'text/javascript; charset=utf-8');
  assert.equal(d3.headers.get('cache-control'), 'no-cache');
  const etag = d3.headers.get('etag');
  assert.match(etag, /^"[0-9a-f]{16}"$/);
  assert.match(await d3.text(), /d3js\.org/);
  const again = await fetch(server.base + '/dashboard/d3.min.js', { headers: { 'if-none-match': etag } });
  assert.equal(again.status, 304);
  assert.equal(again.headers.get('etag'), etag);
  assert.equal(await again.text(), '');
  const changed = await fetch(server.base + '/dashboard/d3.min.js', { headers: { 'if-none-match': '"0000"' } });
  assert.equal(changed.status, 200);
  await changed.arrayBuffer();
  const license = await fetch(server.base + '/dashboard/d3-LICENSE.txt');
  assert.equal(license.headers.get('content-type'), 'text/plain; charset=utf-8');
  assert.match(await license.text(), /Mike Bostock/);
  for (const [name, type] of [['dashboard.js', 'text/javascript'], ['dashboard.css', 'text/css']]) {
    const r = await fetch(server.base + '/dashboard/' + name);
    if (r.status === 404) continue;  // the page may be made of other files
    assert.equal(r.status, 200);
    assert.ok(r.headers.get('content-type').startsWith(type), name);
    await r.arrayBuffer();
  }
  assert.equal((await server.get('/dashboard/nope.js')).status, 404);
  // Paths that try to leave the table, sent as is (fetch would normalise them).
  const conn = new RawConn(Number(new URL(server.base).port));
  const paths = ['/dashboard/../health', '/dashboard/..%2F..%2Fetc%2Fpasswd', '/dashboard//etc/passwd',
    '/dashboard/%2e%2e/index.html'];
  for (const p of paths) conn.write(`GET ${p} HTTP/1.1\r\nHost: x\r\n\r\n`);
  assert.ok(await conn.until(() => conn.responses().responses.length === paths.length, 10000));
  for (const resp of conn.responses().responses) assert.equal(resp.status, 404);
  conn.destroy();

  const c = await server.get('/dashboard/config');
  assert.equal(c.status, 200);
  assert.equal(c.json.mode, 'worker');
  assert.equal(c.json.auth_required, true);
  assert.equal(c.json.page_size, 16);
  assert.equal(typeof c.json.model, 'string');
  assert.match(c.json.version, /^\d+\.\d+\.\d+/);
  assert.ok(!c.text.includes(KEY));
});

async function startRouter(args) {
  const proc = spawn(STRATA, ['route', '--model', tinyQwen3Model(), '--port', '0', '--log-level', 'warn',
    '--admin-api-key', KEY, '--load-poll-ms', '50', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d.toString(); });
  const port = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error('router did not start: ' + stderr)), 30000);
    proc.stdout.on('data', (d) => {
      out += d.toString();
      const m = out.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`router exited ${code}: ${stderr}`)); });
  });
  const base = `http://127.0.0.1:${port}`;
  const get = async (p, headers = {}) => {
    const r = await fetch(base + p, { headers });
    const text = await r.text();
    let json = null;
    try { json = JSON.parse(text); } catch { /* not JSON */ }
    return { status: r.status, json, text, headers: r.headers };
  };
  return {
    base, get,
    async post(p, body, headers = {}) {
      const r = await fetch(base + p, { method: 'POST', headers: { 'content-type': 'application/json', ...headers },
        body: JSON.stringify(body) });
      return { status: r.status, json: await r.json().catch(() => null) };
    },
    async stop() {
      if (proc.exitCode !== null || proc.signalCode !== null) return proc.exitCode ?? proc.signalCode;
      const exited = new Promise((r) => proc.on('exit', (code, sig) => r(code ?? sig)));
      process.kill(proc.pid, 'SIGTERM');
      return exited;
    },
  };
}

test('the router: its dashboard and a worker\'s cache state', async () => {
  router = await startRouter(['--worker', server.base]);
  await waitFor(async () => {
    const w = await router.get('/workers');
    return w.json.workers.length === 1 && w.json.workers[0].joined;
  }, 'the worker to join');
  const c = await router.get('/dashboard/config');
  assert.equal(c.status, 200);
  assert.equal(c.json.mode, 'router');
  assert.equal(c.json.auth_required, true);
  assert.equal(c.json.page_size, 16);
  const page = await router.get('/dashboard');
  assert.equal(page.status, 200);
  assert.equal(page.headers.get('content-type'), 'text/html; charset=utf-8');
  assert.equal((await router.get('/dashboard/d3.min.js')).status, 200);

  const url = encodeURIComponent(server.base);
  assert.equal((await router.get(`/workers/cache_state?url=${url}`)).status, 401);
  assert.equal((await router.get('/workers/cache_state', ADMIN)).status, 400);
  assert.equal((await router.get(`/workers/cache_state?url=${url}&detail=all`, ADMIN)).status, 400);
  const unknown = await router.get('/workers/cache_state?url=' + encodeURIComponent('http://127.0.0.1:9'), ADMIN);
  assert.equal(unknown.status, 404);
  const r = await fetch(router.base + `/workers/cache_state?url=${url}&detail=tree`, { headers: ADMIN });
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('x-strata-worker'), server.base);
  const viaRouter = parseExact(await r.text());
  const direct = await tree();
  assert.deepEqual(treeBlocks(viaRouter), treeBlocks(direct));
  assert.equal(viaRouter.page_size, 16);
  const summary = await router.get(`/workers/cache_state?url=${url}`, ADMIN);
  assert.equal(summary.status, 200);
  assert.equal(summary.json.nodes, undefined);

  // A registered worker that does not answer: 502.
  const added = await router.post('/workers', { url: 'http://127.0.0.1:9' }, ADMIN);
  assert.equal(added.status, 201);
  const down = await router.get('/workers/cache_state?url=' + encodeURIComponent('http://127.0.0.1:9'), ADMIN);
  assert.equal(down.status, 502);
  assert.match(down.json.error.message, /127\.0\.0\.1:9/);
});

test('shutdown ends the streams cleanly', async () => {
  const s = await EventStream.open(server.base);
  await s.until(() => s.events.length > 0, 'hello');
  const code = await server.stop();
  await s.until(() => s.ended || s.error, 'the stream to end');
  assert.equal(s.error, null, 'the stream ended with its last chunk, not cut');
  assert.equal(s.ended, true);
  assert.equal(code, 0);
});
