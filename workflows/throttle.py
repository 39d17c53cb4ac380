"""The throttle policy: how long the replay waits, and how (pure code, no I/O): docs/pacing.md, "The two policies"."""

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
"""The longest wait done as a poll (seconds); longer ones are durable timers: docs/pacing.md, "How a wait is done"."""

TIMER_GRANULARITY_SECONDS = 1.0
"""How late a durable timer may fire (seconds): docs/pacing.md, "How a wait is done"."""

POLL_INTERVAL_BOUNDS = (0.002, 0.05)
"""Seconds between two readings of a poll: about a tenth of the expected wait, within these bounds."""

WAIT_FLOOR_SECONDS = 0.5
"""The least any throttle wait is bounded by (seconds): docs/contract.md, "Faults" ("No spin")."""

POLL_READINGS = 11
"""The most backlog readings one poll takes when its backlog does not drain (its bound over its interval, plus one)."""

DEFAULT_REACTION_SECONDS = 0.02
"""Assumed time from the end of a wait to the next publish landing, before one was measured (seconds)."""

WATERMARK_SAFETY = 2.0
"""The low watermark covers this many times what consumers drain while the replay reacts."""

RATE_TIME_CONSTANT_SECONDS = 1.0
"""Time constant of the drain-rate average (seconds): samples older than a few of these fade out."""

FIRST_ESTIMATE_SECONDS = 0.05
"""How much measured time the first drain-rate estimate needs (seconds)."""

MAX_RATE = 10_000_000.0
"""The highest drain rate believed (entries per second); also the bound of the carried estimate."""

PROBE_GAIN = 2.0
"""The factor a wait that ends with the stream empty raises the drain-rate estimate by (docs/pacing.md)."""

WAIT_SAMPLE_WEIGHT = 0.5
"""The least weight of a drain sample that spans a whole wait (docs/pacing.md, "Why adaptive is the default")."""

BURST_DECAY = 0.5
"""The fraction of the way a smaller burst moves the learned one down (a larger one replaces it)."""

STOPPED_POLL_SECONDS = 60.0
"""How long a stop of the consumers is waited out in polls (seconds); after it, in durable timers (docs/pacing.md)."""


class WaitKind(StrEnum):
    """How a wait is done: a durable timer, or a bounded poll inside one local activity."""

    TIMER = "timer"
    POLL = "poll"


@dataclass(frozen=True)
class WaitPlan:
    """One throttle wait.

    Attributes:
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
    """Why the replay waits, one line for the UI: ``backlog 501+ >= 500 (pending 120 + lag 381+) in group audit``.

    ``reading`` was taken before a move of ``moved`` entries (they add to the lag); ``+``: a count stopped at the cap.
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
    """The throttle policy's settings, read from the input in force (``ResumptionInput.pacing``), never kept."""

    adaptive: bool
    threshold: int
    throttle_seconds: float
    min_wait: float
    max_wait: float


@dataclass
class Pacer:
    """Decides how long the replay waits, and estimates the consumers' drain rate; the settings come with each call.

    Carried from an earlier run: ``rate`` (entries/s), ``reaction`` (seconds), ``burst`` (entries, 0: none yet).
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
        """Fold in a reading taken at workflow time ``at``: ``before`` entries, ``after`` with the step's own move."""
        last, waited = self._last, self._in_wait
        self._last, self._in_wait = None if capped else (after, at), False
        if last is None or capped or last[0] == 0:
            return
        self._fold(max(0, last[0] - before), (at - last[1]).total_seconds(), before == 0, waited, at)

    def _fold(self, drained: int, seconds: float, empty: bool, waited: bool, at: datetime) -> None:
        """Fold ``drained`` entries over ``seconds`` into the estimate: docs/pacing.md, "Why adaptive is the default".

        ``empty``: the stream was empty at workflow time ``at``; ``waited``: the interval spans a throttle wait.
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
        """Fold in the largest fall of the backlog between two readings of a poll (entries, at most ``threshold``)."""
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
        """The backlog an adaptive wait waits for (entries; docs/pacing.md), or None under ``fixed``."""
        if not pacing.adaptive:
            return None
        threshold = pacing.threshold
        ceiling = max(threshold * 3 // 4, min(self.burst, threshold - 1))  # at least one burst
        if self.rate is None:
            return max(threshold // 2, min(self.burst, ceiling))
        react = (self.reaction or DEFAULT_REACTION_SECONDS) + POLL_INTERVAL_BOUNDS[0]
        return int(_clamp(self.burst + math.ceil(WATERMARK_SAFETY * self.rate * react), 0, ceiling))

    def plan(self, pacing: Pacing, backlog: int, at: datetime) -> WaitPlan:
        """The wait to take at ``backlog`` entries (at or over the threshold) at workflow time ``at``."""
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
        """How the wait of ``plan`` was chosen, for the UI: ``drain ~2,000/s: poll up to 2s for the backlog to ...``."""
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
    """How long the backlog has not gone down and no task moved: the stall window's clock (docs/contract.md, "Faults").

    Carried across continue-as-new: ``progress_at`` (workflow time), ``last`` (backlog, pending, last-delivered-id).
    """

    progress_at: datetime | None = None
    last: tuple[int, int, str] | None = None

    def observe(self, at: datetime, backlog: int, pending: int, last_delivered_id: str, moved: int = 0) -> float:
        """Fold in a reading at workflow time ``at``; returns the seconds since progress was last seen."""
        now = (backlog, pending, last_delivered_id)
        last, self.last = self.last, now
        went_down = last is not None and (backlog < last[0] or pending < last[1] or last_delivered_id != last[2])
        if self.progress_at is None or moved > 0 or went_down:
            self.progress_at = at
        return (at - self.progress_at).total_seconds()

    def restart(self, at: datetime) -> None:
        """Start the window again at ``at`` (a wait the consumers are not to blame for: Redis away, a rate cap)."""
        self.progress_at = at
