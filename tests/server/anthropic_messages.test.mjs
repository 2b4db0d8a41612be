// Black-box tests of Anthropic's Messages API (docs/anthropic-messages.md) against a real
// `strata serve` with the official `@anthropic-ai/sdk` npm client: messages.create,
// streaming with the SDK's stream helpers, a tool round trip (tool_use, then tool_result),
// countTokens, cache breakpoints made into soft pins and the usage that reports them, and
// bad input refused in Anthropic's error shape without changing anything, and a tool_use
// reply that parks its conversation's KV on the host (--auto-tool-offload, the session being
// the x-session-id header or metadata.user_id) until the tool_result turn restores it, on a
// worker and through `strata route`. The tiny model's
// replies are chosen with the test-only `forced_output` field (--allow-forced-output).
// Run by CTest: node --test tests/server/anthropic_messages.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { createRequire } from 'node:module';
import { startServer, startRouter, allJoined, words, SOURCE_DIR } from './server_harness.mjs';

const require = createRequire(path.join(SOURCE_DIR, 'tools/js/package.json'));
const AnthropicModule = require('@anthropic-ai/sdk');
const Anthropic = AnthropicModule.default ?? AnthropicModule.Anthropic ?? AnthropicModule;

const KEY = 'k';
const ADMIN = { authorization: `Bearer ${KEY}` };
const TOOLS = [
  {
    name: 'get_weather',
    description: 'The weather in a city',
    input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
];
const CALL = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';

let server;
let client; // no key: a client's rights
let admin; // the admin key as x-api-key

before(async () => {
  server = await startServer(['--kv-cache-tokens', '8192', '--allow-forced-output', '--admin-api-key', KEY]);
  client = new Anthropic({ baseURL: server.base, apiKey: 'not-the-key', maxRetries: 0 });
  admin = new Anthropic({ baseURL: server.base, apiKey: KEY, maxRetries: 0 });
});

after(async () => {
  if (server) await server.stop();
});

async function pins() {
  const s = await server.get('/cache/state', ADMIN);
  assert.equal(s.status, 200, s.text);
  return { pinned: s.json.device.pinned_blocks, soft: s.json.device.soft_pinned_blocks };
}

async function metric(name) {
  const m = (await server.get('/metrics')).text.match(new RegExp(`^${name} (\\d+)`, 'm'));
  return m ? Number(m[1]) : 0;
}

test('messages.create: the message shape, end_turn, usage', async () => {
  const m = await client.messages.create({
    model: 'tiny', max_tokens: 64, system: 'Be brief.',
    messages: [{ role: 'user', content: 'Say hello.' }], forced_output: 'Hello there.',
  });
  assert.match(m.id, /^msg_/);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.deepEqual(m.content, [{ type: 'text', text: 'Hello there.' }]);
  assert.equal(m.stop_reason, 'end_turn');
  assert.equal(m.stop_sequence, null);
  assert.ok(m.usage.output_tokens > 0);
  const counted = await client.messages.countTokens({
    model: 'tiny', system: 'Be brief.', messages: [{ role: 'user', content: 'Say hello.' }],
  });
  assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens + m.usage.cache_creation_input_tokens,
    counted.input_tokens);
  assert.equal(m.usage.cache_creation_input_tokens, 0, 'no breakpoint: nothing created');
  assert.ok('device' in m.usage.cached_tokens_details, "Strata's per-tier breakdown");
});

test('stop_reason max_tokens and stop_sequence; sampling fields accepted', async () => {
  const cut = await client.messages.create({
    model: 'tiny', max_tokens: 2, messages: [{ role: 'user', content: 'x' }],
    forced_output: 'one two three four five six', temperature: 0.5, top_p: 0.9, top_k: 5,
    metadata: { user_id: 'u1' },
  });
  assert.equal(cut.stop_reason, 'max_tokens');
  assert.equal(cut.usage.output_tokens, 2);
  const stopped = await client.messages.create({
    model: 'tiny', max_tokens: 64, messages: [{ role: 'user', content: 'x' }],
    forced_output: 'alpha STOP beta', stop_sequences: ['NEVER', 'STOP'],
  });
  assert.equal(stopped.stop_reason, 'stop_sequence');
  assert.equal(stopped.stop_sequence, 'STOP');
  assert.equal(stopped.content[0].text, 'alpha ');
});

test('streaming: the SDK stream helpers see Anthropic event sequence', async () => {
  const stream = client.messages.stream({
    model: 'tiny', max_tokens: 64, messages: [{ role: 'user', content: 'Stream please.' }],
    forced_output: 'Streaming works fine here.',
  });
  let text = '';
  stream.on('text', (t) => { text += t; });
  const types = [];
  stream.on('streamEvent', (e) => types.push(e.type));
  const final = await stream.finalMessage();
  assert.equal(text, 'Streaming works fine here.');
  assert.equal(final.content[0].text, text);
  assert.equal(final.stop_reason, 'end_turn');
  assert.ok(final.usage.output_tokens > 0);
  assert.equal(types[0], 'message_start');
  assert.equal(types.at(-1), 'message_stop');
  assert.equal(types.at(-2), 'message_delta');
  assert.ok(types.includes('content_block_start') && types.includes('content_block_delta'));
  assert.ok(types.indexOf('content_block_stop') < types.indexOf('message_delta'));
  // The raw framing: `event: NAME` then `data: JSON`, ping included.
  const r = await fetch(server.base + '/v1/messages', {
    method: 'POST', headers: { 'content-type': 'application/json', 'anthropic-version': '2023-06-01' },
    body: JSON.stringify({ model: 'tiny', max_tokens: 8, stream: true, messages: [{ role: 'user', content: 'x' }], forced_output: 'ok' }),
  });
  const raw = await r.text();
  assert.match(raw, /^event: message_start\ndata: \{/);
  assert.match(raw, /event: ping\ndata: \{"type":"ping"\}\n\n/);
  assert.match(raw, /event: message_stop\ndata: \{"type":"message_stop"\}\n\n$/);
});

test('tools: tool_use out (whole and streamed), tool_result back in', async () => {
  const ask = { role: 'user', content: 'Weather in Paris?' };
  const m = await client.messages.create({
    model: 'tiny', max_tokens: 200, tools: TOOLS, messages: [ask], forced_output: CALL,
  });
  assert.equal(m.stop_reason, 'tool_use');
  assert.equal(m.content[0].type, 'text');
  assert.equal(m.content[0].text, 'Checking.\n');
  const use = m.content[1];
  assert.equal(use.type, 'tool_use');
  assert.equal(use.name, 'get_weather');
  assert.deepEqual(use.input, { city: 'Paris' });
  assert.ok(use.id.length > 0);

  const stream = client.messages.stream({
    model: 'tiny', max_tokens: 200, tools: TOOLS, messages: [ask], forced_output: CALL,
  });
  let json = '';
  stream.on('inputJson', (partial) => { json += partial; });
  const final = await stream.finalMessage();
  assert.equal(final.stop_reason, 'tool_use');
  const streamed = final.content.find((b) => b.type === 'tool_use');
  assert.deepEqual(streamed.input, { city: 'Paris' });
  assert.deepEqual(JSON.parse(json), { city: 'Paris' });

  // The round trip: the call and its result go back; the answer is text again.
  const next = await client.messages.create({
    model: 'tiny', max_tokens: 64, tools: TOOLS, forced_output: 'It is sunny in Paris.',
    messages: [ask, { role: 'assistant', content: m.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '21 C, sunny' }] }],
  });
  assert.equal(next.stop_reason, 'end_turn');
  assert.equal(next.content[0].text, 'It is sunny in Paris.');
  // tool_choice: a named tool the reply does not call is refused (as in chat completions).
  await assert.rejects(client.messages.create({
    model: 'tiny', max_tokens: 64, tools: TOOLS, tool_choice: { type: 'tool', name: 'get_weather' },
    messages: [ask], forced_output: 'no call',
  }), (e) => e.status === 422 && e.error?.type === 'error');
  // tool_choice none: the reply is text, even with markup.
  const none = await client.messages.create({
    model: 'tiny', max_tokens: 200, tools: TOOLS, tool_choice: { type: 'none' }, messages: [ask], forced_output: CALL,
  });
  assert.equal(none.stop_reason, 'end_turn');
  assert.equal(none.content.length, 1);
});

test('a breakpoint: created, then read on a repeat, and pinned softly for a client', async () => {
  const before = await pins();
  const body = {
    model: 'tiny', max_tokens: 4,
    system: [{ type: 'text', text: words(400, 31), cache_control: { type: 'ephemeral' } }],
    messages: [{ role: 'user', content: 'First question?' }], forced_output: 'ok',
  };
  const first = await client.messages.create(body);
  assert.ok(first.usage.cache_creation_input_tokens > 300, JSON.stringify(first.usage));
  assert.equal(first.usage.cache_creation.ephemeral_5m_input_tokens, first.usage.cache_creation_input_tokens);
  assert.equal(first.usage.cache_creation.ephemeral_1h_input_tokens, 0);
  assert.ok(first.usage.input_tokens > 0, 'the user turn is after the breakpoint');
  const p = await pins();
  assert.ok(p.pinned > before.pinned, 'the breakpoint pinned its prefix');
  assert.equal(p.soft - before.soft, p.pinned - before.pinned, "a client's pins are soft");
  // The repeat reads the prefix from the cache.
  const second = await client.messages.create(body);
  assert.ok(second.usage.cache_read_input_tokens > 300, JSON.stringify(second.usage));
  assert.equal(second.usage.input_tokens + second.usage.cache_read_input_tokens + second.usage.cache_creation_input_tokens,
    first.usage.input_tokens + first.usage.cache_read_input_tokens + first.usage.cache_creation_input_tokens);
  // The pinned blocks are in the tree's inspection too.
  const tree = await server.get('/cache/state?detail=tree', ADMIN);
  assert.ok(tree.json.nodes.some((n) => n.soft_pinned_blocks > 0));
});

test('1h breakpoints with the admin key (x-api-key), the automatic mode', async () => {
  const before = await pins();
  const m = await admin.messages.create({
    model: 'tiny', max_tokens: 4, cache_control: { type: 'ephemeral', ttl: '1h' },
    messages: [{ role: 'user', content: words(300, 32) }], forced_output: 'ok',
  });
  assert.ok(m.usage.cache_creation.ephemeral_1h_input_tokens > 250, JSON.stringify(m.usage));
  const p = await pins();
  assert.ok(p.soft > before.soft, 'a TTL makes the admin pin soft too');
});

// A breakpoint is a pin of its prefix: a flood of other prompts, several times the pool,
// evicts an unpinned prefix but not the pinned one; the pin's TTL (the tree's
// soft_pin_ttl_s) is the one asked for, a client's capped by --max-client-pin-ttl-s.
test('a breakpoint survives a flood that evicts unpinned prefixes; its pin has the TTL asked', async () => {
  const small = await startServer(['--kv-cache-tokens', '2048', '--allow-forced-output', '--admin-api-key', KEY,
    '--max-client-pinned-ratio', '0.4']);
  try {
    const c = new Anthropic({ baseURL: small.base, apiKey: 'not-the-key', maxRetries: 0 });
    const a = new Anthropic({ baseURL: small.base, apiKey: KEY, maxRetries: 0 });
    const ask = (system, cacheControl, question) => ({
      model: 'tiny', max_tokens: 4, forced_output: 'ok', messages: [{ role: 'user', content: question }],
      system: [{ type: 'text', text: system, ...(cacheControl ? { cache_control: cacheControl } : {}) }],
    });
    // The TTLs of the soft pins on the tree's pinned blocks, each once, and every block's.
    const ttls = async () => {
      const tree = await small.get('/cache/state?detail=tree', ADMIN);
      assert.equal(tree.status, 200, tree.text);
      const all = tree.json.nodes.flatMap((n) => n.soft_pin_ttl_s.filter((t, k) => n.pin_counts[k] > 0));
      return { distinct: [...new Set(all)].sort((x, y) => x - y), all };
    };
    const pinned = words(200, 91);
    const unpinned = words(200, 92);
    const first = await c.messages.create(ask(pinned, { type: 'ephemeral' }, 'one'));
    assert.ok(first.usage.cache_creation_input_tokens > 150, JSON.stringify(first.usage));
    assert.deepEqual((await ttls()).distinct, [300], "a client's 5m breakpoint: 300 s");
    const plain = await c.messages.create(ask(unpinned, null, 'one'));
    assert.equal(plain.usage.cache_creation_input_tokens, 0);
    // The admin's 1h breakpoint holds an hour; a client's is capped at 300 s.
    await a.messages.create(ask(words(80, 93), { type: 'ephemeral', ttl: '1h' }, 'x'));
    const withAdmin = await ttls();
    assert.deepEqual(withAdmin.distinct, [300, 3600]);
    await c.messages.create(ask(words(80, 94), { type: 'ephemeral', ttl: '1h' }, 'x'));
    const withClient = await ttls();
    assert.deepEqual(withClient.distinct, [300, 3600]);
    assert.ok(withClient.all.length > withAdmin.all.length, "the client's 1h pin is made, at 300 s");
    assert.equal(withClient.all.filter((t) => t === 3600).length, withAdmin.all.filter((t) => t === 3600).length);
    // The flood: distinct long prompts, several times the pool of 128 pages.
    for (let i = 0; i < 12; i++) {
      const r = await small.post('/v1/completions', { prompt: words(600, 2000 + i), max_tokens: 1 });
      assert.equal(r.status, 200, r.text);
    }
    const st = (await small.get('/cache/state', ADMIN)).json;
    assert.ok(st.evictions.evicted_pages_total > 128, JSON.stringify(st.evictions));
    const again = await c.messages.create(ask(pinned, { type: 'ephemeral' }, 'two'));
    assert.ok(again.usage.cache_read_input_tokens >= first.usage.cache_creation_input_tokens - 16,
      JSON.stringify([first.usage, again.usage]));
    const plainAgain = await c.messages.create(ask(unpinned, null, 'two'));
    assert.ok(plainAgain.usage.cache_read_input_tokens < 32, 'the unpinned prefix was evicted: ' +
      JSON.stringify(plainAgain.usage));
  } finally {
    await small.stop();
  }
});

// A breakpoint's pin lasts its TTL and no longer. The operator's cap on a client's pin TTL
// (--max-client-pin-ttl-s 3, docs/authority.md) makes a 5m breakpoint a 3 s soft pin, so
// the real expiry is seen in seconds: a hit within the TTL refreshes it; once the TTL passes
// without a hit the pin is dropped (counted in expired_pins_total) and a flood evicts the
// prefix like any other.
test('a breakpoint pin is refreshed by a hit and expires after its TTL; a flood then evicts it', async () => {
  const small = await startServer(['--kv-cache-tokens', '2048', '--allow-forced-output', '--admin-api-key', KEY,
    '--max-client-pinned-ratio', '0.4', '--max-client-pin-ttl-s', '3']);
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  try {
    const c = new Anthropic({ baseURL: small.base, apiKey: 'not-the-key', maxRetries: 0 });
    const ask = (system, question, cacheControl) => ({
      model: 'tiny', max_tokens: 4, forced_output: 'ok', messages: [{ role: 'user', content: question }],
      system: [{ type: 'text', text: system, ...(cacheControl ? { cache_control: cacheControl } : {}) }],
    });
    const state = async (detail) => {
      const r = await small.get(detail ? '/cache/state?detail=tree' : '/cache/state', ADMIN);
      assert.equal(r.status, 200, r.text);
      return r.json;
    };
    const pinnedBlocks = async () => (await state(true)).nodes
      .reduce((sum, n) => sum + n.pin_counts.filter((k) => k > 0).length, 0);
    const prefix = words(200, 95);
    const first = await c.messages.create(ask(prefix, 'one', { type: 'ephemeral' }));
    assert.ok(first.usage.cache_creation_input_tokens > 150, JSON.stringify(first.usage));
    const tree = await state(true);
    const ttls = tree.nodes.flatMap((n) => n.soft_pin_ttl_s.filter((t, k) => n.pin_counts[k] > 0));
    assert.deepEqual([...new Set(ttls)], [3], 'the 5m breakpoint capped at the operator\'s 3 s');
    const pinned = await pinnedBlocks();
    assert.ok(pinned >= 12, `${pinned} blocks pinned`);
    // A hit 1.5 s in refreshes the TTL: 1 s after it (2.5 s after the pin) it still holds.
    await sleep(1500);
    const hit = await c.messages.create(ask(prefix, 'two', { type: 'ephemeral' }));
    assert.ok(hit.usage.cache_read_input_tokens >= first.usage.cache_creation_input_tokens - 16,
      JSON.stringify(hit.usage));
    await sleep(1000);
    assert.equal(await pinnedBlocks(), pinned, 'a hit refreshed the TTL');
    assert.equal((await state(false)).evictions.expired_pins_total, 0);
    // No hit for the TTL: the pin goes (the engine checks expiries every 100 ms).
    const deadline = Date.now() + 15000;
    let left = pinned;
    while (left > 0 && Date.now() < deadline) {
      await sleep(250);
      left = await pinnedBlocks();
    }
    assert.equal(left, 0, 'the pin expired');
    assert.ok((await state(false)).evictions.expired_pins_total >= 1);
    // Now nothing holds the prefix: a flood several times the pool evicts it.
    for (let i = 0; i < 12; i++) {
      const r = await small.post('/v1/completions', { prompt: words(600, 3000 + i), max_tokens: 1 });
      assert.equal(r.status, 200, r.text);
    }
    const after = await c.messages.create(ask(prefix, 'three', null));
    assert.ok(after.usage.cache_read_input_tokens < 32, 'the expired prefix was evicted: ' +
      JSON.stringify(after.usage));
  } finally {
    await small.stop();
  }
});

test('bad input: Anthropic error shape, 4xx, nothing pinned or queued', async () => {
  const cc = { type: 'ephemeral' };
  const text = (t, c) => (c ? { type: 'text', text: t, cache_control: c } : { type: 'text', text: t });
  const cases = [
    [{ model: 'tiny', messages: [{ role: 'user', content: 'x' }] }, /max_tokens/],
    [{ model: 'tiny', max_tokens: '8', messages: [{ role: 'user', content: 'x' }] }, /max_tokens/],
    [{ model: 'tiny', max_tokens: 8, messages: [{ role: 'user', content: [{ type: 'image', source: {} }] }] }, /image/],
    [{ model: 'tiny', max_tokens: 8, messages: 'x' }, /messages/],
    [{ model: 'tiny', max_tokens: 8, messages: [{ role: 'user', content: [text(words(50, 1), { type: 'ephemeral', ttl: '2h' })] }] }, /ttl/],
    [{ model: 'tiny', max_tokens: 8, system: [text('s', cc)],
      messages: [{ role: 'user', content: [text('a', { type: 'ephemeral', ttl: '1h' })] }] }, /1h/],
    [{ model: 'tiny', max_tokens: 8, cache_control: cc, system: [text('a', cc), text('b', cc)],
      messages: [{ role: 'user', content: [text('c', cc), text('d', cc)] }] }, /maximum of 4/],
    [{ model: 'tiny', max_tokens: 8, tools: [{ type: 'web_search_20250305', name: 'web_search' }],
      messages: [{ role: 'user', content: 'x' }] }, /server tool/],
  ];
  const before = await pins();
  const prompts = await metric('strata_prompt_tokens_total');
  for (const [body, re] of cases) {
    const r = await server.post('/v1/messages', body, { 'x-api-key': KEY, 'anthropic-version': '2023-06-01' });
    assert.equal(r.status, 400, JSON.stringify(body) + ' ' + r.text);
    assert.equal(r.json.type, 'error');
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.match(r.json.error.message, re);
  }
  const badJson = await server.post('/v1/messages', '{"max_tokens": ');
  assert.equal(badJson.status, 400);
  assert.equal(badJson.json.type, 'error');
  assert.deepEqual(await pins(), before, 'nothing pinned');
  assert.equal(await metric('strata_prompt_tokens_total'), prompts, 'nothing ran');
  // The SDK reads the shape into its error classes.
  await assert.rejects(client.messages.create({ model: 'tiny', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof Anthropic.BadRequestError && e.error?.error?.type === 'invalid_request_error');
  const count = await server.post('/v1/messages/count_tokens', { messages: [{ role: 'user', content: [{ type: 'document' }] }] });
  assert.equal(count.status, 400);
  assert.equal(count.json.error.type, 'invalid_request_error');
});

test("a client's breakpoints live within the client pin budget; x-api-key is the admin's", async () => {
  // The tiny model's pool at 8,192 tokens: 512 pages of 16; 0.002 of it is 1 page.
  const small = await startServer(['--kv-cache-tokens', '8192', '--allow-forced-output', '--admin-api-key', KEY,
    '--max-client-pinned-ratio', '0.002']);
  try {
    const body = (seed) => ({
      model: 'tiny', max_tokens: 4, forced_output: 'ok',
      system: [{ type: 'text', text: words(400, seed), cache_control: { type: 'ephemeral' } }],
      messages: [{ role: 'user', content: 'hi' }],
    });
    const state = async () => (await small.get('/cache/state', ADMIN)).json.device.pinned_blocks;
    const refused = async () => {
      const m = (await small.get('/metrics')).text.match(/^strata_cache_control_pins_refused_total (\d+)/m);
      return m ? Number(m[1]) : 0;
    };
    const c = new Anthropic({ baseURL: small.base, apiKey: 'wrong', maxRetries: 0 });
    const m = await c.messages.create(body(41));
    // It answers; over the budget the longest prefix that fits (one page) is held, and only
    // that counts as cache creation.
    assert.equal(m.usage.cache_creation_input_tokens, 16, JSON.stringify(m.usage));
    assert.ok(m.usage.input_tokens > 300);
    assert.equal(await state(), 1, 'over the client budget: the first page pinned');
    assert.equal(await refused(), 1, 'the cut is counted');
    const device = (await small.get('/cache/state', ADMIN)).json.device;
    assert.equal(device.pins_cut_total, 1);
    assert.equal(device.pins_refused_total, 0);
    assert.ok(device.pin_blocks_refused_total > 10, JSON.stringify(device));
    // Another prefix when the budget is full: refused whole, counted.
    await c.messages.create(body(43));
    const full = (await small.get('/cache/state', ADMIN)).json.device;
    assert.equal(full.pins_refused_total, 1);
    assert.equal(await state(), 1);
    const a = new Anthropic({ baseURL: small.base, apiKey: KEY, maxRetries: 0 });
    await a.messages.create(body(42));
    assert.ok(await state() > 8, 'the admin key as x-api-key pins beyond the client budget');
  } finally {
    await small.stop();
  }
});

// --auto-tool-offload on the Messages API: the conversation's session is the x-session-id
// header, else metadata.user_id (docs/anthropic-messages.md). A tool_use reply parks the
// session's KV on the host (its kv_meta state), and the turn that brings the tool_result
// restores it and reads the whole first turn from the cache. Through `strata route` the same
// key sticks to one worker, which the router's /session/kv_meta finds.
test('a tool_use reply parks its session on the host; the tool_result turn restores it (worker, router)', async () => {
  const flags = ['--kv-cache-tokens', '8192', '--allow-forced-output', '--admin-api-key', KEY,
    '--enable-hierarchical-cache', '--hicache-ratio', '2', '--auto-tool-offload'];
  const workers = [];
  let router;
  try {
    workers.push(await startServer(flags), await startServer(flags));
    router = await startRouter(['--admin-api-key', KEY, '--load-poll-ms', '50',
      ...workers.flatMap((w) => ['--worker', w.base])]);
    await allJoined(router, 2);
    const system = 'Tools agent. ' + words(150, 21);
    const ask = { role: 'user', content: 'Weather in Paris?' };
    // One tool round trip of session `key` through `anthropic`, the key given by `extra`
    // (body fields) or `headers`; `where` answers kv_meta for the key.
    const roundTrip = async (anthropic, key, extra, headers, where) => {
      const stateOf = async () => {
        const meta = await where.get('/session/kv_meta?session_id=' + encodeURIComponent(key), ADMIN);
        assert.equal(meta.status, 200, meta.text);
        return { state: meta.json.state, worker: meta.headers?.get('x-strata-worker') };
      };
      const { data: first, response: r1 } = await anthropic.messages.create({ model: 'tiny', max_tokens: 200,
        system, tools: TOOLS, messages: [ask], forced_output: CALL, ...extra }, { headers }).withResponse();
      assert.equal(first.stop_reason, 'tool_use');
      const parked = await stateOf();
      assert.ok(['OFFLOADING', 'OFFLOADED'].includes(parked.state), `${key}: ${parked.state}`);
      const use = first.content.find((b) => b.type === 'tool_use');
      const { data: next, response: r2 } = await anthropic.messages.create({ model: 'tiny', max_tokens: 64,
        system, tools: TOOLS, forced_output: 'It is sunny in Paris.', ...extra,
        messages: [ask, { role: 'assistant', content: first.content },
          { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '21 C, sunny' }] }] },
      { headers }).withResponse();
      assert.equal(next.stop_reason, 'end_turn');
      assert.equal(next.content[0].text, 'It is sunny in Paris.');
      assert.notEqual((await stateOf()).state, 'OFFLOADED');
      const firstPrompt = first.usage.input_tokens + first.usage.cache_read_input_tokens
        + first.usage.cache_creation_input_tokens;
      assert.ok(next.usage.cache_read_input_tokens >= firstPrompt - 16,
        JSON.stringify([first.usage, next.usage]));
      return { parkedOn: parked.worker, first: r1.headers.get('x-strata-worker'), next: r2.headers.get('x-strata-worker') };
    };
    // On a worker: metadata.user_id, then the header (which wins over a user_id).
    const direct = new Anthropic({ baseURL: workers[0].base, apiKey: 'not-the-key', maxRetries: 0 });
    await roundTrip(direct, 'user-anthropic-1', { metadata: { user_id: 'user-anthropic-1' } }, {}, workers[0]);
    await roundTrip(direct, 'conv-anthropic-2', { metadata: { user_id: 'someone-else' } },
      { 'x-session-id': 'conv-anthropic-2' }, workers[0]);
    // Without a key nothing is parked: there is no session to name.
    const plain = await direct.messages.create({ model: 'tiny', max_tokens: 200, system, tools: TOOLS,
      messages: [ask], forced_output: CALL });
    assert.equal(plain.stop_reason, 'tool_use');
    const sessions = (await workers[0].get('/metrics')).text.match(/^strata_tool_sessions\{state="OFFLOADED"\} (\d+)/m);
    assert.ok(sessions, 'the tool sessions gauge');
    assert.equal(Number(sessions[1]), 0, sessions[0]);
    // Through the router: the key sticks to one worker, whose session is parked and restored.
    const routed = new Anthropic({ baseURL: router.base, apiKey: 'not-the-key', maxRetries: 0 });
    for (const [key, extra, headers] of [
      ['user-routed-3', { metadata: { user_id: 'user-routed-3' } }, {}],
      ['conv-routed-4', {}, { 'x-session-id': 'conv-routed-4' }],
    ]) {
      const seen = await roundTrip(routed, key, extra, headers, router);
      assert.ok(workers.some((w) => w.base === seen.first), seen.first);
      assert.equal(seen.next, seen.first, key);
      assert.equal(seen.parkedOn, seen.first, key);
    }
  } finally {
    if (router) await router.stop();
    for (const w of workers) await w.stop();
  }
});
