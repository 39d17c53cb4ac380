"""The adaptive policy's drain-rate estimator (workflows/throttle.py) against simulated consumers: it learns their
bursts, probes upwards after a wait that ended with the stream empty, recovers after a stop or a change of pace, and
keeps its low watermark under the threshold.

The simulation is the workflow's loop on workflow time: a wait as the pacer plans it (a poll reads the backlog every
``poll_seconds`` until it reaches the low watermark; a timer sleeps, and the next turn's publish measures), then the
reaction (check, publish: ``REACT`` seconds) and a top-up to the threshold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from xmc_resumption.workflows.throttle import (
    MAX_RATE,
    POLL_LIMIT_SECONDS,
    STOPPED_POLL_SECONDS,
    Pacer,
    Pacing,
    WaitKind,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
THRESHOLD = 500
REACT = 0.02
STEP = 0.001
PACING = Pacing(adaptive=True, threshold=THRESHOLD, throttle_seconds=10, min_wait=0.0, max_wait=10.0)


@dataclass
class Sim:
    """Consumers that take ``rate`` entries/s smoothly, or ``burst`` entries every ``period`` s, from
    a stream the replay tops up to the threshold; ``starved``: consumer-seconds lost to an empty stream."""

    pacer: Pacer
    rate: float = 2_000.0
    pacing: Pacing = PACING
    burst: int = 0
    period: float = 0.1
    t: float = 0.0
    backlog: int = THRESHOLD
    starved: float = 0.0
    credit: float = 0.0
    next_tick: float = 0.0
    waits: list[WaitKind] = field(default_factory=list)
    change: tuple[float, float] | None = None
    """(when, rate): the consumers' rate changes at that time, in the middle of whatever the replay does."""

    def __post_init__(self) -> None:
        self.pacer.observe(self.backlog, self.backlog, False, self.at())  # the publish that filled the stream

    def at(self) -> datetime:
        return T0 + timedelta(seconds=self.t)

    def advance(self, seconds: float) -> None:
        end = self.t + seconds
        while self.t < end - 1e-12:
            dt = min(STEP, end - self.t)
            self.t += dt
            if self.change is not None and self.t >= self.change[0]:
                self.rate, self.change = self.change[1], None
            if self.rate <= 0:
                continue
            if self.burst:
                if self.t >= self.next_tick:
                    self.next_tick += self.period
                    taken = min(self.backlog, self.burst)
                    self.starved += (self.burst - taken) / self.burst * self.period
                    self.backlog -= taken
                continue
            self.credit += self.rate * dt
            taken = min(self.backlog, int(self.credit))
            self.credit -= taken
            if self.backlog == 0:
                self.starved += dt
                self.credit = 0.0
            self.backlog -= taken

    def turn(self) -> None:
        """One wait, then the reaction and the top-up (the publishes) to the threshold."""
        plan = self.pacer.plan(self.pacing, self.backlog, self.at())
        self.waits.append(plan.kind)
        if plan.kind is WaitKind.POLL:
            start, previous, drop = self.t, None, 0
            while True:
                if previous is not None:
                    drop = max(drop, previous - self.backlog)
                previous = self.backlog
                elapsed = self.t - start
                reached = self.backlog <= plan.low_watermark and elapsed >= plan.min_seconds
                if reached or elapsed >= plan.seconds - 1e-9:
                    break
                self.advance(min(plan.poll_seconds, plan.seconds - elapsed))
            self.pacer.burst_seen(drop, THRESHOLD)
        else:
            self.advance(plan.seconds)
        self.pacer.observe(self.backlog, self.backlog, False, self.at())
        self.pacer.woke(self.at())
        self.advance(REACT)
        before, self.backlog = self.backlog, THRESHOLD
        self.pacer.observe(before, THRESHOLD, False, self.at())
        self.pacer.published(self.at())

    def run(self, seconds: float) -> float:
        """Turn for ``seconds``; returns the consumers' starved fraction of that time."""
        start_t, start_starved = self.t, self.starved
        while self.t - start_t < seconds:
            self.turn()
        return (self.starved - start_starved) / (self.t - start_t)


def pacer(rate: float | None = None) -> Pacer:
    return Pacer(rate=rate)


def test_the_burst_is_learned_and_the_low_watermark_keeps_one_in_hand() -> None:
    """200 entries every 100 ms: the low watermark holds at least one burst, so no tick reads short."""
    sim = Sim(pacer(), burst=200)
    sim.run(2.0)
    assert sim.pacer.burst == 200
    low = sim.pacer.low_watermark(PACING)
    assert low is not None and low >= 200
    assert sim.run(5.0) < 0.02


def test_a_wait_that_ends_with_the_stream_empty_grows_the_estimate() -> None:
    """Carried 200/s, the consumers take 2,000/s: each wait finds the stream empty, and the
    estimate doubles until it is near the true rate; then it is followed, not passed by far."""
    sim = Sim(pacer(rate=200.0))
    estimates = []
    for _ in range(6):
        sim.turn()
        estimates.append(sim.pacer.rate)
    assert estimates[0] is not None and estimates[0] >= 2 * 200
    assert max(e or 0 for e in estimates[:4]) >= 1_500
    sim.run(5.0)
    assert sim.pacer.rate == pytest.approx(2_000, rel=0.25)
    assert sim.run(5.0) < 0.02


def test_after_a_stop_the_replay_catches_up_within_a_few_waits() -> None:
    """2,000/s, a stop of 30 s, then 2,000/s again: the pacer polls through the stop (its estimate kept), so the
    restarted consumers find the stream full and stay busy."""
    sim = Sim(pacer())
    sim.run(3.0)
    before = sim.pacer.rate
    sim.rate = 0.0
    sim.run(30.0)
    assert sim.pacer.rate == before  # a stop teaches nothing about the rate
    assert sim.waits[-1] is WaitKind.POLL
    sim.rate = 2_000.0
    starved = sim.run(5.0)
    assert starved < 0.05
    assert sim.pacer.rate == pytest.approx(2_000, rel=0.25)


def test_a_long_stop_goes_back_to_durable_timers() -> None:
    """Consumers gone for longer than ``STOPPED_POLL_SECONDS``: the waits become durable timers of
    the longest wait (the history grows by a timer per 10 s instead of a poll per 2 s)."""
    sim = Sim(pacer())
    sim.run(3.0)
    sim.rate = 0.0
    sim.run(STOPPED_POLL_SECONDS + 15)
    assert sim.waits[-1] is WaitKind.TIMER
    assert sim.pacer.plan(PACING, THRESHOLD, sim.at()).seconds == 10.0


def test_nobody_ever_draining_sets_the_estimate_to_zero_and_the_longest_wait() -> None:
    sim = Sim(pacer(), rate=0.0)
    sim.run(5.0)
    assert sim.pacer.rate == 0
    plan = sim.pacer.plan(PACING, THRESHOLD, sim.at())
    assert (plan.kind, plan.seconds) == (WaitKind.TIMER, 10.0)


def test_consumers_ten_times_faster_are_followed_within_a_few_waits() -> None:
    sim = Sim(pacer(), rate=200.0)
    sim.run(5.0)
    assert sim.pacer.rate == pytest.approx(200, rel=0.25)
    sim.rate = 2_000.0
    for _ in range(4):
        sim.turn()
    assert sim.pacer.rate == pytest.approx(2_000, rel=0.3)
    assert sim.run(5.0) < 0.03


@pytest.mark.parametrize("burst", [0, 450, 10_000])
def test_probing_never_overshoots(burst: int) -> None:
    """Consumers faster than anything the replay can feed (the stream ends every wait empty): the
    estimate grows, but stays bounded by ``MAX_RATE``; the low watermark stays under the
    threshold (a burst larger than the threshold counts as the threshold); every wait stays within
    ``[min_wait, max_wait]``."""
    sim = Sim(pacer(), rate=1e9, burst=burst, period=0.001)
    for _ in range(80):
        sim.turn()
        low = sim.pacer.low_watermark(PACING)
        assert low is not None and 0 <= low < THRESHOLD
        plan = sim.pacer.plan(PACING, THRESHOLD, sim.at())
        assert 0 <= plan.seconds <= 10.0 and 0 <= plan.low_watermark < THRESHOLD
    assert sim.pacer.rate is not None and sim.pacer.rate <= MAX_RATE
    assert sim.pacer.burst <= THRESHOLD


def test_a_speed_up_in_the_middle_of_a_long_wait_is_seen_within_a_poll() -> None:
    """At 200/s a wait is about 2.3 s, polled in slices while the consumers drain: a speed-up tenfold ends the slice
    within a poll interval, and the next waits follow the new pace."""
    sim = Sim(pacer(), rate=200.0)
    sim.run(5.0)
    assert sim.waits[-1] is WaitKind.POLL
    sim.change = (sim.t + 0.3, 2_000.0)
    starved = sim.run(3.0)
    assert starved < 0.05 and set(sim.waits) == {WaitKind.POLL}


def test_slices_are_for_consumers_that_drain() -> None:
    """A long wait is a slice of ``POLL_LIMIT_SECONDS`` only while the consumers drain: nobody drained yet, a stop
    past ``STOPPED_POLL_SECONDS`` and a ``min_wait_seconds`` over the poll limit sleep on a durable timer."""
    plan = pacer(rate=50.0).plan(PACING, THRESHOLD, T0)
    assert (plan.kind, plan.seconds, plan.poll_seconds) == (WaitKind.POLL, POLL_LIMIT_SECONDS, 0.05)
    patient = Pacing(adaptive=True, threshold=THRESHOLD, throttle_seconds=10, min_wait=3.0, max_wait=10.0)
    assert pacer(rate=50.0).plan(patient, THRESHOLD, T0).kind is WaitKind.TIMER
    nobody = Sim(pacer(), rate=0.0)
    nobody.run(5.0)
    assert nobody.pacer.plan(PACING, THRESHOLD, nobody.at()).kind is WaitKind.TIMER
    stopped = Sim(pacer())
    stopped.run(3.0)
    stopped.rate = 0.0
    stopped.run(STOPPED_POLL_SECONDS + 15)
    assert stopped.waits[-1] is WaitKind.TIMER and WaitKind.POLL in stopped.waits[-20:]
