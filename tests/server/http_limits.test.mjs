// Black-box tests of the HTTP layer's limits and robustness: slow and idle connections,
// clients that vanish mid-request, oversized headers and bodies, the connection cap, a
// raw-bytes fuzz loop and graceful shutdown. Real sockets on loopback, bounded in count
// and time; every server is stopped by its pid and every socket destroyed at the end.
// Run by CTest: node --test tests/server/http_limits.test.mjs
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { execFileSync } from 'node:child_process';
import { startServer } from './server_harness.mjs';
import { GET_HEALTH, RawConn, destroyAllRawConns, postRaw } from './raw_http.mjs';

// ---------------------------------------------------------------- helpers

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// For the losing side of a race: a timer that does not keep the process alive.
const deadline = (ms) => new Promise((r) => setTimeout(r, ms).unref());
const now = () => performance.now();

// Every raw socket a test opens is destroyed at the end, even when a test fails.
after(destroyAllRawConns);

// Stops a server by its pid (SIGTERM, the harness's stop()); one that has not exited
// after `ms` is killed, so that a hung shutdown fails the test instead of the suite.
async function stopServer(server, ms = 15000) {
  if (!server || server.proc.exitCode !== null || server.proc.signalCode !== null) return;
  let timer;
  const killed = new Promise((resolve) => {
    timer = setTimeout(() => {
      try { process.kill(server.pid, 'SIGKILL'); } catch { /* already gone */ }
      resolve('SIGKILL');
    }, ms);
  });
  try {
    return await Promise.race([server.stop(), killed]);
  } finally {
    clearTimeout(timer);
  }
}

// Starts a server for one test and registers its stop (and the sockets' end) with the test.
async function serverFor(t, args) {
  const server = await startServer(args);
  t.after(async () => {
    destroyAllRawConns();
    await stopServer(server);
  });
  server.port = Number(new URL(server.base).port);
  return server;
}

// Null when `r` is an acceptable answer: 2xx, 4xx, 501 or 503, and for an error a JSON
// body {"error": {"message", "type", "code"}}. Otherwise what is wrong with it.
function badResponse(r) {
  const ok = (r.status >= 200 && r.status < 300) || (r.status >= 400 && r.status < 500) ||
    r.status === 501 || r.status === 503;
  if (!ok) return `status ${r.status}`;
  if (r.status < 400) return null;
  let j;
  try { j = JSON.parse(r.body); } catch { return `status ${r.status} with a body that is not JSON: ${r.body.slice(0, 200)}`; }
  const e = j?.error;
  if (!e || typeof e !== 'object' || typeof e.message !== 'string' || typeof e.type !== 'string' || !('code' in e)) {
    return `status ${r.status} without {"error": {"message", "type", "code"}}: ${r.body.slice(0, 200)}`;
  }
  return null;
}

function assertJsonError(r, status, what) {
  assert.equal(r.status, status, `${what}: status ${r.status}: ${r.body.slice(0, 300)}`);
  const problem = badResponse(r);
  assert.equal(problem, null, `${what}: ${problem}`);
}

// One GET on a fresh connection that is closed afterwards (no keep-alive pool), so that
// it also checks that the server still accepts. Resolves { status, body } or rejects
// after `ms`.
function getFresh(port, path, ms = 5000) {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: '127.0.0.1', port, path, agent: false, timeout: ms }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { body += d; });
      res.on('end', () => resolve({ status: res.statusCode, body }));
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error(`GET ${path} took more than ${ms} ms`)));
    req.on('error', reject);
  });
}

async function getJson(port, path) {
  const r = await getFresh(port, path);
  assert.equal(r.status, 200, `GET ${path}: ${r.body}`);
  return JSON.parse(r.body);
}

// The sum of the samples of a Prometheus metric whose labels contain `labels`
// (e.g. 'phase="header"'); null when the metric is absent.
function metricValue(text, name, labels = '') {
  let sum = null;
  for (const line of text.split('\n')) {
    if (!line.startsWith(name)) continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/);
    if (!m || m[1] !== name || !(m[2] ?? '').includes(labels)) continue;
    sum = (sum ?? 0) + Number(m[3]);
  }
  return sum;
}

// A metric's value from /metrics. A baseline (`{ baseline: true }`) taken before anything
// happened may be absent (a labelled series can appear at its first increment): 0 then.
async function metric(port, name, labels = '', { baseline = false } = {}) {
  const r = await getFresh(port, '/metrics');
  assert.equal(r.status, 200);
  const v = metricValue(r.body, name, labels);
  if (v === null && baseline) return 0;
  assert.notEqual(v, null, `/metrics has no ${name}${labels ? `{${labels}}` : ''}`);
  return v;
}

// Polls until pred(value of fn()) holds; returns the last value (the caller asserts).
async function pollFor(fn, pred, ms, every = 25) {
  const end = now() + ms;
  let v = await fn();
  while (!pred(v) && now() < end) {
    await sleep(every);
    v = await fn();
  }
  return v;
}

const idle = (s) => s.requests.running === 0 && s.requests.waiting === 0 && s.device.request_pages === 0;
const stateLine = (s) => `running ${s.requests.running}, waiting ${s.requests.waiting}, ` +
  `request_pages ${s.device.request_pages}`;

// A streaming chat: parses the SSE events; never throws on a broken stream (`error`).
// onEvent(out) runs after every content chunk.
async function streamChat(base, body, { onEvent, signal } = {}) {
  const out = { status: 0, content: '', chunks: 0, done: false, finish: null, usage: null, error: null,
    endedAt: null, raw: '' };
  try {
    const r = await fetch(base + '/v1/chat/completions', {
      method: 'POST', headers: { 'content-type': 'application/json' }, signal,
      body: JSON.stringify({ ...body, stream: true }),
    });
    out.status = r.status;
    if (r.status !== 200) {
      out.raw = await r.text();
      return out;
    }
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, i);
        buf = buf.slice(i + 2);
        for (const line of ev.split('\n')) {
          if (!line.startsWith('data:')) continue;
          const data = line.slice(5).trim();
          if (data === '[DONE]') { out.done = true; continue; }
          const j = JSON.parse(data);
          if (j.usage) out.usage = j.usage;
          for (const c of j.choices ?? []) {
            if (c.delta?.content) { out.content += c.delta.content; out.chunks++; }
            if (c.finish_reason) out.finish = c.finish_reason;
          }
          onEvent?.(out);
        }
      }
    }
  } catch (e) {
    out.error = e;
  } finally {
    out.endedAt = now();
  }
  return out;
}

// Opens n RawConns, `batch` connects at a time (a burst of thousands of SYNs at once can
// overflow the listen backlog, which is not what these tests are about), running
// prepare(conn) on each; returns them all.
async function openMany(port, n, batch, prepare) {
  const all = [];
  for (let i = 0; i < n; i += batch) {
    const group = [];
    for (let k = i; k < Math.min(n, i + batch); k++) group.push(new RawConn(port));
    await Promise.all(group.map(async (c) => {
      assert.ok(await c.connected, `connection failed: ${c.error?.message}`);
      await prepare(c);
    }));
    all.push(...group);
  }
  return all;
}

// ---------------------------------------------------------------- 1. slow and idle connections

test('1,000 slow-header and 1,000 idle connections do not starve streaming clients', { timeout: 90000 }, async (t) => {
  // The test holds ~2,010 sockets here and the server as many; node (and the server)
  // raise their soft RLIMIT_NOFILE to the hard limit at start, so the hard limit decides.
  const hard = execFileSync('sh', ['-c', 'ulimit -Hn']).toString().trim();
  if (hard !== 'unlimited' && Number(hard) < 2300) {
    t.skip(`needs ~2,300 file descriptors per process; the hard RLIMIT_NOFILE is ${hard} (raise it with ulimit -Hn)`);
    return;
  }
  const server = await serverFor(t, ['--http-header-timeout-s', '2', '--http-max-connections', '3000',
    '--http-threads', '2']);
  const { port } = server;
  const headerTimeoutsBefore = await metric(port, 'strata_http_timeouts_total', 'phase="header"', { baseline: true });

  // 1,000 keep-alive connections: one complete request each, then silence (the idle
  // timeout is the default 60 s, far beyond this test).
  const idleConns = await openMany(port, 1000, 100, async (c) => {
    c.write(GET_HEALTH);
    assert.ok(await c.until(() => c.responses().responses.length === 1 || c.closed, 10000),
      'an idle connection got no answer to its first request');
    assert.equal(c.responses().responses[0]?.status, 200);
  });
  // 1,000 connections that send part of a header and then nothing.
  const slowConns = await openMany(port, 1000, 200, async (c) => {
    c.write('GET /health HTTP/1.1\r\nHost: x\r\n');
  });

  // Liveness: /health on a fresh connection keeps answering while all this is open.
  // It stops at the first failure (kept in samplerError), so that it never outlives the test.
  let sampling = true;
  let samples = 0;
  let slowestSample = 0;
  let samplerError = null;
  const sampler = (async () => {
    while (sampling) {
      const t0 = now();
      try {
        const r = await getFresh(port, '/health', 5000);
        if (r.status !== 200) throw new Error(`/health answered ${r.status}`);
      } catch (e) {
        samplerError = e;
        return;
      }
      slowestSample = Math.max(slowestSample, now() - t0);
      samples++;
      await sleep(200);
    }
  })();
  t.after(() => { sampling = false; });

  const open = await metric(port, 'strata_http_open_connections');
  assert.ok(open >= 1000, `strata_http_open_connections is ${open} with 2,000 connections open`);

  // 8 streaming clients complete normally meanwhile.
  const streams = await Promise.all(Array.from({ length: 8 }, (_, i) => streamChat(server.base, {
    messages: [{ role: 'user', content: `Tell me about number ${i}.` }], max_tokens: 32, temperature: 0,
  })));
  for (const [i, s] of streams.entries()) {
    assert.equal(s.status, 200, `stream ${i}: ${s.raw}`);
    assert.equal(s.error, null, `stream ${i} broke: ${s.error}`);
    assert.ok(s.done, `stream ${i} did not end with [DONE]`);
    assert.ok(['stop', 'length'].includes(s.finish), `stream ${i}: finish_reason ${s.finish}`);
  }

  // The server closes every slow-header connection, about 2 s after it connected.
  const lastConnect = Math.max(...slowConns.map((c) => c.connectedAt));
  const waitMs = Math.max(0, lastConnect + 10000 - now());
  await Promise.all(slowConns.map((c) => c.until(() => c.closed, waitMs)));
  const stillOpen = slowConns.filter((c) => !c.closed).length;
  assert.equal(stillOpen, 0, `${stillOpen} of 1,000 slow-header connections still open 10 s after connecting`);
  const early = slowConns.filter((c) => c.closedAt - c.connectedAt < 1500).length;
  assert.equal(early, 0, `${early} slow-header connections were closed before the 2 s header timeout`);
  // A 408 on the way out is fine; anything sent must be a JSON error.
  for (const c of slowConns) {
    for (const r of c.responses().responses) assert.equal(badResponse(r), null);
  }

  sampling = false;
  await sampler;
  assert.equal(samplerError, null, `/health stopped answering: ${samplerError?.message}`);
  assert.ok(samples >= 3, `only ${samples} /health samples`);
  t.diagnostic(`${samples} /health samples, slowest ${slowestSample.toFixed(0)} ms`);

  // A counter may trail its connection's close by a moment: poll it.
  const headerTimeouts = await pollFor(() => metric(port, 'strata_http_timeouts_total', 'phase="header"'),
    (v) => v - headerTimeoutsBefore >= 1000, 3000);
  assert.ok(headerTimeouts - headerTimeoutsBefore >= 1000,
    `strata_http_timeouts_total{phase="header"} rose by ${headerTimeouts - headerTimeoutsBefore}, not 1,000`);

  // The idle keep-alive connections were left alone, and still work.
  const idleClosed = idleConns.filter((c) => c.closed).length;
  assert.equal(idleClosed, 0, `${idleClosed} idle keep-alive connections were closed`);
  await Promise.all(idleConns.slice(0, 50).map(async (c) => {
    c.write(GET_HEALTH);
    assert.ok(await c.until(() => c.responses().responses.length === 2, 5000), 'an idle connection stopped answering');
    assert.equal(c.responses().responses[1].status, 200);
  }));
  const openAfter = await metric(port, 'strata_http_open_connections');
  assert.ok(openAfter >= 1000 && openAfter <= 1050,
    `strata_http_open_connections is ${openAfter} with 1,000 idle connections left`);

  // Closing them brings the gauge down.
  for (const c of idleConns) c.destroy();
  const gauge = await pollFor(() => metric(port, 'strata_http_open_connections'), (v) => v <= 20, 5000, 100);
  assert.ok(gauge <= 20, `strata_http_open_connections is ${gauge} after the clients closed`);
});

// ---------------------------------------------------------------- 2. clients that vanish

test('a client that disconnects mid-request has its request cancelled at once', { timeout: 60000 }, async (t) => {
  const server = await serverFor(t, []);
  const { port } = server;
  const state = () => getJson(port, '/cache/state');  // no --admin-api-key: open
  // A request long enough to still run when its client goes: most of the context.
  const { data: [model] } = await getJson(port, '/v1/models');
  const body = (extra) => JSON.stringify({
    messages: [{ role: 'user', content: 'Tell me a very long story.' }], temperature: 0, ignore_eos: true,
    max_tokens: Math.min(2000, model.max_model_len - 64), ...extra,
  });
  const waitRunning = async () => {
    const s = await pollFor(state, (x) => x.requests.running >= 1, 5000);
    assert.ok(s.requests.running >= 1, 'the request never ran');
  };
  const expectCancelled = async (what, disconnectsBefore) => {
    const t0 = now();
    const s = await pollFor(state, idle, 1000);
    assert.ok(idle(s), `${what}: 1 s after the client left: ${stateLine(s)}`);
    t.diagnostic(`${what}: cancelled within ${(now() - t0).toFixed(0)} ms`);
    const d = await pollFor(() => metric(port, 'strata_http_client_disconnects_total'),
      (v) => v >= disconnectsBefore + 1, 1000);
    assert.ok(d >= disconnectsBefore + 1, `${what}: strata_http_client_disconnects_total did not rise (${d})`);
  };

  // Non-streaming, with fetch: abort() closes the socket while the server is generating.
  let before = await metric(port, 'strata_http_client_disconnects_total', '', { baseline: true });
  const ctrl = new AbortController();
  const pending = fetch(server.base + '/v1/chat/completions', {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: body({}), signal: ctrl.signal,
  }).then((r) => r.text()).catch((e) => e);
  await waitRunning();
  await sleep(300);
  assert.equal((await state()).requests.running, 1, 'the request ended before the client left; make it longer');
  ctrl.abort();
  assert.equal((await pending).name, 'AbortError');
  await expectCancelled('non-streaming', before);

  // Streaming, on a raw socket that is destroyed after the first events arrive.
  before = await metric(port, 'strata_http_client_disconnects_total', '', { baseline: true });
  const c = new RawConn(port);
  assert.ok(await c.connected);
  c.write(postRaw('/v1/chat/completions', body({ stream: true })));
  assert.ok(await c.until(() => (c.data.toString('latin1').match(/data: /g) ?? []).length >= 3, 10000),
    'no stream events arrived');
  assert.match(c.data.toString('latin1'), /^HTTP\/1\.1 200/);
  c.destroy();
  await expectCancelled('streaming', before);
  assert.equal((await getFresh(port, '/health')).status, 200);
});

// ---------------------------------------------------------------- 3. oversized requests

test('an oversized header gets a 431 and an oversized body a 413, then the server serves on', { timeout: 60000 }, async (t) => {
  // Header limit: the default (16 KiB). Body limit: 1 MiB.
  const server = await serverFor(t, ['--http-max-body-bytes', '1048576']);
  const { port } = server;

  // Rejects `request` with `status` (a JSON error) and closes the connection. Sent in
  // pieces that stop once the server answers (see writeInPieces): a server may answer as
  // soon as it has seen too much header, or the Content-Length.
  const rejected = async (what, request, status) => {
    const c = new RawConn(port);
    assert.ok(await c.connected);
    await c.writeInPieces(request, 16384, 5);
    assert.ok(await c.until(() => c.closed, 5000), `${what}: the connection was not closed`);
    const { responses } = c.responses();
    assert.equal(responses.length, 1, `${what}: ${responses.length} responses (${c.error?.code ?? 'no error'}): ` +
      c.data.toString('latin1').slice(0, 200));
    assertJsonError(responses[0], status, what);
    c.destroy();
    assert.equal((await getFresh(port, '/health')).status, 200, `${what}: /health afterwards`);
  };

  // Under the limits, the same shapes are served (the limits are not too tight).
  const fine = new RawConn(port);
  assert.ok(await fine.connected);
  fine.write(`GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(8192)}\r\n\r\n`);
  assert.ok(await fine.until(() => fine.responses().responses.length === 1, 5000), 'an 8 KiB header got no answer');
  assert.equal(fine.responses().responses[0].status, 200);
  fine.destroy();
  // A 512 KiB body (answered with a 400: the prompt is a number) is read whole, request
  // after request on one keep-alive connection: the body's bytes never count as the next
  // request's header.
  const halfBody = JSON.stringify({ prompt: 7, pad: 'x'.repeat(512 * 1024) });
  const keep = new RawConn(port);
  assert.ok(await keep.connected);
  for (let k = 1; k <= 5; k++) {
    keep.write(postRaw('/tokenize', halfBody));
    assert.ok(await keep.until(() => keep.responses().responses.length === k || keep.closed, 5000),
      `512 KiB body #${k} got no answer`);
    assert.ok(!keep.closed, `the server closed the keep-alive connection at 512 KiB body #${k}`);
    assertJsonError(keep.responses().responses[k - 1], 400, `512 KiB body #${k}`);
  }
  keep.destroy();
  const half = await fetch(server.base + '/tokenize', { method: 'POST', headers: { 'content-type': 'application/json' },
    body: halfBody });
  assert.equal(half.status, 400, `a 512 KiB body with fetch: ${await half.text()}`);

  await rejected('64 KiB header value', `GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(65536)}\r\n\r\n`, 431);
  const big = JSON.stringify({ prompt: 'a'.repeat(2 * 1024 * 1024) });
  await rejected('2 MiB body', postRaw('/v1/completions', big), 413);
});

// ---------------------------------------------------------------- 4. the connection cap

test('--http-max-connections refuses the connection beyond it, and only that one', { timeout: 60000 }, async (t) => {
  const server = await serverFor(t, ['--http-max-connections', '50']);
  const { port } = server;
  // Nothing else has connected to this server yet: these 50 are all its connections.
  const conns = await openMany(port, 50, 10, async (c) => {
    c.write(GET_HEALTH);
    assert.ok(await c.until(() => c.responses().responses.length === 1, 5000));
    assert.equal(c.responses().responses[0].status, 200);
  });

  // The 51st is closed at once, possibly after a 503; never served, never left waiting.
  const extra = new RawConn(port);
  await extra.connected;
  extra.write(GET_HEALTH);
  const t0 = now();
  assert.ok(await extra.until(() => extra.closed, 2000), 'the 51st connection was not closed in 2 s; answers: ' +
    (extra.responses().responses.map((r) => r.status).join(', ') || 'none'));
  t.diagnostic(`51st connection closed after ${(now() - t0).toFixed(0)} ms`);
  for (const r of extra.responses().responses) assertJsonError(r, 503, 'the 51st connection');

  // Closing 10 makes room again.
  for (const c of conns.slice(0, 10)) c.destroy();
  const health = await pollFor(() => getFresh(port, '/health', 1000).catch((e) => ({ status: e.message })),
    (r) => r.status === 200, 3000, 100);
  assert.equal(health.status, 200, 'no new connection was accepted after 10 closed');
  assert.ok(await metric(port, 'strata_http_connections_refused_total') >= 1);
  const open = await metric(port, 'strata_http_open_connections');
  assert.ok(open >= 40 && open <= 45, `strata_http_open_connections is ${open} with 40 clients connected`);

  // The 40 that stayed open were never affected and still work.
  await Promise.all(conns.slice(10).map(async (c) => {
    assert.ok(!c.closed, 'an existing connection was closed');
    c.write(GET_HEALTH);
    assert.ok(await c.until(() => c.responses().responses.length === 2, 5000), 'an existing connection stopped answering');
    assert.equal(c.responses().responses[1].status, 200);
  }));
});

test('a keep-alive connection left idle is closed after --http-idle-timeout-s', { timeout: 30000 }, async (t) => {
  const server = await serverFor(t, ['--http-idle-timeout-s', '1']);
  const { port } = server;
  const c = new RawConn(port);
  assert.ok(await c.connected);
  c.write(GET_HEALTH);
  assert.ok(await c.until(() => c.responses().responses.length === 1, 5000));
  const answered = now();
  assert.ok(await c.until(() => c.closed, 5000), 'an idle keep-alive connection was still open 5 s later');
  const after = now() - answered;
  assert.ok(after >= 700, `closed ${after.toFixed(0)} ms after its answer, before the 1 s idle timeout`);
  // The socket closes before the server's read completes with the timeout, so the counter
  // may trail the close by a moment: poll it.
  const idle = await pollFor(() => metric(port, 'strata_http_timeouts_total', 'phase="idle"'),
    (v) => v >= 1, 3000);
  assert.ok(idle >= 1, `strata_http_timeouts_total{phase="idle"} is ${idle}`);
});

// ---------------------------------------------------------------- 5. raw-bytes fuzz

// mulberry32: a small deterministic PRNG, so that a failing input can be reproduced.
function prng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let x = a;
    x = Math.imul(x ^ (x >>> 15), x | 1);
    x ^= x + Math.imul(x ^ (x >>> 7), x | 61);
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}

// Valid requests, each with a check of its own answer (for pipelining: which is which).
// The completion is tiny: prompt and output stay under one KV page (16 tokens), so
// nothing the fuzz sends can add to the radix tree, and --default-max-tokens 2 keeps a
// mutation that loses "max_tokens" short.
const VALID = [
  [GET_HEALTH, (r) => JSON.parse(r.body).status === 'ok'],
  ['GET /v1/models HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n', (r) => JSON.parse(r.body).object === 'list'],
  [postRaw('/tokenize', '{"prompt":"hello world"}'), (r) => Array.isArray(JSON.parse(r.body).tokens)],
  [postRaw('/detokenize', '{"tokens":[1,2,3]}'), (r) => typeof JSON.parse(r.body).prompt === 'string'],
  [postRaw('/v1/completions', '{"prompt":"hi","max_tokens":1,"temperature":0}'),
    (r) => JSON.parse(r.body).object === 'text_completion'],
  ['GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n', (r) => r.body.includes('strata_')],
];

// Framings with a required answer. `closes`: the server must also close the connection
// at once (it cannot find the next request's start).
const TOKENIZE = '{"prompt":"hello world"}';
const FRAMINGS = [
  { name: 'Content-Length: -1', status: 400,
    bytes: `POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n${TOKENIZE}` },
  { name: 'Content-Length: 10000000000 with a short body', status: 413,
    bytes: `POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n\r\n${TOKENIZE}` },
  // The CRLF after the body lets a parser see the first "chunk-size" line, which is not hex.
  { name: 'Transfer-Encoding: chunked with a plain body', status: 400,
    bytes: `POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n${TOKENIZE}\r\n` },
  { name: 'Transfer-Encoding: gzip', status: 501,
    bytes: `POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n${TOKENIZE}` },
  { name: 'GARBAGE', status: 400, closes: true, bytes: 'GARBAGE\r\n\r\n' },
];

// Malformed framings with no single right answer: any acceptable answer, or a close.
const ODD_FRAMINGS = [
  `POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 24\r\n\r\n${TOKENIZE}`,
  `POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n${TOKENIZE}`,
  `POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n${TOKENIZE}`,
  `POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 24\r\nTransfer-Encoding: chunked\r\n\r\n${TOKENIZE}`,
  `POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n${TOKENIZE}`,  // stalls, no CRLF
  `POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n${TOKENIZE}\r\n0\r\n\r\n`,
  `POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"pro\r\n0\r\n\r\n`,
  `POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n${TOKENIZE}`,  // the rest: a 2nd "request"
  'GET /health HTTP/1.1\r\nHost: x\r\n  folded: value\r\n\r\n',
  'GET /health HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n',
  'GET /health HTTP/1.1\nHost: x\n\n',
  'GET /health HTTP/1.1\r\nHost: x\r\nX-Nul: a\0b\r\n\r\n',
  'GET /health HTTP/9.9\r\nHost: x\r\n\r\n',
  'GET /health\r\n\r\n',
  'GET  /health  HTTP/1.1\r\nHost: x\r\n\r\n',
  `GET /${'a'.repeat(20000)} HTTP/1.1\r\nHost: x\r\n\r\n`,
  `GET /health HTTP/1.1\r\n${'X-A: b\r\n'.repeat(2000)}\r\n`,
  'GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nGARBAGE\r\n\r\n',
  '\r\n\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n',
];

// The fuzz cases, all from one seed. Each: `bytes`, and optionally `expect` (checks of the
// 200 answers, in order), `status` (of the first answer) or `closes` (see FRAMINGS).
function fuzzCases(seed, n) {
  const rnd = prng(seed);
  const int = (k) => Math.floor(rnd() * k);
  const pick = (a) => a[int(a.length)];
  const cases = [];
  for (let i = 0; i < n; i++) {
    const r = rnd();
    if (r < 0.15) {  // random bytes; half of them end like a header so they are parsed at once
      const b = Buffer.alloc(1 + int(300));
      for (let k = 0; k < b.length; k++) b[k] = int(256);
      cases.push({ kind: 'random bytes', bytes: rnd() < 0.5 ? Buffer.concat([b, Buffer.from('\r\n\r\n')]) : b });
    } else if (r < 0.25) {  // random printable lines
      const lines = [];
      for (let l = 1 + int(6); l > 0; l--) {
        lines.push(Array.from({ length: int(40) }, () => String.fromCharCode(32 + int(95))).join(''));
      }
      cases.push({ kind: 'random text', bytes: lines.join('\r\n') + (rnd() < 0.5 ? '\r\n\r\n' : '') });
    } else if (r < 0.40) {  // a valid request cut short
      const v = Buffer.from(pick(VALID)[0]);
      cases.push({ kind: 'truncated', bytes: v.subarray(0, 1 + int(v.length - 1)) });
    } else if (r < 0.65) {  // a valid request with 1-3 bytes changed
      const v = Buffer.from(pick(VALID)[0]);
      for (let k = 1 + int(3); k > 0; k--) v[int(v.length)] = int(256);
      cases.push({ kind: 'mutated', bytes: v });
    } else if (r < 0.75) {
      cases.push({ kind: 'framing', ...pick(FRAMINGS) });
    } else if (r < 0.85) {
      cases.push({ kind: 'odd framing', bytes: pick(ODD_FRAMINGS) });
    } else if (r < 0.95) {  // two valid requests in one write: both answered, in order
      const a = pick(VALID);
      const b = pick(VALID);
      cases.push({ kind: 'pipelined', bytes: a[0] + b[0], expect: [a[1], b[1]] });
    } else {
      const a = pick(VALID);
      cases.push({ kind: 'valid', bytes: a[0], expect: [a[1]] });
    }
  }
  return cases;
}

// How long a connection may go with neither an answer nor a close: the header and body
// timeouts (1 s each) and a margin for a busy 2-core machine.
const FUZZ_DEADLINE_MS = 5000;

// Runs one case on a fresh connection. Returns null, or what went wrong.
async function runCase(port, c) {
  const conn = new RawConn(port);
  try {
    if (!(await conn.connected)) return `connect failed: ${conn.error?.message}`;
    conn.write(c.bytes);
    const want = c.expect?.length ?? 1;
    const t0 = now();
    // Done when the server closes, or has answered `want` times (then a short wait for
    // anything more the rest of the bytes cause).
    await conn.until(() => conn.closed || conn.responses().responses.length >= want, FUZZ_DEADLINE_MS);
    if (!conn.closed && conn.responses().responses.length >= want && !c.closes) {
      await conn.until(() => conn.closed, 100);
    }
    if (c.closes && !conn.closed) await conn.until(() => conn.closed, Math.max(0, t0 + 1000 - now()));
    const { responses, rest, bad } = conn.responses();
    if (bad) return `not an HTTP response: ${JSON.stringify(bad)}`;
    for (const r of responses) {
      const problem = badResponse(r);
      if (problem) return problem;
    }
    if (responses.length === 0 && !conn.closed) return `no answer and still open after ${FUZZ_DEADLINE_MS} ms`;
    if (conn.closed && rest > 0) return `closed in the middle of a response`;
    if (c.status !== undefined && responses[0]?.status !== c.status) {
      return `expected ${c.status}, got ${responses.map((x) => x.status).join(', ') || 'a close'}`;
    }
    if (c.closes && !conn.closed) return 'the connection stayed open after the error (expected a prompt close)';
    if (c.expect) {
      if (responses.length < c.expect.length) return `${responses.length} of ${c.expect.length} answers`;
      for (const [k, check] of c.expect.entries()) {
        const r = responses[k];
        let ok = false;
        try { ok = r.status === 200 && check(r); } catch { /* not JSON */ }
        if (!ok) return `answer ${k + 1} is not the answer to request ${k + 1} (${r.status}): ${r.body.slice(0, 120)}`;
      }
    }
    return null;
  } finally {
    conn.destroy();
  }
}

test('raw-bytes fuzz: every connection is answered sanely or closed; nothing leaks', { timeout: 120000 }, async (t) => {
  const server = await serverFor(t, ['--http-header-timeout-s', '1', '--http-body-timeout-s', '1',
    '--default-max-tokens', '2']);
  const { port } = server;
  const state = () => getJson(port, '/cache/state');
  const before = await state();

  // The required answers first, one at a time, for clear failures.
  for (const f of FRAMINGS) {
    assert.equal(await runCase(port, { kind: 'framing', ...f }), null, f.name);
  }
  for (let i = 0; i < VALID.length; i++) {
    const [a, b] = [VALID[i], VALID[(i + 1) % VALID.length]];
    assert.equal(await runCase(port, { kind: 'pipelined', bytes: a[0] + b[0], expect: [a[1], b[1]] }), null,
      `pipelined ${JSON.stringify((a[0] + b[0]).slice(0, 80))}`);
  }

  // Then the seeded loop, 64 connections at a time.
  const SEED = 20240611;
  const cases = fuzzCases(SEED, 2000);
  const failures = [];
  let next = 0;
  const t0 = now();
  await Promise.all(Array.from({ length: 64 }, async () => {
    while (next < cases.length) {
      const i = next++;
      const problem = await runCase(port, cases[i]);
      if (problem) failures.push({ i, kind: cases[i].kind, problem, bytes: cases[i].bytes });
    }
  }));
  t.diagnostic(`${cases.length} fuzz cases in ${((now() - t0) / 1000).toFixed(1)} s (seed ${SEED})`);
  const show = (b) => JSON.stringify(Buffer.from(b).toString('latin1').slice(0, 160));
  assert.deepEqual(failures.slice(0, 10).map((f) => `#${f.i} ${f.kind}: ${f.problem} <- ${show(f.bytes)}`), [],
    `${failures.length} fuzz cases failed (seed ${SEED})`);

  // Stalled headers and bodies were ended by their timeouts, and counted.
  assert.ok(await metric(port, 'strata_http_timeouts_total', 'phase="header"') >= 1);
  assert.ok(await metric(port, 'strata_http_timeouts_total', 'phase="body"') >= 1);

  // The server is healthy, nothing runs or holds pages, and the tree is as it was.
  assert.equal((await getFresh(port, '/health')).status, 200);
  const s = await pollFor(state, idle, 2000);
  assert.ok(idle(s), `after the fuzz: ${stateLine(s)}`);
  assert.equal(s.nodes_count, before.nodes_count, 'the fuzz changed the radix tree');
});

// ---------------------------------------------------------------- 6. graceful shutdown

// Starts n streaming chats and resolves (with their promises) once each has sent content.
async function startStreams(base, n, body) {
  let started = 0;
  let resolveStarted;
  const allStarted = new Promise((r) => { resolveStarted = r; });
  const seen = new Set();
  const streams = Array.from({ length: n }, (_, i) => streamChat(base, {
    messages: [{ role: 'user', content: `Story number ${i}, please.` }], temperature: 0,
    stream_options: { include_usage: true }, ...body,
  }, {
    onEvent: (out) => {
      if (out.chunks > 0 && !seen.has(i)) {
        seen.add(i);
        if (++started === n) resolveStarted();
      }
    },
  }));
  // A stream that ends before it sends content also counts, so that this never hangs.
  for (const s of streams) s.then(() => { if (started < n) resolveStarted(); });
  await Promise.race([allStarted, deadline(20000)]);
  return streams;
}

// After SIGTERM the listener is closed: a new connection is refused (or closed at once,
// possibly with a 503), never served.
async function assertRefused(port, what) {
  const c = new RawConn(port);
  const connected = await c.connected;
  if (connected) c.write(GET_HEALTH);
  assert.ok(await c.until(() => c.closed, 2000), `${what}: a new connection was neither refused nor closed in 2 s`);
  for (const r of c.responses().responses) assertJsonError(r, 503, what);
  c.destroy();
}

test('SIGTERM lets running streams finish, then exits 0', { timeout: 60000 }, async (t) => {
  const server = await serverFor(t, ['--shutdown-timeout-s', '30']);
  // The ASan+UBSan Debug build decodes the tiny model many times slower: fewer tokens there,
  // so that the streams end well inside the 30 s grace period.
  const MAX = process.env.STRATA_SANITIZER_BUILD === '1' ? 24 : 200;
  const streams = await startStreams(server.base, 4, { max_tokens: MAX, ignore_eos: true });
  const exited = server.stop();  // SIGTERM, by pid
  await sleep(300);
  await assertRefused(server.port, 'during shutdown');
  const results = await Promise.all(streams);
  for (const [i, s] of results.entries()) {
    assert.equal(s.error, null, `stream ${i} broke: ${s.error}`);
    assert.ok(s.done, `stream ${i} did not get its [DONE]`);
    assert.equal(s.finish, 'length', `stream ${i}: finish_reason ${s.finish}`);
    assert.equal(s.usage?.completion_tokens, MAX, `stream ${i}: ${s.usage?.completion_tokens} tokens`);
  }
  assert.equal(await exited, 0, `exit code; stderr: ${server.stderr().slice(-2000)}`);
});

test('SIGTERM with --shutdown-timeout-s 1 cancels long streams and exits 0', { timeout: 60000 }, async (t) => {
  const server = await serverFor(t, ['--shutdown-timeout-s', '1']);
  // Streams that would run to the end of the context: far longer than the grace period.
  const { data: [model] } = await getJson(server.port, '/v1/models');
  const messages = [{ role: 'user', content: 'Story number 0, please.' }];
  const tok = await fetch(server.base + '/tokenize', { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages }) }).then((r) => r.json());
  const maxTokens = model.max_model_len - tok.count - 8;  // the other prompts may be a token or two longer
  const streams = await startStreams(server.base, 4, { max_tokens: maxTokens, ignore_eos: true });

  const t0 = now();
  const exited = server.stop();
  await sleep(300);
  await assertRefused(server.port, 'during shutdown');
  const results = await Promise.all(streams);
  for (const [i, s] of results.entries()) {
    const took = s.endedAt - t0;
    assert.ok(took <= 5000, `stream ${i} ran on ${took.toFixed(0)} ms after SIGTERM`);
    assert.ok(!(s.finish === 'length' && s.usage?.completion_tokens === maxTokens), `stream ${i} was not cut short`);
  }
  const code = await Promise.race([exited, deadline(6000).then(() => 'still running 6 s after SIGTERM')]);
  assert.equal(code, 0, `exit code; stderr: ${server.stderr().slice(-2000)}`);
  t.diagnostic(`exited ${((now() - t0) / 1000).toFixed(1)} s after SIGTERM`);
});
