// The dashboard's model of a worker's radix tree, and the icicle layout that draws a
// bounded number of its nodes.
//
// The model holds every node (100,000 are fine): it is loaded from GET
// /cache/state?detail=tree and then follows the KV events (GET /cache/events) block by
// block until the next load. Events name blocks, not nodes, so a node the events create
// has no server id yet (a negative id here) and a store below the middle of a node splits
// it, as the server's tree does; a lookup splits the server's nodes without any event, so
// only a load makes the node count equal the server's nodes_count again (the dashboard
// loads after a burst of events, after an action and every few seconds).
//
// The layout never draws more than `maxRects` rectangles: siblings too thin to see (under
// `minPx`) and whatever the budget cannot hold are folded into one "N more" rectangle per
// parent, and levels beyond the width are hidden. Every node of the drawn subtree is
// either drawn or counted as aggregated: drawn + aggregated == total.

import { hashText } from './api.js';

export const TIER = Object.freeze({ DEVICE: 1, HOST: 2, STORAGE: 4 });
const MEDIUM_BIT = Object.freeze({ GPU: TIER.DEVICE, CPU_PINNED: TIER.HOST, DISK: TIER.STORAGE });
const TIER_NAME_BIT = Object.freeze({ device: TIER.DEVICE, host: TIER.HOST, storage: TIER.STORAGE });

// Leaves (most nodes) share one empty set until they get a child: see addChild().
const NO_CHILDREN = Object.freeze(new Set());

function addChild(parent, child) {
  if (parent.children === NO_CHILDREN) parent.children = new Set();
  parent.children.add(child);
  child.parent = parent;
}

function makeNode(id) {
  return {
    id,
    parent: null,
    children: NO_CHILDREN,
    tokens: 0,
    hashes: [],
    tiers: [], // per block: TIER bits
    lockRef: 0,
    pinRef: 0,
    pinCounts: [], // per page: pins (hard + soft)
    softPinnedBlocks: null, // pages with a soft pin, when the server reports it
    lastAccessMs: 0,
    hitCount: 0,
    loading: false,
    sessionProtected: false,
    evictable: false,
    synthetic: false, // made from events: no server id yet
    // Derived by ensureDerived(): pages of the subtree, nodes of the subtree, levels below.
    weight: 0,
    count: 0,
    height: 0,
  };
}

export function tierMask(node) {
  let m = 0;
  for (const t of node.tiers) m |= t;
  return m;
}

export function ownPinnedBlocks(node) {
  let n = 0;
  for (const c of node.pinCounts) if (c > 0) n++;
  return n;
}

export class TreeModel {
  constructor() {
    this.pageSize = 16;
    this.version = 0;
    this.clear();
  }

  clear() {
    this.root = makeNode(0);
    this.nodes = new Map(); // id -> node (the root excluded)
    this.byHash = new Map(); // block hash (decimal text) -> node
    this.nextSyntheticId = -1;
    this.desynced = false; // events that did not fit the model: a load is due
    this.touch();
  }

  get size() {
    return this.nodes.size;
  }

  touch() {
    this.version++;
    this.derivedVersion = -1;
  }

  // Replaces the model with the server's nodes (the "nodes" array of
  // /cache/state?detail=tree). Parents may come after their children.
  loadState(list, pageSize) {
    this.clear();
    if (pageSize > 0) this.pageSize = pageSize;
    const made = [];
    const parentIds = [];
    for (const n of list) {
      const node = makeNode(n.id);
      node.tokens = n.tokens ?? 0;
      node.hashes = (n.block_hashes ?? []).map(hashText);
      let mask = 0;
      if (Array.isArray(n.tiers)) {
        for (const t of n.tiers) mask |= TIER_NAME_BIT[t] ?? 0;
      } else {
        if (n.on_device) mask |= TIER.DEVICE;
        if (n.on_host) mask |= TIER.HOST;
        if (n.in_storage) mask |= TIER.STORAGE;
      }
      node.tiers = new Array(node.hashes.length).fill(mask);
      node.lockRef = n.lock_ref ?? 0;
      node.pinRef = n.pin_ref ?? 0;
      node.pinCounts = n.pin_counts ?? [];
      node.softPinnedBlocks = n.soft_pinned_blocks ?? null;
      node.lastAccessMs = n.last_access_ms ?? 0;
      node.hitCount = n.hit_count ?? 0;
      node.loading = !!n.loading;
      node.sessionProtected = !!n.session_protected;
      node.evictable = !!n.evictable;
      made.push(node);
      parentIds.push(n.parent ?? 0);
      this.nodes.set(node.id, node);
      for (const h of node.hashes) this.byHash.set(h, node);
    }
    for (let i = 0; i < made.length; i++) {
      const node = made[i];
      const parentId = parentIds[i];
      let parent = parentId === 0 ? this.root : this.nodes.get(parentId);
      if (!parent) {
        // A parent missing from the snapshot: keep the node visible under the root.
        this.desynced = true;
        parent = this.root;
      }
      addChild(parent, node);
    }
    this.touch();
  }

  // Applies one batch of KV events (the "events" array of a /cache/events message).
  // Returns the blocks stored and removed and whether the cache was cleared.
  applyEvents(events) {
    const out = { stored: 0, removed: 0, cleared: false };
    for (const e of events) {
      if (e.type === 'BlockStored') {
        out.stored += e.block_hashes.length;
        this.store(e);
      } else if (e.type === 'BlockRemoved') {
        out.removed += e.block_hashes.length;
        this.remove(e.block_hashes.map(hashText), MEDIUM_BIT[e.medium] ?? TIER.DEVICE);
      } else if (e.type === 'AllBlocksCleared') {
        out.cleared = true;
        this.clear();
      }
    }
    if (events.length > 0) this.touch();
    return out;
  }

  store(e) {
    const bit = MEDIUM_BIT[e.medium] ?? TIER.DEVICE;
    const hashes = e.block_hashes.map(hashText);
    const blockSize = e.block_size > 0 ? e.block_size : this.pageSize;
    let parentHash = e.parent_block_hash == null ? null : hashText(e.parent_block_hash);
    let i = 0;
    while (i < hashes.length) {
      const known = this.byHash.get(hashes[i]);
      if (known) {
        known.tiers[known.hashes.indexOf(hashes[i])] |= bit;
        parentHash = hashes[i];
        i++;
        continue;
      }
      let j = i;
      while (j < hashes.length && !this.byHash.has(hashes[j])) j++;
      const parent = this.attachPoint(parentHash);
      const node = makeNode(this.nextSyntheticId--);
      node.synthetic = true;
      node.hashes = hashes.slice(i, j);
      node.tokens = (j - i) * blockSize;
      node.tiers = new Array(j - i).fill(bit);
      node.pinCounts = new Array(j - i).fill(0);
      node.lastAccessMs = this.maxAccessMs ?? 0;
      node.evictable = true;
      addChild(parent, node);
      this.nodes.set(node.id, node);
      for (const h of node.hashes) this.byHash.set(h, node);
      parentHash = hashes[j - 1];
      i = j;
    }
  }

  // The node new blocks after `parentHash` hang from: the one that ends with it, split
  // there when the block is in its middle; the root for a first block (or, out of sync,
  // for an unknown parent).
  attachPoint(parentHash) {
    if (parentHash == null) return this.root;
    const node = this.byHash.get(parentHash);
    if (!node) {
      this.desynced = true;
      return this.root;
    }
    const at = node.hashes.indexOf(parentHash) + 1;
    return at < node.hashes.length ? this.split(node, at) : node;
  }

  // Moves blocks [0, at) of `node` into a new parent of it and returns that parent. As in
  // the server's tree, the node keeps its id, its tail and its children; the upper part is
  // the new node.
  split(node, at) {
    const head = makeNode(this.nextSyntheticId--);
    head.synthetic = true;
    const perBlock = node.hashes.length > 0 ? node.tokens / node.hashes.length : this.pageSize;
    head.hashes = node.hashes.slice(0, at);
    head.tiers = node.tiers.slice(0, at);
    head.pinCounts = node.pinCounts.slice(0, at);
    head.tokens = Math.round(perBlock * at);
    for (const k of ['lockRef', 'pinRef', 'lastAccessMs', 'hitCount', 'loading', 'sessionProtected', 'evictable']) {
      head[k] = node[k];
    }
    node.hashes = node.hashes.slice(at);
    node.tiers = node.tiers.slice(at);
    node.pinCounts = node.pinCounts.slice(at);
    node.tokens -= head.tokens;
    const parent = node.parent;
    parent.children.delete(node);
    addChild(parent, head);
    addChild(head, node);
    this.nodes.set(head.id, head);
    for (const h of head.hashes) this.byHash.set(h, head);
    return head;
  }

  remove(hashes, bit) {
    const touched = new Set();
    for (const h of hashes) {
      const node = this.byHash.get(h);
      if (!node) continue;
      node.tiers[node.hashes.indexOf(h)] &= ~bit;
      touched.add(node);
    }
    for (const node of touched) {
      let keep = node.tiers.length;
      while (keep > 0 && node.tiers[keep - 1] === 0) keep--;
        if (node.tiers.slice(0, keep).some((t) => t === 0)) this.desynced = true; // a hole
      if (keep === node.tiers.length) continue;
      if (keep > 0 && node.children.size === 0) {
        // The tail of a leaf left every tier: the server split it first (no event).
        for (const h of node.hashes.slice(keep)) this.byHash.delete(h);
        node.tokens = Math.round((node.tokens / node.hashes.length) * keep);
        node.hashes = node.hashes.slice(0, keep);
        node.tiers = node.tiers.slice(0, keep);
        node.pinCounts = node.pinCounts.slice(0, keep);
      } else if (keep === 0) {
        this.dropNode(node);
      } else {
        this.desynced = true;
      }
    }
  }

  dropNode(node) {
    if (node.children.size > 0) {
      // The server removes leaves; children left behind mean the model drifted.
      this.desynced = true;
      for (const c of node.children) addChild(node.parent, c);
    }
    node.parent.children.delete(node);
    this.nodes.delete(node.id);
    for (const h of node.hashes) if (this.byHash.get(h) === node) this.byHash.delete(h);
  }

  pages(node) {
    return node === this.root ? 0 : Math.max(1, Math.ceil(node.tokens / this.pageSize));
  }

  // Subtree pages, node counts and heights, and the ranges the colour scales need.
  ensureDerived() {
    if (this.derivedVersion === this.version) return;
    const order = [];
    const stack = [this.root];
    while (stack.length > 0) {
      const n = stack.pop();
      order.push(n);
      for (const c of n.children) stack.push(c);
    }
    let maxHits = 0;
    let maxAccess = 0;
    let minAccess = Infinity;
    for (let i = order.length - 1; i >= 0; i--) {
      const n = order[i];
      let weight = this.pages(n);
      let count = n === this.root ? 0 : 1;
      let height = 0;
      for (const c of n.children) {
        weight += c.weight;
        count += c.count;
        if (c.height + 1 > height) height = c.height + 1;
      }
      n.weight = weight;
      n.count = count;
      n.height = height;
      if (n !== this.root) {
        if (n.hitCount > maxHits) maxHits = n.hitCount;
        if (n.lastAccessMs > maxAccess) maxAccess = n.lastAccessMs;
        if (n.lastAccessMs < minAccess) minAccess = n.lastAccessMs;
      }
    }
    this.maxHits = maxHits;
    this.maxAccessMs = maxAccess;
    this.minAccessMs = minAccess === Infinity ? 0 : minAccess;
    this.derivedVersion = this.version;
  }
}

function sortedChildren(node) {
  return Array.from(node.children).sort((a, b) => b.weight - a.weight || a.id - b.id);
}

// Lays the subtree of `focus` ({id, skip}: start at node `id`, leaving out its `skip`
// largest children; null: the whole tree) out as an icicle: depth along x, pages along y.
// Returns {items, drawn, aggregated, total, levels, colW}; an item is
//   {kind: 'node', node, x0, y0, x1, y1, depth, deeper}    (deeper: children hidden by depth)
//   {kind: 'more', parent, skip, siblings, nodes, pages, x0, y0, x1, y1, depth}
export function layoutIcicle(model, focus, width, height, { maxRects = 2500, minPx = 1, minColPx = 72 } = {}) {
  model.ensureDerived();
  const focusNode = (focus && model.nodes.get(focus.id)) || model.root;
  const skip = focus && (focusNode !== model.root || focus.id === 0) ? (focus.skip ?? 0) : 0;
  const fromRoot = focusNode === model.root;
  const wanted = fromRoot ? focusNode.height : focusNode.height + 1;
  const levels = Math.max(1, Math.min(wanted, Math.floor(width / minColPx)));
  const colW = width / levels;
  const items = [];
  const queue = [];
  let drawn = 0;
  let aggregated = 0;

  // Places `list` (sorted, largest first) in [y0, y1] at column `depth`, `scale` px a page.
  const place = (parentItem, parent, list, skipped, y0, scale, depth) => {
    if (list.length === 0) return;
    if (depth >= levels) {
      for (const c of list) aggregated += c.count;
      if (parentItem) parentItem.deeper = true;
      return;
    }
    let y = y0;
    for (let i = 0; i < list.length; i++) {
      const c = list[i];
      const h = c.weight * scale;
      const room = maxRects - items.length;
      const last = i === list.length - 1;
      if (h < minPx || room <= (last ? 0 : 1)) {
        let nodes = 0;
        let pages = 0;
        for (let j = i; j < list.length; j++) {
          nodes += list[j].count;
          pages += list[j].weight;
        }
        aggregated += nodes;
        // A fold thinner than a pixel is not drawn (it could not be seen or clicked).
        if (items.length < maxRects && pages * scale >= minPx) {
          items.push({ kind: 'more', parent, skip: skipped + i, siblings: list.length - i, nodes, pages,
            x0: depth * colW, x1: (depth + 1) * colW, y0: y, y1: y + pages * scale, depth });
        }
        return;
      }
      const item = { kind: 'node', node: c, x0: depth * colW, x1: (depth + 1) * colW, y0: y, y1: y + h, depth,
        deeper: false };
      items.push(item);
      queue.push(item);
      drawn++;
      y += h;
    }
  };

  // The focus's children, less the `skip` largest (not shown, not counted); the rest
  // scaled to fill the height when some were skipped.
  const kids = sortedChildren(focusNode);
  const rest = skip > 0 ? kids.slice(skip) : kids;
  let total = fromRoot ? model.size : focusNode.count;
  for (let i = 0; i < Math.min(skip, kids.length); i++) total -= kids[i].count;
  const restPages = rest.reduce((s, c) => s + c.weight, 0);
  if (fromRoot) {
    place(null, model.root, rest, skip, 0, restPages > 0 ? height / restPages : 0, 0);
  } else {
    const item = { kind: 'node', node: focusNode, x0: 0, x1: colW, y0: 0, y1: height, depth: 0, deeper: false,
      skip };
    items.push(item);
    drawn++;
    const scale = skip > 0 ? (restPages > 0 ? height / restPages : 0) : height / focusNode.weight;
    place(item, focusNode, rest, skip, 0, scale, 1);
  }
  for (let qi = 0; qi < queue.length; qi++) {
    const it = queue[qi];
    const n = it.node;
    if (n.children.size === 0) continue;
    place(it, n, sortedChildren(n), 0, it.y0, (it.y1 - it.y0) / n.weight, it.depth + 1);
  }
  return { items, drawn, aggregated, total, levels, colW, focusNode, skip };
}
