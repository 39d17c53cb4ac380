"""``xmc plan`` and ``xmc resume --dry-run`` (``xmc_resumption.plan``) against a real redis-server
and the dev server: what would move, every group's backlog, the estimate from a sampled drain,
every reason the start would be refused or would wait; and that nothing is written, in Redis or
in Temporal. The ACL side is in tests/test_acl.py."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from redis.asyncio import Redis
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from tests.support.helpers import GROUP, STREAM, consume, hold_tasks
from tests.test_cli import Xmc, one_line, xmc_fixture  # noqa: F401  (the fixture)
from xmc_resumption import plan as plan_module
from xmc_resumption.plan import entry_time, plan
from xmc_resumption.redisclient import ratecap
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.workflows.eta import eta_seconds
from xmc_resumption.workflows.models import ResumptionInput
from xmc_resumption.workflows.resumption import ResumptionWorkflow

pytestmark = [pytest.mark.real_server, pytest.mark.slow]


def address(env: WorkflowEnvironment) -> str:
    return env.client.service_client.config.target_host


async def keyspace(redis: Redis) -> dict[bytes, tuple[bytes, bytes]]:
    """Every key with its type and DUMP: any write shows."""
    return {key: (await redis.type(key), await redis.dump(key)) async for key in redis.scan_iter()}


async def two_groups(redis: Redis) -> None:
    """xmc-workers (created at the end, one consumer holding 3 pending) and audit (created at 0):
    7 entries that are not held tasks, so each group's backlog is 7 (3 pending + 4, and 7)."""
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    await redis.xgroup_create(STREAM, "audit", id="0")
    for i in range(7):
        await redis.xadd(STREAM, {"task": f"other-{i}"})
    await redis.xreadgroup(GROUP, "c1", {STREAM: ">"}, count=3)


async def test_plan_reads_everything_and_writes_nothing(
    temporal_env: WorkflowEnvironment, redis: Redis, xmc: Xmc
) -> None:
    e = f"P{uuid.uuid4().hex[:6]}"
    await hold_tasks(redis, e, 50)
    await two_groups(redis)
    keys = ExperimentKeys(STREAM, e)
    before = await keyspace(redis)

    ran = await asyncio.to_thread(xmc, "plan", e, "--sample-seconds", "0.2", "--json", temporal=address(temporal_env))
    dry = await asyncio.to_thread(
        xmc, "resume", e, "--dry-run", "--sample-seconds", "0", temporal=address(temporal_env)
    )

    assert await keyspace(redis) == before
    with pytest.raises(RPCError) as missing:
        await temporal_env.client.get_workflow_handle(f"resumption-{e}").describe()
    assert missing.value.status is RPCStatusCode.NOT_FOUND  # nothing started
    assert (ran.returncode, ran.stderr) == (0, ""), ran
    doc = json.loads(ran.stdout)
    held: list[Any] = await redis.xrange(keys.held)
    size = sum(len(i) + sum(len(k) + len(v) for k, v in f.items()) for i, f in held)
    assert (doc["state"], doc["held"], doc["held_bytes"], doc["held_bytes_exact"]) == ("paused", 50, size, True)
    first, last = held[0][0].decode(), held[-1][0].decode()
    assert (doc["oldest"]["id"], doc["newest"]["id"]) == (first, last)
    assert doc["oldest"]["time"] == entry_time(first).isoformat().replace("+00:00", "Z")
    groups = {g["group"]: g for g in doc["groups"]}
    assert {name: (g["consumers"], g["pending"], g["lag"], g["backlog"]) for name, g in groups.items()} == {
        GROUP: (1, 3, 4, 7),
        "audit": (0, 0, 7, 7),
    }
    # nobody drained during the sample: a rate of 0 for the groups with a backlog, so no estimate
    assert groups[GROUP]["drain_rate"] == 0 and doc["rate"] is None and doc["estimate_seconds"] is None
    assert doc["estimate_basis"] == f"no estimate: {GROUP} drained nothing over the 0.2s sample"
    assert (doc["refusals"], doc["waits"], doc["run"]) == ([], [], None)
    assert doc["sample_seconds"] == 0.2
    assert (dry.returncode, dry.stderr) == (0, ""), dry
    assert dry.stdout.startswith(f"{e} on {STREAM}: paused, 50 held tasks, {size:,} bytes\n")
    assert f"  group {GROUP} (this replay's): 1 consumers, backlog 7 (pending 3 + lag 4), drain -\n" in dry.stdout
    assert dry.stdout.endswith("  xmc resume would start; nothing was written\n")


async def test_plan_names_every_refusal_and_wait(temporal_env: WorkflowEnvironment, redis: Redis, xmc: Xmc) -> None:
    """A resumption already running (started with no worker: it stays running), Redis evicting and
    over the memory fraction, a missing group under ``error``, a backlog over the threshold, the
    stream's rate cap; ``--dry-run`` exits 2 with one line, the plan on stdout."""
    e = f"P{uuid.uuid4().hex[:6]}"
    await hold_tasks(redis, e, 20)
    await two_groups(redis)
    await ratecap.set_stream_rate(redis, STREAM, 40)
    handle = await temporal_env.client.start_workflow(
        ResumptionWorkflow.run, ResumptionInput(experiment_id=e), id=f"resumption-{e}", task_queue="nobody-polls"
    )
    used = int((await redis.info("memory"))["used_memory"])
    await redis.config_set("maxmemory", str(used * 2))
    await redis.config_set("maxmemory-policy", "allkeys-lru")
    try:
        before = await keyspace(redis)
        env = {"temporal": address(temporal_env)}
        args = ("--sample-seconds", "0", "--max-memory-fraction", "0.3")
        missing = await asyncio.to_thread(
            xmc, "plan", e, "--group", "nosuch", "--missing-group", "error", *args, "--json", **env
        )
        over = await asyncio.to_thread(xmc, "plan", e, "--threshold", "5", *args, "--json", **env)
        dry = await asyncio.to_thread(xmc, "resume", e, "--dry-run", *args, **env)
        assert await keyspace(redis) == before
    finally:
        await redis.config_set("maxmemory-policy", "noeviction")
        await redis.config_set("maxmemory", "0")
        await handle.terminate()
    doc = json.loads(missing.stdout)
    assert doc["refusals"] == [
        "maxmemory-policy allkeys-lru: the replay needs noeviction (this policy can evict the held tasks, the "
        "fence counter or the claim); set maxmemory-policy noeviction on this Redis, then resume again",
        f"consumer group nosuch does not exist on {STREAM}: missing_group 'error' fails the run at its first "
        "measurement",
        f"a resumption is already running: resumption-{e} (run {handle.result_run_id}); xmc status {e} shows its "
        "progress and ETA",
    ]
    assert doc["waits"][0].startswith("Redis memory 5") and doc["waits"][0].endswith(
        "of maxmemory >= max_memory_fraction 0.3: the replay waits (10s at a time) until it falls"
    )
    assert doc["waits"][1:] == [
        "the stream's rate cap ({xmc-tasks-stream}:rate): at most 40 tasks/s for all its replays"
    ]
    assert doc["run"]["status"] == "running" and doc["at_least_seconds"] == 20 / 40
    waits = json.loads(over.stdout)["waits"]
    assert waits[-1] == f"backlog of {GROUP} is 6+ >= threshold 5: the replay waits for the consumers first"
    assert (dry.returncode, dry.stderr) == (2, f"xmc resume: the start would be refused: {e}: {doc['refusals'][0]}\n")
    assert "  refused: a resumption is already running: " in dry.stdout
    assert dry.stdout.endswith("  xmc resume would be refused; nothing was written\n")


async def test_the_estimate_is_the_sampled_drain(redis: Redis) -> None:
    """A consumer draining about 400/s a backlog of 3,000 other entries, sampled for 1 s: the
    group's drain rate; ``adaptive`` estimates ``(held - headroom) / rate``, ``fixed`` (a 10 s wait
    at threshold 500) no faster than 50/s, a rate cap of 20/s no faster than that."""
    e = f"P{uuid.uuid4().hex[:6]}"
    await hold_tasks(redis, e, 2_000)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    async with redis.pipeline(transaction=False) as pipe:
        for i in range(3_000):
            pipe.xadd(STREAM, {"task": f"other-{i}"})
        await pipe.execute()
    stop, seen = asyncio.Event(), []
    consumer = asyncio.create_task(consume(redis, "c1", stop, seen, per_read=20, rate=400))
    try:
        await asyncio.sleep(0.2)
        adaptive = await plan(
            redis, ResumptionInput(experiment_id=e, throttle_policy="adaptive"), temporal=None, sample_seconds=1
        )
        fixed = await plan(
            redis, ResumptionInput(experiment_id=e, throttle_policy="fixed"), temporal=None, sample_seconds=1
        )
        capped = await plan(
            redis, ResumptionInput(experiment_id=e, max_tasks_per_second=20), temporal=None, sample_seconds=1
        )
    finally:
        stop.set()
        await consumer
    [group] = adaptive.groups
    assert group.drain_rate is not None and 250 < group.drain_rate < 500, group
    assert adaptive.rate == group.drain_rate
    assert adaptive.estimate_seconds == eta_seconds(2_000, 0, group.drain_rate)  # backlog >= 500: no headroom
    assert adaptive.estimate_basis == (
        f"{GROUP} took {group.drain_rate:,.1f}/s with a backlog all along over a 1s sample (what its consumers "
        f"can take), producers added 0.0/s: {group.drain_rate:,.1f}/s left for the replay"
    )
    assert (group.caught_up, group.drain_note, adaptive.added_rate) == (False, None, 0)
    assert fixed.rate == 50 and fixed.estimate_seconds == 2_000 / 50
    assert "bounded by fixed waits: threshold / throttle_seconds = 50.0/s" in fixed.estimate_basis
    assert capped.rate == 20 and capped.estimate_seconds == capped.at_least_seconds == 2_000 / 20
    assert capped.notes[0] == "this replay's own rate cap: at most 20 tasks/s"
    assert capped.run == {"error": "Temporal not asked"}


async def test_a_missing_stream_and_a_large_held_stream(redis: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """No task stream: said, with what ``zero`` costs. Past the read limit the held bytes are
    estimated from the entries read."""
    e = f"P{uuid.uuid4().hex[:6]}"
    await hold_tasks(redis, e, 1_000)
    monkeypatch.setattr(plan_module, "ENTRIES_READ_LIMIT", 100)
    monkeypatch.setattr(plan_module, "READ_CHUNK", 30)
    found = await plan(redis, ResumptionInput(experiment_id=e), temporal=None, sample_seconds=0)
    held: list[Any] = await redis.xrange(ExperimentKeys(STREAM, e).held)
    size = sum(len(i) + sum(len(k) + len(v) for k, v in f.items()) for i, f in held)
    # the first 120 entries read (chunks of 30, past 100) are the shorter names (t0..t119): a few % low
    assert found.held_bytes_exact is False and 0.9 < found.held_bytes / size < 1
    assert (found.stream_exists, found.groups, found.sample_seconds) == (False, [], 0.0)
    assert f"the task stream {STREAM} does not exist: the replay waits for it (missing_group 'wait')" in found.waits
    zero = await plan(redis, ResumptionInput(experiment_id=e, missing_group="zero"), temporal=None, sample_seconds=0)
    assert zero.notes[0] == (
        f"the task stream {STREAM} does not exist: missing_group 'zero' counts the stream's entries as its backlog "
        "and moves up to the threshold into a stream no consumer group reads yet (a group created later at '$' "
        "never sees them)"
    )
    for bad in (-1.0, 61.0, float("nan")):
        with pytest.raises(ValueError, match="sample_seconds"):
            await plan(redis, ResumptionInput(experiment_id=e), temporal=None, sample_seconds=bad)


def test_nothing_to_plan_is_a_refusal(redis: Redis, xmc: Xmc) -> None:
    ran = xmc("plan", "P-none", "--sample-seconds", "0", "--json")
    assert ran.returncode == 0
    assert json.loads(ran.stdout)["refusals"][0].startswith(
        "experiment P-none is running and holds no tasks on xmc-tasks-stream: nothing to resume"
    )
    one_line(xmc("plan", "P-none", "--sample-seconds", "-1"), "xmc plan: error: Invalid value for '--sample-seconds'")


async def produce(redis: Redis, stop: asyncio.Event, per_second: float) -> None:
    """Another experiment's producer: ``per_second`` entries a second into the task stream, in tens."""
    i = 0
    while not stop.is_set():
        async with redis.pipeline(transaction=False) as pipe:
            for _ in range(10):
                pipe.xadd(STREAM, {"task": f"live-{i}"})
                i += 1
            await pipe.execute()
        await asyncio.sleep(10 / per_second)


async def test_a_caught_up_group_shows_a_lower_bound_not_what_producers_add(redis: Redis, xmc: Xmc) -> None:
    """Issue 26, row 4: the group is caught up and producers add about 100/s; its consumers could take
    far more. What it acknowledged is what producers added, so the plan calls it a lower bound and
    gives no estimate from it (before: ~100/s taken as the consumers' speed, an estimate printed)."""
    e = f"P{uuid.uuid4().hex[:6]}"
    await hold_tasks(redis, e, 3_000)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    stop, seen = asyncio.Event(), []
    tasks = [asyncio.create_task(consume(redis, "c1", stop, seen)), asyncio.create_task(produce(redis, stop, 100))]
    try:
        await asyncio.sleep(0.3)
        ran = await asyncio.to_thread(xmc, "plan", e, "--sample-seconds", "1.5", "--json")
        text = await asyncio.to_thread(xmc, "plan", e, "--sample-seconds", "1")
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    assert ran.returncode == 0, ran
    doc = json.loads(ran.stdout)
    assert (doc["rate"], doc["estimate_seconds"]) == (None, None), doc["estimate_basis"]
    [group] = doc["groups"]
    assert group["caught_up"] is True and 50 < group["drain_rate"] < 150, group
    assert (
        group["drain_note"]
        == "it caught up during the sample: the rate is what reached it, its consumers may take more"
    )
    assert 50 < doc["added_rate"] < 150
    assert doc["estimate_basis"] == (
        f"no estimate: {GROUP}: it caught up during the sample: the rate is what reached it, its consumers may take "
        "more; a sample shows what the consumers can take only while they have entries to read (the run's ETA "
        "tells once it feeds them)"
    )
    assert "estimated time: unknown (no estimate: " in text.stdout
    assert (
        f"  group {GROUP} (this replay's): 1 consumers, backlog 0 (pending 0 + lag 0), drain at least " in text.stdout
    )


async def test_producers_share_the_consumers_with_the_replay(redis: Redis) -> None:
    """Consumers taking about 400/s with a backlog all along while producers add about 100/s: the
    replay gets what is left, about 300/s (before: 400/s, as if the producers were not there)."""
    e = f"P{uuid.uuid4().hex[:6]}"
    await hold_tasks(redis, e, 2_000)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    async with redis.pipeline(transaction=False) as pipe:
        for i in range(3_000):
            pipe.xadd(STREAM, {"task": f"other-{i}"})
        await pipe.execute()
    stop, seen = asyncio.Event(), []
    tasks = [
        asyncio.create_task(consume(redis, "c1", stop, seen, per_read=20, rate=400)),
        asyncio.create_task(produce(redis, stop, 100)),
    ]
    try:
        await asyncio.sleep(0.2)
        found = await plan(redis, ResumptionInput(experiment_id=e), temporal=None, sample_seconds=1.5)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    [group] = found.groups
    assert found.added_rate is not None and group.drain_rate is not None and not group.caught_up
    assert 50 < found.added_rate < 150 and 250 < group.drain_rate < 500
    assert found.rate == pytest.approx(group.drain_rate - found.added_rate)
    assert found.estimate_seconds == eta_seconds(2_000, 0, found.rate)
    assert f"producers added {found.added_rate:,.1f}/s: {found.rate:,.1f}/s left for the replay" in (
        found.estimate_basis
    )


async def test_idle_consumers_say_why_the_plan_cannot_tell(redis: Redis) -> None:
    """Idle consumers, nothing added (the usual state before a resume): no rate, and the basis says
    why (before: "nothing to drain during the sample: its rate is unknown", no word on what would tell)."""
    e = f"P{uuid.uuid4().hex[:6]}"
    await hold_tasks(redis, e, 100)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    stop, seen = asyncio.Event(), []
    consumer = asyncio.create_task(consume(redis, "c1", stop, seen))
    try:
        found = await plan(redis, ResumptionInput(experiment_id=e), temporal=None, sample_seconds=0.5)
    finally:
        stop.set()
        await consumer
    [group] = found.groups
    assert (group.drain_rate, group.caught_up, found.added_rate, found.estimate_seconds) == (None, True, 0, None)
    assert found.estimate_basis == (
        f"no estimate: {GROUP}: nothing reached it during the sample: how fast its consumers go is unknown; a sample "
        "shows what the consumers can take only while they have entries to read (the run's ETA tells once it "
        "feeds them)"
    )


async def test_a_damaged_rate_cap_refuses_a_resume_as_it_refuses_a_dry_run(
    temporal_env: WorkflowEnvironment, redis: Redis, xmc: Xmc
) -> None:
    """Issue 26, row 7: a ``{S}:rate`` every publish would refuse. ``xmc resume --dry-run`` and plain
    ``xmc resume`` refuse with the same words (one check: ``ratecap.stream_rate``), and nothing starts
    (before: plain resume started a run that failed at its first publish)."""
    e = f"P{uuid.uuid4().hex[:6]}"
    await hold_tasks(redis, e, 5)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    await redis.hset(ratecap.rate_key(STREAM), mapping={"limit": "10", "tokens": "-1"})
    env = {"temporal": address(temporal_env)}
    dry = await asyncio.to_thread(xmc, "resume", e, "--dry-run", "--sample-seconds", "0", **env)
    plain = await asyncio.to_thread(xmc, "resume", e, **env)
    reason = 'XMCCORRUPT {xmc-tasks-stream}:rate field tokens holds "-1", not a number in [0, 1000000]'
    assert dry.returncode == 2 and dry.stderr.splitlines() == [
        f"xmc resume: the start would be refused: {e}: {reason}: every publish into {STREAM} fails until it is "
        f"mended (xmc rate --stream {STREAM} --clear removes it)"
    ], dry
    one_line(plain, f"xmc resume: {reason}: every publish into {STREAM} fails until it is mended")
    with pytest.raises(RPCError) as missing:
        await temporal_env.client.get_workflow_handle(f"resumption-{e}").describe()
    assert missing.value.status is RPCStatusCode.NOT_FOUND
