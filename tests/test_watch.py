"""Drain polls sharing their readings (``redisclient.watch``) against a real redis-server: one reading serves every
poll of a measurement, the headroom wakes the polls in turn, a fault fails them all, bounds are refused."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from xmc_resumption.redisclient.watch import BacklogWatches, TurnsRefused

STREAM, GROUP = "xmc-tasks-stream", "xmc-workers"


async def backlog_of(redis: Redis, entries: int) -> None:
    """A group at the stream's start with ``entries`` undelivered entries."""
    await redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    for i in range(entries):
        await redis.xadd(STREAM, {"n": str(i)})


def poll(watches: BacklogWatches, redis: Redis, low: int, **kw):  # type: ignore[no-untyped-def]
    args = {"min_seconds": 0.0, "max_seconds": 1.0, "poll_seconds": 0.01} | kw
    return watches.wait_for_drain(redis, STREAM, GROUP, 100, low, **args)


async def test_one_reading_serves_every_poll_of_a_measurement(redis: Redis) -> None:
    await backlog_of(redis, 80)
    watches = BacklogWatches()
    started = time.monotonic()
    waits = await asyncio.gather(*(poll(watches, redis, 10, max_seconds=0.3, poll_seconds=0.02) for _ in range(20)))
    elapsed = time.monotonic() - started
    assert all(not w.reached and w.reading.backlog == 80 and w.seconds >= 0.3 for w in waits)
    # the polls shared the readings: the first saw every one (under load a later poll may join a reading late: a CI
    # run saw 14 and 15 of 15), and there was at most one a poll period, where twenty polls on their own would have
    # taken twenty times as many (a slow machine makes fewer, never more)
    assert max(w.polls for w in waits) == watches.readings
    assert 1 <= watches.readings <= elapsed / 0.02 + 3
    assert watches.polling() == 0


async def test_polls_of_other_measurements_read_on_their_own(redis: Redis) -> None:
    await backlog_of(redis, 30)
    watches = BacklogWatches()
    a, b = await asyncio.gather(
        poll(watches, redis, 10, max_seconds=0.1),
        watches.wait_for_drain(redis, STREAM, GROUP, 25, 10, min_seconds=0, max_seconds=0.1, poll_seconds=0.01),
    )
    assert (a.reading.threshold, a.reading.headroom, b.reading.threshold, b.reading.headroom) == (100, 70, 25, 0)
    assert a.polls + b.polls == watches.readings


async def test_the_headroom_wakes_the_polls_in_turn(redis: Redis) -> None:
    await backlog_of(redis, 40)  # headroom 60 at threshold 100
    watches = BacklogWatches()
    waits = await asyncio.gather(*(poll(watches, redis, 50, take=30) for _ in range(5)))
    # first come, first served while a reading's headroom lasts: 30 + 30 promised to the first two; the next
    # reading (nobody published meanwhile) wakes the next two, the third the last
    assert [w.polls for w in waits] == [1, 1, 2, 2, 3] and all(w.reached for w in waits)
    assert watches.readings == 3


async def test_a_poll_whose_turn_does_not_come_ends_at_its_bound(redis: Redis) -> None:
    await backlog_of(redis, 40)
    watches = BacklogWatches()

    async def publisher() -> None:  # what the woken poll's replay does: publish its take
        first = await asyncio.wait_for(asyncio.shield(woken), 1.0)
        assert first.reached
        async with redis.pipeline(transaction=True) as pipe:  # at once, as the publish script moves them
            for i in range(60):
                pipe.xadd(STREAM, {"n": f"p{i}"})
            await pipe.execute()

    woken = asyncio.ensure_future(poll(watches, redis, 50, take=60))
    # the late poll reads every 0.1 s: its next reading comes after the publish (the woken one read every 0.01 s, and
    # a reading between its wake and the publish would see the headroom again, unpromised)
    late, _ = await asyncio.gather(poll(watches, redis, 50, max_seconds=0.3, poll_seconds=0.1, take=60), publisher())
    assert (await woken).polls == 1
    assert not late.reached and late.reading.backlog == 100 and late.seconds >= 0.3


async def test_a_poll_that_takes_none_wakes_the_next_too(redis: Redis) -> None:
    await backlog_of(redis, 40)
    watches = BacklogWatches()
    waits = await asyncio.gather(poll(watches, redis, 50, take=0), poll(watches, redis, 50))
    assert all(w.reached and w.polls == 1 for w in waits)


async def test_a_poll_sees_the_drain_and_its_largest_drop(redis: Redis) -> None:
    await backlog_of(redis, 90)
    watches = BacklogWatches()

    async def consumer() -> None:
        await asyncio.sleep(0.05)
        await redis.xreadgroup(GROUP, "c", {STREAM: ">"}, count=60)  # pending now: still backlog
        entries = await redis.xpending_range(STREAM, GROUP, "-", "+", 60)
        await redis.xack(STREAM, GROUP, *[e["message_id"] for e in entries])

    drained, _ = await asyncio.gather(poll(watches, redis, 40, min_seconds=0.1, poll_seconds=0.01), consumer())
    assert drained.reached and drained.reading.backlog == 30 and drained.largest_drop == 60
    assert drained.seconds >= 0.1  # reached early, but not before its least time


async def test_a_fault_fails_every_poll_waiting(redis: Redis) -> None:
    await redis.set(STREAM, "not a stream")
    watches = BacklogWatches()
    outcomes = await asyncio.gather(poll(watches, redis, 10), poll(watches, redis, 10), return_exceptions=True)
    assert all(isinstance(o, ResponseError) and "WRONGTYPE" in str(o) for o in outcomes)
    assert watches.polling() == 0


async def test_a_cancelled_poll_leaves_its_watch(redis: Redis) -> None:
    await backlog_of(redis, 80)
    watches = BacklogWatches()
    task = asyncio.create_task(poll(watches, redis, 10, max_seconds=5.0))
    await asyncio.sleep(0.05)
    assert watches.polling() == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert watches.polling() == 0
    await asyncio.sleep(0.05)
    assert not watches._watches  # the watch ended and left
    readings = watches.readings
    await asyncio.sleep(0.05)
    assert watches.readings == readings  # nobody waits: nothing is read


async def test_polls_without_a_take_take_no_turn(redis: Redis) -> None:
    """A poll without a ``take`` (runs recorded before patch ``publish-rounds``) ends at its watermark whatever the
    others do, as a poll of its own did; one that takes its turn still promises what it takes."""
    await backlog_of(redis, 40)
    watches = BacklogWatches()
    waits = await asyncio.gather(poll(watches, redis, 50, take=60), poll(watches, redis, 50), poll(watches, redis, 50))
    assert [w.polls for w in waits] == [1, 1, 1]
    late = await asyncio.gather(poll(watches, redis, 50, take=60), poll(watches, redis, 50, take=1))
    assert [w.polls for w in late] == [1, 2]


async def test_a_watch_that_stops_fails_the_polls_waiting_on_it(redis: Redis) -> None:
    await backlog_of(redis, 80)
    watches = BacklogWatches()
    polls = [asyncio.create_task(poll(watches, redis, 10, max_seconds=30.0)) for _ in range(2)]
    for _ in range(1_000):  # both polls wait on the watch (a loaded machine may take a while to start them)
        if watches.polling() == 2 and watches.readings > 0:
            break
        await asyncio.sleep(0.01)
    (watch_task,) = [t for t in asyncio.all_tasks() if t.get_coro().__name__ == "_run"]  # type: ignore[union-attr]
    watch_task.cancel()
    outcomes = await asyncio.gather(*polls, return_exceptions=True)
    assert all(isinstance(o, RuntimeError) and "the backlog watch stopped" in str(o) for o in outcomes)
    assert watches.polling() == 0 and not watches._watches


@pytest.mark.parametrize(
    ("low", "kw", "message"),
    [
        (100, {}, r"low_watermark must be in \[0, threshold\)"),
        (10, {"max_seconds": float("inf")}, "must be finite"),
        (10, {"min_seconds": 2.0}, "need 0 <= min_seconds <= max_seconds <= 60"),
        (10, {"max_seconds": 61.0}, "need 0 <= min_seconds <= max_seconds <= 60"),
        (10, {"poll_seconds": 0.0}, r"poll_seconds must be in \(0, 1\]"),
        (10, {"take": -1}, "take must be >= 0"),
        (10, {"queue_seconds": float("nan")}, r"queue_seconds must be in \[0, 86400\]"),
        (10, {"queue_seconds": -1.0}, r"queue_seconds must be in \[0, 86400\]"),
    ],
)
async def test_bad_arguments_are_refused(redis: Redis, low: int, kw: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        await poll(BacklogWatches(), redis, low, **kw)


class Line:
    """The turns a test's queued waiters were given, in order (what the worker's signals would be)."""

    def __init__(self) -> None:
        self.woken: list[str] = []

    def wake(self, name: str):  # type: ignore[no-untyped-def]
        async def given() -> None:
            self.woken.append(name)

        return given

    async def until(self, count: int) -> None:
        for _ in range(500):
            if len(self.woken) >= count:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{count} turns expected, {self.woken} given")


def queued_poll(watches: BacklogWatches, redis: Redis, line: Line, name: str, take: int, queue: float = 30.0):  # type: ignore[no-untyped-def]
    return poll(watches, redis, 50, max_seconds=0.1, take=take, replay=name, queue_seconds=queue, wake=line.wake(name))


async def drain_to(redis: Redis, backlog: int) -> None:
    """Read and acknowledge the group's entries until ``backlog`` are left."""
    length = await redis.xlen(STREAM)
    pending = await redis.xreadgroup(GROUP, "c", {STREAM: ">"}, count=length - backlog)
    await redis.xack(STREAM, GROUP, *[entry_id for entry_id, _ in pending[0][1]])


async def test_polls_whose_turn_does_not_come_queue_and_are_woken_in_turn(redis: Redis) -> None:
    """At their bound, polls sharing a watch stay in line; the headroom wakes them first come, first served, and a
    woken one's take stays promised until its replay calls again."""
    await backlog_of(redis, 100)  # threshold 100: no headroom
    watches, line = BacklogWatches(), Line()
    waits = await asyncio.gather(*(queued_poll(watches, redis, line, name, 40) for name in "abc"))
    assert [(w.queued, w.reached, w.reading.backlog) for w in waits] == [(True, False, 100)] * 3
    assert (watches.polling(), watches.queued(), line.woken) == (0, 3, [])
    await drain_to(redis, 30)  # headroom 70: a (40) and b (40 more, 40 < 70) have their turn, c must wait
    await line.until(2)
    readings = watches.readings
    while watches.readings < readings + 3:
        await asyncio.sleep(0.01)
    assert (line.woken, watches.queued()) == (["a", "b"], 1)  # nobody published: a and b keep their promise
    watches.left("a")  # a checks: it has left the line, but its turn stays promised until its publish
    readings = watches.readings
    while watches.readings < readings + 3:
        await asyncio.sleep(0.01)
    assert line.woken == ["a", "b"]
    watches.called("a")  # a published (or polls again): its take is no longer promised
    await line.until(3)
    assert line.woken == ["a", "b", "c"] and watches.queued() == 0


async def test_a_lone_poll_ends_at_its_bound_and_a_queued_one_leaves_after_its_queue_seconds(redis: Redis) -> None:
    await backlog_of(redis, 100)
    watches, line = BacklogWatches(), Line()
    alone = await queued_poll(watches, redis, line, "a", 40)
    assert not alone.queued and watches.queued() == 0  # nobody to take turns with: the replay turns as before
    waits = await asyncio.gather(*(queued_poll(watches, redis, line, name, 40, queue=0.2) for name in "abc"))
    assert [w.queued for w in waits] == [True, True, True]
    watches.called("c")  # c checked, published or released: its wait ended another way, it leaves the line
    assert watches.queued() == 2
    for _ in range(500):
        if not watches._watches:
            break
        await asyncio.sleep(0.01)
    assert (watches.queued(), line.woken, watches._watches) == (0, [], {})  # left the line; the watch stopped


async def test_a_replay_polling_again_leaves_its_queued_place_and_a_failed_wake_is_only_logged(
    redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    await backlog_of(redis, 100)
    watches, line = BacklogWatches(), Line()
    await asyncio.gather(*(queued_poll(watches, redis, line, name, 40) for name in "ab"))
    again = await asyncio.gather(queued_poll(watches, redis, line, "a", 40), queued_poll(watches, redis, line, "c", 40))
    # b, a (anew), c: behind a line, a poll queues at its first reading
    assert [(w.queued, w.polls) for w in again] == [(True, 1), (True, 1)] and watches.queued() == 3

    async def fails() -> None:
        raise RuntimeError("workflow not found")

    next(x for w in watches._watches.values() for x in w.waiters if x.key == "b").wake = fails
    await drain_to(redis, 0)  # headroom 100: b (failing), a, then c (80 < 100)
    await line.until(2)
    assert line.woken == ["a", "c"]
    assert "a queued replay's turn could not be given: workflow not found" in caplog.text


async def queue_three(watches: BacklogWatches, redis: Redis, line: Line) -> None:
    """Replays a, b and c queued at a backlog without headroom; none has its turn yet."""
    await backlog_of(redis, 100)
    waits = await asyncio.gather(*(queued_poll(watches, redis, line, name, 40) for name in "abc"))
    assert [w.queued for w in waits] == [True] * 3 and line.woken == []


async def test_a_reading_fault_gives_every_queued_waiter_its_turn(redis: Redis) -> None:
    """A fault fails the polls still waiting (their activities retry) and wakes the queued ones: their replays go on
    at their next turn, which measures afresh, instead of sleeping out their queue time."""
    watches, line = BacklogWatches(), Line()
    await queue_three(watches, redis, line)
    polling = asyncio.create_task(poll(watches, redis, 10, max_seconds=30.0))
    await redis.delete(STREAM)
    await redis.set(STREAM, "not a stream")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await polling
    await line.until(3)
    assert sorted(line.woken) == ["a", "b", "c"] and watches.queued() == 0


async def test_a_watch_that_stops_gives_every_queued_waiter_its_turn(redis: Redis) -> None:
    watches, line = BacklogWatches(), Line()
    await queue_three(watches, redis, line)
    (watch_task,) = [t for t in asyncio.all_tasks() if t.get_coro().__name__ == "_run"]  # type: ignore[union-attr]
    watch_task.cancel()
    await line.until(3)
    assert sorted(line.woken) == ["a", "b", "c"] and watches.queued() == 0 and not watches._watches


async def test_closing_gives_every_queued_waiter_its_turn_and_ends_queueing(redis: Redis) -> None:
    """What a stopping worker does (``ResumptionActivities``, the plugin): its line's replays go on elsewhere."""
    watches, line = BacklogWatches(), Line()
    await queue_three(watches, redis, line)
    await watches.close()  # it waits for the turns to be given
    assert sorted(line.woken) == ["a", "b", "c"] and watches.queued() == 0
    waits = await asyncio.gather(*(queued_poll(watches, redis, line, name, 40) for name in "de"))
    assert [(w.queued, w.reached) for w in waits] == [(False, False)] * 2  # at their bound, as before turns
    # polls running when the line closes end at their bound too: nobody would give them a turn
    watches = BacklogWatches()
    running = [
        asyncio.create_task(
            poll(watches, redis, 50, max_seconds=5.0, take=40, replay=n, queue_seconds=30.0, wake=line.wake(n))
        )
        for n in "fg"
    ]
    for _ in range(500):
        if watches.polling() == 2:
            break
        await asyncio.sleep(0.01)
    assert watches.polling() == 2  # both still polling (bound 5 s) when the line closes
    await watches.close()
    waits = await asyncio.gather(*running)
    assert [(w.queued, w.reached) for w in waits] == [(False, False)] * 2 and watches.queued() == 0


async def test_a_closed_line_reopened_for_the_next_worker_queues_again(redis: Redis) -> None:
    """``ResumptionActivities`` reused by a worker after one stopped (``reopen`` at its first poll); never after a
    refused turn."""
    watches, line = BacklogWatches(), Line()
    await watches.close()
    watches.reopen()
    await queue_three(watches, redis, line)  # all three queue
    watches.refusal = TurnsRefused("PERMISSION_DENIED")
    watches.reopen()
    assert not watches.queueing


async def test_a_refused_turn_ends_queueing_and_is_logged_once(redis: Redis, caplog: pytest.LogCaptureFixture) -> None:
    """A worker that may not signal (PERMISSION_DENIED, ``activities.resumption._turn_giver``) gives no turn: its
    polls no longer queue, and its line is left (the runs' own timers end their waits)."""
    watches, line = BacklogWatches(), Line()
    await queue_three(watches, redis, line)

    async def refused() -> None:
        raise TurnsRefused("PERMISSION_DENIED")

    for waiter in (x for w in watches._watches.values() for x in w.waiters):
        waiter.wake = refused
    await drain_to(redis, 0)  # headroom 100: a (40), b (80 < 100) and c (promised 80 < 100) have their turn, refused
    for _ in range(500):
        if watches.refusals >= 2:
            break
        await asyncio.sleep(0.01)
    assert not watches.queueing and watches.queued() == 0 and line.woken == [] and watches.refusals >= 2
    for i in range(100):  # no headroom again
        await redis.xadd(STREAM, {"n": f"again{i}"})
    waits = await asyncio.gather(*(queued_poll(watches, redis, line, name, 40) for name in "de"))
    assert [(w.queued, w.reached) for w in waits] == [(False, False)] * 2  # at their bound, as before turns
    await asyncio.sleep(0)  # a second refusal, if any, has run
    assert caplog.text.count("polls no longer queue on this worker") == 1


async def test_polls_of_replays_naming_other_groups_each_wait_on_their_own_groups(redis: Redis) -> None:
    """Issue 26's survivor: one reading shared by polls whose replays name different consumer groups would hand
    one replay the other's backlog. ``xmc-workers`` is caught up; ``audit`` (it has a consumer) is 50 behind."""
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    await redis.xgroup_create(STREAM, "audit", id="$")
    for i in range(50):
        await redis.xadd(STREAM, {"n": str(i)})
    await redis.xreadgroup(GROUP, "w", {STREAM: ">"}, count=50, noack=True)
    await redis.xgroup_createconsumer(STREAM, "audit", "a")
    watches = BacklogWatches()
    own, both, every = await asyncio.gather(
        poll(watches, redis, 10, max_seconds=0.2, groups=[GROUP]),
        poll(watches, redis, 10, max_seconds=0.2, groups=[GROUP, "audit"]),
        poll(watches, redis, 10, max_seconds=0.2),
    )
    assert (own.reached, own.reading.backlog, [g.name for g in own.reading.groups]) == (True, 0, [GROUP])
    assert (both.reached, both.reading.backlog, both.reading.limiting_group) == (False, 50, "audit")
    assert (every.reached, every.reading.backlog, every.reading.limiting_group) == (False, 50, "audit")
    assert own.polls == 1 and both.polls >= 2 and watches.readings == own.polls + both.polls + every.polls
