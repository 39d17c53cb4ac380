"""Record a release's workflow histories for the replay test: ``python -m tests.record_histories [NAME ...]``.

Runs one scenario per outcome (or only the named ones) on a fresh dev server and redis-server and writes each first
run's history as JSON to ``tests/histories/<version>/``, the version being ``pyproject.toml``'s. A release records its
folder once, when it is cut; the folders of earlier releases stay as they are, so that the runs those releases
started still replay (tests/test_replay.py). A new scenario is recorded by its name alone, so the others' files stay.
docs/development.md, "Changing the workflow".
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from redis.asyncio import Redis
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from tests.support.helpers import (
    GROUP,
    STREAM,
    consume,
    fill_backlog,
    hold_tasks,
    redis_outage,
    resumption_worker,
    start,
    throttled,
    wait_for,
)
from xmc_resumption import __version__
from xmc_resumption.redisclient import fencing, held, ratecap
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.services import installed_binary, local_redis
from xmc_resumption.workflows import fleet
from xmc_resumption.workflows.control import ControlChange
from xmc_resumption.workflows.models import Outcome, Phase, ResumptionInput
from xmc_resumption.workflows.resumption import ResumptionWorkflow

HISTORIES = Path(__file__).parent / "histories"
"""One folder per release, named by its version, of the histories its code recorded."""

OUT = HISTORIES / __version__


def releases() -> list[Path]:
    """The folder of each release in ``HISTORIES``, oldest first (by version, not by name)."""
    folders = [p for p in HISTORIES.iterdir() if p.is_dir()]
    return sorted(folders, key=lambda p: tuple(int(n) for n in p.name.split(".")))


Scenario = Callable[[Redis, WorkflowHandle, str, Client], Awaitable[None]]


async def completed(redis: Redis, handle: WorkflowHandle, e: str, client: Client) -> None:
    await wait_for(handle, throttled)
    stop, seen = asyncio.Event(), []
    consumer = asyncio.create_task(consume(redis, "c1", stop, seen))
    await handle.result()
    stop.set()
    await consumer


async def continued(redis: Redis, handle: WorkflowHandle, e: str, client: Client) -> None:
    """As ``completed``, with a consumer slow enough (20 tasks/s) that no turn moves the rest at once."""
    await wait_for(handle, throttled)
    stop, seen = asyncio.Event(), []
    consumer = asyncio.create_task(consume(redis, "c1", stop, seen, per_read=2, rate=20))
    await handle.result()
    stop.set()
    await consumer


async def paused(redis: Redis, handle: WorkflowHandle, e: str, client: Client) -> None:
    await wait_for(handle, throttled)
    await held.pause(redis, ExperimentKeys(STREAM, e))
    await handle.result()


async def fenced(redis: Redis, handle: WorkflowHandle, e: str, client: Client) -> None:
    await wait_for(handle, throttled)
    await fencing.acquire_claim(redis, ExperimentKeys(STREAM, e), "operator", 60_000)
    await handle.result()


async def waited_for_redis(redis: Redis, handle: WorkflowHandle, e: str, client: Client) -> None:
    await wait_for(handle, throttled)
    async with redis_outage(redis):
        await redis.xgroup_setid(STREAM, GROUP, "$")
        await wait_for(handle, lambda p: p.redis_waits > 0, timeout=60)  # the wait after a call's retries
    await completed(redis, handle, e)


async def controlled(redis: Redis, handle: WorkflowHandle, e: str, client: Client) -> None:
    """Raise the threshold by Update during the throttle wait (it wakes the timer), then a
    rejected one, then let the consumers drain."""
    await wait_for(handle, throttled)
    await handle.execute_update(ResumptionWorkflow.configure, ControlChange(max_backlog_threshold=8, batch_size=4))
    with contextlib.suppress(WorkflowUpdateFailedError):
        await handle.execute_update(ResumptionWorkflow.set_threshold, 0)
    await completed(redis, handle, e)


async def stopped(redis: Redis, handle: WorkflowHandle, e: str, client: Client) -> None:
    """The pause Update during the throttle wait."""
    await wait_for(handle, throttled)
    await handle.execute_update(ResumptionWorkflow.pause)
    await handle.result()


async def waited_for_group(redis: Redis, handle: WorkflowHandle, e: str, client: Client) -> None:
    """The group deleted during the throttle wait (``missing_group: wait``): the replay waits in
    ``waiting_for_group`` until it is back, at ``$``, then completes."""
    await wait_for(handle, throttled)
    await redis.xgroup_destroy(STREAM, GROUP)
    await wait_for(handle, lambda p: p.phase is Phase.WAITING_FOR_GROUP, timeout=30)
    await redis.xgroup_create(STREAM, GROUP, id="$")
    await completed(redis, handle, e)


async def stalled_naming_consumers(redis: Redis, handle: WorkflowHandle, e: str, client: Client) -> None:
    """A consumer reads the backlog and never acknowledges: the replay stalls, names it (the idle
    consumers' read) and ends ``stalled`` at ``max_stall_seconds``."""
    await wait_for(handle, throttled)
    await redis.xreadgroup(GROUP, "dead-1", {STREAM: ">"}, count=5)
    await handle.result()


async def rate_limited(redis: Redis, handle: WorkflowHandle, e: str, client: Client) -> None:
    """A stream-wide cap of 3/s with an empty bucket, set during the throttle wait, above the
    replay's own cap of 2/s: the first publish after the wait is ``rate_limited`` by the script
    (nothing moves; a wait for the stream's bucket), later ones move 2 and wait for the replay's
    own bucket; then it completes."""
    await wait_for(handle, throttled)
    seconds, micros = await redis.time()
    now_ms = seconds * 1000 + micros // 1000
    # an empty bucket that starts refilling 1.5 s from now: the first publishes after the wait find none
    await redis.hset(ratecap.rate_key(STREAM), mapping={"limit": "3", "tokens": "0", "at": str(now_ms + 1_500)})
    await completed(redis, handle, e)


async def release_failed(redis: Redis, handle: WorkflowHandle, e: str, client: Client) -> None:
    """Redis refuses the worker; the pause Update ends the Redis wait, and the release fails in
    rounds (a durable wait between them) until the claim's lease lapses: ``release_error``."""
    await wait_for(handle, throttled)
    async with redis_outage(redis):
        await wait_for(handle, lambda p: p.redis_waits > 0, timeout=60)  # the wait after a call's retries
        await handle.execute_update(ResumptionWorkflow.pause)
        await handle.result()


async def stalled_on_memory(redis: Redis, handle: WorkflowHandle, e: str, client: Client) -> None:
    """The backlog drains during the throttle wait, but Redis's used memory is over the input's
    fraction: memory waits, counted against ``max_stall_seconds``, end the run ``stalled``."""
    await wait_for(handle, throttled)
    await redis.config_set("maxmemory", str(100 * 1024 * 1024))
    try:
        await redis.xgroup_setid(STREAM, GROUP, "$")
        await handle.result()
    finally:
        await redis.config_set("maxmemory", "0")


async def cancelled(redis: Redis, handle: WorkflowHandle, e: str, client: Client) -> None:
    await wait_for(handle, throttled)
    await handle.cancel()
    with contextlib.suppress(WorkflowFailureError):
        await handle.result()


COMPANIONS, COMPANION_TASKS = 2, 3
"""Replays of other experiments that ``queued_for_turn`` runs beside the recorded one, and the tasks each holds."""


async def queued_for_turn(redis: Redis, handle: WorkflowHandle, e: str, client: Client) -> None:
    """Two replays of other experiments on the same worker and stream, with the same threshold, nobody consuming:
    the polls share one reading and reach their bound, and the run's poll returns ``queued``; it waits durably for
    its turn, which the worker gives by signal ``xmc-turn`` once consumers drain
    (docs/pacing.md, "Many replays on one worker"). The companions finish too; their histories are not kept."""
    queue = (await handle.describe()).task_queue
    others = []
    for i in range(COMPANIONS):
        other = f"{e}x{i}"
        await hold_tasks(redis, other, COMPANION_TASKS)
        others.append(
            await start(client, queue, experiment_id=other, **SCENARIOS["queued_for_turn"][1])  # one measurement
        )
    await wait_for(handle, lambda p: "queued" in (p.wait_plan or ""), timeout=60)
    stop, seen = asyncio.Event(), []
    consumer = asyncio.create_task(consume(redis, "c1", stop, seen))
    try:
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in (handle, *others))), 120)
    finally:
        stop.set()
        await consumer
    if [r.outcome for r in results] != [Outcome.COMPLETED] * (1 + COMPANIONS):
        raise RuntimeError(f"a replay did not complete: {[r.outcome for r in results]}")


SCENARIOS: dict[str, tuple[Scenario, dict]] = {
    "completed_after_throttles": (
        completed,
        {"max_backlog_threshold": 5, "batch_size": 3, "throttle_seconds": 0.5, "throttle_policy": "fixed"},
    ),
    "paused_during_wait": (paused, {"max_backlog_threshold": 5, "throttle_seconds": 1, "throttle_policy": "fixed"}),
    "fenced_during_wait": (fenced, {"max_backlog_threshold": 5, "throttle_seconds": 1, "throttle_policy": "fixed"}),
    "cancelled_during_wait": (
        cancelled,
        {"max_backlog_threshold": 5, "throttle_seconds": 5, "throttle_policy": "fixed"},
    ),
    "waited_for_redis": (
        waited_for_redis,
        {"max_backlog_threshold": 5, "batch_size": 4, "throttle_seconds": 0.5, "throttle_policy": "fixed"},
    ),
    "continued_as_new": (
        continued,
        {
            "max_backlog_threshold": 5,
            "batch_size": 2,
            "throttle_seconds": 0.3,
            "throttle_policy": "fixed",
            "turns_per_run": 2,
        },
    ),
    "controlled_by_update": (
        controlled,
        {"max_backlog_threshold": 5, "throttle_seconds": 5, "throttle_policy": "fixed"},
    ),
    "stopped_by_update": (stopped, {"max_backlog_threshold": 5, "throttle_seconds": 5, "throttle_policy": "fixed"}),
    "adaptive_completed": (
        completed,
        {"max_backlog_threshold": 5, "batch_size": 2, "throttle_policy": "adaptive", "max_wait_seconds": 3},
    ),
    # the default policy (adaptive) with its estimator
    "probe_completed": (completed, {"max_backlog_threshold": 5, "batch_size": 2, "max_wait_seconds": 3}),
    "waited_for_group": (
        waited_for_group,
        {"max_backlog_threshold": 5, "batch_size": 4, "throttle_seconds": 1, "throttle_policy": "fixed"},
    ),
    "stalled_naming_consumers": (
        stalled_naming_consumers,
        {
            "max_backlog_threshold": 5,
            "throttle_seconds": 1,
            "throttle_policy": "fixed",
            "stall_window_seconds": 2,
            "max_stall_seconds": 6,
        },
    ),
    "rate_limited": (
        rate_limited,
        {"max_backlog_threshold": 5, "throttle_seconds": 0.5, "throttle_policy": "fixed", "max_tasks_per_second": 2},
    ),
    # polls that do not fit the workflow task's budget run as regular activities (workflows/calls.py)
    "adaptive_polled_by_activity": (
        completed,
        {"max_backlog_threshold": 5, "batch_size": 2, "throttle_policy": "adaptive", "max_wait_seconds": 3},
    ),
    "release_failed_in_outage": (
        release_failed,
        {
            "max_backlog_threshold": 5,
            "throttle_seconds": 2,
            "throttle_policy": "fixed",
            "claim_lease_seconds": 30,
            "redis_retry_seconds": 600,
        },
    ),
    "stalled_on_memory": (
        stalled_on_memory,
        {
            "max_backlog_threshold": 5,
            "throttle_seconds": 1,
            "throttle_policy": "fixed",
            "max_memory_fraction": 0.01,
            "stall_window_seconds": 2,
            "max_stall_seconds": 5,
        },
    ),
    # polls of several replays on one worker that queue, and a turn given by signal
    "queued_for_turn": (
        queued_for_turn,
        {"max_backlog_threshold": 5, "batch_size": 2, "throttle_policy": "adaptive", "max_wait_seconds": 10},
    ),
}


async def record(names: list[str]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        raise SystemExit(f"no such scenario: {', '.join(sorted(unknown))}; choose from {', '.join(SCENARIOS)}")
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=installed_binary("temporal"),
        data_converter=pydantic_data_converter,
        search_attributes=fleet.ALL,
    )
    try:
        with local_redis() as url:
            redis = Redis.from_url(url)
            for name, (scenario, fields) in SCENARIOS.items():
                if names and name not in names:
                    continue
                await redis.flushall()
                e = f"E{uuid.uuid4().hex[:6]}"
                await hold_tasks(redis, e, 12)
                await fill_backlog(redis, 5)
                queue = f"record-{name}"
                async with resumption_worker(env.client, queue, url):
                    handle = await env.client.start_workflow(
                        ResumptionWorkflow.run,
                        ResumptionInput(experiment_id=e, **fields),
                        id=f"resumption-{e}",
                        task_queue=queue,
                    )
                    await scenario(redis, handle, e, env.client)
                # the first run's history (a continue-as-new chain's later runs start from a carry)
                first = env.client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id)
                history = await first.fetch_history()
                (OUT / f"{name}.json").write_text(history.to_json())
                print(f"{name}: {len(history.events)} events")
            await redis.aclose()
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(record(sys.argv[1:]))
    gc.collect()
