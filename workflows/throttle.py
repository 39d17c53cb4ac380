"""The throttle policy: when the replay waits, how long, and how (pure code, no I/O; docs/pacing.md).

When to wait is one rule, computed inside Redis by ``redisclient/lua/backlog.lua``: the replay waits when the
reading's ``headroom`` (``threshold - backlog``) is 0. This module decides how long and how, from the input's settings
(``Pacing``) and what was measured (``Pacer``): ``fixed``, a durable timer of ``throttle_seconds``; ``adaptive``,
about ``(backlog - L) / R`` for the consumers' drain rate R and a low watermark L
(docs/pacing.md, "The two policies"), as a bounded poll or a durable timer
(docs/pacing.md, "How a wait is done"). Either way the turn after a wait starts again at the pause and fencing check.
Deterministic: its inputs are activity results and ``workflow.now()`` readings the workflow passes in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING

from xmc_resumption.redisclient.text import show_name

if TYPE_CHECKING:
    from xmc_resumption.redisclient.readings import BacklogReading

POLL_LIMIT_SECONDS = 2.0
"""The longest wait done as a poll inside one local activity (seconds). Longer waits are durable
timers: a poll holds a workflow task open, and a worker lost mid-poll costs a workflow-task timeout."""

TIMER_GRANULARITY_SECONDS = 1.0
"""How late a durable timer may fire (seconds; measured on the dev server: docs/pacing.md, "How a wait is done").

A long adaptive wait sleeps this much less than estimated and polls the rest.
"""

POLL_INTERVAL_BOUNDS = (0.002, 0.05)
"""Seconds between two readings of a poll: about a tenth of the expected wait, within these bounds."""

WAIT_FLOOR_SECONDS = 0.5
"""The least any throttle wait is bounded by (seconds), whatever ``throttle_seconds`` or ``max_wait_seconds`` say.

A durable timer lasts at least this long, and so does a poll whose backlog does not fall to its low watermark (a
draining backlog ends it at once). With stopped consumers a turn (check, publish, wait) then lasts at least this
long; docs/contract.md, "Faults", has why."""

POLL_READINGS = 11
"""The most backlog readings one poll takes when its backlog does not drain: its bound over its
interval (a tenth of the expected wait, which is the bound when nothing drains), plus the first."""

DEFAULT_REACTION_SECONDS = 0.02
"""Assumed time from the end of a wait to the next publish landing, before one was measured (seconds:
about three local-activity round trips here)."""

WATERMARK_SAFETY = 2.0
"""The low watermark covers this many times what consumers drain while the replay reacts."""

RATE_TIME_CONSTANT_SECONDS = 1.0
"""Time constant of the drain-rate average (seconds): samples older than a few of these fade out."""

FIRST_ESTIMATE_SECONDS = 0.05
"""How much measured time the first drain-rate estimate needs (seconds)."""

MAX_RATE = 10_000_000.0
"""The highest drain rate believed (entries per second); also the bound of the carried estimate."""

PROBE_GAIN = 2.0
"""How much a wait that ended with the stream empty raises the drain-rate estimate (a factor, like
a congestion window's slow start): the drain seen then is only a lower bound of the rate."""

WAIT_SAMPLE_WEIGHT = 0.5
"""The least weight of a drain sample that spans a whole wait, so the estimate follows a change of
the consumers within a few waits (an error halves with each)."""

BURST_DECAY = 0.5
"""A smaller burst than the one learned moves the learned one this fraction of the way down; a
larger one replaces it at once."""

STOPPED_POLL_SECONDS = 60.0
"""While the consumers have taken nothing for less than this (seconds), the replay waits in polls
(it notices their restart within a poll interval); after it, in durable timers of the longest wait."""


class WaitKind(StrEnum):
    """How a wait is done: a durable timer, or a bounded poll inside one local activity."""

    TIMER = "timer"
    POLL = "poll"


@dataclass(frozen=True)
class WaitPlan:
    """One throttle wait.

    Attributes:
        kind: timer or poll.
        seconds: the timer's duration, or the poll's upper bound (seconds).
        min_seconds: a poll lasts at least this long (seconds; 0 for a timer).
        low_watermark: the backlog a poll waits for (entries; 0 for a timer).
        poll_seconds: the interval between a poll's readings (seconds).
    """

    kind: WaitKind
    seconds: float
    min_seconds: float = 0.0
    low_watermark: int = 0
    poll_seconds: float = POLL_INTERVAL_BOUNDS[1]

    @classmethod
    def timer(cls, seconds: float) -> WaitPlan:
        """A durable timer of ``seconds``, at least ``WAIT_FLOOR_SECONDS``."""
        return cls(WaitKind.TIMER, max(seconds, WAIT_FLOOR_SECONDS))


def wait_reason(reading: BacklogReading, threshold: int, moved: int = 0) -> str:
    """A one-line reason for the UI why the replay waits.

    For example ``backlog 501+ >= 500 (pending 120 + lag 381+) in group audit`` (the group that holds the replay back,
    when the reading names one), for ``reading`` taken before a move of ``moved`` entries (which add to the lag) and
    ``threshold`` (entries).

    A ``+`` marks a count that stopped at the cap: the true value may be larger. A count stopped
    by the byte budget says so: the undelivered tasks are too large to count in one script.
    """
    pending, lag, capped = reading.pending, reading.lag + moved, reading.capped
    plus = "+" if capped else ""
    if reading.bytes_capped:
        return f"undelivered entries pass the byte budget (pending {pending} + lag {lag}+ counted)"
    lag_text = "not counted" if capped and lag == 0 else f"{lag}{plus}"
    group = f" in group {show_name(reading.limiting_group)}" if reading.limiting_group else ""
    return f"backlog {pending + lag}{plus} >= {threshold} (pending {pending} + lag {lag_text}){group}"


def _clamp(value: float, low: float, high: float) -> float:
    return min(high, max(low, value))


@dataclass(frozen=True)
class Pacing:
    """The throttle policy's settings, read from the input in force (``ResumptionInput.pacing``), never kept.

    Attributes:
        adaptive: the ``adaptive`` policy (else ``fixed``).
        threshold: the backlog bound (entries, >= 1).
        throttle_seconds: the fixed policy's wait (seconds).
        min_wait, max_wait: bounds of one adaptive wait (seconds, 0 <= min_wait <= max_wait).
    """

    adaptive: bool
    threshold: int
    throttle_seconds: float
    min_wait: float
    max_wait: float


@dataclass
class Pacer:
    """Decides how long the replay waits, and estimates the consumers' drain rate.

    The settings come with each call (``Pacing``); what is kept is what was measured.

    Args:
        rate: the drain-rate estimate carried from an earlier run (entries/s), or None.
        reaction: the measured reaction time carried from an earlier run (seconds), or None.
        burst: the consumers' learned burst carried from an earlier run (entries, 0: none yet).
    """

    rate: float | None = None
    reaction: float | None = None
    burst: int = 0
    _last: tuple[int, datetime] | None = field(default=None, init=False, repr=False)
    _in_wait: bool = field(default=False, init=False, repr=False)
    _stopped_since: datetime | None = field(default=None, init=False, repr=False)
    _first: tuple[int, float] = field(default=(0, 0.0), init=False, repr=False)
    _woke_at: datetime | None = field(default=None, init=False, repr=False)

    def observe(self, before: int, after: int, capped: bool, at: datetime) -> None:
        """Fold in a backlog reading taken at workflow time ``at``.

        ``before`` entries as measured, ``after`` once the replay's own move in the same step was added (``before`` for
        a plain measurement). The drain-rate sample is ``(last after - before) / elapsed``. A capped reading is only a
        lower bound of the backlog and gives no sample; nor does an interval that started with an empty stream (nothing
        to drain).
        """
        last, waited = self._last, self._in_wait
        self._last, self._in_wait = None if capped else (after, at), False
        if last is None or capped or last[0] == 0:
            return
        self._fold(max(0, last[0] - before), (at - last[1]).total_seconds(), before == 0, waited, at)

    def _fold(self, drained: int, seconds: float, empty: bool, waited: bool, at: datetime) -> None:
        """Fold ``drained`` entries over ``seconds`` ending at workflow time ``at`` into the drain-rate estimate.

        ``empty``: the stream was empty at the end (the drain is then a lower bound of the rate); ``waited``: the
        interval spans a throttle wait. The rules (a stop keeps the estimate, an empty end probes upwards by
        ``PROBE_GAIN``, anything else is a moving average): docs/pacing.md, "Why adaptive is the default".
        """
        if seconds <= 0:
            return
        if waited and drained == 0:
            if not self.rate:  # nobody has drained yet: the rate is 0 until someone does
                self.rate = 0.0
            elif self._stopped_since is None:
                self._stopped_since = at - timedelta(seconds=seconds)
            return
        if drained == 0 and self._stopped_since is not None:
            return  # between two publishes of a stop: still stopped
        stopped, self._stopped_since = self._stopped_since is not None or self.rate == 0, None
        sample = drained / seconds
        if self.rate is None:
            self._first = (self._first[0] + drained, self._first[1] + seconds)
            if not (waited or self._first[1] >= FIRST_ESTIMATE_SECONDS):
                return
            sample, self.rate = self._first[0] / self._first[1], 0.0
        if empty or stopped:
            grown = max(self.rate, sample)
            self.rate = min(MAX_RATE, grown * PROBE_GAIN if empty and waited else grown)
            return
        weight = 1 - math.exp(-seconds / RATE_TIME_CONSTANT_SECONDS)
        if waited:
            weight = max(weight, WAIT_SAMPLE_WEIGHT)
        self.rate = min(MAX_RATE, self.rate + weight * (sample - self.rate))

    def burst_seen(self, drop: int, threshold: int) -> None:
        """Fold in the largest fall of the backlog between two readings of a poll (entries; 0: the poll saw none).

        What the consumers take at once, or in one poll interval, at most ``threshold``. A larger one is learned at
        once, a smaller one ``BURST_DECAY`` of the way (a stop teaches nothing).
        """
        if drop <= 0:
            return
        drop = min(drop, threshold)
        self.burst = drop if drop > self.burst else round(self.burst + BURST_DECAY * (drop - self.burst))

    def woke(self, at: datetime) -> None:
        """A wait ended at workflow time ``at``; the next ``published`` measures the reaction."""
        self._woke_at = at

    def published(self, at: datetime) -> None:
        """A publish landed at workflow time ``at``: fold in the reaction time since the last wake."""
        if self._woke_at is not None:
            sample = _clamp((at - self._woke_at).total_seconds(), 0.001, 60.0)
            self.reaction = sample if self.reaction is None else (self.reaction + sample) / 2
            self._woke_at = None

    def low_watermark(self, pacing: Pacing) -> int | None:
        """The backlog an adaptive wait waits for (entries), or None under ``fixed``.

        What the consumers drain while the replay reacts, twice over, plus one learned burst, within ``[0, 3/4 of the
        threshold]`` (or up to one burst, below the threshold); half the threshold before a rate is known.
        """
        if not pacing.adaptive:
            return None
        threshold = pacing.threshold
        ceiling = max(threshold * 3 // 4, min(self.burst, threshold - 1))  # at least one burst
        if self.rate is None:
            return max(threshold // 2, min(self.burst, ceiling))
        react = (self.reaction or DEFAULT_REACTION_SECONDS) + POLL_INTERVAL_BOUNDS[0]
        return int(_clamp(self.burst + math.ceil(WATERMARK_SAFETY * self.rate * react), 0, ceiling))

    def plan(self, pacing: Pacing, backlog: int, at: datetime) -> WaitPlan:
        """The wait to take at ``backlog`` entries (at or over the threshold) at workflow time ``at``.

        Bounded by at least ``WAIT_FLOOR_SECONDS`` (a shorter ``max_wait_seconds`` or ``throttle_seconds`` counts as
        it). The next reading is taken as the end of this wait (``observe``).
        """
        if not pacing.adaptive:
            return WaitPlan.timer(pacing.throttle_seconds)
        self._in_wait = True
        min_wait, longest = pacing.min_wait, max(pacing.max_wait, WAIT_FLOOR_SECONDS)
        low = self.low_watermark(pacing) or 0
        since = self._stopped_since
        draining = False
        if since is not None and (at - since).total_seconds() >= STOPPED_POLL_SECONDS:
            expected = longest
        elif self.rate is None or since is not None:
            # nothing measured yet, or the consumers stopped: a poll measures (unless min_wait is longer)
            expected = min(longest, max(min_wait, POLL_LIMIT_SECONDS))
        elif self.rate <= 0:
            expected = longest
        else:
            expected = _clamp((backlog - low) / self.rate, min_wait, longest)
            # while the consumers drain, a long wait is polled in slices: a change of theirs shows within a poll
            draining = min_wait <= POLL_LIMIT_SECONDS
        if expected <= POLL_LIMIT_SECONDS or draining:
            bound = min(longest, POLL_LIMIT_SECONDS)
            poll = _clamp(min(expected, bound) / 10, *POLL_INTERVAL_BOUNDS)
            return WaitPlan(WaitKind.POLL, bound, min(min_wait, bound), low, poll)
        timer = max(min_wait, expected - TIMER_GRANULARITY_SECONDS) if expected < longest else expected
        return WaitPlan.timer(timer)

    def describe(self, pacing: Pacing, plan: WaitPlan) -> str:
        """How the wait of ``plan`` was chosen, for the UI.

        For example ``drain ~2,000/s: poll up to 2s for the backlog to fall to 40``.
        """
        if not pacing.adaptive:
            return f"fixed {plan.seconds:g}s wait"
        rate = "drain rate not measured yet" if self.rate is None else f"drain ~{self.rate:,.0f}/s"
        if self.burst:
            rate += f", bursts ~{self.burst:,}"
        if self._stopped_since is not None:
            rate += ", consumers stopped"
        if plan.kind is WaitKind.POLL:
            return f"{rate}: poll up to {plan.seconds:g}s for the backlog to fall to {plan.low_watermark}"
        return f"{rate}: sleep {plan.seconds:.3g}s"


@dataclass
class StallWatch:
    """Tells how long the backlog has not gone down, and no task moved (the stall window's clock).

    Whether that is a stall, and when it ends the run, is the input's to say (``stall_window_seconds``,
    ``max_stall_seconds``: ``RunState.observe``, ``RunState.stall_over_limit``).

    Args:
        progress_at: when progress was last seen (workflow time), carried across continue-as-new.
        last: the last reading (backlog, pending, last-delivered-id), carried across continue-as-new.
    """

    progress_at: datetime | None = None
    last: tuple[int, int, str] | None = None

    def observe(self, at: datetime, backlog: int, pending: int, last_delivered_id: str, moved: int = 0) -> float:
        """Fold in a reading at workflow time ``at``; returns the seconds since progress was last seen.

        Progress is a task moved, or the backlog or the PEL going down, or the group's last-delivered-id moving on
        (consumers reading, even when a capped count hides the drop).
        """
        now = (backlog, pending, last_delivered_id)
        last, self.last = self.last, now
        went_down = last is not None and (backlog < last[0] or pending < last[1] or last_delivered_id != last[2])
        if self.progress_at is None or moved > 0 or went_down:
            self.progress_at = at
        return (at - self.progress_at).total_seconds()

    def restart(self, at: datetime) -> None:
        """Start the window again at ``at`` (a wait the consumers are not to blame for: Redis away, a rate cap)."""
        self.progress_at = at
