"""Issue 14, items 1-3: every consumer group bounds the replay, a missing group is waited for, and a
stall names the idle consumers holding pending entries. Against a real redis-server (the Lua rule
of ``lua/backlog.lua``, the publish script, ``XINFO CONSUMERS``) and, for the ``waiting_for_group``
phase, the time-skipping test server."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError
from temporalio.testing import WorkflowEnvironment

from tests.support.helpers import (
    GROUP,
    STREAM,
    cancelled,
    hold_tasks,
    resumption_worker,
    start,
    stream_tasks,
    wait_for,
    xmc_process,
)
from xmc_resumption.redisclient import fencing, held
from xmc_resumption.redisclient.backlog import MAX_GROUPS, measure_backlog
from xmc_resumption.redisclient.consumers import idle_consumers
from xmc_resumption.redisclient.errors import MissingConsumerGroupError
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.redisclient.publish import PublishParams, publish_batch
from xmc_resumption.redisclient.readings import GroupStatus, MissingGroupPolicy
from xmc_resumption.redisclient.results import PublishStatus
from xmc_resumption.redisclient.scripts import run_script
from xmc_resumption.workflows import fleet
from xmc_resumption.workflows.models import Outcome, Phase, ResumptionInput
from xmc_resumption.workflows.text import details_markdown, ui_details

KEYS = ExperimentKeys(STREAM, "G1")


async def add(redis: Redis, n: int) -> None:
    """Add ``n`` entries to the task stream (not held tasks)."""
    async with redis.pipeline(transaction=False) as pipe:
        for i in range(n):
            pipe.xadd(STREAM, {"task": f"x{i}"})
        await pipe.execute()


async def three_groups(redis: Redis) -> None:
    """20 entries; ``xmc-workers`` read and acknowledged all, ``audit`` read 12 and acknowledged 4
    (pending 8, lag 8), ``late`` was created at entry 15 (lag 5)."""
    await redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    await add(redis, 20)
    await redis.xgroup_create(STREAM, "audit", id="0")
    ids = [i for i, _ in (await redis.xrange(STREAM))]
    await redis.xgroup_create(STREAM, "late", id=ids[14])
    read = await redis.xreadgroup(GROUP, "w1", {STREAM: ">"}, count=100)
    await redis.xack(STREAM, GROUP, *[i for i, _ in read[0][1]])
    read = await redis.xreadgroup("audit", "a1", {STREAM: ">"}, count=12)
    await redis.xack(STREAM, "audit", *[i for i, _ in read[0][1]][:4])


async def test_every_group_is_measured_and_the_largest_backlog_bounds(redis: Redis) -> None:
    await three_groups(redis)
    reading = await measure_backlog(redis, STREAM, GROUP, 100)
    parts = {g.name: (g.pending, g.lag, g.capped, g.counted) for g in reading.groups}
    assert parts == {GROUP: (0, 0, False, True), "audit": (8, 8, False, True), "late": (0, 5, False, True)}
    assert reading.groups[0].name == GROUP  # the required group is measured first
    assert (reading.limiting_group, reading.backlog, reading.headroom, reading.status) == ("audit", 16, 84, "ok")
    # named groups: the seed's one-group rule, and any subset
    one = await measure_backlog(redis, STREAM, GROUP, 100, groups=[GROUP])
    assert (one.limiting_group, one.backlog, one.headroom, len(one.groups)) == (GROUP, 0, 100, 1)
    two = await measure_backlog(redis, STREAM, GROUP, 100, groups=[GROUP, "late"])
    assert (two.limiting_group, two.backlog, two.headroom) == ("late", 5, 95)


async def test_each_count_stops_past_the_threshold_and_a_full_group_ends_the_counting(redis: Redis) -> None:
    await three_groups(redis)
    await add(redis, 1_000)  # every group is now more than the threshold behind
    reading = await measure_backlog(redis, STREAM, GROUP, 10)
    # xmc-workers is counted first and stops at threshold + 1: the others' lags are not counted
    assert [(g.name, g.lag, g.capped, g.counted) for g in reading.groups] == [
        (GROUP, 11, True, True), ("audit", 0, False, False), ("late", 0, False, False),
    ]  # fmt: skip
    # audit's pending (8) alone is under 10, but pending >= threshold skips the count: threshold 8
    reading = await measure_backlog(redis, STREAM, GROUP, 8)
    assert (reading.limiting_group, reading.pending, reading.lag, reading.capped, reading.headroom) == (
        "audit", 8, 0, True, 0,
    )  # fmt: skip
    assert not any(g.counted for g in reading.groups if g.name != "audit")
    # the byte budget caps each count too: Redis's entries-added - entries-read bounds what it could not read
    reading = await measure_backlog(redis, STREAM, GROUP, 2_000, max_bytes=100, groups=[GROUP])
    assert (reading.lag, reading.lag_source, reading.bytes_capped, reading.headroom) == (1_000, "bound", False, 1_000)
    # without entries-read (NULL after SETID) the stream's length bounds it: 1,020 entries for a lag of 1,000
    await redis.xgroup_setid(STREAM, GROUP, (await redis.xrange(STREAM, count=20))[-1][0])
    reading = await measure_backlog(redis, STREAM, GROUP, 2_000, max_bytes=100, groups=[GROUP])
    assert (reading.lag, reading.lag_source, reading.bytes_capped, reading.headroom) == (1_020, "bound", False, 980)


async def test_a_missing_group_under_each_policy(redis: Redis) -> None:
    await redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    await add(redis, 30)
    read = await redis.xreadgroup(GROUP, "w1", {STREAM: ">"}, count=100)
    await redis.xack(STREAM, GROUP, *[i for i, _ in read[0][1]])  # caught up
    named = [GROUP, "audit"]
    wait = await measure_backlog(redis, STREAM, GROUP, 10, MissingGroupPolicy.WAIT, groups=named)
    assert (wait.status, wait.missing_group, wait.headroom) == (GroupStatus.NO_GROUP, "audit", 0)
    # the consumer group's lag is known in O(1) (caught up) even with no headroom; audit's is not
    assert [(g.name, g.missing, g.counted) for g in wait.groups] == [(GROUP, False, True), ("audit", True, False)]
    with pytest.raises(MissingConsumerGroupError, match="'audit'"):
        await measure_backlog(redis, STREAM, GROUP, 10, MissingGroupPolicy.ERROR, groups=named)
    # zero: the stream's entries are the missing group's backlog (XLEN)
    zero = await measure_backlog(redis, STREAM, GROUP, 10, MissingGroupPolicy.ZERO, groups=named)
    assert (zero.status, zero.limiting_group, zero.lag, zero.capped, zero.headroom, zero.lag_source) == (
        GroupStatus.NO_GROUP, "audit", 30, False, 0, "stream",
    )  # fmt: skip
    # every group (the default): only the consumer group is required; audit is not asked for
    every = await measure_backlog(redis, STREAM, GROUP, 100)
    assert (every.status, every.missing_group, every.backlog) == (GroupStatus.OK, "", 0)
    # the required group itself missing, with another group present
    await redis.xgroup_create(STREAM, "audit", id="$")
    await redis.xgroup_destroy(STREAM, GROUP)
    gone = await measure_backlog(redis, STREAM, GROUP, 100)
    assert (gone.status, gone.missing_group, gone.headroom) == (GroupStatus.NO_GROUP, GROUP, 0)


async def hold(redis: Redis, n: int) -> int:
    """Hold ``n`` tasks of ``KEYS``'s experiment and take its claim; returns the token."""
    await held.pause(redis, KEYS)
    for i in range(n):
        await held.enqueue_task(redis, KEYS, {"task": f"t{i}"})
    return (await fencing.acquire_claim(redis, KEYS, "me", 60_000)).token


async def publish(redis: Redis, token: int, seq: int, **kw):  # type: ignore[no-untyped-def]
    groups = kw.pop("groups", None)
    args = {"batch_size": 100, "threshold": 10, **kw}
    return await publish_batch(
        redis, KEYS, GROUP, PublishParams(token=token, seq=seq, owner="me", lease_ms=60_000, **args), groups
    )


async def test_zero_puts_at_most_the_threshold_into_a_stream_no_group_reads(redis: Redis) -> None:
    """The seed's zero moved every held task into a stream without a group; now at most the
    threshold goes in, and a group created later at ``$`` sees none of those (the cost of zero)."""
    token = await hold(redis, 50)
    first = await publish(redis, token, 1, missing_group=MissingGroupPolicy.ZERO)
    assert (first.status, first.moved, first.reading.status, first.reading.missing_group) == (
        PublishStatus.PUBLISHED, 10, GroupStatus.NO_STREAM, GROUP,
    )  # fmt: skip
    second = await publish(redis, token, 2, missing_group=MissingGroupPolicy.ZERO)
    assert (second.status, second.moved, second.reading.backlog) == (PublishStatus.THROTTLED, 0, 10)
    assert await redis.xlen(STREAM) == 10
    await redis.xgroup_create(STREAM, GROUP, id="$")  # a library's default: the group never sees them
    third = await publish(redis, token, 3, missing_group=MissingGroupPolicy.ZERO)
    assert (third.moved, third.reading.status) == (10, GroupStatus.OK)
    read = await redis.xreadgroup(GROUP, "c", {STREAM: ">"}, count=100)
    assert [f[b"task"] for _, f in read[0][1]] == [f"t{i}".encode() for i in range(10, 20)]


async def test_wait_moves_and_writes_nothing_until_the_group_exists(redis: Redis) -> None:
    token = await hold(redis, 5)
    await redis.pexpire(KEYS.claim, 5_000)
    waiting = await publish(redis, token, 1)  # the default policy: wait
    r = waiting.reading
    assert (waiting.status, waiting.moved, r.status, r.missing_group, waiting.remaining) == (
        PublishStatus.WAITING_FOR_GROUP, 0, GroupStatus.NO_STREAM, GROUP, 5,
    )  # fmt: skip
    assert not await redis.exists(STREAM) and not await redis.exists(KEYS.publish)
    assert await redis.pttl(KEYS.claim) <= 5_000  # the lease was not touched
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    done = await publish(redis, token, 1)
    assert (done.status, done.moved, done.reading.limiting_group) == (PublishStatus.COMPLETED, 5, GROUP)
    assert len((await redis.xreadgroup(GROUP, "c", {STREAM: ">"}, count=100))[0][1]) == 5


async def test_the_publish_is_bounded_by_the_slowest_group_and_names_it(redis: Redis) -> None:
    await three_groups(redis)  # audit: backlog 16
    token = await hold(redis, 50)
    result = await publish_batch(
        redis, KEYS, GROUP, PublishParams(token=token, seq=1, batch_size=100, threshold=20, owner="me", lease_ms=60_000)
    )
    assert (result.moved, result.reading.backlog, result.reading.limiting_group, result.reading.headroom) == (
        4,
        16,
        "audit",
        4,
    )
    again = await publish_batch(
        redis, KEYS, GROUP, PublishParams(token=token, seq=2, batch_size=100, threshold=20, owner="me", lease_ms=60_000)
    )
    assert (again.status, again.moved, again.reading.limiting_group) == (PublishStatus.THROTTLED, 0, "audit")
    # named: audit left out, the move is bounded by the others (late: lag 5 + 4 moved)
    named = await publish_batch(
        redis,
        KEYS,
        GROUP,
        PublishParams(token=token, seq=3, batch_size=100, threshold=20, owner="me", lease_ms=60_000),
        [GROUP, "late"],
    )
    assert (named.moved, named.reading.backlog, named.reading.limiting_group) == (11, 9, "late")


@pytest.mark.parametrize(
    ("index", "value", "says"),
    [
        (1, "x1", "token must be a decimal integer"),
        (2, "0", "seq must be an integer"),
        (3, "-1", "batch size must be an integer"),
        (4, "0", "threshold must be an integer"),
        (5, "bad group", "consumer group must be 1..200"),
        (6, "maybe", "missing-group policy must be wait, zero or error"),
        (7, "1.5", "lease must be an integer"),
        (8, "", "owner must be 1..1000 bytes"),
        (9, "0", "byte budget must be an integer"),
        (10, "2", "max memory fraction"),
        (11, "yes", "fair share must be 0 or 1"),
        (12, "", "experiment ID must be 1..200"),
        (13, "audit", "groups must include the consumer group"),
        (13, f"{GROUP}  audit", "groups must name 1..64 groups"),
        (13, f"{GROUP} {GROUP}", "groups names a group twice"),
        (13, " ".join([GROUP] + [f"g{i}" for i in range(MAX_GROUPS)]), "groups must name 1..64"),
    ],
)
async def test_every_publish_argument_is_checked_before_the_first_write(
    redis: Redis, index: int, value: str, says: str
) -> None:
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    token = await hold(redis, 5)
    keys = [KEYS.stream, KEYS.held, KEYS.state, KEYS.fence, KEYS.claim, KEYS.publish,
            f"{{{STREAM}}}:weights", f"{{{STREAM}}}:replayers"]  # fmt: skip
    args = [str(token), "1", "10", "100", GROUP, "wait", "60000", "me", "4096", "", "0", KEYS.experiment_id, "*"]
    args[index - 1] = value
    with pytest.raises(ResponseError, match=f"^XMCARG {says}"):
        await run_script(redis, "publish", keys, args)
    assert (await redis.xlen(STREAM), await redis.xlen(KEYS.held), await redis.exists(KEYS.publish)) == (0, 5, 0)


async def test_measure_arguments_are_checked(redis: Redis) -> None:
    with pytest.raises(ResponseError, match=r"^XMCARG missing-group policy"):
        await run_script(redis, "measure", [STREAM], [GROUP, "5", "4096", "ignore", "*"])
    with pytest.raises(ValueError, match="consumer_groups must include consumer_group"):
        await measure_backlog(redis, STREAM, GROUP, 5, groups=["audit"])


async def test_idle_consumers_holding_pending_entries_are_named(redis: Redis) -> None:
    await redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    await redis.xgroup_create(STREAM, "audit", id="0")
    await add(redis, 10)
    await redis.xreadgroup(GROUP, "dead", {STREAM: ">"}, count=6)
    await redis.xreadgroup(GROUP, "alive", {STREAM: ">"}, count=4)
    await redis.xreadgroup("audit", "a1", {STREAM: ">"}, count=3)
    await asyncio.sleep(0.3)
    await add(redis, 1)
    await redis.xreadgroup(GROUP, "alive", {STREAM: ">"}, count=1)  # it reads again: not idle
    found = await idle_consumers(redis, STREAM, [GROUP, "audit", "gone"], 250)
    assert [(c.group, c.consumer, c.pending) for c in found] == [(GROUP, "dead", 6), ("audit", "a1", 3)]
    assert found[0].idle_ms >= 250 and found[0].describe().startswith(f"{GROUP}/dead holds 6 pending, idle ")
    assert await idle_consumers(redis, STREAM, [GROUP], 60_000) == []
    assert len(await idle_consumers(redis, STREAM, [GROUP, "audit"], 0, limit=1)) == 1
    assert await idle_consumers(redis, "no-such-stream", [GROUP], 0) == []
    with pytest.raises(ValueError, match="min_idle_ms"):
        await idle_consumers(redis, STREAM, [GROUP], -1)


def test_the_input_names_the_groups_and_requires_the_consumer_group() -> None:
    inp = ResumptionInput(experiment_id="E")
    assert (inp.consumer_groups, inp.missing_group) == (None, MissingGroupPolicy.WAIT)
    assert "largest backlog of `xmc-workers` and every group with a consumer (group `xmc-workers` must exist)" in (
        ui_details(inp)
    )
    assert ResumptionInput(experiment_id="E", consumer_groups=[GROUP, "audit"]).consumer_groups == [GROUP, "audit"]
    for bad, says in (
        (["audit"], "must include consumer_group"),
        ([GROUP, GROUP], "names a group twice"),
        ([GROUP, "a b"], "consumer_groups"),
        ([], "at least 1 item"),
        ([GROUP] + [f"g{i}" for i in range(MAX_GROUPS)], "at most 64 items"),
    ):
        with pytest.raises(ValueError, match=says):
            ResumptionInput(experiment_id="E", consumer_groups=bad)


# --- the waiting_for_group phase on the time-skipping test server ------------------------------------


def experiment() -> str:
    return f"E{uuid.uuid4().hex[:6]}"


async def test_the_replay_waits_for_the_group_then_replays_everything_into_it(
    temporal_env: WorkflowEnvironment, redis: Redis, redis_url: str, task_queue: str
) -> None:
    """No stream and no group at the start: the replay moves nothing, waits in ``waiting_for_group``
    (progress, UI details, fleet phase) naming the stream and the group; once the group is created
    at ``$``, as the consumer libraries do, every task reaches it, in order."""
    e = experiment()
    names = await hold_tasks(redis, e, 12)
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(temporal_env.client, task_queue, experiment_id=e, throttle_seconds=5, batch_size=5)
        progress = await wait_for(handle, lambda p: p.phase is Phase.WAITING_FOR_GROUP)
        assert progress.throttle_reason == (
            f"stream {STREAM} does not exist, so neither does consumer group {GROUP} "
            "(missing_group wait: nothing moves until it exists)"
        )
        assert "**waiting for a consumer group**" in details_markdown(progress)
        assert progress.replayed == 0 and not await redis.exists(STREAM)
        described = await handle.describe()
        assert described.typed_search_attributes.get(fleet.PHASE) == "waiting_for_group"
        await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
        result = await asyncio.wait_for(handle.result(), 30)
    assert (result.outcome, result.replayed) == (Outcome.COMPLETED, 12)
    read = await redis.xreadgroup(GROUP, "c", {STREAM: ">"}, count=100)
    assert [f[b"task"] for _, f in read[0][1]] == names == await stream_tasks(redis)


async def test_a_group_that_never_comes_ends_the_run_stalled_naming_it(
    temporal_env: WorkflowEnvironment, redis: Redis, redis_url: str, task_queue: str
) -> None:
    e = experiment()
    keys = ExperimentKeys(STREAM, e)
    names = await hold_tasks(redis, e, 5)
    await redis.xgroup_create(STREAM, "audit", id="$", mkstream=True)  # another group, not the one required
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(
            temporal_env.client, task_queue, experiment_id=e, stall_window_seconds=20, max_stall_seconds=60
        )
        result = await asyncio.wait_for(handle.result(), 30)
        progress = await handle.query("progress")
    assert (result.outcome, result.replayed, result.remaining) == (Outcome.STALLED, 0, 5)
    assert progress["stall_reason"] == (
        f"consumer group {GROUP} does not exist on stream {STREAM} (missing_group wait: nothing moves until it exists)"
    )
    assert await held.get_state(redis, keys) == "paused"
    assert [f[b"task"] for _, f in await redis.xrange(keys.held)] == names and await redis.xlen(STREAM) == 0


# --- the CLI: xmc status and xmc resume name the groups -------------------------------------------------


async def test_xmc_status_shows_each_group_the_limiting_one_and_idle_consumers(redis: Redis, redis_url: str) -> None:
    await three_groups(redis)
    await held.pause(redis, KEYS)
    await asyncio.sleep(0.2)  # audit's consumer a1 holds 8 entries, idle since its read
    ran = await asyncio.to_thread(xmc_process, redis_url, "status", KEYS.experiment_id, "--idle-seconds", "0.1")
    assert ran.returncode == 0, ran.stderr
    assert "  backlog of audit: 8 pending + 8 undelivered, under 500 (counted up to --threshold); the largest of 3" in (
        ran.stdout
    )
    assert "    group late: 0 pending + 5 undelivered; no consumer: not waited for" in ran.stdout
    assert "  idle consumers holding pending entries: audit/a1 holds 8, idle " in ran.stdout
    named = await asyncio.to_thread(
        xmc_process, redis_url, "status", KEYS.experiment_id, "--groups", f"{GROUP},late", "--json"
    )
    doc = json.loads(named.stdout)
    assert [g["name"] for g in doc["backlog"]["groups"]] == [GROUP, "late"]
    assert (doc["backlog"]["limiting_group"], doc["backlog"]["lag"], doc["idle_consumers"]) == ("late", 5, [])
    bad = await asyncio.to_thread(xmc_process, redis_url, "status", KEYS.experiment_id, "--groups", "late")
    assert bad.returncode == 2 and "must include --group xmc-workers" in bad.stderr
    await redis.xgroup_destroy(STREAM, GROUP)
    missing = await asyncio.to_thread(xmc_process, redis_url, "status", KEYS.experiment_id)
    assert f"  backlog: consumer group {GROUP} missing: a replay waits for it under missing_group wait" in (
        missing.stdout
    )


async def test_xmc_resume_takes_the_groups_and_checks_them_before_anything_starts(redis: Redis, redis_url: str) -> None:
    await hold(redis, 2)
    for groups, says in (("audit", "consumer_groups must include consumer_group"), ("a b", "consumer_groups 'a b'")):
        ran = await asyncio.to_thread(xmc_process, redis_url, "resume", KEYS.experiment_id, "--groups", groups)
        assert ran.returncode == 2 and says in ran.stderr, ran.stderr
    # a valid list passes the input's rule; the start then needs Temporal (a refused port here)
    ran = await asyncio.to_thread(
        xmc_process, redis_url, "resume", KEYS.experiment_id, "--groups", f"{GROUP},audit", "--missing-group", "wait"
    )
    assert ran.returncode == 2 and "cannot reach Temporal" in ran.stderr, ran.stderr


async def leftover_taskiq_group(redis: Redis, redis_url: str, behind: int) -> None:
    """The consumer group ``xmc-workers`` with a consumer, caught up; taskiq-redis's ``taskiq`` group, made by a
    producer's broker start-up (no consumer ever), ``behind`` entries behind."""
    from taskiq_redis import RedisStreamBroker

    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    broker = RedisStreamBroker(redis_url, queue_name=STREAM)
    await broker.startup()
    await broker.shutdown()
    await add(redis, behind)
    read = await redis.xreadgroup(GROUP, "w1", {STREAM: ">"}, count=behind)
    await redis.xack(STREAM, GROUP, *[i for i, _ in read[0][1]])
    groups = {g["name"]: g["consumers"] for g in await redis.xinfo_groups(STREAM)}
    assert groups == {GROUP.encode(): 1, b"taskiq": 0}


async def test_a_group_with_no_consumer_is_named_not_waited_for(redis: Redis, redis_url: str) -> None:
    """Issue 24 item 5: the group a taskiq-redis producer leaves behind does not hold the replay; it is reported
    with its backlog, and naming it in ``consumer_groups`` makes it count."""
    await leftover_taskiq_group(redis, redis_url, 20)
    reading = await measure_backlog(redis, STREAM, GROUP, 10)
    assert (reading.limiting_group, reading.backlog, reading.headroom) == (GROUP, 0, 10)
    assert [(g.name, g.pending, g.lag, g.exact) for g in reading.unattended] == [("taskiq", 0, 20, True)]
    assert [(g.name, g.consumers, g.bounds) for g in reading.groups] == [(GROUP, 1, True), ("taskiq", 0, False)]
    token = await hold(redis, 30)
    moved = await publish(redis, token, 1)  # threshold 10: the taskiq group's 20 do not hold it
    assert (moved.status, moved.moved, moved.reading.limiting_group) == (PublishStatus.PUBLISHED, 10, GROUP)
    assert [(g.name, g.lag) for g in moved.reading.unattended] == [("taskiq", 20)]
    named = await publish(redis, token, 2, groups=[GROUP, "taskiq"])
    assert (named.status, named.moved, named.reading.limiting_group, named.reading.backlog) == (
        PublishStatus.THROTTLED, 0, "taskiq", 30,
    )  # fmt: skip
    assert named.reading.unattended == []
    # the consumer group itself bounds with no consumer at all (its workers may not have started yet)
    await redis.xgroup_delconsumer(STREAM, GROUP, "w1")
    alone = await measure_backlog(redis, STREAM, GROUP, 10)
    assert (alone.limiting_group, alone.backlog, alone.headroom) == (GROUP, 10, 0)


async def test_a_stream_with_more_groups_than_a_list_may_name_is_measured_whole(redis: Redis) -> None:
    """Issue 26 row 6: a 65th group made during a replay neither fails the reading (it was an ``XMCGROUPS`` error
    that ended the run) nor escapes it: the groups past the 64th bound the replay like the others."""
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    for i in range(MAX_GROUPS):
        await redis.xgroup_create(STREAM, f"g{i:02}", id="$")
        await redis.xgroup_createconsumer(STREAM, f"g{i:02}", "c")
    await add(redis, 5)
    for i in range(MAX_GROUPS - 1):  # every group but the last reads everything
        await redis.xreadgroup(f"g{i:02}", "c", {STREAM: ">"}, count=10, noack=True)
    await redis.xreadgroup(GROUP, "c", {STREAM: ">"}, count=10, noack=True)
    reading = await measure_backlog(redis, STREAM, GROUP, 5)
    assert (len(reading.groups), reading.limiting_group, reading.backlog, reading.headroom) == (
        MAX_GROUPS + 1, f"g{MAX_GROUPS - 1:02}", 5, 0,
    )  # fmt: skip
    token = await hold(redis, 3)
    assert (await publish(redis, token, 1, threshold=7)).moved == 2
    throttled = await publish(redis, token, 2, threshold=7)
    assert (throttled.status, throttled.reading.limiting_group) == (PublishStatus.THROTTLED, f"g{MAX_GROUPS - 1:02}")


async def test_with_no_headroom_the_reading_says_how_long_the_limiting_group_has_been_idle(redis: Redis) -> None:
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    await add(redis, 10)
    await redis.xreadgroup(GROUP, "w1", {STREAM: ">"}, count=4)
    await asyncio.sleep(0.3)
    full = await measure_backlog(redis, STREAM, GROUP, 10)
    assert full.headroom == 0 and full.limiting_idle_ms is not None and full.limiting_idle_ms >= 300
    await redis.xreadgroup(GROUP, "w2", {STREAM: ">"}, count=1)  # one consumer that just read
    again = await measure_backlog(redis, STREAM, GROUP, 10)
    assert again.limiting_idle_ms is not None and again.limiting_idle_ms < 300
    assert (await measure_backlog(redis, STREAM, GROUP, 100)).limiting_idle_ms is None  # headroom left: not read


async def test_the_progress_names_a_group_no_consumer_reads_and_gives_no_eta_while_the_limiting_group_is_idle(
    temporal_env: WorkflowEnvironment, redis: Redis, redis_url: str, task_queue: str
) -> None:
    """Issue 24 item 5 in the progress: ``leftover`` (no consumer) is named with its backlog and does not hold the
    replay. ``xmc-workers``' consumer drains 10 a wait, so the ETA is known; then it stops reading, and once it has
    been idle for the stall window the progress says so and gives no ETA: the group that holds the replay does
    not drain."""
    e = experiment()
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    await redis.xgroup_create(STREAM, "leftover", id="$")
    await add(redis, 20)
    await redis.xreadgroup(GROUP, "w1", {STREAM: ">"}, count=20, noack=True)
    await hold_tasks(redis, e, 60)

    async def drain() -> int:
        read = await redis.xreadgroup(GROUP, "w1", {STREAM: ">"}, count=100, noack=True)
        return len(read[0][1]) if read else 0

    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(
            temporal_env.client, task_queue, experiment_id=e, max_backlog_threshold=10, batch_size=5,
            throttle_policy="fixed", throttle_seconds=1, stall_window_seconds=2,
        )  # fmt: skip
        progress = await wait_for(handle, lambda p: p.replayed == 10 and p.phase is Phase.THROTTLED)
        assert [(g.name, g.pending, g.lag) for g in progress.unattended_groups] == [("leftover", 0, 30)]
        assert (progress.limiting_group, progress.backlog) == (GROUP, 10)
        for waits in (2, 3):
            assert await drain() == 10
            await temporal_env.sleep(1)
            progress = await wait_for(handle, lambda p, n=waits: p.throttles == n and p.phase is Phase.THROTTLED)
        assert progress.eta_seconds is not None and progress.limiting_idle_ms is not None
        assert progress.limiting_idle_ms < 2_000
        await asyncio.sleep(2.1)  # w1 reads no more: idle past the stall window (Redis's clock)
        await temporal_env.sleep(1)
        progress = await wait_for(handle, lambda p: (p.limiting_idle_ms or 0) >= 2_000)
        assert (progress.eta_seconds, progress.limiting_group, progress.backlog) == (None, GROUP, 10)
        await cancelled(handle)
