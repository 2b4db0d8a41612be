// Draws a layoutIcicle() result into an SVG with d3 (the global from /dashboard/d3.min.js):
// one rectangle per item, keyed by node id so that an update moves rectangles instead of
// rebuilding them; marks for locks and tool-session protection; labels where they fit; a
// tooltip on hover. Clicks and double clicks go back to the page through callbacks.

import { TIER, tierMask, ownPinnedBlocks } from './tree.js';

const d3 = globalThis.d3;

export function tierName(node) {
  if (node.loading) return 'loading';
  const m = tierMask(node);
  if (m & TIER.DEVICE) return 'device';
  if (m & TIER.HOST) return 'host';
  if (m & TIER.STORAGE) return 'storage';
  return 'none';
}

export function tierList(node) {
  const m = tierMask(node);
  const out = [];
  if (m & TIER.DEVICE) out.push('device');
  if (m & TIER.HOST) out.push('host');
  if (m & TIER.STORAGE) out.push('storage');
  return out;
}

// Pins of a node's own pages: 'hard', 'soft' (every pinned page has a soft pin, when the
// server reports soft pins per node), or null; 'below' when only descendants are pinned.
export function pinKind(node) {
  const own = ownPinnedBlocks(node);
  if (own > 0) return node.softPinnedBlocks != null && node.softPinnedBlocks >= own ? 'soft' : 'hard';
  return node.pinRef > 0 ? 'below' : null;
}

const fmt = d3.format(',');

function escapeHtml(s) {
  return String(s).replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c]);
}

export class IcicleView {
  // container: the #tree element; callbacks: onSelect(node), onFocus({id, skip}).
  constructor(container, tooltip, { onSelect, onFocus }) {
    this.container = container;
    this.tooltip = tooltip;
    this.onSelect = onSelect;
    this.onFocus = onFocus;
    this.svg = d3.select(container).append('svg').attr('class', 'icicle');
    this.gRects = this.svg.append('g').attr('class', 'rects');
    this.gMarks = this.svg.append('g').attr('class', 'marks');
    this.gLabels = this.svg.append('g').attr('class', 'labels');
    this.byKey = new Map();
    this.heat = d3.scaleSequential(d3.interpolateYlOrRd);

    const itemOf = (ev) => this.byKey.get(ev.target?.dataset?.key);
    this.svg.on('mousemove', (ev) => {
      const it = itemOf(ev);
      if (!it) return this.hideTooltip();
      this.showTooltip(it, ev);
    });
    this.svg.on('mouseleave', () => this.hideTooltip());
    this.svg.on('click', (ev) => {
      const it = itemOf(ev);
      if (!it) return;
      if (it.kind === 'more') this.onFocus({ id: it.parent.id, skip: it.skip });
      else this.onSelect(it.node);
    });
    this.svg.on('dblclick', (ev) => {
      const it = itemOf(ev);
      if (it?.kind === 'node') this.onFocus({ id: it.node.id, skip: 0 });
    });
  }

  size() {
    return { width: Math.max(200, this.container.clientWidth), height: Math.max(120, this.container.clientHeight) };
  }

  fill(it, model, mode) {
    if (it.kind === 'more') return null;
    const n = it.node;
    if (mode === 'hits') {
      const max = Math.log1p(model.maxHits || 1);
      return this.heat(0.08 + 0.92 * (Math.log1p(n.hitCount) / max));
    }
    if (mode === 'recency') {
      const span = Math.max(1, model.maxAccessMs - model.minAccessMs);
      return this.heat(0.08 + 0.92 * ((n.lastAccessMs - model.minAccessMs) / span));
    }
    return null; // tier colours come from the CSS classes
  }

  render(layout, model, { mode, selectedId }) {
    this.model = model;
    const { width, height } = this.size();
    this.svg.attr('width', width).attr('height', height).attr('viewBox', `0 0 ${width} ${height}`);
    this.byKey.clear();
    for (const it of layout.items) {
      it.key = it.kind === 'node' ? 'n' + it.node.id : `m${it.parent.id}:${it.depth}`;
      this.byKey.set(it.key, it);
    }
    const cls = (it) => {
      if (it.kind === 'more') return 'cell more';
      const n = it.node;
      const c = ['cell', 'node', 'tier-' + tierName(n)];
      const pin = pinKind(n);
      if (pin) c.push('pin-' + pin);
      if (n.lockRef > 0) c.push('locked');
      if (n.sessionProtected) c.push('protected');
      if (it.deeper) c.push('deeper');
      if (n.id === selectedId) c.push('selected');
      return c.join(' ');
    };
    const w = (it) => Math.max(0, it.x1 - it.x0 - 1);
    const h = (it) => Math.max(0.5, it.y1 - it.y0 - (it.y1 - it.y0 > 3 ? 1 : 0));
    this.gRects
      .selectAll('rect')
      .data(layout.items, (it) => it.key)
      .join('rect')
      .attr('data-key', (it) => it.key)
      .attr('data-node-id', (it) => (it.kind === 'node' ? it.node.id : null))
      .attr('data-kind', (it) => it.kind)
      .attr('class', cls)
      .attr('x', (it) => it.x0)
      .attr('y', (it) => it.y0)
      .attr('width', w)
      .attr('height', h)
      .style('fill', (it) => this.fill(it, model, mode));

    // Request locks (a bar on the left edge) and tool-session protection (right edge); the
    // selection is an outline of its own so that the node's pin outline stays visible.
    const marks = [];
    for (const it of layout.items) {
      if (it.kind === 'node' && it.node.id === selectedId) marks.push({ it, kind: 'selected', x: it.x0 - 1 });
      if (it.kind !== 'node' || it.y1 - it.y0 < 2) continue;
      if (it.node.lockRef > 0) marks.push({ it, kind: 'lock', x: it.x0 });
      if (it.node.sessionProtected) marks.push({ it, kind: 'session', x: it.x1 - 5 });
      if (it.deeper) marks.push({ it, kind: 'deeper', x: it.x1 - 9 });
      // Also held by a slower tier (a device node backed up on the host): a strip below.
      const m = tierMask(it.node);
      if (mode === 'tier' && it.y1 - it.y0 >= 8 && (m & TIER.DEVICE) && (m & (TIER.HOST | TIER.STORAGE))) {
        marks.push({ it, kind: m & TIER.HOST ? 'copy-host' : 'copy-storage', x: it.x0 + 4 });
      }
    }
    this.gMarks
      .selectAll('rect')
      .data(marks, (m) => m.it.key + m.kind)
      .join('rect')
      .attr('class', (m) => 'mark mark-' + m.kind)
      .attr('x', (m) => m.x)
      .attr('width', (m) => {
        if (m.kind === 'selected') return w(m.it) + 2;
        return m.kind.startsWith('copy') ? Math.max(0, w(m.it) - 8) : 4;
      })
      .attr('y', (m) => {
        if (m.kind === 'selected') return m.it.y0 - 1;
        return m.kind.startsWith('copy') ? m.it.y0 + h(m.it) - 3 : m.it.y0;
      })
      .attr('height', (m) => {
        if (m.kind === 'selected') return h(m.it) + 2;
        return m.kind.startsWith('copy') ? 3 : h(m.it);
      });

    const labelled = layout.items.filter((it) => it.y1 - it.y0 >= 14 && it.x1 - it.x0 >= 40);
    this.gLabels
      .selectAll('text')
      .data(labelled, (it) => it.key)
      .join('text')
      .attr('x', (it) => it.x0 + 6)
      .attr('y', (it) => it.y0 + Math.min(15, (it.y1 - it.y0) / 2 + 4))
      .text((it) => {
        const max = Math.floor((it.x1 - it.x0 - 10) / 6.5);
        const s = it.kind === 'more'
          ? `${fmt(it.siblings)} more (${fmt(it.nodes)} nodes)`
          : `${it.node.synthetic ? 'new' : '#' + it.node.id} · ${fmt(it.node.tokens)} tok` +
            (it.node.hitCount ? ` · ${fmt(it.node.hitCount)} hit${it.node.hitCount === 1 ? '' : 's'}` : '');
        return s.length > max ? s.slice(0, Math.max(0, max - 1)) + '…' : s;
      });
  }

  showTooltip(it, ev) {
    let html;
    if (it.kind === 'more') {
      html = `<b>${fmt(it.siblings)} more siblings</b><br>${fmt(it.nodes)} nodes, ${fmt(it.pages)} pages` +
        '<br><i>click to show them</i>';
    } else {
      const n = it.node;
      const pin = pinKind(n);
      const age = this.model ? (this.model.maxAccessMs - n.lastAccessMs) / 1000 : 0;
      html = `<b>${n.synthetic ? 'new node (from events)' : 'node #' + n.id}</b>` +
        `<br>${fmt(n.tokens)} tokens, ${fmt(n.hashes.length)} block${n.hashes.length === 1 ? '' : 's'}` +
        `<br>tiers: ${tierList(n).join(', ') || 'none'}${n.loading ? ' (loading)' : ''}` +
        `<br>hits: ${fmt(n.hitCount)}, last access ${age.toFixed(1)} s before the newest` +
        (pin ? `<br>pins: ${pin === 'below' ? 'below this node' : pin} (pin_ref ${n.pinRef})` : '') +
        (n.lockRef > 0 ? `<br>locked by ${n.lockRef} request(s)` : '') +
        (n.sessionProtected ? '<br>protected by a tool session' : '') +
        `<br>subtree: ${fmt(n.count)} nodes, ${fmt(n.weight)} pages` +
        (it.deeper ? '<br><i>deeper levels hidden: double-click to zoom</i>' : '');
    }
    const t = this.tooltip;
    t.innerHTML = html;
    t.hidden = false;
    const pad = 14;
    const r = t.getBoundingClientRect();
    let x = ev.clientX + pad;
    let y = ev.clientY + pad;
    if (x + r.width > window.innerWidth) x = ev.clientX - r.width - pad;
    if (y + r.height > window.innerHeight) y = ev.clientY - r.height - pad;
    t.style.left = `${Math.max(0, x)}px`;
    t.style.top = `${Math.max(0, y)}px`;
  }

  hideTooltip() {
    this.tooltip.hidden = true;
  }
}

export { escapeHtml };
