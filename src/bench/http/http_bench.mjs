#!/usr/bin/env node
// The HTTP layer's numbers (docs/benchmarks.md, "HTTP layer"): /health latency with and
// without 1,000 slow-header connections open, the per-request cost of a 1-token
// completion, SSE events/s through one stream and through 500 concurrent streams, and
// memory per open stream. Starts its own `strata serve` on a free loopback port (the tiny
// model) and stops it by pid. Prints a Markdown table.
//
//   node src/bench/http/http_bench.mjs STRATA_BINARY MODEL_DIR [--streams 500] [--legacy]
// --legacy: a binary from before the async layer (no --http-* options), for the
// side-by-side comparison in docs/benchmarks.md.
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import http from 'node:http';

const [bin, model, ...rest] = process.argv.slice(2);
if (!bin || !model) {
  console.error('usage: http_bench.mjs STRATA_BINARY MODEL_DIR [--streams N]');
  process.exit(2);
}
const STREAMS = rest.includes('--streams') ? Number(rest[rest.indexOf('--streams') + 1]) : 500;
const LEGACY = rest.includes('--legacy');

function percentile(xs, p) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
}

function rssMb(pid) {
  const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+) kB/);
  return Number(m[1]) / 1024;
}

async function startServer(args) {
  const proc = spawn(bin, ['serve', '--model', model, '--port', '0', '--threads', '1',
    '--log-level', process.env.LOG_LEVEL ?? 'error', ...args], { stdio: ['ignore', 'pipe', 'inherit'] });
  const port = await new Promise((resolve, reject) => {
    let out = '';
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) resolve(Number(m[1]));
    });
    proc.on('exit', (c) => reject(new Error(`server exited ${c}`)));
  });
  proc.on('exit', (code, sig) => { if (code !== 0) console.error(`server exited: ${code ?? sig}`); });
  return { proc, port };
}

const agent = new http.Agent({ keepAlive: true, maxSockets: 1024 });
let timeouts = 0;

function request(port, method, path, body) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, method, path, agent,
      headers: body ? { 'content-type': 'application/json' } : {} }, (res) => {
      let data = '';
      res.on('data', (d) => { data += d; });
      res.on('end', () => resolve({ status: res.statusCode, data }));
    });
    req.on('error', (e) => reject(new Error(`${method} ${path}: ${e.message}`)));
    // An answer that takes over 5 s counts as a time-out (the old server's /health behind
    // slow connections never answered).
    req.setTimeout(5000, () => {
      timeouts += 1;
      req.destroy();
      resolve({ status: 0, data: '' });
    });
    if (body) req.write(JSON.stringify(body));
    req.end();
  });
}

async function timed(n, fn) {
  const ms = [];
  for (let i = 0; i < n; i++) {
    const t0 = process.hrtime.bigint();
    await fn();
    ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  return ms;
}

// One streaming completion; resolves with the number of SSE data events and the time.
function stream(port, maxTokens, onOpen) {
  return new Promise((resolve, reject) => {
    const t0 = process.hrtime.bigint();
    const req = http.request({ host: '127.0.0.1', port, method: 'POST', path: '/v1/completions', agent,
      headers: { 'content-type': 'application/json' } }, (res) => {
      if (onOpen) onOpen();
      let events = 0;
      let tail = '';
      res.on('data', (d) => {
        const text = tail + d;
        const parts = text.split('\n\n');
        tail = parts.pop();
        events += parts.length;
      });
      res.on('end', () => resolve({ events, s: Number(process.hrtime.bigint() - t0) / 1e9 }));
    });
    req.on('error', reject);
    req.write(JSON.stringify({ prompt: 'once upon a time', max_tokens: maxTokens, ignore_eos: true,
      temperature: 0, stream: true }));
    req.end();
  });
}

const rows = [];
const httpArgs = LEGACY ? [] : ['--http-max-connections', '8192', '--http-header-timeout-s', '600'];
const { proc, port } = await startServer(httpArgs);
try {
  await timed(50, () => request(port, 'GET', '/health'));  // warm-up
  const idle = await timed(500, () => request(port, 'GET', '/health'));
  rows.push(['/health latency, nothing else open', `p50 ${percentile(idle, 50).toFixed(2)} ms, p99 ${percentile(idle, 99).toFixed(2)} ms`]);

  const slow = [];
  for (let i = 0; i < 1000; i++) {
    const s = net.connect(port, '127.0.0.1');
    s.on('error', () => {});
    s.write('GET /health HTTP/1.1\r\nHost: x\r\n');
    slow.push(s);
  }
  await new Promise((r) => setTimeout(r, 500));
  timeouts = 0;
  const loaded = await timed(LEGACY ? 5 : 500, () => request(port, 'GET', '/health'));
  rows.push(['/health latency, 1,000 slow-header connections open', timeouts > 0
    ? `${timeouts} of ${loaded.length} timed out after 5 s`
    : `p50 ${percentile(loaded, 50).toFixed(2)} ms, p99 ${percentile(loaded, 99).toFixed(2)} ms (target p99 < 50 ms)`]);
  for (const s of slow) s.destroy();

  const oneToken = { prompt: 'hello', max_tokens: 1, temperature: 0 };
  await timed(20, () => request(port, 'POST', '/v1/completions', oneToken));
  const comp = await timed(300, () => request(port, 'POST', '/v1/completions', oneToken));
  rows.push(['1-token completion (keep-alive, sequential)', `p50 ${percentile(comp, 50).toFixed(2)} ms, p99 ${percentile(comp, 99).toFixed(2)} ms`]);

  const one = await stream(port, 2000);
  rows.push(['SSE events/s, one stream (2,000 tokens)', `${(one.events / one.s).toFixed(0)} events/s`]);

  const before = rssMb(proc.pid);
  let open = 0;
  let peak = before;
  const all = [];
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < STREAMS; i++) {
    all.push(stream(port, 200, () => {
      open += 1;
      if (open === STREAMS) peak = Math.max(peak, rssMb(proc.pid));
    }));
  }
  const sampler = setInterval(() => { peak = Math.max(peak, rssMb(proc.pid)); }, 20);
  const results = await Promise.all(all);
  clearInterval(sampler);
  const wall = Number(process.hrtime.bigint() - t0) / 1e9;
  const events = results.reduce((a, r) => a + r.events, 0);
  rows.push([`SSE events/s, ${STREAMS} concurrent streams (200 tokens each)`, `${(events / wall).toFixed(0)} events/s in total`]);
  rows.push([`server memory per open stream (${STREAMS} streams, peak RSS over idle)`, `${(((peak - before) * 1024) / STREAMS).toFixed(0)} KiB`]);
} finally {
  proc.kill('SIGTERM');
  agent.destroy();
}
console.log('| measurement | result |');
console.log('|---|---|');
for (const [k, v] of rows) console.log(`| ${k} | ${v} |`);
