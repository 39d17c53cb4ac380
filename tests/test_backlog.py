"""Backlog measurement against a real redis-server: every case of tests/cases/backlog.json (the
XINFO lag cases of docs/contract.md, "Backlog"; measured for the one group each names, the seed's
rule), plus the cap and the error paths. Several groups: tests/test_groups.py."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from xmc_resumption.redisclient.backlog import DEFAULT_BYTE_BUDGET, measure_backlog
from xmc_resumption.redisclient.errors import MissingConsumerGroupError
from xmc_resumption.redisclient.readings import BacklogReading, GroupStatus, MissingGroupPolicy

CASES = json.loads((Path(__file__).parent / "cases" / "backlog.json").read_text())
STREAM = CASES["stream"]


@pytest.mark.parametrize("case", CASES["cases"], ids=[c["name"] for c in CASES["cases"]])
async def test_backlog_case(redis: Redis, case: dict) -> None:
    for command in case["commands"]:
        await redis.execute_command(*command)
    policy = MissingGroupPolicy(case.get("policy", "zero"))
    threshold = case["threshold"]
    if "expect_error" in case:
        with pytest.raises(ResponseError, match=case["expect_error"]):
            await measure_backlog(redis, STREAM, case["group"], threshold, policy, groups=[case["group"]])
        return
    reading = await measure_backlog(redis, STREAM, case["group"], threshold, policy, groups=[case["group"]])
    truth = case["truth"]
    if truth < threshold:
        assert (reading.backlog, reading.exact) == (truth, True)
    else:
        assert reading.backlog >= threshold
    assert reading.headroom == max(0, threshold - truth)


async def test_lag_count_stops_just_past_the_threshold(redis: Redis) -> None:
    async with redis.pipeline(transaction=False) as pipe:
        for i in range(1, 10_001):
            pipe.xadd(STREAM, {"task": f"t{i}"}, id=f"{i}-0")
        await pipe.execute()
    await redis.xgroup_create(STREAM, "g", id="0")
    # before the first entry: every entry is the lag, from XLEN
    reading = await measure_backlog(redis, STREAM, "g", 50)
    assert (reading.pending, reading.lag, reading.capped, reading.lag_source) == (0, 10_000, False, "behind")
    # inside the stream with no record: a count, stopped just past the threshold
    await redis.xgroup_setid(STREAM, "g", "1-0")
    reading = await measure_backlog(redis, STREAM, "g", 50)
    assert (reading.pending, reading.lag, reading.capped, reading.lag_source) == (0, 51, True, "counted")


async def test_pending_alone_at_threshold_skips_the_count(redis: Redis) -> None:
    for i in range(1, 21):
        await redis.xadd(STREAM, {"task": f"t{i}"}, id=f"{i}-0")
    await redis.xgroup_create(STREAM, "g", id="0")
    await redis.xreadgroup("g", "c1", {STREAM: ">"}, count=7)
    reading = await measure_backlog(redis, STREAM, "g", 7)
    assert (reading.pending, reading.lag, reading.capped, reading.backlog, reading.lag_source) == (
        7, 0, True, 7, "not_counted",
    )  # fmt: skip
    reading = await measure_backlog(redis, STREAM, "g", 8)
    assert (reading.pending, reading.lag, reading.capped, reading.backlog) == (7, 2, True, 9)
    reading = await measure_backlog(redis, STREAM, "g", 100)
    assert (reading.pending, reading.lag, reading.capped, reading.backlog, reading.exact) == (7, 13, False, 20, True)


async def test_missing_group_zero_policy_counts_the_stream_and_warns(
    redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    await redis.xadd(STREAM, {"task": "t1"})
    reading = await measure_backlog(redis, STREAM, "nobody", 5, MissingGroupPolicy.ZERO)
    assert (reading.status, reading.backlog, reading.headroom, reading.missing_group, reading.lag_source) == (
        GroupStatus.NO_GROUP, 1, 4, "nobody", "stream",
    )  # fmt: skip
    assert "does not exist" in caplog.text


async def test_missing_group_wait_policy_leaves_no_headroom(redis: Redis) -> None:
    await redis.xadd(STREAM, {"task": "t1"})
    reading = await measure_backlog(redis, STREAM, "nobody", 5)  # the default policy: wait
    assert (reading.status, reading.backlog, reading.headroom, reading.missing_group) == (
        GroupStatus.NO_GROUP, 0, 0, "nobody",
    )  # fmt: skip


async def test_missing_group_error_policy_raises(redis: Redis) -> None:
    await redis.xadd(STREAM, {"task": "t1"})
    with pytest.raises(MissingConsumerGroupError, match="nobody"):
        await measure_backlog(redis, STREAM, "nobody", 5, MissingGroupPolicy.ERROR)


async def test_missing_stream_is_zero_under_the_zero_policy_and_an_error_under_error(redis: Redis) -> None:
    reading = await measure_backlog(redis, STREAM, "g", 5, MissingGroupPolicy.ZERO)
    assert (reading.status, reading.backlog, reading.headroom) == (GroupStatus.NO_STREAM, 0, 5)
    reading = await measure_backlog(redis, STREAM, "g", 5, MissingGroupPolicy.WAIT)
    assert (reading.status, reading.headroom, reading.missing_group) == (GroupStatus.NO_STREAM, 0, "g")
    with pytest.raises(MissingConsumerGroupError):
        await measure_backlog(redis, STREAM, "g", 5, MissingGroupPolicy.ERROR)


async def test_connection_error_is_raised_not_zero() -> None:
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError

    from xmc_resumption.services import free_port

    client = Redis(port=free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))  # no client retries
    with pytest.raises(RedisConnectionError):
        await measure_backlog(client, STREAM, "g", 5)
    await client.aclose()


async def test_threshold_below_one_is_refused(redis: Redis) -> None:
    with pytest.raises(ValueError, match="threshold"):
        await measure_backlog(redis, STREAM, "g", 0)


# The measurement against brute force: random sequences of the stream commands consumers, producers and
# operators run, on a real redis-server. Each group's truth is its PEL size plus the entries that exist
# after its last-delivered-id, read in full; a reading must equal it below the threshold and reach the
# threshold otherwise, whatever the records (``{S}:backlog``) the earlier readings of the sequence wrote.
GROUPS = ("g0", "g1", "g2")
_index = st.integers(min_value=0, max_value=10_000)  # an entry chosen modulo the entries there are
_group = st.sampled_from(GROUPS)
OPERATION = st.one_of(
    st.tuples(st.just("xadd"), st.integers(min_value=1, max_value=25)),
    st.tuples(st.just("xdel"), _index, st.integers(min_value=1, max_value=3)),
    st.tuples(st.just("maxlen"), st.integers(min_value=0, max_value=40)),
    st.tuples(st.just("minid"), _index),
    st.tuples(st.just("create"), _group, st.sampled_from(("0", "$", "id")), _index),
    st.tuples(st.just("setid"), _group, st.sampled_from(("0", "$", "id")), _index, st.booleans()),
    st.tuples(st.just("destroy"), _group),
    st.tuples(st.just("read"), _group, st.sampled_from(("c0", "c1")), st.integers(min_value=1, max_value=30)),
    st.tuples(st.just("ack"), _group, st.integers(min_value=1, max_value=10)),
    st.tuples(st.just("autoclaim"), _group, st.integers(min_value=1, max_value=5)),
    st.tuples(st.just("claim"), _group, _index),
    st.tuples(st.just("measure"), st.integers(min_value=1, max_value=60), st.booleans()),
)


def _id(raw: bytes | str) -> tuple[int, int]:
    ms, seq = (raw.decode() if isinstance(raw, bytes) else raw).split("-")
    return int(ms), int(seq)


class _Model:
    """What the brute force needs that Redis does not say: every ID ever added, in order."""

    def __init__(self) -> None:
        self.added: list[tuple[int, int]] = []

    def added_up_to(self, entry: tuple[int, int]) -> int:
        """Entries ever added with an ID at or before ``entry``: what ENTRIESREAD means."""
        return sum(1 for i in self.added if i <= entry)


async def _truth(redis: Redis) -> dict[str, int]:
    """Each group's backlog, by brute force: pending + the entries that exist after its last-delivered-id."""
    if not await redis.exists(STREAM):
        return {}
    ids = [_id(i) for i, _ in await redis.xrange(STREAM)]
    truth = {}
    for g in await redis.xinfo_groups(STREAM):
        last = _id(g["last-delivered-id"])
        truth[g["name"].decode()] = g["pending"] + sum(1 for i in ids if i > last)
    return truth


async def _apply(redis: Redis, model: _Model, op: tuple) -> None:  # type: ignore[type-arg]
    """Run one operation; one that Redis refuses in this state (no stream, no group, BUSYGROUP) is skipped."""
    kind = op[0]
    ids = [i for i, _ in await redis.xrange(STREAM)] if await redis.exists(STREAM) else []
    try:
        if kind == "xadd":
            async with redis.pipeline(transaction=False) as pipe:
                for i in range(op[1]):
                    pipe.xadd(STREAM, {"task": f"t{i}"})
                model.added += [_id(i) for i in await pipe.execute()]
        elif kind == "xdel" and ids:
            await redis.xdel(STREAM, *{ids[(op[1] + k) % len(ids)] for k in range(op[2])})
        elif kind == "maxlen" and ids:
            await redis.xtrim(STREAM, maxlen=op[1], approximate=False)
        elif kind == "minid" and ids:
            await redis.xtrim(STREAM, minid=ids[op[1] % len(ids)], approximate=False)
        elif kind in ("create", "setid"):
            where = op[2]
            if where == "id":
                where = ids[op[3] % len(ids)] if ids else "0"
            if kind == "create":
                await redis.xgroup_create(STREAM, op[1], id=where, mkstream=True)
            elif op[4]:
                # ENTRIESREAD as Redis's replication writes it: the entries added up to the ID
                if where == "$":
                    at = model.added[-1] if model.added else (0, 0)
                else:
                    at = (0, 0) if where == "0" else _id(where)
                await redis.execute_command(
                    "XGROUP", "SETID", STREAM, op[1], where, "ENTRIESREAD", model.added_up_to(at)
                )
            else:
                await redis.xgroup_setid(STREAM, op[1], where)
        elif kind == "destroy" and ids is not None:
            await redis.xgroup_destroy(STREAM, op[1])
        elif kind == "read":
            await redis.xreadgroup(op[1], op[2], {STREAM: ">"}, count=op[3])
        elif kind == "ack":
            pending = await redis.xpending_range(STREAM, op[1], min="-", max="+", count=op[2])
            if pending:
                await redis.xack(STREAM, op[1], *[p["message_id"] for p in pending])
        elif kind == "autoclaim":
            await redis.xautoclaim(STREAM, op[1], "c1", 0, count=op[2])
        elif kind == "claim":
            pending = await redis.xpending_range(STREAM, op[1], min="-", max="+", count=100)
            if pending:
                await redis.xclaim(STREAM, op[1], "c0", 0, [pending[op[2] % len(pending)]["message_id"]])
    except ResponseError as err:
        if not any(word in str(err) for word in ("NOGROUP", "BUSYGROUP", "requires the key to exist", "no such key")):
            raise


async def _check(redis: Redis, threshold: int, every: bool, max_bytes: int) -> None:
    truth = await _truth(redis)
    for name, backlog in truth.items():
        reading = await measure_backlog(
            redis, STREAM, name, threshold, max_bytes=max_bytes, groups=[name], records=True
        )
        _agree(reading, backlog, threshold, exact=max_bytes >= 1_000_000)
    if every and truth:
        name = sorted(truth)[0]
        reading = await measure_backlog(redis, STREAM, name, threshold, max_bytes=max_bytes, records=True)
        bounding = [g for g in reading.groups if g.bounds]
        assert {g.name for g in bounding} == {n for n in truth if n == name or _consumers(reading, n) > 0}
        _agree(reading, max(truth[g.name] for g in bounding), threshold, exact=max_bytes >= 1_000_000)


def _consumers(reading: BacklogReading, name: str) -> int:
    return next(g.consumers for g in reading.groups if g.name == name)


def _agree(reading: BacklogReading, truth: int, threshold: int, *, exact: bool) -> None:
    """Exact below the threshold (with every count in budget), never below the truth or the threshold."""
    if truth < threshold:
        if exact:
            assert (reading.backlog, reading.headroom) == (truth, threshold - truth)
        else:  # a count cut by the byte budget: an upper bound, never under the truth
            assert reading.backlog >= truth and reading.headroom == threshold - min(threshold, reading.backlog)
    else:
        assert reading.headroom == 0 and reading.backlog >= threshold


async def _run_sequence(url: str, operations: list[tuple], max_bytes: int) -> None:  # type: ignore[type-arg]
    redis = Redis.from_url(url, decode_responses=False)
    try:
        await redis.flushall()
        model = _Model()
        for op in operations:
            if op[0] == "measure":
                await _check(redis, op[1], op[2], max_bytes)
            else:
                await _apply(redis, model, op)
        await _check(redis, 5, True, max_bytes)
        await _check(redis, 60, True, max_bytes)
    finally:
        await redis.aclose()


@settings(
    max_examples=int(os.environ.get("XMC_EXAMPLES", 150)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    report_multiple_bugs=False,
)
@given(operations=st.lists(OPERATION, max_size=40))
def test_the_reading_equals_the_brute_force_truth(redis_url: str, operations: list[tuple]) -> None:  # type: ignore[type-arg]
    asyncio.run(_run_sequence(redis_url, operations, DEFAULT_BYTE_BUDGET))


@settings(
    max_examples=int(os.environ.get("XMC_EXAMPLES", 150)) // 3,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    report_multiple_bugs=False,
)
@given(operations=st.lists(OPERATION, max_size=40))
def test_a_count_cut_by_the_byte_budget_never_under_counts(redis_url: str, operations: list[tuple]) -> None:  # type: ignore[type-arg]
    asyncio.run(_run_sequence(redis_url, operations, 40))


async def _lag_of(redis: Redis, threshold: int = 1_000) -> tuple[int, str | None]:
    reading = await measure_backlog(redis, STREAM, "g", threshold, groups=["g"], records=True)
    return reading.backlog, reading.lag_source


async def _ids(redis: Redis, n: int) -> None:
    for i in range(1, n + 1):
        await redis.xadd(STREAM, {"task": f"t{i}"}, id=f"{i}-0")


async def test_a_group_that_reads_past_trimmed_entries_is_counted_not_taken_from_entries_read(redis: Redis) -> None:
    # Redis 7.0 counts one entry read where the group skipped the trimmed ones: entries-read 2 at 6-0,
    # so entries-added - entries-read (and XINFO's lag) says 8 where 4 entries are left after 6-0
    await _ids(redis, 10)
    await redis.xgroup_create(STREAM, "g", id="0")
    await redis.xreadgroup("g", "c", {STREAM: ">"}, count=1)
    assert await _lag_of(redis) == (10, "counted")  # pending 1 + 9
    await redis.xtrim(STREAM, maxlen=5, approximate=False)
    await redis.xreadgroup("g", "c", {STREAM: ">"}, count=1)
    group = (await redis.xinfo_groups(STREAM))[0]
    assert (group["entries-read"], group["lag"]) == (2, 8)
    assert await _lag_of(redis) == (2 + 4, "counted")


async def test_a_group_that_reads_past_a_deleted_entry_is_counted_not_taken_from_entries_read(redis: Redis) -> None:
    await _ids(redis, 5)
    await redis.xgroup_create(STREAM, "g", id="0")
    await redis.xreadgroup("g", "c", {STREAM: ">"}, count=2)
    await redis.xack(STREAM, "g", "1-0", "2-0")
    await redis.xreadgroup("g", "c", {STREAM: ">"}, count=3)
    await redis.xack(STREAM, "g", "3-0", "4-0", "5-0")
    assert await _lag_of(redis) == (0, "caught_up")  # entries-read 5 = entries-added: the record is written
    await _ids_after(redis, 6, 10)
    assert await _lag_of(redis) == (5, "recorded")  # O(1) from the record
    await redis.xdel(STREAM, "6-0")  # an entry the group has not read
    await redis.xreadgroup("g", "c", {STREAM: ">"}, count=1)  # 7-0: Redis 7.0 counts one read, not two
    group = (await redis.xinfo_groups(STREAM))[0]
    assert (group["entries-read"], group["lag"]) == (6, 4)
    assert await _lag_of(redis) == (1 + 3, "counted")  # something was deleted: the record no longer holds


async def _ids_after(redis: Redis, first: int, last: int) -> None:
    for i in range(first, last + 1):
        await redis.xadd(STREAM, {"task": f"t{i}"}, id=f"{i}-0")


async def test_a_group_moved_back_loses_its_record(redis: Redis) -> None:
    # XGROUP SETID back with ENTRIESREAD before a deleted entry, then reads past it: Redis 7.0 counts one read
    # for two entries. A reading that sees the group behind its record drops the record, so the later
    # reading counts instead of trusting entries-read.
    await _ids(redis, 10)
    await redis.xgroup_create(STREAM, "g", id="0")
    await redis.xdel(STREAM, "5-0")
    await redis.xreadgroup("g", "c", {STREAM: ">"}, count=100)
    await redis.xack(STREAM, "g", *[f"{i}-0" for i in range(1, 11) if i != 5])
    assert await _lag_of(redis) == (0, "caught_up")
    assert await redis.hget("{" + STREAM + "}:backlog", "g") == b"10-0 10 10 1"
    await _ids_after(redis, 11, 15)
    await redis.execute_command("XGROUP", "SETID", STREAM, "g", "4-0", "ENTRIESREAD", 4)
    assert await _lag_of(redis) == (10, "counted")  # 6..15 after 4-0 (nine of them and 10-0)
    assert await redis.hget("{" + STREAM + "}:backlog", "g") is None
    await redis.xreadgroup("g", "c", {STREAM: ">"}, count=7)  # 6..12: entries-read 11 where 12 were added
    assert (await redis.xinfo_groups(STREAM))[0]["entries-read"] == 11
    assert await _lag_of(redis) == (7 + 3, "counted")


async def test_a_lag_past_the_count_budget_is_bounded_by_entries_read(redis: Redis) -> None:
    # 20,000 entries behind at threshold 100,000: entries-read is exact (the group read from the start and
    # nothing was removed), so one count of at most COUNT_ENTRIES gives way to entries-added - entries-read
    await redis.xgroup_create(STREAM, "g", id="$", mkstream=True)
    async with redis.pipeline(transaction=False) as pipe:
        for _ in range(20_010):
            pipe.xadd(STREAM, {"task": "x"})
        await pipe.execute()
    await redis.xgroup_setid(STREAM, "g", "0")
    await redis.xreadgroup("g", "c", {STREAM: ">"}, count=10)
    reading = await measure_backlog(redis, STREAM, "g", 100_000, groups=["g"])
    assert (reading.backlog, reading.lag_source, reading.exact, reading.headroom) == (20_010, "bound", False, 79_990)


async def test_a_damaged_record_is_ignored_and_written_again(redis: Redis) -> None:
    key = "{" + STREAM + "}:backlog"
    await _ids(redis, 5)
    await redis.xgroup_create(STREAM, "g", id="$")
    await redis.hset(key, "g", "not a record")
    assert await _lag_of(redis) == (0, "caught_up")
    await _ids_after(redis, 6, 8)
    await redis.xreadgroup("g", "c", {STREAM: ">"}, count=10)
    await redis.xack(STREAM, "g", "6-0", "7-0", "8-0")
    assert await _lag_of(redis) == (0, "caught_up")  # entries-read 8 = entries-added: exact, recorded
    assert await redis.hget(key, "g") == b"8-0 8 8 0"
    await redis.hset(key, "g", "8-0 99999999999999999999 8 0")  # past what a Lua number holds: ignored
    await _ids_after(redis, 9, 9)
    assert await _lag_of(redis) == (1, "counted")
    await redis.set(key, "a string")
    with pytest.raises(ResponseError, match=r"WRONGTYPE \{xmc-tasks-stream\}:backlog is a string, expected a hash"):
        await _lag_of(redis)


async def test_groups_past_the_count_budget_take_their_upper_bound(redis: Redis) -> None:
    # three groups 600 behind, each read from the start (entries-read exact), none recorded: the count budget
    # (1,000 entries a script) counts the first whole and part of the second; the rest take their bound
    await redis.xgroup_create(STREAM, "g", id="$", mkstream=True)
    async with redis.pipeline(transaction=False) as pipe:
        for _ in range(700):
            pipe.xadd(STREAM, {"task": "x"})
        await pipe.execute()
    for name, read in (("g", 100), ("h", 100), ("i", 99)):
        await redis.xgroup_create(STREAM, name, id="0") if name != "g" else await redis.xgroup_setid(STREAM, "g", "0")
        await redis.xreadgroup(name, "c", {STREAM: ">"}, count=read, noack=True)
    reading = await measure_backlog(redis, STREAM, "g", 10_000)
    assert [(g.name, g.lag, g.lag_source, g.exact) for g in reading.groups] == [
        ("g", 600, "counted", True), ("h", 600, "bound", False), ("i", 601, "bound", False),
    ]  # fmt: skip
    assert (reading.limiting_group, reading.backlog, reading.headroom) == ("i", 601, 9_399)


async def test_a_reading_without_records_writes_nothing(redis: Redis) -> None:
    await _ids(redis, 5)
    await redis.xgroup_create(STREAM, "g", id="0")
    await redis.xreadgroup("g", "c", {STREAM: ">"}, count=5, noack=True)
    plain = await measure_backlog(redis, STREAM, "g", 10)
    assert (plain.backlog, plain.lag_source, await redis.exists("{" + STREAM + "}:backlog")) == (0, "caught_up", 0)
    assert (await _lag_of(redis)) == (0, "caught_up")
    assert await redis.hget("{" + STREAM + "}:backlog", "g") == b"5-0 5 5 0"
