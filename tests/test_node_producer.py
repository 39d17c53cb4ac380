"""A producer in another language: Node with the npm ``redis`` client (tests/node, installed by
``make test`` from its lock file) pauses an experiment and enqueues through the contract of
docs/producers.md, as the producers' ACL user; some tasks carry idempotency keys and one is sent
again, as after a lost reply. A resumption then replays every held task exactly once and in order."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from temporalio.testing import WorkflowEnvironment

from tests.support.helpers import GROUP, STREAM, resumption_worker, start
from tests.support.secure import PRODUCER_USER, ROOT, producer_acl_redis
from xmc_resumption.redisclient.keys import ExperimentKeys, as_text

pytestmark = pytest.mark.real_server

NODE_DIR = ROOT / "tests" / "node"
SCRIPT = ROOT / "xmc_resumption" / "redisclient" / "lua" / "enqueue.lua"


def node_producer(url: str, steps: list[dict[str, Any]]) -> list[Any]:
    """Run ``steps`` with tests/node/run.mjs (XmcProducer); returns each step's result."""
    plan = {"url": url, "script": str(SCRIPT), "stream": STREAM, "steps": steps}
    proc = subprocess.run(
        ["node", str(NODE_DIR / "run.mjs")], input=json.dumps(plan), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return list(json.loads(proc.stdout))


@pytest.fixture(scope="module")
def acl_urls() -> Iterator[tuple[str, str]]:
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    if not (NODE_DIR / "node_modules" / "redis").is_dir():
        pytest.skip("the npm packages of tests/node are not installed: make node-deps (make test does it)")
    with producer_acl_redis() as urls:
        yield urls


def tasks(*specs: tuple[str, str | None]) -> list[dict[str, Any]]:
    return [{"fields": {"task": name, "n": i}, "key": key} for i, (name, key) in enumerate(specs)]


async def test_a_node_producer_enqueues_and_the_replay_is_exact(
    acl_urls: tuple[str, str], temporal_env: WorkflowEnvironment, task_queue: str
) -> None:
    admin_url, producer_url = acl_urls
    assert f"{PRODUCER_USER}:" in producer_url
    admin = Redis.from_url(admin_url)
    keys = ExperimentKeys(STREAM, "N1")
    try:
        await admin.flushall()
        await admin.script_flush()  # the first enqueue meets NOSCRIPT and loads the script
        before, paused, first, unkeyed, retried, batch = node_producer(
            producer_url,
            [
                {"op": "enqueue", "experiment": "N1", "tasks": tasks(("before", None))},
                {"op": "pause", "experiment": "N1"},
                {"op": "enqueue", "experiment": "N1", "tasks": tasks(("t0", "k0"), ("t1", "k1"), ("t2", None))},
                {"op": "enqueue", "experiment": "N1", "tasks": tasks(("t3", None))},
                {"op": "enqueue", "experiment": "N1", "tasks": tasks(("t1", "k1"))},  # a retry of k1
                {"op": "enqueue", "experiment": "N1", "tasks": tasks(("t4", "k4"), ("t4", "k4"), ("t5", "k5"))},
            ],
        )
        assert [(r["destination"], r["duplicate"]) for r in before] == [("stream", False)]
        assert paused is None and await admin.get(keys.state) == b"paused"
        assert [(r["destination"], r["duplicate"]) for r in first] == [("held", False)] * 3
        assert [(r["destination"], r["duplicate"]) for r in unkeyed] == [("held", False)]
        assert retried == [{"destination": "held", "id": first[1]["id"], "duplicate": True}]
        assert [r["duplicate"] for r in batch] == [False, True, False] and batch[1]["id"] == batch[0]["id"]
        held_ids = [as_text(i) for i, _ in await admin.xrange(keys.held)]
        assert held_ids == [
            first[0]["id"],
            first[1]["id"],
            first[2]["id"],
            unkeyed[0]["id"],
            batch[0]["id"],
            batch[2]["id"],
        ]

        await admin.xgroup_create(STREAM, GROUP, id="$")  # the consumers' group: the replay waits for it
        async with resumption_worker(temporal_env.client, task_queue, admin_url):
            handle = await start(temporal_env.client, task_queue, experiment_id="N1", batch_size=2)
            result = await handle.result()
        assert (result.outcome.value, result.replayed, result.remaining) == ("completed", 6, 0)
        [after] = await asyncio.to_thread(
            node_producer, producer_url, [{"op": "enqueue", "experiment": "N1", "tasks": tasks(("after", None))}]
        )
        assert after[0]["destination"] == "stream"
        replayed = [as_text(f[b"task"]) for _, f in await admin.xrange(STREAM)]
        assert replayed == ["before", "t0", "t1", "t2", "t3", "t4", "t5", "after"]
        assert (await admin.xrange(STREAM))[2][1] == {b"task": b"t1", b"n": b"1"}  # byte for byte
        assert [e for e in await admin.acl_log() if as_text(e["object"]) != "client|setinfo"] == []
    finally:
        await admin.aclose()


def test_the_docs_node_example_is_the_tested_file() -> None:
    """docs/producers.md shows tests/node/xmc-producer.mjs as it is."""
    doc = (ROOT / "docs" / "producers.md").read_text()
    code = (NODE_DIR / "xmc-producer.mjs").read_text()
    assert f"```js\n{code}```\n" in doc


def test_node_modules_are_not_in_the_repository() -> None:
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", str(NODE_DIR / "node_modules" / "redis")], cwd=ROOT, check=False
    )
    assert ignored.returncode == 0 and Path(NODE_DIR / "package-lock.json").is_file()
