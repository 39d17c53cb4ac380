"""Every release's failure told (issue 16, item 4): a claim that could not be handed back at a run's
end is retried while its lease lasts, then said in the result (``release_error``), in one JSON log
line and by ``xmc status``; a fault retrying cannot mend is named at once; the fair share's
optional ``{S}:replayers`` key of the wrong type does not stop a release."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import uuid
from collections.abc import Sequence
from typing import cast

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHandle

from tests.support.helpers import (
    STREAM,
    fill_backlog,
    hold_tasks,
    redis_calls,
    redis_outage,
    resumption_worker,
    run_module,
    start,
    throttled,
    throttled_replay,
    wait_for,
)
from tests.support.proxy import SwitchableProxy
from xmc_resumption.redisclient import held
from xmc_resumption.redisclient.keys import ExperimentKeys, replayers_key
from xmc_resumption.redisclient.results import ExperimentState
from xmc_resumption.worker import JSON_FIELDS, JSON_RENAMES
from xmc_resumption.workflows.calls import RELEASE_RETRY, handed_on_retry
from xmc_resumption.workflows.models import Outcome, Phase, ResumptionResult
from xmc_resumption.workflows.release import MAX_RELEASE_ROUNDS
from xmc_resumption.workflows.resumption import ResumptionWorkflow


@pytest.mark.real_server
@pytest.mark.slow
async def test_a_pause_during_an_outage_says_the_claim_was_not_released(
    temporal_env, redis, redis_url, task_queue, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis refuses the worker; the pause Update ends the run's Redis wait. The release cannot
    reach Redis: it is tried again after a durable wait while the claim's lease (25 s) lasts, then
    the result, one JSON log line and ``xmc status`` say that the claim was not released and that
    the lease lapses next; Redis still shows ``resuming`` with the live claim and the fence."""
    e = f"E{uuid.uuid4().hex[:6]}"
    keys = ExperimentKeys(STREAM, e)
    await hold_tasks(redis, e, 10)
    await fill_backlog(redis, 5)
    caplog.set_level(logging.INFO)
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(
            temporal_env.client,
            task_queue,
            experiment_id=e,
            max_backlog_threshold=5,
            throttle_seconds=5,
            claim_lease_seconds=25,
            redis_retry_seconds=600,
        )
        await wait_for(handle, throttled)
        async with redis_outage(redis):
            await wait_for(handle, lambda p: p.phase is Phase.REDIS_UNAVAILABLE, timeout=30)
            effective = await handle.execute_update(ResumptionWorkflow.pause)
            # within 90 s: the pause ended the 600 s Redis wait; the release's rounds last about the lease
            result = await asyncio.wait_for(handle.result(), 90)
            fence = await redis.get(keys.fence)
            state = await held.get_state(redis, keys)
            claim = await redis.hgetall(keys.claim)
    assert effective.stopping is True
    assert (result.outcome, result.replayed, result.remaining) == (Outcome.PAUSED, 0, 10)
    told = result.release_error
    assert told is not None and told.startswith("claim not released after 2 round(s) of tries: ")
    assert "the token is not revoked" in told and "lease" in told and f"`xmc status {e}`" in told
    assert "orphaned" in told
    # Redis as the result says: the tries went on until the lease lapsed; still resuming, the
    # claim gone with its lease, the fence unrevoked: orphaned
    assert state is ExperimentState.RESUMING
    assert claim == {} and fence is not None and int(fence) == result.token
    # two rounds (the lease lapsed during the second): the first round's tries, a durable wait, the
    # second round's; the call's own backoff past the task budget is on durable timers too
    calls = await redis_calls(handle)
    assert [k for k, _ in calls][-1] == "release_claim" and MAX_RELEASE_ROUNDS > 2
    again = [r for r in caplog.records if r.msg.startswith("claim not released yet; trying again")]
    assert [r.__dict__["round"] for r in again] == [1]
    # one log line at ERROR carrying the same words (formatted as the worker does: one JSON object)
    from pythonjsonlogger.json import JsonFormatter

    records = [r for r in caplog.records if r.msg.startswith("claim not released (")]
    assert len(records) == 1 and records[0].levelname == "ERROR"
    line = JsonFormatter(JSON_FIELDS, rename_fields=JSON_RENAMES, timestamp="time").format(records[0])
    assert "\n" not in line and json.loads(line)["release_error"] == told
    # xmc status: Redis's side (resuming, the claim) and the run's release error
    address = temporal_env.client.service_client.config.target_host
    status = await asyncio.to_thread(
        run_module, "xmc_resumption", "status", e, TEMPORAL_ADDRESS=address, XMC_REDIS_URL=redis_url
    )
    assert status.returncode == 0, status.stderr
    assert f"{e} on {STREAM}: resuming (orphaned: resuming, no live claim)" in status.stdout
    assert f"CLAIM NOT RELEASED: {told}" in status.stdout
    doc = await asyncio.to_thread(
        run_module, "xmc_resumption", "status", e, "--json", TEMPORAL_ADDRESS=address, XMC_REDIS_URL=redis_url
    )
    assert json.loads(doc.stdout)["run"]["release_error"] == told


async def test_a_release_refused_for_good_is_named_at_once(temporal_env, redis, redis_url, task_queue) -> None:
    """A fence counter that is no token (a fault retrying cannot mend) refuses the release before
    its first write: one round, and the result names the key."""
    async with throttled_replay(temporal_env, task_queue, redis, redis_url) as t:
        await redis.set(t.keys.fence, "garbage")
        await t.handle.execute_update(ResumptionWorkflow.pause)
        result = await asyncio.wait_for(t.handle.result(), 30)
        calls = await redis_calls(t.handle)
    assert result.outcome is Outcome.PAUSED
    told = result.release_error
    assert told is not None and told.startswith("claim not released after 1 round(s) of tries: ")
    assert f"XMCCORRUPT {t.keys.fence} holds" in told
    assert [k for k, _ in calls].count("release_claim") == 1
    assert await redis.hgetall(t.keys.claim) != {}  # nothing was written


@pytest.mark.parametrize("fair_share", [False, True])
async def test_a_replayers_key_of_the_wrong_type_does_not_stop_the_release(
    temporal_env, redis, redis_url, task_queue, fair_share: bool
) -> None:
    """``{S}:replayers`` holds a string: a replay without fair share completes and its release
    succeeds; with fair share, its publish fails naming the key, and the release still hands the
    experiment back as paused (the structure is optional for the release)."""
    e = f"E{uuid.uuid4().hex[:6]}"
    keys = ExperimentKeys(STREAM, e)
    names = await hold_tasks(redis, e, 3)
    await fill_backlog(redis, 0)
    await redis.set(replayers_key(STREAM), "not a sorted set")
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(temporal_env.client, task_queue, experiment_id=e, fair_share=fair_share)
        if fair_share:
            with pytest.raises(Exception, match="failed"):
                await asyncio.wait_for(handle.result(), 30)
            assert await held.get_state(redis, keys) is ExperimentState.PAUSED
        else:
            result = await asyncio.wait_for(handle.result(), 30)
            assert (result.outcome, result.replayed, result.release_error) == (Outcome.COMPLETED, 3, None)
            assert [f[b"task"] for _, f in await redis.xrange(STREAM)] == names
            assert await held.get_state(redis, keys) is ExperimentState.RUNNING
    assert not await redis.exists(keys.claim)
    [release] = await redis.lrange(keys.released, 0, -1)  # '<token> <outcome> <replayed> <remaining>'
    assert await redis.get(keys.fence) == str(int(release.split()[0]) + 1).encode()  # revoked
    assert await redis.get(replayers_key(STREAM)) == b"not a sorted set"


async def test_a_release_with_redis_away_ends_after_its_rounds_while_the_lease_is_long(
    temporal_env, redis, redis_url, task_queue
) -> None:
    """A proxy between the worker and Redis cuts every connection while the run waits (a claim lease of an hour), and
    the pause Update ends the wait. The release tries ``MAX_RELEASE_ROUNDS`` rounds of 7 attempts, a durable wait
    between two, then the run ends ``paused`` and ``release_error`` says how many rounds failed and that the lease
    still runs: the run does not go on trying for the lease's hour. Redis still holds the claim."""
    e = f"E{uuid.uuid4().hex[:6]}"
    keys = ExperimentKeys(STREAM, e)
    await hold_tasks(redis, e, 10)
    await fill_backlog(redis, 5)
    proxy = SwitchableProxy(int(redis_url.rsplit(":", 1)[1].split("/")[0]))
    await proxy.start()
    with socket.socket() as refusing:  # bound, never listening: every connection to it is refused
        refusing.bind(("127.0.0.1", 0))
        try:
            async with resumption_worker(temporal_env.client, task_queue, proxy.url):
                handle = await start(
                    temporal_env.client,
                    task_queue,
                    experiment_id=e,
                    max_backlog_threshold=5,
                    throttle_policy="fixed",
                    throttle_seconds=600,
                    claim_lease_seconds=3_600,
                    redis_retry_seconds=30,
                )
                await wait_for(handle, throttled)
                proxy.switch(refusing.getsockname()[1], reset=True)
                await handle.execute_update(ResumptionWorkflow.pause)
                result = await asyncio.wait_for(result_within_rounds(handle), 60)
                events = (await handle.fetch_history()).events
        finally:
            await proxy.close()
    assert (result.outcome, result.replayed, result.remaining) == (Outcome.PAUSED, 0, 10)
    told = result.release_error
    assert told is not None and told.startswith(f"claim not released after {MAX_RELEASE_ROUNDS} round(s) of tries: ")
    assert "its lease lapses by" in told  # not "has lapsed": the rounds ended, not the lease
    # each round: a local attempt whose connection fault hands the call on to a regular activity (within
    # HAND_OFF_SECONDS of a fault, the regular activity at once), which fails after its attempts; then a durable wait
    # before the next round
    local = release_rounds(events)
    assert local and all(ended == (1, True) for ended in local)
    attempts = handed_on_retry(RELEASE_RETRY).maximum_attempts
    assert regular_release_rounds(events) == [(attempts, True)] * MAX_RELEASE_ROUNDS
    waits = [summary for summary in timer_summaries(events) if summary.startswith("release failed")]
    assert waits == [
        f"release failed ({n} of at most {MAX_RELEASE_ROUNDS} rounds): trying again"
        for n in range(1, MAX_RELEASE_ROUNDS)
    ]
    assert await redis.hget(keys.claim, "token") == str(result.token).encode()  # the claim lives on, unreleased


async def result_within_rounds(handle: WorkflowHandle) -> ResumptionResult:
    """The run's result; fails (and ends the run) as soon as its history shows more than ``MAX_RELEASE_ROUNDS`` release
    rounds."""
    ending = asyncio.ensure_future(handle.result())
    try:
        while not ending.done():
            rounds = len(release_rounds((await handle.fetch_history()).events))
            if rounds > MAX_RELEASE_ROUNDS:
                await handle.terminate("the release went on past its rounds")
                raise AssertionError(f"{rounds} rounds of release tries: more than {MAX_RELEASE_ROUNDS}")
            await asyncio.wait({ending}, timeout=0.5)
        return cast(ResumptionResult, ending.result())
    finally:
        ending.cancel()


def release_rounds(events: Sequence[HistoryEvent]) -> list[tuple[int, bool]]:
    """The ``release_claim`` local activities that ended (no backoff after them): (last attempt, failed), in order."""
    ended = []
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            marker = event.marker_recorded_event_attributes
            data = json.loads(marker.details["data"].payloads[0].data) if "data" in marker.details else {}
            if data.get("activity_type") == "release_claim" and data["backoff"] is None:
                ended.append((data["attempt"], marker.HasField("failure")))
    return ended


def regular_release_rounds(events: Sequence[HistoryEvent]) -> list[tuple[int, bool]]:
    """The ``release_claim`` regular activities that ended: (last attempt, failed), in order."""
    scheduled = {
        e.event_id for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "release_claim"
    }  # fmt: skip
    attempts = {
        e.activity_task_started_event_attributes.scheduled_event_id: e.activity_task_started_event_attributes.attempt
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    }
    return [
        (attempts[e.activity_task_failed_event_attributes.scheduled_event_id], True)
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
        and e.activity_task_failed_event_attributes.scheduled_event_id in scheduled
    ]


def timer_summaries(events: Sequence[HistoryEvent]) -> list[str]:
    """The summary of every durable timer started, in order ('' for one without)."""
    return [
        json.loads(e.user_metadata.summary.data) if e.user_metadata.summary.data else ""
        for e in events
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
    ]
