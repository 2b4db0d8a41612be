// Black-box tests of OpenAI function calling (docs/function-calling.md) against a real
// `strata serve` with the official `openai` npm client. The tiny model's replies are
// chosen with the test-only `forced_output` field (--allow-forced-output), so that the
// whole flow runs end to end: tools in, tool_calls out (whole and streamed), tool results
// back, the prompt rendered as @huggingface/jinja renders it, and the offload of a
// session waiting for a tool, for every parser.
// Run by CTest: node --test tests/server/function_calling.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { startServer, tinyQwen3Model, words, SOURCE_DIR } from './server_harness.mjs';

const require = createRequire(path.join(SOURCE_DIR, 'tools/js/package.json'));
const OpenAI = require('openai').default ?? require('openai');
const { Template } = require('@huggingface/jinja');

const ADMIN = { authorization: 'Bearer k' };
const TOOLS = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'The weather in a city',
      parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['c', 'f'] } }, required: ['city'] },
    },
  },
  { type: 'function', function: { name: 'search', parameters: { type: 'object', properties: { q: { type: 'string' } } } } },
];
const USER = [{ role: 'user', content: 'Weather in Paris and Tokyo? Also search for umbrellas.' }];
const TWO_CALLS =
  'I will check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>\n' +
  '<tool_call>\n{"name": "search", "arguments": {"q": "東京 ☂ \\"umbrella\\"", "nested": {"a": [1, {"b": null}]}}}\n</tool_call>';

let server;
let client;

before(async () => {
  server = await startServer(['--kv-cache-tokens', '4096', '--allow-forced-output', '--admin-api-key', 'k']);
  client = new OpenAI({ baseURL: server.base + '/v1', apiKey: 'unused' });
});

after(async () => {
  if (server) await server.stop();
});

async function tokenCount(body) {
  const r = await server.post('/tokenize', body);
  assert.equal(r.status, 200, r.text);
  return r.json.tokens.length;
}

async function malformedCount(s = server) {
  const m = (await s.get('/metrics')).text.match(/strata_tool_call_replies_total\{outcome="malformed"\} (\d+)/);
  return m ? Number(m[1]) : 0;
}

test('non-streaming: tool_calls, finish_reason "tool_calls", content without markup, usage', async () => {
  const r = await client.chat.completions.create({
    model: 'tiny', messages: USER, tools: TOOLS, forced_output: TWO_CALLS, max_tokens: 200,
  });
  const choice = r.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.equal(choice.message.content, 'I will check.\n');
  const calls = choice.message.tool_calls;
  assert.equal(calls.length, 2);
  for (const c of calls) {
    assert.equal(c.type, 'function');
    assert.match(c.id, /^call_[A-Za-z0-9]{24}$/);
  }
  assert.notEqual(calls[0].id, calls[1].id);
  assert.equal(calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(calls[0].function.arguments), { city: 'Paris', unit: 'c' });
  assert.equal(calls[1].function.name, 'search');
  assert.deepEqual(JSON.parse(calls[1].function.arguments), { q: '東京 ☂ "umbrella"', nested: { a: [1, { b: null }] } });
  // Usage: the forced reply counts as generated, the prompt as rendered with the tools.
  assert.equal(r.usage.completion_tokens, await tokenCount({ prompt: TWO_CALLS }));
  assert.equal(r.usage.prompt_tokens, await tokenCount({ messages: USER, tools: TOOLS }));
});

test('streaming: the name once, the arguments as they arrive, never markup as content', async () => {
  const stream = await client.chat.completions.create({
    model: 'tiny', messages: USER, tools: TOOLS, forced_output: TWO_CALLS, max_tokens: 200, stream: true,
    stream_options: { include_usage: true },
  });
  let content = '';
  const calls = [];
  let finish = null;
  let argChunks = 0;
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    const choice = chunk.choices[0];
    if (!choice) continue;
    if (choice.finish_reason) finish = choice.finish_reason;
    const d = choice.delta;
    if (d.content) {
      content += d.content;
      assert.doesNotMatch(d.content, /<|tool_call|"name"/);
    }
    for (const tc of d.tool_calls ?? []) {
      if (!calls[tc.index]) {
        assert.ok(tc.id && tc.function.name, 'the first piece of a call names it');
        assert.equal(tc.type, 'function');
        calls[tc.index] = { id: tc.id, name: tc.function.name, arguments: '' };
      } else {
        assert.equal(tc.function.name, undefined, 'the name comes once');
        assert.equal(tc.id, undefined);
      }
      calls[tc.index].arguments += tc.function.arguments ?? '';
      argChunks++;
    }
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(content, 'I will check.\n');
  assert.equal(calls.length, 2);
  assert.equal(calls[0].name, 'get_weather');
  assert.deepEqual(JSON.parse(calls[0].arguments), { city: 'Paris', unit: 'c' });
  assert.equal(calls[1].name, 'search');
  assert.deepEqual(JSON.parse(calls[1].arguments), { q: '東京 ☂ "umbrella"', nested: { a: [1, { b: null }] } });
  assert.ok(argChunks > 6, `arguments streamed in pieces (${argChunks})`);
  assert.equal(usage.completion_tokens, await tokenCount({ prompt: TWO_CALLS }));
});

test('the openai client\'s stream helper assembles the same message', async () => {
  const runner = client.chat.completions.stream({
    model: 'tiny', messages: USER, tools: TOOLS, forced_output: TWO_CALLS, max_tokens: 200,
  });
  const final = await runner.finalChatCompletion();
  const msg = final.choices[0].message;
  assert.equal(final.choices[0].finish_reason, 'tool_calls');
  assert.deepEqual(msg.tool_calls.map((c) => c.function.name), ['get_weather', 'search']);
  assert.deepEqual(JSON.parse(msg.tool_calls[0].function.arguments), { city: 'Paris', unit: 'c' });
});

test('the tool results go back: the prompt is the reference rendering of the conversation', async () => {
  const first = await client.chat.completions.create({
    model: 'tiny', messages: USER, tools: TOOLS, forced_output: TWO_CALLS, max_tokens: 200,
  });
  const assistant = first.choices[0].message;
  const messages = [
    ...USER,
    { role: 'assistant', content: assistant.content, tool_calls: assistant.tool_calls },
    { role: 'tool', tool_call_id: assistant.tool_calls[0].id, content: '{"temp": 21}' },
    { role: 'tool', tool_call_id: assistant.tool_calls[1].id, content: 'umbrella shop, 5 min' },
  ];
  const second = await client.chat.completions.create({
    model: 'tiny', messages, tools: TOOLS, forced_output: 'It is 21 °C in Paris.', max_tokens: 50,
  });
  assert.equal(second.choices[0].finish_reason, 'stop');
  assert.equal(second.choices[0].message.content, 'It is 21 °C in Paris.');
  assert.equal(second.choices[0].message.tool_calls, undefined);
  // The reference: @huggingface/jinja renders the model's template with the arguments as
  // objects (as vLLM passes them) and a null content as "".
  const config = JSON.parse(readFileSync(path.join(tinyQwen3Model(), 'tokenizer_config.json'), 'utf8'));
  const asObjects = messages.map((m) => (m.tool_calls
    ? { ...m, content: m.content ?? '', tool_calls: m.tool_calls.map((c) => ({ ...c, function: { ...c.function, arguments: JSON.parse(c.function.arguments) } })) }
    : m));
  const reference = new Template(config.chat_template).render({
    messages: asObjects, tools: TOOLS, add_generation_prompt: true, eos_token: config.eos_token,
  });
  const ours = await server.post('/tokenize', { messages, tools: TOOLS });
  assert.equal(ours.status, 200, ours.text);
  const text = await server.post('/detokenize', { tokens: ours.json.tokens });
  assert.equal(text.json.prompt, reference);
  assert.match(reference, /<tool_call>\n\{"name": "search", "arguments": \{"q": "東京 ☂ \\"umbrella\\"", "nested"/);
  assert.match(reference, /<tool_response>\n\{"temp": 21\}\n<\/tool_response>/);
  assert.equal(second.usage.prompt_tokens, ours.json.tokens.length);
});

test('malformed tool-call text comes back as content, counted, never a 500', async () => {
  const cases = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>',
    '<tool_call>\n{"name": "launch_missiles", "arguments": {}}\n</tool_call>',
    'Sure <tool_call>{"name": "get_weather"',
    '<tool_call>not json at all</tool_call>',
  ];
  for (const stream of [false, true]) {
    for (const text of cases) {
      const before = await malformedCount();
      const body = { model: 'tiny', messages: USER, tools: TOOLS, forced_output: text, max_tokens: 100, stream };
      let content = '';
      let finish;
      let toolCalls = 0;
      if (stream) {
        for await (const chunk of await client.chat.completions.create(body)) {
          const c = chunk.choices[0];
          if (!c) continue;
          content += c.delta.content ?? '';
          toolCalls += (c.delta.tool_calls ?? []).length;
          finish = c.finish_reason ?? finish;
        }
      } else {
        const r = await client.chat.completions.create(body);
        content = r.choices[0].message.content;
        finish = r.choices[0].finish_reason;
        assert.equal(r.choices[0].message.tool_calls, undefined);
      }
      // A stream shows a call once its name is known and allowed; when its JSON then
      // breaks, what was sent stands (docs/function-calling.md). Otherwise it is content.
      if (toolCalls === 0) {
        assert.equal(content, text, `stream=${stream}`);
        assert.equal(finish, 'stop');
      } else {
        assert.ok(stream);
        assert.equal(finish, 'tool_calls');
      }
      assert.equal(await malformedCount(), before + 1, text);
    }
  }
});

test('a reply cut by max_tokens inside a call: finish_reason "length", text as content', async () => {
  const r = await client.chat.completions.create({
    model: 'tiny', messages: USER, tools: TOOLS, forced_output: TWO_CALLS, max_tokens: 12,
  });
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.choices[0].message.tool_calls, undefined);
  assert.equal(r.usage.completion_tokens, 12);
  assert.ok(TWO_CALLS.startsWith(r.choices[0].message.content));
});

test('tool_choice: none, required, a named function', async () => {
  // none: the tools are not rendered and the reply is not parsed.
  const none = await client.chat.completions.create({
    model: 'tiny', messages: USER, tools: TOOLS, tool_choice: 'none', forced_output: TWO_CALLS, max_tokens: 200,
  });
  assert.equal(none.choices[0].message.content, TWO_CALLS);
  assert.equal(none.choices[0].finish_reason, 'stop');
  assert.equal(none.usage.prompt_tokens, await tokenCount({ messages: USER }));
  // required / named: a complying reply passes.
  const req = await client.chat.completions.create({
    model: 'tiny', messages: USER, tools: TOOLS, tool_choice: 'required', forced_output: TWO_CALLS, max_tokens: 200,
  });
  assert.equal(req.choices[0].message.tool_calls.length, 2);
  const one = '<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>';
  const named = await client.chat.completions.create({
    model: 'tiny', messages: USER, tools: TOOLS, forced_output: one, max_tokens: 200,
    tool_choice: { type: 'function', function: { name: 'search' } },
  });
  assert.equal(named.choices[0].message.tool_calls[0].function.name, 'search');
  // ... a reply that does not comply is refused with a clear error.
  const refusals = [
    [{ tool_choice: 'required', forced_output: 'No tools needed.' }, /calls no tool/],
    [{ tool_choice: { type: 'function', function: { name: 'search' } }, forced_output: TWO_CALLS }, /names 'search'/],
  ];
  for (const [extra, message] of refusals) {
    const r = await server.post('/v1/chat/completions', { messages: USER, tools: TOOLS, max_tokens: 200, ...extra });
    assert.equal(r.status, 422, r.text);
    assert.equal(r.json.error.code, 'tool_choice_not_satisfied');
    assert.match(r.json.error.message, message);
    const s = await fetch(server.base + '/v1/chat/completions', {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: USER, tools: TOOLS, max_tokens: 200, stream: true, ...extra }),
    });
    const events = (await s.text()).split('\n\n').filter((e) => e.startsWith('data: '));
    assert.equal(events.at(-1), 'data: [DONE]');
    const last = JSON.parse(events.at(-2).slice(6));
    assert.equal(last.error.code, 'tool_choice_not_satisfied');
  }
});

test('tools and tool_choice are validated against the OpenAI schema with clear 400s', async () => {
  const bad = [
    [{ tools: {} }, /'tools' must be an array/],
    [{ tools: [{ type: 'function' }] }, /tools\[0\]\.function must be an object/],
    [{ tools: [{ type: 'code_interpreter', function: { name: 'f' } }] }, /tools\[0\]\.type/],
    [{ tools: [{ type: 'function', function: { name: 'bad name' } }] }, /tools\[0\]\.function\.name 'bad name'/],
    [{ tools: [TOOLS[0], TOOLS[0]] }, /given twice/],
    [{ tools: [{ type: 'function', function: { name: 'f', parameters: 'x' } }] }, /parameters/],
    [{ tools: TOOLS, tool_choice: 'always' }, /'tool_choice' must be/],
    [{ tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } } }, /not in 'tools'/],
    [{ tool_choice: 'required' }, /needs 'tools'/],
    [{ tools: TOOLS, parallel_tool_calls: 'yes' }, /parallel_tool_calls/],
    [{ messages: [...USER, { role: 'assistant', content: null, tool_calls: [{ id: 'a', type: 'function', function: { arguments: '{}' } }] }] },
      /messages\[1\]\.tool_calls\[0\]\.function\.name/],
  ];
  for (const [extra, message] of bad) {
    const r = await server.post('/v1/chat/completions', { messages: USER, max_tokens: 2, ...extra });
    assert.equal(r.status, 400, JSON.stringify(extra) + ' ' + r.text);
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.match(r.json.error.message, message);
  }
});

test('forced_output is refused with a 400 when --allow-forced-output is off', async () => {
  const plain = await startServer(['--kv-cache-tokens', '2048']);
  try {
    for (const p of ['/v1/chat/completions', '/v1/completions']) {
      const body = p.includes('chat') ? { messages: USER } : { prompt: 'hi' };
      const r = await plain.post(p, { ...body, forced_output: 'x', max_tokens: 2 });
      assert.equal(r.status, 400, r.text);
      assert.match(r.json.error.message, /--allow-forced-output/);
    }
  } finally {
    await plain.stop();
  }
});

// --auto-tool-offload keys on the parsed tool calls, for every parser: a reply with calls
// parks the session on the host, a reply without leaves it, and the next request (the
// tool results) brings it back by itself.
const PARSER_REPLIES = {
  auto: '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
  llama3_json: '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
  mistral: '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
};
for (const [parser, reply] of Object.entries(PARSER_REPLIES)) {
  test(`auto tool offload on a tool-call reply (--tool-call-parser ${parser})`, async () => {
    const s = await startServer(['--kv-cache-tokens', '2048', '--enable-hierarchical-cache', '--hicache-ratio', '4',
      '--auto-tool-offload', '--allow-forced-output', '--admin-api-key', 'k', '--tool-call-parser', parser]);
    try {
      const messages = [{ role: 'system', content: 'Agent. ' + words(150, 3) }, ...USER];
      const stateOf = async (id) => (await s.get('/session/kv_meta?session_id=' + id, ADMIN)).json?.state;
      // A plain answer does not offload.
      const plain = await s.post('/v1/chat/completions', { messages, tools: TOOLS, session_id: 'p-' + parser,
        forced_output: 'Just text.', max_tokens: 20 });
      assert.equal(plain.status, 200, plain.text);
      assert.notEqual(await stateOf('p-' + parser), 'OFFLOADED');
      // A tool call does, streamed or not.
      for (const stream of [false, true]) {
        const id = `a-${parser}-${stream}`;
        const r = await s.post('/v1/chat/completions', { messages, tools: TOOLS, session_id: id, forced_output: reply,
          max_tokens: 60, stream });
        assert.equal(r.status, 200, r.text);
        if (!stream) {
          assert.equal(r.json.choices[0].finish_reason, 'tool_calls');
          assert.equal(r.json.choices[0].message.tool_calls[0].function.name, 'get_weather');
        } else {
          assert.match(r.text, /"finish_reason":"tool_calls"/);
        }
        assert.ok(['OFFLOADING', 'OFFLOADED'].includes(await stateOf(id)), parser);
        const call = stream ? { id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }
          : r.json.choices[0].message.tool_calls[0];
        const next = await s.post('/v1/chat/completions', { session_id: id, tools: TOOLS, max_tokens: 5, forced_output: 'Sunny.',
          messages: [...messages, { role: 'assistant', content: null, tool_calls: [call] },
            { role: 'tool', tool_call_id: call.id, content: 'sunny' }] });
        assert.equal(next.status, 200, next.text);
        assert.equal(next.json.choices[0].message.content, 'Sunny.');
        assert.ok(next.json.usage.prompt_tokens_details.cached_tokens > 0, next.text);
        assert.notEqual(await stateOf(id), 'OFFLOADED');
      }
    } finally {
      await s.stop();
    }
  });
}
