"""The backlog sampler of figure b: ``python -m bench.sampler URL STREAM GROUP HELD``.

In its own process, so the bench's event loop (consumers, the Temporal client) cannot delay its readings.

Every ``EVERY_S`` seconds it reads the group's exact backlog (``measure_backlog`` with a threshold far
above the replay's, so the count never stops at a cap) and the held tasks, until its stdin closes;
then it prints a ``BacklogSamples`` as JSON. Times are ``time.monotonic()``, which on Linux is one
clock for every process, so they compare with the bench's.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass

from redis.asyncio import Redis

from xmc_resumption.redisclient.backlog import measure_backlog
from xmc_resumption.redisclient.keys import ExperimentKeys

EXACT_THRESHOLD = 100_000
"""The sampler's threshold: far above the replay's, so its backlog count is exact."""

EVERY_S = 0.002
"""Pause between two readings (seconds); a reading itself takes two round trips."""


@dataclass
class BacklogSamples:
    """The sampler's record.

    Attributes:
        max_backlog: the highest exact backlog seen (entries).
        samples: readings taken.
        max_gap_s: the longest time between two readings (seconds).
        mean_gap_s: the mean time between two readings (seconds).
        gaps_over_10ms: how many times two readings were more than 10 ms apart.
        held_empty_s: monotonic time of the first reading with no task held (seconds), or None.
        starved_s: seconds (between readings) when the group had nothing delivered or to deliver
            (backlog 0) while tasks were still held: a cross-check of the consumers' idle time.
    """

    max_backlog: int = 0
    samples: int = 0
    max_gap_s: float = 0.0
    mean_gap_s: float = 0.0
    gaps_over_10ms: int = 0
    held_empty_s: float | None = None
    starved_s: float = 0.0


async def sample(redis: Redis, stream: str, group: str, held_key: str, stop: asyncio.Event) -> BacklogSamples:
    """Read the exact backlog of ``group`` on ``stream`` and the length of ``held_key`` until ``stop``."""
    out = BacklogSamples()
    first: float | None = None
    previous: float | None = None
    previous_idle = False
    while not stop.is_set():
        reading = await measure_backlog(redis, stream, group, EXACT_THRESHOLD, groups=[group])
        held = int(await redis.xlen(held_key))
        now = time.monotonic()
        if previous is not None:
            out.max_gap_s = max(out.max_gap_s, now - previous)
            out.gaps_over_10ms += now - previous > 0.010
            out.starved_s += now - previous if previous_idle else 0.0
        first = now if first is None else first
        out.samples += 1
        out.max_backlog = max(out.max_backlog, reading.backlog)
        if held == 0 and out.held_empty_s is None:
            out.held_empty_s = now
        previous, previous_idle = now, held > 0 and reading.backlog == 0
        await asyncio.sleep(EVERY_S)
    if first is not None and previous is not None and out.samples > 1:
        out.mean_gap_s = (previous - first) / (out.samples - 1)
    return out


async def _main(url: str, stream: str, group: str, held_key: str) -> None:
    redis = Redis.from_url(url, decode_responses=False)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    reader = loop.run_in_executor(None, sys.stdin.read)
    reader.add_done_callback(lambda _: stop.set())
    await redis.ping()
    print("ready", flush=True)
    out = await sample(redis, stream, group, held_key, stop)
    await redis.aclose()
    print(json.dumps(asdict(out)), flush=True)


class SamplerResult:
    """Filled when ``sampler_process`` ends: ``samples`` is then the sampler's record."""

    samples: BacklogSamples


@asynccontextmanager
async def sampler_process(url: str, keys: ExperimentKeys, group: str) -> AsyncIterator[SamplerResult]:
    """Run the sampler in its own process for the block; its record is in the yielded object after."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.sampler", url, keys.stream, group, keys.held, stdin=PIPE, stdout=PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None
    await proc.stdout.readline()  # "ready": connected
    result = SamplerResult()
    try:
        yield result
    finally:
        proc.stdin.close()
        out, _ = await proc.communicate()
    result.samples = BacklogSamples(**json.loads(out))


if __name__ == "__main__":
    asyncio.run(_main(*sys.argv[1:5]))
    gc.collect()
