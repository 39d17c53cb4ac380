"""The throttle policy: when the replay waits, how long, and how (pure code, no I/O).

When to wait is one rule, computed inside Redis by ``redisclient/lua/backlog.lua``: the replay
waits when the reading's ``headroom`` (``threshold - backlog``) is 0. This module decides how long
and how, from the workflow input and what was measured:

- ``fixed`` (the seed's rule): a durable timer of ``throttle_seconds``.
- ``adaptive``: estimate the consumers' drain rate R from successive backlog readings and wait
  about ``(backlog - L) / R``, clamped to ``[min_wait_seconds, max_wait_seconds]``, where the low
  watermark L is the backlog the consumers still have in hand while the replay wakes up, re-checks
  and publishes (``L ~ 2 x R x reaction``, docs/pacing.md). Then the next turn tops the
  stream up to the threshold.

How a wait is done comes from measurements on the dev server (docs/pacing.md, "How a wait is done"):
a durable timer costs 5 history events and fires on the server's timer granularity
(``TIMER_GRANULARITY_SECONDS``), while a bounded poll inside one local activity costs 1 marker and
reacts within its poll interval. So a wait the estimate says is short (up to ``POLL_LIMIT_SECONDS``)
polls the backlog until it reaches L; a longer one sleeps on a durable timer for all but
``TIMER_GRANULARITY_SECONDS`` of it and lets the next turn poll the rest. Either way the turn after
a wait starts again at the pause and fencing check.

Everything here is deterministic: its inputs are activity results (recorded in history) and
``workflow.now()`` readings passed in by the workflow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xmc_resumption.redisclient.results import BacklogReading

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
"""The least any throttle wait is bounded by (seconds), whatever ``throttle_seconds`` or
``max_wait_seconds`` say: a durable timer lasts at least this long, and so does a poll whose
backlog does not fall to its low watermark (a draining backlog ends it as soon as it does, so
consumers that drain lose nothing). With stopped consumers each turn (check, measure, wait) then
lasts at least this long: at most ``1 / WAIT_FLOOR_SECONDS`` turns a second, each of at most
``POLL_READINGS + 3`` scripts (a poll's interval is at least a tenth of its expected wait, itself
at least the floor when nothing drains); docs/contract.md, "Faults", has why the floor exists."""

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

    A one-line reason for the UI, e.g. ``backlog 501+ >= 500 (pending 120 + lag 381+) in group audit`` (the group that
    holds the replay back, when the reading names one), for ``reading`` taken before a move of ``moved`` entries (which
    add to the lag) and ``threshold`` (entries).

    A ``+`` marks a count that stopped at the cap: the true value may be larger. A count stopped
    by the byte budget says so: the undelivered tasks are too large to count in one script.
    """
    pending, lag, capped = reading.pending, reading.lag + moved, reading.capped
    plus = "+" if capped else ""
    if reading.bytes_capped:
        return f"undelivered entries pass the byte budget (pending {pending} + lag {lag}+ counted)"
    lag_text = "not counted" if capped and lag == 0 else f"{lag}{plus}"
    group = f" in group {reading.limiting_group}" if reading.limiting_group else ""
    return f"backlog {pending + lag}{plus} >= {threshold} (pending {pending} + lag {lag_text}){group}"


def _clamp(value: float, low: float, high: float) -> float:
    return min(high, max(low, value))


@dataclass
class Pacer:
    """Decides how long the replay waits, and estimates the consumers' drain rate.

    Args:
        adaptive: the ``adaptive`` policy (else ``fixed``).
        threshold: the backlog bound (entries, >= 1).
        throttle_seconds: the fixed policy's wait (seconds).
        min_wait, max_wait: bounds of one adaptive wait (seconds, 0 <= min_wait <= max_wait).
        rate: the drain-rate estimate carried from an earlier run (entries/s), or None.
        reaction: the measured reaction time carried from an earlier run (seconds), or None.
        burst: the consumers' learned burst carried from an earlier run (entries, 0: none yet).
        probing: the estimator of patch ``pacing-probe`` (``_fold_probing``): learns bursts,
            probes upwards after a wait that ended with the stream empty, and polls through a stop.
            False: the estimator runs that started before it recorded (``_fold``), kept for them.
        sliced: patch ``publish-rounds``: a wait longer than ``POLL_LIMIT_SECONDS`` while the
            consumers drain is a poll of ``POLL_LIMIT_SECONDS`` (the next turn plans again), not a
            durable timer, so a change of the consumers is seen within a poll interval.
    """

    adaptive: bool
    threshold: int
    throttle_seconds: float
    min_wait: float
    max_wait: float
    rate: float | None = None
    reaction: float | None = None
    burst: int = 0
    probing: bool = False
    sliced: bool = False
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
        if self.probing:
            self._fold_probing(max(0, last[0] - before), (at - last[1]).total_seconds(), before == 0, waited, at)
        else:
            self._fold(max(0, last[0] - before), (at - last[1]).total_seconds())

    def _fold_probing(self, drained: int, seconds: float, empty: bool, waited: bool, at: datetime) -> None:
        """The ``pacing-probe`` drain-rate estimator.

        The ``pacing-probe`` estimator: ``drained`` entries over ``seconds`` ending at ``at``; ``empty``: the stream was
        empty at the end (the drain is then a lower bound of the rate); ``waited``: the interval spans a throttle wait.

        - A wait in which the consumers took nothing starts (or continues) a stop: the estimate is
          kept, since it is what they take when they run (``plan`` then polls for their return).
          Before anyone drained, such a wait sets the estimate to 0 (``plan``: the longest waits).
        - A wait that ended with the stream empty, or the first interval after a stop (or after
          an estimate of 0), raises the estimate to at least the drain seen, and an empty end
          multiplies it by ``PROBE_GAIN``.
        - Any other interval folds in as a moving average whose weight grows with its length (a
          time constant of ``RATE_TIME_CONSTANT_SECONDS``), at least ``WAIT_SAMPLE_WEIGHT`` for a wait.
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

    def burst_seen(self, drop: int) -> None:
        """Fold in the largest fall of the backlog between two readings of a poll (entries).

        Fold in the largest fall of the backlog between two readings of a poll (entries; 0: the poll saw none): what the
        consumers take at once, or in one poll interval. A larger one is learned at once, a smaller one ``BURST_DECAY``
        of the way (a stop teaches nothing).
        """
        if not self.probing or drop <= 0:
            return
        drop = min(drop, self.threshold)
        self.burst = drop if drop > self.burst else round(self.burst + BURST_DECAY * (drop - self.burst))

    def _fold(self, drained: int, seconds: float) -> None:
        """Fold a drain-rate sample into a time-weighted moving average.

        A time-weighted moving average: a sample of ``seconds`` weighs ``1 - exp(-seconds /
        RATE_TIME_CONSTANT_SECONDS)``, so the many short intervals between back-to-back Redis calls barely move it
        (consumers drain in bursts: one acknowledgement of a whole read) while a poll of a second moves it most of the
        way. The first estimate waits for ``FIRST_ESTIMATE_SECONDS`` of samples.
        """
        if seconds <= 0:
            return
        if self.rate is None:
            self._first = (self._first[0] + drained, self._first[1] + seconds)
            if self._first[1] >= FIRST_ESTIMATE_SECONDS:
                self.rate = min(MAX_RATE, self._first[0] / self._first[1])
            return
        weight = 1 - math.exp(-seconds / RATE_TIME_CONSTANT_SECONDS)
        self.rate = min(MAX_RATE, self.rate + weight * (drained / seconds - self.rate))

    def woke(self, at: datetime) -> None:
        """A wait ended at workflow time ``at``; the next ``published`` measures the reaction."""
        self._woke_at = at

    def published(self, at: datetime) -> None:
        """A publish landed at workflow time ``at``: fold in the reaction time since the last wake."""
        if self._woke_at is not None:
            sample = _clamp((at - self._woke_at).total_seconds(), 0.001, 60.0)
            self.reaction = sample if self.reaction is None else (self.reaction + sample) / 2
            self._woke_at = None

    @property
    def low_watermark(self) -> int | None:
        """The backlog an adaptive wait waits for (entries), or None under ``fixed``.

        The backlog an adaptive wait waits for (entries): what the consumers drain while the replay reacts, twice over,
        plus one learned burst (``probing``), within ``[0, 3/4 of the threshold]`` (or up to one burst, below the
        threshold); half the threshold before a rate is known; None under ``fixed``.
        """
        if not self.adaptive:
            return None
        ceiling = self.threshold * 3 // 4
        if self.probing:  # at least one burst, even above 3/4 of the threshold
            ceiling = max(ceiling, min(self.burst, self.threshold - 1))
        if self.rate is None:
            return max(self.threshold // 2, min(self.burst, ceiling))
        react = (self.reaction or DEFAULT_REACTION_SECONDS) + POLL_INTERVAL_BOUNDS[0]
        return int(_clamp(self.burst + math.ceil(WATERMARK_SAFETY * self.rate * react), 0, ceiling))

    def plan(self, backlog: int, at: datetime) -> WaitPlan:
        """The wait to take at ``backlog`` entries at workflow time ``at``.

        The wait to take at ``backlog`` entries (at or over the threshold) at workflow time ``at``; bounded by at least
        ``WAIT_FLOOR_SECONDS`` (a shorter ``max_wait_seconds`` or ``throttle_seconds`` counts as it). The next reading
        is taken as the end of this wait (``observe``).
        """
        if not self.adaptive:
            return WaitPlan.timer(self.throttle_seconds)
        self._in_wait = True
        longest = max(self.max_wait, WAIT_FLOOR_SECONDS)
        low = self.low_watermark or 0
        since = self._stopped_since if self.probing else None
        draining = False
        if since is not None and (at - since).total_seconds() >= STOPPED_POLL_SECONDS:
            expected = longest
        elif self.rate is None or since is not None:
            # nothing measured yet, or the consumers stopped: a poll measures (unless min_wait is longer)
            expected = min(longest, max(self.min_wait, POLL_LIMIT_SECONDS))
        elif self.rate <= 0:
            expected = longest
        else:
            expected = _clamp((backlog - low) / self.rate, self.min_wait, longest)
            draining = self.sliced and self.min_wait <= POLL_LIMIT_SECONDS
        if expected <= POLL_LIMIT_SECONDS or draining:
            bound = min(longest, POLL_LIMIT_SECONDS)
            poll = _clamp(min(expected, bound) / 10, *POLL_INTERVAL_BOUNDS)
            return WaitPlan(WaitKind.POLL, bound, min(self.min_wait, bound), low, poll)
        timer = max(self.min_wait, expected - TIMER_GRANULARITY_SECONDS) if expected < longest else expected
        return WaitPlan.timer(timer)

    def describe(self, plan: WaitPlan) -> str:
        """How the wait of ``plan`` was chosen, for the UI.

        For example ``drain ~2,000/s: poll up to 2 s for the backlog to fall to 40``.
        """
        if not self.adaptive:
            return f"fixed {plan.seconds:g}s wait"
        rate = "drain rate not measured yet" if self.rate is None else f"drain ~{self.rate:,.0f}/s"
        if self.burst:
            rate += f", bursts ~{self.burst:,}"
        if self.probing and self._stopped_since is not None:
            rate += ", consumers stopped"
        if plan.kind is WaitKind.POLL:
            return f"{rate}: poll up to {plan.seconds:g}s for the backlog to fall to {plan.low_watermark}"
        return f"{rate}: sleep {plan.seconds:.3g}s"


@dataclass
class StallWatch:
    """Tells a stalled replay: the backlog has not gone down, and no task moved, for a window.

    Args:
        window: seconds without progress after which the replay is ``stalled``.
        limit: seconds without progress after which the run ends ``stalled`` (None: never).
        progress_at: when progress was last seen (workflow time), carried across continue-as-new.
        last: the last reading, carried across continue-as-new.
    """

    window: float
    limit: float | None
    progress_at: datetime | None = None
    last: tuple[int, int, str] | None = None
    """The last reading (backlog, pending, last-delivered-id), carried across continue-as-new."""

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
        """Start the window again at ``at`` (after a Redis outage: consumers could not drain either)."""
        self.progress_at = at

    def stalled(self, seconds: float) -> bool:
        """True when ``seconds`` without progress reach the window."""
        return seconds >= self.window

    def over_limit(self, seconds: float) -> bool:
        """True when ``seconds`` without progress reach ``max_stall_seconds``."""
        return self.limit is not None and seconds >= self.limit
