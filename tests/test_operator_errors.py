"""Operator errors (issue 6, item 6; the settings rows of item 8): each a one-line message on
stderr naming the argument, setting or key, never a secret, and exit 2; run as an operator runs
the commands (``python -m xmc``, ``python -m worker``) against a real redis-server."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from redis.asyncio import Redis
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.support.helpers import ROOT, RUNNER
from tests.support.helpers import run_module as run
from xmc_resumption.activities.resumption import ResumptionActivities
from xmc_resumption.cli import main
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.services import free_port
from xmc_resumption.settings import Settings, redacted_url
from xmc_resumption.workflows.resumption import ResumptionWorkflow

pytestmark = [pytest.mark.real_server, pytest.mark.slow]

SECRET = "s3cret-Pa55"
KEYS = ExperimentKeys("xmc-tasks-stream", "E6")


def one_line_error(proc: subprocess.CompletedProcess[str], *parts: str, code: int = 2) -> str:
    """Assert exit ``code``, exactly one stderr line containing ``parts``, no secret; return the line."""
    lines = proc.stderr.splitlines()
    assert proc.returncode == code, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert SECRET not in proc.stderr + proc.stdout
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def fake_endpoints() -> Iterator[dict[str, int]]:
    """Two loopback TCP servers that are not Redis: one answers HTTP, one closes at once."""
    servers: dict[str, int] = {}
    socks = []

    def serve(sock: socket.socket, reply: bytes) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                if reply:
                    conn.recv(1024)
                    conn.sendall(reply)

    for name, reply in (("http", b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"), ("closing", b"")):
        sock = socket.create_server(("127.0.0.1", 0))
        socks.append(sock)
        servers[name] = sock.getsockname()[1]
        threading.Thread(target=serve, args=(sock, reply), daemon=True).start()
    yield servers
    for sock in socks:
        sock.close()


def dead_url() -> str:
    return f"redis://admin:{SECRET}@127.0.0.1:{free_port()}/0"


def test_password_is_masked_when_redis_is_unreachable() -> None:
    line = one_line_error(
        run("xmc_resumption", "status", "E6", XMC_REDIS_URL=dead_url()), "cannot reach Redis at redis://admin:***@"
    )
    assert line.startswith("xmc status: ") and "(XMC_REDIS_URL)" in line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["status", ""], "Invalid value for 'EXPERIMENT_ID': experiment_id '' (0 characters) must be 1 to 200 of"),
        (["status", "E6", "--threshold", "0"], "Invalid value for '--threshold': 0 is not in the range 1<=x<=100000"),
        (["status", "E6", "--stream", "a{b"], "Invalid value for '--stream': stream 'a{b' (3 characters) must be 1 to"),
        (["pause", "E 6"], "experiment_id 'E 6' (3 characters) must be 1 to 200 of"),
        (["enqueue", "E*"], "experiment_id 'E*' (2 characters) must be 1 to 200 of"),
        (["enqueue", "E6", "--count", "0"], "Invalid value for '--count': 0 is not in the range 1<=x<=1000000"),
        (["resume", "x" * 201], "Invalid value for 'EXPERIMENT_ID': experiment_id 'xxxx"),
    ],
)
def test_bad_arguments_are_one_line(args: list[str], expected: str) -> None:
    line = one_line_error(
        run("xmc_resumption", *args, XMC_REDIS_URL=dead_url()), expected, f"(see xmc {args[0]} --help)"
    )
    assert line.startswith(f"xmc {args[0]}: error: ")


def test_bad_resume_input_names_the_field() -> None:
    one_line_error(
        run("xmc_resumption", "resume", "E6", "--throttle-seconds", "200", XMC_REDIS_URL=dead_url()),
        "xmc resume: invalid ResumptionInput: claim_lease_seconds (120) must be longer than throttle_seconds (200)",
    )


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"XMC_REDIS_TIMEOUT_SECONDS": "0"}, "XMC_REDIS_TIMEOUT_SECONDS: Input should be greater than 0"),
        ({"XMC_REDIS_TIMEOUT_SECONDS": "nan"}, "XMC_REDIS_TIMEOUT_SECONDS: Input should be a finite number"),
        ({"XMC_REDIS_TIMEOUT_SECONDS": "301"}, "XMC_REDIS_TIMEOUT_SECONDS: Input should be less than or equal to 300"),
        ({"XMC_REDIS_URL": f"http://u:{SECRET}@x"}, "XMC_REDIS_URL: Redis URL must specify one of the following"),
        ({"XMC_REDIS_URL": f"redis://:{SECRET}@127.0.0.1/abc"}, "XMC_REDIS_URL: the database must be a number"),
        ({"XMC_REDIS_URL": f"redis://:{SECRET}@127.0.0.1:port/0"}, "XMC_REDIS_URL: the port is not a number"),
        ({"XMC_REDIS_URL": "redis://127.0.0.1/0?db=x"}, "XMC_REDIS_URL: Invalid value for 'db' in connection URL"),
        ({"XMC_METRICS_BIND": "9090"}, "XMC_METRICS_BIND: must be host:port with a port in 1..65535"),
        # a number in another script's digits (Python's int() takes Arabic-Indic 1 as 1; issue 26, row 9)
        ({"XMC_REDIS_URL": "redis://127.0.0.1/\u0661"}, "XMC_REDIS_URL: the database must be a number"),
        (
            {"XMC_REDIS_URL": "redis://127.0.0.1/0?socket_timeout=\u0661"},
            "XMC_REDIS_URL: socket_timeout must be a number in ASCII",
        ),
        ({"XMC_METRICS_BIND": "0.0.0.0:\u0669\u0660"}, "XMC_METRICS_BIND: must be host:port with a port in 1..65535"),
        ({"XMC_REDIS_TIMEOUT_SECONDS": "\u0661"}, "XMC_REDIS_TIMEOUT_SECONDS: Input should be a valid number"),
        ({"XMC_TASK_QUEUE": ""}, "XMC_TASK_QUEUE: String should have at least 1 character"),
        ({"XMC_BUILD_ID": "b7"}, "XMC_DEPLOYMENT_NAME and XMC_BUILD_ID go together (a Worker Deployment Version)"),
        ({"XMC_DEPLOYMENT_NAME": "x.y", "XMC_BUILD_ID": "b7"}, "XMC_DEPLOYMENT_NAME: must not contain '.'"),
        ({"XMC_DEPLOYMENT_NAME": "x", "XMC_BUILD_ID": "__unversioned__"}, "XMC_BUILD_ID: __unversioned__ is reserved"),
        ({"XMC_DEPLOYMENT_NAME": "x", "XMC_BUILD_ID": "b" * 256}, "XMC_BUILD_ID: String should have at most 255"),
        ({"XMC_DEPLOYMENT_NAME": "x\ty", "XMC_BUILD_ID": "b7"}, "XMC_DEPLOYMENT_NAME: must be printable"),
    ],
)
@pytest.mark.parametrize("module", ["xmc_resumption", "xmc_resumption.worker"])
def test_bad_settings_are_one_line(module: str, env: dict[str, str], expected: str) -> None:
    env = {"XMC_REDIS_URL": dead_url(), **env}
    args = ["status", "E6"] if module == "xmc_resumption" else []
    prefix = "xmc status: " if module == "xmc_resumption" else "worker: "
    line = one_line_error(run(module, *args, **env), "invalid setting: " + expected)
    assert line.startswith(prefix)


def test_nonexistent_database(redis_url: str) -> None:
    url = redis_url.rsplit("/", 1)[0] + "/99"
    expected = f"XMC_REDIS_URL: database 99 does not exist on the Redis at {url} (DB index is out of range)"
    one_line_error(run("xmc_resumption", "status", "E6", XMC_REDIS_URL=url), expected)
    # the worker checks Redis before it connects to Temporal, so no Temporal server is needed here
    one_line_error(
        run("xmc_resumption.worker", XMC_REDIS_URL=url, TEMPORAL_ADDRESS="127.0.0.1:1"), "worker: " + expected
    )


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("http", "does not speak the Redis protocol: Protocol Error: b'HTTP/1.1 400 Bad Request'"),
        ("closing", "cannot reach Redis at redis://:***@127.0.0.1:"),
    ],
)
def test_endpoint_that_is_not_redis(fake_endpoints: dict[str, int], endpoint: str, expected: str) -> None:
    url = f"redis://:{SECRET}@127.0.0.1:{fake_endpoints[endpoint]}/0"
    one_line_error(run("xmc_resumption", "status", "E6", XMC_REDIS_URL=url), expected)


GARBAGE = [
    ("status", KEYS.state, ["x"], f"key {KEYS.state} is a list, expected a string: paused, resuming (absent: running)"),
    ("status", KEYS.fence, "ten", f"key {KEYS.fence} holds 'ten', expected an integer (the fencing token)"),
    ("status", KEYS.held, "text", f"key {KEYS.held} is a string, expected a stream (the held tasks)"),
    ("status", KEYS.claim, "text", f"key {KEYS.claim} is a string, expected a hash (token, owner)"),
    ("status", KEYS.stream, "text", f"key {KEYS.stream} is a string, expected a stream (the task stream)"),
    # resume reads the state and held keys before it starts the workflow
    ("resume", KEYS.state, ["x"], f"key {KEYS.state} is a list, expected a string: paused, resuming (absent: running)"),
    ("resume", KEYS.held, "text", f"key {KEYS.held} is a string, expected a stream (the held tasks)"),
]


@pytest.mark.parametrize(("command", "key", "value", "expected"), GARBAGE)
async def test_garbage_keys(
    redis: Redis, redis_url: str, command: str, key: str, value: str | list[str], expected: str
) -> None:
    if isinstance(value, list):
        await redis.rpush(key, *value)
    else:
        await redis.set(key, value)
    one_line_error(run("xmc_resumption", command, "E6", XMC_REDIS_URL=redis_url), f"xmc {command}: " + expected)


async def test_a_state_value_the_contract_does_not_know_shows_as_unknown(redis: Redis, redis_url: str) -> None:
    """Not an error: producers hold tasks behind it and the next claim normalizes it."""
    await redis.set(KEYS.state, "garbage")
    done = run(
        "xmc_resumption", "status", "E6", "--json", XMC_REDIS_URL=redis_url, TEMPORAL_ADDRESS=f"127.0.0.1:{free_port()}"
    )
    assert done.returncode == 0 and done.stderr == ""
    assert json.loads(done.stdout)["state"] == "unknown"


async def test_broken_pipe_exits_quietly(redis: Redis, redis_url: str) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before xmc writes a byte (xmc status E | head, head done)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "xmc_resumption", "status", "E6"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=20,
            cwd=ROOT,
            env={"PATH": "/usr/bin:/bin", "XMC_REDIS_URL": redis_url},
        )
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (141, "")


def test_unreachable_or_malformed_temporal_address(redis_url: str) -> None:
    base = {"XMC_REDIS_URL": redis_url}
    one_line_error(
        run("xmc_resumption", "resume", "E6", "--force", TEMPORAL_ADDRESS=f"127.0.0.1:{free_port()}", **base),
        "xmc resume: cannot reach Temporal at TEMPORAL_ADDRESS=127.0.0.1:",
        "Connection refused",
    )
    one_line_error(
        run("xmc_resumption", "resume", "E6", "--force", TEMPORAL_ADDRESS="bad address::x", **base),
        "xmc resume: cannot reach Temporal at TEMPORAL_ADDRESS=bad address::x: invalid target URL",
    )


def test_unknown_namespace(temporal_env: WorkflowEnvironment, redis_url: str) -> None:
    address = temporal_env.client.service_client.config.target_host
    one_line_error(
        run(
            "xmc_resumption",
            "resume",
            "E6",
            "--force",
            XMC_REDIS_URL=redis_url,
            TEMPORAL_ADDRESS=address,
            TEMPORAL_NAMESPACE="nope",
        ),
        f"TEMPORAL_ADDRESS={address}, TEMPORAL_NAMESPACE=nope: NOT_FOUND: Namespace nope is not found",
    )


async def test_resume_wait_of_a_failed_run(
    temporal_env: WorkflowEnvironment, redis: Redis, redis_url: str, task_queue: str
) -> None:
    await redis.set(KEYS.state, "paused")
    await redis.set(KEYS.stream, "not a stream")  # the run fails measuring: RedisWrongType, not retryable
    env = {
        "XMC_REDIS_URL": redis_url,
        "XMC_TASK_QUEUE": task_queue,
        "TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
    }
    worker_redis = Redis.from_url(redis_url)
    try:
        async with Worker(
            temporal_env.client,
            task_queue=task_queue,
            workflows=[ResumptionWorkflow],
            activities=ResumptionActivities(worker_redis).all(),
            workflow_runner=RUNNER,
        ):
            proc = await asyncio.to_thread(run, "xmc_resumption", "resume", "E6", "--wait", "--quiet", **env)
    finally:
        await worker_redis.aclose()
    line = one_line_error(proc, "xmc resume: resumption-E6 failed: ", code=1)  # the run failed: exit 1
    assert "RedisWrongType" in line, line
    assert proc.stdout.startswith("started resumption-E6")


async def test_worker_logs_one_line_per_failed_attempt_during_an_outage(
    temporal_env: WorkflowEnvironment, task_queue: str, tmp_path: Path
) -> None:
    address = temporal_env.client.service_client.config.target_host
    env = {"XMC_REDIS_URL": dead_url(), "XMC_TASK_QUEUE": task_queue, "TEMPORAL_ADDRESS": address}
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker"], cwd=ROOT, env={"PATH": "/usr/bin:/bin", **env}, stdout=log, stderr=log
        )
    try:
        handle = await temporal_env.client.start_workflow(
            ResumptionWorkflow.run, {"experiment_id": "E6"}, id=f"resumption-E6-{task_queue}", task_queue=task_queue
        )
        # three attempts of the retry policy, however long the worker takes to start: a bound, not a deadline
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and log_path.read_text().count("Completing activity as failed") < 3:
            assert proc.poll() is None, log_path.read_text()
            await asyncio.sleep(0.2)
        await handle.terminate()
    finally:
        proc.kill()
        proc.wait()
    text = log_path.read_text()
    failed = [line for line in text.splitlines() if "Completing activity as failed" in line]
    assert len(failed) >= 3, text
    assert all("error=ConnectionError: Error 111 connecting to 127.0.0.1" in line for line in failed), text
    assert "Traceback" not in text and SECRET not in text
    assert "redis://admin:***@127.0.0.1" in text  # the start-up warning names the Redis, masked


SEGMENTS = ("Qz7", "Kx9", "Vw3", "Jm5", "Ht2")
"""Pieces of the passwords below: none may show in any output."""


@pytest.mark.parametrize(
    "password",
    ["Qz7@Kx9", "Qz7:Kx9", "Qz7/Kx9", "Qz7%Kx9", "Qz7%40Kx9", "Qz7@Kx9:Vw3/Jm5%Ht2", "@Qz7:", "Qz7@@Kx9::"],
)
@pytest.mark.parametrize("escaped", [True, False], ids=["escaped", "as-typed"])
@pytest.mark.parametrize("user", ["admin", ""], ids=["user", "no-user"])
def test_a_password_with_url_characters_never_shows(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, password: str, escaped: bool, user: str
) -> None:
    """``@ : / %`` in the password, percent-escaped (a valid URL) or typed as is: every printed URL
    masks all of it. ``/`` typed as is ends the host part early; redis-py cannot read such a URL,
    so it is refused as a setting, and never printed."""
    port = free_port()
    url = f"redis://{user}:{quote(password, safe='') if escaped else password}@127.0.0.1:{port}/0"
    shown = redacted_url(url)
    monkeypatch.setenv("XMC_REDIS_URL", url)
    monkeypatch.setenv("TEMPORAL_ADDRESS", f"127.0.0.1:{free_port()}")
    code = main(["status", "E6"])
    out, err = capsys.readouterr()
    for text in (shown, out, err):
        for piece in (password, quote(password, safe=""), *SEGMENTS):
            assert piece not in text, (piece, text)
    assert code == 2 and len(err.splitlines()) == 1, err
    if escaped or "/" not in password:  # a URL redis-py reads: the user and host shown, the password as ***
        assert shown == f"redis://{user}:***@127.0.0.1:{port}/0"
        assert err.startswith(f"xmc status: cannot reach Redis at {shown} (XMC_REDIS_URL)"), err
        assert Settings().redis_location() == shown
    else:
        assert shown == "<unparseable URL>"
        assert err.startswith("xmc status: invalid setting: XMC_REDIS_URL: "), err
