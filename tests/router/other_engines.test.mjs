// Black-box tests of `strata route` in front of workers that are not Strata (docs/router.md,
// "Workers", the `kind` of a --workers-file entry): a kind the router does not know stops
// it at start; real `strata serve` workers entered as `kind: openai` (any OpenAI-compatible
// server: its load is the router's own accounting); real llama.cpp servers as `kind:
// llamacpp` (their load read from /slots and /metrics), where the machine has `llama-server`
// on PATH and a GGUF model in STRATA_LLAMACPP_MODEL, skipped (and reported as skipped)
// where it has not. Every server listens on 127.0.0.1 and is stopped by its process id.
// Run by CTest: node --test tests/router/other_engines.test.mjs
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import net from 'node:net';
import os from 'node:os';
import { spawn } from 'node:child_process';
import { accessSync, constants, existsSync, mkdtempSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { startServer, startRouter, waitFor, workerList, allJoined, words, SOURCE_DIR } from '../server/server_harness.mjs';

const require = createRequire(path.join(SOURCE_DIR, 'tools/js/package.json'));
const OpenAI = require('openai').default ?? require('openai');

function workersFile(entries) {
  const file = path.join(mkdtempSync(path.join(os.tmpdir(), 'strata-kinds-')), 'workers.json');
  writeFileSync(file, JSON.stringify(entries));
  return file;
}

function chat(system, user) {
  return { messages: [{ role: 'system', content: system }, { role: 'user', content: user }], max_tokens: 4,
    temperature: 0 };
}

// A repeated system prompt goes to the worker the first request went to: the router
// predicts it cached there (these engines publish no KV events).
async function checkPlacement(router, system) {
  const first = await router.post('/v1/chat/completions', chat(system, 'first question'));
  assert.equal(first.status, 200, first.text);
  const home = first.headers.get('x-strata-worker');
  assert.ok(home);
  for (const q of ['second question', 'third question']) {
    const r = await router.post('/v1/chat/completions', chat(system, q));
    assert.equal(r.status, 200, r.text);
    assert.equal(r.headers.get('x-strata-worker'), home);
    assert.equal(r.headers.get('x-strata-route'), 'cache');
  }
  return home;
}

// The official openai client through the router, streaming and not.
async function checkClient(router) {
  const client = new OpenAI({ baseURL: router.base + '/v1', apiKey: 'unused', maxRetries: 0 });
  const r = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hello' }],
    max_tokens: 4, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  const stream = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hello' }],
    max_tokens: 4, temperature: 0, stream: true });
  let chunks = 0;
  for await (const chunk of stream) chunks += chunk.choices.length;
  assert.ok(chunks > 0);
}

test('a worker kind the router does not know stops it at start, naming the kinds it knows', async () => {
  const file = workersFile([{ url: 'http://127.0.0.1:9', kind: 'tgi' }]);
  await assert.rejects(startRouter(['--workers-file', file]), (e) => {
    assert.match(e.message, /router exited 1/);
    assert.match(e.message, /unknown worker kind 'tgi' \(it must be strata, vllm, sglang, llamacpp or openai\)/);
    return true;
  });
  const events = workersFile([{ url: 'http://127.0.0.1:9', kind: 'llamacpp', kv_events: 'tcp://127.0.0.1:5557' }]);
  await assert.rejects(startRouter(['--workers-file', events]), /a llamacpp worker publishes no KV events/);
});

test("kind openai: Strata workers entered as any OpenAI-compatible server, load from the router's accounting", async () => {
  const workers = [];
  let router;
  try {
    for (let i = 0; i < 2; i++) workers.push(await startServer(['--kv-cache-tokens', '4096']));
    const file = workersFile([{ url: workers[0].base, kind: 'openai', max_running_requests: 4 },
      { url: workers[1].base, kind: 'openai' }]);
    router = await startRouter(['--workers-file', file, '--load-poll-ms', '50']);
    const ws = await allJoined(router, 2);
    for (const w of ws) {
      assert.equal(w.kind, 'openai');
      assert.equal(w.load.source, 'router');
      assert.equal(w.block_size, 16);
      assert.equal(w.kv_events, null);
    }
    assert.deepEqual(ws.map((w) => w.load.max_running_requests), [4, 0]);
    await checkPlacement(router, 'Any OpenAI-compatible server. ' + words(200, 7));
    await checkClient(router);
    // Every request finished: the router's count is back to zero, and the load with it.
    await waitFor(async () => (await workerList(router)).every((w) =>
      w.router.active_requests === 0 && w.load.load_fraction === 0), 'the accounting to drain');
    const counted = (await workerList(router)).reduce((n, w) => n + w.router.requests, 0);
    assert.equal(counted, 5);
  } finally {
    if (router) await router.stop();
    for (const w of workers) await w.stop();
  }
});

// ---- real llama.cpp servers ----

function onPath(name) {
  for (const dir of (process.env.PATH ?? '').split(path.delimiter)) {
    if (!dir) continue;
    try {
      accessSync(path.join(dir, name), constants.X_OK);
      return path.join(dir, name);
    } catch { /* not here */ }
  }
  return null;
}

const LLAMA_SERVER = onPath('llama-server');
const LLAMA_MODEL = process.env.STRATA_LLAMACPP_MODEL;

// A free loopback port (closed again at once: llama-server binds it next).
function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// llama-server with two slots and its metrics, ready (GET /health 200 once its model loaded).
async function startLlamaServer() {
  const port = await freePort();
  const proc = spawn(LLAMA_SERVER, ['-m', LLAMA_MODEL, '--host', '127.0.0.1', '--port', String(port),
    '-np', '2', '-c', '4096', '-t', '1', '--metrics'], { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  proc.stdout.on('data', (d) => { log += d.toString(); });
  proc.stderr.on('data', (d) => { log += d.toString(); });
  const exited = new Promise((r) => proc.on('exit', (code, sig) => r(code ?? sig)));
  const base = `http://127.0.0.1:${port}`;
  const server = {
    base,
    async stop() {
      if (proc.exitCode !== null || proc.signalCode !== null) return;
      process.kill(proc.pid, 'SIGTERM');
      await exited;
    },
  };
  try {
    await waitFor(async () => {
      if (proc.exitCode !== null) throw new Error(`llama-server exited ${proc.exitCode}: ${log.slice(-2000)}`);
      try {
        return (await fetch(base + '/health')).status === 200;
      } catch {
        return false;
      }
    }, 'llama-server to load ' + LLAMA_MODEL, 180000);
  } catch (e) {
    await server.stop();
    throw e;
  }
  return server;
}

test('kind llamacpp: real llama.cpp servers, their load read from /slots and /metrics', async (t) => {
  if (!LLAMA_SERVER) {
    t.skip('llama-server is not on PATH');
    return;
  }
  if (!LLAMA_MODEL || !existsSync(LLAMA_MODEL)) {
    t.skip('STRATA_LLAMACPP_MODEL does not name a GGUF model for llama-server');
    return;
  }
  const servers = [];
  let router;
  try {
    for (let i = 0; i < 2; i++) servers.push(await startLlamaServer());
    const file = workersFile(servers.map((s) => ({ url: s.base, kind: 'llamacpp' })));
    router = await startRouter(['--workers-file', file, '--load-poll-ms', '50']);
    await allJoined(router, 2);
    const ws = await waitFor(async () => {
      const list = await workerList(router);
      return list.every((w) => w.load.source === 'slots+metrics') ? list : null;
    }, 'the load polls to read /slots and /metrics');
    for (const w of ws) {
      assert.equal(w.kind, 'llamacpp');
      assert.equal(w.load.max_running_requests, 2);  // -np 2
      assert.ok(w.max_prompt_tokens > 0);  // a slot's n_ctx
      assert.equal(w.eligible, true);
    }
    const home = await checkPlacement(router, 'Routed to llama.cpp. ' + words(200, 11));
    await checkClient(router);
    // The router reads what the server counted of the prompts it processed.
    await waitFor(async () => (await workerList(router)).find((w) => w.url === home).load.prompt_tokens_total > 0,
      'llamacpp:prompt_tokens_total');
  } finally {
    if (router) await router.stop();
    for (const s of servers) await s.stop();
  }
});
