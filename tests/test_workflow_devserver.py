"""ResumptionWorkflow on the Temporal dev server (real time, the real server's continue-as-new),
against a real redis-server: exactly once with consumers, continue-as-new, a worker restart
during a throttle wait."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
import uuid

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import CancelledError
from temporalio.testing import WorkflowEnvironment

from tests.support.helpers import (
    GROUP,
    STREAM,
    assert_never_over,
    chain_histories,
    consume,
    fill_backlog,
    history_calls,
    hold_tasks,
    issued_tokens,
    redis_outage,
    resumption_worker,
    start,
    stream_tasks,
    throttled,
    wait_for,
)
from xmc_resumption.redisclient import fencing, held
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.redisclient.results import ExperimentState
from xmc_resumption.services import installed_binary
from xmc_resumption.workflows import fleet
from xmc_resumption.workflows.models import Outcome, Phase
from xmc_resumption.workflows.resumption import ResumptionWorkflow

pytestmark = [pytest.mark.real_server, pytest.mark.slow]


async def test_exactly_once_in_order_with_consumers_and_producers(temporal_env, redis, redis_url, task_queue) -> None:
    e = f"E{uuid.uuid4().hex[:6]}"
    keys = ExperimentKeys(STREAM, e)
    names = await hold_tasks(redis, e, 2_000)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    threshold = 100
    stop, seen = asyncio.Event(), []
    later: list[bytes] = []
    held_later = 0

    async def producer() -> None:  # the experiment keeps producing while it resumes
        nonlocal held_later
        for i in range(2_000, 2_200):
            name = f"{e}-t{i}".encode()
            where = (await held.enqueue_task(redis, keys, {b"task": name})).destination
            later.append(name)
            held_later += where == "held"
            await asyncio.sleep(random.random() / 100)

    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        consumers = [asyncio.create_task(consume(redis, f"c{i}", stop, seen, 5, rate=200)) for i in range(3)]
        handle = await start(
            temporal_env.client,
            task_queue,
            experiment_id=e,
            max_backlog_threshold=threshold,
            batch_size=50,
            throttle_seconds=0.2,
        )
        await producer()
        result = await asyncio.wait_for(handle.result(), 120)
        stop.set()
        await asyncio.gather(*consumers)
        calls = [c for h in await chain_histories(temporal_env.client, handle) for c in history_calls(h)]
    assert result.outcome is Outcome.COMPLETED
    assert result.replayed == 2_000 + held_later
    assert result.throttles >= 1
    assert await stream_tasks(redis) == names + later
    assert sorted(seen) == sorted(names + later)
    assert_never_over(calls, threshold)  # each publish's backlog, measured atomically with its move


async def test_continue_as_new_carries_token_and_counters(temporal_env, redis, redis_url, task_queue) -> None:
    """30 tasks at threshold 4 (a publish moves 4 at most) and two turns a run, against a consumer: the chain of runs
    goes on with the first run's token and counters."""
    e = f"E{uuid.uuid4().hex[:6]}"
    names = await hold_tasks(redis, e, 30)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    stop, seen = asyncio.Event(), []
    consumer = asyncio.create_task(consume(redis, "c1", stop, seen))
    try:
        async with resumption_worker(temporal_env.client, task_queue, redis_url):
            handle = await start(
                temporal_env.client, task_queue, experiment_id=e, max_backlog_threshold=4, batch_size=4, turns_per_run=2
            )
            result = await asyncio.wait_for(handle.result(), 60)
            histories = await chain_histories(temporal_env.client, handle)
    finally:
        stop.set()
        await consumer
    kinds = [[k for k, _ in history_calls(h)] for h in histories]
    # 30 tasks at 4 a publish: at least 8 turns, 2 a run
    assert (result.outcome, result.replayed) == (Outcome.COMPLETED, 30)
    assert result.turns >= 8 and result.runs == len(histories) and result.turns <= 2 * result.runs
    assert seen == names
    assert await stream_tasks(redis) == names
    assert len(histories) >= 4
    ends = [h.events[-1].event_type for h in histories]
    assert ends == [EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW] * (len(histories) - 1) + [
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED
    ]
    # one claim for the whole resumption: later runs go on with the carried token, acquiring nothing
    assert [k.count("acquire_claim") for k in kinds] == [1] + [0] * (len(histories) - 1)
    keys = ExperimentKeys(STREAM, e)
    assert await issued_tokens(redis, keys) == [result.token]  # one token issued,
    assert await fencing.current_token(redis, keys) == result.token + 1  # then revoked by the release


async def test_throttle_wait_survives_a_worker_restart_and_fires_once(
    temporal_env, redis, redis_url, task_queue
) -> None:
    """docs/contract.md, "Guarantees": a 10 s throttle survives a worker restart and fires once. The worker stays
    down past the claim's lease too; the next check takes the lease again for the same token."""
    e = f"E{uuid.uuid4().hex[:6]}"
    keys = ExperimentKeys(STREAM, e)
    names = await hold_tasks(redis, e, 20)
    await fill_backlog(redis, 5)
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(
            temporal_env.client,
            task_queue,
            experiment_id=e,
            max_backlog_threshold=5,
            throttle_seconds=10,
            throttle_policy="fixed",  # one durable 10 s timer, the seed's rule under test
            claim_lease_seconds=10.5,
        )
        await wait_for(handle, throttled)
        throttled_at = time.monotonic()
    # no worker now; the timer lives in the server. Drain the backlog meanwhile.
    await redis.xgroup_setid(STREAM, GROUP, "$")
    await asyncio.sleep(max(0.0, 11.5 - (time.monotonic() - throttled_at)))
    assert not await redis.exists(keys.claim), "the lease lapsed while no worker ran"
    stop, seen = asyncio.Event(), []
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        consumer = asyncio.create_task(consume(redis, "c1", stop, seen))
        result = await asyncio.wait_for(handle.result(), 60)
        stop.set()
        await consumer
    history = await handle.fetch_history()
    started = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]
    fired = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_TIMER_FIRED]
    assert (result.outcome, result.replayed) == (Outcome.COMPLETED, 20)
    assert await issued_tokens(redis, keys) == [result.token]  # the same token after the restart
    assert result.throttles == len(started) == len(fired) == 1
    assert fired[0].timer_fired_event_attributes.started_event_id == started[0].event_id
    waited = fired[0].event_time.ToDatetime() - started[0].event_time.ToDatetime()
    assert 9.9 <= waited.total_seconds() < 10.5, "the timer resumed, neither restarted nor skipped"
    assert (await stream_tasks(redis))[5:] == names


async def test_redis_outage_is_waited_out_and_loses_nothing(temporal_env, redis, redis_url, task_queue) -> None:
    """An outage longer than a call's retries: the turn waits on a durable timer and starts over; nothing is
    published meanwhile, and the replay completes exactly once."""
    e = f"E{uuid.uuid4().hex[:6]}"
    names = await hold_tasks(redis, e, 60)
    await fill_backlog(redis, 5)
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(
            temporal_env.client,
            task_queue,
            experiment_id=e,
            max_backlog_threshold=5,
            batch_size=5,
            throttle_seconds=0.5,
        )
        await wait_for(handle, throttled)
        async with redis_outage(redis):
            await redis.xgroup_setid(STREAM, GROUP, "$")  # the backlog is gone; only the outage holds it
            # the first failed attempt shows the fault (the call handed on); the wait after its retries follows
            await wait_for(handle, lambda p: p.phase is Phase.REDIS_UNAVAILABLE and p.redis_handoffs > 0, timeout=30)
            during = await wait_for(handle, lambda p: p.redis_waits > 0, timeout=60)
            assert during.replayed == 0 and await redis.xlen(STREAM) == 5
        stop, seen = asyncio.Event(), []
        consumer = asyncio.create_task(consume(redis, "c1", stop, seen))
        result = await asyncio.wait_for(handle.result(), 60)
        stop.set()
        await consumer
        progress = await handle.query(ResumptionWorkflow.progress)
    assert (result.outcome, result.replayed) == (Outcome.COMPLETED, 60)
    assert progress.redis_waits >= 1 and (progress.last_error or "").startswith("AuthenticationError")
    assert (await stream_tasks(redis))[5:] == names
    assert sorted(seen) == sorted(names)
    history = await handle.fetch_history()
    summaries = [e.user_metadata.summary.data for e in history.events if e.HasField("user_metadata")]
    assert any(b"Redis unavailable" in s for s in summaries)


async def test_cancel_ends_even_while_redis_is_away(temporal_env, redis, redis_url, task_queue) -> None:
    e = f"E{uuid.uuid4().hex[:6]}"
    keys = ExperimentKeys(STREAM, e)
    await hold_tasks(redis, e, 10)
    await fill_backlog(redis, 5)
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(
            temporal_env.client,
            task_queue,
            experiment_id=e,
            max_backlog_threshold=5,
            throttle_seconds=30,
            throttle_policy="fixed",
        )
        await wait_for(handle, throttled)
        async with redis_outage(redis):
            await handle.cancel()
            with pytest.raises(WorkflowFailureError) as failure:  # the release gives up after its bounded attempts
                await asyncio.wait_for(handle.result(), 40)
    assert isinstance(failure.value.cause, CancelledError)
    # the release could not run: the experiment stays resuming, its tasks held, until the lease lapses
    assert await held.get_state(redis, keys) is ExperimentState.RESUMING
    assert await redis.xlen(keys.held) == 10


async def test_continue_as_new_when_temporal_suggests_it(redis, redis_url, task_queue) -> None:
    """A dev server of its own that suggests continue-as-new at 40 events (docs/development.md, "Temporal facts")."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=installed_binary("temporal"),
        data_converter=pydantic_data_converter,
        dev_server_log_level="error",
        search_attributes=fleet.ALL,
        dev_server_extra_args=[
            "--dynamic-config-value",
            "limit.historyCount.suggestContinueAsNew=40",
            "--dynamic-config-value",
            'history.workflowIdReuseMinimalInterval="0s"',
        ],
    )
    try:
        e = f"E{uuid.uuid4().hex[:6]}"
        names = await hold_tasks(redis, e, 40)
        await fill_backlog(redis, 5)
        stop, seen = asyncio.Event(), []
        async with resumption_worker(env.client, task_queue, redis_url):
            consumer = asyncio.create_task(consume(redis, "c1", stop, seen, per_read=2, rate=40))
            handle = await start(
                env.client, task_queue, experiment_id=e, max_backlog_threshold=5, batch_size=5, throttle_seconds=0.2
            )
            result = await asyncio.wait_for(handle.result(), 60)
            stop.set()
            await consumer
            histories = await chain_histories(env.client, handle)
    finally:
        await env.shutdown()
    first = histories[0]
    assert (result.outcome, result.replayed) == (Outcome.COMPLETED, 40)
    assert await issued_tokens(redis, ExperimentKeys(STREAM, e)) == [result.token]  # carried across runs
    assert result.runs >= 2, "the throttle waits grow the history past 40 events"
    assert first.events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
    assert 40 <= len(first.events) < 60
    assert [k for h in histories for k, _ in history_calls(h)].count("acquire_claim") == 1  # one claim for all runs
    assert (await stream_tasks(redis))[5:] == names
    assert sorted(seen) == sorted([f"other-{i}".encode() for i in range(5)] + names)


async def test_cancel_while_a_call_hangs_ends_the_run_cancelled(temporal_env, redis, task_queue) -> None:
    """A Redis that accepts connections and never answers: the cancel reaches the workflow while a
    local activity is still retrying, and must end the run, not be taken for a Redis fault."""
    e = f"E{uuid.uuid4().hex[:6]}"
    loop = asyncio.get_running_loop()
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel accepts; nobody ever answers
        silent.setblocking(False)
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0?socket_timeout=0.5&socket_connect_timeout=0.5"
        async with resumption_worker(temporal_env.client, task_queue, url):
            handle = await start(temporal_env.client, task_queue, experiment_id=e, throttle_seconds=1)
            # a second connection: the acquire timed out once and is retrying. (The progress query
            # cannot tell: it is answered only once the workflow task holding the call heartbeats.)
            connections = [(await asyncio.wait_for(loop.sock_accept(silent), 20))[0] for _ in range(2)]
            await handle.cancel()
            with pytest.raises(WorkflowFailureError) as failure:
                await asyncio.wait_for(handle.result(), 60)
        for c in connections:
            c.close()
    assert isinstance(failure.value.cause, CancelledError)
    history = await handle.fetch_history()
    # no wait of the workflow's own (a Redis-outage wait has a summary); the call's retry backoff
    # past the workflow task's budget is a timer of the SDK's, without one (workflows/calls.py)
    timers = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]
    assert not [e for e in timers if e.user_metadata.HasField("summary")]


async def test_a_long_outage_before_the_claim_continues_as_new_and_claims_once(
    temporal_env, redis, redis_url, task_queue
) -> None:
    e = f"E{uuid.uuid4().hex[:6]}"
    names = await hold_tasks(redis, e, 10)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        async with redis_outage(redis):
            handle = await start(
                temporal_env.client, task_queue, experiment_id=e, throttle_seconds=0.2, turns_per_run=1
            )
            progress = await wait_for(handle, lambda p: p.runs >= 2, timeout=40)
            assert progress.token == 0 and await redis.xlen(STREAM) == 0
        result = await asyncio.wait_for(handle.result(), 60)
    assert (result.outcome, result.replayed) == (Outcome.COMPLETED, 10)
    assert result.runs >= 2
    assert await issued_tokens(redis, ExperimentKeys(STREAM, e)) == [result.token]  # one claim,
    assert await fencing.current_token(redis, ExperimentKeys(STREAM, e)) == result.token + 1  # then its release
    assert await stream_tasks(redis) == names


async def test_continue_as_new_carries_the_rate_cap_s_bucket(temporal_env, redis, redis_url, task_queue) -> None:
    """100 tasks at ``max_tasks_per_second`` 20, one turn a run: every run starts where the last left the bucket, so
    across the boundaries too every window of the stream holds at most 20 per second of it plus the bucket's 20 (the
    entry IDs' milliseconds: Redis's clock; 1 s of slack for a publish that lands late after the workflow time the
    bucket counted it at)."""
    e = f"E{uuid.uuid4().hex[:6]}"
    names = await hold_tasks(redis, e, 100)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(
            temporal_env.client, task_queue, experiment_id=e, batch_size=100, max_tasks_per_second=20, turns_per_run=1
        )
        result = await asyncio.wait_for(handle.result(), 60)
        histories = await chain_histories(temporal_env.client, handle)
    assert (result.outcome, result.replayed) == (Outcome.COMPLETED, 100)
    assert await stream_tasks(redis) == names
    assert result.runs == len(histories) >= 5
    added = [int(entry_id.split(b"-")[0]) for entry_id, _ in await redis.xrange(STREAM)]
    windows = [(j - i + 1, (added[j] - added[i]) / 1000) for i in range(len(added)) for j in range(i, len(added))]
    worst = max(windows, key=lambda w: w[0] - 20 * w[1])  # (tasks, seconds) furthest over 20/s
    assert worst[0] <= 20 * (worst[1] + 1.0) + 20, f"{worst[0]} tasks within {worst[1]:g}s (runs: {result.runs})"


async def test_continue_as_new_carries_the_seq_redis_recorded(temporal_env, redis, redis_url, task_queue) -> None:
    """30 tasks at threshold 4, one turn a run, against a consumer. Each publish script records its seq in Redis (the
    publish's idempotency record), so when a run ends the last seq Redis recorded is the number of scripts the chain
    ran so far: each run carries that seq, and the next run's first publish moves tasks (a seq carried below it
    would be refused as stale by every run, one turn each, for ever). Checked on the chain as it runs, so a wrong
    carry fails at the first boundary it crosses."""
    e = f"E{uuid.uuid4().hex[:6]}"
    names = await hold_tasks(redis, e, 30)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    stop, seen = asyncio.Event(), []
    consumer = asyncio.create_task(consume(redis, "c1", stop, seen))
    try:
        async with resumption_worker(temporal_env.client, task_queue, redis_url):
            handle = await start(
                temporal_env.client, task_queue, experiment_id=e, max_backlog_threshold=4, batch_size=4, turns_per_run=1
            )
            ending = asyncio.ensure_future(handle.result())
            try:
                async with asyncio.timeout(60):
                    while True:
                        ended = ending.done()
                        histories = await chain_histories(temporal_env.client, handle)
                        try:
                            assert_seq_carried(histories)
                        except AssertionError:
                            await handle.terminate("the seq carried is not the one Redis recorded")
                            raise
                        if ended:
                            break
                        await asyncio.wait({ending}, timeout=0.2)
            finally:
                ending.cancel()
            result = ending.result()
    finally:
        stop.set()
        await consumer
    assert (result.outcome, result.replayed) == (Outcome.COMPLETED, 30)
    assert result.runs == len(histories) >= 8  # 30 tasks at 4 a publish, one publish a run
    assert await stream_tasks(redis) == names and seen == names


def assert_seq_carried(histories: list[WorkflowHistory]) -> None:
    """Each run of a chain carries the last seq its publishes used (the seqs of all the chain's scripts so far, one
    each), and each run's first publish is neither stale nor repeated and moves tasks."""
    scripts = 0
    for n, history in enumerate(histories):
        publishes = [r for kind, r in history_calls(history) if kind == "publish_batch"]
        if publishes and n > 0:
            first = publishes[0]
            assert first["status"] in ("published", "completed") and not first.get("repeated"), (n, first)
            assert first["moved"] > 0, (n, first)
        scripts += sum(r["rounds"]["scripts"] for r in publishes if "rounds" in r)
        last = history.events[-1]
        if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            carried = json.loads(last.workflow_execution_continued_as_new_event_attributes.input.payloads[0].data)
            assert carried["carry"]["seq"] == scripts, (n, carried["carry"], scripts)
