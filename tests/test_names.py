"""Issue 9, item 4: names that become Redis keys (experiment IDs, streams) or reach XINFO, logs and
the UI (consumer groups) follow one rule (``redisclient.keys.validate_name``), and every entry point
refuses a hostile name the same way, before anything reaches Redis: the workflow input, the
activities' ``ExperimentRef``, the CLI's arguments and the producers' enqueue."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from xmc_resumption.activities.requests import AcquireRequest, DrainWaitRequest, ExperimentRef
from xmc_resumption.activities.resumption import ResumptionActivities
from xmc_resumption.cli import EXPERIMENT_ID, GROUP_NAME, STREAM_NAME, main
from xmc_resumption.redisclient import held
from xmc_resumption.redisclient.keys import DEFAULT_GROUP, DEFAULT_STREAM, ExperimentKeys, validate_name
from xmc_resumption.workflows.models import ResumptionInput

HOSTILE = ["*", "E?", "E[1]", "E]", "{E}", "E}", "E{", "E 1", "E\t1", "E\n", "\n", "", "x" * 201, "E\\1", "E\x00"]
"""Glob characters (a key pattern), braces (the ``{S}`` hash tag), whitespace and line breaks
(a log line), empty, too long, a backslash, a NUL."""

FIELDS = ("experiment_id", "stream", "consumer_group")
LENGTH = re.compile(r"String should have at (least 1 character|most 200 characters)")


def good(field: str, value: str) -> dict[str, str]:
    """Valid names, with ``field`` set to ``value``."""
    return {"experiment_id": "E1", "stream": DEFAULT_STREAM, "consumer_group": DEFAULT_GROUP, field: value}


async def workflow_input(field: str, value: str, redis: Redis) -> str:
    with pytest.raises(ValidationError) as err:
        ResumptionInput(**good(field, value))
    return str(err.value)


async def activity(field: str, value: str, redis: Redis) -> str:
    """Both kinds of activity: with the experiment's keys (acquire) and the backlog's (measure)."""
    ref = ExperimentRef.model_construct(**good(field, value))  # as a bad workflow could send it
    acts, messages = ResumptionActivities(redis), []
    for call, req in (
        (acts.acquire_claim, AcquireRequest.model_construct(ref=ref, owner="o", lease_ms=1000, request_id="r")),
        (acts.wait_for_drain, DrainWaitRequest.model_construct(ref=ref, threshold=5)),
    ):
        with pytest.raises(ApplicationError) as err:
            await ActivityEnvironment().run(call, req)  # type: ignore[arg-type]
        assert (err.value.type, err.value.non_retryable) == ("InvalidArgument", True)
        messages.append(str(err.value))
    assert messages[0] == messages[1]
    return messages[0]


async def cli(field: str, value: str, redis: Redis) -> str:
    args = {"experiment_id": [value], "stream": ["E1", "--stream", value], "consumer_group": ["E1", "--group", value]}
    for command in ("status", "resume"):
        assert main([command, *args[field]]) == 2
    return "refused by the CLI"  # the message is read from stderr by the test


async def producer(field: str, value: str, redis: Redis) -> str:
    names = good(field, value)
    with pytest.raises(ValueError) as err:
        await held.enqueue_task(redis, ExperimentKeys(names["stream"], names["experiment_id"]), {"task": "t"})
    return str(err.value)


ENTRY_POINTS: dict[str, tuple[Callable[[str, str, Redis], Awaitable[str]], tuple[str, ...]]] = {
    "workflow input": (workflow_input, FIELDS),
    "activity": (activity, FIELDS),
    "cli": (cli, FIELDS),
    "producer": (producer, ("experiment_id", "stream")),  # a producer names no group
}


@pytest.mark.parametrize(
    "entry", [pytest.param(e, marks=pytest.mark.slow) if e == "cli" else e for e in ENTRY_POINTS]
)  # the CLI: one command per name, seconds in all
async def test_hostile_names_are_refused_everywhere(
    entry: str, redis: Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    check, fields = ENTRY_POINTS[entry]
    for field in fields:
        for value in HOSTILE:
            with pytest.raises(ValueError) as rule:
                validate_name(field, value)
            message = await check(field, value, redis)
            if entry == "cli":
                message = capsys.readouterr().err
            where = f"{entry}, {field}={value!r}: {message}"
            # the one rule's own words, or pydantic's length check that the input model adds
            assert str(rule.value).split(" (", 1)[1] in message or LENGTH.search(message), where
            assert field in message or field.replace("_", " ") in message, where
    assert await redis.dbsize() == 0  # nothing reached Redis


@pytest.mark.parametrize("value", ["E1", "exp-2026.11/run:3@host+x=y", "x" * 200])
def test_good_names_pass_every_check(value: str) -> None:
    assert validate_name("experiment_id", value) == value
    assert ResumptionInput(experiment_id=value, stream=value, consumer_group=value).consumer_group == value
    assert [t.convert(value, None, None) for t in (EXPERIMENT_ID, STREAM_NAME, GROUP_NAME)] == [value] * 3
