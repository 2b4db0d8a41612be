// Black-box tests of OpenAI's Responses API through `strata route` in front of three real
// `strata serve` workers on loopback, with the official `openai` npm client
// (docs/openai-responses.md, docs/router.md): responses.create and streaming through the
// router, a previous_response_id chain that stays on its worker and hits the cache (every
// full page of each previous turn), prompt_cache_key stickiness, a function call whose
// reply parks its key's KV on the host (--auto-tool-offload) and whose tool output brings
// it back on the same worker, GET and DELETE through the router, unknown ids, bad input
// refused at the router, a router restarted mid-chain (and a second replica) that finds the
// worker holding each response it has no binding for, and a killed worker whose responses
// are answered as unknown once the holder's wait is over. The tiny model's replies are
// chosen with the test-only `forced_output` field.
// Run by CTest: node --test tests/router/responses.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { createRequire } from 'node:module';
import { startServer, startRouter, allJoined, waitFor, workerList, words, SOURCE_DIR } from '../server/server_harness.mjs';

const require = createRequire(path.join(SOURCE_DIR, 'tools/js/package.json'));
const OpenAIModule = require('openai');
const OpenAI = OpenAIModule.default ?? OpenAIModule.OpenAI ?? OpenAIModule;

const KEY = 'responses-router-key';
const ADMIN = { authorization: `Bearer ${KEY}` };
const TOOLS = [{
  type: 'function', name: 'get_weather', description: 'The weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
}];
const CALL = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';

const workers = [];
let router;
let client; // through the router, not the admin key: a client's rights

before(async () => {
  for (let i = 0; i < 3; i++) {
    workers.push(await startServer(['--kv-cache-tokens', '8192', '--admin-api-key', KEY, '--allow-forced-output',
      '--kv-events-endpoint', 'tcp://127.0.0.1:*', '--kv-events-replay-endpoint', 'tcp://127.0.0.1:*',
      '--enable-hierarchical-cache', '--hicache-ratio', '2', '--auto-tool-offload']));
  }
  router = await startNewRouter();
  client = new OpenAI({ baseURL: router.base + '/v1', apiKey: 'not-the-key', maxRetries: 0 });
});

// A router in front of the three workers, all joined. A killed worker's continuation waits
// --response-holder-wait-ms for it (1 s here, 5 s by default) before the unknown-id answer.
async function startNewRouter() {
  const r = await startRouter(['--admin-api-key', KEY, '--load-poll-ms', '50', '--response-holder-wait-ms', '1000',
    ...workers.flatMap((w) => ['--worker', w.base])]);
  await allJoined(r, 3);
  return r;
}

async function routerMetric(r, sample) {
  const m = (await r.get('/metrics')).text;
  const line = m.split('\n').find((l) => l.startsWith(sample + ' '));
  return line ? Number(line.split(' ')[1]) : 0;
}

after(async () => {
  if (router) await router.stop();
  for (const w of workers) await w.stop();
});

// A response created through the router, and the worker that answered it.
async function create(body) {
  const { data, response } = await client.responses.create({ model: 'tiny', ...body }).withResponse();
  return { r: data, worker: response.headers.get('x-strata-worker'), route: response.headers.get('x-strata-route') };
}

// Prompt tokens every worker has run (its own counter): unchanged means nothing ran.
async function promptTokensRun() {
  let n = 0;
  for (const w of workers) {
    if (w.proc.exitCode !== null || w.proc.signalCode !== null) continue;
    const m = (await w.get('/metrics')).text.match(/^strata_prompt_tokens_total (\d+)/m);
    n += m ? Number(m[1]) : 0;
  }
  return n;
}

test('responses.create through the router: the answer, its worker, and a repeat placed by cache', async () => {
  const instructions = 'You answer briefly. ' + words(300, 5);
  const first = await create({ instructions, input: 'first question', forced_output: 'Hello there.' });
  assert.match(first.r.id, /^resp_[0-9a-f]{32}$/);
  assert.equal(first.r.output_text, 'Hello there.');
  assert.ok(workers.some((w) => w.base === first.worker), first.worker);
  const id = (await workerList(router)).find((w) => w.url === first.worker).id;
  await waitFor(async () => (await workerList(router)).find((w) => w.id === id).index_blocks >= 16, 'the events');
  // The same instructions with another input: read by the router as the worker reads it,
  // so its prefix is found where it is cached.
  const again = await create({ instructions, input: 'second question', forced_output: 'Again.' });
  assert.equal(again.worker, first.worker);
  assert.equal(again.route, 'cache');
  assert.ok(again.r.usage.input_tokens_details.cached_tokens >= 256, JSON.stringify(again.r.usage));
  const m = (await router.get('/metrics')).text;
  assert.match(m, /^strata_router_reported_cached_tokens_total [1-9]\d*/m);
});

test('streaming through the router: the Responses events pass as they are, the response is bound', async () => {
  const stream = client.responses.stream({ model: 'tiny', input: 'Stream please.', forced_output: 'Streaming works fine here.' });
  let text = '';
  const types = [];
  stream.on('response.output_text.delta', (e) => { text += e.delta; });
  stream.on('event', (e) => types.push(e.type));
  const final = await stream.finalResponse();
  assert.equal(text, 'Streaming works fine here.');
  assert.equal(final.status, 'completed');
  assert.deepEqual(types.slice(0, 4),
    ['response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added']);
  assert.deepEqual(types.slice(-4),
    ['response.output_text.done', 'response.content_part.done', 'response.output_item.done', 'response.completed']);
  // The router bound the streamed response (from its response.created event).
  const got = await client.responses.retrieve(final.id);
  assert.equal(got.output_text, 'Streaming works fine here.');
  // The raw framing: named events, numbered from 0, as the worker wrote them.
  const raw = await fetch(router.base + '/v1/responses', {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'tiny', input: 'x', stream: true, forced_output: 'ok' }),
  });
  assert.ok(raw.headers.get('x-strata-worker'));
  const body = await raw.text();
  assert.match(body, /^event: response\.created\ndata: \{/);
  assert.match(body, /event: response\.completed\ndata: \{.*"sequence_number":\d+.*\}\n\n$/);
  const events = body.split('\n\n').filter((e) => e.length > 0);
  events.forEach((e, i) => {
    const [name, data] = e.split('\n');
    const j = JSON.parse(data.slice('data: '.length));
    assert.equal(name, 'event: ' + j.type);
    assert.equal(j.sequence_number, i);
  });
});

test('a previous_response_id chain stays on its worker and hits the cache every turn', async () => {
  const instructions = words(600, 61);
  let prev = null;
  let home = null;
  for (let turn = 0; turn < 8; turn++) {
    const { r, worker, route } = await create({
      instructions, input: words(25, 100 + turn), max_output_tokens: 20, temperature: 0,
      previous_response_id: prev ? prev.id : undefined,
    });
    if (prev) {
      assert.equal(worker, home, `turn ${turn} left its worker`);
      assert.equal(route, 'previous_response');
      // Every full page of the previous prompt and output (the last partial page and the
      // last sampled token are computed again).
      const before = prev.usage.input_tokens + prev.usage.output_tokens;
      assert.ok(r.usage.input_tokens_details.cached_tokens >= before - 16,
        `turn ${turn}: cached ${r.usage.input_tokens_details.cached_tokens} of ${before}`);
      assert.ok(r.usage.input_tokens > before, 'the prompt holds the whole chain');
    } else {
      home = worker;
    }
    prev = r;
  }
});

test('prompt_cache_key sticks to one worker; new keys spread', async () => {
  const homes = new Set();
  for (let i = 0; i < 6; i++) {
    const { worker } = await create({ input: words(40, 300 + i), prompt_cache_key: 'sticky-agent', forced_output: 'ok' });
    homes.add(worker);
  }
  assert.equal(homes.size, 1, [...homes].join(' '));
  const spread = new Set();
  for (let i = 0; i < 6; i++) {
    const { worker } = await create({ input: words(40, 400 + i), prompt_cache_key: `agent-${i}`, forced_output: 'ok' });
    spread.add(worker);
  }
  assert.ok(spread.size >= 2, 'new keys spread over the workers');
});

test('a function call parks its key on the host; the tool output comes back to the same worker', async () => {
  const key = 'tool-agent';
  const instructions = 'Tools agent. ' + words(150, 9);
  const first = await create({ instructions, input: 'Weather in Paris?', tools: TOOLS, forced_output: CALL,
    max_output_tokens: 200, prompt_cache_key: key });
  const call = first.r.output.find((i) => i.type === 'function_call');
  assert.ok(call, JSON.stringify(first.r.output));
  assert.deepEqual(JSON.parse(call.arguments), { city: 'Paris' });
  // The key is the session: the router relays kv_meta to the key's worker.
  const meta = await router.get('/session/kv_meta?session_id=' + key, ADMIN);
  assert.equal(meta.status, 200, meta.text);
  assert.equal(meta.headers.get('x-strata-worker'), first.worker);
  assert.ok(['OFFLOADING', 'OFFLOADED'].includes(meta.json.state), meta.text);
  const next = await create({ instructions, previous_response_id: first.r.id, tools: TOOLS, prompt_cache_key: key,
    forced_output: 'It is sunny in Paris.',
    input: [{ type: 'function_call_output', call_id: call.call_id, output: '21 C, sunny' }] });
  assert.equal(next.worker, first.worker);
  assert.equal(next.r.output_text, 'It is sunny in Paris.');
  assert.ok(next.r.usage.input_tokens_details.cached_tokens >= first.r.usage.input_tokens - 16,
    JSON.stringify([first.r.usage, next.r.usage]));
  const after = await router.get('/session/kv_meta?session_id=' + key, ADMIN);
  assert.notEqual(after.json.state, 'OFFLOADED');
});

test('GET and DELETE /v1/responses/{id} through the router; unknown ids', async () => {
  const { r, worker } = await create({ input: 'keep me', forced_output: 'kept' });
  const got = await client.responses.retrieve(r.id);
  assert.equal(got.output_text, 'kept');
  assert.deepEqual(got.usage, r.usage);
  const raw = await router.get('/v1/responses/' + r.id);
  assert.equal(raw.headers.get('x-strata-worker'), worker);
  const d = await router.del('/v1/responses/' + r.id);
  assert.equal(d.status, 200, d.text);
  assert.deepEqual(d.json, { id: r.id, object: 'response', deleted: true });
  await assert.rejects(client.responses.retrieve(r.id), (e) => e.status === 404 && e.error?.code === 'not_found');
  assert.equal((await router.del('/v1/responses/' + r.id)).status, 404);
  await assert.rejects(client.responses.create({ model: 'tiny', input: 'x', previous_response_id: r.id }),
    (e) => e.status === 400 && e.error?.code === 'previous_response_not_found');
  // Ids the router never saw: the workers' answers for an unknown id.
  const unknown = await router.get('/v1/responses/resp_nope');
  assert.equal(unknown.status, 404);
  assert.deepEqual(unknown.json, { error: { message: "No response found with id 'resp_nope'.",
    type: 'invalid_request_error', code: 'not_found' } });
  await assert.rejects(client.responses.create({ model: 'tiny', input: 'x', previous_response_id: 'resp_nope' }),
    (e) => e instanceof OpenAI.BadRequestError && e.error?.code === 'previous_response_not_found');
  // store: false: nothing to read back.
  const unstored = await create({ input: 'forget me', store: false, forced_output: 'gone' });
  await assert.rejects(client.responses.retrieve(unstored.r.id), (e) => e.status === 404);
});

test('bad input: the Responses error shape at the router, nothing run or bound', async () => {
  const ran = await promptTokensRun();
  const cases = [
    [{ model: 'tiny' }, /input/],
    [{ model: 'tiny', input: 5 }, /input/],
    [{ model: 'tiny', input: [{ type: 'item_reference', id: 'x' }] }, /Item with id 'x' not found/],
    [{ model: 'tiny', input: 'x', tools: [{ type: 'web_search' }], tool_choice: { type: 'web_search' } },
      /tool_choice names the tool type 'web_search', which Strata does not run/],
    [{ model: 'tiny', input: 'x', prompt_cache_retention: '1w' }, /prompt_cache_retention/],
    [{ model: 'tiny', input: 'x', prompt_cache_key: '' }, /prompt_cache_key/],
    [{ model: 'tiny', input: 'x', stream: 'yes' }, /stream/],
  ];
  for (const [body, re] of cases) {
    const r = await router.post('/v1/responses', body);
    assert.equal(r.status, 400, JSON.stringify(body) + ' ' + r.text);
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.match(r.json.error.message, re);
    assert.equal(r.headers.get('x-strata-worker'), null);
  }
  assert.equal((await router.post('/v1/responses', '{"input": ')).status, 400);
  assert.equal(await promptTokensRun(), ran, 'nothing ran');
  await assert.rejects(client.responses.create({ model: 'tiny', input: [{ type: 'item_reference', id: 'x' }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.error?.type === 'invalid_request_error');
});

test('a restarted router, and a second replica, find the worker of each response they never bound', async () => {
  // A chain of three turns through the router.
  const instructions = 'Chain agent. ' + words(200, 31);
  const ids = [];
  let home = null;
  let previous;
  for (let turn = 0; turn < 3; turn++) {
    const { r, worker } = await create({ instructions, input: `turn ${turn}: ` + words(20, 700 + turn),
      forced_output: `Answer ${turn}.`, ...(previous ? { previous_response_id: previous } : {}) });
    if (home) assert.equal(worker, home);
    home = worker;
    ids.push(r.id);
    previous = r.id;
  }
  // The router restarts: it has no bindings now.
  await router.stop();
  router = await startNewRouter();
  client = new OpenAI({ baseURL: router.base + '/v1', apiKey: 'not-the-key', maxRetries: 0 });
  assert.equal(await routerMetric(router, 'strata_router_response_lookups_total{result="found"}'), 0);
  const { r: next, worker, route } = await create({ instructions, previous_response_id: previous,
    input: 'turn 3: ' + words(20, 703), forced_output: 'Answer 3.' });
  assert.equal(worker, home);
  assert.equal(route, 'previous_response');
  assert.equal(next.output_text, 'Answer 3.');
  // The chain's exact tokens are continued on its worker: the previous prompt and output hit.
  assert.ok(next.usage.input_tokens_details.cached_tokens >= 200, JSON.stringify(next.usage));
  assert.equal(await routerMetric(router, 'strata_router_response_lookups_total{result="found"}'), 1);
  // An older response of the chain, read back through the new router.
  const old = await router.get('/v1/responses/' + ids[0]);
  assert.equal(old.status, 200, old.text);
  assert.equal(old.headers.get('x-strata-worker'), home);
  assert.equal(old.json.output[0].content[0].text, 'Answer 0.');
  // A second replica beside it: each continues what the other answered.
  const replica = await startNewRouter();
  try {
    const other = new OpenAI({ baseURL: replica.base + '/v1', apiKey: 'not-the-key', maxRetries: 0 });
    const { data: onReplica, response } = await other.responses.create({ model: 'tiny', instructions,
      previous_response_id: next.id, input: 'turn 4', forced_output: 'Answer 4.' }).withResponse();
    assert.equal(response.headers.get('x-strata-worker'), home);
    const back = await create({ instructions, previous_response_id: onReplica.id, input: 'turn 5',
      forced_output: 'Answer 5.' });
    assert.equal(back.worker, home);
    assert.equal(back.r.output_text, 'Answer 5.');
    assert.equal(await routerMetric(replica, 'strata_router_response_lookups_total{result="found"}'), 1);
    // The continuation after the restart, the GET of the chain's first response, and this one.
    assert.equal(await routerMetric(router, 'strata_router_response_lookups_total{result="found"}'), 3);
  } finally {
    await replica.stop();
  }
  // An id no worker has is still the unknown-id answer, after asking them.
  await assert.rejects(client.responses.create({ model: 'tiny', input: 'x', previous_response_id: 'resp_' + '0'.repeat(32) }),
    (e) => e.status === 400 && e.error?.code === 'previous_response_not_found');
  assert.equal(await routerMetric(router, 'strata_router_response_lookups_total{result="not_found"}'), 1);
});

test('a killed worker: its responses are unknown once the holder wait is over, the others go on', async () => {
  // One response on each worker (new keys spread).
  const byWorker = new Map();
  for (let i = 0; i < 12 && byWorker.size < 3; i++) {
    const { r, worker } = await create({ input: words(30, 500 + i), prompt_cache_key: `kill-${i}`, forced_output: 'ok' });
    byWorker.set(worker, r.id);
  }
  assert.equal(byWorker.size, 3);
  const victim = workers[2];
  const lost = byWorker.get(victim.base);
  process.kill(victim.pid, 'SIGKILL');
  await new Promise((r) => victim.proc.on('exit', r));
  await assert.rejects(client.responses.retrieve(lost), (e) => e.status === 404 && e.error?.code === 'not_found');
  await assert.rejects(client.responses.create({ model: 'tiny', input: 'x', previous_response_id: lost }),
    (e) => e.status === 400 && e.error?.code === 'previous_response_not_found');
  for (const w of workers.slice(0, 2)) {
    const { worker, r } = await create({ input: 'go on', previous_response_id: byWorker.get(w.base), forced_output: 'ok' });
    assert.equal(worker, w.base);
    assert.equal(r.output_text, 'ok');
  }
  // Once the router saw the worker go, the answer does not even try it.
  await waitFor(async () => !(await workerList(router)).find((w) => w.url === victim.base).eligible, 'the victim to be ineligible');
  await assert.rejects(client.responses.retrieve(lost), (e) => e.status === 404);
});
