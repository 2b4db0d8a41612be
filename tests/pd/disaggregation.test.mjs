// Prefill/decode disaggregation, black-box: a prefill worker and a decode worker as real
// `strata serve` processes (UCX over tcp), a colocated worker as the reference, and
// `strata route --pd` in front. Greedy output equal to the colocated worker's, usage's
// kv_transfer, /server_info's pd field, the metrics, the router's choice and header, and a
// prefill worker killed mid-stream of orders (requests still complete).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, startRouter, words } from '../server/server_harness.mjs';

process.env.UCX_TLS = process.env.UCX_TLS || 'tcp';

let colocated;
let prefill;
let decode;

function completion(prompt, maxTokens = 12) {
  return { prompt, max_tokens: maxTokens, temperature: 0 };
}

async function metric(server, name, label) {
  const r = await server.get('/metrics');
  const line = r.text.split('\n').find((l) => l.startsWith(`${name}{${label}}`));
  return line ? Number(line.split(' ').pop()) : NaN;
}

before(async () => {
  colocated = await startServer();
  prefill = await startServer(['--role', 'prefill', '--pd-worker-id', 'p1', '--pd-heartbeat-ms', '50',
    '--pd-peer-timeout-ms', '500']);
  const info = await prefill.get('/server_info');
  assert.equal(info.json.role, 'prefill');
  assert.equal(info.json.pd.worker_id, 'p1');
  assert.match(info.json.pd.endpoint, /^tcp:\/\/127\.0\.0\.1:\d+$/);
  decode = await startServer(['--role', 'decode', '--pd-worker-id', 'd1', '--pd-prefill-peer',
    info.json.pd.endpoint, '--pd-heartbeat-ms', '50', '--pd-peer-timeout-ms', '500', '--pd-quarantine-ms', '300']);
  for (let i = 0; i < 200; i++) {
    const d = await decode.get('/server_info');
    if (d.json.pd.peers_alive.includes('p1')) break;
    await new Promise((r) => setTimeout(r, 20));
  }
});

after(async () => {
  for (const s of [decode, prefill, colocated]) if (s) await s.stop();
});

test('server_info reports the role and the control plane', async () => {
  const d = await decode.get('/server_info');
  assert.equal(d.json.role, 'decode');
  assert.equal(d.json.pd.worker_id, 'd1');
  assert.equal(d.json.pd.endpoint, '');
  assert.equal(d.json.pd.transport, 'ucx');
  assert.deepEqual(d.json.pd.peers_alive, ['p1']);
  const c = await colocated.get('/server_info');
  assert.equal(c.json.role, 'mixed');
  assert.equal(c.json.pd, null);
});

test('a disaggregated completion equals the colocated one, with kv_transfer in usage', async () => {
  for (const n of [3, 40, 300]) {
    const prompt = words(n, n);
    const want = await colocated.post('/v1/completions', completion(prompt));
    const got = await decode.post('/v1/completions', completion(prompt), { 'x-strata-prefill-peer': 'p1' });
    assert.equal(got.status, 200, got.text);
    assert.equal(got.json.choices[0].text, want.json.choices[0].text, `prompt of ${n} words`);
    const kv = got.json.usage.kv_transfer;
    assert.ok(kv, JSON.stringify(got.json.usage));
    assert.equal(kv.tokens, got.json.usage.prompt_tokens - got.json.usage.prompt_tokens_details.cached_tokens);
    assert.ok(kv.bytes > 0 && kv.ms >= 0);
    assert.equal(want.json.usage.kv_transfer, undefined);
  }
  // Streamed, with usage in the last chunk.
  const prompt = words(120, 5);
  const want = await colocated.post('/v1/completions', completion(prompt));
  const r = await fetch(decode.base + '/v1/completions', {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-strata-prefill-peer': 'p1' },
    body: JSON.stringify({ ...completion(prompt), stream: true, stream_options: { include_usage: true } }),
  });
  const body = await r.text();
  let text = '';
  let usage = null;
  for (const line of body.split('\n')) {
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    const ev = JSON.parse(line.slice(6));
    if (ev.choices?.length) text += ev.choices[0].text;
    if (ev.usage) usage = ev.usage;
  }
  assert.equal(text, want.json.choices[0].text);
  assert.ok(usage.kv_transfer.tokens > 0);
  assert.ok(await metric(decode, 'strata_pd_events_total', 'event="rooms_done"') >= 4);
  assert.ok(await metric(prefill, 'strata_pd_events_total', 'event="orders_done"') >= 4);
  assert.ok(await metric(prefill, 'strata_pd_events_total', 'event="bytes_sent"') > 0);
});

test('an unknown peer in the header prefills locally and changes nothing else', async () => {
  const prompt = words(50, 77);
  const want = await colocated.post('/v1/completions', completion(prompt));
  const got = await decode.post('/v1/completions', completion(prompt), { 'x-strata-prefill-peer': 'nobody' });
  assert.equal(got.status, 200);
  assert.equal(got.json.choices[0].text, want.json.choices[0].text);
  assert.equal(got.json.usage.kv_transfer, undefined);
  assert.ok(await metric(decode, 'strata_pd_fallbacks_total', 'reason="peer_unavailable"') >= 1);
});

test('strata route --pd sends long prompts through the prefill worker', async () => {
  const router = await startRouter(['--pd', '--pd-min-prefill-tokens', '32', '--worker', decode.base,
    '--worker', prefill.base]);
  const base = router.base;
  try {
    // Wait until both workers joined.
    for (let i = 0; i < 200; i++) {
      const w = await (await fetch(base + '/workers')).json();
      if (w.workers?.filter((x) => x.joined).length === 2) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    const long = words(400, 31);
    const want = await colocated.post('/v1/completions', completion(long));
    const r = await fetch(base + '/v1/completions', { method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify(completion(long)) });
    const got = await r.json();
    assert.equal(r.status, 200, JSON.stringify(got));
    assert.equal(r.headers.get('x-strata-worker'), decode.base);
    assert.equal(r.headers.get('x-strata-prefill-worker'), prefill.base);
    assert.equal(got.choices[0].text, want.json.choices[0].text);
    assert.ok(got.usage.kv_transfer.tokens > 0);
    // A salted prompt (tenant isolation) stays on the decode worker: no order carries a salt.
    const salted = await fetch(base + '/v1/completions', { method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ ...completion(words(400, 32)), cache_salt: 'tenant-a' }) });
    assert.equal(salted.status, 200);
    assert.equal(salted.headers.get('x-strata-prefill-worker'), null);
    assert.equal((await salted.json()).usage.kv_transfer, undefined);
    // A short prompt stays on the decode worker.
    const s = await fetch(base + '/v1/completions', { method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify(completion('hello there', 4)) });
    const sj = await s.json();
    assert.equal(s.status, 200);
    assert.equal(s.headers.get('x-strata-prefill-worker'), null);
    assert.equal(sj.usage.kv_transfer, undefined);
  } finally {
    await router.stop();
  }
});

test('the prefill worker dies: requests complete by local prefill, no page leaks', async () => {
  const prompts = [words(600, 91), words(600, 92), words(600, 93)];
  const wants = await Promise.all(prompts.map((p) => colocated.post('/v1/completions', completion(p, 6))));
  const pending = prompts.map((p) => decode.post('/v1/completions', completion(p, 6), { 'x-strata-prefill-peer': 'p1' }));
  await new Promise((r) => setTimeout(r, 30));
  process.kill(prefill.pid, 'SIGKILL');
  const got = await Promise.all(pending);
  for (let i = 0; i < got.length; i++) {
    assert.equal(got[i].status, 200, got[i].text);
    assert.equal(got[i].json.choices[0].text, wants[i].json.choices[0].text);
  }
  prefill = null;
  // After the quarantine every page is free or cached: the pool's audit holds.
  let state;
  for (let i = 0; i < 100; i++) {
    state = await decode.get('/metrics');
    const q = state.text.split('\n').find((l) => l.startsWith('strata_pd{state="quarantined_pages"}'));
    if (q && Number(q.split(' ').pop()) === 0) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  // Idle: every allocated page is in the tree (none held by a request or a failed room).
  const st = await decode.get('/cache/state');
  assert.equal(st.status, 200, st.text);
  const dev = st.json.device;
  assert.equal(dev.request_pages, 0);
  assert.equal(dev.used_pages, dev.cached_pages, JSON.stringify(dev));
  assert.equal(dev.free_pages + dev.used_pages, dev.capacity_pages);
  // The decode worker still serves, with a local prefill (its peer is gone).
  const after = await decode.post('/v1/completions', completion(words(30, 94), 4), { 'x-strata-prefill-peer': 'p1' });
  assert.equal(after.status, 200);
});
