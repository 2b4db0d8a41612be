// How the dashboard talks to the server: JSON whose 64-bit integers (block hashes) stay
// exact, the admin key (kept in sessionStorage for this tab only), and the server-sent
// events of GET /cache/events read through fetch() so that the Authorization header can be
// sent (EventSource cannot send one).

const KEY_STORAGE = 'strata-dashboard-admin-key';

export class ApiError extends Error {
  constructor(status, message, body = null) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

// JSON.parse, except that integers beyond 2^53 (block hashes are signed int64) become
// decimal strings instead of rounded numbers. Strings are matched first so that digits
// inside them (a node's detokenized text) are left alone.
const JSON_TOKENS = /"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?/g;
export function parseExactJson(text) {
  return JSON.parse(text.replace(JSON_TOKENS, (m) => {
    if (m.length < 16 || m.charCodeAt(0) === 34 || /[.eE]/.test(m)) return m;
    return Number.isSafeInteger(Number(m)) ? m : `"${m}"`;
  }));
}

// A block hash as the decimal text the server wrote: exact both ways.
export function hashText(h) {
  return typeof h === 'string' ? h : String(h);
}

// A JSON body whose "block_hashes" go out as bare integers, exactly as they came in.
export function hashesBody(hashes, extra = {}) {
  const rest = JSON.stringify(extra).slice(1, -1);
  return `{"block_hashes":[${hashes.map(hashText).join(',')}]${rest ? ',' + rest : ''}}`;
}

export class Api {
  constructor() {
    this.onAuthNeeded = () => {};
  }

  get key() {
    return sessionStorage.getItem(KEY_STORAGE) ?? '';
  }

  set key(value) {
    if (value) sessionStorage.setItem(KEY_STORAGE, value);
    else sessionStorage.removeItem(KEY_STORAGE);
  }

  headers(extra = {}) {
    const h = { ...extra };
    if (this.key) h.authorization = 'Bearer ' + this.key;
    return h;
  }

  async request(method, path, body, { signal } = {}) {
    const init = { method, headers: this.headers(), signal };
    if (body !== undefined) {
      init.headers['content-type'] = 'application/json';
      init.body = typeof body === 'string' ? body : JSON.stringify(body);
    }
    const r = await fetch(path, init);
    const text = await r.text();
    let json = null;
    try {
      json = text ? parseExactJson(text) : null;
    } catch {
      json = null;
    }
    if (!r.ok) {
      const message = json?.error?.message ?? json?.message ?? (text.slice(0, 300) || r.statusText);
      if (r.status === 401 || r.status === 403) this.onAuthNeeded(message);
      throw new ApiError(r.status, `${method} ${path}: ${r.status} ${message}`, json);
    }
    return json;
  }

  get(path, opts) {
    return this.request('GET', path, undefined, opts);
  }

  post(path, body, opts) {
    return this.request('POST', path, body, opts);
  }

  async text(path) {
    const r = await fetch(path, { headers: this.headers() });
    if (!r.ok) throw new ApiError(r.status, `GET ${path}: ${r.status}`);
    return r.text();
  }

  // Reads a server-sent-events stream until it ends, calling onMessage({event, data}) per
  // message (comments such as ": keepalive" are skipped). Resolves when the server closes
  // the stream; rejects on a network error, a non-2xx answer or an abort.
  async stream(path, onMessage, signal) {
    const r = await fetch(path, { headers: this.headers({ accept: 'text/event-stream' }), signal });
    if (!r.ok) {
      const text = await r.text().catch(() => '');
      if (r.status === 401 || r.status === 403) this.onAuthNeeded(text);
      throw new ApiError(r.status, `GET ${path}: ${r.status} ${text.slice(0, 300)}`);
    }
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      // Messages end with a blank line; CRLF, LF and CR line ends are all allowed.
      for (;;) {
        const m = /\r\n\r\n|\n\n|\r\r/.exec(buffer);
        if (!m) break;
        const block = buffer.slice(0, m.index);
        buffer = buffer.slice(m.index + m[0].length);
        let event = 'message';
        const data = [];
        for (const line of block.split(/\r\n|\n|\r/)) {
          if (line === '' || line.startsWith(':')) continue;
          const colon = line.indexOf(':');
          const field = colon < 0 ? line : line.slice(0, colon);
          let value = colon < 0 ? '' : line.slice(colon + 1);
          if (value.startsWith(' ')) value = value.slice(1);
          if (field === 'event') event = value;
          else if (field === 'data') data.push(value);
        }
        if (data.length > 0 || event !== 'message') onMessage({ event, data: data.join('\n') });
      }
    }
  }
}

// Prometheus text exposition -> Map(name -> [{labels, value}]).
export function parseMetrics(text) {
  const out = new Map();
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    if (m[2]) {
      for (const l of m[2].matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) {
        labels[l[1]] = l[2].replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
      }
    }
    if (!out.has(m[1])) out.set(m[1], []);
    out.get(m[1]).push({ labels, value: Number(m[3]) });
  }
  return out;
}
