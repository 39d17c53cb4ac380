"""Figure p: the pacing cases of issue 17, one row each (``python -m bench --only p``).

Every row replays held tasks against consumers whose behaviour is scripted over time and reports
how close the replay came to the ideal, and its history events per 1,000 tasks:

- ``smooth``: paced consumers at 2,000/s (``bench.consumers``), the adaptive policy;
- ``bursty``: a consumer that takes 200 entries every 100 ms (2,000/s) and acknowledges them at once;
- ``stop``: paced at 2,000/s, stopped for ``STOP_SECONDS`` (30 s, as in the issue) after
  ``CHANGE_AT_SECONDS``, then restarted; the ratio is the rest of the replay (restart -> last task read)
  over its ideal (tasks not yet read at the restart / R);
- ``faster``: paced at 200/s until ``CHANGE_AT_SECONDS``, then 2,000/s; the ratio is the rest of the
  replay over its ideal, as for ``stop``;
- ``defaults``: the default input (only the experiment ID: batch, threshold, policy and wait as
  shipped) against paced consumers at 2,000/s;
- ``batch`` rows: figure a's unthrottled workflow over the bare atomic move, per batch size.

The replays rows of issue 17 (10 and 100 replays at once on one stream) are figure m's (``bench.many``).

R is the rate the paced consumers sustain on a full stream (``calibrate``), nominal for the bursty
one. ``x ideal`` is (workflow start -> the consumers' last read) over the ideal, which counts the
time the last threshold's worth of entries takes to drain; ``wall/ideal`` (start -> result) is
figure b's ratio.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from bench import throughput
from bench.consumers import BURST_SECONDS, calibrate, read_count
from bench.env import BenchEnv
from bench.replay import build_input, run_resumption
from bench.tasks import check_replay, hold_tasks
from xmc_resumption.consumer import entries_of
from xmc_resumption.redisclient.keys import DEFAULT_GROUP, DEFAULT_STREAM, ExperimentKeys

RATE = 2_000.0
"""The consumers' rate of the smooth, bursty, stop and defaults rows (entries/s)."""

THRESHOLD = 500
BURST, BURST_PERIOD_S = 200, 0.1
CHANGE_AT_SECONDS = 1.5
"""When the stop and faster rows change the consumers (seconds after the workflow start)."""

STOP_SECONDS = 30.0
"""How long the stop row's consumers stop (seconds)."""

DRAIN_TIMEOUT_S = 120.0
"""How long after the result the consumers may take to read the last tasks (seconds)."""

BATCHES = (100, 1_000, 5_000)
BATCH_TASKS = 10_000


@dataclass(frozen=True)
class Case:
    """One consumer-driven row: name, held tasks, the input's extra fields, the consumers' schedule.

    The schedule is ``(seconds after the start, rate)`` (rate 0: stopped); ``burst``: 200 every 100 ms.
    """

    name: str
    tasks: int
    fields: dict[str, Any]
    schedule: tuple[tuple[float, float], ...] = ((0.0, RATE),)
    burst: bool = False

    def rate_at(self, seconds: float) -> float:
        """The scheduled rate ``seconds`` after the start (entries/s)."""
        rate = self.schedule[0][1]
        for at, r in self.schedule:
            if seconds >= at:
                rate = r
        return rate

    @property
    def change_at(self) -> float | None:
        """When the schedule last changes (seconds), or None for a steady one."""
        return self.schedule[-1][0] if len(self.schedule) > 1 else None


ADAPTIVE = {"max_backlog_threshold": THRESHOLD, "throttle_policy": "adaptive"}
CASES = (
    Case("smooth", 10_000, ADAPTIVE),
    Case("bursty", 6_000, ADAPTIVE, burst=True),
    Case("stop", 8_000, ADAPTIVE, ((0.0, RATE), (CHANGE_AT_SECONDS, 0.0), (CHANGE_AT_SECONDS + STOP_SECONDS, RATE))),
    Case("faster", 6_000, ADAPTIVE, ((0.0, RATE / 10), (CHANGE_AT_SECONDS, RATE))),
    Case("defaults", 1_500, {}),
)


@dataclass
class Reads:
    """What the consumers read: (monotonic time, entries) of every non-empty read, task numbers."""

    reads: list[tuple[float, int]] = field(default_factory=list)
    consumed: list[int] = field(default_factory=list)

    def add(self, at: float, entries: list[Any]) -> None:
        """Record a read at monotonic time ``at`` that brought ``entries``."""
        self.reads.append((at, len(entries)))
        self.consumed += [int(fields.get(b"n", b"-1")) for _, fields in entries]

    def read_before(self, at: float) -> int:
        """Entries read before monotonic time ``at``."""
        return sum(n for t, n in self.reads if t < at)


async def _consume(redis: Redis, stream: str, case: Case, started: float, reads: Reads, stop: asyncio.Event) -> None:
    """One consumer following ``case``'s schedule.

    Paced on a token bucket (as ``bench.consumers``, acknowledging after processing), or ``BURST`` entries every
    ``BURST_PERIOD_S`` acknowledged at once.
    """
    free_at, tick = time.monotonic(), started
    while not stop.is_set():
        now = time.monotonic()
        rate = case.rate_at(now - started)
        if rate <= 0:
            await asyncio.sleep(0.005)
            free_at = time.monotonic()
            continue
        count = BURST if case.burst else read_count(rate)
        entries = entries_of(await redis.xreadgroup(DEFAULT_GROUP, "c0", {stream: ">"}, count=count, block=2))
        got = time.monotonic()
        if entries:
            reads.add(got, entries)
        ids = [entry_id for entry_id, _ in entries]
        if case.burst:
            if ids:
                await redis.xack(stream, DEFAULT_GROUP, *ids)
            tick += BURST_PERIOD_S
            await asyncio.sleep(max(0.0, tick - time.monotonic()))
            continue
        if not ids:
            continue
        free_at = max(got - BURST_SECONDS, free_at) + len(ids) / rate
        await asyncio.sleep(max(0.0, free_at - time.monotonic()))
        await redis.xack(stream, DEFAULT_GROUP, *ids)


async def case_run(env: BenchEnv, case: Case, rate: float) -> dict[str, Any]:
    """One consumer-driven row, ``rate``: the calibrated 2,000/s (nominal for the bursty consumer)."""
    keys = ExperimentKeys(DEFAULT_STREAM, f"bench-p-{case.name}-{uuid.uuid4().hex[:8]}")
    inp = build_input({"experiment_id": keys.experiment_id, **case.fields})
    await env.redis.delete(keys.stream)
    await env.redis.xgroup_create(keys.stream, DEFAULT_GROUP, id="0", mkstream=True)
    await hold_tasks(env.redis, keys, case.tasks)
    reads, stop = Reads(), asyncio.Event()
    started = time.monotonic()
    consumer = asyncio.create_task(_consume(env.redis, keys.stream, case, started, reads, stop))
    try:
        run = await run_resumption(env, inp)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while len(reads.consumed) < case.tasks and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    finally:
        stop.set()
        await consumer
    check = await check_replay(env.redis, keys, case.tasks)
    await env.redis.delete(keys.stream)
    last = reads.reads[-1][0] if reads.reads else started
    row: dict[str, Any] = {
        "row": case.name,
        "tasks": case.tasks,
        "policy": inp.throttle_policy.value,
        "batch": inp.batch_size,
        "threshold": inp.max_backlog_threshold,
        "rate": rate,
        "wall_s": run.wall_s,
        "wall_over_ideal": run.wall_s * rate / case.tasks,
        "drained_s": last - started,
        "throttles": run.result.throttles,
        "turns": run.result.turns,
        "events": run.events,
        "largest_run_events": run.largest_run_events,
        "events_per_1000_tasks": run.events / case.tasks * 1000,
        "exactly_once": check.exactly_once and sorted(reads.consumed) == list(range(case.tasks)),
    }
    if case.change_at is None:
        ideal = case.tasks / rate
        return row | {"ideal_s": ideal, "over_ideal": (last - started) / ideal}
    change = started + case.change_at
    rest = case.tasks - reads.read_before(change)
    ideal = rest / rate
    idle = max(0.0, 1 - rest / (rate * max(last - change, 1e-9)))
    return row | {"ideal_s": ideal, "rest_s": last - change, "over_ideal": (last - change) / ideal, "idle": idle}


async def scenarios(env: BenchEnv) -> dict[str, Any]:
    """Figure p: the consumer rows, then the batch rows, under the worker of ``bench.run``."""
    rate = await calibrate(env.redis, RATE, False)
    rows = []
    for case in CASES:
        print(f"p: {case.name}", flush=True)
        rows.append(await case_run(env, case, RATE if case.burst else rate))
    print(f"p: batches {BATCHES}, {BATCH_TASKS} tasks", flush=True)
    batches = await throughput.throughput(env, BATCH_TASKS, BATCHES, 1)
    keep = ("batch", "tasks", "ratio", "workflow_ms_per_turn", "exactly_once")
    return {
        "rows": rows,
        "batches": [
            {k: r[k] for k in keep} | {"events_per_1000_tasks": r["workflow_runs"][0]["events"] / r["tasks"] * 1000}  # type: ignore[index]
            for r in batches
        ],
    }


def lines(p: dict[str, Any]) -> list[str]:
    """Figure p's table."""
    out = [
        "p. pacing cases of issue 17 (x ideal = start -> last task read over N / R; stop, faster: restart or "
        f"speed-up -> last read over the rest / R; the stop lasts {STOP_SECONDS:g} s; events per 1,000 tasks)"
    ]
    out.append(f"{'row':>12} {'policy':>8} {'N':>6} {'R':>6} {'x ideal':>8} {'wall/ideal':>10} {'idle':>6} "
               f"{'waits':>5} {'ev/1k':>6} {'once':>4}")  # fmt: skip
    for r in p["rows"]:
        idle = f"{r['idle']:.0%}" if "idle" in r else "-"
        out.append(
            f"{r['row']:>12} {r['policy']:>8} {r['tasks']:>6} {r['rate']:>6.0f} {r['over_ideal']:>8.2f} "
            f"{r['wall_over_ideal']:>10.2f} {idle:>6} {r['throttles']:>5} {r['events_per_1000_tasks']:>6.1f} "
            f"{'yes' if r['exactly_once'] else 'NO':>4}"
        )
    for r in p["batches"]:
        events = f", {r['events_per_1000_tasks']:.1f} events / 1k tasks" if "events_per_1000_tasks" in r else ""
        out.append(f"{'batch ' + str(r['batch']):>12} unthrottled workflow / bare atomic move: {r['ratio']:.2f} "
                   f"({r['workflow_ms_per_turn']:.2f} ms a turn, {r['tasks']} tasks{events})")  # fmt: skip
    return out
