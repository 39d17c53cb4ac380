// An application's producer, type-checked against the package's types (npm test runs tsc on it):
// a node-redis client and tasks built elsewhere as Record<string, string> need no cast.
import { createClient } from 'redis';
import { type Enqueued, XmcEnqueueError, XmcProducer } from '../src/index.js';

function orderTask(orderId: string): Record<string, string> {
  return { order: orderId, action: 'recompute' };
}

export async function produce(url: string, orders: string[]): Promise<number> {
  const redis = await createClient({ url }).connect();
  const xmc = new XmcProducer(redis, { stream: 'xmc-tasks-stream' });
  await xmc.pause('E1');
  const state: 'running' | 'paused' | 'resuming' | 'unknown' = await xmc.state('E1');
  let done: Enqueued[] = [];
  try {
    done = await xmc.enqueueMany('E1', orders.map(orderTask), { idempotencyKeys: orders, requestId: 'batch-7' });
  } catch (err) {
    if (err instanceof XmcEnqueueError) done = err.enqueued;
  }
  const one = await xmc.enqueue('E1', new Map([['n', 1]]), { idempotencyKey: null });
  await redis.close();
  return [...done, one].filter((d) => !d.duplicate).length + (state === 'paused' ? 0 : 1);
}
