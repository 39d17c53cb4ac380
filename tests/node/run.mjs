// The harness of tests/test_node_producer.py: reads a plan (JSON) on stdin, runs its steps with
// XmcProducer and prints one JSON document: the result of each step, in order.
// Plan: {url, script, stream, steps: [{op: 'pause', experiment} | {op: 'enqueue', experiment, tasks}]}
import { createClient } from 'redis';
import { XmcProducer } from './xmc-producer.mjs';

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const plan = JSON.parse(Buffer.concat(chunks).toString('utf8'));
const client = createClient({ url: plan.url });
client.on('error', (err) => console.error(`redis client: ${err.message}`));
await client.connect();
try {
  const producer = new XmcProducer(client, plan.script, plan.stream);
  const results = [];
  for (const step of plan.steps) {
    if (step.op === 'pause') results.push(await producer.pause(step.experiment) ?? null);
    else if (step.op === 'enqueue') results.push(await producer.enqueue(step.experiment, step.tasks));
    else throw new Error(`unknown step ${step.op}`);
  }
  console.log(JSON.stringify(results));
} finally {
  await client.quit();
}
