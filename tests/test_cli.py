"""The operator CLI against a real redis-server: pause, enqueue, status (with the orphaned flag)."""

from __future__ import annotations

import json
import subprocess
import sys

from redis.asyncio import Redis

from redisclient import fencing
from redisclient.keys import ExperimentKeys


def xmc(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xmc", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"XMC_REDIS_URL": redis_url, "PATH": "/usr/bin:/bin"},
    )


async def test_pause_enqueue_status_and_orphan(redis: Redis, redis_url: str) -> None:
    assert xmc(redis_url, "pause", "E7").returncode == 0
    enqueued = xmc(redis_url, "enqueue", "E7", "--count", "25")
    assert json.loads(enqueued.stdout) == {"experiment_id": "E7", "enqueued": {"held": 25}}
    keys = ExperimentKeys("xmc-tasks-stream", "E7")
    await fencing.acquire_claim(redis, keys, "resumption-E7", 60_000)
    status = json.loads(xmc(redis_url, "status", "E7").stdout)
    assert (status["state"], status["held"], status["fence"], status["orphaned"]) == ("resuming", 25, 1, False)
    assert status["claim"]["owner"] == "resumption-E7"
    await redis.delete(keys.claim)  # the lease lapsed with no replayer left
    status = json.loads(xmc(redis_url, "status", "E7").stdout)
    assert (status["state"], status["orphaned"]) == ("resuming", True)


def test_errors_are_one_line_and_exit_2(redis_url: str) -> None:
    bad = xmc("redis://127.0.0.1:1/0", "status", "E7")
    assert bad.returncode == 2
    assert bad.stderr.startswith("xmc status: cannot reach Redis at redis://127.0.0.1:1/0")
    assert len(bad.stderr.strip().splitlines()) == 1
    nothing = xmc(redis_url, "resume", "E-none")
    assert nothing.returncode == 1 and "nothing to resume" in nothing.stderr
