"""Every Update of ``Control`` with good and hostile arguments (issue 16, item 6): a hostile one
(the wrong type: a bool or a string for a number; nan, inf, out of bounds, huge, null, an empty
string, an unknown policy or field, the wrong number of arguments) is rejected by the validator
with a non-retryable ``ApplicationError`` of type ``InvalidControl``: one line naming the field.
The table is checked against the model (fast, every row) and then sent over the wire to one
throttled replay on the time-skipping server, NaN and Infinity as raw JSON payloads (a Python
client would send them as null)."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import WorkflowUpdateFailedError
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from tests.support.helpers import throttled_replay
from xmc_resumption.workflows.control import SET_FIELDS, Control, ControlChange, EffectiveSettings, InvalidControlError
from xmc_resumption.workflows.models import Outcome, ResumptionInput, ThrottlePolicy
from xmc_resumption.workflows.resumption import ResumptionWorkflow


class Json:
    """An argument sent as this JSON text exactly (``NaN``, ``Infinity``: not JSON to a Python
    encoder, which writes null, but accepted by the worker's JSON decoder)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def payload(self) -> RawValue:
        return RawValue(Payload(metadata={"encoding": b"json/plain"}, data=self.text.encode()))

    def decoded(self) -> Any:
        return {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}[self.text]

    def __repr__(self) -> str:
        return self.text


NAN, INF, NEG_INF = Json("NaN"), Json("Infinity"), Json("-Infinity")
NOTHING = object()
"""No argument at all."""

INT_HOSTILE: list[Any] = [True, False, "5", "\u0665", "", 5.5, 5.0, 0, -1, 10**30, NAN, INF, None, [], {}, [5], "abc"]
"""Never a good integer setting (a threshold, a batch size)."""

HOSTILE: dict[Control, list[tuple[Any, str]]] = {
    Control.SET_THRESHOLD: [(v, "max_backlog_threshold") for v in [*INT_HOSTILE, 100_001]],
    Control.SET_BATCH_SIZE: [(v, "batch_size") for v in [*INT_HOSTILE, 10_001]],
    Control.SET_THROTTLE_SECONDS: [
        *((v, "throttle_seconds") for v in [True, "5", "\u0665", "", NAN, INF, NEG_INF, 0, -1, 1e308, None, [], {}]),
        (500, "claim_lease_seconds"),  # longer than the lease (120 s): the rule over two fields
    ],
    Control.SET_THROTTLE_POLICY: [(v, "throttle_policy") for v in ["", "bogus", "FIXED", 1, True, None, [], {}]],
    Control.SET_MAX_TASKS_PER_SECOND: [
        (v, "max_tasks_per_second")
        for v in [True, "5", "\u0661\u0660", "", NAN, INF, NEG_INF, -1, 0.0001, 1e7, None, [], {}]
    ],
    Control.CONFIGURE: [
        (5, "configure: the change must be a JSON object"),
        ("batch_size", "configure: the change must be a JSON object"),
        ([], "configure: the change must be a JSON object"),
        (None, "configure: the change must be a JSON object"),
        (True, "configure: the change must be a JSON object"),
        ({"bogus": 1}, "bogus: Extra inputs are not permitted"),
        ({"carry": {}}, "carry: Extra inputs are not permitted"),
        ({"batch_size": True}, "batch_size: Input should be a valid integer (got a bool)"),
        ({"batch_size": "5"}, "batch_size: Input should be a valid integer (got a str)"),
        ({"max_backlog_threshold": 0}, "max_backlog_threshold: Input should be greater than or equal to 1"),
        ({"throttle_seconds": 7 * 86_400}, "throttle_seconds: Input should be less than or equal to 86400"),
        ({"throttle_policy": "eager"}, "throttle_policy: Input should be 'fixed' or 'adaptive'"),
        ({"max_tasks_per_second": True}, "max_tasks_per_second: Input should be a valid number (got a bool)"),
    ],
    Control.PAUSE: [(1, "pause: takes 0 argument(s), got 1"), ("", "pause: takes 0 argument(s), got 1")],
}
"""Each Update's hostile arguments and what the one-line rejection must name."""

WRONG_COUNTS: list[tuple[Control, list[Any], str]] = [
    (update, args, f"{update.value}: takes 1 argument(s), got {len(args)}")
    for update in Control
    if update is not Control.PAUSE
    for args in ([], [1, 2])
]

GOOD: dict[Control, list[tuple[Any, dict[str, Any]]]] = {
    Control.SET_THRESHOLD: [(1, {"max_backlog_threshold": 1}), (5, {"max_backlog_threshold": 5})],
    Control.SET_BATCH_SIZE: [(1, {"batch_size": 1}), (10_000, {"batch_size": 10_000})],
    Control.SET_THROTTLE_SECONDS: [(0.5, {"throttle_seconds": 0.5}), (100, {"throttle_seconds": 100.0})],
    Control.SET_THROTTLE_POLICY: [(p, {"throttle_policy": p}) for p in ("adaptive", "fixed")],
    Control.SET_MAX_TASKS_PER_SECOND: [(0.5, {"max_tasks_per_second": 0.5}), (1_000, {"max_tasks_per_second": 1000.0})],
    Control.CONFIGURE: [
        ({}, {}),
        ({"batch_size": 7, "throttle_seconds": 20}, {"batch_size": 7, "throttle_seconds": 20.0}),
        ({"max_backlog_threshold": None, "throttle_policy": "fixed"}, {"throttle_policy": "fixed"}),
    ],
}
"""Good arguments that keep the test's replay throttled (threshold at most its backlog of 5)."""


def decoded(value: Any) -> Any:
    """``value`` as the worker's JSON decoder hands it to the handler."""
    return value.decoded() if isinstance(value, Json) else value


def hostile_rows() -> list[Any]:
    rows = [
        pytest.param(update, [value], expected, id=f"{update.value}-{value!r:.20}")
        for update, cases in HOSTILE.items()
        for value, expected in cases
    ]
    rows += [pytest.param(u, args, expected, id=f"{u.value}-{len(args)}-args") for u, args, expected in WRONG_COUNTS]
    return rows


def test_every_update_has_rows() -> None:
    assert set(HOSTILE) == set(Control) and set(GOOD) | {Control.PAUSE} == set(Control)
    assert set(SET_FIELDS) == set(Control) - {Control.CONFIGURE, Control.PAUSE}


@pytest.mark.parametrize(("update", "args", "expected"), hostile_rows())
def test_a_hostile_argument_is_refused_naming_the_field(update: Control, args: list[Any], expected: str) -> None:
    """As the validator reads it: ``of_update`` for the argument itself, then the whole input's
    rules (``checked_against``, as ``_validate`` does) for a value that breaks a bound or a rule
    over two fields."""
    inp = ResumptionInput(experiment_id="E1", max_backlog_threshold=5)
    with pytest.raises(InvalidControlError) as raised:
        ControlChange.of_update(update, [decoded(a) for a in args]).checked_against(inp)
    message = str(raised.value)
    assert "\n" not in message and len(message) < 300, message
    assert expected in message or (update.value in SET_FIELDS and expected.split(":")[0] in message), message


@pytest.mark.parametrize(
    ("update", "value", "fields"),
    [pytest.param(u, v, f, id=f"{u.value}-{v!r:.30}") for u, rows in GOOD.items() for v, f in rows],
)
def test_a_good_argument_is_read_exactly(update: Control, value: Any, fields: dict[str, Any]) -> None:
    change = ControlChange.of_update(update, [value])
    assert change.model_dump(exclude_none=True, mode="json") == fields
    assert ControlChange.of_update(Control.PAUSE, []) == ControlChange()


async def test_every_hostile_update_is_rejected_one_line_non_retryable(
    temporal_env, redis, redis_url, task_queue
) -> None:
    """Over the wire, one throttled replay: every hostile row is rejected (non-retryable,
    ``InvalidControl``, one line naming the field) and changes nothing; then every good row is
    accepted and returns the settings it asked for; then ``pause`` ends the run."""
    rejected: list[str] = []
    async with throttled_replay(temporal_env, task_queue, redis, redis_url) as run:
        handle = run.handle
        for row in hostile_rows():
            update, args, expected = row.values
            sent = [a.payload() if isinstance(a, Json) else a for a in args]
            with pytest.raises(WorkflowUpdateFailedError) as raised:
                await handle.execute_update(update.value, args=sent, result_type=EffectiveSettings)
            cause = raised.value.cause
            assert isinstance(cause, ApplicationError), cause
            assert (cause.type, cause.non_retryable) == ("InvalidControl", True), (row.id, cause)
            assert "\n" not in cause.message and len(cause.message) < 300, cause.message
            field = expected.split(":")[0] if update in SET_FIELDS else expected
            assert field in cause.message, (row.id, cause.message)
            rejected.append(cause.message)
        unchanged = await handle.query(ResumptionWorkflow.progress)
        accepted = []
        for update, rows in GOOD.items():
            for value, fields in rows:
                effective = await handle.execute_update(update.value, value, result_type=EffectiveSettings)
                got = effective.model_dump(mode="json")
                assert {k: got[k] for k in fields} == fields, (update, value, got)
                accepted.append(update)
        stopped = await handle.execute_update(ResumptionWorkflow.pause)
        result = await handle.result()
        progress = await handle.query(ResumptionWorkflow.progress)
    assert len(rejected) == len(hostile_rows())
    assert unchanged.settings_changes == 0 and unchanged.threshold == 5
    assert progress.settings_changes == len(accepted)
    assert stopped.stopping and stopped.throttle_policy is ThrottlePolicy.FIXED
    assert (result.outcome, result.replayed, result.remaining) == (Outcome.PAUSED, 0, 10)
