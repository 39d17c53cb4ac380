"""The fleet view and live control on the dev server (real visibility, real Update handling): a
throttled resumption is found by ``XmcPhase`` from the Temporal CLI, an Update typed at the
Temporal CLI changes its threshold mid-run, a rejected Update leaves nothing in the history, and a
worker refuses a namespace that lacks the search attributes."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError

from tests.support.helpers import (
    ROOT,
    bare_namespace,
    fill_backlog,
    hold_tasks,
    resumption_worker,
    run_module,
    start,
    stream_tasks,
    throttled,
    wait_for,
)
from xmc_resumption import search_attributes
from xmc_resumption.services import installed_binary
from xmc_resumption.workflows import fleet
from xmc_resumption.workflows.models import START_BATCH_SIZE, Outcome, Phase
from xmc_resumption.workflows.resumption import ResumptionWorkflow

pytestmark = [pytest.mark.real_server, pytest.mark.slow]


def temporal(env, *args: str) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    """``temporal ARGS`` against the test's dev server, as an operator types it."""
    address = env.client.service_client.config.target_host
    return subprocess.run(
        [installed_binary("temporal"), *args, "--address", address], capture_output=True, text=True, timeout=30
    )


async def listed(env, query: str, timeout: float = 15) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """``temporal workflow list --query QUERY -o json`` until it lists something (visibility is
    eventually consistent); the workflows it lists."""
    deadline = time.monotonic() + timeout
    while True:
        # in a thread: the test's worker runs on this event loop
        out = await asyncio.to_thread(temporal, env, "workflow", "list", "--query", query, "-o", "json")
        assert out.returncode == 0, out.stderr
        rows = json.loads(out.stdout or "[]")
        if rows or time.monotonic() > deadline:
            return list(rows)
        await asyncio.sleep(0.2)


def attributes(row: dict[str, Any]) -> dict[str, Any]:
    """A listed workflow's custom search attributes, decoded: name -> value."""
    fields = row["searchAttributes"]["indexedFields"]
    return {name: json.loads(base64.b64decode(p["data"])) for name, p in fields.items()}


TIMER_EVENTS = {
    EventType.EVENT_TYPE_TIMER_STARTED,
    EventType.EVENT_TYPE_TIMER_FIRED,
    EventType.EVENT_TYPE_TIMER_CANCELED,
}


async def test_a_throttled_resumption_is_found_by_its_phase_and_an_update_raises_its_threshold(
    temporal_env, redis, redis_url, task_queue
) -> None:
    e = f"E{uuid.uuid4().hex[:6]}"
    names = await hold_tasks(redis, e, 10)
    await fill_backlog(redis, 5)
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(
            temporal_env.client,
            task_queue,
            experiment_id=e,
            max_backlog_threshold=5,
            throttle_seconds=60,
            throttle_policy="fixed",
        )
        await wait_for(handle, throttled)
        rows = await listed(temporal_env, f'XmcPhase="throttled" AND XmcExperimentId="{e}"')
        assert [r["execution"]["workflowId"] for r in rows] == [f"resumption-{e}"]
        found = attributes(rows[0])
        assert {k: found[k] for k in ("XmcPhase", "XmcStream", "XmcReplayed", "XmcRemaining")} == {
            "XmcPhase": "throttled",
            "XmcStream": "xmc-tasks-stream",
            "XmcReplayed": 0,
            "XmcRemaining": 10,
        }
        # the operator raises the threshold from the Temporal CLI: the 60 s wait ends at once
        updated = await asyncio.to_thread(
            temporal,
            temporal_env, "workflow", "update", "execute", "--workflow-id", f"resumption-{e}",
            "--name", "set_threshold", "--input", "15", "-o", "json",
        )  # fmt: skip
        assert updated.returncode == 0, updated.stderr
        result = await asyncio.wait_for(handle.result(), 30)
        timers = [e.event_type for e in (await handle.fetch_history()).events if e.event_type in TIMER_EVENTS]
    assert json.loads(updated.stdout)["result"] == {
        "max_backlog_threshold": 15,
        "batch_size": START_BATCH_SIZE,  # the input left it out: automatic, and nothing has moved yet
        "throttle_seconds": 60.0,
        "throttle_policy": "fixed",
        "stopping": False,
        "max_tasks_per_second": None,
    }
    # the Update ended the 60 s wait: its timer was cancelled, never fired
    assert timers == [EventType.EVENT_TYPE_TIMER_STARTED, EventType.EVENT_TYPE_TIMER_CANCELED]
    assert (result.outcome, result.replayed) == (Outcome.COMPLETED, 10)
    assert (await stream_tasks(redis))[5:] == names
    done = await listed(temporal_env, f'XmcOutcome="completed" AND XmcExperimentId="{e}"')
    assert {k: attributes(done[0])[k] for k in ("XmcPhase", "XmcReplayed", "XmcRemaining")} == {
        "XmcPhase": "completed",
        "XmcReplayed": 10,
        "XmcRemaining": 0,
    }


async def settled_history(handle: Any) -> list[Any]:
    """The run's events once its throttle timer has started and two readings 0.2 s apart agree (bounded: 20 s)."""
    events: list[Any] = []
    for _ in range(100):
        now = list((await handle.fetch_history()).events)
        started = any(e.event_type == EventType.EVENT_TYPE_TIMER_STARTED for e in now)
        if started and len(now) == len(events):
            return now
        events = now
        await asyncio.sleep(0.2)
    raise AssertionError(f"the history did not settle: {len(events)} events")


WORKFLOW_TASK_EVENTS = {
    EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
    EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT,
}
"""What the server may write for a speculative workflow task that it had to keep (one not completed within its
schedule-to-start timeout on a busy machine is written as a normal one): no Update, no command."""


async def test_a_rejected_update_leaves_nothing_in_the_history(temporal_env, redis, redis_url, task_queue) -> None:
    """On a real server the validator runs in a speculative workflow task: a rejection adds no event,
    whether the Update came from the SDK or the Temporal CLI."""
    e = f"E{uuid.uuid4().hex[:6]}"
    await hold_tasks(redis, e, 10)
    await fill_backlog(redis, 5)
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(
            temporal_env.client,
            task_queue,
            experiment_id=e,
            max_backlog_threshold=5,
            throttle_seconds=60,
            throttle_policy="fixed",
        )
        await wait_for(handle, throttled)
        before = await settled_history(handle)  # the 60 s timer started, nothing else to come before it fires
        with pytest.raises(WorkflowUpdateFailedError) as raised:
            await handle.execute_update(ResumptionWorkflow.set_throttle_seconds, 600.0)
        # typed at the Temporal CLI: JSON true is no threshold (it was taken as 1 once)
        typed = await asyncio.to_thread(
            temporal,
            temporal_env, "workflow", "update", "execute", "--workflow-id", f"resumption-{e}",
            "--name", "set_threshold", "--input", "true",
        )  # fmt: skip
        after = await settled_history(handle)
        progress = await handle.query(ResumptionWorkflow.progress)
        await handle.cancel()
    assert "claim_lease_seconds" in str(raised.value.cause)
    assert typed.returncode != 0
    assert "set_threshold: max_backlog_threshold: Input should be a valid integer (got a bool)" in typed.stderr
    assert (progress.threshold, progress.settings_changes) == (5, 0)
    # the history as it was, but for workflow task events the server may have had to keep: no Update event
    assert after[: len(before)] == before
    assert {e.event_type for e in after[len(before) :]} <= WORKFLOW_TASK_EVENTS, [e.event_type for e in after]


async def test_the_worker_refuses_a_namespace_without_the_search_attributes(temporal_env, tmp_path) -> None:
    client = temporal_env.client
    bare = await bare_namespace(client)
    namespace = bare.namespace
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "TEMPORAL_NAMESPACE": namespace,
        "XMC_REDIS_URL": "redis://127.0.0.1:1/0",
    }
    run = subprocess.run(
        [sys.executable, "-m", "worker"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2
    lines = [line for line in run.stderr.splitlines() if line.startswith("worker:")]
    assert len(lines) == 1 and "Traceback" not in run.stderr
    assert f"namespace {namespace} lacks the search attributes XmcExperimentId, XmcStream" in lines[0]
    command = f"temporal operator search-attribute create --namespace {namespace} --name XmcPhase --type Keyword"
    assert command in lines[0]
    # registering them (what the dev servers of the demo and the tests do at start) is enough
    await search_attributes.register(bare)
    assert await search_attributes.missing_on(bare) == []


async def test_a_failed_run_shows_failed_in_the_fleet_view(temporal_env, redis, redis_url, task_queue) -> None:
    """A fault retrying cannot mend (``missing_group: error`` and no group): the run fails, hands the
    experiment back as paused, and visibility says so, not ``replaying`` for ever."""
    e = f"E{uuid.uuid4().hex[:6]}"
    await hold_tasks(redis, e, 3)
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(temporal_env.client, task_queue, experiment_id=e, missing_group="error")
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), 30)
    rows = await listed(temporal_env, f'XmcPhase="failed" AND XmcOutcome="failed" AND XmcExperimentId="{e}"')
    assert [r["execution"]["workflowId"] for r in rows] == [f"resumption-{e}"]
    assert attributes(rows[0])["XmcRemaining"] == 3
    # and xmc list finds it by that phase (its choices once left "failed" out)
    address = temporal_env.client.service_client.config.target_host
    xmc = await asyncio.to_thread(
        run_module, "xmc_resumption", "list", "--phase", "failed", "--experiment", e, "--json",
        TEMPORAL_ADDRESS=address, XMC_REDIS_URL=redis_url,
    )  # fmt: skip
    assert xmc.returncode == 0, xmc.stderr
    found = json.loads(xmc.stdout)["resumptions"]
    assert [(r["workflow_id"], r["phase"], r["status"]) for r in found] == [(f"resumption-{e}", "failed", "failed")]


def test_xmc_list_takes_every_phase_the_workflow_sets() -> None:
    """``xmc list --phase`` takes its choices from ``phase_values``: every value ``fleet_phase``
    returns must be among them (``failed`` was left out once, so a failed run could not be listed
    by its phase), and nothing else."""
    from datetime import UTC, datetime

    from xmc_resumption.cli import cli
    from xmc_resumption.workflows.models import Progress

    seen = set()
    for phase in Phase:
        for outcome in [None, *Outcome]:
            for failed in (False, True):
                for stopping in (False, True):
                    for until in (None, datetime(2026, 1, 1, tzinfo=UTC)):
                        p = Progress(
                            experiment_id="E", threshold=5, phase=phase, outcome=outcome, throttled_until=until
                        )
                        seen.add(fleet.fleet_phase(p, failed=failed, stopping=stopping))
    assert seen == set(fleet.phase_values())
    choices = next(p for p in cli.commands["list"].params if p.name == "phase").type.choices  # type: ignore[attr-defined]
    assert list(choices) == fleet.phase_values()
