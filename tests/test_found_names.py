"""Issue 26, rows 1 and 2: names found in Redis are data, not operator input.

Another team's consumer groups and consumers on the shared task stream may bear any name Redis
accepts: blanks, braces, non-ASCII letters, a line break, no character at all, bytes that are no
UTF-8. ``xmc status`` (text and JSON), ``xmc plan``, ``xmc resume --dry-run``, the
``idle_consumers`` activity and a stalled run each take them, and show each on one line
(``redisclient.text.show_name``) while JSON keeps the name itself. The operator's own names (E, S,
G) keep their rule: tests/test_names.py."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from redis.asyncio import Redis
from temporalio.client import WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from tests.support.helpers import GROUP, STREAM, hold_tasks, resumption_worker, run_module, wait_for
from tests.test_cli import Xmc, xmc_fixture  # noqa: F401  (the fixture)
from xmc_resumption.activities.requests import ExperimentRef, IdleConsumersRequest
from xmc_resumption.activities.resumption import ResumptionActivities
from xmc_resumption.redisclient import fencing
from xmc_resumption.redisclient.backlog import measure_backlog
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.redisclient.publish import PublishParams, publish_batch
from xmc_resumption.redisclient.results import PublishStatus
from xmc_resumption.workflows.text import details_markdown

AUDIT, BRACES, UMLAUT, EMPTY = "audit team", "grp{1}", "ümlaut", ""
NOT_UTF8 = b"bin\xff"
"""A group whose name is no UTF-8: its text is ``bin\\xff`` (``keys.as_text``)."""
DEAD = "dead\nline"
"""A consumer whose name holds a line break."""

FOUND = [AUDIT, BRACES, UMLAUT, EMPTY, "bin\\xff"]
SHOWN = {GROUP: GROUP, AUDIT: '"audit team"', BRACES: BRACES, UMLAUT: UMLAUT, EMPTY: '""', "bin\\xff": '"bin\\\\xff"'}
"""How ``show_name`` shows each (spelled out, so this file imports nothing the code before the issue lacks)."""


async def foreign_groups(redis: Redis) -> None:
    """The replay's group and five of another team's, each 6 entries behind; ``DEAD`` in ``grp{1}``
    read 4 of them and holds them (pending), as does ``c1`` in the group that is no UTF-8 (1)."""
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    for name in (AUDIT, BRACES, UMLAUT, EMPTY, NOT_UTF8):
        await redis.xgroup_create(STREAM, name, id="$")
    for i in range(6):
        await redis.xadd(STREAM, {"task": f"other-{i}"})
    await redis.xreadgroup(BRACES, DEAD, {STREAM: ">"}, count=4)
    await redis.xreadgroup(NOT_UTF8, "c1", {STREAM: ">"}, count=1)


async def until_started(handle: WorkflowHandle) -> None:
    """Until the workflow ``handle`` names exists (started by another process), at most 30 s."""
    for _ in range(300):
        try:
            await handle.describe()
            return
        except RPCError as err:
            if err.status is not RPCStatusCode.NOT_FOUND:
                raise
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{handle.id} did not start")


def test_a_found_name_is_shown_on_one_line() -> None:
    from xmc_resumption.redisclient.text import show_name

    assert {name: show_name(name) for name in SHOWN} == SHOWN
    assert [show_name(n) for n in (GROUP, BRACES, UMLAUT)] == [GROUP, BRACES, UMLAUT]
    assert [show_name(n) for n in (AUDIT, DEAD, EMPTY, "bin\\xff", "a\u202eb", 'q"')] == [
        '"audit team"', '"dead\\nline"', '""', '"bin\\\\xff"', '"a\\u202eb"', '"q\\""'
    ]  # fmt: skip
    long = show_name("x\n" * 500)
    assert long.endswith('..." (1000 characters)') and len(long) <= 80 + 30 and "\n" not in long


async def test_status_shows_every_found_name_escaped_and_json_keeps_it(redis: Redis, xmc: Xmc) -> None:
    e = f"N{uuid.uuid4().hex[:6]}"
    await hold_tasks(redis, e, 3)
    await foreign_groups(redis)
    text = await asyncio.to_thread(xmc, "status", e, "--idle-seconds", "0")
    doc = await asyncio.to_thread(xmc, "status", e, "--idle-seconds", "0", "--json")
    assert (text.returncode, text.stderr) == (0, ""), text
    lines = text.stdout.splitlines()
    assert lines[0].startswith(f"{e} on {STREAM}: paused") and all(line.startswith("  ") for line in lines[1:])
    for name in (GROUP, AUDIT, UMLAUT, EMPTY):
        shown = f"    group {SHOWN[name]}: 0 pending + 6 undelivered"
        # the replay's own group always bounds it; the others have no consumer, so they are named, not waited for
        assert shown + ("" if name == GROUP else "; no consumer: not waited for") in lines, name
    assert f"    group {BRACES}: 4 pending + 2 undelivered" in lines
    assert '    group "bin\\\\xff": 1 pending + 5 undelivered' in lines
    idle = next(line for line in lines if line.startswith("  idle consumers holding pending entries: "))
    assert f'{BRACES}/"dead\\nline" holds 4, idle ' in idle and '"bin\\\\xff"/c1 holds 1, idle ' in idle
    assert doc.returncode == 0, doc
    status = json.loads(doc.stdout)
    assert {g["name"] for g in status["backlog"]["groups"]} == {GROUP, *FOUND}
    assert [(c["group"], c["consumer"], c["pending"]) for c in status["idle_consumers"]] == [
        (BRACES, DEAD, 4),
        ("bin\\xff", "c1", 1),
    ]


async def test_plan_and_a_dry_run_take_every_found_name(redis: Redis, xmc: Xmc) -> None:
    e = f"N{uuid.uuid4().hex[:6]}"
    await hold_tasks(redis, e, 3)
    await foreign_groups(redis)
    doc = await asyncio.to_thread(xmc, "plan", e, "--sample-seconds", "0.3", "--json")
    text = await asyncio.to_thread(xmc, "plan", e, "--sample-seconds", "0")
    dry = await asyncio.to_thread(xmc, "resume", e, "--dry-run", "--sample-seconds", "0")
    assert (doc.returncode, doc.stderr) == (0, ""), doc
    groups = {g["group"]: (g["pending"], g["lag"], g["backlog"]) for g in json.loads(doc.stdout)["groups"]}
    assert groups == {BRACES: (4, 2, 6), "bin\\xff": (1, 5, 6), **{n: (0, 6, 6) for n in (GROUP, AUDIT, UMLAUT, EMPTY)}}
    for ran in (text, dry):
        assert (ran.returncode, ran.stderr) == (0, ""), ran
        lines = ran.stdout.splitlines()
        assert all(line.startswith("  ") for line in lines[1:]), ran.stdout
        for name in FOUND:
            assert any(line.startswith(f"  group {SHOWN[name]}: ") for line in lines), (name, ran.stdout)
        assert lines[-1] == "  xmc resume would start; nothing was written"


async def test_a_group_whose_name_is_no_utf8_bounds_the_replay_like_any_other(redis: Redis) -> None:
    """The measure and publish scripts pass such a name through their JSON replies as it is (before:
    ``json.loads`` refused the reply, so every measure and publish of the stream failed)."""
    keys = ExperimentKeys(STREAM, "N2")
    await hold_tasks(redis, keys.experiment_id, 5)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    await redis.xgroup_create(STREAM, NOT_UTF8, id="$")
    await redis.execute_command(
        "XGROUP", "CREATECONSUMER", STREAM, NOT_UTF8, "c"
    )  # a group no consumer reads is not waited for
    other = await redis.xadd(STREAM, {"task": "other"})
    reading = await measure_backlog(redis, STREAM, GROUP, 10)
    assert [(g.name, g.lag) for g in reading.groups] == [(GROUP, 1), ("bin\\xff", 1)]
    await redis.xreadgroup(GROUP, "c1", {STREAM: ">"})
    await redis.xack(STREAM, GROUP, other)  # the replay's group drained it: the other one bounds the replay
    token = (await fencing.acquire_claim(redis, keys, "me", 60_000)).token
    params = PublishParams(token=token, seq=1, batch_size=3, threshold=3, owner="me", lease_ms=60_000)
    result = await publish_batch(redis, keys, GROUP, params)
    assert (result.status, result.moved, result.reading.limiting_group) == (PublishStatus.PUBLISHED, 2, "bin\\xff")


async def test_the_idle_consumers_activity_takes_any_group(redis: Redis) -> None:
    """The activity a stalled run calls, with the limiting group found in Redis (before: refused,
    non-retryable, by the operator's name rule)."""
    await foreign_groups(redis)
    ref = ExperimentRef(experiment_id="N1", stream=STREAM, consumer_group=GROUP)
    request = IdleConsumersRequest(ref=ref, groups=[BRACES, "bin\\xff", AUDIT, "gone"], min_idle_ms=0)
    found = await ActivityEnvironment().run(ResumptionActivities(redis).idle_consumers, request)
    assert [(c.group, c.consumer, c.pending) for c in found] == [(BRACES, DEAD, 4), ("bin\\xff", "c1", 1)]
    assert found[0].describe().startswith('grp{1}/"dead\\nline" holds 4 pending, idle ')


@pytest.mark.real_server
@pytest.mark.slow
async def test_a_stall_names_an_idle_consumer_of_any_group_on_one_line(
    temporal_env: WorkflowEnvironment, redis: Redis, redis_url: str, task_queue: str
) -> None:
    """Another team's group ``audit team`` holds the replay back: its consumer ``dead\\nline`` read
    the 4 entries that fill the threshold and died. The stall names it, on one line, in the
    progress, the UI's details, ``xmc status`` and the result (before: the activity refused the
    group's name, so nobody was named; and a named consumer's line break split the reason)."""
    e = f"N{uuid.uuid4().hex[:6]}"
    await hold_tasks(redis, e, 10)
    await redis.xgroup_create(STREAM, AUDIT, id="$", mkstream=True)
    for i in range(4):
        await redis.xadd(STREAM, {"task": f"other-{i}"})
    await redis.xgroup_create(STREAM, GROUP, id="$")
    await redis.xreadgroup(AUDIT, DEAD, {STREAM: ">"}, count=4)
    env = {
        "XMC_REDIS_URL": redis_url,
        "XMC_TASK_QUEUE": task_queue,
        "TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
    }
    inputs = ["--threshold", "4", "--throttle-seconds", "1", "--stall-window-seconds", "2", "--max-stall-seconds", "60"]
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        # xmc resume --wait follows the run in its own process; the test stops it once the stall is named
        resumed = asyncio.create_task(
            asyncio.to_thread(run_module, "xmc_resumption", "resume", e, *inputs, "--wait", timeout=90, **env)
        )
        handle = temporal_env.client.get_workflow_handle(f"resumption-{e}")
        await until_started(handle)
        progress = await wait_for(handle, lambda p: p.stalled and bool(p.idle_consumers), timeout=30)
        status = await asyncio.to_thread(run_module, "xmc_resumption", "status", e, "--idle-seconds", "1", **env)
        await handle.execute_update("pause")
        resume = await resumed
    assert [(c.group, c.consumer, c.pending) for c in progress.idle_consumers] == [(AUDIT, DEAD, 4)]
    reason = progress.stall_reason
    assert reason is not None and "\n" not in reason
    assert reason.startswith('backlog 4 of group "audit team" (pending 4) not going down')
    assert 'pending entries held by idle consumers: "audit team"/"dead\\nline" holds 4 pending, idle ' in reason
    assert '- backlog: 4 / threshold 4 (group `"audit team"`)' in details_markdown(progress)
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert all(line.startswith("  ") for line in lines[1:]), status.stdout
    assert "STALLED" in status.stdout and '"audit team"/"dead\\nline" holds 4' in status.stdout
    assert resume.returncode == 0, resume.stderr
    warnings = [line for line in resume.stderr.splitlines() if line.startswith("xmc resume: warning: ")]
    assert warnings[0].startswith(
        'xmc resume: warning: no consumer is draining "audit team": backlog 4 of group "audit team"'
    )
    assert f"; start consumers, or xmc stop {e}" in warnings[0]
    assert resume.stdout.splitlines()[-1].startswith("outcome: paused; 0 replayed, 10 remaining"), resume.stdout
