#!/usr/bin/env node
// Repro of a scheduler livelock the fuzz suite found (not run by CTest): running requests
// that each lock a cached prefix, on a tight pool, while the oldest one's next prefill chunk
// needs more pages than are free. Engine::step() retracts only the newest request before
// it gives up on the step (the plan is empty), and the next admit() re-admits that one at
// once (alone it fits), so nothing runs until a client goes away: /cache/state shows
// {"running": 7, "waiting": 1}, request_pages 0, evictable_pages 0, free pages > 0, for as
// long as the clients wait. No pins are needed (they only make it likelier).
//
// usage: node tests/fuzz/repro_scheduler_livelock.mjs [STRATA_BIN] [--rounds N]
// Exit 1 when a round stalls for more than 10 s, 0 when none of the rounds did.
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const rounds = args.includes('--rounds') ? Number(args[args.indexOf('--rounds') + 1]) : 40;
const bin = args.find((a, i) => !a.startsWith('-') && args[i - 1] !== '--rounds');
process.env.STRATA_SOURCE_DIR ||= path.resolve(HERE, '../..');
process.env.STRATA_BIN = bin || process.env.STRATA_BIN || path.join(process.env.STRATA_SOURCE_DIR, 'build/strata');
process.env.STRATA_TEST_DIR ||= path.join(path.dirname(process.env.STRATA_BIN), 'test-work');
const { startServer } = await import('../server/server_harness.mjs');

// 128 pages of 16 tokens; 8 cached prefixes of 12 pages; request 0 adds 50 pages, the
// others 2 to 4.
const server = await startServer(['--kv-cache-tokens', '2048']);
const VOCAB = ['alpha', 'river', 'stone', 'cloud', 'metric', 'vector', 'quiet', 'orange', 'signal', 'harbor'];
const words = (n, s) => Array.from({ length: n }, (_, i) => VOCAB[(i * 7 + s * 13 + (i * i) % 11) % VOCAB.length] + ((i * s) % 97)).join(' ');
const tokens = async (text) => (await server.post('/tokenize', { prompt: text, add_special_tokens: false })).json.tokens;
let code = 0;
try {
  const prefixes = [];
  for (let k = 0; k < 8; k++) prefixes.push((await tokens(words(400, 2000 + k))).slice(0, 16 * 12));
  const suffixes = [];
  for (let k = 0; k < 64; k++) suffixes.push((await tokens(words(600, 3000 + k))).slice(0, 16 * 50));
  for (let round = 0; round < rounds && code === 0; round++) {
    for (const p of prefixes) await server.post('/v1/completions', { prompt: p, max_tokens: 1 });
    const t0 = Date.now();
    const controller = new AbortController();
    const all = Promise.all(prefixes.map((p, i) => fetch(server.base + '/v1/completions', {
      method: 'POST', headers: { 'content-type': 'application/json' }, signal: controller.signal,
      body: JSON.stringify({ prompt: [...p, ...suffixes[(round * 8 + i) % 64].slice(0, 16 * (i === 0 ? 50 : 2 + (i % 3)))], max_tokens: 4 }),
    }).then((r) => r.status)));
    const out = await Promise.race([all, new Promise((r) => setTimeout(() => r(null), 10000))]);
    if (out === null) {
      const s = (await server.get('/cache/state')).json;
      console.log(`round ${round}: STALLED for 10 s: requests ${JSON.stringify(s.requests)}, free_pages ${s.device.free_pages}, ` +
        `evictable_pages ${s.device.evictable_pages}, locked_nodes ${s.device.locked_nodes}, request_pages ${s.device.request_pages}`);
      controller.abort();
      await all.catch(() => {});
      code = 1;
    } else {
      console.log(`round ${round}: ${JSON.stringify(out)} in ${Date.now() - t0} ms`);
    }
  }
} finally {
  await server.stop();
}
console.log(code ? 'livelock reproduced' : `no stall in ${rounds} rounds`);
process.exit(code);
