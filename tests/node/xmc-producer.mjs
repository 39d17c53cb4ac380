// An xmc-resumption producer in Node, on the npm `redis` client, through the contract of
// docs/producers.md: pause with SET, enqueue with the enqueue script (EVALSHA, loaded on NOSCRIPT).
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';

export class XmcProducer {
  // client: a connected `redis` client; scriptPath: enqueue.lua of the installed xmc-resumption
  constructor(client, scriptPath, stream = 'xmc-tasks-stream') {
    this.client = client;
    this.stream = stream;
    this.script = readFileSync(scriptPath, 'utf8');
    this.sha = createHash('sha1').update(this.script).digest('hex');
  }

  keys(experiment) {
    const p = `{${this.stream}}:experiment:${experiment}`;
    return [this.stream, `${p}:state`, `${p}:held`, `${p}:idempotency`, `${p}:idempotency-previous`];
  }

  async pause(experiment) {
    await this.client.set(this.keys(experiment)[1], 'paused');
  }

  // tasks: 1..1000 of {fields: {name: value, ...}, key: an idempotency key or undefined}
  async enqueue(experiment, tasks) {
    const args = [String(tasks.length)];
    for (const { fields, key } of tasks) {
      const pairs = Object.entries(fields).flat().map(String);
      args.push(key ?? '', String(pairs.length / 2), ...pairs);
    }
    const call = () => this.client.evalSha(this.sha, { keys: this.keys(experiment), arguments: args });
    let reply;
    try {
      reply = await call();
    } catch (err) {
      if (!String(err?.message).startsWith('NOSCRIPT')) throw err;
      await this.client.scriptLoad(this.script); // a restarted Redis has an empty script cache
      reply = await call();
    }
    return reply.map(([destination, id, duplicate]) => ({ destination, id, duplicate: duplicate === 1 }));
  }
}
