// The harness of tests/test_node_producer.py's end-to-end test: reads a plan (JSON) on stdin, runs
// its steps with XmcProducer and prints one JSON document: the result of each step, in order.
// Plan: {url, stream, steps: [{op: 'pause' | 'state', experiment} | {op: 'enqueue', experiment, tasks, keys}]}
import { createClient } from 'redis';
import { XmcProducer } from '../src/index.js';

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const plan = JSON.parse(Buffer.concat(chunks).toString('utf8'));
const client = createClient({ url: plan.url });
client.on('error', (err) => console.error(`redis client: ${err.message}`));
await client.connect();
try {
  const xmc = new XmcProducer(client, { stream: plan.stream });
  const results = [];
  for (const step of plan.steps) {
    if (step.op === 'pause') results.push((await xmc.pause(step.experiment)) ?? null);
    else if (step.op === 'state') results.push(await xmc.state(step.experiment));
    else if (step.op === 'enqueue') results.push(await xmc.enqueueMany(step.experiment, step.tasks, { idempotencyKeys: step.keys }));
    else throw new Error(`unknown step ${step.op}`);
  }
  console.log(JSON.stringify(results));
} finally {
  await client.close();
}
