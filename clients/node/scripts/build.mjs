// Writes src/script.js: the enqueue script of this release, copied from the Python package's
// xmc_resumption/redisclient/lua/enqueue.lua (the one source), with its SHA1. Run by `npm run build`
// (and so by `npm test` and `npm pack`); the package carries the copy and never reads a Python install.
import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';

const source = new URL('../../../xmc_resumption/redisclient/lua/enqueue.lua', import.meta.url);
const text = readFileSync(source, 'utf8');
const sha1 = createHash('sha1').update(text).digest('hex');
const out = new URL('../src/script.js', import.meta.url);
writeFileSync(
  out,
  '// Written by scripts/build.mjs from xmc_resumption/redisclient/lua/enqueue.lua: do not edit.\n\n' +
    '/** The enqueue script of this release, byte for byte. */\n' +
    `export const ENQUEUE_SCRIPT = ${JSON.stringify(text)};\n\n` +
    '/** The SHA1 of ENQUEUE_SCRIPT (hex): the name EVALSHA calls it by. */\n' +
    `export const ENQUEUE_SHA1 = ${JSON.stringify(sha1)};\n`,
);
