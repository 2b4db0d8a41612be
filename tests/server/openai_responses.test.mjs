// Black-box tests of OpenAI's Responses API (docs/openai-responses.md) against a real
// `strata serve` with the official `openai` npm client: responses.create, streaming (the
// SDK's stream helper and the raw event framing), a function call round trip with
// function_call_output (and item_reference to stored items), a 16-turn chain through
// previous_response_id that hits the cache completely, GET and DELETE of stored responses, prompt_cache_retention as a soft pin
// (grouped by prompt_cache_key), and bad input refused in OpenAI's error shape without
// changing anything. The tiny model's replies are chosen with the test-only `forced_output`
// field (--allow-forced-output).
// Run by CTest: node --test tests/server/openai_responses.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { createRequire } from 'node:module';
import { startServer, words, SOURCE_DIR } from './server_harness.mjs';

const require = createRequire(path.join(SOURCE_DIR, 'tools/js/package.json'));
const OpenAIModule = require('openai');
const OpenAI = OpenAIModule.default ?? OpenAIModule.OpenAI ?? OpenAIModule;

const KEY = 'k';
const ADMIN = { authorization: `Bearer ${KEY}` };
const TOOLS = [
  {
    type: 'function', name: 'get_weather', description: 'The weather in a city', strict: true,
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
];
const CALL = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';

let server;
let client; // not the admin key: a client's rights

before(async () => {
  server = await startServer(['--kv-cache-tokens', '16384', '--allow-forced-output', '--admin-api-key', KEY]);
  client = new OpenAI({ baseURL: server.base + '/v1', apiKey: 'not-the-key', maxRetries: 0 });
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

test('responses.create: a string input, instructions, the response shape and usage', async () => {
  const r = await client.responses.create({
    model: 'tiny', instructions: 'Be brief.', input: 'Say hello.', max_output_tokens: 64,
    temperature: 0.5, top_p: 0.9, forced_output: 'Hello there.', metadata: { k: 'v' },
  });
  assert.match(r.id, /^resp_/);
  assert.equal(r.object, 'response');
  assert.equal(r.status, 'completed');
  assert.equal(r.instructions, 'Be brief.');
  assert.equal(r.output_text, 'Hello there.');
  assert.equal(r.output.length, 1);
  const msg = r.output[0];
  assert.equal(msg.type, 'message');
  assert.equal(msg.role, 'assistant');
  assert.equal(msg.status, 'completed');
  assert.deepEqual(msg.content, [{ type: 'output_text', text: 'Hello there.', annotations: [] }]);
  assert.ok(r.usage.input_tokens > 0);
  assert.ok(r.usage.output_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.equal(typeof r.usage.input_tokens_details.cached_tokens, 'number');
  assert.ok('device' in r.usage.cached_tokens_details, "Strata's per-tier breakdown");
  assert.equal(r.store, true);
  assert.deepEqual(r.metadata, { k: 'v' });
  // Items in, as the chat path reads them: the same prompt as the string form.
  const items = await client.responses.create({
    model: 'tiny', input: [{ role: 'developer', content: 'Be brief.' },
      { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Say hello.' }] }],
    forced_output: 'Hello there.',
  });
  assert.equal(items.usage.input_tokens, r.usage.input_tokens);
  // max_output_tokens cuts the reply: incomplete.
  const cut = await client.responses.create({
    model: 'tiny', input: 'x', max_output_tokens: 2, forced_output: 'one two three four five six',
  });
  assert.equal(cut.status, 'incomplete');
  assert.deepEqual(cut.incomplete_details, { reason: 'max_output_tokens' });
  assert.equal(cut.usage.output_tokens, 2);
});

test('streaming: the SDK stream helper, and the raw event framing', async () => {
  const stream = client.responses.stream({
    model: 'tiny', input: 'Stream please.', forced_output: 'Streaming works fine here.',
  });
  let text = '';
  const types = [];
  stream.on('response.output_text.delta', (e) => { text += e.delta; });
  stream.on('event', (e) => types.push(e.type));
  const final = await stream.finalResponse();
  assert.equal(text, 'Streaming works fine here.');
  assert.equal(final.output[0].content[0].text, text);
  assert.equal(final.status, 'completed');
  assert.ok(final.usage.output_tokens > 0);
  assert.deepEqual(types.slice(0, 4),
    ['response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added']);
  assert.deepEqual(types.slice(-4),
    ['response.output_text.done', 'response.content_part.done', 'response.output_item.done', 'response.completed']);
  // create({stream: true}): numbered events.
  const events = [];
  for await (const e of await client.responses.create({ model: 'tiny', input: 'x', stream: true, forced_output: 'ok then' })) {
    events.push(e);
  }
  assert.deepEqual(events.map((e) => e.sequence_number), events.map((_, i) => i));
  assert.equal(events.at(-1).type, 'response.completed');
  // The stored response is the streamed one.
  const got = await client.responses.retrieve(events.at(-1).response.id);
  assert.equal(got.output_text, 'ok then');
  const r = await fetch(server.base + '/v1/responses', {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'tiny', input: 'x', stream: true, forced_output: 'ok' }),
  });
  const raw = await r.text();
  assert.match(raw, /^event: response\.created\ndata: \{/);
  assert.match(raw, /event: response\.completed\ndata: \{.*"sequence_number":\d+.*\}\n\n$/);
});

test('function calls: out (whole and streamed), function_call_output back in', async () => {
  const r = await client.responses.create({
    model: 'tiny', input: 'Weather in Paris?', tools: TOOLS, forced_output: CALL, max_output_tokens: 200,
  });
  const call = r.output.find((i) => i.type === 'function_call');
  assert.ok(call, JSON.stringify(r.output));
  assert.equal(call.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.arguments), { city: 'Paris' });
  assert.ok(call.call_id.length > 0);
  assert.equal(r.output[0].type, 'message');
  assert.match(r.output[0].content[0].text, /^Checking\./);

  const stream = client.responses.stream({
    model: 'tiny', input: 'Weather in Paris?', tools: TOOLS, forced_output: CALL, max_output_tokens: 200,
  });
  let args = '';
  stream.on('response.function_call_arguments.delta', (e) => { args += e.delta; });
  let done = null;
  stream.on('response.function_call_arguments.done', (e) => { done = e.arguments; });
  const final = await stream.finalResponse();
  const streamed = final.output.find((i) => i.type === 'function_call');
  assert.deepEqual(JSON.parse(streamed.arguments), { city: 'Paris' });
  assert.deepEqual(JSON.parse(args), { city: 'Paris' });
  assert.equal(done, streamed.arguments);

  // The round trip on previous_response_id: only the output goes back.
  const next = await client.responses.create({
    model: 'tiny', previous_response_id: r.id, tools: TOOLS, forced_output: 'It is sunny in Paris.',
    input: [{ type: 'function_call_output', call_id: call.call_id, output: '21 C, sunny' }],
  });
  assert.equal(next.output_text, 'It is sunny in Paris.');
  assert.equal(next.previous_response_id, r.id);
  assert.ok(next.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens - 16,
    JSON.stringify([r.usage, next.usage]));
  // The same round trip stateless: the whole transcript as items.
  const stateless = await client.responses.create({
    model: 'tiny', tools: TOOLS, forced_output: 'It is sunny in Paris.', store: false,
    input: [{ role: 'user', content: 'Weather in Paris?' }, ...r.output,
      { type: 'function_call_output', call_id: call.call_id, output: '21 C, sunny' }],
  });
  assert.equal(stateless.output_text, 'It is sunny in Paris.');
  await assert.rejects(client.responses.retrieve(stateless.id), (e) => e.status === 404);
  // item_reference: the stored output items named instead of repeated (the Vercel AI SDK's
  // way while `store` is on) read as the items themselves.
  const referenced = await client.responses.create({
    model: 'tiny', tools: TOOLS, forced_output: 'It is sunny in Paris.', store: false,
    input: [{ role: 'user', content: 'Weather in Paris?' }, ...r.output.map((i) => ({ type: 'item_reference', id: i.id })),
      { type: 'function_call_output', call_id: call.call_id, output: '21 C, sunny' }],
  });
  assert.equal(referenced.output_text, 'It is sunny in Paris.');
  assert.equal(referenced.usage.input_tokens, stateless.usage.input_tokens);
  await assert.rejects(client.responses.create({ model: 'tiny', input: [{ type: 'item_reference', id: r.output[0].id + '9' }] }),
    (e) => e.status === 400 && /not found/.test(e.message));
  // tool_choice: a named function the reply does not call is refused.
  await assert.rejects(client.responses.create({
    model: 'tiny', input: 'x', tools: TOOLS, tool_choice: { type: 'function', name: 'get_weather' },
    forced_output: 'no call',
  }), (e) => e.status === 422);
  // tool_choice none: the reply is text, even with markup.
  const none = await client.responses.create({
    model: 'tiny', input: 'x', tools: TOOLS, tool_choice: 'none', forced_output: CALL, max_output_tokens: 200,
  });
  assert.equal(none.output.length, 1);
  assert.equal(none.output[0].type, 'message');
});

test('a chain of 16 turns on previous_response_id keeps every previous prompt and output cached', async () => {
  const instructions = words(1800, 61);
  let prev = null;
  for (let turn = 0; turn < 16; turn++) {
    const r = await client.responses.create({
      model: 'tiny', instructions, input: words(25, 100 + turn), max_output_tokens: 20, temperature: 0,
      previous_response_id: prev ? prev.id : undefined,
    });
    assert.equal(r.status === 'completed' || r.status === 'incomplete', true);
    const u = r.usage;
    if (prev) {
      const before = prev.usage.input_tokens + prev.usage.output_tokens;
      const covered = u.input_tokens_details.cached_tokens / before;
      assert.ok(covered >= 0.99, `turn ${turn}: cached ${u.input_tokens_details.cached_tokens} of ` +
        `${before} (${(100 * covered).toFixed(1)}%)`);
      assert.ok(u.input_tokens > before, 'the prompt holds the whole chain');
    }
    prev = r;
  }
});

test('previous_response_id continues the exact tokens: a reasoning block and a streamed turn stay cached', async () => {
  // Qwen3's template drops an earlier turn's <think> block when it renders the conversation
  // afresh; the continuation keeps the tokens the model produced, so they stay cached.
  const think = `<think>\n${words(200, 81)}\n</think>\n\nThe answer.`;
  const first = await client.responses.create({
    model: 'tiny', instructions: 'Be brief.', input: 'A question?', forced_output: think,
  });
  const covered = (prev, next) => {
    const before = prev.usage.input_tokens + prev.usage.output_tokens;
    assert.ok(next.usage.input_tokens_details.cached_tokens >= before - 16,
      `cached ${next.usage.input_tokens_details.cached_tokens} of ${before}`);
  };
  const stream = client.responses.stream({
    model: 'tiny', instructions: 'Be brief.', input: 'And another?', previous_response_id: first.id,
    forced_output: 'Streamed reply.',
  });
  const second = await stream.finalResponse();
  covered(first, second);
  // The same conversation sent whole is rendered afresh: the <think> block is gone from it,
  // and so is the cache hit past the assistant turn's start.
  const whole = await client.responses.create({
    model: 'tiny', instructions: 'Be brief.', store: false, forced_output: 'Streamed reply.',
    input: [{ role: 'user', content: 'A question?' }, ...first.output, { role: 'user', content: 'And another?' }],
  });
  assert.ok(whole.usage.input_tokens_details.cached_tokens < first.usage.input_tokens + 32,
    `a fresh render hits ${whole.usage.input_tokens_details.cached_tokens}`);
  assert.ok(whole.usage.input_tokens < second.usage.input_tokens - 150, 'the continuation kept the block');
  const third = await client.responses.create({
    model: 'tiny', instructions: 'Be brief.', input: 'Last one.', previous_response_id: second.id, forced_output: 'ok',
  });
  covered(second, third);
  // Other instructions: the conversation is rendered afresh (not carried over), and answers.
  const other = await client.responses.create({
    model: 'tiny', instructions: 'Be verbose.', input: 'Last one.', previous_response_id: second.id, forced_output: 'ok',
  });
  assert.equal(other.output_text, 'ok');
  assert.ok(other.usage.input_tokens_details.cached_tokens < second.usage.input_tokens);
});

test('GET and DELETE /v1/responses/{id}', async () => {
  const r = await client.responses.create({ model: 'tiny', input: 'keep me', forced_output: 'kept' });
  const got = await client.responses.retrieve(r.id);
  assert.equal(got.id, r.id);
  assert.equal(got.output_text, 'kept');
  assert.deepEqual(got.usage, r.usage);
  const d = await fetch(`${server.base}/v1/responses/${r.id}`, { method: 'DELETE' });
  assert.equal(d.status, 200);
  assert.deepEqual(await d.json(), { id: r.id, object: 'response', deleted: true });
  await assert.rejects(client.responses.retrieve(r.id), (e) => e.status === 404 && e.error?.code === 'not_found');
  const again = await fetch(`${server.base}/v1/responses/${r.id}`, { method: 'DELETE' });
  assert.equal(again.status, 404);
  // A deleted response cannot be continued.
  await assert.rejects(client.responses.create({ model: 'tiny', input: 'x', previous_response_id: r.id }),
    (e) => e.status === 400 && e.error?.code === 'previous_response_not_found');
});

test('prompt_cache_retention: a soft pin of the turn; prompt_cache_key groups a chain', async () => {
  const before = await pins();
  const first = await client.responses.create({
    model: 'tiny', instructions: words(400, 71), input: 'first', forced_output: 'ok',
    prompt_cache_retention: 'in_memory', prompt_cache_key: 'agent-1',
  });
  assert.equal(first.prompt_cache_key, 'agent-1');
  const p1 = await pins();
  assert.ok(p1.pinned > before.pinned + 20, JSON.stringify([before, p1]));
  assert.equal(p1.soft - before.soft, p1.pinned - before.pinned, "a client's pins are soft");
  // The next turn of the group pins only what its group has not pinned yet.
  const second = await client.responses.create({
    model: 'tiny', instructions: words(400, 71), input: 'second', forced_output: 'ok',
    previous_response_id: first.id, prompt_cache_retention: 'in_memory', prompt_cache_key: 'agent-1',
  });
  assert.ok(second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens + first.usage.output_tokens - 16,
    JSON.stringify([first.usage, second.usage]));
  const p2 = await pins();
  const detail = await server.get('/cache/state?detail=tree', ADMIN);
  const maxPinRef = Math.max(...detail.json.nodes.map((n) => Math.max(0, ...(n.pin_counts ?? [0]))));
  assert.ok(maxPinRef <= 1, 'each block of the group is pinned once');
  assert.ok(p2.pinned >= p1.pinned);
  // Without retention nothing is pinned.
  await client.responses.create({ model: 'tiny', input: words(300, 72), forced_output: 'ok' });
  assert.equal((await pins()).pinned, p2.pinned);
});

test('bad input: OpenAI error shape, 4xx, nothing stored, pinned or run', async () => {
  const cases = [
    [{ model: 'tiny' }, /input/],
    [{ model: 'tiny', input: 5 }, /input/],
    [{ model: 'tiny', input: [{ type: 'item_reference', id: 'x' }] }, /Item with id 'x' not found/],
    [{ model: 'tiny', input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'http://x' }] }] }, /input_image/],
    [{ model: 'tiny', input: 'x', tools: [{ type: 'web_search' }], tool_choice: { type: 'web_search' } },
      /tool_choice names the tool type 'web_search', which Strata does not run/],
    [{ model: 'tiny', input: 'x', max_output_tokens: 'many' }, /max_output_tokens/],
    [{ model: 'tiny', input: 'x', prompt_cache_retention: '1w' }, /prompt_cache_retention/],
    [{ model: 'tiny', input: 'x', text: { format: { type: 'json_schema' } } }, /json_schema/],
    [{ model: 'tiny', input: [{ type: 'function_call', call_id: 'c', name: 'f', arguments: '{' }] }, /arguments/],
  ];
  const before = await pins();
  const prompts = await metric('strata_prompt_tokens_total');
  for (const [body, re] of cases) {
    const r = await server.post('/v1/responses', body);
    assert.equal(r.status, 400, JSON.stringify(body) + ' ' + r.text);
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.match(r.json.error.message, re);
  }
  const unknown = await server.post('/v1/responses', { model: 'tiny', input: 'x', previous_response_id: 'resp_nope' });
  assert.equal(unknown.status, 400);
  assert.equal(unknown.json.error.code, 'previous_response_not_found');
  assert.equal((await server.post('/v1/responses', '{"input": ')).status, 400);
  assert.deepEqual(await pins(), before, 'nothing pinned');
  assert.equal(await metric('strata_prompt_tokens_total'), prompts, 'nothing ran');
  assert.equal((await server.get('/v1/responses/resp_nope')).status, 404);
  // The SDK reads the shape into its error classes.
  await assert.rejects(client.responses.create({ model: 'tiny', input: [{ type: 'item_reference', id: 'x' }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.error?.type === 'invalid_request_error');
});

test('stored responses are bounded: --max-stored-responses drops the least recently used', async () => {
  const small = await startServer(['--kv-cache-tokens', '4096', '--allow-forced-output', '--max-stored-responses', '2']);
  try {
    const c = new OpenAI({ baseURL: small.base + '/v1', apiKey: 'x', maxRetries: 0 });
    const ids = [];
    for (let i = 0; i < 3; i++) {
      ids.push((await c.responses.create({ model: 'tiny', input: `turn ${i}`, forced_output: `r${i}` })).id);
    }
    await assert.rejects(c.responses.retrieve(ids[0]), (e) => e.status === 404);
    assert.equal((await c.responses.retrieve(ids[1])).output_text, 'r1');
    assert.equal((await c.responses.retrieve(ids[2])).output_text, 'r2');
    // The dropped one cannot be continued; a kept one can.
    await assert.rejects(c.responses.create({ model: 'tiny', input: 'x', previous_response_id: ids[0] }),
      (e) => e.status === 400);
    const next = await c.responses.create({ model: 'tiny', input: 'x', previous_response_id: ids[2], forced_output: 'ok' });
    assert.equal(next.output_text, 'ok');
    const m = (await small.get('/metrics')).text;
    assert.match(m, /^strata_stored_responses 2$/m);
    assert.match(m, /^strata_stored_responses_dropped_total 2$/m);
    assert.match(m, /endpoint="\/v1\/responses\/\*",status="404"/);
    assert.doesNotMatch(m, /endpoint="\/v1\/responses\/resp_/, 'one label for every id');
  } finally {
    await small.stop();
  }
});
