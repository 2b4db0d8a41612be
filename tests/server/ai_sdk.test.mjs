// Black-box tests with the Vercel AI SDK (`ai`, `@ai-sdk/anthropic`, `@ai-sdk/openai`)
// against a real `strata serve`, and one case through `strata route`: generateText and
// streamText with the Anthropic provider (Strata's /v1/messages), the OpenAI provider's
// Responses model (`openai.responses`, /v1/responses) and its chat model (`openai.chat`,
// /v1/chat/completions), each with one tool-call round trip (the SDK runs the tool and
// sends its result back). The tiny model's replies are chosen with the test-only
// `forced_output` field, which a fetch wrapper adds to the providers' requests (the SDK has
// no field for it); every request body the SDK sent is kept, to check what it asked for.
// Run by CTest: node --test tests/server/ai_sdk.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { createRequire } from 'node:module';
import { startServer, startRouter, allJoined, words, SOURCE_DIR } from './server_harness.mjs';

const require = createRequire(path.join(SOURCE_DIR, 'tools/js/package.json'));
const { generateText, streamText, tool, jsonSchema, stepCountIs } = require('ai');
const { createAnthropic } = require('@ai-sdk/anthropic');
const { createOpenAI } = require('@ai-sdk/openai');

const CALL = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';

let server;

before(async () => {
  server = await startServer(['--kv-cache-tokens', '8192', '--allow-forced-output']);
});

after(async () => {
  if (server) await server.stop();
});

// The providers of one base URL, with a fetch that gives each request the next forced
// reply and keeps the bodies sent.
function providers(base) {
  const forced = [];
  const sent = [];
  const fetchForced = async (url, init) => {
    if (init?.body && typeof init.body === 'string') {
      const body = JSON.parse(init.body);
      sent.push({ url: String(url), body });
      if (forced.length > 0) body.forced_output = forced.shift();
      init = { ...init, body: JSON.stringify(body) };
    }
    return fetch(url, init);
  };
  return {
    forced, sent,
    anthropic: createAnthropic({ baseURL: base + '/v1', apiKey: 'unused', fetch: fetchForced }),
    openai: createOpenAI({ baseURL: base + '/v1', apiKey: 'unused', fetch: fetchForced }),
  };
}

// One tool, run by the SDK: what it was called with is kept.
function weatherTool(calls) {
  return tool({
    description: 'The weather in a city',
    inputSchema: jsonSchema({ type: 'object', properties: { city: { type: 'string' } }, required: ['city'] }),
    execute: async ({ city }) => {
      calls.push(city);
      return `21 C and sunny in ${city}`;
    },
  });
}

// The three models of one set of providers.
function models(p) {
  return [
    ['anthropic', p.anthropic('tiny'), '/v1/messages'],
    ['openai.responses', p.openai.responses('tiny'), '/v1/responses'],
    ['openai.chat', p.openai.chat('tiny'), '/v1/chat/completions'],
  ];
}

for (const [name, index] of [['anthropic', 0], ['openai.responses', 1], ['openai.chat', 2]]) {
  test(`${name}: generateText and streamText`, async () => {
    const p = providers(server.base);
    const [, model, route] = models(p)[index];
    p.forced.push('Hello from Strata.');
    const g = await generateText({ model, system: 'Be brief.', prompt: 'Say hello.', maxOutputTokens: 32 });
    assert.equal(g.text, 'Hello from Strata.');
    assert.equal(g.finishReason, 'stop');
    assert.ok(g.usage.inputTokens > 0, JSON.stringify(g.usage));
    assert.ok(g.usage.outputTokens > 0, JSON.stringify(g.usage));
    assert.ok(p.sent[0].url.endsWith(route), p.sent[0].url);

    p.forced.push('Streaming works fine.');
    const s = streamText({ model, system: 'Be brief.', prompt: 'Stream please.', maxOutputTokens: 32 });
    let text = '';
    for await (const piece of s.textStream) text += piece;
    assert.equal(text, 'Streaming works fine.');
    assert.equal(await s.finishReason, 'stop');
    assert.ok((await s.usage).outputTokens > 0);
    assert.equal(p.sent[1].body.stream, true);
  });

  test(`${name}: a tool-call round trip, whole and streamed`, async () => {
    const p = providers(server.base);
    const [, model] = models(p)[index];
    const calls = [];
    const ask = { model, system: 'You look the weather up. ' + words(60, 7), prompt: 'Weather in Paris?',
      tools: { get_weather: weatherTool(calls) }, stopWhen: stepCountIs(3), maxOutputTokens: 200 };
    p.forced.push(CALL, 'It is sunny in Paris.');
    const g = await generateText(ask);
    assert.deepEqual(calls, ['Paris']);
    assert.equal(g.steps.length, 2);
    assert.equal(g.steps[0].finishReason, 'tool-calls');
    assert.deepEqual(g.steps[0].toolCalls.map((c) => [c.toolName, c.input]), [['get_weather', { city: 'Paris' }]]);
    assert.equal(g.text, 'It is sunny in Paris.');
    // The second request carried the call and its result back, and hit the first's prompt.
    assert.ok(g.steps[1].usage.inputTokens > g.steps[0].usage.inputTokens);
    assert.ok(JSON.stringify(p.sent[1].body).includes('21 C and sunny in Paris'));

    p.forced.push(CALL, 'Sunny, streamed.');
    const s = streamText(ask);
    let text = '';
    for await (const piece of s.textStream) text += piece;
    assert.deepEqual(calls, ['Paris', 'Paris']);
    assert.equal((await s.steps).length, 2);
    assert.ok(text.endsWith('Sunny, streamed.'), text);
  });
}

test('through strata route: the three providers, a tool round trip each', async () => {
  const workers = [];
  let router;
  try {
    for (let i = 0; i < 2; i++) {
      workers.push(await startServer(['--kv-cache-tokens', '4096', '--allow-forced-output',
        '--kv-events-endpoint', 'tcp://127.0.0.1:*']));
    }
    router = await startRouter(workers.flatMap((w) => ['--worker', w.base]));
    await allJoined(router, 2);
    const p = providers(router.base);
    for (const [name, model] of models(p)) {
      const calls = [];
      p.forced.push(CALL, `Sunny (${name}).`);
      const g = await generateText({ model, prompt: 'Weather in Paris?', tools: { get_weather: weatherTool(calls) },
        stopWhen: stepCountIs(3), maxOutputTokens: 200 });
      assert.deepEqual(calls, ['Paris'], name);
      assert.equal(g.text, `Sunny (${name}).`, name);
    }
  } finally {
    if (router) await router.stop();
    for (const w of workers) await w.stop();
  }
});
