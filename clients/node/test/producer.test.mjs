// The package against a real redis-server (XMC_TEST_REDIS_URL, started by tests/test_node_producer.py)
// and, for lost replies, a reply-losing proxy in front of it (./proxy.mjs).
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, test } from 'node:test';
import { createClient, SocketClosedUnexpectedlyError } from 'redis';
import { ENQUEUE_SCRIPT, LIMITS, XmcEnqueueError, XmcProducer } from '../src/index.js';
import { LosingProxy } from './proxy.mjs';

const url = process.env.XMC_TEST_REDIS_URL;
if (!url) throw new Error('XMC_TEST_REDIS_URL must name a redis-server of the test (tests/test_node_producer.py sets it)');

/** @type {import('redis').RedisClientType} */
let admin;
/** @type {LosingProxy} */
let proxy;
/** @type {import('redis').RedisClientType} */
let proxied;

const clients = [];
async function connect(to) {
  const client = createClient({ url: to, socket: { reconnectStrategy: () => 50 } });
  client.on('error', () => {}); // a lost connection: the client reconnects, the call sees the fault
  await client.connect();
  clients.push(client);
  return client;
}

before(async () => {
  admin = await connect(url);
  proxy = new LosingProxy(Number(new URL(url).port));
  const port = await proxy.listen();
  proxied = await connect(`redis://127.0.0.1:${port}/${new URL(url).pathname.slice(1) || 0}`);
});

after(async () => {
  for (const c of clients) await c.close();
  await proxy.close();
});

// the proxied client reconnected (a call queued while it reconnects would share the handshake's write)
const lose = async (marker, times = 1) => {
  await proxied.ping();
  proxy.lose(marker, times);
};

const fresh = (prefix) => `${prefix}-${randomUUID().slice(0, 8)}`;
const taskNames = async (key) => (await admin.xRange(key, '-', '+')).map((e) => e.message.task);

test('the limits are the script\'s', () => {
  assert.match(ENQUEUE_SCRIPT, /^local XMC_MAX_TASKS = 1000$/m);
  assert.deepEqual({ ...LIMITS }, { tasks: 1000, fields: 3995, keyBytes: 256, requestBytes: 128, bytes: 64 * 1024 * 1024 });
});

test('pause, state and the hold rule; a key adds a task once', async () => {
  const xmc = new XmcProducer(admin);
  const e = fresh('N');
  const keys = xmc.keys(e);
  assert.equal(await xmc.state(e), 'running');
  const running = await xmc.enqueue(e, { task: 'r0', n: 0 });
  assert.equal(running.destination, 'stream');
  assert.equal(running.duplicate, false);
  await xmc.pause(e);
  assert.equal(await admin.get(keys.state), 'paused');
  assert.equal(await xmc.state(e), 'paused');
  const first = await xmc.enqueue(e, { task: 'a' }, { idempotencyKey: 'order-1' });
  const again = await xmc.enqueue(e, { task: 'a' }, { idempotencyKey: 'order-1' });
  assert.deepEqual(first, { destination: 'held', entryId: first.entryId, duplicate: false });
  assert.deepEqual(again, { ...first, duplicate: true }); // another call: a duplicate
  const batch = await xmc.enqueueMany(e, [{ task: 'b' }, { task: 'b' }, new Map([[Buffer.from('task'), Buffer.from('c')]])], {
    idempotencyKeys: ['order-2', 'order-2', null],
  });
  assert.deepEqual(batch.map((b) => b.duplicate), [false, true, false]);
  assert.deepEqual(await taskNames(keys.held), ['a', 'b', 'c']);
  assert.equal(await xmc.held(e), 3);
  await admin.set(keys.state, 'resuming');
  assert.equal(await xmc.state(e), 'resuming');
  await admin.set(keys.state, 'odd');
  assert.equal(await xmc.state(e), 'unknown');
});

test('a keyed enqueue whose reply was lost is sent again and told it added the task', async () => {
  const xmc = new XmcProducer(proxied);
  const e = fresh('L');
  await xmc.pause(e);
  await xmc.enqueue(e, { task: 'warm' }); // the script is loaded: the lost call is its EVALSHA
  const lostBefore = proxy.lost;
  await lose('EVALSHA');
  const done = await xmc.enqueue(e, { task: 'once' }, { idempotencyKey: 'req-1' });
  assert.equal(proxy.lost, lostBefore + 1);
  const [, entry] = await admin.xRange(xmc.keys(e).held, '-', '+');
  assert.deepEqual(done, { destination: 'held', entryId: entry.id, duplicate: false });
  assert.deepEqual(await taskNames(xmc.keys(e).held), ['warm', 'once']);
});

test('an unkeyed enqueue, or a batch mixing keyed and unkeyed tasks, is not sent again', async () => {
  const xmc = new XmcProducer(proxied);
  const e = fresh('M');
  await xmc.pause(e);
  await xmc.enqueue(e, { task: 'warm' });
  await lose('EVALSHA');
  await assert.rejects(xmc.enqueue(e, { task: 'unkeyed' }), (err) => err instanceof SocketClosedUnexpectedlyError);
  for (const keys of [['k-1', null], [null, 'k-2']]) {
    await lose('EVALSHA');
    await assert.rejects(xmc.enqueueMany(e, [{ task: 'a' }, { task: 'b' }], { idempotencyKeys: keys }));
  }
  assert.deepEqual(await taskNames(xmc.keys(e).held), ['warm', 'unkeyed', 'a', 'b', 'a', 'b']);
});

test('any number of tasks go in atomic chunks, in order', async () => {
  const xmc = new XmcProducer(admin);
  const e = fresh('C');
  await xmc.pause(e);
  const tasks = Array.from({ length: 2345 }, (_, i) => ({ task: `t${i}` }));
  const done = await xmc.enqueueMany(e, tasks);
  assert.equal(done.length, 2345);
  const entries = await admin.xRange(xmc.keys(e).held, '-', '+');
  assert.deepEqual(entries.map((x) => x.id), done.map((d) => d.entryId));
  assert.deepEqual(entries.map((x) => x.message.task), tasks.map((t) => t.task));
});

test('a failure between chunks says what was done, and a retry with the request ID tells the truth', async () => {
  const xmc = new XmcProducer(proxied);
  const e = fresh('F');
  await xmc.pause(e);
  await xmc.enqueue(e, { task: 'warm' });
  const tasks = Array.from({ length: 2500 }, (_, i) => ({ task: `t${i}` }));
  tasks[1500].mark = 'chunk-two'; // the proxy loses the replies of the call carrying it
  const keys = tasks.map((_, i) => `k${i}`);
  await lose('CHUNK-TWO', 4); // the first send and the 3 retries
  const err = await xmc.enqueueMany(e, tasks, { idempotencyKeys: keys, requestId: 'job-7' }).catch((x) => x);
  assert.ok(err instanceof XmcEnqueueError, String(err));
  assert.equal(err.enqueued.length, 1000);
  assert.equal(err.total, 2500);
  assert.equal(await xmc.held(e), 1 + 2000); // the second chunk ran; the third was not sent
  const again = await xmc.enqueueMany(e, tasks, { idempotencyKeys: keys, requestId: 'job-7' });
  assert.deepEqual(again.filter((d) => d.duplicate), []);
  assert.deepEqual(again.slice(0, 1000), err.enqueued);
  assert.equal(await xmc.held(e), 1 + 2500);
  const other = await xmc.enqueueMany(e, tasks.slice(0, 2), { idempotencyKeys: keys.slice(0, 2) });
  assert.deepEqual(other.map((d) => d.duplicate), [true, true]);
});

test('an empty script cache is refilled (NOSCRIPT, then SCRIPT LOAD)', async () => {
  const xmc = new XmcProducer(admin);
  const e = fresh('S');
  await admin.scriptFlush();
  assert.equal((await xmc.enqueue(e, { task: 'x' })).destination, 'stream');
});

test('bad input is refused before any call', async () => {
  const xmc = new XmcProducer(admin, { stream: 'other-stream' });
  const e = fresh('B');
  await assert.rejects(xmc.enqueue('a b', { task: 'x' }), /experiment ID "a b" must be 1 to 200 of/);
  await assert.rejects(xmc.enqueueMany(e, []), /at least one task, got 0/);
  await assert.rejects(xmc.enqueueMany(e, [{ f: 'v' }, {}]), /task 1: a task needs at least one field/);
  await assert.rejects(xmc.enqueue(e, { f: 'v' }, { idempotencyKey: 'k'.repeat(257) }), /at most 256 bytes, got 257/);
  await assert.rejects(xmc.enqueueMany(e, [{ f: 'v' }], { idempotencyKeys: ['a', 'b'] }), /2 idempotency keys for 1 tasks/);
  await assert.rejects(xmc.enqueue(e, { f: 'v' }, { requestId: 'r'.repeat(65) }), /a request ID has 1..64 bytes, got 65/);
  await assert.rejects(xmc.enqueue(e, { f: true }), /a field name or value is a string, a number or a Buffer, got boolean/);
  assert.throws(() => new XmcProducer(admin, { stream: 'a{b}' }), /stream "a\{b\}"/);
  assert.equal(await admin.exists(['other-stream', xmc.keys(e).held]), 0);
});
