import { createClient } from 'redis';
import { XmcProducer } from 'xmc-resumption';

const redis = await createClient({ url: process.env.XMC_REDIS_URL }).connect();
const xmc = new XmcProducer(redis); // stream 'xmc-tasks-stream'; 3 retries of what is safe to resend
await xmc.pause('exp-42'); // from now on the experiment's new tasks are held
const done = await xmc.enqueue('exp-42', { user: 'u1', action: 'recompute' }, { idempotencyKey: 'req-1' });
console.log(done.destination, done.duplicate, await xmc.state('exp-42')); // held false paused
const tasks = Array.from({ length: 2500 }, (_, i) => ({ user: `u${i + 2}`, action: 'recompute' }));
const batch = await xmc.enqueueMany('exp-42', tasks, { idempotencyKeys: tasks.map((t) => `req-${t.user}`) });
console.log(batch.length, batch.filter((b) => !b.duplicate).length); // 2500 2500
await redis.close();
