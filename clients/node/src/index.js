// xmc-resumption's producers in Node: pause an experiment, read its state, and enqueue its tasks
// through the pause-aware enqueue script, with idempotency keys, a request ID per call, and any
// number of tasks in atomic chunks. The contract behind it, for every language: docs/producers.md
// of the xmc-resumption repository. Works on a node-redis (`redis`, v5) client of the caller's.
import { randomUUID } from 'node:crypto';
import {
  ClientOfflineError,
  ConnectionTimeoutError,
  ErrorReply,
  SocketClosedUnexpectedlyError,
  SocketTimeoutError,
  TimeoutError,
} from 'redis';
import { ENQUEUE_SCRIPT, ENQUEUE_SHA1 } from './script.js';

export { ENQUEUE_SCRIPT, ENQUEUE_SHA1 };

/** The default task stream `S`. */
export const DEFAULT_STREAM = 'xmc-tasks-stream';

/**
 * The value of `local <name> = <expression>` in the enqueue script: its limits, written once there.
 * @param {string} name
 * @returns {number}
 */
function scriptConstant(name) {
  const match = new RegExp(`^local ${name} = ([0-9 *]+)`, 'm').exec(ENQUEUE_SCRIPT);
  if (match === null) throw new Error(`the enqueue script defines no ${name}`);
  return match[1].split('*').reduce((product, factor) => product * Number(factor), 1);
}

/** The script's limits: tasks a call, fields a task, bytes of a key, of a request ID, of a call's arguments. */
export const LIMITS = Object.freeze({
  tasks: scriptConstant('XMC_MAX_TASKS'),
  fields: scriptConstant('XMC_MAX_FIELDS'),
  keyBytes: scriptConstant('XMC_MAX_KEY_BYTES'),
  requestBytes: scriptConstant('XMC_MAX_REQUEST_BYTES'),
  bytes: scriptConstant('XMC_MAX_BYTES'),
});

/** The longest request ID a caller gives (bytes of its UTF-8): chunk `n` of a call appends `/<n>`. */
export const REQUEST_ID_BYTES = 64;

/** How often a call that is safe to repeat is sent again after a connection fault. */
export const RETRIES = 3;

/** The first wait before such a retry (ms); it doubles with each try (100, 200, 400). */
export const RETRY_MS = 100;

const NAME = /^[A-Za-z0-9._:/@+=-]{1,200}$/;
const HEADER_BYTES = String(LIMITS.tasks).length + LIMITS.requestBytes;

/**
 * @typedef {string | number | Buffer} FieldValue
 *   A task's value: text is stored as UTF-8, a number as its text (`String(n)`), a Buffer byte for byte.
 * @typedef {Record<string, FieldValue> | Map<string | Buffer, FieldValue>} Task
 *   A task: a stream entry's field map (1..LIMITS.fields fields).
 * @typedef {string | Buffer | null | undefined} IdempotencyKey
 *   A task's idempotency key: none when null, undefined or empty; else at most LIMITS.keyBytes bytes.
 * @typedef {{destination: 'stream' | 'held', entryId: string, duplicate: boolean}} Enqueued
 *   What one task's enqueue did: where it went and its entry ID there (for a duplicate, the first
 *   enqueue's); duplicate is true when another call had added a task of this key (nothing added),
 *   false when this call added it (also when a resend of it after a lost reply found it added).
 * @typedef {'running' | 'paused' | 'resuming' | 'unknown'} ExperimentState
 * @typedef {{stream: string, state: string, held: string, idempotency: string, idempotencyPrevious: string}} ExperimentKeys
 * @typedef {{keys: string[], arguments: Array<string | Buffer>}} ScriptOptions
 * @typedef {object} RedisLike The node-redis client calls this package makes.
 * @property {(sha1: string, options: ScriptOptions) => Promise<unknown>} evalSha
 * @property {(script: string) => Promise<unknown>} scriptLoad
 * @property {(key: string, value: string) => Promise<unknown>} set
 * @property {(key: string) => Promise<unknown>} get
 * @property {(key: string) => Promise<number>} xLen
 */

/** An enqueue of several calls failed after its first calls were done. */
export class XmcEnqueueError extends Error {
  /**
   * @param {Enqueued[]} enqueued the answers of the tasks done: the first `enqueued.length` tasks
   * @param {number} total how many tasks the enqueue carried
   * @param {unknown} cause the fault of the call that failed
   */
  constructor(enqueued, total, cause) {
    super(
      `enqueued ${enqueued.length} of ${total} tasks, then a call failed (${String(cause)}); ` +
        `tasks ${enqueued.length} and later are not confirmed`,
      { cause },
    );
    this.name = 'XmcEnqueueError';
    this.enqueued = enqueued;
    this.total = total;
  }
}

/**
 * @param {string} what
 * @param {string} value
 * @returns {string}
 */
function validName(what, value) {
  if (typeof value !== 'string' || !NAME.test(value)) {
    throw new RangeError(`${what} ${JSON.stringify(String(value).slice(0, 40))} must be 1 to 200 of A-Z a-z 0-9 . _ : / @ + = -`);
  }
  return value;
}

/**
 * @param {unknown} value
 * @param {string} where
 * @returns {string | Buffer}
 */
function asArgument(value, where) {
  if (typeof value === 'string' || Buffer.isBuffer(value)) return value;
  if (typeof value === 'number') return String(value);
  throw new TypeError(`${where}: a field name or value is a string, a number or a Buffer, got ${typeof value}`);
}

/**
 * Task `i`'s part of the ARGV: its key ('' for none), its field count, its field/value pairs.
 * @param {number} i
 * @param {Task} task
 * @param {IdempotencyKey} key
 * @returns {Array<string | Buffer>}
 */
function taskArguments(i, task, key) {
  const entries = task instanceof Map ? [...task.entries()] : Object.entries(task ?? {});
  if (entries.length === 0) throw new RangeError(`task ${i}: a task needs at least one field`);
  if (entries.length > LIMITS.fields) {
    throw new RangeError(`task ${i}: a task of ${entries.length} fields has more than ${LIMITS.fields}`);
  }
  const raw = key ?? '';
  if (Buffer.byteLength(raw) > LIMITS.keyBytes) {
    throw new RangeError(`task ${i}: an idempotency key has at most ${LIMITS.keyBytes} bytes, got ${Buffer.byteLength(raw)}`);
  }
  /** @type {Array<string | Buffer>} */
  const args = [raw, String(entries.length)];
  for (const [field, value] of entries) {
    if (typeof field !== 'string' && !Buffer.isBuffer(field)) throw new TypeError(`task ${i}: a field name is a string or a Buffer`);
    args.push(field, asArgument(value, `task ${i}`));
  }
  return args;
}

/**
 * The script calls that enqueue `tasks`, in order, every task checked first: chunks of at most
 * LIMITS.tasks tasks and LIMITS.bytes bytes, chunk `n` with the request ID `<requestId>/<n>`.
 * @param {Task[]} tasks
 * @param {IdempotencyKey[] | undefined} idempotencyKeys
 * @param {string | undefined} requestId
 * @returns {{args: Array<string | Buffer>, tasks: number, safe: boolean}[]}
 */
export function enqueueCalls(tasks, idempotencyKeys, requestId) {
  if (!Array.isArray(tasks) || tasks.length === 0) throw new RangeError('an enqueue carries at least one task, got 0');
  if (idempotencyKeys !== undefined && idempotencyKeys.length !== tasks.length) {
    throw new RangeError(`${idempotencyKeys.length} idempotency keys for ${tasks.length} tasks: give one (or null) per task`);
  }
  const base = requestId ?? randomUUID().replaceAll('-', '');
  const baseBytes = Buffer.byteLength(base);
  if (baseBytes < 1 || baseBytes > REQUEST_ID_BYTES) throw new RangeError(`a request ID has 1..${REQUEST_ID_BYTES} bytes, got ${baseBytes}`);
  const room = LIMITS.bytes - HEADER_BYTES;
  /** @type {{args: Array<string | Buffer>, tasks: number, safe: boolean}[]} */
  const chunks = [];
  let chunk = { args: /** @type {Array<string | Buffer>} */ ([]), tasks: 0, safe: true };
  let size = 0;
  tasks.forEach((task, i) => {
    const key = idempotencyKeys?.[i];
    const part = taskArguments(i, task, key);
    const partSize = part.reduce((sum, a) => sum + Buffer.byteLength(a), 0);
    if (partSize > room) throw new RangeError(`task ${i}: holds ${partSize} bytes, more than one enqueue call carries (${room})`);
    if (chunk.tasks === LIMITS.tasks || size + partSize > room) {
      chunks.push(chunk);
      chunk = { args: [], tasks: 0, safe: true };
      size = 0;
    }
    chunk.args.push(...part);
    chunk.tasks += 1;
    chunk.safe &&= Buffer.byteLength(key ?? '') > 0;
    size += partSize;
  });
  chunks.push(chunk);
  return chunks.map((c, n) => ({ args: [String(c.tasks), `${base}/${n}`, ...c.args], tasks: c.tasks, safe: c.safe }));
}

/**
 * A connection fault after which a call may or may not have run (an error reply never is one).
 * @param {unknown} err
 * @returns {boolean}
 */
export function isConnectionFault(err) {
  if (err instanceof ErrorReply) return false;
  if (
    err instanceof SocketClosedUnexpectedlyError ||
    err instanceof ConnectionTimeoutError ||
    err instanceof SocketTimeoutError ||
    err instanceof TimeoutError ||
    err instanceof ClientOfflineError
  ) {
    return true;
  }
  const code = /** @type {{code?: unknown}} */ (err)?.code;
  return typeof code === 'string' && ['ECONNRESET', 'ECONNREFUSED', 'EPIPE', 'ETIMEDOUT'].includes(code);
}

/** @param {number} ms */
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Producers' calls on one task stream, through a node-redis client of the caller's. */
export class XmcProducer {
  /**
   * @param {RedisLike} client a connected node-redis client (`createClient(...)`), strings in and out
   * @param {{stream?: string, retries?: number}} [options] the task stream `S` (DEFAULT_STREAM), and
   *   how often a call that is safe to repeat is sent again after a connection fault (RETRIES)
   */
  constructor(client, { stream = DEFAULT_STREAM, retries = RETRIES } = {}) {
    this.client = client;
    this.stream = validName('stream', stream);
    if (!Number.isInteger(retries) || retries < 0 || retries > 10) throw new RangeError(`retries must be 0..10, got ${retries}`);
    this.retries = retries;
  }

  /**
   * The experiment's keys on this producer's stream.
   * @param {string} experimentId
   * @returns {ExperimentKeys}
   */
  keys(experimentId) {
    const prefix = `{${this.stream}}:experiment:${validName('experiment ID', experimentId)}`;
    return {
      stream: this.stream,
      state: `${prefix}:state`,
      held: `${prefix}:held`,
      idempotency: `${prefix}:idempotency`,
      idempotencyPrevious: `${prefix}:idempotency-previous`,
    };
  }

  /**
   * `fn()`, sent again up to `retries` times after a connection fault when `safe`.
   * @template T
   * @param {() => Promise<T>} fn
   * @param {boolean} safe
   * @returns {Promise<T>}
   */
  async #repeat(fn, safe) {
    for (let attempt = 0; ; attempt += 1) {
      try {
        return await fn();
      } catch (err) {
        if (!safe || attempt >= this.retries || !isConnectionFault(err)) throw err;
        await sleep(RETRY_MS * 2 ** attempt);
      }
    }
  }

  /**
   * Pause the experiment (`SET {S}:experiment:E:state paused`): its new tasks are held, and a
   * running replay stops at its next turn. Retried after a connection fault.
   * @param {string} experimentId
   * @returns {Promise<void>}
   */
  async pause(experimentId) {
    const { state } = this.keys(experimentId);
    await this.#repeat(() => this.client.set(state, 'paused'), true);
  }

  /**
   * The experiment's pause or resume state as the scripts read it: `running` when the state key is
   * absent, `paused`, `resuming`, or `unknown` for any other value (which holds tasks too).
   * @param {string} experimentId
   * @returns {Promise<ExperimentState>}
   */
  async state(experimentId) {
    const { state } = this.keys(experimentId);
    const value = await this.#repeat(() => this.client.get(state), true);
    if (value === null || value === undefined) return 'running';
    return value === 'paused' || value === 'resuming' ? value : 'unknown';
  }

  /**
   * Held tasks of the experiment (entries of its held stream).
   * @param {string} experimentId
   * @returns {Promise<number>}
   */
  async held(experimentId) {
    const { held } = this.keys(experimentId);
    return this.#repeat(() => this.client.xLen(held), true);
  }

  /**
   * Enqueue one task: to the task stream while the experiment runs, else behind its held tasks.
   * @param {string} experimentId
   * @param {Task} task
   * @param {{idempotencyKey?: IdempotencyKey, requestId?: string}} [options] see enqueueMany
   * @returns {Promise<Enqueued>}
   */
  async enqueue(experimentId, task, { idempotencyKey, requestId } = {}) {
    const [done] = await this.enqueueMany(experimentId, [task], { idempotencyKeys: [idempotencyKey], requestId });
    return done;
  }

  /**
   * Enqueue any number of tasks in order, in atomic script calls (chunks) of up to LIMITS.tasks
   * tasks and LIMITS.bytes bytes; every task is checked before the first call. A chunk whose every
   * task has an idempotency key is sent again after a connection fault, with its request ID (a
   * task its lost first send added is answered as then: not a duplicate); any other is not (an
   * unkeyed task would be added twice), and the fault is thrown.
   * @param {string} experimentId
   * @param {Task[]} tasks
   * @param {{idempotencyKeys?: IdempotencyKey[], requestId?: string}} [options] one key (or null)
   *   per task; the enqueue's request ID (1..REQUEST_ID_BYTES bytes; default a new one): give one
   *   to retry a failed enqueue yourself with the same tasks and keys, and get the first answers
   * @returns {Promise<Enqueued[]>} one per task, in order
   * @throws {RangeError | TypeError} a bad name, task, key or request ID; nothing was sent
   * @throws {XmcEnqueueError} a chunk after the first failed (`enqueued`: the chunks done before it)
   */
  async enqueueMany(experimentId, tasks, { idempotencyKeys, requestId } = {}) {
    const keys = this.keys(experimentId);
    /** @type {Enqueued[]} */
    const done = [];
    for (const call of enqueueCalls(tasks, idempotencyKeys, requestId)) {
      let reply;
      try {
        reply = await this.#repeat(() => this.#send(keys, call.args), call.safe);
      } catch (err) {
        if (done.length === 0) throw err;
        throw new XmcEnqueueError(done, tasks.length, err);
      }
      for (const [destination, entryId, duplicate] of /** @type {[string, string, number][]} */ (reply)) {
        done.push({ destination: destination === 'held' ? 'held' : 'stream', entryId: String(entryId), duplicate: Number(duplicate) === 1 });
      }
    }
    return done;
  }

  /**
   * One enqueue script call (EVALSHA; after NOSCRIPT, SCRIPT LOAD and EVALSHA again): the one place
   * the package calls the script. Returns its reply.
   * @param {ExperimentKeys} keys
   * @param {Array<string | Buffer>} args
   * @returns {Promise<unknown>}
   */
  async #send(keys, args) {
    const options = {
      keys: [keys.stream, keys.state, keys.held, keys.idempotency, keys.idempotencyPrevious],
      arguments: args,
    };
    try {
      return await this.client.evalSha(ENQUEUE_SHA1, options);
    } catch (err) {
      if (!(err instanceof ErrorReply && err.message.startsWith('NOSCRIPT'))) throw err;
      await this.client.scriptLoad(ENQUEUE_SCRIPT); // a restarted Redis has an empty script cache
      return this.client.evalSha(ENQUEUE_SHA1, options);
    }
  }
}
