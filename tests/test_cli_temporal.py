"""The operator CLI against the dev server (search attributes registered) and a real redis-server:
``xmc resume --wait`` with progress and the no-consumer warning, the refusal of a second resume,
``xmc list`` from visibility, ``xmc status`` with the live run, ``xmc set`` and ``xmc stop`` through
the control Updates; and what the Temporal CLI's ``workflow start`` does while a resumption runs
(issue 7, item 5)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable

import pytest
from redis.asyncio import Redis
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from tests.support.helpers import (
    GROUP,
    ROOT,
    consume,
    fill_backlog,
    hold_tasks,
    resumption_worker,
    stream_tasks,
    throttled,
    wait_for,
)
from tests.test_cli import Ran, Xmc, one_line, xmc_fixture  # noqa: F401  (the fixture)
from xmc_resumption.client import XmcClient
from xmc_resumption.services import installed_binary

pytestmark = [pytest.mark.real_server, pytest.mark.slow]


def address(env: WorkflowEnvironment) -> str:
    return env.client.service_client.config.target_host


async def until(check: Callable[[], Ran], ok: Callable[[Ran], bool], timeout: float = 15) -> Ran:
    """Run ``check`` (an ``xmc`` command, on a thread) until ``ok`` holds; visibility lags a little."""
    deadline = time.monotonic() + timeout
    while True:
        ran = await asyncio.to_thread(check)
        if ok(ran) or time.monotonic() > deadline:
            return ran
        await asyncio.sleep(0.3)


async def test_resume_wait_completes_and_the_fleet_view_shows_it(
    temporal_env: WorkflowEnvironment, redis: Redis, redis_url: str, task_queue: str, xmc: Xmc
) -> None:
    experiment = f"L{uuid.uuid4().hex[:8]}"
    names = await hold_tasks(redis, experiment, 300)
    await redis.xgroup_create("xmc-tasks-stream", GROUP, id="0", mkstream=True)
    env = {"temporal": address(temporal_env), "XMC_TASK_QUEUE": task_queue}
    stop, seen = asyncio.Event(), []
    consumer = asyncio.create_task(consume(redis, "c1", stop, seen, per_read=50))
    try:
        async with resumption_worker(temporal_env.client, task_queue, redis_url):
            ran = await asyncio.to_thread(
                xmc,
                "resume",
                experiment,
                "--threshold",
                "100",
                "--throttle-seconds",
                "0.5",
                "--turns-per-run",
                "1",  # continues as new: the fleet view shows the chain once, by its newest run
                "--wait",
                "--json",
                **env,
            )
    finally:
        stop.set()
        await consumer
    assert (ran.returncode, ran.stderr) == (0, ""), ran
    doc = json.loads(ran.stdout)
    assert doc["workflow_id"] == f"resumption-{experiment}" and doc["input"]["max_backlog_threshold"] == 100
    assert (doc["result"]["outcome"], doc["result"]["replayed"], doc["result"]["remaining"]) == ("completed", 300, 0)
    assert doc["result"]["runs"] >= 2
    assert await stream_tasks(redis) == names

    def listed() -> Ran:
        return xmc("list", "--experiment", experiment, "--phase", "completed", "--json", **env)

    rows = json.loads((await until(listed, lambda r: '"remaining": 0' in r.stdout)).stdout)["resumptions"]
    assert len(rows) == 1
    row = rows[0]
    assert (row["experiment_id"], row["status"], row["phase"], row["outcome"]) == (
        experiment,
        "completed",
        "completed",
        "completed",
    )
    newest = (await temporal_env.client.get_workflow_handle(doc["workflow_id"]).describe()).run_id
    assert (row["replayed"], row["remaining"], row["run_id"]) == (300, 0, newest)
    assert newest != doc["run_id"]
    text = await asyncio.to_thread(xmc, "list", "--experiment", experiment, **env)
    assert text.stdout.split("\n")[1].split()[:9] == [
        f"resumption-{experiment}",
        "completed",
        experiment,
        "completed",
        "300",
        "-",  # redelivered: none
        "0",
        "-",  # no ETA: not running
        "completed",
    ]
    status = await asyncio.to_thread(xmc, "status", experiment, **env)
    assert f"resumption: resumption-{experiment} completed (run {newest}): phase completed" in status.stdout


def _read_lines(stream: object, lines: list[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        lines.append(line)


async def test_wait_warns_without_consumers_then_set_and_stop(
    temporal_env: WorkflowEnvironment, redis: Redis, redis_url: str, task_queue: str, xmc: Xmc
) -> None:
    experiment = f"W{uuid.uuid4().hex[:8]}"
    await hold_tasks(redis, experiment, 60)
    await fill_backlog(redis, 5)  # the group exists, no consumer ever reads: backlog 5 = the threshold
    env = {"temporal": address(temporal_env), "XMC_TASK_QUEUE": task_queue}
    proc_env = {
        "PATH": "/usr/bin:/bin",
        "XMC_REDIS_URL": redis_url,
        "TEMPORAL_ADDRESS": address(temporal_env),
        "XMC_TASK_QUEUE": task_queue,
    }
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        waiting = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "xmc_resumption",
                "resume",
                experiment,
                "--threshold",
                "5",
                "--throttle-seconds",
                "1",
                "--policy",
                "fixed",  # durable waits: the fleet view shows the run throttled
                "--wait",
            ],
            cwd=ROOT,
            env=proc_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        err_lines: list[str] = []
        reader = threading.Thread(target=_read_lines, args=(waiting.stderr, err_lines), daemon=True)
        reader.start()
        try:
            deadline = time.monotonic() + 30
            while not any("warning" in line for line in err_lines) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            warnings = [line for line in err_lines if "warning" in line]
            assert warnings == [
                f"xmc resume: warning: no consumer in group {GROUP} of xmc-tasks-stream: the backlog (5) stays at "
                f"the threshold (5) until one reads; start consumers, or xmc stop {experiment}\n"
            ], err_lines

            again = await asyncio.to_thread(xmc, "resume", experiment, **env)
            run_id = json.loads((await asyncio.to_thread(xmc, "status", experiment, "--json", **env)).stdout)["run"][
                "run_id"
            ]
            one_line(again, f"xmc resume: a resumption is already running: resumption-{experiment} (run {run_id})")

            def throttled() -> Ran:
                return xmc("list", "--running", "--phase", "throttled", "--json", **env)

            listed = await until(throttled, lambda r: experiment in r.stdout)
            rows = [r for r in json.loads(listed.stdout)["resumptions"] if r["experiment_id"] == experiment]
            assert [(r["status"], r["phase"], r["outcome"]) for r in rows] == [("running", "throttled", None)]

            status = json.loads((await asyncio.to_thread(xmc, "status", experiment, "--json", **env)).stdout)
            assert (status["state"], status["run"]["status"]) == ("resuming", "running")
            assert status["run"]["progress"]["phase"] == "throttled"
            assert status["run"]["progress"]["backlog"] == 5

            rejected = await asyncio.to_thread(xmc, "set", experiment, "--throttle-seconds", "500", **env)
            line = one_line(rejected, f"xmc set: resumption-{experiment} rejected the change: ")
            assert "claim_lease_seconds (120) must be longer than throttle_seconds (500)" in line
            changed = await asyncio.to_thread(
                xmc, "set", experiment, "--threshold", "8", "--batch", "2", "--json", **env
            )
            assert changed.returncode == 0, changed
            assert json.loads(changed.stdout) == {
                "max_backlog_threshold": 8,
                "batch_size": 2,
                "throttle_seconds": 1.0,
                "throttle_policy": "fixed",
                "stopping": False,
                "max_tasks_per_second": None,
            }
            stopped = await asyncio.to_thread(xmc, "stop", experiment, "--wait", "--json", **env)
            assert stopped.returncode == 0, stopped
            result = json.loads(stopped.stdout)["result"]
            assert (result["outcome"], result["replayed"], result["remaining"]) == ("paused", 3, 57)
            await asyncio.to_thread(waiting.wait, 30)  # stderr is the reader thread's alone
        finally:
            if waiting.poll() is None:
                waiting.kill()
                waiting.wait()
    reader.join(timeout=5)
    out = waiting.stdout.read()  # type: ignore[union-attr]
    assert waiting.returncode == 0, err_lines
    assert out.startswith(f"started resumption-{experiment} (run {run_id})\n")
    assert "outcome: paused; 3 replayed, 57 remaining" in out
    progress = [line for line in err_lines if line.startswith(f"resumption-{experiment}: ")]
    assert progress and "throttled: 0/60 replayed, remaining 60, backlog 5/5" in progress[0], err_lines
    assert (await redis.get(f"{{xmc-tasks-stream}}:experiment:{experiment}:state")) == b"paused"


def temporal_start(env: WorkflowEnvironment, task_queue: str, workflow_id: str, inp: dict[str, object], *flags: str):  # type: ignore[no-untyped-def]
    """``temporal workflow start`` of ``ResumptionWorkflow`` as the README shows it."""
    return subprocess.run(
        [
            installed_binary("temporal"),
            "workflow",
            "start",
            "--address",
            address(env),
            "--type",
            "ResumptionWorkflow",
            "--task-queue",
            task_queue,
            "--workflow-id",
            workflow_id,
            "--input",
            json.dumps(inp),
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp")},
    )


async def test_temporal_cli_start_while_one_runs_attaches_and_drops_the_input(
    temporal_env: WorkflowEnvironment, redis: Redis, task_queue: str, xmc: Xmc
) -> None:
    """What docs/operating.md says of the Temporal CLI (1.9.1): a second ``temporal workflow start`` of a
    running resumption prints the running run's ID and exits 0, with or without
    ``--id-conflict-policy Fail`` or ``--id-reuse-policy RejectDuplicate``; the new input is
    dropped. ``xmc resume`` refuses instead. No worker polls the task queue, so the run stays open."""
    experiment = f"T{uuid.uuid4().hex[:8]}"
    workflow_id = f"resumption-{experiment}"
    first = temporal_start(temporal_env, task_queue, workflow_id, {"experiment_id": experiment})
    assert first.returncode == 0, first.stderr
    run_id = re.search(r"RunId\s+(\S+)", first.stdout).group(1)  # type: ignore[union-attr]
    handle = temporal_env.client.get_workflow_handle(workflow_id)
    try:
        for flags in ([], ["--id-conflict-policy", "Fail"], ["--id-reuse-policy", "RejectDuplicate"]):
            second = temporal_start(
                temporal_env, task_queue, workflow_id, {"experiment_id": experiment, "batch_size": 7}, *flags
            )
            assert (second.returncode, second.stderr) == (0, ""), (flags, second.stderr)
            assert re.search(r"RunId\s+(\S+)", second.stdout).group(1) == run_id, (flags, second.stdout)  # type: ignore[union-attr]
        runs = [w async for w in temporal_env.client.list_workflows(f"WorkflowId = '{workflow_id}'")]
        assert [(w.run_id, w.status) for w in runs] == [(run_id, WorkflowExecutionStatus.RUNNING)]
        history = await handle.fetch_history()
        started = history.events[0].workflow_execution_started_event_attributes
        assert json.loads(started.input.payloads[0].data) == {"experiment_id": experiment}  # batch_size 7 dropped

        await hold_tasks(redis, experiment, 1)
        env = {"temporal": address(temporal_env), "XMC_TASK_QUEUE": task_queue}
        listed = await asyncio.to_thread(xmc, "list", "--running", "--experiment", experiment, "--json", **env)
        rows = json.loads(listed.stdout)["resumptions"]
        assert [(r["workflow_id"], r["run_id"], r["status"], r["phase"]) for r in rows] == [
            (workflow_id, run_id, "running", None)  # no worker ran it: no search attribute set yet
        ]
        refused = await asyncio.to_thread(xmc, "resume", experiment, "--batch", "7", **env)
        one_line(refused, f"xmc resume: a resumption is already running: {workflow_id} (run {run_id})")
        no_worker = await asyncio.to_thread(xmc, "stop", experiment, "--timeout", "1", **env)
        one_line(no_worker, f"xmc stop: no worker answered the pause Update of {workflow_id} within 1s")
    finally:
        await handle.terminate()


async def test_wait_warns_when_no_worker_answers_and_ctrl_c_leaves_the_run(
    temporal_env: WorkflowEnvironment, redis: Redis, redis_url: str, task_queue: str
) -> None:
    """No worker polls the task queue: ``--wait`` says so after 10 s instead of waiting silently;
    Ctrl-C ends the command with 130 and says the run goes on."""
    experiment = f"N{uuid.uuid4().hex[:8]}"
    await hold_tasks(redis, experiment, 1)
    waiting = subprocess.Popen(
        [sys.executable, "-m", "xmc_resumption", "resume", experiment, "--wait"],
        cwd=ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "XMC_REDIS_URL": redis_url,
            "TEMPORAL_ADDRESS": address(temporal_env),
            "XMC_TASK_QUEUE": task_queue,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    err_lines: list[str] = []
    reader = threading.Thread(target=_read_lines, args=(waiting.stderr, err_lines), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120  # the warning comes 10 s after the start: bounded for a loaded machine
        while not err_lines and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        waiting.send_signal(signal.SIGINT)
        await asyncio.to_thread(waiting.wait, 60)  # stderr is the reader thread's alone
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()
        await temporal_env.client.get_workflow_handle(f"resumption-{experiment}").terminate()
    reader.join(timeout=5)
    out = waiting.stdout.read()  # type: ignore[union-attr]
    assert waiting.returncode == 130, err_lines
    assert out.startswith(f"started resumption-{experiment} (run ")
    assert err_lines == [
        f"xmc resume: warning: no worker has answered resumption-{experiment}'s progress query for 10s: is a "
        f"worker polling task queue {task_queue}?\n",
        f"xmc resume: interrupted; resumption-{experiment} keeps running (xmc stop {experiment} stops it)\n",
    ]


async def _started(client: Client, experiment: str, timeout: float = 20) -> None:
    """Wait until ``resumption-<experiment>`` exists."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await client.get_workflow_handle(f"resumption-{experiment}").describe()
            return
        except RPCError as err:
            if err.status is not RPCStatusCode.NOT_FOUND or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.1)


async def _terminate(client: Client, *experiments: str) -> None:
    for e in experiments:
        with contextlib.suppress(RPCError):  # not started, or ended already
            await client.get_workflow_handle(f"resumption-{e}").terminate("test over")


async def test_resume_starts_several_experiments_each_checked(
    temporal_env: WorkflowEnvironment, redis: Redis, task_queue: str, xmc: Xmc
) -> None:
    """``xmc resume E1 E2``: one line per started run, on the ``--task-queue`` given (else
    ``XMC_TASK_QUEUE``); a refusal of one starts none; one already running is reported (exit 2)
    after the others started. No worker polls: the runs stay open."""
    tag = uuid.uuid4().hex[:6]
    r1, r2, r3, r4, idle = (f"M{tag}-{i}" for i in range(5))
    for e in (r1, r2, r3, r4):
        await hold_tasks(redis, e, 2)
    env = {"temporal": address(temporal_env), "XMC_TASK_QUEUE": task_queue}
    try:
        ran = await asyncio.to_thread(xmc, "resume", r1, r2, "--task-queue", f"{task_queue}-x", "--batch", "9", **env)
        assert (ran.returncode, ran.stderr) == (0, ""), ran
        lines = ran.stdout.splitlines()
        assert [line.split(" (run ")[0] for line in lines] == [f"started resumption-{r1}", f"started resumption-{r2}"]
        for e, line in zip((r1, r2), lines, strict=True):
            desc = await temporal_env.client.get_workflow_handle(f"resumption-{e}").describe()
            assert (desc.task_queue, desc.run_id) == (f"{task_queue}-x", line.split(" (run ")[1].rstrip(")"))

        refused = await asyncio.to_thread(xmc, "resume", r3, idle, **env)
        one_line(
            refused,
            f"xmc resume: experiment {idle} has no key on xmc-tasks-stream (never paused here: a typo, or another "
            "--stream?): nothing to resume "
            "(--force starts the workflow anyway)",
        )
        with pytest.raises(RPCError):  # the refusal of one started none
            await temporal_env.client.get_workflow_handle(f"resumption-{r3}").describe()

        partial = await asyncio.to_thread(xmc, "resume", r1, r3, "--json", **env)
        assert partial.returncode == 2 and len(partial.stderr.splitlines()) == 1, partial
        assert [d["workflow_id"] for d in json.loads(partial.stdout)["resumptions"]] == [f"resumption-{r3}"]
        assert partial.stderr.startswith(
            f"xmc resume: 1 of 2 resumptions started; {r1}: a resumption is already running: resumption-{r1} (run "
        ), partial.stderr

        single = await asyncio.to_thread(xmc, "resume", r4, "--json", **env)
        doc = json.loads(single.stdout)  # one experiment: the document of one run, as before
        assert (doc["workflow_id"], doc["input"]["experiment_id"]) == (f"resumption-{r4}", r4)
        desc = await temporal_env.client.get_workflow_handle(f"resumption-{r4}").describe()
        assert desc.task_queue == task_queue  # XMC_TASK_QUEUE
        shown = " ".join((await asyncio.to_thread(xmc, "resume", "--help")).stdout.split())
        assert "EXPERIMENT_ID..." in shown and "--task-queue TASK-QUEUE the task queue the workers poll" in shown
        assert "[default: (XMC_TASK_QUEUE, else xmc-resumption)]" in shown
    finally:
        await _terminate(temporal_env.client, r1, r2, r3, r4)


async def test_resume_wait_follows_several_runs_and_exits_1_when_one_ends_without_a_result(
    temporal_env: WorkflowEnvironment, redis: Redis, redis_url: str, task_queue: str, xmc: Xmc
) -> None:
    tag = uuid.uuid4().hex[:6]
    first, second = f"V{tag}-1", f"V{tag}-2"
    for e in (first, second):
        await hold_tasks(redis, e, 10)
    await fill_backlog(redis, 5)  # no consumer reads: both runs throttle at threshold 5
    env = {"temporal": address(temporal_env), "XMC_TASK_QUEUE": task_queue}
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        waiting = asyncio.create_task(
            asyncio.to_thread(
                xmc, "resume", first, second, "--threshold", "5", "--throttle-seconds", "1", "--wait", "--json", **env
            )
        )
        try:
            for e in (first, second):
                await _started(temporal_env.client, e)
                await wait_for(temporal_env.client.get_workflow_handle(f"resumption-{e}"), throttled)
            await temporal_env.client.get_workflow_handle(f"resumption-{first}").terminate("gone")
            # not with xmc stop: the xmc fixture captures one command's output at a time
            assert (await XmcClient(redis, temporal_env.client).stop(second)).settings.stopping
            ran = await asyncio.wait_for(waiting, 60)
        finally:
            await _terminate(temporal_env.client, first, second)
    assert ran.returncode == 1, ran
    runs = json.loads(ran.stdout)["resumptions"]
    assert [r["workflow_id"] for r in runs] == [f"resumption-{first}", f"resumption-{second}"]
    assert "result" not in runs[0] and runs[1]["result"]["outcome"] == "paused"
    failed = [line for line in ran.stderr.splitlines() if "warning" not in line]
    assert failed == [f"xmc resume: resumption-{first} failed: TerminatedError: terminated by user via frontend"], (
        ran.stderr
    )
