// Large inputs (issue 20): a server that tokenizes 10 MB one-word strings and refuses
// 1 MB prompts that cannot fit its context returns to about the memory it had after a
// warm-up; a prompt over --max-prompt-tokens is refused with 400 and a message that names
// the limit, before the engine and before it is fully tokenized.
// Run by CTest: node --test tests/server/big_inputs.test.mjs
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { startServer, tinyQwen3Model, words, STRATA } from './server_harness.mjs';

// Sanitizer builds run the same checks on smaller inputs, without the memory bound
// (AddressSanitizer keeps freed memory in quarantine on purpose).
const SANITIZED = process.env.STRATA_SANITIZER_BUILD === '1';
const BIG_WORD_BYTES = SANITIZED ? 1_000_000 : 10_000_000;
const BIG_WORDS = SANITIZED ? 2 : 5;
const PROMPT_BYTES = 1_000_000;
const PROMPTS = SANITIZED ? 6 : 20;

const servers = [];
after(async () => {
  for (const s of servers) await s.stop();
});
async function serve(args) {
  const s = await startServer(args);
  servers.push(s);
  return s;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const residentMiB = (pid) =>
  Number(readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/)[1]) / 1024;

// A prompt of about `bytes`: one word without spaces, or words.
function bigPrompt(bytes, oneWord) {
  if (oneWord) return 'x'.repeat(bytes);
  const text = words(Math.ceil(bytes / 5));
  return text.slice(0, bytes);
}

test('large /tokenize and refused large prompts leave memory as it was', async () => {
  const server = await serve(['--http-max-body-bytes', String(64 << 20)]);
  // Warm-up: every route the sequence takes, with small and medium inputs.
  for (let i = 0; i < 3; i++) {
    assert.equal((await server.post('/tokenize', { prompt: words(20000) })).status, 200);
    assert.equal((await server.post('/v1/completions', { prompt: 'hello', max_tokens: 2 })).status, 200);
    const chat = await server.post('/v1/chat/completions',
      { messages: [{ role: 'user', content: words(50) }], max_tokens: 2 });
    assert.equal(chat.status, 200, chat.text);
  }
  await sleep(500);
  const warm = residentMiB(server.pid);

  const t0 = performance.now();
  for (let i = 0; i < BIG_WORDS; i++) {
    const r = await server.post('/tokenize', { prompt: 'a'.repeat(BIG_WORD_BYTES) });
    assert.equal(r.status, 200, r.text.slice(0, 300));
    assert.ok(r.json.count > BIG_WORD_BYTES / 128 && r.json.count === r.json.tokens.length);
  }
  const t1 = performance.now();
  for (let i = 0; i < PROMPTS; i++) {
    const text = bigPrompt(PROMPT_BYTES, i % 2 === 1);
    const r = i % 4 < 2
      ? await server.post('/v1/chat/completions', { messages: [{ role: 'user', content: text }], max_tokens: 2 })
      : await server.post('/v1/completions', { prompt: text, max_tokens: 2 });
    assert.equal(r.status, 400, r.text.slice(0, 300));
    assert.match(r.json.error.message, /longer than 8192 tokens.*--max-prompt-tokens/);
    // Accepted requests in between still work.
    if (i % 5 === 4) {
      assert.equal((await server.post('/v1/completions', { prompt: words(30), max_tokens: 2 })).status, 200);
    }
  }
  const t2 = performance.now();
  await sleep(1000);
  const end = residentMiB(server.pid);
  console.log(`RSS after warm-up ${warm.toFixed(0)} MiB, after the sequence ${end.toFixed(0)} MiB; ` +
    `${BIG_WORDS} x ${BIG_WORD_BYTES / 1e6} MB /tokenize in ${((t1 - t0) / 1000).toFixed(1)} s, ` +
    `${PROMPTS} x 1 MB refused prompts in ${((t2 - t1) / 1000).toFixed(1)} s`);
  if (!SANITIZED) {
    // Before the fix every 10 MB word added ~330 MB for good.
    assert.ok(end <= warm * 1.10 + 30,
      `resident memory went from ${warm.toFixed(0)} MiB to ${end.toFixed(0)} MiB`);
  }
  assert.equal((await server.get('/health')).status, 200);
});

test('a prompt over --max-prompt-tokens is refused with 400 before the engine', async () => {
  const server = await serve(['--max-prompt-tokens', '64']);
  const limitMessage = /the prompt is longer than 64 tokens.*--max-prompt-tokens.*context is 8192/;

  const within = await server.post('/v1/completions', { prompt: words(10), max_tokens: 2 });
  assert.equal(within.status, 200, within.text);

  const cases = [
    ['completions, text', '/v1/completions', { prompt: words(200), max_tokens: 2 }],
    ['completions, token ids', '/v1/completions', { prompt: Array(65).fill(9707), max_tokens: 2 }],
    ['chat', '/v1/chat/completions', { messages: [{ role: 'user', content: words(200) }], max_tokens: 2 }],
    ['completions, 8 MB word', '/v1/completions', { prompt: 'y'.repeat(8_000_000), max_tokens: 2 }],
    ['chat, 8 MB word', '/v1/chat/completions',
      { messages: [{ role: 'user', content: 'y'.repeat(8_000_000) }], max_tokens: 2 }],
    ['completions, streamed', '/v1/completions', { prompt: words(200), max_tokens: 2, stream: true }],
  ];
  for (const [name, route, body] of cases) {
    const t = performance.now();
    const r = await server.post(route, body);
    const ms = performance.now() - t;
    assert.equal(r.status, 400, `${name}: ${r.text.slice(0, 300)}`);
    assert.equal(r.json.error.code, 'invalid_argument', name);
    assert.match(r.json.error.message, limitMessage, name);
    console.log(`${name}: refused in ${ms.toFixed(0)} ms`);
  }

  // A prompt of exactly the limit is accepted; /tokenize is not limited (it counts).
  const ids = (await server.post('/tokenize', { prompt: words(500) })).json.tokens;
  const exact = await server.post('/v1/completions', { prompt: ids.slice(0, 64), max_tokens: 2 });
  assert.equal(exact.status, 200, exact.text);
  assert.ok(ids.length > 64);
});

test('--max-prompt-tokens beyond the context is refused at start-up', () => {
  const r = spawnSync(STRATA, ['serve', '--model', tinyQwen3Model(), '--port', '0', '--threads', '1',
    '--log-level', 'warn', '--max-prompt-tokens', '9000'], { encoding: 'utf8', timeout: 60000 });
  assert.equal(r.status, 2, r.stderr);
  assert.match(r.stderr, /--max-prompt-tokens 9000 is beyond the model's context length \(8192\)/);
});
