// The Kubernetes manifests of deploy/kubernetes, checked offline (no cluster runs here):
// every object against the Kubernetes API's schemas (the npm package kubernetes-models, the
// API's OpenAPI definitions compiled to validators) and the InferencePool against the
// fields of the Gateway API Inference Extension's v1 CRD; then what ties them together
// (selectors, ports, probes, the router's workers file, the drain's timing); then the
// workers and a router start from the manifests' own commands, as processes, and answer.
// Run by CTest: node --test tests/deploy/manifests.test.mjs
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import net from 'node:net';
import { readdirSync, readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import { spawn, spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import { tinyQwen3Model, waitFor, STRATA, SOURCE_DIR, WORK_DIR } from '../server/server_harness.mjs';

const require = createRequire(path.join(SOURCE_DIR, 'tools/js/package.json'));
// (kubernetes-models is ES modules only: imported by path.)
const modelsUrl = (sub) =>
  pathToFileURL(path.join(SOURCE_DIR, 'tools/js/node_modules/kubernetes-models', sub, 'index.js')).href;
const YAML = require('yaml');
const core = await import(modelsUrl('v1'));
const apps = await import(modelsUrl('apps/v1'));

const DIR = path.join(SOURCE_DIR, 'deploy/kubernetes');
const objects = readdirSync(DIR).filter((f) => f.endsWith('.yaml')).sort().flatMap((f) =>
  YAML.parseAllDocuments(readFileSync(path.join(DIR, f), 'utf8')).map((d) => {
    assert.equal(d.errors.length, 0, `${f}: ${d.errors.join('; ')}`);
    return { file: f, obj: d.toJS() };
  }));
const find = (kind, name) => {
  const o = objects.find((x) => x.obj.kind === kind && x.obj.metadata.name === name);
  assert.ok(o, `no ${kind} ${name} in deploy/kubernetes`);
  return o.obj;
};

// The InferencePool's v1 schema, written from the fields of the extension's CRD
// (config/crd/bases/inference.networking.k8s.io_inferencepools.yaml): the required ones,
// their types, ranges and enums, and no field the CRD does not have.
function checkInferencePool(o) {
  const errors = [];
  const fail = (m) => errors.push(m);
  const only = (obj, keys, where) => {
    for (const k of Object.keys(obj ?? {})) if (!keys.includes(k)) fail(`${where}.${k} is not a field of the CRD`);
  };
  const port = (p, where) => {
    if (!Number.isInteger(p?.number) || p.number < 1 || p.number > 65535) fail(`${where}.number must be in [1, 65535]`);
    only(p, ['number'], where);
  };
  if (o.apiVersion !== 'inference.networking.k8s.io/v1') fail(`apiVersion ${o.apiVersion}`);
  only(o, ['apiVersion', 'kind', 'metadata', 'spec', 'status'], '');
  const s = o.spec;
  if (!s || typeof s !== 'object') return ['spec is required'];
  only(s, ['selector', 'targetPorts', 'appProtocol', 'endpointPickerRef'], 'spec');
  const labels = s.selector?.matchLabels;
  if (!labels || typeof labels !== 'object' || Object.keys(labels).length < 1 || Object.keys(labels).length > 64) {
    fail('spec.selector.matchLabels must hold 1 to 64 labels');
  }
  only(s.selector, ['matchLabels'], 'spec.selector');
  for (const v of Object.values(labels ?? {})) {
    if (typeof v !== 'string' || v.length > 63 || !/^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/.test(v)) fail(`label value ${v}`);
  }
  if (!Array.isArray(s.targetPorts) || s.targetPorts.length < 1 || s.targetPorts.length > 8) {
    fail('spec.targetPorts must hold 1 to 8 ports');
  } else {
    s.targetPorts.forEach((p, i) => port(p, `spec.targetPorts[${i}]`));
    if (new Set(s.targetPorts.map((p) => p.number)).size !== s.targetPorts.length) fail('port number must be unique');
  }
  if (s.appProtocol !== undefined && !['http', 'kubernetes.io/h2c'].includes(s.appProtocol)) fail('spec.appProtocol');
  const ref = s.endpointPickerRef;
  if (ref !== undefined) {
    only(ref, ['group', 'kind', 'name', 'port', 'failureMode'], 'spec.endpointPickerRef');
    if (typeof ref.name !== 'string' || ref.name.length < 1 || ref.name.length > 253) fail('spec.endpointPickerRef.name is required');
    if ((ref.kind ?? 'Service') === 'Service' && ref.port === undefined) {
      fail("port is required when kind is 'Service' or unspecified (defaults to 'Service')");
    }
    if (ref.port !== undefined) port(ref.port, 'spec.endpointPickerRef.port');
    if (ref.failureMode !== undefined && !['FailOpen', 'FailClose'].includes(ref.failureMode)) fail('failureMode');
  }
  return errors;
}

const MODELS = {
  PersistentVolumeClaim: core.PersistentVolumeClaim, Secret: core.Secret, Service: core.Service,
  ConfigMap: core.ConfigMap, StatefulSet: apps.StatefulSet, Deployment: apps.Deployment,
};

function validate(o) {
  if (o.kind === 'InferencePool') return checkInferencePool(o);
  const Model = MODELS[o.kind];
  if (!Model) return [`no schema for kind ${o.kind}`];
  try {
    new Model(o).validate();
    return [];
  } catch (e) {
    return [e.message];
  }
}

test('every object validates against the Kubernetes schemas (and the InferencePool CRD\'s fields)', () => {
  assert.ok(objects.length >= 9, `${objects.length} objects`);
  for (const { file, obj } of objects) {
    assert.deepEqual(validate(obj), [], `${file}: ${obj.kind} ${obj.metadata?.name}`);
  }
});

test('the validators refuse what is wrong (they are not a no-op)', () => {
  const sts = structuredClone(find('StatefulSet', 'strata-worker'));
  sts.spec.template.spec.containers[0].ports[0].containerPort = 'http';
  assert.match(validate(sts).join(), /containerPort must be integer/);
  const pool = structuredClone(find('InferencePool', 'strata'));
  pool.spec.targetPorts.push({ number: 8000 });
  delete pool.spec.endpointPickerRef.port;
  pool.spec.selectr = pool.spec.selector;
  const errors = validate(pool).join('; ');
  assert.match(errors, /port number must be unique/);
  assert.match(errors, /port is required when kind is 'Service'/);
  assert.match(errors, /spec\.selectr is not a field/);
});

// The container's args as `strata` reads them: {flag: value} and the subcommand.
function flags(container) {
  const args = container.args;
  const out = { command: args[0] };
  for (let i = 1; i < args.length; i++) {
    assert.match(args[i], /^--/, `an argument without its flag: ${args[i]}`);
    const next = args[i + 1];
    if (next === undefined || next.startsWith('--')) out[args[i]] = true;
    else out[args[i]] = args[++i];
  }
  return out;
}

test('selectors, ports, probes, the workers file and the drain fit together', () => {
  const sts = find('StatefulSet', 'strata-worker');
  const pod = sts.spec.template;
  const worker = pod.spec.containers[0];
  const wf = flags(worker);
  const portOf = (c, name) => c.ports.find((p) => p.name === name)?.containerPort;
  // The workers' Service is headless and the StatefulSet's, selecting its pods.
  const svc = find('Service', sts.spec.serviceName);
  assert.equal(svc.spec.clusterIP, 'None');
  for (const [k, v] of Object.entries(svc.spec.selector)) assert.equal(pod.metadata.labels[k], v);
  for (const [k, v] of Object.entries(sts.spec.selector.matchLabels)) assert.equal(pod.metadata.labels[k], v);
  // Ports: the server's, the events' and the replay's, as serve binds them.
  assert.equal(wf.command, 'serve');
  assert.equal(Number(wf['--port']), portOf(worker, 'http'));
  assert.equal(wf['--host'], '0.0.0.0');
  assert.equal(wf['--kv-events-endpoint'], `tcp://*:${portOf(worker, 'kv-events')}`);
  assert.equal(wf['--kv-events-replay-endpoint'], `tcp://*:${portOf(worker, 'kv-replay')}`);
  for (const p of svc.spec.ports) assert.ok(worker.ports.some((c) => c.name === p.targetPort), p.name);
  // Readiness and liveness on /health, on the server's port.
  for (const probe of ['startupProbe', 'readinessProbe', 'livenessProbe']) {
    assert.equal(worker[probe].httpGet.path, '/health', probe);
    assert.equal(worker[probe].httpGet.port, 'http', probe);
  }
  // The drain fits in the grace period: the preStop pause, then --shutdown-timeout-s.
  const pause = Number(worker.lifecycle.preStop.exec.command[1]);
  assert.ok(pod.spec.terminationGracePeriodSeconds > pause + Number(wf['--shutdown-timeout-s']));
  // The secret the admin key comes from exists and has the key.
  const secretRef = worker.env.find((e) => e.name === 'STRATA_ADMIN_API_KEY').valueFrom.secretKeyRef;
  assert.ok(find('Secret', secretRef.name).stringData[secretRef.key]);
  assert.equal(wf['--admin-api-key'], '$(STRATA_ADMIN_API_KEY)');
  // The model volume.
  assert.ok(find('PersistentVolumeClaim', pod.spec.volumes[0].persistentVolumeClaim.claimName));
  assert.ok(wf['--model'].startsWith(worker.volumeMounts[0].mountPath + '/'));

  // The router: its workers file names every StatefulSet pod by its stable DNS name.
  const router = find('Deployment', 'strata-router');
  const rc = router.spec.template.spec.containers[0];
  const rf = flags(rc);
  assert.equal(rf.command, 'route');
  const mount = rc.volumeMounts.find((m) => rf['--workers-file'].startsWith(m.mountPath + '/'));
  const cmName = router.spec.template.spec.volumes.find((v) => v.name === mount.name).configMap.name;
  const entries = JSON.parse(find('ConfigMap', cmName).data[path.basename(rf['--workers-file'])]);
  assert.deepEqual(entries.map((e) => e.url),
    Array.from({ length: sts.spec.replicas }, (_, i) => `http://${sts.metadata.name}-${i}.${svc.metadata.name}:${portOf(worker, 'http')}`));
  assert.ok(entries.every((e) => e.kind === 'strata'));
  // Sessions shared through Redis: the store's Service and its port.
  const store = new URL(rf['--session-store']);
  const redisSvc = find('Service', store.hostname);
  assert.equal(redisSvc.spec.ports[0].port, Number(store.port));
  const redis = find('Deployment', store.hostname);
  for (const [k, v] of Object.entries(redisSvc.spec.selector)) assert.equal(redis.spec.template.metadata.labels[k], v);
  assert.equal(Number(rf['--port']), portOf(rc, 'http'));

  // The InferencePool selects the workers' pods on their server port.
  const pool = find('InferencePool', 'strata');
  for (const [k, v] of Object.entries(pool.spec.selector.matchLabels)) assert.equal(pod.metadata.labels[k], v);
  assert.deepEqual(pool.spec.targetPorts.map((p) => p.number), [portOf(worker, 'http')]);
});

// ---- the manifests' commands, as processes ----

const procs = [];
after(async () => {
  for (const p of procs.reverse()) {
    if (p.exitCode === null && p.signalCode === null) {
      const exited = new Promise((r) => p.on('exit', r));
      process.kill(p.pid, 'SIGTERM');
      await exited;
    }
  }
});

async function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// The container's args with what only a cluster has replaced: the model's path (the tiny
// model), the addresses (loopback, free ports), the workers file and the session store;
// every other flag is the manifest's.
function rendered(container, replace) {
  const args = container.args.map((a) => (a === '$(STRATA_ADMIN_API_KEY)' ? 'test-admin-key' : a));
  for (const [flag, value] of Object.entries(replace)) {
    const i = args.indexOf(flag);
    assert.ok(i > 0, `${flag} is not in the manifest's args`);
    args[i + 1] = value;
  }
  return args;
}

function start(args) {
  const p = spawn(STRATA, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  p.stderr.on('data', (d) => { err += d; });
  procs.push(p);
  const ready = new Promise((resolve, reject) => {
    p.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/127\.0\.0\.1:\d+)/);
      if (m) resolve(m[1]);
    });
    p.on('exit', (code) => reject(new Error(`${args[0]} exited ${code}: ${err}`)));
  });
  return { proc: p, ready };
}

test('the workers and a router start from the manifests\' commands and serve a chat', async () => {
  const dir = path.join(WORK_DIR, 'deploy-manifests');
  mkdirSync(dir, { recursive: true });
  const model = tinyQwen3Model();
  const worker = find('StatefulSet', 'strata-worker').spec.template.spec.containers[0];
  const urls = [];
  for (let i = 0; i < 2; i++) {
    const [http, ev, replay] = [await freePort(), await freePort(), await freePort()];
    const w = start(rendered(worker, {
      '--model': model, '--host': '127.0.0.1', '--port': String(http), '--kv-cache-tokens': '4096',
      '--kv-events-endpoint': `tcp://127.0.0.1:${ev}`, '--kv-events-replay-endpoint': `tcp://127.0.0.1:${replay}`,
    }));
    urls.push(await w.ready);
  }
  for (const u of urls) assert.equal((await fetch(u + '/health')).status, 200);
  // A private Redis as the session store.
  const redisPort = await freePort();
  const redis = spawn('redis-server', ['--port', String(redisPort), '--bind', '127.0.0.1', '--save', '',
    '--appendonly', 'no'], { stdio: 'ignore' });
  procs.push(redis);
  await waitFor(() => spawnSync('redis-cli', ['-p', String(redisPort), 'ping']).stdout?.toString().includes('PONG'),
    'redis-server');
  const workersFile = path.join(dir, 'workers.json');
  writeFileSync(workersFile, JSON.stringify(urls.map((url) => ({ url, kind: 'strata' }))));
  const routerC = find('Deployment', 'strata-router').spec.template.spec.containers[0];
  const r = start(rendered(routerC, {
    '--model': model, '--host': '127.0.0.1', '--port': '0', '--workers-file': workersFile,
    '--session-store': `redis://127.0.0.1:${redisPort}`,
  }));
  const base = await r.ready;
  const auth = { authorization: 'Bearer test-admin-key' };
  await waitFor(async () => {
    const ws = (await (await fetch(base + '/workers', { headers: auth })).json()).workers;
    return ws.length === 2 && ws.every((w) => w.joined && w.reachable);
  }, 'both workers to join the router');
  const chat = await fetch(base + '/v1/chat/completions', {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'Hello there.' }], max_tokens: 3, session_id: 'k8s-1' }),
  });
  assert.equal(chat.status, 200, await chat.text());
  // The session's binding is in the shared store.
  const keys = spawnSync('redis-cli', ['-p', String(redisPort), '--scan']).stdout.toString();
  assert.match(keys, /k8s-1/);
  // SIGTERM drains and exits cleanly, as the pods' termination does.
  for (const p of procs.filter((x) => x !== redis)) {
    const exited = new Promise((res) => p.on('exit', (code, sig) => res(code ?? sig)));
    process.kill(p.pid, 'SIGTERM');
    assert.equal(await exited, 0);
  }
});
