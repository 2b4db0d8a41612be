// The Strata cache dashboard (docs/dashboard.md). One page for both servers:
//  - worker (`strata serve`): the radix tree loaded from /cache/state?detail=tree and kept
//    live by /cache/events; node details from /cache/node; actions on /cache/*; gauges
//    polled from /cache/state and /metrics every second.
//  - router (`strata route`): the workers from /workers, decisions per second by reason
//    from /metrics, and the selected worker's tree through /workers/cache_state.
// Everything the page shows is also written into data attributes (the tree's node, drawn
// and aggregated counts, the events seen, the gauges' last values) for tests and tools.

import { Api, ApiError, parseExactJson, parseMetrics, hashesBody } from './api.js';
import { TreeModel, layoutIcicle, ownPinnedBlocks } from './tree.js';
import { IcicleView, tierList, pinKind, escapeHtml } from './icicle.js';
import { LineChart, Rates } from './charts.js';

const d3 = globalThis.d3;
const $ = (sel) => document.querySelector(sel);
const fmt = d3.format(',');

const MAX_RECTS = 2500; // rectangles the tree draws at most (the rest is aggregated)
const DRAW_INTERVAL_MS = 300; // redraws at most this often while events stream in
const POLL_MS = 1000; // gauges, and the router's worker list
const TREE_POLL_MS = 5000; // a full tree reload this often even without events
const ROUTER_TREE_POLL_MS = 2000; // a router's worker tree (it has no event stream)
const EVENTS_SETTLE_MS = 500; // reload the tree this long after the last event batch
const EVENT_LOG_LINES = 60;

const api = new Api();
const model = new TreeModel();
const state = {
  config: null,
  focus: null, // {id, skip} or null (the whole tree)
  colourMode: 'tier',
  selectedId: null,
  frozen: false, // a tree given to loadTree(): no live updates
  authBlocked: false,
  started: false,
  // tree loading
  loading: null, // the promise of the reload in flight
  reloadAgain: false,
  pendingEvents: null, // event batches that arrived during a reload, replayed after it
  lastLoadMs: 0,
  lastLoadAt: 0,
  reloadTimer: null,
  reloadDue: Infinity,
  // events
  eventsAbort: null,
  streamOpen: false, // a hello came on the current stream
  polling: false, // no /cache/events on this server: the tree is reloaded on a timer
  lastSeq: null,
  counts: { batches: 0, stored: 0, removed: 0, device: 0, host: 0, storage: 0, cleared: 0, overflows: 0 },
  // drawing
  drawPending: false,
  lastDrawAt: 0,
  layout: null,
  // router
  workerUrl: null,
  workers: [],
};

// ---------------------------------------------------------------------------------------
// Connection status

function setConn(s, detail = '') {
  const el = $('#conn');
  el.dataset.state = s;
  const words = { connecting: 'connecting', live: 'live', resync: 'resyncing', error: 'error', paused: 'paused' };
  el.querySelector('.text').textContent = words[s] + (detail ? ': ' + detail : '');
  el.title = detail;
}

// ---------------------------------------------------------------------------------------
// The tree

const view = new IcicleView($('#tree'), $('#tooltip'), {
  onSelect: (node) => selectNode(node.id),
  onFocus: (focus) => setFocus(focus),
});

function scheduleDraw() {
  if (state.drawPending) return;
  state.drawPending = true;
  const wait = Math.max(0, state.lastDrawAt + DRAW_INTERVAL_MS - performance.now());
  setTimeout(() => requestAnimationFrame(() => {
    state.drawPending = false;
    draw();
  }), wait);
}

function draw() {
  state.lastDrawAt = performance.now();
  if (state.focus && state.focus.id !== 0 && !model.nodes.has(state.focus.id)) state.focus = null;
  const { width, height } = view.size();
  const layout = layoutIcicle(model, state.focus, width, height, { maxRects: MAX_RECTS });
  state.layout = layout;
  view.render(layout, model, { mode: state.colourMode, selectedId: state.selectedId });
  const el = $('#tree');
  el.dataset.nodeCount = String(model.size);
  el.dataset.drawnCount = String(layout.drawn);
  el.dataset.aggregatedCount = String(layout.aggregated);
  el.dataset.rectCount = String(layout.items.length);
  el.dataset.focusId = state.focus ? String(state.focus.id) : '';
  el.dataset.colourMode = state.colourMode;
  el.dataset.modelVersion = String(model.version);
  $('#tree-stats').textContent =
    `${fmt(model.size)} nodes · ${fmt(model.root.weight)} pages · drawn ${fmt(layout.drawn)}` +
    (layout.aggregated ? `, ${fmt(layout.aggregated)} aggregated` : '');
  renderCrumbs(layout);
  if (state.selectedId != null) renderDetailFromModel();
  return layout;
}

function renderCrumbs(layout) {
  const nav = $('#crumbs');
  nav.textContent = '';
  if (!state.focus) return;
  const whole = document.createElement('button');
  whole.type = 'button';
  whole.id = 'focus-reset';
  whole.textContent = 'whole tree';
  whole.onclick = () => setFocus(null);
  nav.append(whole);
  const path = [];
  for (let n = layout.focusNode.parent; n && n !== model.root; n = n.parent) path.unshift(n);
  for (const n of path.slice(-4)) {
    const b = document.createElement('button');
    b.type = 'button';
    b.textContent = '#' + n.id;
    b.onclick = () => setFocus({ id: n.id, skip: 0 });
    nav.append(b);
  }
  const here = document.createElement('span');
  here.textContent = (layout.focusNode === model.root ? 'root' : `#${layout.focusNode.id}`) +
    (layout.skip ? `: children after the ${fmt(layout.skip)} largest` : '');
  nav.append(here);
}

function setFocus(focus) {
  state.focus = focus;
  draw();
}

// Loads the whole tree (worker: /cache/state?detail=tree; router: the selected worker's
// through /workers/cache_state) and replays the event batches that arrived meanwhile.
async function reloadTree() {
  if (state.frozen || state.authBlocked) return;
  if (state.loading) {
    state.reloadAgain = true;
    return state.loading;
  }
  if (state.config.mode === 'router' && !state.workerUrl) return;
  state.loading = (async () => {
    // Nothing below may finish before this function has returned and state.loading is
    // set: the `finally` clears it.
    await Promise.resolve();
    const t0 = performance.now();
    state.pendingEvents = [];
    try {
      let s;
      if (state.config.mode === 'router') {
        const url = state.workerUrl;
        s = await api.get('/workers/cache_state?detail=tree&url=' + encodeURIComponent(url));
        if (s && s.body && !s.nodes) s = s.body; // a relayed answer
        if (url !== state.workerUrl || state.frozen) return;
      } else {
        s = await api.get('/cache/state?detail=tree');
        if (state.frozen) return;
      }
      model.loadState(s.nodes ?? [], s.page_size);
      for (const events of state.pendingEvents) model.applyEvents(events);
      $('#tree').dataset.serverNodeCount = String(s.nodes_count ?? '');
      $('#tree').dataset.loads = String(Number($('#tree').dataset.loads ?? 0) + 1);
      state.lastLoadMs = performance.now() - t0;
      state.lastLoadAt = performance.now();
      // Live again once a reload worked while the stream is open (router: no stream).
      if (state.config.mode === 'router' || state.streamOpen || state.polling) setConn('live');
      draw();
    } catch (e) {
      if (!(e instanceof ApiError && (e.status === 401 || e.status === 403))) setConn('error', e.message);
    } finally {
      state.pendingEvents = null;
      state.loading = null;
      if (state.reloadAgain) {
        state.reloadAgain = false;
        scheduleReload(0);
      }
    }
  })();
  return state.loading;
}

// A reload no sooner than `delayMs` from now, and (so that a 100,000-node tree does not
// keep the page busy) no sooner than ten times the last load's duration after it.
function scheduleReload(delayMs) {
  const now = performance.now();
  const due = Math.max(now + delayMs, state.lastLoadAt + Math.max(500, state.lastLoadMs * 10));
  if (state.reloadTimer && state.reloadDue <= due) return;
  clearTimeout(state.reloadTimer);
  state.reloadDue = due;
  state.reloadTimer = setTimeout(() => {
    state.reloadTimer = null;
    state.reloadDue = Infinity;
    reloadTree();
  }, due - now);
}

// ---------------------------------------------------------------------------------------
// The event stream (worker)

async function followEvents() {
  let backoffMs = 500;
  while (!state.frozen && !state.authBlocked) {
    const ctrl = new AbortController();
    state.eventsAbort = ctrl;
    state.lastSeq = null;
    state.streamOpen = false;
    setConn('connecting');
    try {
      await api.stream('/cache/events', onEventMessage, ctrl.signal);
      state.streamOpen = false;
      if (state.frozen) return;
      setConn('error', 'the event stream ended; reconnecting');
    } catch (e) {
      state.streamOpen = false;
      if (state.frozen || state.authBlocked) return;
      if (e instanceof ApiError && e.status === 404) {
        // A server without /cache/events: reload the tree on a timer instead.
        state.polling = true;
        setConn('live', 'no event stream on this server: the tree is reloaded every 2 s');
        every(ROUTER_TREE_POLL_MS, reloadTree);
        return;
      }
      if (ctrl.signal.aborted && ctrl.signal.reason === 'resync') {
        backoffMs = 500;
        continue; // an overflow: reconnect at once
      }
      setConn('error', e.message);
    }
    await new Promise((r) => setTimeout(r, backoffMs));
    backoffMs = Math.min(5000, backoffMs * 2);
  }
}

function onEventMessage({ event, data }) {
  if (event === 'hello') {
    const hello = parseExactJson(data);
    $('#events').dataset.helloSeq = String(hello.seq ?? '');
    state.streamOpen = true;
    setConn('resync');
    reloadTree();
    return;
  }
  if (event === 'overflow') {
    // The server dropped us for falling behind: reload, and reconnect for a fresh stream.
    state.counts.overflows++;
    setConn('resync', 'fell behind the event stream');
    updateEventCounts();
    state.eventsAbort?.abort('resync');
    return;
  }
  if (event !== 'message') return;
  const batch = parseExactJson(data);
  state.counts.batches++;
  if (state.lastSeq != null && batch.seq !== state.lastSeq + 1) scheduleReload(0); // a gap
  state.lastSeq = batch.seq;
  const events = batch.events ?? [];
  for (const e of events) {
    if (e.type === 'BlockStored') state.counts.stored += e.block_hashes.length;
    else if (e.type === 'BlockRemoved') {
      const n = e.block_hashes.length;
      state.counts.removed += n;
      if (e.medium === 'CPU_PINNED') state.counts.host += n;
      else if (e.medium === 'DISK') state.counts.storage += n;
      else state.counts.device += n;
    } else if (e.type === 'AllBlocksCleared') state.counts.cleared++;
  }
  logEvents(batch);
  updateEventCounts();
  if (state.frozen) return;
  if (state.pendingEvents) state.pendingEvents.push(events);
  else model.applyEvents(events);
  scheduleDraw();
  // Events that did not fit the model (an unknown parent, a hole in a node) call for a
  // reload at once; otherwise one after the burst.
  scheduleReload(model.desynced ? 0 : EVENTS_SETTLE_MS);
}

function updateEventCounts() {
  const el = $('#events');
  const c = state.counts;
  el.dataset.eventsReceived = String(c.batches);
  el.dataset.evictedTotal = String(c.removed);
  el.dataset.storedTotal = String(c.stored);
  el.dataset.removedDevice = String(c.device);
  el.dataset.removedHost = String(c.host);
  el.dataset.removedStorage = String(c.storage);
  el.dataset.cleared = String(c.cleared);
  el.dataset.overflows = String(c.overflows);
  el.dataset.lastSeq = state.lastSeq == null ? '' : String(state.lastSeq);
  el.querySelector('.counts').textContent =
    `${fmt(c.batches)} batches · ${fmt(c.stored)} stored · ${fmt(c.removed)} removed`;
}

function logEvents(batch) {
  const log = $('#events .log');
  const time = new Date((batch.ts ?? Date.now() / 1000) * 1000).toLocaleTimeString();
  const medium = { GPU: 'device', CPU_PINNED: 'host', DISK: 'storage' };
  for (const e of batch.events ?? []) {
    const li = document.createElement('li');
    if (e.type === 'BlockStored') {
      li.className = 'stored';
      li.textContent = `${time} + ${e.block_hashes.length} block(s) on ${medium[e.medium] ?? e.medium}`;
    } else if (e.type === 'BlockRemoved') {
      li.className = 'removed';
      li.textContent = `${time} − ${e.block_hashes.length} block(s) from ${medium[e.medium] ?? e.medium}`;
    } else {
      li.className = 'removed';
      li.textContent = `${time} all blocks cleared`;
    }
    log.prepend(li);
  }
  while (log.childElementCount > EVENT_LOG_LINES) log.lastElementChild.remove();
}

// ---------------------------------------------------------------------------------------
// Node details and actions

function selectNode(id) {
  state.selectedId = id;
  const d = $('#detail');
  d.dataset.nodeId = String(id);
  d.dataset.loaded = 'false';
  d.querySelector('.text').textContent = '';
  renderDetailFromModel();
  draw();
  if (state.config.mode !== 'worker') {
    d.querySelector('.text').textContent = '(the text is shown on the worker\'s own dashboard)';
    return;
  }
  if (id < 0) {
    d.querySelector('.text').textContent = '(a node made from events: its text comes with the next reload)';
    return;
  }
  if (state.frozen) {
    d.querySelector('.text').textContent = '(a tree given by loadTree(): no text)';
    return;
  }
  api.get('/cache/node?id=' + id).then((n) => {
    if (state.selectedId !== id) return;
    d.dataset.loaded = 'true';
    d.querySelector('.text').textContent = n.text ?? `(token ids that do not decode: ${(n.token_ids ?? []).join(' ')})`;
    d.dataset.pinRef = String(n.pin_ref ?? '');
    renderDetailFromModel(n);
  }).catch((e) => {
    if (state.selectedId !== id) return;
    d.querySelector('.text').textContent = e.status === 404
      ? '(this node is gone: evicted, or split by a lookup; pick it again after the next reload)'
      : e.message;
  });
}

function renderDetailFromModel(server = null) {
  const d = $('#detail');
  const node = model.nodes.get(state.selectedId);
  d.querySelector('.empty').hidden = true;
  d.querySelector('.body').hidden = false;
  const dl = d.querySelector('dl');
  if (!node && !server) {
    dl.innerHTML = `<dt>node</dt><dd>#${escapeHtml(state.selectedId)} (no longer in the tree)</dd>`;
    return;
  }
  const n = node ?? {};
  const tokens = server?.tokens ?? n.tokens;
  const hashes = server?.block_hashes ?? n.hashes ?? [];
  const pinCounts = server?.pin_counts ?? n.pinCounts ?? [];
  const pin = node ? pinKind(node) : null;
  const tiers = server
    ? ['device', 'host', 'storage'].filter((t) => server[{ device: 'on_device', host: 'on_host', storage: 'in_storage' }[t]])
    : tierList(n);
  const age = node ? ((model.maxAccessMs - node.lastAccessMs) / 1000).toFixed(1) + ' s before the newest' : '';
  const rows = [
    ['node', `#${state.selectedId}${n.synthetic ? ' (from events)' : ''}`],
    ['parent', n.parent ? (n.parent === model.root ? 'root' : '#' + n.parent.id) : String(server?.parent ?? '')],
    ['tokens', `${fmt(tokens ?? 0)} (${fmt(hashes.length)} block${hashes.length === 1 ? '' : 's'})`],
    ['tiers', (tiers.join(', ') || 'none') + ((server?.loading ?? n.loading) ? ' (loading)' : '')],
    ['pins', `${pinCounts.join(' ') || '–'} (per page)` + (pin ? `; ${pin === 'below' ? 'pinned below' : pin}` : '')],
    ['pin_ref', String(server?.pin_ref ?? n.pinRef ?? 0)],
    ['request locks', String(server?.lock_ref ?? n.lockRef ?? 0)],
    ['tool session', (server?.session_protected ?? n.sessionProtected) ? 'protected' : 'no'],
    ['hits', fmt(server?.hit_count ?? n.hitCount ?? 0)],
    ['last access', `${fmt(server?.last_access_ms ?? n.lastAccessMs ?? 0)} ms${age ? ' (' + age + ')' : ''}`],
    ['subtree', node ? `${fmt(node.count)} nodes, ${fmt(node.weight)} pages` : ''],
  ];
  dl.innerHTML = rows.map(([k, v]) => `<dt>${k}</dt><dd>${escapeHtml(v)}</dd>`).join('');
  const shown = hashes.slice(0, 64).map(String);
  d.querySelector('.hashes').textContent = shown.join('\n') + (hashes.length > 64 ? `\n… ${hashes.length - 64} more` : '');
  if (node) {
    d.dataset.pinRef = String(server?.pin_ref ?? node.pinRef);
    d.dataset.ownPinned = String(ownPinnedBlocks(node));
  }
}

function showResult(action, ok, text) {
  const el = $('#action-result');
  el.hidden = false;
  el.dataset.status = ok ? 'ok' : 'error';
  el.dataset.action = action;
  el.textContent = `${action}: ${text}`;
}

async function act(action) {
  let path;
  let body;
  if (action === 'flush') {
    path = '/cache/flush';
    body = '{}';
  } else {
    const node = model.nodes.get(state.selectedId);
    if (!node) return showResult(action, false, 'select a node first');
    if (action === 'pin') {
      path = '/cache/pin';
      body = hashesBody(node.hashes);
    } else if (action === 'soft-pin') {
      path = '/cache/pin';
      body = hashesBody(node.hashes, { ttl_s: Math.max(1, Number($('#soft-ttl').value) || 300) });
    } else if (action === 'unpin') {
      path = '/cache/unpin';
      body = hashesBody(node.hashes);
    } else if (action === 'evict') {
      path = '/cache/evict';
      body = hashesBody(node.hashes, { descendants: true });
    }
  }
  $('#action-result').dataset.status = 'pending';
  try {
    const answer = await api.post(path, body);
    showResult(action, true, JSON.stringify(answer));
  } catch (e) {
    showResult(action, false, e.message);
  }
  // Pins and evictions may change no block the events name (a pin changes none): reload.
  await reloadTree();
  if (state.selectedId != null && model.nodes.has(state.selectedId) && state.config.mode === 'worker') {
    selectNode(state.selectedId);
  }
}

// A flush asks for a second click within three seconds.
function armFlush() {
  const b = $('#btn-flush');
  if (b.classList.contains('armed')) {
    b.classList.remove('armed');
    b.textContent = 'Flush cache';
    clearTimeout(b.timer);
    act('flush');
    return;
  }
  b.classList.add('armed');
  b.textContent = 'Click again to flush';
  b.timer = setTimeout(() => {
    b.classList.remove('armed');
    b.textContent = 'Flush cache';
  }, 3000);
}

// ---------------------------------------------------------------------------------------
// Gauges (worker)

let gauges = null;

function makeWorkerGauges() {
  const s = (key, label) => ({ key, label });
  return {
    device: new LineChart($('#gauge-device'), { title: 'Device pages', series: [s('used', 'used'), s('pinned', 'pinned'), s('evictable', 'evictable'), s('protected', 'protected')] }),
    host: new LineChart($('#gauge-host'), { title: 'Host pages', series: [s('used', 'used'), s('protected', 'protected (pins, sessions)'), s('evictable', 'evictable')] }),
    storage: new LineChart($('#gauge-storage'), { title: 'Storage pages', series: [s('stored', 'stored (known)')] }),
    evictions: new LineChart($('#gauge-evictions'), { title: 'Evictions', unit: 'pages/s', series: [s('device', 'device evicted'), s('demoted', 'device → host'), s('host', 'host evicted')] }),
    hits: new LineChart($('#gauge-hits'), { title: 'Hits', unit: 'tokens/s', series: [s('hit', 'cached prompt tokens'), s('prompt', 'prompt tokens')] }),
    requests: new LineChart($('#gauge-requests'), { title: 'Requests', series: [s('running', 'running'), s('waiting', 'waiting')] }),
    sessions: new LineChart($('#gauge-sessions'), { title: 'Tool sessions', dynamic: true, series: [] }),
    rates: new Rates(),
  };
}

async function pollWorkerGauges() {
  const [s, mtext] = await Promise.all([api.get('/cache/state'), api.text('/metrics').catch(() => null)]);
  const t = Date.now();
  const m = mtext ? parseMetrics(mtext) : new Map();
  const g = gauges;
  const dev = s.device ?? {};
  g.device.push(t, { used: dev.used_pages, pinned: dev.pinned_blocks, evictable: dev.evictable_pages, protected: dev.protected_pages });
  g.device.minMax = dev.capacity_pages ?? 1;
  // The pages' dtype and what a GB of them holds (8-bit pages: about twice BF16's tokens).
  if (dev.page_bytes > 0) {
    $('#kv-info').textContent = `KV ${s.kv_dtype ?? '?'} · ${dev.page_bytes.toLocaleString()} B/page · ` +
      `${(dev.tokens_per_gb ?? 0).toLocaleString()} tokens/GB`;
  }
  if (s.host) {
    g.host.push(t, { used: s.host.used_pages, protected: s.host.protected_pages, evictable: s.host.evictable_pages });
    g.host.minMax = s.host.capacity_pages ?? 1;
    g.host.setNote('');
  } else {
    g.host.push(t, { used: null, protected: null, evictable: null });
    g.host.setNote('no host tier (--enable-hierarchical-cache)');
  }
  if (s.storage) {
    g.storage.push(t, { stored: s.storage.stored_pages_known });
    g.storage.setNote(`backend: ${s.storage.backend}`);
  } else {
    g.storage.push(t, { stored: null });
    g.storage.setNote('no storage tier (--hicache-storage-backend)');
  }
  const ev = s.evictions ?? {};
  const hits = s.hits ?? {};
  const r = g.rates.next(t, {
    device: ev.evicted_pages_total, demoted: ev.demoted_pages_total, host: ev.host_evicted_pages_total,
    hit: hits.cached_prompt_tokens_total, prompt: hits.prompt_tokens_total,
  });
  g.evictions.push(t, { device: r.device, demoted: r.demoted, host: r.host });
  g.hits.push(t, { hit: r.hit, prompt: r.prompt });
  g.requests.push(t, { running: s.requests?.running, waiting: s.requests?.waiting });
  // Tool sessions by state, when the server reports them (strata_tool_sessions{state}).
  const sessions = {};
  for (const x of m.get('strata_tool_sessions') ?? []) {
    if (x.labels.state) sessions[x.labels.state.toLowerCase()] = (sessions[x.labels.state.toLowerCase()] ?? 0) + x.value;
  }
  g.sessions.push(t, sessions);
  g.sessions.setNote(m.has('strata_tool_sessions') ? '' : 'not reported by this server');
  for (const c of Object.values(g)) if (c instanceof LineChart) c.render();
  const el = $('#gauges');
  el.dataset.lastPoll = String(t);
  el.dataset.nodesCount = String(s.nodes_count ?? '');
}

// ---------------------------------------------------------------------------------------
// Router

let decisions = null;
let decisionRates = null;

function healthOf(w) {
  if (!w.joined) return ['joining', false];
  if (w.draining) return ['draining', false];
  if (!w.reachable) return ['unreachable', false];
  if (w.breaker && w.breaker !== 'closed') return ['breaker ' + w.breaker, false];
  return [w.eligible === false ? 'not eligible' : 'healthy', w.eligible !== false];
}

async function pollRouter() {
  const [list, mtext] = await Promise.all([api.get('/workers'), api.text('/metrics').catch(() => null)]);
  const workers = list.workers ?? [];
  state.workers = workers;
  const table = $('#workers');
  table.dataset.workerCount = String(workers.length);
  table.dataset.policy = list.policy ?? '';
  table.dataset.healthyCount = String(workers.filter((w) => healthOf(w)[1]).length);
  const rows = d3.select(table).select('tbody').selectAll('tr').data(workers, (w) => w.url).join('tr');
  rows.attr('data-url', (w) => w.url)
    .attr('data-healthy', (w) => String(healthOf(w)[1]))
    .attr('data-index-blocks', (w) => String(w.index_blocks ?? 0))
    .attr('data-sessions', (w) => String(w.router?.sessions ?? 0))
    .classed('selected', (w) => w.url === state.workerUrl)
    .on('click', (_, w) => selectWorker(w.url))
    .html((w) => {
      const [h, ok] = healthOf(w);
      const l = w.load ?? {};
      const cells = [
        escapeHtml(w.url), `<span class="${ok ? 'health-ok' : 'health-bad'}">${escapeHtml(h)}</span>`,
        (l.load_fraction ?? 0).toFixed(2), fmt(l.running ?? 0), fmt(l.waiting ?? 0),
        `${fmt(l.free_pages ?? 0)} / ${fmt(l.total_pages ?? 0)}`, fmt(w.index_blocks ?? 0),
        fmt(w.router?.sessions ?? 0), fmt(w.router?.requests ?? 0),
      ];
      return cells.map((c) => `<td>${c}</td>`).join('');
    });
  const select = $('#worker-select');
  const urls = workers.map((w) => w.url);
  if ([...select.options].map((o) => o.value).join('\n') !== urls.join('\n')) {
    select.textContent = '';
    for (const u of urls) select.append(new Option(u, u));
  }
  if (!state.workerUrl || !urls.includes(state.workerUrl)) {
    if (urls.length) selectWorker(urls[0]);
  } else {
    select.value = state.workerUrl;
  }
  if (mtext) {
    const m = parseMetrics(mtext);
    const byReason = {};
    for (const x of m.get('strata_router_decisions_total') ?? []) {
      const reason = x.labels.reason ?? 'unknown';
      byReason[reason] = (byReason[reason] ?? 0) + x.value;
    }
    const t = Date.now();
    decisions.push(t, decisionRates.next(t, byReason));
    decisions.render();
  }
  setConn('live');
}

function selectWorker(url) {
  if (state.workerUrl === url) return;
  state.workerUrl = url;
  $('#worker-select').value = url;
  $('#tree').dataset.worker = url;
  state.selectedId = null;
  state.focus = null;
  model.clear();
  draw();
  reloadTree();
}

// ---------------------------------------------------------------------------------------
// Admin key

function showAuth(message) {
  state.authBlocked = true;
  state.eventsAbort?.abort('auth');
  $('#auth').hidden = false;
  $('#auth-error').textContent = message ?? '';
  setConn('error', 'admin key needed');
  $('#btn-key').hidden = false;
  $('#auth-key').focus();
}

async function submitKey(ev) {
  ev.preventDefault();
  api.key = $('#auth-key').value.trim();
  $('#auth-error').textContent = '';
  try {
    await api.get(state.config.mode === 'router' ? '/workers' : '/cache/state');
    if (state.config.mode === 'router' && state.config.auth_required) {
      // The router's /workers is public: try a call that needs the key.
      const first = (await api.get('/workers')).workers?.[0];
      if (first) await api.get('/workers/cache_state?url=' + encodeURIComponent(first.url));
    }
  } catch (e) {
    $('#auth').hidden = false;
    $('#auth-error').textContent = e.status === 401 || e.status === 403 ? 'This key was refused.' : e.message;
    return;
  }
  $('#auth').hidden = true;
  state.authBlocked = false;
  start();
}

// ---------------------------------------------------------------------------------------
// Start

function every(ms, fn) {
  const tick = async () => {
    if (state.authBlocked) return setTimeout(tick, ms);
    try {
      await fn();
    } catch (e) {
      if (!(e instanceof ApiError && (e.status === 401 || e.status === 403))) setConn('error', e.message);
    }
    setTimeout(tick, ms);
  };
  tick();
}

function start() {
  if (state.started) {
    // After a new key: the loops are running; reconnect the stream and reload.
    if (state.config.mode === 'worker') followEvents();
    reloadTree();
    return;
  }
  state.started = true;
  if (state.config.mode === 'router') {
    decisions = new LineChart($('#gauge-decisions'), { title: 'Routing decisions', unit: 'per second, by reason', dynamic: true });
    decisionRates = new Rates();
    every(POLL_MS, pollRouter);
    every(ROUTER_TREE_POLL_MS, async () => {
      if (!state.frozen) await reloadTree();
    });
  } else {
    gauges = makeWorkerGauges();
    followEvents();
    every(POLL_MS, pollWorkerGauges);
    every(TREE_POLL_MS, async () => {
      if (!state.frozen && $('#conn').dataset.state === 'live') scheduleReload(0);
    });
  }
}

async function main() {
  $('#colour-mode').addEventListener('change', (e) => {
    state.colourMode = e.target.value;
    document.body.dataset.colour = state.colourMode;
    $('.heat-scale').hidden = state.colourMode === 'tier';
    draw();
  });
  $('#btn-flush').addEventListener('click', armFlush);
  $('#btn-pin').addEventListener('click', () => act('pin'));
  $('#btn-soft-pin').addEventListener('click', () => act('soft-pin'));
  $('#btn-unpin').addEventListener('click', () => act('unpin'));
  $('#btn-evict').addEventListener('click', () => act('evict'));
  $('#btn-zoom').addEventListener('click', () => state.selectedId != null && setFocus({ id: state.selectedId, skip: 0 }));
  $('#btn-key').addEventListener('click', () => showAuth(''));
  $('#auth form').addEventListener('submit', submitKey);
  $('#worker-select').addEventListener('change', (e) => selectWorker(e.target.value));
  new ResizeObserver(() => scheduleDraw()).observe($('#tree'));
  api.onAuthNeeded = (message) => {
    if (state.authBlocked) return;
    showAuth(api.key ? 'The key was refused: ' + message : 'This server needs its admin key.');
  };

  try {
    state.config = await api.get('/dashboard/config');
  } catch (e) {
    setConn('error', 'cannot read /dashboard/config: ' + e.message);
    return;
  }
  const c = state.config;
  document.body.dataset.mode = c.mode;
  document.title = `Strata ${c.mode} · ${c.model ?? ''}`;
  $('#server-info').textContent = `${c.mode} · ${c.model ?? ''} · page ${c.page_size ?? '?'} tokens` +
    (c.version ? ` · ${c.version}` : '');
  if (c.page_size > 0) model.pageSize = c.page_size;
  $('#btn-key').hidden = !c.auth_required;
  if (c.auth_required && !api.key) {
    showAuth('');
    return;
  }
  start();
}

// The test hook (tests/server/dashboard.test.mjs) and a console handle.
window.strataDashboard = {
  model,
  state,
  maxRects: MAX_RECTS,
  // Shows `nodes` (the "nodes" of /cache/state?detail=tree) and stops live updates.
  loadTree(nodes, { pageSize } = {}) {
    state.frozen = true;
    state.eventsAbort?.abort('frozen');
    setConn('paused', 'a tree given by loadTree(); reload the page for live data');
    state.focus = null;
    state.selectedId = null;
    const t0 = performance.now();
    model.loadState(nodes, pageSize ?? model.pageSize);
    const layout = draw();
    return { nodeCount: model.size, drawn: layout.drawn, aggregated: layout.aggregated, rects: layout.items.length,
      ms: performance.now() - t0 };
  },
  draw: () => {
    const l = draw();
    return { drawn: l.drawn, aggregated: l.aggregated, rects: l.items.length, total: l.total };
  },
  focus: (id, skip = 0) => setFocus(id == null ? null : { id, skip }),
  select: (id) => selectNode(id),
};

main();
