// Raw HTTP/1.1 over a plain TCP socket, for the black-box tests that must send bytes no
// HTTP client would (bad framings, pipelining, slow writers) and read exactly what the
// server sends back: RawConn records the bytes and the close, parseResponses() splits them
// into responses. Shared by tests/server/http_limits.test.mjs and tests/fuzz/fuzz_server.mjs.
import net from 'node:net';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const now = () => performance.now();

// A request line and headers that every server answers: GET /health.
export const GET_HEALTH = 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n';

// A POST with a JSON body and its Content-Length; `extra` is more header lines, each
// ending in CRLF.
export const postRaw = (path, body, extra = '') =>
  `POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n${extra}` +
  `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;

// Every RawConn socket still open, so that none outlives a suite even when a test fails.
const openSockets = new Set();

// Destroys every RawConn socket still open (for a suite's `after`).
export function destroyAllRawConns() {
  for (const s of openSockets) s.destroy();
  openSockets.clear();
}

// Parses the HTTP/1.1 responses at the start of `buf`: Content-Length and chunked bodies,
// and (once the connection is `closed`) a body that runs to the close. 1xx, 204 and 304
// answers have no body, nor have the first `heads` responses (answers to HEAD requests,
// RFC 9110 §9.3.2). Header names are lower-cased; a repeated header keeps its last value.
// Returns { responses: [{ status, headers, body }], rest (bytes not yet part of a complete
// response), bad (null, or what is wrong where a response should start: a status line that
// is not HTTP, or a chunk size that is not hex) }.
export function parseResponses(buf, closed, heads = 0) {
  const responses = [];
  let off = 0;
  while (off < buf.length) {
    const end = buf.indexOf('\r\n\r\n', off);
    if (end < 0) break;
    const lines = buf.subarray(off, end).toString('latin1').split('\r\n');
    const m = lines[0].match(/^HTTP\/1\.[01] (\d{3})/);
    if (!m) return { responses, rest: buf.length - off, bad: lines[0].slice(0, 120) };
    const status = Number(m[1]);
    const headers = {};
    for (const l of lines.slice(1)) {
      const i = l.indexOf(':');
      if (i > 0) headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim();
    }
    const start = end + 4;
    let body;
    let next;
    if (responses.length < heads || status === 204 || status === 304 || status < 200) {
      body = Buffer.alloc(0);
      next = start;
    } else if (/chunked/i.test(headers['transfer-encoding'] ?? '')) {
      const parts = [];
      let p = start;
      for (;;) {
        const eol = buf.indexOf('\r\n', p);
        if (eol < 0) break;
        const size = parseInt(buf.subarray(p, eol).toString('latin1'), 16);
        if (Number.isNaN(size)) return { responses, rest: buf.length - off, bad: 'bad chunk size' };
        if (size === 0) {
          const te = buf.indexOf('\r\n\r\n', eol);  // the end of the (empty) trailers
          if (te >= 0) next = te + 4;
          break;
        }
        if (buf.length < eol + 2 + size + 2) break;
        parts.push(buf.subarray(eol + 2, eol + 2 + size));
        p = eol + 2 + size + 2;
      }
      if (next === undefined) break;
      body = Buffer.concat(parts);
    } else if (headers['content-length'] !== undefined) {
      const n = Number(headers['content-length']);
      if (buf.length < start + n) break;
      body = buf.subarray(start, start + n);
      next = start + n;
    } else {
      if (!closed) break;  // the body runs to the close
      body = buf.subarray(start);
      next = buf.length;
    }
    responses.push({ status, headers, body: body.toString('utf8') });
    off = next;
  }
  return { responses, rest: buf.length - off, bad: null };
}

// A raw TCP connection to 127.0.0.1:port that records everything: the bytes received,
// whether and when the server closed it (FIN or RST: both are 'the server closed it'), and
// errors such as the client still writing. It never throws.
export class RawConn {
  constructor(port) {
    this.chunks = [];
    this.closed = false;  // closed by the server (or failed), not by destroy()
    this.closedAt = null;
    this.connectedAt = null;
    this.error = null;
    this.destroyedByUs = false;
    this.waiters = new Set();
    this.sock = net.connect({ host: '127.0.0.1', port });
    openSockets.add(this.sock);
    this.connected = new Promise((resolve) => {
      this.sock.once('connect', () => { this.connectedAt = now(); resolve(true); });
      this.sock.once('close', () => resolve(false));
    });
    this.sock.on('data', (d) => { this.chunks.push(d); this.poke(); });
    this.sock.on('error', (e) => { this.error = e; });
    this.sock.on('close', () => {
      openSockets.delete(this.sock);
      if (!this.destroyedByUs) { this.closed = true; this.closedAt = now(); }
      this.poke();
    });
  }

  // Every byte received so far, as one Buffer.
  get data() {
    if (this.chunks.length > 1) this.chunks = [Buffer.concat(this.chunks)];
    return this.chunks[0] ?? Buffer.alloc(0);
  }

  // The complete responses received so far (see parseResponses; `heads`: how many of the
  // requests sent first were HEAD requests).
  responses(heads = 0) { return parseResponses(this.data, this.closed, heads); }

  write(bytes) {
    if (!this.sock.destroyed) this.sock.write(bytes, () => { /* errors land in 'error' */ });
  }

  // Writes `bytes` in pieces with a pause after each, and stops as soon as the server has
  // answered or closed. For requests the server rejects part-way: node destroys a socket
  // on EPIPE / ECONNRESET, dropping an answer not yet read, so a client that kept writing
  // into a closed connection could lose the very answer under test.
  async writeInPieces(bytes, pieceSize, pauseMs) {
    const buf = Buffer.from(bytes);
    for (let off = 0; off < buf.length; off += pieceSize) {
      if (this.closed || this.chunks.length > 0) return;
      this.write(buf.subarray(off, off + pieceSize));
      await sleep(pauseMs);
    }
  }

  destroy() {
    if (!this.closed) this.destroyedByUs = true;
    this.sock.destroy();
    openSockets.delete(this.sock);
  }

  poke() { for (const w of this.waiters) w(); }

  // Resolves true as soon as pred() holds (checked on every event), false after ms.
  until(pred, ms) {
    if (pred()) return Promise.resolve(true);
    return new Promise((resolve) => {
      const check = () => {
        if (!pred()) return;
        finish(true);
      };
      const finish = (v) => { clearTimeout(timer); this.waiters.delete(check); resolve(v); };
      const timer = setTimeout(() => finish(pred()), ms);
      this.waiters.add(check);
    });
  }
}
