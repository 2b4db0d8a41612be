#!/usr/bin/env node
// Prefill/decode disaggregation against colocation, side by side in one run
// (docs/benchmarks.md, "Disaggregation (issue 15)"). Three deployments of the same model on
// this machine's two cores, each fed the same traffic for the same time:
//
//   colocated  one worker on both cores (taskset -c 0,1, --threads 2), clients straight to it
//   2 mixed    two 1-core workers (taskset -c 0 / -c 1, --threads 1) behind `strata route`
//   P/D        a prefill worker on core 0 and a decode worker on core 1 (--threads 1 each)
//              behind `strata route --pd`
//
// Traffic: --chat concurrent chat streams (a fresh short prompt each turn, --chat-tokens
// generated) mixed with long prompts (--long-words words, 8 tokens generated) arriving every
// --long-every-ms. Reported per deployment: chat inter-token latency p50/p99 and TTFT, long
// prompts' TTFT, chat tokens/s, goodput (requests/s within the SLO: chat TTFT and every gap
// under --slo-chat-ttft-ms / --slo-itl-ms, long TTFT under --slo-long-ttft-ms), and for P/D
// the KV moved per long prompt with its bandwidth against a memcpy of the same bytes here.
// Every process is started on free loopback ports and stopped by pid. Prints Markdown.
//
//   node src/bench/http/pd_bench.mjs STRATA_BINARY MODEL_DIR [--seconds 30] [--chat 4]
//        [--chat-tokens 48] [--long-words 1500] [--long-every-ms 2500] [--only colocated,mixed,pd]
//        [--pd-min-prefill-tokens 256] [--kv-cache-tokens 32768]
import { spawn, execFileSync } from 'node:child_process';

const [bin, model, ...rest] = process.argv.slice(2);
if (!bin || !model) {
  console.error('usage: pd_bench.mjs STRATA_BINARY MODEL_DIR [options]');
  process.exit(2);
}
function opt(name, dflt) {
  const i = rest.indexOf('--' + name);
  return i >= 0 ? rest[i + 1] : dflt;
}
const SECONDS = Number(opt('seconds', 30));
const CHAT = Number(opt('chat', 4));
const CHAT_TOKENS = Number(opt('chat-tokens', 48));
const LONG_WORDS = Number(opt('long-words', 1500));
const LONG_EVERY = Number(opt('long-every-ms', 2500));
const SLO_CHAT_TTFT = Number(opt('slo-chat-ttft-ms', 1000));
const SLO_ITL = Number(opt('slo-itl-ms', 250));
const SLO_LONG_TTFT = Number(opt('slo-long-ttft-ms', 8000));
const ONLY = opt('only', 'colocated,mixed,pd').split(',');
const KV_TOKENS = opt('kv-cache-tokens', '32768');
const PD_MIN = opt('pd-min-prefill-tokens', '256');

let hasTaskset = true;
try { execFileSync('taskset', ['-c', '0', 'true']); } catch { hasTaskset = false; }

function percentile(xs, p) {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
}

const VOCAB = ['alpha', 'river', 'stone', 'cloud', 'metric', 'vector', 'quiet', 'orange', 'signal', 'harbor',
  'lattice', 'ember', 'token', 'cache', 'pin', 'forest', 'delta', 'copper', 'window', 'falcon'];
let wordSeed = 1;
function words(n) {
  let x = (wordSeed++ * 2654435761) >>> 0;
  const out = [];
  for (let i = 0; i < n; i++) {
    x = (x * 1103515245 + 12345) >>> 0;
    out.push(VOCAB[(x >>> 16) % VOCAB.length]);
  }
  return out.join(' ');
}

const procs = [];
async function start(args, what, cores) {
  const argv = hasTaskset && cores ? ['taskset', '-c', cores, bin, ...args] : [bin, ...args];
  const proc = spawn(argv[0], argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, UCX_TLS: process.env.UCX_TLS || 'sm' } });
  procs.push(proc);
  let err = '';
  proc.stderr.on('data', (d) => { err += d; });
  const port = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(what + ' did not start: ' + err)), 60000);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    proc.on('exit', (c) => reject(new Error(`${what} exited ${c}: ${err}`)));
  });
  return { proc, base: `http://127.0.0.1:${port}` };
}
async function stopAll() {
  await Promise.all(procs.splice(0).map((p) => new Promise((res) => {
    if (p.exitCode !== null || p.signalCode !== null) return res();
    p.on('exit', res);
    process.kill(p.pid, 'SIGTERM');
  })));
}
process.on('SIGINT', async () => { await stopAll(); process.exit(130); });

// One streamed completion: TTFT, the gaps between tokens, the usage.
async function streamed(base, prompt, maxTokens) {
  const t0 = performance.now();
  const r = await fetch(base + '/v1/completions', { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true,
      stream_options: { include_usage: true } }) });
  if (r.status !== 200) return { ok: false, status: r.status };
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  let last = null;
  let ttft = null;
  const gaps = [];
  let usage = null;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (j.usage) usage = j.usage;
      if (!j.choices?.length) continue;
      const now = performance.now();
      if (ttft === null) ttft = now - t0; else gaps.push(now - last);
      last = now;
    }
  }
  return { ok: true, ttft, gaps, usage, prefill: r.headers.get('x-strata-prefill-worker') };
}

async function waitJoined(router, n) {
  for (let i = 0; i < 400; i++) {
    try {
      const w = await (await fetch(router + '/workers')).json();
      if ((w.workers ?? []).filter((x) => x.joined).length >= n) return;
    } catch { /* starting */ }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error('workers did not join the router');
}

async function runTraffic(base) {
  const chat = { ttft: [], gaps: [], ok: 0, good: 0, tokens: 0 };
  const long = { ttft: [], ok: 0, good: 0, kvBytes: [], kvMs: [], remote: 0 };
  const deadline = performance.now() + SECONDS * 1000;
  const chatLoops = Array.from({ length: CHAT }, async () => {
    while (performance.now() < deadline) {
      const r = await streamed(base, words(60), CHAT_TOKENS);
      if (!r.ok) continue;
      chat.ok++;
      chat.tokens += r.gaps.length + 1;
      chat.ttft.push(r.ttft);
      chat.gaps.push(...r.gaps);
      if (r.ttft <= SLO_CHAT_TTFT && Math.max(0, ...r.gaps) <= SLO_ITL) chat.good++;
    }
  });
  const longs = [];
  const longLoop = (async () => {
    while (performance.now() + LONG_EVERY / 2 < deadline) {
      longs.push(streamed(base, words(LONG_WORDS), 8).then((r) => {
        if (!r.ok) return;
        long.ok++;
        long.ttft.push(r.ttft);
        if (r.ttft <= SLO_LONG_TTFT) long.good++;
        if (r.usage?.kv_transfer) {
          long.remote++;
          long.kvBytes.push(r.usage.kv_transfer.bytes);
          long.kvMs.push(r.usage.kv_transfer.ms);
        }
      }));
      await new Promise((res) => setTimeout(res, LONG_EVERY));
    }
  })();
  const t0 = performance.now();
  await Promise.all([...chatLoops, longLoop]);
  await Promise.all(longs);
  const elapsed = (performance.now() - t0) / 1000;
  return { chat, long, elapsed };
}

function memcpyGBps(bytes) {
  const src = Buffer.alloc(bytes, 1);
  const dst = Buffer.alloc(bytes);
  let best = Infinity;
  for (let i = 0; i < 5; i++) {
    const t0 = performance.now();
    src.copy(dst);
    best = Math.min(best, performance.now() - t0);
  }
  return bytes / (best / 1000) / 1e9;
}

const serveArgs = ['serve', '--model', model, '--port', '0', '--log-level', 'warn', '--kv-cache-tokens', KV_TOKENS];
const results = [];
try {
  for (const what of ONLY) {
    let base;
    if (what === 'colocated') {
      base = (await start([...serveArgs, '--threads', '2'], 'colocated worker', '0,1')).base;
    } else if (what === 'mixed') {
      const a = await start([...serveArgs, '--threads', '1'], 'worker 0', '0');
      const b = await start([...serveArgs, '--threads', '1'], 'worker 1', '1');
      base = (await start(['route', '--model', model, '--port', '0', '--log-level', 'warn',
        '--worker', a.base, '--worker', b.base], 'router')).base;
      await waitJoined(base, 2);
    } else if (what === 'pd') {
      const p = await start([...serveArgs, '--threads', '1', '--role', 'prefill', '--pd-worker-id', 'p1'],
        'prefill worker', '0');
      const info = await (await fetch(p.base + '/server_info')).json();
      const d = await start([...serveArgs, '--threads', '1', '--role', 'decode', '--pd-worker-id', 'd1',
        '--pd-prefill-peer', info.pd.endpoint], 'decode worker', '1');
      base = (await start(['route', '--model', model, '--port', '0', '--log-level', 'warn', '--pd',
        '--pd-min-prefill-tokens', PD_MIN, '--worker', d.base, '--worker', p.base], 'router')).base;
      await waitJoined(base, 2);
    } else {
      throw new Error('unknown deployment ' + what);
    }
    await streamed(base, words(20), 4);  // warm-up
    const r = await runTraffic(base);
    results.push({ what, ...r });
    await stopAll();
  }
} finally {
  await stopAll();
}

const names = { colocated: 'colocated, 2 cores', mixed: '2 mixed 1-core workers + router', pd: 'P/D: prefill core 0, decode core 1 + router --pd' };
const f = (x, d = 0) => (Number.isFinite(x) ? x.toFixed(d) : '–');
console.log(`\n${SECONDS} s each; ${CHAT} chat streams of ${CHAT_TOKENS} tokens (60-word prompts) and a ` +
  `${LONG_WORDS}-word prompt every ${LONG_EVERY} ms; SLO: chat TTFT ≤ ${SLO_CHAT_TTFT} ms and every gap ≤ ` +
  `${SLO_ITL} ms, long TTFT ≤ ${SLO_LONG_TTFT} ms${hasTaskset ? '' : ' (no taskset: cores not split)'}\n`);
console.log('| deployment | chat ITL p50 | chat ITL p99 | p99/p50 | chat TTFT p50 / p99 | long TTFT p50 / p99 | chat tok/s | goodput req/s | long prompts via P/D |');
console.log('|---|---|---|---|---|---|---|---|---|');
for (const r of results) {
  const p50 = percentile(r.chat.gaps, 50);
  const p99 = percentile(r.chat.gaps, 99);
  console.log(`| ${names[r.what]} | ${f(p50, 1)} ms | ${f(p99, 1)} ms | ${f(p99 / p50, 2)} | ` +
    `${f(percentile(r.chat.ttft, 50))} / ${f(percentile(r.chat.ttft, 99))} ms | ` +
    `${f(percentile(r.long.ttft, 50))} / ${f(percentile(r.long.ttft, 99))} ms | ${f(r.chat.tokens / r.elapsed, 1)} | ` +
    `${f((r.chat.good + r.long.good) / r.elapsed, 2)} | ${r.long.remote} of ${r.long.ok} |`);
}
const pd = results.find((r) => r.what === 'pd');
if (pd && pd.long.kvBytes.length) {
  const bytes = percentile(pd.long.kvBytes, 50);
  const ms = percentile(pd.long.kvMs, 50);
  const mc = memcpyGBps(bytes);
  console.log(`\nP/D transfer per long prompt (median): ${(bytes / 1e6).toFixed(1)} MB in ${ms} ms from order to ` +
    `pages received (prefill compute included): ${(bytes / (ms / 1000) / 1e9).toFixed(2)} GB/s; ` +
    `memcpy of the same bytes here: ${mc.toFixed(2)} GB/s`);
}
