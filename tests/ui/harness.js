// Shared by the browser test and the benchmark: runs the built contprofd on a fresh store,
// fills it through `contprof import` (the embedded broker and ingest), and launches
// Debian's chromium through playwright-core.
'use strict';

const { spawn, execFileSync } = require('child_process');
const fs = require('fs');
const net = require('net');
const path = require('path');
const { chromium } = require('playwright-core');
const pprof = require('./pprof');

// Starts contprofd --data DIR/store on a kernel-chosen port; resolves to {url, stop()}.
// args replaces the default --http 127.0.0.1:0 (e.g. ['--config', FILE]).
async function startDaemon(bindir, dir, args) {
  const bin = path.join(bindir, 'query', 'contprofd');
  const log = path.join(dir, 'contprofd.log');
  const fd = fs.openSync(log, 'w');
  const child = spawn(bin, ['--data', path.join(dir, 'store'), ...(args || ['--http', '127.0.0.1:0'])],
    { stdio: ['ignore', fd, fd] });
  let exited = null;
  child.on('exit', code => { exited = code; });
  for (let i = 0; i < 500; i++) {
    const m = /query API on (http:\/\/127\.0\.0\.1:\d+)/.exec(fs.readFileSync(log, 'utf8'));
    if (m) {
      return {
        url: m[1], log,
        stop: () => new Promise(resolve => {
          if (exited !== null) return resolve(exited);
          child.on('exit', code => resolve(code));
          child.kill('SIGTERM');
        }),
      };
    }
    if (exited !== null) throw new Error('contprofd exited early:\n' + fs.readFileSync(log, 'utf8'));
    await new Promise(r => setTimeout(r, 20));
  }
  child.kill('SIGKILL');
  throw new Error('contprofd did not start:\n' + fs.readFileSync(log, 'utf8'));
}

// Writes a CPU profile of folded stacks {"root;...;leaf": ns} and imports it as one 10 s
// window at atSec with the given labels ({service, version, ...}).
function importCpu(bindir, dir, url, folded, labels, atSec, mappings) {
  const file = path.join(dir, `p-${labels.service}-${labels.version || ''}-${atSec}.pb.gz`);
  fs.writeFileSync(file, pprof.cpuProfile(folded, mappings));
  const args = ['import', '--server', url, '--service', labels.service, '--at', String(atSec), '--duration', '10s'];
  for (const [k, v] of Object.entries(labels)) if (k !== 'service') args.push('--label', `${k}=${v}`);
  args.push(file);
  try {
    execFileSync(path.join(bindir, 'query', 'contprof'), args, { stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (e) {
    throw new Error(`contprof ${args.join(' ')}: ${e.stderr || e.message}`);
  }
}

// Waits until the API's total for select over [from, to] is want (ingest is asynchronous).
async function waitTotal(url, select, from, to, want) {
  let got = -1;
  for (let i = 0; i < 600; i++) {
    const q = new URLSearchParams({ select, from: String(from), to: String(to), format: 'json', max_nodes: '1' });
    const r = await fetch(url + '/api/v1/profile?' + q);
    if (r.ok) got = (await r.json()).total;
    if (got === want) return;
    await new Promise(res => setTimeout(res, 100));
  }
  throw new Error(`store total for ${select} stayed ${got}, want ${want}`);
}

// Two contprofd nodes of one cluster on loopback (query/README.md "A cluster of nodes"):
// node 1 hosts the embedded broker (2 partitions) and owns partition 0, node 2 owns 1; both
// know both URLs. Resolves to [node1, node2] as startDaemon's, once both are healthy.
async function startCluster(bindir, dir) {
  const ports = await Promise.all([0, 1].map(() => new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => { const p = srv.address().port; srv.close(() => resolve(p)); });
  })));
  const peers = ports.map(p => `http://127.0.0.1:${p}`).join(',');
  const dirs = [1, 2].map(i => { const d = path.join(dir, 'node' + i); fs.mkdirSync(d); return d; });
  const conf = path.join(dirs[0], 'contprofd.conf');
  fs.writeFileSync(conf, 'embedded.partitions = 2\ncluster.peer_timeout = 2s\ncluster.token = ui-cluster-secret\n');
  const peerConf = path.join(dirs[1], 'peer.conf');
  fs.writeFileSync(peerConf, 'cluster.token = ui-cluster-secret\n');
  const healthy = async url => {
    for (let i = 0; i < 600; i++) {
      if ((await fetch(url + '/healthz').catch(() => ({ status: 0 }))).status === 200) return;
      await new Promise(r => setTimeout(r, 100));
    }
    throw new Error(url + ' not healthy within 60 s');
  };
  const n1 = await startDaemon(bindir, dirs[0], ['--config', conf, '--http', `127.0.0.1:${ports[0]}`,
    '--peers', peers, '--partitions', '0']);
  await healthy(n1.url);
  const brokers = (await (await fetch(n1.url + '/api/v1/brokers')).json()).brokers;
  const n2 = await startDaemon(bindir, dirs[1], ['--config', peerConf, '--http', `127.0.0.1:${ports[1]}`, '--brokers', brokers,
    '--peers', peers, '--partitions', '1']);
  await healthy(n2.url);
  return [n1, n2];
}

// Launches chromium headless with a fresh profile directory under dir.
async function launch(dir) {
  const userDir = fs.mkdtempSync(path.join(dir, 'chromium-'));
  return chromium.launchPersistentContext(userDir, {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    acceptDownloads: true,
    viewport: { width: 1440, height: 900 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
}

// A tree of n nodes (n-1 frames under the root) as folded stacks, each frame with its own
// self value: deterministic (seeded), about 10 levels deep, for the 20,000-node benchmarks.
function bigFolded(n) {
  let seed = 12345;
  const rnd = () => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return seed / 4294967296; };
  const stacks = ['main'];
  const depth = [1];
  const out = { main: 1e7 };
  for (let i = 1; i < n - 1; i++) {
    // Parents among recent frames (bounded depth) so the tree is both wide and deep.
    let p = Math.max(0, Math.floor(i - 1 - rnd() * Math.min(i, 400)));
    while (depth[p] >= 14) p = Math.floor(rnd() * Math.min(i, 20));
    const name = `pkg${i % 131}.Func${i}`;
    stacks.push(stacks[p] + ';' + name);
    depth.push(depth[p] + 1);
    out[stacks[i]] = Math.round(1 + rnd() * rnd() * 200) * 1e7;
  }
  return out;
}

// Imports a profile of `frames` frames as one window of {service="big"} at atSec and
// returns its folded stacks.
function importBig(bindir, dir, url, frames, atSec) {
  const big = bigFolded(frames + 1);
  importCpu(bindir, dir, url, big, { service: 'big', version: '9' }, atSec);
  return big;
}

module.exports = { startDaemon, startCluster, importCpu, waitTotal, launch, bigFolded, importBig };
