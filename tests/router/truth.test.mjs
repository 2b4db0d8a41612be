// Black-box tests that `strata route` believes only what is true (docs/router.md): it reads
// agentic conversations exactly as its workers do (same prompt tokens, a predicted cached
// prefix equal to the worker's reported hit), forgets a restarted worker's blocks and pins
// at once, never marks a pin the worker did not confirm, answers bad input with 4xx in the
// workers' error shape, and keeps nothing of a refused request (resident memory included).
// Run by CTest: node --test tests/router/truth.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import path from 'node:path';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { startServer, startRouter as startRouterProcess, waitFor, workerList, allJoined, words, metric, SOURCE_DIR } from '../server/server_harness.mjs';
import { RawConn, postRaw, destroyAllRawConns } from '../server/raw_http.mjs';

const require = createRequire(path.join(SOURCE_DIR, 'tools/js/package.json'));
const OpenAI = require('openai').default ?? require('openai');

const KEY = 'truth-key';
const ADMIN = { authorization: 'Bearer ' + KEY };
const SANITIZED = process.env.STRATA_SANITIZER_BUILD === '1';
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const workers = [];
let reference;  // a worker behind no router: what a client sending directly gets
let router;
const extra = [];  // processes a test started, stopped in `after`

function workerArgs(more = []) {
  return ['--kv-cache-tokens', '8192', '--admin-api-key', KEY, '--allow-forced-output',
    '--max-prompt-tokens', '4096', ...more];
}
const withEvents = ['--kv-events-endpoint', 'tcp://127.0.0.1:*', '--kv-events-replay-endpoint', 'tcp://127.0.0.1:*'];

function startRouter(args) {
  return startRouterProcess(['--admin-api-key', KEY, '--load-poll-ms', '50', ...args]);
}

async function counters(r) {
  return {
    prompt: await metric(r, 'strata_router_prompt_tokens_total'),
    predicted: await metric(r, 'strata_router_predicted_cached_tokens_total'),
    reported: await metric(r, 'strata_router_reported_cached_tokens_total'),
  };
}

// The router's index of one worker (GET /cache/state's index.workers entry).
async function indexOf(r, url) {
  const ws = await workerList(r);
  const id = ws.find((w) => w.url === url).id;
  const s = await r.get('/cache/state', ADMIN);
  assert.equal(s.status, 200, s.text);
  return s.json.index.workers.find((w) => w.worker === id) ?? { blocks: 0, pinned_blocks: 0 };
}

// Until the router's index of every worker holds what the worker caches (its events
// arrived), or 3 s; then a little more for the last batch.
async function settled(r, ws) {
  const until = Date.now() + 3000;
  for (const w of ws) {
    while (Date.now() < until) {
      const st = await w.get('/cache/state', ADMIN);
      if ((await indexOf(r, w.base)).blocks === st.json.device.cached_pages) break;
      await sleep(50);
    }
  }
  await sleep(200);
}

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
  });
}

before(async () => {
  for (let i = 0; i < 2; i++) workers.push(await startServer(workerArgs(withEvents)));
  reference = await startServer(workerArgs());
  router = await startRouter(workers.flatMap((w) => ['--worker', w.base]));
  await allJoined(router, 2);
});

after(async () => {
  destroyAllRawConns();
  for (const p of extra) await p.stop();
  if (router) await router.stop();
  for (const w of workers) await w.stop();
  if (reference) await reference.stop();
});

const TOOLS = [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];

// Compact JSON (LangChain, the Vercel AI SDK) and JSON with spaces (Python's json.dumps).
const spaced = (o) => JSON.stringify(o).replace(/":/g, '": ').replace(/,"/g, ', "');

// The ways clients echo an assistant turn with a tool call.
const FORMS = [
  { name: 'string arguments, compact JSON, content null', args: (o) => JSON.stringify(o), content: null },
  { name: 'string arguments, spaced JSON, content null', args: spaced, content: null },
  { name: 'object arguments, content null', args: (o) => o, content: null },
  { name: 'string arguments, content ""', args: (o) => JSON.stringify(o), content: '' },
];

// One request through the router and the same one directly to a worker: the router counted
// the worker's tokens, and predicted exactly the cached prefix the worker reported. With
// `session` (a session the worker continues with its exact tokens, docs/sessions.md) the
// reference worker holds no record of it, so only the router's count and prediction are
// compared with what its worker reported: the router continues the exact tokens the
// worker gave it for the session (docs/router.md, "Exact continuations").
async function throughBoth(body, seen, session = false) {
  const before = await counters(router);
  const viaRouter = await router.post('/v1/chat/completions', body);
  assert.equal(viaRouter.status, 200, viaRouter.text);
  const after = await counters(router);
  const usage = viaRouter.json.usage;
  const predicted = after.predicted - before.predicted;
  const reported = after.reported - before.reported;
  const counted = after.prompt - before.prompt;
  assert.equal(reported, usage.prompt_tokens_details.cached_tokens);
  seen.push({ predicted, reported, prompt: usage.prompt_tokens, counted });
  assert.equal(viaRouter.json.strata_turn_record, undefined, 'the router\'s extension field reaches no client');
  if (session) {
    assert.equal(counted, usage.prompt_tokens, 'the router counted the worker\'s prompt tokens');
    assert.equal(predicted, reported, `predicted ${predicted} cached tokens, the worker reported ${reported}`);
    return viaRouter;
  }
  const direct = await reference.post('/v1/chat/completions', body);
  assert.equal(direct.status, 200, direct.text);
  assert.equal(counted, usage.prompt_tokens, 'the router counted the worker\'s prompt tokens');
  assert.equal(direct.json.usage.prompt_tokens, usage.prompt_tokens, 'the same prompt sent directly');
  assert.equal(predicted, reported, `predicted ${predicted} cached tokens, the worker reported ${reported}`);
  return viaRouter;
}

test('agent loops: the router reads each turn as the worker and predicts its hit', async () => {
  const seen = [];
  let seed = 11;
  for (const form of FORMS) {
    const messages = [{ role: 'system', content: 'You are a weather agent. ' + words(200, seed++) },
      { role: 'user', content: 'Weather in three cities, one call at a time.' }];
    for (let turn = 0; turn < 3; turn++) {
      const call = { name: 'get_weather', arguments: { city: 'City' + turn } };
      const r = await throughBoth({ messages, tools: TOOLS, max_tokens: 40, temperature: 0,
        forced_output: `<tool_call>\n${JSON.stringify(call)}\n</tool_call>` }, seen);
      const msg = r.json.choices[0].message;
      assert.equal(msg.tool_calls?.length, 1, JSON.stringify(msg));
      // Echoed as the client does: the API's message, its arguments in the client's form.
      const tc = msg.tool_calls[0];
      messages.push({ role: 'assistant', content: form.content,
        tool_calls: [{ id: tc.id, type: 'function',
          function: { name: tc.function.name, arguments: form.args(JSON.parse(tc.function.arguments)) } }] });
      messages.push({ role: 'tool', tool_call_id: tc.id, content: spaced({ temp_c: 18 + turn }) });
      await settled(router, workers);
    }
  }
  console.log('agent loops, predicted/reported cached tokens per turn: ' +
    seen.map((s) => `${s.predicted}/${s.reported} of ${s.prompt}`).join(', '));
  assert.ok(seen.some((s) => s.reported > 0), 'later turns are cache hits');
});

test('the openai SDK\'s own agent loop (the message echoed as returned) goes through the router', async () => {
  const client = new OpenAI({ baseURL: router.base + '/v1', apiKey: 'unused' });
  const messages = [{ role: 'system', content: 'Tools agent. ' + words(150, 77) },
    { role: 'user', content: 'What is the weather in Oslo?' }];
  const first = await client.chat.completions.create({ model: 'tiny', messages, tools: TOOLS, max_tokens: 40,
    forced_output: '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' });
  const msg = first.choices[0].message;
  assert.equal(msg.content, null);
  messages.push(msg);
  messages.push({ role: 'tool', tool_call_id: msg.tool_calls[0].id, content: '{"temp_c": 3}' });
  await settled(router, workers);
  const seen = [];
  await throughBoth({ messages, tools: TOOLS, max_tokens: 4, forced_output: 'It is 3 C.' }, seen);
  const tok = await router.post('/tokenize', { messages, tools: TOOLS });
  assert.equal(tok.status, 200, tok.text);
});

test('<think> replies, with and without session_id: the router predicts the worker\'s hit', async () => {
  for (const session of [false, true]) {
    const seen = [];
    const messages = [{ role: 'system', content: 'Think first. ' + words(200, session ? 98 : 99) },
      { role: 'user', content: 'What is 2 + 2?' }];
    for (let turn = 0; turn < 3; turn++) {
      const body = { messages, max_tokens: 60,
        forced_output: `<think>\nStep ${turn}: add the numbers.\n</think>\n\nThe answer is ${4 + turn}.` };
      if (session) body.session_id = 'think-session';
      const r = await throughBoth(body, seen, session);
      messages.push({ role: 'assistant', content: r.json.choices[0].message.content });
      messages.push({ role: 'user', content: `And plus ${turn + 1}?` });
      await settled(router, workers);
    }
    console.log(`<think> turns${session ? ' with session_id' : ''}, predicted/reported (counted/prompt tokens): ` +
      seen.map((s) => `${s.predicted}/${s.reported} (${s.counted}/${s.prompt})`).join(', '));
    for (const [turn, s] of seen.entries()) {
      assert.equal(s.predicted, s.reported, `turn ${turn}: predicted ${s.predicted}, the worker reported ${s.reported}`);
      assert.equal(s.counted, s.prompt, `turn ${turn}: counted ${s.counted} of the worker's ${s.prompt} tokens`);
    }
    assert.ok(seen.slice(1).every((s) => s.reported > 0), 'later turns are cache hits');
    if (session) {
      // The worker continued its exact tokens (the <think> blocks stay in its prompt).
      assert.ok(seen[2].prompt > seen[2].reported && seen[2].reported >= seen[1].prompt - 16,
        `the third turn hits the whole second turn: ${JSON.stringify(seen)}`);
    }
  }
});

test('<think> replies streamed with session_id: the record event reaches no client, the prediction holds', async () => {
  const messages = [{ role: 'system', content: 'Stream and think. ' + words(200, 97) },
    { role: 'user', content: 'What is 3 + 3?' }];
  for (let turn = 0; turn < 3; turn++) {
    const before = await counters(router);
    const r = await fetch(router.base + '/v1/chat/completions', {
      method: 'POST', headers: { 'content-type': 'application/json', 'x-session-id': 'think-stream' },
      body: JSON.stringify({ messages, max_tokens: 60, stream: true, stream_options: { include_usage: true },
        forced_output: `<think>\nStep ${turn}.\n</think>\n\nIt is ${6 + turn}.` }),
    });
    assert.equal(r.status, 200);
    const text = await r.text();
    assert.ok(!text.includes('strata_turn_record'), text);
    assert.match(text, /data: \[DONE\]\n\n$/);
    const chunks = text.split('\n\n').filter((e) => e.startsWith('data: {')).map((e) => JSON.parse(e.slice(6)));
    const usage = chunks.find((c) => c.usage)?.usage;
    const content = chunks.map((c) => c.choices?.[0]?.delta?.content ?? '').join('');
    const after = await counters(router);
    assert.equal(after.predicted - before.predicted, usage.prompt_tokens_details.cached_tokens, `turn ${turn}`);
    assert.equal(after.prompt - before.prompt, usage.prompt_tokens, `turn ${turn}`);
    if (turn > 0) assert.ok(usage.prompt_tokens_details.cached_tokens > 0);
    messages.push({ role: 'assistant', content });
    messages.push({ role: 'user', content: `And plus ${turn + 1}?` });
    await settled(router, workers);
  }
  // A client that asks for the extension itself gets it.
  const asked = await router.post('/v1/chat/completions', { messages: messages.slice(0, 2), max_tokens: 8,
    forced_output: 'Six.', session_id: 'asked-for-record' }, { 'x-strata-turn-record': '1' });
  assert.equal(asked.status, 200, asked.text);
  assert.ok(Array.isArray(asked.json.strata_turn_record?.tokens), asked.text);
  assert.ok(asked.json.strata_turn_record.tokens.length > asked.json.usage.prompt_tokens, asked.text);
  // A worker adds the field only when asked, and only for a session's turn.
  const direct = { messages: messages.slice(0, 2), max_tokens: 8, forced_output: 'Six.', session_id: 'direct-record' };
  const plain = await reference.post('/v1/chat/completions', direct);
  assert.equal(plain.status, 200, plain.text);
  assert.ok(!plain.text.includes('strata_turn_record'), plain.text);
  const withHeader = await reference.post('/v1/chat/completions', direct, { 'x-strata-turn-record': '1' });
  assert.equal(withHeader.json.strata_turn_record.num_messages, 2, withHeader.text);
  const noSession = await reference.post('/v1/chat/completions', { ...direct, session_id: undefined },
    { 'x-strata-turn-record': '1' });
  assert.ok(!noSession.text.includes('strata_turn_record'), noSession.text);
});

test('a chain of Responses turns by previous_response_id: the router predicts the worker\'s hit', async () => {
  const instructions = 'Answer after thinking. ' + words(200, 96);
  let previous = null;
  const seen = [];
  for (let turn = 0; turn < 5; turn++) {
    const body = { model: 'tiny', instructions, input: `What is ${turn} + 2?`, max_output_tokens: 60,
      forced_output: `<think>\nStep ${turn}: add.\n</think>\n\nIt is ${turn + 2}.` };
    if (previous) body.previous_response_id = previous;
    const stream = turn === 3;  // one turn streamed: its record comes as an event
    if (stream) body.stream = true;
    const before = await counters(router);
    let usage;
    if (stream) {
      const r = await fetch(router.base + '/v1/responses', {
        method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
      assert.equal(r.status, 200);
      const text = await r.text();
      assert.ok(!text.includes('strata_turn_record'), text);
      assert.match(text, /event: response\.completed\ndata: \{.*\}\n\n$/);
      const done = text.split('\n\n').find((e) => e.startsWith('event: response.completed'));
      const response = JSON.parse(done.split('\n')[1].slice('data: '.length)).response;
      usage = response.usage;
      previous = response.id;
    } else {
      const r = await router.post('/v1/responses', body);
      assert.equal(r.status, 200, r.text);
      assert.equal(r.json.strata_turn_record, undefined, 'the router\'s extension field reaches no client');
      if (turn > 0) assert.equal(r.headers.get('x-strata-route'), 'previous_response');
      usage = r.json.usage;
      previous = r.json.id;
    }
    const after = await counters(router);
    const predicted = after.predicted - before.predicted;
    const reported = after.reported - before.reported;
    assert.equal(reported, usage.input_tokens_details.cached_tokens);
    seen.push({ predicted, reported, prompt: usage.input_tokens });
    await settled(router, workers);
  }
  console.log('Responses chain, predicted/reported (prompt tokens): ' +
    seen.map((s) => `${s.predicted}/${s.reported} (${s.prompt})`).join(', '));
  for (const [turn, s] of seen.entries()) {
    assert.equal(s.predicted, s.reported, `turn ${turn}: predicted ${s.predicted}, the worker reported ${s.reported}`);
  }
  assert.ok(seen.slice(1).every((s) => s.reported > 0), 'a chain hits its previous turns');
  // The stored response the client reads has no extension field either.
  const got = await router.get('/v1/responses/' + previous);
  assert.equal(got.status, 200, got.text);
  assert.equal(got.json.strata_turn_record, undefined);
});

test('pins the workers did not confirm are never marked', async () => {
  const unknown = [];
  for (let i = 0; i < 64; i++) unknown.push(String(1000003n * BigInt(i + 1) + 12345678901234567n));
  const before = await router.get('/cache/state', ADMIN);
  const marks = (s) => s.json.index.workers.reduce((n, w) => n + w.pinned_blocks, 0);
  for (let round = 0; round < 5; round++) {
    // Decimal strings (what a JavaScript client can hold exactly) and integers.
    for (const body of [{ block_hashes: unknown }, { block_hashes: unknown.slice(0, 8).map(Number) }]) {
      const r = await router.post('/cache/pin', body, ADMIN);
      assert.equal(r.status, 200, r.text);
      for (const w of r.json.workers) assert.equal(w.body.pinned_count, 0, JSON.stringify(w));
    }
  }
  const afterPins = await router.get('/cache/state', ADMIN);
  assert.equal(marks(afterPins), marks(before), 'pin marks grew on hashes no worker knows');

  // A pin the worker confirms is marked (by content: the router hashes it as the worker).
  const system = 'Pinned prefix. ' + words(200, 5);
  const messages = [{ role: 'system', content: system }, { role: 'user', content: 'hello' }];
  const r = await router.post('/v1/chat/completions', { messages, max_tokens: 2 });
  assert.equal(r.status, 200, r.text);
  const home = r.headers.get('x-strata-worker');
  await settled(router, workers);
  const pin = await router.post('/cache/pin', { messages: [{ role: 'system', content: system }] }, ADMIN);
  assert.equal(pin.status, 200, pin.text);
  const answer = pin.json.workers.find((w) => w.url === home);
  assert.ok(answer.body.pinned_count > 0, JSON.stringify(pin.json));
  assert.equal((await indexOf(router, home)).pinned_blocks, answer.body.pinned_count);
  const unpin = await router.post('/cache/unpin', { messages: [{ role: 'system', content: system }] }, ADMIN);
  assert.equal(unpin.status, 200, unpin.text);
  assert.equal((await indexOf(router, home)).pinned_blocks, 0);
});

test('a worker killed and restarted is forgotten at once, its pins included', async () => {
  const [port, ev, replay] = [await freePort(), await freePort(), await freePort()];
  const args = workerArgs(['--port', String(port), '--kv-events-endpoint', `tcp://127.0.0.1:${ev}`,
    '--kv-events-replay-endpoint', `tcp://127.0.0.1:${replay}`]);
  let victim = await startServer(args);
  extra.push(victim);  // stopped by the suite's end even if this test fails midway
  const r2 = await startRouter(['--worker', victim.base, '--worker', workers[0].base]);
  extra.push(r2);
  await allJoined(r2, 2);
  const system = 'Restart me. ' + words(300, 123);
  const body = { messages: [{ role: 'system', content: system }, { role: 'user', content: 'q' }], max_tokens: 2 };
  assert.equal((await victim.post('/v1/chat/completions', body)).status, 200);
  await waitFor(async () => (await indexOf(r2, victim.base)).blocks >= 16, 'the victim\'s blocks in the index');
  const pin = await r2.post('/cache/pin', { messages: [{ role: 'system', content: system }] }, ADMIN);
  assert.equal(pin.status, 200, pin.text);
  const held = await indexOf(r2, victim.base);
  assert.ok(held.pinned_blocks > 0, JSON.stringify(held));
  // A session's turn there: the router keeps the exact tokens the victim recorded for it.
  const turn = await r2.post('/v1/chat/completions', { ...body, session_id: 'victim-session' });
  assert.equal(turn.status, 200, turn.text);
  assert.equal(turn.headers.get('x-strata-worker'), victim.base, 'the cached prefix decides');
  const records = async () => (await workerList(r2)).find((w) => w.url === victim.base).router.turn_records;
  assert.equal(await records(), 1);

  process.kill(victim.pid, 'SIGKILL');
  await new Promise((res) => victim.proc.on('exit', res));
  await waitFor(async () => !(await workerList(r2)).find((w) => w.url === victim.base).reachable, 'the router to see it gone');
  victim = await startServer(args);
  extra.push(victim);
  await waitFor(async () => (await workerList(r2)).find((w) => w.url === victim.base).reachable, 'the router to see it back');
  // Without waiting for any event from the new process.
  const idx = await waitFor(async () => {
    const i = await indexOf(r2, victim.base);
    return i.blocks === 0 && i.pinned_blocks === 0 ? i : null;
  }, 'the dead process\'s blocks and pins to be forgotten', 3000);
  assert.equal(idx.pinned_blocks, 0);
  // Its records went with the old process.
  assert.equal(await records(), 0);

  // The prefix is now nowhere: no prediction for the restarted worker.
  const before = await counters(r2);
  const again = await r2.post('/v1/chat/completions', body);
  assert.equal(again.status, 200, again.text);
  const after = await counters(r2);
  assert.equal(after.predicted - before.predicted, after.reported - before.reported);
});

test('bad input gets a 4xx in the workers\' error shape, never a 5xx', async () => {
  const shape = (r, what) => {
    assert.ok(r.status >= 400 && r.status < 500, `${what}: ${r.status} ${r.text}`);
    assert.equal(typeof r.json?.error?.message, 'string', `${what}: ${r.text}`);
    assert.equal(r.json.error.type, 'invalid_request_error', `${what}: ${r.text}`);
    assert.equal(typeof r.json.error.code, 'string', `${what}: ${r.text}`);
  };
  const msgs = [{ role: 'user', content: 'hi' }];
  const cases = [
    ['/v1/chat/completions', 'not json'],
    ['/v1/chat/completions', '[1,2]'],
    ['/v1/chat/completions', { messages: 'x' }],
    ['/v1/chat/completions', { messages: msgs, stream: 'yes' }],
    ['/v1/chat/completions', { messages: msgs, session_id: 7 }],
    ['/v1/chat/completions', { messages: msgs, tools: 'x' }],
    ['/v1/chat/completions', { messages: [{ role: 'assistant', content: null, tool_calls: [{ function: { name: 'f', arguments: 5 } }] }] }],
    ['/v1/completions', { prompt: [1, -1] }],
    ['/v1/completions', { prompt: { a: 1 } }],
    ['/cache/pin', { messages: msgs, add_generation_prompt: 'yes' }],
    ['/cache/pin', { messages: msgs, add_generation_prompt: 1 }],
    ['/cache/pin', { block_hashes: ['12x'] }],
    ['/cache/pin', { block_hashes: [1], token_ids: [1] }],
    ['/cache/unpin', { token_ids: [-5] }],
    ['/cache/evict', { token_ids: [1] }],
    ['/cache/pin', { messages: msgs, tools: 5 }],
    ['/session/tool_start', { session_id: 3 }],
    ['/workers', { url: 5 }],
  ];
  for (const [p, body] of cases) {
    shape(await router.post(p, body, ADMIN), `${p} ${JSON.stringify(body)}`);
    if (p.startsWith('/v1/')) {
      // A worker answers the same.
      shape(await workers[0].post(p, body), `worker ${p} ${JSON.stringify(body)}`);
    }
  }
  // Decimal-string hashes are accepted like a worker's.
  const ok = await router.post('/cache/pin', { block_hashes: ['18446744073709551615', '-1', '5'] }, ADMIN);
  assert.equal(ok.status, 200, ok.text);
  // A header that is not UTF-8, and a query that is not: raw bytes no fetch would send.
  for (const raw of [
    Buffer.concat([Buffer.from(postRaw('/v1/chat/completions', JSON.stringify({ messages: msgs, max_tokens: 2 }), 'x-session-id: ')
      .split('Content-Length')[0]), Buffer.from([0xff, 0xfe, 0x0d, 0x0a]),
    Buffer.from('Content-Length' + postRaw('/v1/chat/completions', JSON.stringify({ messages: msgs, max_tokens: 2 })).split('Content-Length')[1])]),
    Buffer.concat([Buffer.from('GET /session/kv_meta?session_id='), Buffer.from([0xff, 0xfe]),
      Buffer.from(` HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\n\r\n`)]),
  ]) {
    const c = new RawConn(Number(new URL(router.base).port));
    await c.connected;
    c.write(raw);
    await waitFor(() => c.responses().responses.length > 0 || c.closed, 'an answer');
    const [resp] = c.responses().responses;
    assert.ok(resp, 'the router answered');
    assert.ok(resp.status < 500, `${resp.status} ${resp.body}`);
    c.sock.destroy();
  }
  assert.equal((await router.get('/health')).status, 200);
});

test('big refused bodies: the router keeps nothing of them, its memory returns near baseline', async () => {
  const rss = () => Number(readFileSync(`/proc/${router.proc.pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/)[1]) / 1024;
  const index = async () => (await router.get('/cache/state', ADMIN)).json.index;
  const big = (i) => (i % 2 ? 'y'.repeat(10_000_000) : words(2_000_000, i).slice(0, 10_000_000));
  // Warm-up: every route the sequence takes.
  for (let i = 0; i < 2; i++) {
    assert.equal((await router.post('/v1/chat/completions', { messages: [{ role: 'user', content: words(50) }], max_tokens: 2 })).status, 200);
    assert.equal((await router.post('/v1/completions', { prompt: words(30), max_tokens: 2 })).status, 200);
  }
  await sleep(2500);  // predictions of the warm-up expire
  const warm = rss();
  const before = await index();
  const n = SANITIZED ? 2 : 4;
  for (let i = 0; i < n; i++) {
    const r = i % 2
      ? await router.post('/v1/completions', { prompt: big(i), max_tokens: 2 })
      : await router.post('/v1/chat/completions', { messages: [{ role: 'user', content: big(i) }], max_tokens: 2 });
    assert.equal(r.status, 400, r.text.slice(0, 300));
    assert.match(r.json.error.message, /longer than 4096 tokens/);
  }
  await sleep(1000);
  const end = rss();
  const afterIdx = await index();
  console.log(`router RSS after warm-up ${warm.toFixed(0)} MiB, after ${n} x 10 MB refused bodies ${end.toFixed(0)} MiB; ` +
    `index ${before.memory_bytes} -> ${afterIdx.memory_bytes} bytes, predicted entries ${before.predicted_entries} -> ${afterIdx.predicted_entries}`);
  assert.equal(afterIdx.predicted_entries, before.predicted_entries, 'predictions of refused prompts');
  assert.ok(afterIdx.memory_bytes <= before.memory_bytes + (1 << 20), 'the index grew on refused prompts');
  if (!SANITIZED) {
    assert.ok(end <= warm * 1.10 + 30, `resident memory went from ${warm.toFixed(0)} MiB to ${end.toFixed(0)} MiB`);
  }
});
