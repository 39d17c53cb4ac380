"""Drain polls that share their backlog readings: one reading per stream for every replay of a process.

A replay that waits for the consumers to drain (the adaptive policy's short waits), or a short
while for a rate cap's bucket, polls the backlog until it falls to its low watermark. A worker
runs many replays of one stream: polling each on its own would cost Redis one reading per replay
per poll interval, so the cost of a replayed task would grow with the number of replays
(docs/pacing.md, "Many replays on one worker").
Here every poll of one measurement (stream, groups, threshold, missing-group policy, byte budget)
waits on one ``_Watch``: a task that takes one reading (``backlog.measure_backlog``) as often as
its most impatient waiter asks, and hands it to every waiter.

The waiters also take turns. A reading at or below several waiters' low watermarks wakes them
first come, first served, only while the headroom it shows is not yet promised to the ones woken
before (each waiter says how much it means to publish, ``take``); the others wait for the next
reading, which sees what the woken ones published. So the replays of a worker do not all wake at
once to race for one headroom, most of them to find none.

A waiter whose poll reaches its bound ends, unless it may queue (``queue_seconds``, with a ``wake``)
and other waiters share its watch, or others are queued already (then at its first reading): its
poll returns ``queued`` and the waiter stays in line, costing its replay nothing, until its turn
comes (``wake`` is called: the worker signals the replay's workflow) or ``queue_seconds`` pass. A
queued waiter woken keeps its ``take`` promised until its replay's next call reaches this process
(``BacklogWatches.called``) or ``PROMISE_SECONDS`` pass, since its replay publishes a signal's
round trip later than a poll's. A replay's check, publish or release leaves its place in line
(its wait ended another way).

A line that ends with waiters in it gives each its turn at once: a reading's fault, a watch that stops,
and ``BacklogWatches.close`` (the worker stops) wake every queued waiter, whose replay then goes on at
its next turn (which measures afresh) instead of sleeping out its queue time. A wake refused for good
(``TurnsRefused``: the worker may not signal) ends queueing on that worker: polls end at their bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from xmc_resumption.redisclient.backlog import DEFAULT_BYTE_BUDGET, measure_backlog, validate_threshold
from xmc_resumption.redisclient.connection import RedisClient
from xmc_resumption.redisclient.readings import BacklogReading, DrainWait, MissingGroupPolicy

MAX_POLL_SECONDS = 60.0
"""The longest bounded poll ``BacklogWatches.wait_for_drain`` takes (seconds): a poll runs inside one activity."""

MAX_QUEUE_SECONDS = 86_400.0
"""The longest a waiter stays queued after its poll (seconds): the workflow's longest wait."""

PROMISE_SECONDS = 0.5
"""How long a queued waiter woken keeps its ``take`` promised, at most (seconds): about a signal's round trip and a
turn, under load. Its replay's calls may run on another worker, whose watch cannot end the promise sooner."""

CLOSE_SECONDS = 5.0
"""How long ``BacklogWatches.close`` waits for the turns it gives to be delivered, at most (seconds)."""

logger = logging.getLogger(__name__)


class TurnsRefused(Exception):
    """A ``wake`` that can never succeed on this worker: the worker may not give turns (it lacks the permission)."""


@dataclass(frozen=True)
class _Measurement:
    """What one reading measures; polls of the same measurement share their readings."""

    client: int
    stream: str
    group: str
    groups: tuple[str, ...] | None
    threshold: int
    missing_group: MissingGroupPolicy
    max_bytes: int


@dataclass
class _Waiter:
    """One poll waiting on a watch (times on the monotonic clock, seconds)."""

    low_watermark: int
    take: int | None
    started: float
    min_until: float
    max_until: float
    poll_seconds: float
    done: asyncio.Future[DrainWait]
    key: str = ""
    """The replay (workflow and run ID): its next call ends a promise of its turn (``BacklogWatches.called``)."""
    queue_seconds: float = 0.0
    wake: Callable[[], Awaitable[None]] | None = None
    queued: bool = False
    polls: int = 0
    largest_drop: int = 0
    previous: BacklogReading | None = None
    last_at: float = 0.0

    def see(self, reading: BacklogReading, at: float) -> bool:
        """Take one reading at ``at``; True when it is at or below the low watermark, with headroom."""
        self.polls += 1
        if self.previous is not None and not reading.capped:  # a capped reading is only a lower bound
            self.largest_drop = max(self.largest_drop, self.previous.backlog - reading.backlog)
        self.previous, self.last_at = reading, at
        return reading.headroom > 0 and reading.backlog <= self.low_watermark

    def may_queue(self) -> bool:
        """Whether this waiter may stay in line past its poll: not queued yet, with a wake, a queue time, a take."""
        return not self.queued and self.wake is not None and self.queue_seconds > 0 and self.take is not None

    def due(self) -> float:
        """When this waiter wants its next reading: a poll interval after its last, or its next bound if sooner."""
        reached = (
            self.previous is not None and self.previous.headroom > 0 and (self.previous.backlog <= self.low_watermark)
        )
        until = self.min_until if reached and self.last_at < self.min_until else self.max_until
        return min(self.last_at + self.poll_seconds, until)

    def finish(self, reading: BacklogReading, reached: bool, at: float, *, queued: bool = False) -> None:
        if not self.done.done():
            self.done.set_result(
                DrainWait(
                    reading=reading,
                    reached=reached,
                    seconds=at - self.started,
                    polls=self.polls,
                    largest_drop=self.largest_drop,
                    queued=queued,
                )
            )


@dataclass
class _Watch:
    """The readings of one measurement, handed to its waiters by one task while any wait."""

    measurement: _Measurement
    client: RedisClient
    watches: BacklogWatches
    waiters: list[_Waiter] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    promises: dict[str, tuple[int, float]] = field(default_factory=dict)
    """Turns given to queued waiters: their replay's key -> (take, until when, monotonic seconds)."""

    async def read(self) -> BacklogReading:
        m = self.measurement
        return await measure_backlog(
            self.client, m.stream, m.group, m.threshold, m.missing_group, m.max_bytes, m.groups, records=True
        )

    async def run(self) -> None:
        """Read and hand out readings until no waiter is left; a fault ends the line with it (``end``)."""
        while self.waiters:
            self.arrived.clear()
            try:
                self.watches.readings += 1
                reading = await self.read()
            except Exception as err:  # every waiting poll fails with it (the activity retries)
                self.end(err)
                return
            now = time.monotonic()
            self.hand_out(reading, now)
            if not self.waiters:
                return
            pause = min(w.due() for w in self.waiters) - time.monotonic()
            if pause > 0:
                # a new waiter wants its first reading at once
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.arrived.wait(), timeout=pause)

    def hand_out(self, reading: BacklogReading, at: float) -> None:
        """Give ``reading`` (taken at ``at``) to every waiter, ending the polls it ends.

        A waiter ends at its bound, or once the reading reaches its low watermark past its least
        time, first come first served, while the reading's headroom is not yet promised to the
        waiters that ended before it at their watermark, nor to queued ones woken lately (``take``
        each: their replays publish next). A waiter without a ``take`` (None) takes no turn: it
        ends at its watermark whatever the others do, as a poll of its own would. A waiter that may
        queue does so at its bound if it shares the watch, or at once if others are queued (the module docstring).
        """
        self.promises = {k: p for k, p in self.promises.items() if p[1] > at}
        promised = sum(take for take, _ in self.promises.values())
        queued = sum(w.queued for w in self.waiters)
        kept: list[_Waiter] = []
        for waiter in self.waiters:
            if waiter.done.done() and not waiter.queued:  # cancelled
                continue
            reached = waiter.see(reading, at)
            turn = waiter.take is None or promised < reading.headroom
            bound = at >= waiter.max_until
            if reached and at >= waiter.min_until and turn:
                if waiter.take is not None:
                    promised += waiter.take  # its replay publishes next
                if waiter.queued:
                    queued -= 1
                    self.promises[waiter.key] = (waiter.take or 0, at + PROMISE_SECONDS)
                    self._wake(waiter)
                else:
                    waiter.finish(reading, reached, at)
            elif self.watches.queueing and waiter.may_queue() and (queued > 0 or (bound and len(self.waiters) > 1)):
                queued += 1
                waiter.queued, waiter.max_until = True, at + waiter.queue_seconds
                waiter.finish(reading, reached, at, queued=True)
                kept.append(waiter)
            elif bound:
                if waiter.queued:
                    queued -= 1  # its poll has ended already: it leaves the line
                elif reached and waiter.take is not None:
                    promised += waiter.take  # its replay publishes next
                waiter.finish(reading, reached, at)
            else:
                kept.append(waiter)
        self.waiters[:] = kept

    def give_turns(self) -> None:
        """Give every queued waiter its turn now: they leave the line."""
        queued = [w for w in self.waiters if w.queued]
        self.waiters[:] = [w for w in self.waiters if not w.queued]
        for waiter in queued:
            self._wake(waiter)

    def end(self, err: BaseException) -> None:
        """End the line: every queued waiter has its turn at once, every waiting poll fails with ``err``."""
        self.give_turns()
        for waiter in self.waiters:
            if not waiter.done.done():
                waiter.done.set_exception(err)
        self.waiters.clear()

    def _wake(self, waiter: _Waiter) -> None:
        """Call a queued ``waiter``'s ``wake`` in a task of its own; a failure is logged (its run's timer ends it)."""
        wake = waiter.wake
        assert wake is not None, "only a waiter with a wake queues"

        async def run() -> None:
            try:
                await wake()
            except TurnsRefused as err:
                self.promises.pop(waiter.key, None)
                self.watches.refused(err)
            except Exception as err:  # the replay ended, or its workflow is unreachable: its own timer ends the wait
                self.promises.pop(waiter.key, None)
                logger.warning("a queued replay's turn could not be given: %s", err, extra={"replay": waiter.key})

        task = asyncio.create_task(run())
        self.watches.wakes.add(task)
        task.add_done_callback(self.watches.wakes.discard)


class BacklogWatches:
    """Every drain poll of one worker (its activities hold one), sharing readings per measurement."""

    def __init__(self) -> None:
        self._watches: dict[_Measurement, _Watch] = {}
        self.readings = 0
        """Backlog readings taken so far, by every watch."""
        self.queueing = True
        """Whether polls may queue past their bound: False once closed, or once a turn was refused."""
        self.refusal: TurnsRefused | None = None
        """The first turn refused for good, if any."""
        self.refusals = 0
        """Turns refused for good so far."""
        self.wakes: set[asyncio.Task[None]] = set()
        """The turns being given now (a task each)."""

    def refused(self, err: TurnsRefused) -> None:
        """A turn was refused for good (``err``): no poll queues any more, the line is left; logged once."""
        self.refusals += 1
        if self.refusal is None:
            self.refusal = err
            logger.error("queued replays cannot be given their turn; polls no longer queue on this worker: %s", err)
            self.queueing = False
            for watch in self._watches.values():  # none of them can be woken: their runs' timers end their waits
                watch.waiters[:] = [w for w in watch.waiters if not w.queued]

    async def close(self, seconds: float = CLOSE_SECONDS) -> None:
        """Stop queueing and give every queued waiter its turn now; wait up to ``seconds`` for the turns to be given.

        The worker stops taking turns (it stops): polls still running end at their bound. A turn not delivered by
        then is given up (its run's durable wait ends it). ``reopen`` lets the next worker on these watches queue.
        """
        self.queueing = False
        for watch in self._watches.values():
            watch.give_turns()
        if self.wakes:
            _, late = await asyncio.wait(set(self.wakes), timeout=seconds)
            for task in late:
                task.cancel()

    def reopen(self) -> None:
        """A new worker polls after ``close``: polls may queue again (unless a turn was refused for good)."""
        self.queueing = self.refusal is None

    def polling(self) -> int:
        """How many polls are waiting now (queued waiters not counted)."""
        return sum(not x.queued for w in self._watches.values() for x in w.waiters)

    def queued(self) -> int:
        """How many waiters are queued now, their polls ended (the module docstring)."""
        return sum(x.queued for w in self._watches.values() for x in w.waiters)

    def called(self, key: str) -> None:
        """Replay ``key`` called again (a publish, a release, a new poll): it leaves the line, and its turn is taken."""
        for watch in self._watches.values():
            watch.promises.pop(key, None)
        self.left(key)

    def left(self, key: str) -> None:
        """Replay ``key`` turns (its check): it leaves the line; a turn promised to it stays until its publish."""
        for watch in self._watches.values():
            if any(w.queued and w.key == key for w in watch.waiters):  # on every check and publish: rebuild rarely
                watch.waiters[:] = [w for w in watch.waiters if not (w.queued and w.key == key)]

    async def wait_for_drain(
        self,
        client: RedisClient,
        stream: str,
        group: str,
        threshold: int,
        low_watermark: int,
        *,
        min_seconds: float,
        max_seconds: float,
        poll_seconds: float,
        missing_group: MissingGroupPolicy = MissingGroupPolicy.WAIT,
        max_bytes: int = DEFAULT_BYTE_BUDGET,
        groups: Sequence[str] | None = None,
        take: int | None = None,
        replay: str = "",
        queue_seconds: float = 0.0,
        wake: Callable[[], Awaitable[None]] | None = None,
    ) -> DrainWait:
        """Poll the backlog until it is at or below ``low_watermark``, sharing the readings.

        The first reading is taken at once; then one at least every ``poll_seconds`` (more often
        when another poll of the same measurement asks). Returns once a reading is at or below
        ``low_watermark`` with headroom, ``min_seconds`` have passed and
        this poll's turn has come (see the module docstring), or once ``max_seconds`` have passed.

        Args:
            client: an asyncio Redis client; stream, group, groups, missing_group, max_bytes: as
                ``backlog.measure_backlog``.
            threshold: the throttle threshold (entries, >= 1): the cap of every reading.
            low_watermark: the backlog to wait for (entries, 0 <= low_watermark < threshold).
            min_seconds, max_seconds: bounds of the poll (seconds, 0 <= min <= max <= 60).
            poll_seconds: the longest interval between two readings (seconds, 0 < poll_seconds <= 1).
            take: how many entries the caller means to publish once woken (>= 0), so that one
                reading wakes no more waiters than its headroom feeds; None: no turn (woken at the
                watermark whatever the others do).
            replay: who polls (its workflow and run ID; "" none): a queued waiter of it leaves the line.
            queue_seconds: how long to stay queued once the poll reaches its bound (seconds, 0 <= q <=
                ``MAX_QUEUE_SECONDS``; 0: never), if ``wake`` is given, other waiters share the watch and
                ``queueing`` holds.
            wake: what gives a queued waiter its turn (the worker signals the replay's workflow); it raises
                ``TurnsRefused`` when no turn can ever be given.

        Raises:
            ValueError: an argument out of its bounds (or not finite).
            MissingConsumerGroupError, redis.exceptions.RedisError: as ``measure_backlog`` (a
                reading's fault fails every poll waiting for it).
        """
        validate_threshold(threshold)
        if not 0 <= low_watermark < threshold:
            raise ValueError(f"low_watermark must be in [0, threshold), got {low_watermark} for threshold {threshold}")
        if not all(math.isfinite(x) for x in (min_seconds, max_seconds, poll_seconds)):
            raise ValueError("min_seconds, max_seconds and poll_seconds must be finite")
        if not 0 <= min_seconds <= max_seconds <= MAX_POLL_SECONDS:
            raise ValueError(
                f"need 0 <= min_seconds <= max_seconds <= {MAX_POLL_SECONDS:g}, got {min_seconds} and {max_seconds}"
            )
        if not 0 < poll_seconds <= 1:
            raise ValueError(f"poll_seconds must be in (0, 1], got {poll_seconds}")
        if take is not None and take < 0:
            raise ValueError(f"take must be >= 0 entries or None, got {take}")
        if not (math.isfinite(queue_seconds) and 0 <= queue_seconds <= MAX_QUEUE_SECONDS):
            raise ValueError(f"queue_seconds must be in [0, {MAX_QUEUE_SECONDS:g}], got {queue_seconds}")
        key = _Measurement(
            id(client), stream, group, None if groups is None else tuple(groups), threshold, missing_group, max_bytes
        )
        watch = self._watches.get(key)
        if watch is None:
            watch = self._watches[key] = _Watch(key, client, self)
        now = time.monotonic()
        waiter = _Waiter(
            low_watermark=low_watermark,
            take=take,
            started=now,
            min_until=now + min_seconds,
            max_until=now + max_seconds,
            poll_seconds=poll_seconds,
            done=asyncio.get_running_loop().create_future(),
            key=replay,
            queue_seconds=queue_seconds if self.queueing else 0.0,
            wake=wake,
        )
        if replay:
            self.called(replay)  # in line anew
        watch.waiters.append(waiter)
        watch.arrived.set()
        if watch.task is None or watch.task.done():
            watch.task = asyncio.create_task(self._run(watch))
        try:
            return await waiter.done
        finally:
            if not waiter.queued:
                with contextlib.suppress(ValueError):  # cancelled: leave the watch (an ended poll has left it)
                    watch.waiters.remove(waiter)

    async def _run(self, watch: _Watch) -> None:
        try:
            await watch.run()
        finally:
            # ended by something other than a reading's fault (cancelled, or a fault of its own): no poll waits for
            # a reading that will not come, no queued waiter for a turn
            watch.end(RuntimeError("the backlog watch stopped; poll again"))
            if self._watches.get(watch.measurement) is watch:
                del self._watches[watch.measurement]
