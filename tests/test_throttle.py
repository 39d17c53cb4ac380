"""The throttle policy's arithmetic (workflows/throttle.py): pure code, fed with readings as the
workflow feeds it (backlog before and after its own move, workflow time)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from xmc_resumption.redisclient.readings import BacklogReading, GroupStatus
from xmc_resumption.workflows.control import ControlChange, InvalidControlError
from xmc_resumption.workflows.models import ResumptionInput
from xmc_resumption.workflows.state import RunState
from xmc_resumption.workflows.throttle import (
    POLL_INTERVAL_BOUNDS,
    POLL_LIMIT_SECONDS,
    RATE_TIME_CONSTANT_SECONDS,
    TIMER_GRANULARITY_SECONDS,
    Pacer,
    Pacing,
    StallWatch,
    WaitKind,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


ADAPTIVE = Pacing(adaptive=True, threshold=500, throttle_seconds=10, min_wait=0.0, max_wait=10.0)
"""The settings most tests plan with: adaptive, threshold 500, waits of 0..10 s."""


def adaptive(**kw: float) -> Pacer:
    return Pacer(**kw)  # type: ignore[arg-type]


def drain(pacer: Pacer, rate: float, cycles: int = 20, step: float = 0.1) -> None:
    """Consumers drain at ``rate`` for ``step`` seconds between readings; the replay tops the
    stream up to the threshold at each reading (a publish: ``before`` measured, 500 after)."""
    t = T0
    pacer.observe(500, 500, False, t)
    for _ in range(cycles):
        t += timedelta(seconds=step)
        before = max(0, 500 - round(rate * step))
        pacer.observe(before, 500, False, t)


def test_fixed_waits_throttle_seconds_on_a_timer() -> None:
    fixed = Pacing(adaptive=False, threshold=500, throttle_seconds=7, min_wait=0, max_wait=7)
    pacer = Pacer()
    plan = pacer.plan(fixed, 600, T0)
    assert (plan.kind, plan.seconds) == (WaitKind.TIMER, 7)
    assert pacer.low_watermark(fixed) is None


def test_before_any_measurement_adaptive_polls_to_half_the_threshold() -> None:
    plan = adaptive().plan(ADAPTIVE, 500, T0)
    assert (plan.kind, plan.seconds, plan.low_watermark) == (WaitKind.POLL, POLL_LIMIT_SECONDS, 250)


@pytest.mark.parametrize("rate", [200.0, 2_000.0, 20_000.0])
def test_the_drain_rate_is_estimated_from_successive_readings(rate: float) -> None:
    """The first estimate starts the moving average (from 0); a few of its time constants later it is the rate."""
    pacer = adaptive()
    step = min(0.1, 400 / rate)
    drain(pacer, rate, step=step, cycles=round(6 * RATE_TIME_CONSTANT_SECONDS / step))
    assert pacer.rate == pytest.approx(rate, rel=0.02)


def test_the_wait_shrinks_when_consumers_are_fast_and_grows_when_slow() -> None:
    fast, slow, stopped = adaptive(), adaptive(), adaptive()
    drain(fast, 20_000, step=0.01, cycles=600)
    drain(slow, 100, step=1.0, cycles=10)
    drain(stopped, 0, step=1.0, cycles=10)
    f, s, z = fast.plan(ADAPTIVE, 500, T0), slow.plan(ADAPTIVE, 500, T0), stopped.plan(ADAPTIVE, 500, T0)
    assert f.kind is WaitKind.POLL and f.poll_seconds == POLL_INTERVAL_BOUNDS[0]
    # fast: keep a watermark the consumers cannot drain while the replay reacts (~20 ms at 20,000/s)
    assert fast.low_watermark(ADAPTIVE) == 375  # 2 x 20,000/s x 22 ms = 880, capped at 3/4 of the threshold
    # slow: (500 - L) / 100/s = ~5 s while they drain: a poll of the slice's length, then the next turn plans again
    assert slow.low_watermark(ADAPTIVE) == 5
    assert (s.kind, s.seconds, s.low_watermark) == (WaitKind.POLL, POLL_LIMIT_SECONDS, 5)
    # with a shortest wait longer than a slice, a timer that wakes a granularity early and a poll for the rest
    patient = Pacing(adaptive=True, threshold=500, throttle_seconds=10, min_wait=3.0, max_wait=10.0)
    t = slow.plan(patient, 500, T0)
    assert t.kind is WaitKind.TIMER
    assert t.seconds == pytest.approx((500 - 5) / slow.rate - TIMER_GRANULARITY_SECONDS)  # type: ignore[operator]
    # stopped: the longest wait
    assert (z.kind, z.seconds) == (WaitKind.TIMER, 10.0)


def test_waits_stay_within_min_and_max() -> None:
    bounded = Pacing(adaptive=True, threshold=500, throttle_seconds=10, min_wait=2.5, max_wait=3.0)
    pacer = Pacer()
    drain(pacer, 1.0, step=1.0, cycles=5)
    assert pacer.plan(bounded, 500, T0).seconds == 3.0
    quick = Pacer()
    drain(quick, 50_000, step=0.005)
    plan = quick.plan(Pacing(adaptive=True, threshold=500, throttle_seconds=10, min_wait=0.5, max_wait=3.0), 500, T0)
    assert plan.kind is WaitKind.POLL and plan.min_seconds == 0.5


def test_capped_readings_and_an_empty_start_give_no_sample() -> None:
    pacer = adaptive()
    pacer.observe(0, 0, False, T0)  # nothing in the stream yet: nothing to drain
    pacer.observe(0, 500, False, T0 + timedelta(seconds=1))
    assert pacer.rate is None
    pacer.observe(501, 501, True, T0 + timedelta(seconds=2))  # capped: a lower bound only
    pacer.observe(400, 400, False, T0 + timedelta(seconds=3))
    assert pacer.rate is None


def test_the_reaction_time_is_measured_from_wake_to_publish() -> None:
    pacer = adaptive()
    pacer.woke(T0)
    pacer.published(T0 + timedelta(milliseconds=30))
    pacer.published(T0 + timedelta(seconds=5))  # not after a wait: not a reaction
    assert pacer.reaction == pytest.approx(0.03)


def test_stall_is_no_progress_across_the_window() -> None:
    watch = StallWatch()
    assert watch.observe(T0, 500, 500, "1-0") == 0
    assert watch.observe(T0 + timedelta(seconds=59), 500, 500, "1-0") == 59
    assert watch.observe(T0 + timedelta(seconds=60), 500, 500, "1-0") == 60
    # consumers read on (last-delivered-id moves) though a capped count hides the drop: progress
    assert watch.observe(T0 + timedelta(seconds=61), 500, 500, "2-0") == 0
    assert watch.observe(T0 + timedelta(seconds=200), 501, 500, "2-0") == 139
    assert watch.observe(T0 + timedelta(seconds=201), 400, 400, "2-0", moved=0) == 0  # went down
    assert watch.observe(T0 + timedelta(seconds=300), 400, 400, "2-0", moved=10) == 0  # tasks moved


def test_a_min_wait_longer_than_a_poll_is_a_timer_even_before_a_measurement() -> None:
    pacer = Pacer()
    plan = pacer.plan(Pacing(adaptive=True, threshold=500, throttle_seconds=30, min_wait=10.0, max_wait=30.0), 500, T0)
    assert (plan.kind, plan.seconds) == (WaitKind.TIMER, 10.0)


def test_the_stall_window_survives_continue_as_new_and_restarts_after_an_outage() -> None:
    first = StallWatch()
    first.observe(T0, 500, 500, "1-0")
    first.observe(T0 + timedelta(seconds=50), 500, 500, "1-0")
    carried = StallWatch(progress_at=first.progress_at, last=first.last)
    assert carried.observe(T0 + timedelta(seconds=130), 500, 500, "1-0") == 130  # the next run's first reading
    carried.restart(T0 + timedelta(seconds=400))  # Redis was away: consumers could not drain either
    assert carried.observe(T0 + timedelta(seconds=401), 500, 500, "1-0") == 1


WAITS = {
    # every wait one turn can take before it extends the lease again, and the input that sets it
    "throttle_seconds": {},  # fixed waits, memory waits, and the adaptive longest by default
    "max_wait_seconds": {"throttle_policy": "adaptive", "throttle_seconds": 1.0},
}
"""The Redis-outage wait (``redis_retry_seconds``) is not among them on purpose: a lease lapsed
during an outage is taken again for the current token at the next check (models._waits_fit)."""


@pytest.mark.parametrize("wait", sorted(WAITS))
@pytest.mark.parametrize(("lease", "seconds", "ok"), [(120, 119.999, True), (120, 120, False), (120, 500, False)])
def test_every_wait_is_shorter_than_the_claims_lease(wait: str, lease: float, seconds: float, ok: bool) -> None:
    """A wait at or past the lease would let the claim lapse every turn: refused at the start and
    by every Update, whichever wait it is (only throttle_seconds was tested once)."""
    fields = {"experiment_id": "E", "claim_lease_seconds": lease, **WAITS[wait], wait: seconds}
    if ok:
        assert ResumptionInput.model_validate(fields).claim_lease_seconds == lease
        return
    with pytest.raises(ValidationError, match=rf"claim_lease_seconds \({lease:g}\) must be longer than {wait}"):
        ResumptionInput.model_validate(fields)
    if wait == "throttle_seconds":  # the same rule for the Update that sets it
        running = ResumptionInput(experiment_id="E", claim_lease_seconds=lease)
        with pytest.raises(InvalidControlError, match=f"must be longer than {wait}"):
            ControlChange(throttle_seconds=seconds).checked_against(running)


def test_waits_of_the_model_are_every_wait_of_the_pacer() -> None:
    """The input's waits the lease is checked against are the pacer's bounds: its longest wait is
    max_wait_seconds, else throttle_seconds, under either policy."""
    for policy in ("fixed", "adaptive"):
        inp = ResumptionInput(experiment_id="E", throttle_policy=policy, throttle_seconds=3, max_wait_seconds=5)
        assert inp.longest_wait_seconds == (5 if policy == "adaptive" else 3) < inp.claim_lease_seconds


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"min_wait_seconds": 5, "max_wait_seconds": 1}, r"max_wait_seconds \(1\) must not be below min_wait_seconds"),
        (
            {"min_wait_seconds": 30, "throttle_seconds": 10},
            r"max_wait_seconds \(= throttle_seconds\) \(10\) must not be below min_wait_seconds \(30\)",
        ),
    ],
)
def test_the_shortest_wait_may_not_pass_the_longest(fields: dict[str, float], message: str) -> None:
    """With max_wait_seconds unset the longest wait is throttle_seconds: a min_wait_seconds above
    it was accepted once (and clamped away in silence)."""
    with pytest.raises(ValidationError, match=message):
        ResumptionInput.model_validate({"experiment_id": "E", "throttle_policy": "adaptive", **fields})
    ResumptionInput.model_validate({"experiment_id": "E", "min_wait_seconds": 10, "throttle_seconds": 10})


def test_the_input_says_when_no_progress_is_a_stall_and_when_it_ends_the_run() -> None:
    """``stall_window_seconds`` and ``max_stall_seconds`` are read from the input in force (``RunState``), over the
    stall watch's seconds without progress."""
    state = RunState.of(ResumptionInput(experiment_id="E1", stall_window_seconds=60, max_stall_seconds=120))
    reading = BacklogReading(
        status=GroupStatus.OK, pending=500, lag=0, capped=False, headroom=0, last_delivered_id="1-0", xinfo_lag=0,
        threshold=500,
    )  # fmt: skip
    for seconds, stalled, over in ((0, False, False), (59, False, False), (60, True, False), (120, True, True)):
        state.observe(reading, T0 + timedelta(seconds=seconds))
        assert (state.progress.stalled, state.stall_over_limit()) == (stalled, over), seconds
    forever = RunState.of(ResumptionInput(experiment_id="E1", stall_window_seconds=60))
    forever.observe(reading, T0)
    forever.observe(reading, T0 + timedelta(days=30))
    assert forever.progress.stalled and not forever.stall_over_limit()
