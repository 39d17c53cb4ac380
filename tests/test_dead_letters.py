"""A poison task: a held entry with more fields than a script can pass to XADD (valid for a plain
XADD). The publish stops before it without an error and moves nothing half done; the replay sets it
aside into the experiment's dead-letter stream and goes on in order; an operator retries or drops it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError, WatchError

from tests.support.helpers import (
    GROUP,
    STREAM,
    consume,
    hold_tasks,
    resumption_worker,
    start,
    stream_tasks,
    xmc_process,
)
from xmc_resumption.redisclient import deadletter, fencing, held
from xmc_resumption.redisclient.deadletter import MAX_TASK_FIELDS
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.redisclient.publish import PublishParams, publish_batch
from xmc_resumption.redisclient.results import ExperimentState, PublishStatus, SetAsideStatus
from xmc_resumption.redisclient.scripts import source
from xmc_resumption.workflows.models import Outcome
from xmc_resumption.workflows.resumption import ResumptionWorkflow
from xmc_resumption.workflows.text import details_markdown

POISON = {f"f{i}": f"v{i}" for i in range(4_000)}  # 8,000 values: past Lua's unpack


async def hold_with_poison(redis: Redis, e: str, n: int, at: int) -> tuple[ExperimentKeys, list[bytes], str]:
    """Hold ``n`` tasks of experiment ``e`` with the ``at``-th (0-based) a poison task added by a
    plain XADD; returns the keys, the good tasks' names in order and the poison entry's ID."""
    keys = ExperimentKeys(STREAM, e)
    names = await hold_tasks(redis, e, at)
    poison_id = (await redis.xadd(keys.held, {"task": b"poison", **POISON})).decode()
    names += await hold_tasks(redis, e, n - at - 1, start=at)
    return keys, names, poison_id


async def test_the_publish_stops_before_a_poison_task_and_writes_nothing_half_done(redis: Redis) -> None:
    keys, names, poison_id = await hold_with_poison(redis, "E1", 6, at=3)
    grant = await fencing.acquire_claim(redis, keys, "me", 60_000)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    result = await publish_batch(
        redis,
        keys,
        GROUP,
        PublishParams(token=grant.token, seq=1, batch_size=10, threshold=100, owner="me", lease_ms=60_000),
    )
    assert (result.status, result.moved, result.poison_id, result.remaining) == (
        PublishStatus.PUBLISHED, 3, poison_id, 3,
    )  # fmt: skip
    assert await stream_tasks(redis) == names[:3]
    assert (await redis.xrange(keys.held, count=1))[0][0].decode() == poison_id  # still first, untouched


async def test_set_aside_moves_it_byte_for_byte_once_and_only_under_the_current_token(redis: Redis) -> None:
    keys, _, poison_id = await hold_with_poison(redis, "E1", 3, at=0)
    grant = await fencing.acquire_claim(redis, keys, "me", 60_000)
    assert (await deadletter.set_aside(redis, keys, grant.token + 1, poison_id)).status is SetAsideStatus.FENCED
    first = await deadletter.set_aside(redis, keys, grant.token, poison_id)
    again = await deadletter.set_aside(redis, keys, grant.token, poison_id)
    assert (first.status, first.dead, first.key) == (SetAsideStatus.SET_ASIDE, 1, keys.dead)
    assert (again.status, again.dead) == (SetAsideStatus.GONE, 1)
    [(_, fields)] = await redis.xrange(keys.dead)
    assert fields == {b"task": b"poison", **{k.encode(): v.encode() for k, v in POISON.items()}}
    assert await redis.xlen(keys.held) == 2


async def test_a_poison_task_does_not_stop_the_replay(temporal_env, redis, redis_url, task_queue) -> None:
    """Issue 6's input: 100 held tasks, the 41st with 4,000 fields. The 99 others are replayed in
    order, exactly once; the 41st is in the dead-letter stream, counted in the result and progress."""
    e = f"E{uuid.uuid4().hex[:6]}"
    keys, names, _ = await hold_with_poison(redis, e, 100, at=40)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    stop, seen = asyncio.Event(), []
    consumer = asyncio.create_task(consume(redis, "c1", stop, seen))
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(temporal_env.client, task_queue, experiment_id=e, max_backlog_threshold=500, batch_size=30)
        result = await asyncio.wait_for(handle.result(), 30)
        progress = await handle.query(ResumptionWorkflow.progress)
    stop.set()
    await consumer
    assert (result.outcome, result.replayed, result.remaining, result.set_aside) == (Outcome.COMPLETED, 99, 0, 1)
    assert (progress.set_aside, progress.dead_letter_key) == (1, keys.dead)
    assert "set aside" in details_markdown(progress)
    assert await stream_tasks(redis) == names and seen == names
    assert await redis.xlen(keys.dead) == 1
    assert await held.get_state(redis, keys) is ExperimentState.RUNNING


def xmc(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``xmc args --json`` as an operator runs it."""
    return xmc_process(redis_url, *args, "--json")


async def test_an_operator_lists_retries_and_drops_set_aside_tasks(redis: Redis, redis_url: str) -> None:
    keys, _, poison_id = await hold_with_poison(redis, "E1", 2, at=0)
    grant = await fencing.acquire_claim(redis, keys, "me", 60_000)
    await deadletter.set_aside(redis, keys, grant.token, poison_id)
    second = (await redis.xadd(keys.dead, {"task": b"other"})).decode()
    listed = xmc(redis_url, "dead", "E1")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert rows["key"] == keys.dead and [t["fields"] for t in rows["tasks"]] == [4_001, 1]
    dead_ids = [t["id"] for t in rows["tasks"]]
    status = json.loads(xmc(redis_url, "status", "E1").stdout)
    assert status["set_aside"] == 2
    # the experiment still holds a task: a retried one goes to the end of the held stream
    retried = xmc(redis_url, "dead", "E1", "--retry", dead_ids[0])
    assert json.loads(retried.stdout) == {"entry_id": dead_ids[0], "retried_to": "held"}
    assert (await redis.xrevrange(keys.held, count=1))[0][1][b"task"] == b"poison"
    dropped = xmc(redis_url, "dead", "E1", "--drop", second)
    assert json.loads(dropped.stdout) == {"entry_id": second, "dropped": True}
    assert await redis.xlen(keys.dead) == 0
    missing = xmc(redis_url, "dead", "E1", "--drop", second)
    assert (
        missing.returncode == 2 and missing.stderr.count("\n") == 1 and f"no set-aside task {second}" in missing.stderr
    )
    bad = xmc(redis_url, "dead", "E1", "--drop", "nope")
    assert bad.returncode == 2 and "not a stream entry ID" in bad.stderr


async def test_a_producer_cannot_enqueue_a_task_the_scripts_could_not_move(redis: Redis) -> None:
    keys = ExperimentKeys(STREAM, "E1")
    with pytest.raises(ValueError, match=f"more than {MAX_TASK_FIELDS}"):
        await held.enqueue_task(redis, keys, POISON)
    assert not await redis.exists(keys.stream, keys.held)
    assert (await held.enqueue_task(redis, keys, {f"f{i}": "v" for i in range(MAX_TASK_FIELDS)}))[0] == "stream"


async def test_a_dead_letter_key_of_the_wrong_type_moves_nothing(redis: Redis) -> None:
    """EXEC runs the rest of a transaction past a failed command: the type is checked first, so
    the task stays held rather than being deleted without landing anywhere."""
    keys, _, poison_id = await hold_with_poison(redis, "E1", 2, at=0)
    grant = await fencing.acquire_claim(redis, keys, "me", 60_000)
    await redis.set(keys.dead, "text")
    with pytest.raises(ResponseError, match=f"WRONGTYPE {keys.dead} is a string, expected a stream"):
        await deadletter.set_aside(redis, keys, grant.token, poison_id)
    assert (await redis.xrange(keys.held, count=1))[0][0].decode() == poison_id


async def test_a_newer_claim_between_the_fence_read_and_the_commit_moves_nothing(
    redis: Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The set-aside reads the fence under WATCH, then commits with MULTI/EXEC. A newer claim taken
    by another client in between (here: right after the read, while the transaction checks the
    dead-letter key's type) must make the commit fail, nothing moved: a fenced replayer may not move
    a held task. The retry then sees the newer token and answers ``fenced``."""
    keys, _, poison_id = await hold_with_poison(redis, "E1", 3, at=0)
    grant = await fencing.acquire_claim(redis, keys, "me", 60_000)
    other = Redis.from_url(redis_url)
    checked = deadletter._must_be_a_stream
    taken: list[int] = []

    async def newer_claim_meanwhile(client: object, key: str) -> None:
        if not taken:  # once, between the fence read and the MULTI
            taken.append((await fencing.acquire_claim(other, keys, "newer", 60_000)).token)
        await checked(client, key)  # type: ignore[arg-type]

    monkeypatch.setattr(deadletter, "_must_be_a_stream", newer_claim_meanwhile)
    try:
        with pytest.raises(WatchError):
            await deadletter.set_aside(redis, keys, grant.token, poison_id)
        retried = await deadletter.set_aside(redis, keys, grant.token, poison_id)
    finally:
        await other.aclose()
    assert len(taken) == 1 and taken[0] > grant.token
    assert retried.status is SetAsideStatus.FENCED
    assert (await redis.xrange(keys.held, count=1))[0][0].decode() == poison_id
    assert await redis.xlen(keys.held) == 3 and await redis.xlen(keys.dead) == 0


def task_of(fields: int, name: bytes) -> dict[bytes, bytes]:
    """A task of exactly ``fields`` fields, ``task`` among them."""
    return {b"task": name, **{f"f{i}".encode(): b"v" for i in range(fields - 1)}}


@pytest.mark.parametrize(("fields", "set_aside"), [(MAX_TASK_FIELDS, 0), (MAX_TASK_FIELDS + 1, 1)])
async def test_the_most_fields_a_script_moves_is_the_boundary(
    temporal_env, redis, redis_url, task_queue, fields: int, set_aside: int
) -> None:
    """A held task of exactly ``MAX_TASK_FIELDS`` (3,995) fields goes through the publish script in
    its place, in order; one of 3,996 is set aside and the replay goes on behind it."""
    e = f"E{uuid.uuid4().hex[:6]}"
    keys = ExperimentKeys(STREAM, e)
    names = await hold_tasks(redis, e, 2)
    await redis.xadd(keys.held, task_of(fields, b"big"))
    names += [b"big"] + await hold_tasks(redis, e, 2, start=2)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(temporal_env.client, task_queue, experiment_id=e, max_backlog_threshold=100)
        result = await asyncio.wait_for(handle.result(), 30)
    assert (result.outcome, result.replayed, result.set_aside) == (Outcome.COMPLETED, 5 - set_aside, set_aside)
    assert await stream_tasks(redis) == [n for n in names if not (set_aside and n == b"big")]
    if set_aside:
        [(_, dead)] = await redis.xrange(keys.dead)
        assert dead == task_of(fields, b"big")
    else:
        big = [f for _, f in await redis.xrange(STREAM) if f[b"task"] == b"big"]
        assert big == [task_of(fields, b"big")]
    assert await redis.xlen(keys.held) == 0


def test_the_scripts_limit_is_the_producers() -> None:
    """``publish.lua``'s XMC_MAX_VALUES (names and values) is twice MAX_TASK_FIELDS: the most a
    producer may enqueue is the most a replay can move."""
    assert f"local XMC_MAX_VALUES = {2 * MAX_TASK_FIELDS}\n" in source("publish")
