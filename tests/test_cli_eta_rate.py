"""The CLI's side of the ETA and the rate caps: ``xmc rate`` (the stream-wide cap in Redis), ``xmc
resume --max-tasks-per-second``, ``xmc set --max-tasks-per-second``, and the ETA in ``xmc status``,
``xmc list`` and ``--wait``'s progress lines, against a real redis-server and the dev server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import uuid

import pytest
from redis.asyncio import Redis
from temporalio.testing import WorkflowEnvironment

from tests.support.helpers import GROUP, STREAM, consume, hold_tasks, resumption_worker
from tests.test_cli import Xmc, one_line, xmc_fixture  # noqa: F401  (the fixture)
from tests.test_cli_temporal import ROOT, _read_lines, address, until
from xmc_resumption.redisclient import ratecap

pytestmark = [pytest.mark.real_server, pytest.mark.slow]


async def test_rate_shows_sets_and_clears_the_stream_cap(redis: Redis, xmc: Xmc) -> None:
    assert xmc("rate").stdout == f"{STREAM}: no stream-wide rate cap\n"
    assert json.loads(xmc("rate", "--set", "250", "--json").stdout) == {
        "stream": STREAM,
        "key": "{xmc-tasks-stream}:rate",
        "limit": 250.0,
        "capacity": 250.0,
        "tokens": 250.0,
    }
    assert (await ratecap.stream_rate(redis, STREAM)).limit == 250  # type: ignore[union-attr]
    shown = xmc("rate", "--stream", STREAM)
    assert shown.stdout.startswith(f"{STREAM}: at most 250 tasks/s for all its replays ({{xmc-tasks-stream}}:rate;")
    one_line(xmc("rate", "--set", "0"), "xmc rate: error: Invalid value for '--set': 0.0 is not in the range")
    one_line(xmc("rate", "--set", "5", "--clear"), "xmc rate: error: --set and --clear exclude each other")
    await redis.hset(ratecap.rate_key(STREAM), "limit", "fast")
    one_line(
        xmc("rate"),
        'xmc rate: XMCCORRUPT {xmc-tasks-stream}:rate field limit holds "fast", not a number in [0.001, 1000000]: '
        f"every publish into {STREAM} fails until it is mended (xmc rate --stream {STREAM} --clear removes it)",
    )
    assert json.loads(xmc("rate", "--clear", "--json").stdout)["limit"] is None
    assert not await redis.exists(ratecap.rate_key(STREAM))


def test_resume_and_set_check_the_rate_cap_by_the_model(xmc: Xmc) -> None:
    """Checked at parse time by the input model's bounds, before Redis or Temporal is asked (neither
    is reachable here); 0 removes a running replay's cap, so ``set`` lets it through to Temporal."""
    nowhere = {"redis_at": "redis://127.0.0.1:1/0"}
    for command, value in (("resume", "0"), ("set", "-3"), ("set", "0.0001"), ("set", "nan")):
        one_line(
            xmc(command, "E7", "--max-tasks-per-second", value, **nowhere),
            f"xmc {command}: error: Invalid value for '--max-tasks-per-second': ",
        )
    one_line(xmc("set", "E7", "--max-tasks-per-second", "0", **nowhere), "xmc set: cannot reach Temporal at")
    assert "--max-tasks-per-second" in xmc("resume", "--help").stdout


async def test_the_eta_in_wait_status_and_list_and_a_live_rate_cap(
    temporal_env: WorkflowEnvironment, redis: Redis, redis_url: str, task_queue: str, xmc: Xmc
) -> None:
    """A replay of 600 tasks (fixed 1 s waits at threshold 30) to a consumer at 200/s: once a rate
    is measured, ``--wait``'s lines, ``xmc status`` and ``xmc list`` show an ETA; ``xmc set
    --max-tasks-per-second`` caps the running replay and 0 removes the cap (with a threshold that
    lets the rest through at once); ``--wait`` prints the result."""
    e = f"R{uuid.uuid4().hex[:6]}"
    await hold_tasks(redis, e, 600)
    await redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    env = {"temporal": address(temporal_env), "XMC_TASK_QUEUE": task_queue}
    proc_env = {"PATH": "/usr/bin:/bin", "XMC_REDIS_URL": redis_url, "TEMPORAL_ADDRESS": address(temporal_env)}
    stop, seen = asyncio.Event(), []  # type: ignore[var-annotated]
    consumer = asyncio.create_task(consume(redis, "c1", stop, seen, per_read=20, rate=200))
    err_lines: list[str] = []
    try:
        async with resumption_worker(temporal_env.client, task_queue, redis_url):
            resume = ("resume", e, "--threshold", "30", "--throttle-seconds", "1", "--policy", "fixed", "--wait")
            waiting = subprocess.Popen(
                [sys.executable, "-m", "xmc_resumption", *resume],
                cwd=ROOT,
                env={**proc_env, "XMC_TASK_QUEUE": task_queue},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            reader = threading.Thread(target=_read_lines, args=(waiting.stderr, err_lines), daemon=True)
            reader.start()
            try:

                def status() -> object:
                    return xmc("status", e, **env)

                shown = await until(status, lambda r: "ETA ~" in r.stdout, timeout=30)  # type: ignore[attr-defined]
                assert ", ETA ~" in shown.stdout and " (at " in shown.stdout, shown
                # --wait's plain lines come every 5 s (PLAIN_LINE_SECONDS) or at a change of phase
                deadline = asyncio.get_running_loop().time() + 15
                while not any(", ETA ~" in line for line in err_lines) and asyncio.get_running_loop().time() < deadline:
                    await asyncio.sleep(0.2)
                listed = await asyncio.to_thread(xmc, "list", "--running", "--experiment", e, "--json", **env)
                [row] = json.loads(listed.stdout)["resumptions"]
                assert row["eta_seconds"] is not None and row["eta_seconds"] > 0 and row["eta_at"] is not None
                table = await asyncio.to_thread(xmc, "list", "--running", "--experiment", e, **env)
                assert table.stdout.split("\n")[0].split() == [
                    "WORKFLOW", "ID", "STATUS", "EXPERIMENT", "PHASE", "REPLAYED", "REDELIVERED", "REMAINING", "ETA",
                    "OUTCOME", "STARTED",
                ]  # fmt: skip
                bare = await asyncio.to_thread(xmc, "list", "--running", "--experiment", e, "--no-eta", "--json", **env)
                assert "eta_seconds" not in json.loads(bare.stdout)["resumptions"][0]
                capped = await asyncio.to_thread(xmc, "set", e, "--max-tasks-per-second", "0.2", "--json", **env)
                assert json.loads(capped.stdout)["max_tasks_per_second"] == 0.2, capped
                cleared = await asyncio.to_thread(
                    xmc, "set", e, "--max-tasks-per-second", "0", "--threshold", "1000", **env
                )
                assert cleared.stdout.rstrip().endswith("policy fixed, rate cap none"), cleared
                await asyncio.to_thread(waiting.wait, 60)
            finally:
                if waiting.poll() is None:
                    waiting.kill()
                    waiting.wait()
            reader.join(timeout=5)
    finally:
        stop.set()
        await consumer
    out = waiting.stdout.read()  # type: ignore[union-attr]
    assert waiting.returncode == 0, err_lines
    assert "outcome: completed; 600 replayed, 0 remaining" in out
    with_eta = [line for line in err_lines if ", ETA ~" in line]
    assert with_eta, err_lines
    assert all(line.startswith(f"resumption-{e}: ") for line in with_eta)
