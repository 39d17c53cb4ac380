// A TCP proxy in front of a redis-server that can lose a reply (as tests/support/proxy.py does): it
// forwards a request to the server, and when the request holds the armed marker, drops the server's
// reply (the command has run) and closes the client's connection. What a producer sees when Redis,
// a proxy or the network fails between the write and the reply.
import net from 'node:net';

export class LosingProxy {
  /** @param {number} upstreamPort a redis-server on 127.0.0.1 */
  constructor(upstreamPort) {
    this.upstreamPort = upstreamPort;
    this.lost = 0;
    this.marker = Buffer.alloc(0);
    this.times = 0;
    this.sockets = new Set();
    this.server = net.createServer((client) => this.#connect(client));
  }

  /** Listen on a free loopback port; returns it. */
  async listen() {
    await new Promise((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    this.port = this.server.address().port;
    return this.port;
  }

  /** The next `times` requests holding `marker` (e.g. 'EVALSHA', matched case-insensitively) lose their reply. */
  lose(marker, times = 1) {
    this.marker = Buffer.from(marker.toUpperCase());
    this.times = times;
  }

  #connect(client) {
    const upstream = net.connect(this.upstreamPort, '127.0.0.1');
    let losing = false;
    let tail = Buffer.alloc(0); // the end of the last request read: a marker may straddle two reads
    for (const s of [client, upstream]) {
      this.sockets.add(s);
      s.on('close', () => this.sockets.delete(s));
      s.on('error', () => {});
    }
    client.on('data', (request) => {
      const seen = Buffer.from(Buffer.concat([tail, request]).toString('latin1').toUpperCase(), 'latin1');
      tail = seen.subarray(Math.max(0, seen.length - this.marker.length + 1));
      if (!losing && this.times > 0 && this.marker.length && seen.includes(this.marker)) {
        this.times -= 1;
        losing = true;
      }
      upstream.write(request);
    });
    upstream.on('data', (reply) => {
      if (losing) {
        this.lost += 1;
        client.destroy();
        upstream.destroy();
        return;
      }
      client.write(reply);
    });
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => client.destroy());
  }

  async close() {
    for (const s of this.sockets) s.destroy();
    await new Promise((resolve) => this.server.close(resolve));
  }
}
