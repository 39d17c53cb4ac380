"""Figures b and e: pacing against consumers that really drain at a rate R, per throttle policy.

For each policy and consumer rate: N held tasks, threshold 500, a group created at 0 before the
replay, paced consumers (``bench.consumers``) and a backlog sampler in its own process
(``bench.sampler``). Reported: the wall time (workflow start -> result; also start -> the
consumers' last read) over the ideal N / R (R: the
rate the consumers sustain on a full stream, measured just before by ``calibrate``), their idle
fraction while tasks were still held (1 - entries they read from the start until the held stream
was empty / (R x that time); also from their empty reads, and from the sampler: backlog 0 while
tasks were held), the highest backlog sampled, and the history events of the continue-as-new chain
(per 1,000 tasks, per throttle wait, largest run).

The input is built as a dict and ``throttle_policy`` is included only for a policy other than
``fixed``, so a build without the field still runs the fixed rows and reports the others as skipped.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from bench.consumers import PacedConsumer, calibrate, read_count, run_paced_consumer
from bench.env import BenchEnv
from bench.replay import build_input, run_resumption
from bench.sampler import sampler_process
from bench.tasks import check_replay, hold_tasks
from xmc_resumption.redisclient.keys import DEFAULT_GROUP, DEFAULT_STREAM, ExperimentKeys

THRESHOLD = 500
DRAIN_TIMEOUT_S = 60.0
"""How long after the result the consumers may take to read the last tasks (seconds)."""


@dataclass(frozen=True)
class PacingCase:
    """One row of figure b: consumer rate (entries/s), held tasks (entries), the fixed policy's wait (s)."""

    rate: float
    tasks: int
    throttle_seconds: float
    consumers: int = 1


FULL_CASES = (
    PacingCase(200, 2_000, 10.0),
    PacingCase(2_000, 5_000, 10.0),
    PacingCase(20_000, 20_000, 1.0),
)
SMOKE_CASES = (PacingCase(2_000, 2_000, 1.0),)


def pacing_input(experiment_id: str, case: PacingCase, policy: str, batch: int) -> dict[str, Any]:
    """The workflow input as a dict; ``throttle_policy`` only when it is not ``fixed``."""
    fields: dict[str, Any] = {
        "experiment_id": experiment_id,
        "batch_size": batch,
        "max_backlog_threshold": THRESHOLD,
        "throttle_seconds": case.throttle_seconds,
    }
    if policy != "fixed":
        fields["throttle_policy"] = policy
    return fields


async def _drained(records: list[PacedConsumer], count: int) -> None:
    """Wait until the consumers have read ``count`` entries between them, or the timeout passes."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while sum(len(r.consumed) for r in records) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


async def pacing_run(
    env: BenchEnv, case: PacingCase, policy: str, batch: int, ack_on_read: bool = False
) -> dict[str, Any]:
    """One row of figure b (and its history figures for e)."""
    keys = ExperimentKeys(DEFAULT_STREAM, f"bench-b-{policy}-{uuid.uuid4().hex[:8]}")
    row: dict[str, Any] = {"policy": policy, "rate_target": case.rate, "tasks": case.tasks, "batch": batch}
    row |= {"throttle_seconds": case.throttle_seconds, "consumers": case.consumers}
    row |= {
        "read_count": read_count(case.rate / case.consumers),
        "ack": "on read" if ack_on_read else "after processing",
    }
    try:
        inp = build_input(pacing_input(keys.experiment_id, case, policy, batch))
    except ValidationError as err:
        return {**row, "skipped": f"this build has no {policy} policy ({err.errors()[0]['msg']})"}
    rate = sum([await calibrate(env.redis, case.rate / case.consumers, ack_on_read) for _ in range(case.consumers)])
    await env.redis.delete(keys.stream)
    await env.redis.xgroup_create(keys.stream, DEFAULT_GROUP, id="0", mkstream=True)
    await hold_tasks(env.redis, keys, case.tasks)
    stop = asyncio.Event()
    records = [PacedConsumer(case.rate / case.consumers) for _ in range(case.consumers)]
    tasks = [
        asyncio.create_task(run_paced_consumer(env.redis, keys.stream, DEFAULT_GROUP, f"c{i}", r, stop, ack_on_read))
        for i, r in enumerate(records)
    ]
    try:
        async with sampler_process(env.redis_url, keys, DEFAULT_GROUP) as sampler:
            started = time.monotonic()
            run = await run_resumption(env, inp)
            await _drained(records, case.tasks)
            drained_s = max((r.last_s or started) for r in records) - started
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    samples = sampler.samples
    held_until = samples.held_empty_s or started + run.wall_s
    window = max(held_until - started, 1e-9)
    consumed = sorted(n for r in records for n in r.consumed)
    check = await check_replay(env.redis, keys, case.tasks)
    await env.redis.delete(keys.stream)
    throttles = run.result.throttles
    read_while_held = sum(r.read_within(started, held_until) for r in records)
    return {
        **row,
        "rate_measured": rate,
        "rate_in_run": sum(r.busy_rate() for r in records),
        "wall_s": run.wall_s,
        "ideal_s": case.tasks / rate,
        "wall_over_ideal": run.wall_s * rate / case.tasks,
        "drained_s": drained_s,
        "drained_over_ideal": drained_s * rate / case.tasks,
        "held_s": window,
        "idle_fraction": max(0.0, 1 - read_while_held / (rate * window)),
        "idle_fraction_empty_reads": sum(r.starved_within(started, held_until) for r in records)
        / len(records)
        / window,
        "idle_fraction_sampled": samples.starved_s / window,
        "max_backlog": samples.max_backlog,
        "threshold": THRESHOLD,
        "samples": samples.samples,
        "max_sample_gap_ms": samples.max_gap_s * 1000,
        "mean_sample_gap_ms": samples.mean_gap_s * 1000,
        "sample_gaps_over_10ms": samples.gaps_over_10ms,
        "throttles": throttles,
        "turns": run.result.turns,
        "runs": run.result.runs,
        "events": run.events,
        "events_per_run": run.events_per_run,
        "largest_run_events": run.largest_run_events,
        "events_per_1000_tasks": run.events / case.tasks * 1000,
        "events_per_throttle_wait": run.events / throttles if throttles else None,
        "exactly_once": check.exactly_once and consumed == list(range(case.tasks)),
    }


async def pacing(
    env: BenchEnv, cases: tuple[PacingCase, ...], policies: tuple[str, ...], batch: int, ack_on_read: bool = False
) -> list[dict[str, Any]]:
    """Figure b for every policy and case, in that order."""
    return [await pacing_run(env, case, policy, batch, ack_on_read) for policy in policies for case in cases]
