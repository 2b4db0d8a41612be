// Black-box tests of a GGUF model served alone (`strata serve --model FILE.gguf`, issue
// 53): the tokenizer and chat template come from the file's metadata, the weights stay
// Q8_0. Beside it the tiny Qwen3 folder made from the same arrays (same seed): the same
// prompt tokens through the same template, and the same greedy tokens where the folder's
// own choice is clear.
// Run by CTest: node --test tests/server/gguf.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { existsSync, mkdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { spawn, execFileSync } from 'node:child_process';
import { startServer, STRATA, SOURCE_DIR, WORK_DIR, QWEN3_TOKENIZER } from './server_harness.mjs';

const require = createRequire(path.join(SOURCE_DIR, 'tools/js/package.json'));
const OpenAI = require('openai').default ?? require('openai');

const dir = path.join(WORK_DIR, 'gguf-tiny-qwen3');
const file = path.join(dir, 'model.gguf');

// `strata serve --model FILE.gguf` on a free port; resolves with its base URL.
function serveGguf(extra = []) {
  const proc = spawn(STRATA, ['serve', '--model', file, '--port', '0', '--threads', '1',
    '--log-level', 'warn', ...extra], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d.toString(); });
  return new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error('server did not start: ' + stderr)), 60000);
    proc.stdout.on('data', (d) => {
      out += d.toString();
      const m = out.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve({ proc, base: `http://127.0.0.1:${m[1]}` }); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited ${code}: ${stderr}`)); });
  });
}

let gguf;
let folder;

before(async () => {
  mkdirSync(WORK_DIR, { recursive: true });
  if (!existsSync(file)) {
    // The fixture's arrays (tiny, qwen3, seed 3, Qwen3's tokenizer) as a Q8_0 file.
    execFileSync(STRATA, ['make-model', '--out', dir, '--preset', 'tiny', '--arch', 'qwen3',
      '--seed', '3', '--tokenizer-dir', QWEN3_TOKENIZER, '--gguf', 'q8_0']);
  }
  gguf = await serveGguf();
  folder = await startServer();
});

after(async () => {
  for (const s of [gguf, folder]) {
    if (!s) continue;
    if (s.stop) { await s.stop(); continue; }
    if (s.proc.exitCode === null) {
      const exited = new Promise((r) => s.proc.on('exit', r));
      s.proc.kill('SIGTERM');
      await exited;
    }
  }
});

test('the file alone serves chat completions with its own template', async () => {
  const client = new OpenAI({ baseURL: gguf.base + '/v1', apiKey: 'unused' });
  const models = await client.models.list();
  assert.equal(models.data[0].id, 'model.gguf');
  const messages = [{ role: 'user', content: 'Name three colors.' }];
  const chat = await client.chat.completions.create({ model: 'model.gguf', messages, max_tokens: 6,
    temperature: 0 });
  assert.equal(chat.object, 'chat.completion');
  assert.equal(chat.usage.completion_tokens, 6);
  const again = await client.chat.completions.create({ model: 'model.gguf', messages, max_tokens: 6,
    temperature: 0 });
  assert.equal(again.choices[0].message.content, chat.choices[0].message.content);
  const stream = await client.chat.completions.create({ model: 'model.gguf', messages, max_tokens: 6,
    temperature: 0, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  assert.equal(text, chat.choices[0].message.content);
});

test('same prompt tokens and clear greedy choices as the folder made from the same arrays', async () => {
  const a = new OpenAI({ baseURL: gguf.base + '/v1', apiKey: 'unused' });
  const b = new OpenAI({ baseURL: folder.base + '/v1', apiKey: 'unused' });
  for (const content of ['Hello there!', 'Write a haiku about 42 cats.']) {
    const ask = (client) => client.chat.completions.create({ model: 'x', messages: [{ role: 'user', content }],
      max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 2 });
    const [q, f] = await Promise.all([ask(a), ask(b)]);
    assert.equal(q.usage.prompt_tokens, f.usage.prompt_tokens, content);
    // Token by token while the F32 folder's top choice leads its second by a clear margin
    // (Q8_0 weights and 8-bit activations move logits by about 1 % of their range).
    const fl = f.choices[0].logprobs.content;
    const ql = q.choices[0].logprobs.content;
    let compared = 0;
    for (let i = 0; i < fl.length; ++i) {
      const top = fl[i].top_logprobs;
      if (top.length < 2 || top[0].logprob - top[1].logprob < 0.25) break;
      assert.equal(ql[i].token, fl[i].token, `${content}: token ${i}`);
      ++compared;
    }
    console.log(`"${content}": ${compared} of ${fl.length} greedy tokens compared`);
  }
});

test('a tokenizer folder given beside the file (--tokenizer) serves', async () => {
  const s = await serveGguf(['--tokenizer', QWEN3_TOKENIZER]);
  try {
    const r = await fetch(s.base + '/v1/completions', { method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'The quick brown fox', max_tokens: 3, temperature: 0 }) });
    assert.equal(r.status, 200);
    const j = await r.json();
    assert.equal(j.usage.completion_tokens, 3);
  } finally {
    const exited = new Promise((r) => s.proc.on('exit', r));
    s.proc.kill('SIGTERM');
    await exited;
  }
});
