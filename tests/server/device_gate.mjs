// Runs a black-box suite (`node device_gate.mjs FILE`: `node --test --test-concurrency=1
// FILE`) on the device STRATA_TEST_DEVICE names. With cuda it first starts one worker on the
// GPU: where that fails for want of a GPU (no driver, no device, a build without CUDA) the
// suite reports skipped (exit 77, CTest's SKIP_RETURN_CODE), never passed, unless
// STRATA_REQUIRE_GPU=1 (scripts/gpu-check.sh), when it fails with the reason.
import { spawnSync } from 'node:child_process';
import { startServer, TEST_DEVICE } from './server_harness.mjs';

const suite = process.argv[2];
if (!suite) {
  console.error('usage: node device_gate.mjs SUITE.test.mjs');
  process.exit(2);
}
if (TEST_DEVICE === 'cuda') {
  try {
    const probe = await startServer();
    await probe.stop();
  } catch (e) {
    const why = String(e.message).split('\n').find((l) => /cuda|gpu|driver|device/i.test(l)) || e.message;
    if (process.env.STRATA_REQUIRE_GPU === '1') {
      console.error(`STRATA_TEST_DEVICE=cuda: no worker starts on the GPU: ${e.message}`);
      process.exit(1);
    }
    console.log(`skipped: STRATA_TEST_DEVICE=cuda and no worker starts on a GPU here (${why.trim()})`);
    process.exit(77);
  }
}
const r = spawnSync(process.execPath, ['--test', '--test-concurrency=1', suite], { stdio: 'inherit' });
process.exit(r.status ?? 1);
