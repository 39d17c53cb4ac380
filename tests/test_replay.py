"""Replay every recorded history of every release (tests/histories/<version>/*.json) against the current workflow
code: a change that would break the runs a release started raises NondeterminismError here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.record_histories import HISTORIES as FOLDER
from tests.record_histories import SCENARIOS, releases
from tests.support.helpers import history_calls
from xmc_resumption.activities.requests import TURN_SIGNAL
from xmc_resumption.workflows.resumption import ResumptionWorkflow

RELEASES = releases()

HISTORIES = sorted(FOLDER.glob("*/*.json"))

HELD = 12
"""Tasks every recorded scenario holds, behind a backlog at the threshold (tests/record_histories.py)."""

ENDINGS: dict[str, tuple[EventType.ValueType, str | None, list[str]]] = {
    # scenario: (the first run's last event, the result's outcome, the Redis calls after the last timer)
    "completed_after_throttles": (EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, "completed", []),
    "adaptive_completed": (EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, "completed", []),
    "probe_completed": (EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, "completed", []),
    "waited_for_redis": (EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, "completed", []),
    "paused_during_wait": (
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
        "paused",
        ["check_claim", "release_claim"],
    ),
    "fenced_during_wait": (EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, "fenced", ["check_claim"]),
    "cancelled_during_wait": (EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED, None, ["release_claim"]),
    "continued_as_new": (EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW, None, []),
    "controlled_by_update": (EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, "completed", []),
    "stopped_by_update": (EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, "paused", ["release_claim"]),
    "waited_for_group": (EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, "completed", []),
    "stalled_naming_consumers": (EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, "stalled", []),
    "rate_limited": (EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, "completed", []),
    "adaptive_polled_by_activity": (EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, "completed", []),
    "release_failed_in_outage": (EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, "paused", ["release_claim"]),
    "stalled_on_memory": (EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, "stalled", []),
    "queued_for_turn": (EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, "completed", []),
}


def name(path: Path) -> str:
    """A recording's test ID: ``<release>/<scenario>``."""
    return f"{path.parent.name}/{path.stem}"


def test_the_newest_release_records_every_scenario_and_every_recording_is_checked() -> None:
    assert [p.name for p in FOLDER.iterdir()] == [p.name for p in RELEASES]  # folders of releases only
    assert {p.stem for p in RELEASES[-1].glob("*.json")} == set(SCENARIOS)
    assert {p.stem for p in HISTORIES} <= set(ENDINGS) and set(SCENARIOS) == set(ENDINGS)


@pytest.mark.parametrize("path", HISTORIES, ids=[name(p) for p in HISTORIES])
def test_recorded_history_ends_as_its_name_says(path: Path) -> None:
    """What each recording is a recording of: it throttled first (a backlog at the threshold), and
    ended the way its name says, so a replay of it exercises that path."""
    history = WorkflowHistory.from_json(f"resumption-{path.stem}", path.read_text())
    name = path.stem
    event_type, outcome, after_last_timer = ENDINGS[name]
    last = history.events[-1]
    assert last.event_type == event_type
    if outcome is not None:
        result = json.loads(last.workflow_execution_completed_event_attributes.result.payloads[0].data)
        moved = HELD if outcome == "completed" else 0
        assert (result["outcome"], result["replayed"], result["remaining"]) == (outcome, moved, HELD - moved)
    # the workflow's own timers (a local activity's retry backoff past the task budget is a timer
    # of the SDK's, without a summary: workflows/calls.py)
    timers = [
        json.loads(e.user_metadata.summary.data)
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED and e.user_metadata.HasField("summary")
    ]
    # (the adaptive waits are polled while the consumers drain: no timer at all, but a queued poll's wait for its turn)
    polled = ("adaptive_polled_by_activity", "probe_completed", "adaptive_completed", "queued_for_turn")
    if name in polled:  # its first wait was a poll, not a timer (before anything moved)
        calls = history_calls(history)
        kinds = [k for k, _ in calls]
        first_move = next(i for i, (k, r) in enumerate(calls) if k == "publish_batch" and r["moved"])
        assert "wait_for_drain" in kinds and kinds.index("wait_for_drain") < first_move
    else:
        assert timers and timers[0].startswith("throttled") and "backlog 5 >= 5" in timers[0]
    outages = ("waited_for_redis", "release_failed_in_outage")
    assert any(t.startswith("Redis unavailable") for t in timers) == (name in outages)
    # the release failed in rounds with a durable wait between them, and the result says so
    assert any(t.startswith("release failed (1 of at most") for t in timers) == (name == "release_failed_in_outage")
    if outcome is not None:
        assert (result.get("release_error") is not None) == (name == "release_failed_in_outage")
    # memory waits counted against max_stall_seconds
    memory = [t for t in timers if "Redis memory" in t]
    assert bool(memory) == (name == "stalled_on_memory")
    # a poll past the workflow task's budget ran as a regular activity (and a rate wait's poll), and so did a call
    # handed on to the task queue after a connection fault in an outage
    scheduled = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    assert bool(scheduled) == (name in polled or name == "rate_limited" or name in outages)
    calls = history_calls(history)
    kinds = [k for k, _ in calls]
    assert kinds[0] == "acquire_claim"
    if after_last_timer:
        last_timer = len(kinds) - 1 - kinds[::-1].index("timer")
        assert kinds[last_timer + 1 :] == after_last_timer
        # nothing moved before the wait ended the run (the publish right after the claim found no headroom)
        assert all(r["moved"] == 0 for k, r in calls if k == "publish_batch")
    # a poll that reached its bound beside other replays' polls of its worker returned queued; the run waited durably
    # for its turn, which the worker gave by signal, with the queued poll's number
    queued = [i for i, (k, r) in enumerate(calls) if k == "wait_for_drain" and r.get("queued", False)]
    assert bool(queued) == (name == "queued_for_turn")
    assert [kinds[i + 1] for i in queued] == ["timer"] * len(queued)
    assert sum(t.startswith("queued up to") for t in timers) == len(queued)
    signals = [
        e.workflow_execution_signaled_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    ]
    assert [s.signal_name for s in signals] == [TURN_SIGNAL] * len(signals) and bool(signals) == bool(queued)
    if queued:
        first_wait_id = kinds[: queued[0]].count("wait_for_drain") + 1
        assert json.loads(signals[0].input.payloads[0].data) == first_wait_id
        ids = [e.event_id for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED]
        cancels = [e.event_id for e in history.events if e.event_type == EventType.EVENT_TYPE_TIMER_CANCELED]
        assert cancels and ids[0] < cancels[0]  # the signal ended the queued wait
    if name in ("cancelled_during_wait", "controlled_by_update", "stopped_by_update", "queued_for_turn"):
        # the cancel, the accepted Update, or the turn's signal ended the timer
        assert any(e.event_type == EventType.EVENT_TYPE_TIMER_CANCELED for e in history.events)
    # the stall named the consumer holding the backlog (one XINFO CONSUMERS, not every turn)
    assert ("idle_consumers" in kinds) == (name in ("stalled_naming_consumers", "stalled_on_memory"))
    assert kinds.count("idle_consumers") < max(1, kinds.count("timer"))
    updates = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED]
    assert len(updates) == (
        1 if name in ("controlled_by_update", "stopped_by_update", "release_failed_in_outage") else 0
    )
    # the fleet view's upserts (the SDK upserts TemporalChangeVersion for each patch too): claiming,
    # replaying, the end, and around each durable wait at most two
    upserts = [
        e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
    ]
    phases = [json.loads(fields["XmcPhase"].data) for fields in upserts if "XmcPhase" in fields]
    assert ("waiting_for_group" in phases) == (name == "waited_for_group")
    # (a poll is no durable wait: the fleet view does not show it as throttled)
    assert phases[:3] == ["claiming", "replaying", "completed" if name in polled else "throttled"]
    assert phases[-1] == (outcome or ("cancelled" if name == "cancelled_during_wait" else "replaying"))
    assert len(phases) <= 3 + 2 * kinds.count("timer"), phases


@pytest.mark.parametrize("path", HISTORIES, ids=[name(p) for p in HISTORIES])
async def test_recorded_history_replays(path: Path) -> None:
    history = WorkflowHistory.from_json(f"resumption-{path.stem}", path.read_text())
    replayer = Replayer(workflows=[ResumptionWorkflow], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None


LATE_MARKER = Path(__file__).parent / "support" / "history_la_completed_with_its_task.json"
"""The first 24 events of a dev-server run (tests/test_workflow_devserver.py's Redis outage, under CPU load) whose
claim, a local activity, completed as its first workflow task was being completed."""


async def test_a_local_activity_that_completed_with_its_workflow_task_replays() -> None:
    """Its marker went into the first workflow task, the code after it ran in the second; a replay runs that code in
    the first, at the marker's time and the first task's history length. A choice of a local or a regular activity
    taken from ``workflow.now()`` and the history length chose a local poll at event 12 on replay (the query of the
    finished run failed with NondeterminismError); the budget counts what the calls report instead."""
    history = WorkflowHistory.from_json("resumption-late-marker", LATE_MARKER.read_text())
    kinds = [(e.event_id, EventType.Name(e.event_type)) for e in history.events[3:12]]
    assert kinds[2] == (6, "EVENT_TYPE_MARKER_RECORDED") and kinds[3] == (7, "EVENT_TYPE_WORKFLOW_TASK_SCHEDULED")
    poll = history.events[11].activity_task_scheduled_event_attributes
    assert (history.events[11].event_id, poll.activity_type.name) == (12, "wait_for_drain")
    replayer = Replayer(workflows=[ResumptionWorkflow], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None
