"""Consumers that really sustain a rate, and a sampler of the group's backlog, for figure b.

The consumer reads with ``XREADGROUP`` and a large COUNT, acknowledges in bulk with one ``XACK``,
and is paced by a token bucket on the monotonic clock, so it drains at its rate R whenever the group
has entries to deliver. A read that finds nothing is a starved interval: from that read until the
next read that brings entries. ``calibrate`` measures the rate a consumer sustains when entries
are plentiful (a pre-filled stream of its own), which is the R of figure b.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from redis.asyncio import Redis

from bench.backlog_cost import fill
from xmc.consumer import entries_of

BURST_SECONDS = 0.02
"""The token bucket holds at most this many seconds of the rate (and at least 1 token)."""

MAX_COUNT = 2_000
"""The most entries one XREADGROUP asks for."""

CALIBRATION_SECONDS = 1.0
"""How long a calibration drain lasts at the target rate (seconds)."""


@dataclass
class PacedConsumer:
    """One consumer's record.

    Attributes:
        rate: its target rate (entries/s).
        consumed: the task numbers it read, in order.
        first_s, last_s: monotonic times of its first and last read that brought entries (seconds).
        first_batch: entries of the first such read (not paid for by time after first_s).
        reads: (monotonic time, entries) of every read that brought entries.
        starved: [start, end) monotonic intervals when its reads found nothing (seconds).
    """

    rate: float
    consumed: list[int] = field(default_factory=list)
    first_s: float | None = None
    last_s: float | None = None
    first_batch: int = 0
    reads: list[tuple[float, int]] = field(default_factory=list)
    starved: list[tuple[float, float]] = field(default_factory=list)

    def starved_within(self, start: float, end: float) -> float:
        """Seconds starved within [start, end)."""
        return sum(max(0.0, min(b, end) - max(a, start)) for a, b in self.starved)

    def read_within(self, start: float, end: float) -> int:
        """Entries read within [start, end)."""
        return sum(n for t, n in self.reads if start <= t < end)

    def busy_rate(self) -> float:
        """Entries per second from its first to its last read, starved time (empty reads) excluded;
        a read that brought fewer entries than asked is not counted as starved, so this is at most
        the rate it sustains when entries are plentiful (``calibrate``)."""
        if self.first_s is None or self.last_s is None or self.last_s <= self.first_s:
            return 0.0
        busy = (self.last_s - self.first_s) - self.starved_within(self.first_s, self.last_s)
        return (len(self.consumed) - self.first_batch) / busy if busy > 0 else 0.0


async def run_paced_consumer(
    redis: Redis, stream: str, group: str, name: str, record: PacedConsumer, stop: asyncio.Event
) -> None:
    """Consume ``stream`` in ``group`` at ``record.rate`` entries/s until ``stop`` is set."""
    burst = max(1.0, record.rate * BURST_SECONDS)
    tokens, last = burst, time.monotonic()
    starved_since: float | None = None
    while not stop.is_set():
        now = time.monotonic()
        tokens, last = min(burst, tokens + (now - last) * record.rate), now
        if tokens < 1:
            await asyncio.sleep((1 - tokens) / record.rate)
            continue
        ask = min(MAX_COUNT, int(tokens))
        read_at = time.monotonic()
        entries = entries_of(await redis.xreadgroup(group, name, {stream: ">"}, count=ask, block=2))
        if not entries:
            starved_since = read_at if starved_since is None else starved_since
            continue
        got = time.monotonic()
        if starved_since is not None:
            record.starved.append((starved_since, read_at))
            starved_since = None
        if record.first_s is None:
            record.first_s, record.first_batch = got, len(entries)
        record.last_s = got
        record.reads.append((got, len(entries)))
        record.consumed += [int(fields.get(b"n", b"-1")) for _, fields in entries]
        await redis.xack(stream, group, *[entry_id for entry_id, _ in entries])
        tokens -= len(entries)
    if starved_since is not None:
        record.starved.append((starved_since, time.monotonic()))


async def calibrate(redis: Redis, rate: float, name: str = "calibration") -> float:
    """The rate (entries/s) a paced consumer sustains on a stream holding more than it can read in
    ``CALIBRATION_SECONDS``: its own stream and group, deleted afterwards."""
    stream, group = f"bench-calibrate-{name}", "bench-group"
    count = max(200, round(rate * CALIBRATION_SECONDS))
    await redis.delete(stream)
    await fill(redis, count, 80, stream)  # the group is created at 0
    record, stop = PacedConsumer(rate), asyncio.Event()
    task = asyncio.create_task(run_paced_consumer(redis, stream, group, name, record, stop))
    while len(record.consumed) < count and not task.done():
        await asyncio.sleep(0.01)
    stop.set()
    await task
    await redis.delete(stream)
    return record.busy_rate()
