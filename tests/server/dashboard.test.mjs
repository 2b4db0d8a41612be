// The cache dashboard (docs/dashboard.md) in a real browser: headless Chromium (Debian's
// `chromium`) driven over the DevTools protocol by puppeteer-core, against live servers
// with populated caches. Checks that the page loads without console errors, draws exactly
// the nodes /cache/state counts, follows the event stream without a reload, pins from the
// page, shows a flood's evictions live, asks for the admin key, stays bounded on a
// 100,000-node tree, and lists a router's workers with their trees. Screenshots go to
// $STRATA_TEST_DIR/dashboard-screens (and, for the docs, to
// $STRATA_DASHBOARD_SCREENSHOT_DIR when set).
// Run by CTest: node --test tests/server/dashboard.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, copyFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { startServer, words, STRATA, SOURCE_DIR, WORK_DIR, tinyQwen3Model } from './server_harness.mjs';

// Debian's chromium; STRATA_CHROMIUM names another build of it.
const CHROMIUM = process.env.STRATA_CHROMIUM ?? '/usr/bin/chromium';
const SKIP = existsSync(CHROMIUM)
  ? false
  : `${CHROMIUM} is absent: the dashboard tests need Debian's chromium (scripts/install-deps.sh installs it)`;
// STRATA_REQUIRE_BROWSER=1 (scripts/test.sh sets it: CI installs Chromium) turns a missing
// browser into a failure, so that a skipped browser test cannot pass CI; a run without it
// (a developer's machine without Chromium) skips them.
const REQUIRE_BROWSER = process.env.STRATA_REQUIRE_BROWSER === '1';
if (SKIP && REQUIRE_BROWSER) {
  test('a browser is present (STRATA_REQUIRE_BROWSER=1)', () => {
    assert.fail(`${SKIP}; STRATA_REQUIRE_BROWSER=1 says the browser tests must run`);
  });
} else if (SKIP) {
  console.log('dashboard browser tests skipped: ' + SKIP);
}

const SCREENS = path.join(WORK_DIR, 'dashboard-screens');
const DOC_SCREENS = process.env.STRATA_DASHBOARD_SCREENSHOT_DIR;
const KEY = 'dashboard-test-key';

let browser;
let server;

// ---------------------------------------------------------------------------------------
// Helpers

async function waitFor(fn, what, ms = 20000) {
  const until = Date.now() + ms;
  let last;
  for (;;) {
    last = await fn();
    if (last) return last;
    if (Date.now() > until) assert.fail('timed out waiting for ' + what);
    await new Promise((r) => setTimeout(r, 100));
  }
}

function chat(system, user, maxTokens = 4) {
  return { messages: [{ role: 'system', content: system }, { role: 'user', content: user }], max_tokens: maxTokens,
    temperature: 0 };
}

async function populate(srv, headers = {}) {
  for (const [seed, users] of [[11, ['how do rivers form', 'why are stones round', 'what is a delta']],
    [12, ['count the windows', 'name a falcon']]]) {
    const system = 'You answer briefly. ' + words(90, seed);
    for (const u of users) {
      const r = await srv.post('/v1/chat/completions', chat(system, u), headers);
      assert.equal(r.status, 200, r.text);
    }
  }
}

// A page on `base`'s dashboard whose console errors and uncaught exceptions are kept in
// page.errors; `allow` lists patterns of errors the test expects.
async function openPage(base, { allow = [] } = {}) {
  const page = await browser.newPage();
  await page.setViewport({ width: 1440, height: 1000 });
  page.errors = [];
  page.on('console', (m) => {
    if (m.type() !== 'error') return;
    const text = `${m.text()} (${m.location()?.url ?? ''})`;
    if (!allow.some((re) => re.test(text))) page.errors.push(text);
  });
  page.on('pageerror', (e) => page.errors.push('pageerror: ' + e.message));
  await page.goto(base + '/dashboard', { waitUntil: 'load' });
  return page;
}

function attr(page, selector, name) {
  return page.$eval(selector, (el, n) => el.getAttribute(n), name);
}

async function numAttr(page, selector, name) {
  return Number(await attr(page, selector, name));
}

// Waits until the page's tree holds exactly the nodes the server counts, all drawn.
async function treeMatches(page, srv, headers = {}, statePath = '/cache/state') {
  return waitFor(async () => {
    const s = await srv.get(statePath, headers);
    assert.equal(s.status, 200, s.text);
    const count = s.json.nodes_count;
    const shown = await numAttr(page, '#tree', 'data-node-count');
    const drawn = await numAttr(page, '#tree', 'data-drawn-count');
    return count > 0 && shown === count && drawn === count ? count : null;
  }, 'the page to show every node of ' + srv.base);
}

async function screenshot(page, name, docName) {
  mkdirSync(SCREENS, { recursive: true });
  const file = path.join(SCREENS, name);
  await page.mouse.move(1, 1); // no tooltip in the picture
  await new Promise((r) => setTimeout(r, 500)); // the redraw after a resize of the panels
  await page.screenshot({ path: file, fullPage: true });
  if (DOC_SCREENS && docName) {
    mkdirSync(DOC_SCREENS, { recursive: true });
    copyFileSync(file, path.join(DOC_SCREENS, docName));
  }
}

async function closePage(page) {
  const errors = page.errors;
  await page.close();
  assert.deepEqual(errors, [], 'console errors on the page');
}

// ---------------------------------------------------------------------------------------

before(async () => {
  if (SKIP) return;
  const require = createRequire(path.join(SOURCE_DIR, 'tools/js/package.json'));
  const puppeteer = require('puppeteer-core');
  browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    // CI runs as root, where Chromium's sandbox cannot start.
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
  });
  // 128 device pages and a host tier twice that: a flood of long prompts evicts.
  server = await startServer(['--kv-cache-tokens', '2048', '--enable-hierarchical-cache', '--hicache-ratio', '2']);
  await populate(server);
});

after(async () => {
  if (browser) await browser.close();
  if (server) await server.stop();
});

// The page's model (src/dashboard/tree.js), run in Node on the live event stream: after
// conversations, a flood (device evictions, host demotions), an eviction and a flush, the
// blocks it holds and their tiers are exactly the server's. Needs no browser.
test('the page\'s tree model follows /cache/events to exactly the server\'s blocks and tiers', async () => {
  const { TreeModel, TIER } = await import(path.join(SOURCE_DIR, 'src/dashboard/tree.js'));
  const { parseExactJson } = await import(path.join(SOURCE_DIR, 'src/dashboard/api.js'));
  const srv = await startServer(['--kv-cache-tokens', '1024', '--enable-hierarchical-cache', '--hicache-ratio', '2']);
  const ctrl = new AbortController();
  try {
    const model = new TreeModel();
    let batches = 0;
    let lastSeq = null;
    const r = await fetch(srv.base + '/cache/events', { signal: ctrl.signal });
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type'), /text\/event-stream/);
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    const pump = (async () => {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf('\n\n')) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const event = /^event: (.*)$/m.exec(block)?.[1] ?? 'message';
          const data = block.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trim()).join('\n');
          if (event === 'overflow') throw new Error('the event stream overflowed');
          if (event !== 'message' || !data) continue;
          const batch = parseExactJson(data);
          if (lastSeq !== null) assert.equal(batch.seq, lastSeq + 1, 'consecutive batches');
          lastSeq = batch.seq;
          model.applyEvents(batch.events);
          batches++;
        }
      }
    })().catch((e) => { if (!ctrl.signal.aborted) throw e; });
    // The stream starts empty, on an empty cache.
    await populate(srv);
    for (let i = 0; i < 8; i++) {
      const res = await srv.post('/v1/chat/completions', chat(words(300, 500 + i), `flood ${i}`, 1));
      assert.equal(res.status, 200, res.text);
    }
    await populate(srv);
    const mid = await srv.getExact('/cache/state?detail=tree');
    const victim = mid.json.nodes.find((n) => n.parent === 0);
    const ev = await srv.post('/cache/evict', `{"block_hashes":[${victim.block_hashes[0]}],"descendants":true}`);
    assert.equal(ev.status, 200, ev.text);
    const blocksOf = (nodes) => {
      const out = new Map();
      for (const n of nodes) {
        let mask = 0;
        for (const t of n.tiers) mask |= { device: TIER.DEVICE, host: TIER.HOST, storage: TIER.STORAGE }[t];
        for (const h of n.block_hashes) out.set(String(h), mask);
      }
      return out;
    };
    const modelBlocks = () => {
      const out = new Map();
      for (const n of model.nodes.values()) n.hashes.forEach((h, i) => out.set(h, n.tiers[i]));
      return out;
    };
    // The blocks where the model and the server differ (empty when they agree).
    const differences = async () => {
      const want = blocksOf((await srv.getExact('/cache/state?detail=tree')).json.nodes);
      const got = modelBlocks();
      const diff = [];
      for (const [h, m] of want) if (got.get(h) !== m) diff.push(`${h}: server tiers ${m}, model ${got.get(h)}`);
      for (const [h, m] of got) if (!want.has(h)) diff.push(`${h}: only in the model (tiers ${m})`);
      return { blocks: want.size, diff };
    };
    const agree = async (what) => {
      let last;
      try {
        return await waitFor(async () => {
          last = await differences();
          return last.diff.length === 0 ? last : null;
        }, what, 10000);
      } catch (e) {
        assert.fail(`${e.message}: ${last.diff.length} blocks differ, e.g. ${last.diff.slice(0, 5).join('; ')}`);
      }
    };
    const { blocks } = await agree('the model to hold the server\'s blocks');
    assert.ok(blocks > 0 && batches > 0);
    assert.equal(model.desynced, false);
    const evictions = (await srv.get('/cache/state')).json.evictions;
    assert.ok(evictions.evicted_pages_total + evictions.demoted_pages_total > 0, JSON.stringify(evictions));
    const flush = await srv.post('/cache/flush', {});
    assert.equal(flush.status, 200, flush.text);
    assert.equal((await agree('the model to follow the flush')).blocks, 0);
    assert.equal(model.size, 0);
    ctrl.abort();
    await pump;
  } finally {
    ctrl.abort();
    await srv.stop();
  }
});

test('the page loads, draws every node of the tree and follows the events live', { skip: SKIP }, async () => {
  const config = await server.get('/dashboard/config');
  assert.equal(config.status, 200, config.text);
  assert.equal(config.json.mode, 'worker');
  assert.equal(config.json.auth_required, false);
  const page = await openPage(server.base);
  await waitFor(async () => (await attr(page, '#conn', 'data-state')) === 'live', 'the event stream');
  const before = await treeMatches(page, server);
  assert.equal(await numAttr(page, '#tree', 'data-aggregated-count'), 0);
  const rects = await page.$$eval('#tree rect[data-kind="node"]', (els) => els.length);
  assert.equal(rects, before);
  // A new conversation arrives as events, without a reload of the page.
  await page.evaluate(() => { window.__sameDocument = true; });
  const batches = await numAttr(page, '#events', 'data-events-received');
  const r = await server.post('/v1/chat/completions', chat('A new system prompt. ' + words(70, 31), 'hello'));
  assert.equal(r.status, 200, r.text);
  await waitFor(async () => (await numAttr(page, '#events', 'data-events-received')) > batches, 'an event batch');
  assert.ok(await numAttr(page, '#events', 'data-stored-total') > 0);
  const after = await treeMatches(page, server);
  assert.ok(after > before, `${after} nodes after a new conversation, ${before} before`);
  assert.equal(await page.evaluate(() => window.__sameDocument), true);
  // The gauges carry what /cache/state says.
  const s = await server.get('/cache/state');
  await waitFor(async () => (await numAttr(page, '#gauge-device', 'data-last-used')) === s.json.device.used_pages,
    'the device gauge');
  await waitFor(async () => (await attr(page, '#gauge-requests', 'data-last-running')) === '0', 'the requests gauge');
  // A hover shows the tooltip; the colour modes redraw.
  await page.hover('#tree rect[data-kind="node"]');
  assert.equal(await page.$eval('#tooltip', (el) => el.hidden), false);
  await page.select('#colour-mode', 'hits');
  assert.equal(await attr(page, '#tree', 'data-colour-mode'), 'hits');
  await page.select('#colour-mode', 'tier');
  await screenshot(page, 'worker.png');
  await closePage(page);
});

test('a pin made in the page shows in /cache/state, survives a flood, and an unpin removes it',
  { skip: SKIP }, async () => {
    const page = await openPage(server.base);
    await treeMatches(page, server);
    // The largest first-level node: the system prompt most conversations share.
    const id = Number(await attr(page, '#tree rect[data-kind="node"]', 'data-node-id'));
    assert.ok(id > 0);
    await page.click(`#tree rect[data-node-id="${id}"]`);
    await waitFor(async () => (await attr(page, '#detail', 'data-loaded')) === 'true', 'the node details');
    assert.equal(await attr(page, '#detail', 'data-node-id'), String(id));
    const text = await page.$eval('#detail .text', (el) => el.textContent);
    assert.ok(text.length > 0, 'the node\'s detokenized text');
    await page.click('#btn-pin');
    await waitFor(async () => (await attr(page, '#action-result', 'data-status')) === 'ok', 'the pin answer');
    assert.equal(await attr(page, '#action-result', 'data-action'), 'pin');
    const pinned = await server.getExact('/cache/state?detail=tree');
    assert.ok(pinned.json.device.pinned_blocks > 0, JSON.stringify(pinned.json.device));
    const node = pinned.json.nodes.find((n) => n.id === id);
    assert.ok(node && node.pin_ref > 0 && node.pin_counts.some((c) => c > 0), JSON.stringify(node));
    await waitFor(async () => page.$eval(`#tree rect[data-node-id="${id}"]`, (el) => el.classList.contains('pin-hard')),
      'the pin mark');
    await waitFor(async () => (await numAttr(page, '#gauge-device', 'data-last-pinned')) > 0, 'the pinned gauge');
    if (DOC_SCREENS) {
      // For the docs' picture: a quarter of a minute of traffic, so that the gauges have a
      // history and the event log some lines.
      for (let i = 0; i < 15; i++) {
        const system = 'You answer briefly. ' + words(90, 11 + (i % 2));
        await server.post('/v1/chat/completions', chat(system, `follow-up question ${i}`, 8));
        if (i === 9) await server.post('/v1/chat/completions', chat(words(300, 900), 'a long one', 1));
        await new Promise((r) => setTimeout(r, 1000));
      }
      await page.click(`#tree rect[data-node-id="${id}"]`);
      await waitFor(async () => (await attr(page, '#detail', 'data-loaded')) === 'true', 'the node details');
    }
    await screenshot(page, 'worker-pinned.png', 'dashboard-worker.png');

    // A flood of distinct long prompts: the page shows the evictions as they happen.
    await page.evaluate(() => { window.__sameDocument = true; });
    const evictedBefore = await numAttr(page, '#events', 'data-evicted-total');
    for (let i = 0; i < 12; i++) {
      const r = await server.post('/v1/chat/completions', chat(words(420, 200 + i), `flood ${i}`, 1));
      assert.equal(r.status, 200, r.text);
    }
    await waitFor(async () => (await numAttr(page, '#events', 'data-evicted-total')) > evictedBefore,
      'evictions on the page');
    assert.ok(await numAttr(page, '#events', 'data-removed-device') > 0);
    assert.equal(await page.evaluate(() => window.__sameDocument), true, 'the page was not reloaded');
    const flooded = await server.get('/cache/state');
    assert.ok(flooded.json.evictions.evicted_pages_total > 0, JSON.stringify(flooded.json.evictions));
    await treeMatches(page, server);
    // The pinned prefix survived the flood (pinned pages may leave the device for the host,
    // never the host: docs/hierarchical-cache.md), in the cache and in the page.
    const kept = await server.getExact('/cache/state?detail=tree');
    const keptNode = kept.json.nodes.find((n) => n.id === id);
    assert.ok(keptNode && keptNode.pin_ref > 0 && keptNode.tiers.length > 0, JSON.stringify(keptNode));
    await page.click(`#tree rect[data-node-id="${id}"]`);
    await waitFor(async () => (await attr(page, '#detail', 'data-loaded')) === 'true', 'the node details');
    await screenshot(page, 'worker-flood.png');

    await page.click('#btn-unpin');
    await waitFor(async () => (await attr(page, '#action-result', 'data-action')) === 'unpin' &&
      (await attr(page, '#action-result', 'data-status')) === 'ok', 'the unpin answer');
    const unpinned = await server.get('/cache/state');
    assert.equal(unpinned.json.device.pinned_blocks, 0);
    await waitFor(async () => !(await page.$eval(`#tree rect[data-node-id="${id}"]`,
      (el) => el.classList.contains('pin-hard'))), 'the pin mark to go');
    await closePage(page);
  });

test('a 100,000-node tree is drawn within the rectangle budget and the page stays responsive',
  { skip: SKIP }, async () => {
    const page = await openPage(server.base);
    await waitFor(async () => (await attr(page, '#conn', 'data-state')) === 'live', 'the event stream');
    const result = await page.evaluate(() => {
      // A deterministic random tree: 40 conversations' roots, then nodes under earlier ones.
      let x = 7;
      const rnd = () => (x = (x * 1103515245 + 12345) % 2147483648) / 2147483648;
      const nodes = [];
      for (let i = 1; i <= 100000; i++) {
        const parent = i <= 40 ? 0 : 1 + Math.floor(rnd() * Math.min(i - 1, 3000 + i / 3));
        nodes.push({ id: i, parent, tokens: 16 * (1 + (i % 4)), block_hashes: [String(-1e15 - i)],
          tiers: i % 7 === 0 ? ['host'] : ['device', 'host'], lock_ref: i % 97 === 0 ? 1 : 0,
          pin_ref: 0, pin_counts: [i % 501 === 0 ? 1 : 0], last_access_ms: i, hit_count: i % 13,
          loading: i % 1009 === 0, session_protected: i % 211 === 0, evictable: true });
      }
      return window.strataDashboard.loadTree(nodes, { pageSize: 16 });
    });
    assert.equal(result.nodeCount, 100000);
    const cap = await page.evaluate(() => window.strataDashboard.maxRects);
    assert.ok(result.rects <= cap && result.drawn <= cap, JSON.stringify(result));
    assert.equal(result.drawn + result.aggregated, 100000);
    assert.equal(await numAttr(page, '#tree', 'data-node-count'), 100000);
    const rects = await page.$$eval('#tree rect.cell', (els) => els.length);
    assert.ok(rects <= cap, `${rects} rectangles`);
    assert.equal(await attr(page, '#conn', 'data-state'), 'paused');
    // Responsive: it answers, a click selects, a "more" rectangle opens the folded siblings.
    assert.equal(await page.evaluate(() => 1 + 1), 2);
    await page.click('#tree rect[data-kind="node"]');
    assert.ok(Number(await attr(page, '#detail', 'data-node-id')) > 0);
    // The tallest "more" rectangle (a click on a one-pixel one could land on a neighbour).
    const more = await page.evaluateHandle(() => [...document.querySelectorAll('#tree rect[data-kind="more"]')]
      .sort((a, b) => b.height.baseVal.value - a.height.baseVal.value)[0] ?? null);
    assert.ok(more.asElement(), 'a "more" rectangle');
    await more.asElement().click();
    assert.notEqual(await attr(page, '#tree', 'data-focus-id'), '');
    const zoomed = await page.evaluate(() => window.strataDashboard.draw());
    assert.ok(zoomed.rects <= cap);
    assert.equal(zoomed.drawn + zoomed.aggregated, zoomed.total);
    await page.click('#focus-reset');
    assert.equal(await attr(page, '#tree', 'data-focus-id'), '');
    await page.select('#colour-mode', 'recency');
    assert.equal(await page.evaluate(() => 1 + 1), 2);
    await screenshot(page, 'worker-100k.png');
    await closePage(page);
  });

test('with an admin key the page asks for it, refuses a wrong one, and evicts and flushes with the right one',
  { skip: SKIP }, async () => {
    const keyed = await startServer(['--kv-cache-tokens', '2048', '--admin-api-key', KEY]);
    try {
      await populate(keyed);
      const headers = { authorization: 'Bearer ' + KEY };
      const config = await keyed.get('/dashboard/config');
      assert.equal(config.json.auth_required, true);
      assert.equal((await keyed.get('/cache/state')).status, 401);
      // The refused key's 401 shows in the console as a failed resource: expected.
      const page = await openPage(keyed.base, { allow: [/status of 401/] });
      await page.waitForSelector('#auth:not([hidden])');
      await page.type('#auth-key', 'not-the-key');
      await page.click('#auth-submit');
      await waitFor(async () => (await page.$eval('#auth-error', (el) => el.textContent)).length > 0, 'the refusal');
      assert.equal(await page.$eval('#auth', (el) => el.hidden), false);
      await page.$eval('#auth-key', (el) => { el.value = ''; });
      await page.type('#auth-key', KEY);
      await page.click('#auth-submit');
      await waitFor(async () => page.$eval('#auth', (el) => el.hidden), 'the key to be accepted');
      await waitFor(async () => (await attr(page, '#conn', 'data-state')) === 'live', 'the event stream');
      const count = await treeMatches(page, keyed, headers);
      // The actions carry the key too. Without a host tier an evicted node leaves the tree.
      const id = Number(await attr(page, '#tree rect[data-kind="node"]', 'data-node-id'));
      await page.click(`#tree rect[data-node-id="${id}"]`);
      await page.click('#btn-evict');
      await waitFor(async () => (await attr(page, '#action-result', 'data-action')) === 'evict' &&
        (await attr(page, '#action-result', 'data-status')) === 'ok', 'the evict answer');
      const answer = await page.$eval('#action-result', (el) => el.textContent);
      assert.match(answer, /"evicted_blocks":[1-9]/);
      const fewer = await treeMatches(page, keyed, headers);
      assert.ok(fewer < count, `${fewer} nodes after evicting a subtree, ${count} before`);
      // The flush asks for a second click.
      await page.click('#btn-flush');
      assert.equal(await attr(page, '#action-result', 'data-action'), 'evict');
      await page.click('#btn-flush');
      await waitFor(async () => (await attr(page, '#action-result', 'data-action')) === 'flush' &&
        (await attr(page, '#action-result', 'data-status')) === 'ok', 'the flush answer');
      await waitFor(async () => (await numAttr(page, '#tree', 'data-node-count')) === 0, 'an empty tree on the page');
      assert.equal((await keyed.get('/cache/state', headers)).json.nodes_count, 0);
      await closePage(page);
    } finally {
      await keyed.stop();
    }
  });

// ---------------------------------------------------------------------------------------
// The router's view

function startRouter(args) {
  const proc = spawn(STRATA, ['route', '--model', tinyQwen3Model(), '--port', '0', '--log-level', 'warn',
    '--load-poll-ms', '100', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d.toString(); });
  return new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error('router did not start: ' + stderr)), 30000);
    proc.stdout.on('data', (d) => {
      out += d.toString();
      const m = out.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (!m) return;
      clearTimeout(timer);
      const base = `http://127.0.0.1:${m[1]}`;
      resolve({
        base,
        async get(p) {
          const r = await fetch(base + p);
          const text = await r.text();
          let json = null;
          try { json = JSON.parse(text); } catch { /* not JSON */ }
          return { status: r.status, json, text };
        },
        async post(p, body) {
          const r = await fetch(base + p, { method: 'POST', headers: { 'content-type': 'application/json' },
            body: JSON.stringify(body) });
          return { status: r.status, text: await r.text() };
        },
        stop() {
          if (proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve();
          const exited = new Promise((r) => proc.on('exit', r));
          process.kill(proc.pid, 'SIGTERM');
          return exited;
        },
      });
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`router exited ${code}: ${stderr}`)); });
  });
}

test('the router view lists the workers and draws each worker\'s tree', { skip: SKIP }, async () => {
  const workers = [];
  let router;
  try {
    for (let i = 0; i < 2; i++) {
      workers.push(await startServer(['--kv-cache-tokens', '2048', '--kv-events-endpoint', 'tcp://127.0.0.1:*',
        '--kv-events-replay-endpoint', 'tcp://127.0.0.1:*']));
    }
    router = await startRouter(workers.flatMap((w) => ['--worker', w.base]));
    await waitFor(async () => {
      const w = await router.get('/workers');
      return w.status === 200 && w.json.workers.length === 2 && w.json.workers.every((x) => x.joined && x.reachable);
    }, 'the workers to join');
    // Sessions spread new conversations over both workers.
    for (let i = 0; i < 6; i++) {
      const r = await router.post('/v1/chat/completions', { ...chat('Agent prompt. ' + words(60, 40 + (i % 2)),
        `task ${i}`), session_id: `dash-${i}` });
      assert.equal(r.status, 200, r.text);
    }
    const config = await router.get('/dashboard/config');
    assert.equal(config.status, 200, config.text);
    assert.equal(config.json.mode, 'router');
    const page = await openPage(router.base);
    await waitFor(async () => (await attr(page, '#workers', 'data-worker-count')) === '2', 'two workers listed');
    assert.equal(await page.$$eval('#workers tbody tr', (rows) => rows.length), 2);
    await waitFor(async () => (await attr(page, '#workers', 'data-healthy-count')) === '2', 'two healthy workers');
    for (const w of workers) {
      await page.select('#worker-select', w.base);
      await waitFor(async () => (await attr(page, '#tree', 'data-worker')) === w.base, 'the worker selection');
      await treeMatches(page, w);
    }
    await waitFor(async () => Number(await attr(page, '#gauge-decisions', 'data-samples')) >= 2, 'decision samples');
    if (DOC_SCREENS) {
      // For the docs' picture: ten seconds of traffic, so that the decisions have a history.
      for (let i = 0; i < 20; i++) {
        await router.post('/v1/chat/completions', { ...chat('Agent prompt. ' + words(60, 40 + (i % 3)),
          `step ${i}`), session_id: `dash-${i % 8}` });
        await new Promise((r) => setTimeout(r, 500));
      }
    }
    await screenshot(page, 'router.png', 'dashboard-router.png');
    await closePage(page);
  } finally {
    if (router) await router.stop();
    for (const w of workers) await w.stop();
  }
});
