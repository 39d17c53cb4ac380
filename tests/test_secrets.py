"""Issue 9, item 3: no password, API key or certificate body in any output. Every ``xmc`` command
(a table: a new command is one more row) and the worker run with a known secret as the Redis
password and as ``TEMPORAL_API_KEY``: normally, and with Redis unreachable, the password refused
and Temporal unreachable. Their stdout, stderr and logs, the worker's metrics, the run's history
(progress, summaries, search attributes, failures) and its progress query never hold the secret."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from google.protobuf.json_format import MessageToJson
from temporalio.testing import WorkflowEnvironment

from tests.support.helpers import run_module
from tests.support.secure import ACL_USER, ROOT, SECRET, acl_redis
from xmc_resumption.cli import cli as xmc_cli
from xmc_resumption.services import free_port, installed_binary
from xmc_resumption.workflows.resumption import ResumptionWorkflow

pytestmark = [pytest.mark.real_server, pytest.mark.slow]

API_KEY = "tmprl-ApiKey-n0t-for-logs"
SECRETS = (SECRET, API_KEY)

COMMANDS: list[tuple[str, list[str], str]] = [
    # (name, arguments, user: "acl" = the project's ACL user, "admin" = a user that may create groups)
    ("pause", ["pause", "S1"], "acl"),
    ("enqueue", ["enqueue", "S1", "--count", "5"], "acl"),
    ("status", ["status", "S1"], "acl"),
    ("dead", ["dead", "S1"], "acl"),
    ("dead --retry", ["dead", "S1", "--retry", "1-1"], "acl"),
    ("dead --drop", ["dead", "S1", "--drop", "1-1"], "acl"),
    ("plan", ["plan", "S1", "--sample-seconds", "0.1"], "acl"),
    ("rate", ["rate"], "acl"),
    # no consumer group (the ACL user may not create one): zero moves the 5 tasks (under the threshold)
    ("resume", ["resume", "S1", "--batch", "2", "--wait", "--force", "--missing-group", "zero"], "acl"),
    ("list", ["list", "--experiment", "S1"], "acl"),
    ("held", ["held"], "admin"),  # SCAN lists every key name: not in the ACL rule
    ("set", ["set", "S1", "--threshold", "50", "--timeout", "3"], "acl"),
    ("stop", ["stop", "S1", "--timeout", "3"], "acl"),
    ("reconcile", ["reconcile", "--dry-run"], "acl"),  # the run above completed: nothing undone
    ("demo", ["demo", "--tasks", "30", "--rate", "100", "--threshold", "10", "--throttle-seconds", "0.2"], "admin"),
]
"""Every ``xmc`` command, in an order that makes a normal run (pause, enqueue, ..., resume)."""

OK_CODES = {"dead --retry": {2}, "dead --drop": {2}, "set": {2}, "stop": {2}, "demo": {0, 1}}
"""Exit codes of the normal run other than 0: retrying or dropping an entry that is not there; the
demo's own checks (a throttle that a short run may not need) are not this test's business; set and
stop after the run has ended (no running resumption)."""


def assert_no_secret(where: str, text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{where} shows a secret:\n{text}"
    assert "BEGIN" not in text, f"{where} shows a PEM block:\n{text}"


def test_the_table_names_every_command() -> None:
    """Every subcommand of ``xmc`` (the click group's) needs a row in ``COMMANDS``."""
    assert set(xmc_cli.commands) == {args[0] for _, args, _ in COMMANDS}


@pytest.fixture(scope="module")
def urls() -> Iterator[tuple[str, str]]:
    """(admin URL, ACL user URL), both with ``SECRET`` as password (the admin's set here)."""
    with acl_redis() as (admin, user):
        port = admin.rsplit(":", 1)[1].split("/")[0]
        cli = [installed_binary("redis-cli"), "-p", port]
        subprocess.run([*cli, "ACL", "SETUSER", "default", f">{SECRET}"], check=True, capture_output=True)
        yield f"redis://default:{SECRET}@127.0.0.1:{port}/0", user


def env_of(scenario: str, urls: tuple[str, str], user: str, temporal: str, task_queue: str) -> dict[str, str]:
    """The environment of one scenario: ``ok``, ``redis-down``, ``wrong-password``, ``temporal-down``."""
    url = urls[1] if user == "acl" else urls[0]
    if scenario == "redis-down":
        url = f"redis://{ACL_USER}:{SECRET}@127.0.0.1:{free_port()}/0"
    elif scenario == "wrong-password":
        url = url.replace(SECRET, SECRET + "-wrong")
    if scenario == "temporal-down":
        temporal = f"127.0.0.1:{free_port()}"
    return {
        "XMC_REDIS_URL": url,
        "XMC_TASK_QUEUE": task_queue,
        "TEMPORAL_ADDRESS": temporal,
        "TEMPORAL_API_KEY": API_KEY,
        "TEMPORAL_TLS": "false",  # the dev server speaks plain text; the key is sent all the same
    }


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "worker"], cwd=ROOT, env={"PATH": "/usr/bin:/bin", **env},
                                stdout=out, stderr=out)  # fmt: skip


def wait_for_line(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"no {text!r} in {log.read_text()}"
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=30)


async def test_a_normal_run_shows_no_secret(
    urls: tuple[str, str], temporal_env: WorkflowEnvironment, task_queue: str, tmp_path: Path
) -> None:
    temporal = temporal_env.client.service_client.config.target_host
    env = env_of("ok", urls, "acl", temporal, task_queue)
    metrics = f"127.0.0.1:{free_port()}"
    log = tmp_path / "worker.log"
    worker = start_worker({**env, "XMC_METRICS_BIND": metrics}, log)
    try:
        wait_for_line(log, "worker polling", worker)
        for name, args, user in COMMANDS:
            cmd_env = env_of("ok", urls, user, temporal, f"{task_queue}-demo" if name == "demo" else task_queue)
            proc = await asyncio.to_thread(run_module, "xmc_resumption", *args, timeout=90, cwd=tmp_path, **cmd_env)
            assert proc.returncode in OK_CODES.get(name, {0}), f"xmc {name}: {proc.stdout}{proc.stderr}"
            assert_no_secret(f"xmc {name}", proc.stdout + proc.stderr)
        assert "outcome: completed" in proc.stdout  # the demo, last in the table
        handle = temporal_env.client.get_workflow_handle("resumption-S1")
        assert_no_secret("the progress query", (await handle.query(ResumptionWorkflow.progress)).model_dump_json())
        history = await handle.fetch_history()
        assert "S1" in history.to_json()  # the history is read: it names the experiment
        assert_no_secret("the run's history", history.to_json())
        description = await handle.describe()
        assert_no_secret("the run's search attributes", MessageToJson(description.raw_description))
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5) as page:
            text = page.read().decode()
        assert "xmc_resumption_replayed_tasks_total" in text
        assert_no_secret("the worker's metrics", text)
    finally:
        assert stop(worker) == 0
    assert "worker polling" in log.read_text()
    assert_no_secret("the worker's log", log.read_text())
    for demo_log in (tmp_path / ".xmc").glob("*.log"):
        assert_no_secret(f"the demo's {demo_log.name}", demo_log.read_text())


@pytest.mark.parametrize("scenario", ["redis-down", "wrong-password", "temporal-down"])
def test_errors_show_no_secret(
    scenario: str, urls: tuple[str, str], temporal_env: WorkflowEnvironment, task_queue: str, tmp_path: Path
) -> None:
    temporal = temporal_env.client.service_client.config.target_host
    # the commands that talk to the failing side (list, set and stop only to Temporal; resume and
    # demo to both); independent runs, so side by side
    temporal_only, both = ("list", "set", "stop"), ("resume", "demo")
    rows = [
        row
        for row in COMMANDS
        if (row[0] in (*temporal_only, *both) if scenario == "temporal-down" else row[0] not in temporal_only)
    ]
    with ThreadPoolExecutor(max_workers=4) as pool:
        procs = pool.map(
            lambda row: run_module(
                "xmc_resumption",
                *row[1],
                timeout=60,
                cwd=tmp_path,
                **env_of(scenario, urls, row[2], temporal, task_queue),
            ),
            rows,
        )
        for (name, _, _), proc in zip(rows, procs, strict=True):
            assert proc.returncode == 2, f"xmc {name} ({scenario}): {proc.stdout}{proc.stderr}"
            assert_no_secret(f"xmc {name} ({scenario})", proc.stdout + proc.stderr)
    # the worker: a Redis that is down is a warning (it starts and waits); refused credentials
    # and an unreachable Temporal end it with one line
    log = tmp_path / "worker.log"
    worker = start_worker(env_of(scenario, urls, "acl", temporal, task_queue), log)
    if scenario == "redis-down":
        wait_for_line(log, "worker polling", worker)
        assert stop(worker) == 0
    else:
        assert worker.wait(timeout=30) == 2, log.read_text()
    assert_no_secret(f"the worker's log ({scenario})", log.read_text())


def test_printed_urls_are_masked(urls: tuple[str, str]) -> None:
    """A URL the CLI prints names the user and host, the password as ***."""
    line = run_module(
        "xmc_resumption", "status", "S1", **env_of("wrong-password", urls, "acl", "127.0.0.1:1", "q")
    ).stderr
    assert f"redis://{ACL_USER}:***@127.0.0.1:" in line, line
    assert json.dumps(SECRET) not in line
