"""Figure h: the ETA's accuracy against a steady consumer (docs/operating.md, "ETA").

For each case: N held tasks, threshold 500, a group created at 0 before the replay, one paced
consumer (``bench.consumers``) at rate R. While the replay runs the bench asks its ``progress``
query every ``POLL_SECONDS``; the first answer at or past 10 %, 25 %, 50 % and 75 % of N moved gives
the ETA then (``eta_seconds``, as of the reading at workflow time ``eta_at - eta_seconds``). The
ETA is the time until the last held task moves, so the actual time left is when the last task
reached the task stream (its entry ID's milliseconds: Redis's clock; Redis, the dev server and the
worker share this machine's clock) minus that reading's time; the error is
``|eta - actual| / actual``, and the figure is the worst error over the marks. An ETA still
unknown at a mark counts as a failure (no error can be given).

A query is answered when the workflow task in progress completes, and an adaptive replay chains
local activities (short polls) in one task for up to its heartbeat (80 % of the task timeout,
10 s by default), so the bench starts its runs with a workflow task timeout of
``TASK_TIMEOUT_SECONDS``: answers come at least that often. It changes when the progress is seen,
not what it says.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.consumers import PacedConsumer, calibrate, run_paced_consumer
from bench.env import BenchEnv
from bench.tasks import check_replay, hold_tasks
from xmc_resumption.redisclient.keys import DEFAULT_GROUP, DEFAULT_STREAM, ExperimentKeys
from xmc_resumption.workflows.models import Progress, ResumptionInput
from xmc_resumption.workflows.resumption import ResumptionWorkflow

THRESHOLD = 500
MARKS = (0.10, 0.25, 0.50, 0.75)
POLL_SECONDS = 0.05
TASK_TIMEOUT_SECONDS = 1.0
QUERY_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class EtaCase:
    """One row of figure h: throttle policy, consumer rate (entries/s), held tasks, the fixed wait (s)."""

    policy: str
    rate: float
    tasks: int
    throttle_seconds: float = 1.0


FULL_CASES = (
    EtaCase("adaptive", 1_000, 30_000),
    EtaCase("adaptive", 200, 6_000),
    EtaCase("fixed", 1_000, 20_000, 1.0),
)
"""Replays of about 30 s: 10 % moves after a few seconds, a few of the fixed policy's waits."""
SMOKE_CASES = (EtaCase("adaptive", 1_000, 5_000),)
"""A 5 s replay: it runs the figure; 10 % moves before a second of readings, so its ETA is unknown
there, and the target is checked in full runs only."""


async def _readings(handle: Any, result: asyncio.Future[Any]) -> list[Progress]:
    """Every distinct progress the run answered while it ran."""
    seen: list[Progress] = []
    while not result.done():
        try:
            progress: Progress = await asyncio.wait_for(
                handle.query(ResumptionWorkflow.progress), QUERY_TIMEOUT_SECONDS
            )
        except Exception:  # not ready yet, or ending: the loop sees the result
            await asyncio.sleep(POLL_SECONDS)
            continue
        if not seen or (progress.replayed, progress.eta_at) != (seen[-1].replayed, seen[-1].eta_at):
            seen.append(progress)
        await asyncio.sleep(POLL_SECONDS)
    return seen


async def eta_run(env: BenchEnv, case: EtaCase) -> dict[str, Any]:
    """One row of figure h."""
    keys = ExperimentKeys(DEFAULT_STREAM, f"bench-h-{case.policy}-{uuid.uuid4().hex[:8]}")
    fields: dict[str, Any] = {
        "experiment_id": keys.experiment_id,
        "max_backlog_threshold": THRESHOLD,
        "throttle_seconds": case.throttle_seconds,
    }
    if case.policy != "fixed":
        fields["throttle_policy"] = case.policy
    inp = ResumptionInput.model_validate(fields)
    measured = await calibrate(env.redis, case.rate, ack_on_read=False)
    await env.redis.delete(keys.stream)
    await env.redis.xgroup_create(keys.stream, DEFAULT_GROUP, id="0", mkstream=True)
    await hold_tasks(env.redis, keys, case.tasks)
    stop, record = asyncio.Event(), PacedConsumer(case.rate)
    consumer = asyncio.create_task(run_paced_consumer(env.redis, keys.stream, DEFAULT_GROUP, "c0", record, stop))
    try:
        started = time.monotonic()
        handle = await env.client.start_workflow(
            ResumptionWorkflow.run,
            inp,
            **inp.start_options(env.task_queue),
            task_timeout=timedelta(seconds=TASK_TIMEOUT_SECONDS),
        )
        result = asyncio.ensure_future(handle.result())
        readings = await _readings(handle, result)
        outcome = (await result).outcome.value
        wall = time.monotonic() - started
    finally:
        stop.set()
        await consumer
    check = await check_replay(env.redis, keys, case.tasks)
    last: list[Any] = await env.redis.xrevrange(keys.stream, count=1) or []
    last_moved = datetime.fromtimestamp(int(last[0][0].split(b"-")[0]) / 1000, tz=UTC)
    await env.redis.delete(keys.stream)
    marks = []
    for mark in MARKS:
        seen = next((p for p in readings if p.replayed >= mark * case.tasks), None)
        row: dict[str, Any] = {"mark": mark, "moved": None, "eta_s": None, "actual_s": None, "error": None}
        if seen is not None:
            row["moved"] = seen.replayed / case.tasks
            if seen.eta_seconds is not None and seen.eta_at is not None:
                read_at = seen.eta_at - timedelta(seconds=seen.eta_seconds)
                actual = (last_moved - read_at).total_seconds()
                row |= {"eta_s": seen.eta_seconds, "actual_s": actual, "net_rate": seen.net_rate}
                row["error"] = abs(seen.eta_seconds - actual) / actual if actual > 0 else None
        marks.append(row)
    errors = [m["error"] for m in marks]
    return {
        "policy": case.policy,
        "rate_target": case.rate,
        "rate_measured": measured,
        "tasks": case.tasks,
        "throttle_seconds": case.throttle_seconds,
        "threshold": THRESHOLD,
        "outcome": outcome,
        "wall_s": wall,
        "answers": len(readings),
        "marks": marks,
        "worst_error": None if None in errors else max(errors),
        "exactly_once": check.exactly_once,
    }


async def eta(env: BenchEnv, cases: tuple[EtaCase, ...]) -> list[dict[str, Any]]:
    """Figure h for every case, in order."""
    return [await eta_run(env, case) for case in cases]


def lines(rows: list[dict[str, Any]]) -> list[str]:
    """Figure h's table: per case and mark, the ETA, the actual time left, the error."""
    out = [
        "h. ETA accuracy, steady consumer (threshold 500; at the first progress answer at or past each mark: "
        "ETA vs the time from that reading until the last task moved; error = |eta - actual| / actual)"
    ]
    out.append(f"{'policy':>8} {'R meas':>7} {'N':>6} {'mark':>5} {'moved':>6} {'eta s':>7} {'actual s':>8} "
               f"{'error':>6} {'net/s':>7}")  # fmt: skip
    for r in rows:
        for m in r["marks"]:
            out.append(
                f"{r['policy']:>8} {r['rate_measured']:>7.0f} {r['tasks']:>6} {m['mark']:>5.0%} "
                f"{_pct(m['moved']):>6} {_num(m['eta_s']):>7} {_num(m['actual_s']):>8} {_pct(m['error']):>6} "
                f"{_num(m.get('net_rate'), '.0f'):>7}"
            )
    worst = [r["worst_error"] for r in rows]
    shown = "unknown at a mark" if None in worst else f"{max(worst):.1%}"
    out.append(f"  worst error once 10% had moved, over every case and mark: {shown}")
    return out


def _num(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"
