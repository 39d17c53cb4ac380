"""Consumers that really sustain a rate, and a sampler of the group's backlog, for figure b.

The consumer reads with ``XREADGROUP`` and a large COUNT, "processes" the entries on a token bucket
on the monotonic clock, and acknowledges them in bulk with one ``XACK``, so it drains at its rate R
whenever the group has entries to deliver. A read that finds nothing is a starved interval: from that read until the
next read that brings entries. ``calibrate`` measures the rate a consumer sustains when entries
are plentiful (a pre-filled stream of its own), which is the R of figure b.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from redis.asyncio import Redis

from bench.backlog_cost import fill
from xmc_resumption.consumer import entries_of

BURST_SECONDS = 0.02
"""The token bucket's credit: a consumer that was idle may get ahead by at most this (seconds)."""

READ_SECONDS = 0.05
"""One read asks for this much work at the consumer's rate (seconds): COUNT 10 at 200/s, 1,000 at 20,000/s."""

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
        """Entries per second from its first to its last read, starved time (empty reads) excluded.

        A read that brought fewer entries than asked is not counted as starved, so this is at most the rate it
        sustains when entries are plentiful (``calibrate``).
        """
        if self.first_s is None or self.last_s is None or self.last_s <= self.first_s:
            return 0.0
        busy = (self.last_s - self.first_s) - self.starved_within(self.first_s, self.last_s)
        return (len(self.consumed) - self.first_batch) / busy if busy > 0 else 0.0


def read_count(rate: float) -> int:
    """COUNT of one XREADGROUP at ``rate`` entries/s: ``READ_SECONDS`` of work, 1..``MAX_COUNT``."""
    return max(1, min(MAX_COUNT, round(rate * READ_SECONDS)))


async def run_paced_consumer(
    redis: Redis,
    stream: str,
    group: str,
    name: str,
    record: PacedConsumer,
    stop: asyncio.Event,
    ack_on_read: bool = False,
) -> None:
    """Consume ``stream`` in ``group`` at ``record.rate`` entries/s until ``stop`` is set.

    Each read takes up to ``read_count(rate)`` entries; "processing" them takes len / rate seconds
    on a token bucket (at most ``BURST_SECONDS`` of credit), then one XACK acknowledges them all, so
    they count as pending while processed, as with a real worker. ``ack_on_read`` acknowledges
    right after the read instead (the backlog then drops as soon as entries are delivered).
    """
    count, rate = read_count(record.rate), record.rate
    free_at = time.monotonic()
    starved_since: float | None = None
    while not stop.is_set():
        read_at = time.monotonic()
        entries = entries_of(await redis.xreadgroup(group, name, {stream: ">"}, count=count, block=2))
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
        ids = [entry_id for entry_id, _ in entries]
        if ack_on_read:
            await redis.xack(stream, group, *ids)
        free_at = max(got - BURST_SECONDS, free_at) + len(entries) / rate
        await asyncio.sleep(max(0.0, free_at - time.monotonic()))
        if not ack_on_read:
            await redis.xack(stream, group, *ids)
    if starved_since is not None:
        record.starved.append((starved_since, time.monotonic()))


async def calibrate(redis: Redis, rate: float, ack_on_read: bool, name: str = "calibration") -> float:
    """The rate (entries/s) a paced consumer sustains on a stream holding more than it can read.

    Measured over ``CALIBRATION_SECONDS`` on its own stream and group, deleted afterwards.
    """
    stream, group = f"bench-calibrate-{name}", "bench-group"
    count = max(200, round(rate * CALIBRATION_SECONDS))
    await redis.delete(stream)
    await fill(redis, count, 80, stream)  # the group is created at 0
    record, stop = PacedConsumer(rate), asyncio.Event()
    task = asyncio.create_task(run_paced_consumer(redis, stream, group, name, record, stop, ack_on_read))
    while len(record.consumed) < count and not task.done():
        await asyncio.sleep(0.01)
    stop.set()
    await task
    await redis.delete(stream)
    return record.busy_rate()
