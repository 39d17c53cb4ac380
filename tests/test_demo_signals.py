"""``make demo`` and ``xmc demo`` stop everything they started on SIGTERM and SIGINT.

Each case starts the demo in a process group of its own, as a shell starts a job, waits until the
replay runs, takes a snapshot of every process under it (the ``xmc demo`` process, its
redis-server, its Temporal dev server and its worker), sends the signal, and checks that the demo
exits and that none of those processes outlives it.

The three ways an operator stops it: ``kill <make's PID>`` (SIGTERM to make, which passes SIGTERM
on to its recipe and waits for it), Ctrl-C (SIGINT to the whole foreground group: make, the demo
and its children each get it), and ``kill -INT <demo's PID>`` (SIGINT to the demo alone; make
would not pass SIGINT on, so this case runs ``python -m xmc demo`` without make). A fourth case
sends SIGTERM while the demo still enqueues its tasks, before the workflow starts: redis-py's
commands are where Python 3.11 can drop a cancel (``xmc.demo.CANCEL_RETRY_SECONDS``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

# make demo and xmc demo with their own servers, stopped by signals; one heavy test at a time
pytestmark = [pytest.mark.slow, pytest.mark.heavy]

REPO = Path(__file__).resolve().parent.parent
VENV = Path(sys.executable).parent.parent  # the venv running the tests, as `make VENV=...` names it
DEMO_ARGS = ["--rate", "20", "--threshold", "50", "--batch", "50", "--throttle-seconds", "1"]
TASKS = {"replaying": "400", "holding": "200000"}
"""400 tasks replay for about 20 s; 200,000 take several seconds to enqueue (20,000 were all held
before the signal in one CI run on an idle machine): long enough to be stopped in the middle of
either."""

STOP_SECONDS = 45.0
"""The bound for the demo to stop everything and exit (seconds): the worker's own shutdown takes
15 s at most (worker.SHUTDOWN_LIMIT_SECONDS); here it took about 1 s."""


def _env() -> dict[str, str]:
    """The environment without configured services (the demo starts its own), unbuffered output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "XMC_"))}
    return env | {"PYTHONUNBUFFERED": "1"}


def _wait_for_line(out: Path, proc: subprocess.Popen[bytes], text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in out.read_text():
        assert proc.poll() is None, f"the demo exited ({proc.returncode}) before printing {text!r}:\n{out.read_text()}"
        assert time.monotonic() < deadline, f"no {text!r} after {timeout:g}s:\n{out.read_text()}"
        time.sleep(0.1)


def _kind(p: psutil.Process) -> str:
    """What a process under the demo is, by its command line; ``gone`` for one that ended meanwhile
    (the demo runs short-lived children too, e.g. ``temporal operator cluster health``)."""
    try:
        cmd = " ".join(p.cmdline())
    except psutil.NoSuchProcess:
        return "gone"
    for kind, marker in (
        ("worker", "-m xmc_resumption.worker"),
        ("demo", "xmc_resumption demo"),
        ("redis", "redis-server"),
        ("temporal", "start-dev"),
    ):
        if marker in cmd:
            return kind
    return "other"


def _worker_started(proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not any(_kind(p) == "worker" for p in psutil.Process(proc.pid).children(recursive=True)):
        assert proc.poll() is None and time.monotonic() < deadline, "the demo never started its worker"
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("via", "sig", "target", "when"),
    [
        ("make", signal.SIGTERM, "leader", "replaying"),
        ("make", signal.SIGINT, "group", "replaying"),
        ("python", signal.SIGINT, "leader", "replaying"),
        ("python", signal.SIGTERM, "leader", "holding"),
    ],
    ids=["kill-make", "ctrl-c-make", "kill-int-xmc-demo", "kill-xmc-demo-while-holding"],
)
def test_a_stop_signal_stops_everything_the_demo_started(
    tmp_path, via: str, sig: signal.Signals, target: str, when: str
) -> None:
    out = tmp_path / "demo.out"
    demo_args = ["--tasks", TASKS[when], *DEMO_ARGS]
    if via == "make":  # -o: the venv counts as installed (pyproject.toml may be newer than its stamp)
        args = [
            "make",
            "-C",
            str(REPO),
            "-o",
            f"{VENV}/.installed",
            f"VENV={VENV}",
            "demo",
            f"ARGS={' '.join(demo_args)}",
        ]
    else:
        args = [sys.executable, "-m", "xmc_resumption", "demo", *demo_args]
    with open(out, "wb") as sink:
        proc = subprocess.Popen(args, cwd=tmp_path, env=_env(), stdout=sink, stderr=subprocess.STDOUT, process_group=0)
    started: list[psutil.Process] = []
    try:
        if when == "replaying":
            _wait_for_line(out, proc, "replayed | backlog", timeout=120)  # progress is drawn
        else:
            _worker_started(proc, timeout=120)  # the next step enqueues the tasks
        root = psutil.Process(proc.pid)
        started += [root, *root.children(recursive=True)]
        kinds = sorted(_kind(p) for p in started)
        assert {"demo", "redis", "temporal", "worker"} <= set(kinds), kinds

        t0 = time.monotonic()
        if target == "group":
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        rc = proc.wait(timeout=STOP_SECONDS)
        took = time.monotonic() - t0
        _, alive = psutil.wait_procs(started, timeout=0)
        assert not alive, f"still running after the demo exited: {[(p.pid, _kind(p)) for p in alive]}"
        print(f"{via} demo, {sig.name} to the {target}: everything stopped, exit {rc}, in {took:.1f}s")
        if via == "make":
            assert rc == -sig  # make ends by the same signal, once its recipe has ended
        else:
            assert rc == 128 + sig
        assert f"{sig.name}: stopped the demo and everything it started" in out.read_text()
        if when == "holding":
            assert "started workflow" not in out.read_text()  # stopped before the replay began
    finally:  # whatever failed, leave nothing running (psutil checks that a PID was not reused)
        for p in started:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
