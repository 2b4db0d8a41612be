// Black-box tests of 8-bit KV pages (issue 54): a worker started with --kv-cache-dtype int8
// (or fp8) and a pool sized by --kv-cache-memory holds about twice the tokens of a BF16
// worker in the same bytes, says its dtype and bytes per page (/server_info, /cache/state,
// /metrics), serves a repeated prompt from its cache, and moves its pages through the host
// tier and a file store like any other; bad values of the new flags are refused at start.
// On a GPU (STRATA_TEST_DEVICE=cuda) 8-bit pages are refused at start with the reason.
// Run by CTest: node --test tests/server/kv8.test.mjs
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { mkdtempSync, rmSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { startServer, words, tinyQwen3Model, STRATA, WORK_DIR, TEST_DEVICE } from './server_harness.mjs';

const ADMIN = { authorization: 'Bearer k' };

async function chat(server, content, maxTokens = 8) {
  const r = await server.post('/v1/chat/completions', {
    model: 'm', messages: [{ role: 'user', content }], max_tokens: maxTokens, temperature: 0,
  });
  assert.equal(r.status, 200, r.text);
  return r.json;
}

function metric(text, name, labels) {
  const head = labels ? `${name}{${labels}} ` : `${name} `;
  const line = text.split('\n').find((l) => l.startsWith(head));
  return line === undefined ? undefined : Number(line.slice(head.length));
}

function serveFails(args) {
  return spawnSync(STRATA, ['serve', '--model', tinyQwen3Model(), '--port', '0', '--threads', '1',
    ...args], { encoding: 'utf8', timeout: 60000 });
}

test('bad values of the new flags are refused at start, naming the flag', () => {
  for (const [args, re] of [
    [['--kv-cache-dtype', 'int4'], /--kv-cache-dtype/],
    [['--kv-cache-memory', '12XB'], /--kv-cache-memory/],
    [['--kv-cache-memory', '0'], /--kv-cache-memory/],
    [['--kv-cache-memory', '1GB', '--kv-cache-tokens', '4096'], /--kv-cache-memory.*--kv-cache-tokens|--kv-cache-tokens.*--kv-cache-memory/],
    [['--kv-cache-memory', '40KB'], /--kv-cache-memory .*at least 4/],
  ]) {
    const r = serveFails(args);
    assert.notEqual(r.status, 0, `${args.join(' ')} was accepted`);
    assert.match(r.stderr + r.stdout, re, args.join(' '));
  }
});

test('on a GPU, 8-bit pages are refused at start with the reason', { skip: TEST_DEVICE !== 'cuda' }, () => {
  const r = serveFails(['--device', 'cuda', '--kv-cache-dtype', 'int8']);
  assert.notEqual(r.status, 0);
  assert.match(r.stderr + r.stdout, /--kv-cache-dtype int8: --device cuda keeps BF16 pages/);
});

test('int8 pages: twice the tokens in the same memory, said everywhere, served from cache and the tiers',
  { skip: TEST_DEVICE === 'cuda' }, async () => {
    const store = mkdtempSync(path.join(WORK_DIR, 'kv8-store-'));
    // The tiny Qwen3's pages: 8,192 bytes in BF16, 4,352 in int8 (head_dim 32: 64 bytes a row
    // against 32 codes and a 2-byte scale), so 300 kB hold 36 and 68 pages.
    const budget = 300000;
    const common = ['--kv-cache-memory', '300KB', '--page-size', '16', '--admin-api-key', 'k'];
    const bf16 = await startServer([...common, '--kv-cache-dtype', 'bf16']);
    const int8 = await startServer([...common, '--kv-cache-dtype', 'int8', '--enable-hierarchical-cache',
      '--hicache-ratio', '4', '--hicache-mem-layout', 'page_first',
      '--hicache-storage-backend', 'file',
      '--hicache-storage-backend-extra-config', JSON.stringify({ dir: store })]);
    try {
      const a = (await bf16.get('/cache/state', ADMIN)).json;
      const b = (await int8.get('/cache/state', ADMIN)).json;
      assert.equal(a.kv_dtype, 'bf16');
      assert.equal(b.kv_dtype, 'int8');
      // The same 300 kB: the pages that fit, each of the bytes /cache/state says.
      for (const s of [a, b]) {
        assert.equal(s.device.capacity_pages, Math.floor(budget / s.device.page_bytes));
        assert.equal(s.device.tokens_per_gb, Math.floor(1e9 / s.device.page_bytes * 16));
      }
      const ratio = b.device.capacity_tokens / a.device.capacity_tokens;
      const info = (await int8.get('/server_info')).json;
      assert.equal(info.kv_cache_dtype, 'int8');
      assert.equal(info.device.page_bytes, b.device.page_bytes);
      assert.ok(ratio > 1.7, `int8 holds ${ratio}x the tokens of bf16`);
      assert.equal(b.host.page_bytes, b.device.page_bytes);
      const m = (await int8.get('/metrics')).text;
      assert.equal(metric(m, 'strata_kv_page_bytes', 'tier="device"'), b.device.page_bytes);
      assert.equal(metric(m, 'strata_kv_tokens_per_gb', 'tier="host"'), b.host.tokens_per_gb);
      assert.match(m, /vllm:cache_config_info\{[^}]*cache_dtype="int8"/);

      // A repeated prompt comes from the cache with the same greedy output.
      const prompt = words(300, 11);
      const first = await chat(int8, prompt);
      const second = await chat(int8, prompt);
      assert.equal(second.choices[0].message.content, first.choices[0].message.content);
      assert.ok(second.usage.prompt_tokens_details.cached_tokens > 200, JSON.stringify(second.usage));
      // A flood of other prompts pushes it off the 68-page device pool; it comes back from
      // the host tier (page_first: a page's rows interleaved token by token, each row's codes
      // then its scale) or the store, with the same output.
      for (let i = 0; i < 12; i++) await chat(int8, words(300, 100 + i), 1);
      const third = await chat(int8, prompt);
      assert.equal(third.choices[0].message.content, first.choices[0].message.content);
      assert.ok(third.usage.prompt_tokens_details.cached_tokens > 200, JSON.stringify(third.usage));
      const s = (await int8.get('/cache/state', ADMIN)).json;
      assert.ok(s.evictions.evicted_pages_total > 0, 'the flood evicted device pages');
      assert.ok(s.host.used_pages > 0, JSON.stringify(s.host));
      assert.ok(s.storage.set_written > 0, JSON.stringify(s.storage));
      assert.equal(s.storage.foreign_format_values, 0);
    } finally {
      await bf16.stop();
      await int8.stop();
      rmSync(store, { recursive: true, force: true });
    }
  });
