// A fake V8 inspector for test_v8: /json/list and a WebSocket (RFC 6455, written here to
// control every byte) that answers contprof v8's calls with malformed messages in turn,
// and one valid CPU profile among them. usage: node fake_inspector.js [badlist]
const crypto = require('node:crypto');
const http = require('node:http');

const badlist = process.argv[2] === 'badlist';
let port = 0;
const server = http.createServer((req, res) => {
  if (req.url !== '/json/list') { res.writeHead(404); res.end(); return; }
  res.writeHead(200, { 'content-type': 'application/json' });
  res.end(badlist ? '[{"id": 3,,]' : JSON.stringify([
    { id: 'fake', title: 'workerd: worker fake', type: 'node', webSocketDebuggerUrl: `ws://127.0.0.1:${port}/fake` },
    { id: 'nourl', title: 'workerd: worker nourl', type: 'node' },
    { id: 7, title: 'id not a string' },
  ]));
});

const goodCpu = {
  nodes: [
    { id: 1, callFrame: { functionName: '(root)', url: '', lineNumber: -1, columnNumber: -1 }, children: [2] },
    { id: 2, callFrame: { functionName: 'fakeHot', url: 'fake.js', lineNumber: 3, columnNumber: 1 } },
  ],
  startTime: 1, endTime: 1000, samples: [2, 2, 2], timeDeltas: [1, 1, 1],
};
const badCpu = [
  'this is not JSON {{{',
  JSON.stringify({ id: 0, result: { profile: { nodes: 'x' } } }),
  JSON.stringify({ id: 0, result: { profile: { nodes: [{ id: 1, callFrame: { functionName: 'a', url: '' }, children: [1] }] } } }),
  JSON.stringify({ id: 0, result: { profile: { nodes: [{ id: 1, callFrame: { functionName: 'a', url: '' }, children: [2] },
    { id: 2, callFrame: { functionName: 'b', url: '' }, children: [1] }], samples: [1], timeDeltas: [1] } } }),
  JSON.stringify({ id: 0, error: { code: -1, message: 'fake refuses' } }),
  JSON.stringify({ id: 0, result: { profile: goodCpu } }),
];
let nstop = 0;

server.on('upgrade', (req, sock) => {
  const key = req.headers['sec-websocket-key'];
  const accept = crypto.createHash('sha1').update(key + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest('base64');
  sock.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
    `Sec-WebSocket-Accept: ${accept}\r\n\r\n`);
  const send = (text) => {
    const b = Buffer.from(text);
    let h;
    if (b.length < 126) h = Buffer.from([0x81, b.length]);
    else if (b.length < 65536) { h = Buffer.alloc(4); h[0] = 0x81; h[1] = 126; h.writeUInt16BE(b.length, 2); }
    else { h = Buffer.alloc(10); h[0] = 0x81; h[1] = 127; h.writeBigUInt64BE(BigInt(b.length), 2); }
    sock.write(Buffer.concat([h, b]));
  };
  const reply = (id, text) => send(text.replace('"id":0', `"id":${id}`));
  const onMessage = (text) => {
    const m = JSON.parse(text);
    // unsolicited junk before every answer
    send('[1,2,3]');
    send(JSON.stringify({ method: 'NodeWorker.receivedMessageFromWorker', params: { sessionId: 'x', message: '{bad' } }));
    send(JSON.stringify({ method: 'NodeWorker.attachedToWorker', params: { workerInfo: {} } }));
    send(JSON.stringify({ id: 'not a number', result: {} }));
    if (m.method === 'Profiler.stop') reply(m.id, badCpu[nstop++ % badCpu.length]);
    else if (m.method === 'HeapProfiler.getSamplingProfile')
      reply(m.id, JSON.stringify({ id: 0, result: { profile: { head: { id: 1, callFrame: { functionName: '(root)', url: '' } },
        samples: [{ size: 10, nodeId: 99, ordinal: 1 }] } } }));
    else reply(m.id, JSON.stringify({ id: 0, result: {} }));
  };
  let buf = Buffer.alloc(0);
  sock.on('error', () => {});
  sock.on('data', (d) => {
    buf = Buffer.concat([buf, d]);
    for (;;) {
      if (buf.length < 2) return;
      const op = buf[0] & 15;
      let len = buf[1] & 127, off = 2;
      if (len === 126) { if (buf.length < 4) return; len = buf.readUInt16BE(2); off = 4; }
      else if (len === 127) { if (buf.length < 10) return; len = Number(buf.readBigUInt64BE(2)); off = 10; }
      const mask = buf[1] & 128 ? buf.subarray(off, off + 4) : null;
      if (mask) off += 4;
      if (buf.length < off + len) return;
      const p = Buffer.from(buf.subarray(off, off + len));
      if (mask) for (let i = 0; i < p.length; i++) p[i] ^= mask[i % 4];
      buf = buf.subarray(off + len);
      if (op === 8) { sock.end(); return; }
      if (op === 1) onMessage(p.toString());
    }
  });
});

server.listen(0, '127.0.0.1', () => {
  port = server.address().port;
  console.log(`fake inspector on ${port}`);
});
