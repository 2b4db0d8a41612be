#!/usr/bin/env node
// What `strata route` adds to a request (docs/benchmarks.md, "Router"): time to first
// token of a short streamed chat request sent straight to a worker and through the router,
// alternately, on the same worker; and SSE events/s of one long stream, direct and
// through the router. Starts its own `strata serve` (tiny model, KV events on) and
// `strata route` on free loopback ports and stops them by pid. Prints a Markdown table.
//
//   node src/bench/http/router_bench.mjs STRATA_BINARY MODEL_DIR [--requests 200]
import { spawn } from 'node:child_process';

const [bin, model, ...rest] = process.argv.slice(2);
if (!bin || !model) {
  console.error('usage: router_bench.mjs STRATA_BINARY MODEL_DIR [--requests N]');
  process.exit(2);
}
const N = rest.includes('--requests') ? Number(rest[rest.indexOf('--requests') + 1]) : 200;

function percentile(xs, p) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
}

async function start(args, what) {
  const proc = spawn(bin, args, { stdio: ['ignore', 'pipe', 'inherit'] });
  const port = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(what + ' did not start')), 60000);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    proc.on('exit', (c) => reject(new Error(`${what} exited ${c}`)));
  });
  return { proc, base: `http://127.0.0.1:${port}` };
}

// Milliseconds to the first content chunk, and the events of the whole stream.
async function stream(base, body) {
  const t0 = performance.now();
  const r = await fetch(base + '/v1/chat/completions', { method: 'POST',
    headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...body, stream: true }) });
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let first = null;
  let events = 0;
  let buf = '';
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!ev.startsWith('data: ')) continue;
      events++;
      if (first === null && ev.includes('"content":"') && !ev.includes('"content":""')) first = performance.now() - t0;
    }
  }
  return { ttft: first ?? performance.now() - t0, events, total: performance.now() - t0 };
}

const worker = await start(['serve', '--model', model, '--port', '0', '--threads', '1', '--log-level', 'error',
  '--kv-events-endpoint', 'tcp://127.0.0.1:*', '--kv-events-replay-endpoint', 'tcp://127.0.0.1:*'], 'worker');
const router = await start(['route', '--model', model, '--port', '0', '--log-level', 'error',
  '--worker', worker.base], 'router');
try {
  for (let i = 0; i < 50; i++) {
    const w = await fetch(router.base + '/workers').then((r) => r.json());
    if (w.workers.every((x) => x.joined)) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  const body = { messages: [{ role: 'system', content: 'You are brief.' }, { role: 'user', content: 'Say hi.' }],
    max_tokens: 1, temperature: 0 };
  for (let i = 0; i < 10; i++) { await stream(worker.base, body); await stream(router.base, body); }
  const direct = [];
  const routed = [];
  for (let i = 0; i < N; i++) {
    direct.push((await stream(worker.base, body)).ttft);
    routed.push((await stream(router.base, body)).ttft);
  }
  const long = { ...body, max_tokens: 2000, ignore_eos: true };
  const sd = await stream(worker.base, long);
  const sr = await stream(router.base, long);
  const f = (x) => x.toFixed(2);
  console.log(`| measure | direct to the worker | through the router | router adds |`);
  console.log(`|---|---:|---:|---:|`);
  console.log(`| TTFT p50 (1-token streamed chat, ${N} each, alternating) | ${f(percentile(direct, 50))} ms | ${f(percentile(routed, 50))} ms | ${f(percentile(routed, 50) - percentile(direct, 50))} ms |`);
  console.log(`| TTFT p99 | ${f(percentile(direct, 99))} ms | ${f(percentile(routed, 99))} ms | ${f(percentile(routed, 99) - percentile(direct, 99))} ms |`);
  console.log(`| SSE events/s, one 2,000-token stream | ${Math.round(sd.events / (sd.total / 1000))} | ${Math.round(sr.events / (sr.total / 1000))} | |`);
} finally {
  router.proc.kill('SIGTERM');
  worker.proc.kill('SIGTERM');
}
