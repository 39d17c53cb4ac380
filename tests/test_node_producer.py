"""The Node producer package (clients/node, npm ``xmc-resumption``): its own tests (``node --test``,
against this session's redis-server, with a reply-losing proxy of its own), the script and version
it carries (the Python package's, checked in the package as ``npm pack`` builds it), the docs'
example run as it is, and a Node producer as the producers' ACL user whose tasks a resumption then
replays exactly once and in order. The npm packages come from the lock file (``make node-deps``)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from temporalio.testing import WorkflowEnvironment

import xmc_resumption
from tests.support.helpers import GROUP, STREAM, resumption_worker, start
from tests.support.secure import PRODUCER_USER, ROOT, producer_acl_redis
from xmc_resumption.redisclient import held
from xmc_resumption.redisclient.keys import ExperimentKeys, as_text
from xmc_resumption.redisclient.scripts import source

PACKAGE = ROOT / "clients" / "node"


@pytest.fixture(scope="module")
def built() -> Path:
    """The package, built (``npm run build``: the script copied, the types emitted)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed")
    if not (PACKAGE / "node_modules" / "redis").is_dir():
        pytest.skip("the npm packages of clients/node are not installed: make node-deps (make test does it)")
    subprocess.run(["npm", "run", "--silent", "build"], cwd=PACKAGE, check=True, timeout=120)
    return PACKAGE


def test_the_packages_own_tests_pass(built: Path, redis: Redis, redis_url: str) -> None:
    proc = subprocess.run(
        ["npm", "test", "--silent"],
        cwd=built,
        env={"PATH": "/usr/bin:/bin:/usr/local/bin", "XMC_TEST_REDIS_URL": redis_url},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    declared = len(re.findall(r"^test\(", (built / "test" / "producer.test.mjs").read_text(), re.MULTILINE))
    assert f"\n# pass {declared}\n" in proc.stdout and "\n# fail 0\n" in proc.stdout, proc.stdout[-2000:]
    assert declared >= 8


def test_the_package_carries_the_script_and_version_of_its_release(built: Path) -> None:
    """What ``npm pack`` would publish: the sources, the types, the script copied from the Python
    package (the same text, so the same SHA1 and limits), at the Python package's version."""
    packed = json.loads(
        subprocess.run(
            ["npm", "pack", "--dry-run", "--json", "--ignore-scripts"],
            cwd=built,
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
    )[0]
    assert (packed["name"], packed["version"]) == ("xmc-resumption", xmc_resumption.__version__)
    files = sorted(f["path"] for f in packed["files"])
    assert files == [
        "README.md", "package.json", "src/index.js", "src/script.js", "types/index.d.ts", "types/script.d.ts",
    ]  # fmt: skip
    manifest = json.loads((built / "package.json").read_text())
    assert manifest["types"] == "./types/index.d.ts" and manifest["version"] == xmc_resumption.__version__
    carried = subprocess.run(
        ["node", "--input-type=module", "-e", "import * as m from './src/index.js'; console.log(JSON.stringify(m))"],
        cwd=built,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    seen = json.loads(carried.stdout)
    assert seen["ENQUEUE_SCRIPT"] == source("enqueue")
    assert seen["ENQUEUE_SHA1"] == hashlib.sha1(source("enqueue").encode()).hexdigest()
    assert seen["LIMITS"] == {
        "tasks": held.MAX_ENQUEUE_TASKS,
        "fields": 3995,
        "keyBytes": held.MAX_IDEMPOTENCY_KEY_BYTES,
        "requestBytes": held.MAX_REQUEST_ID_BYTES,
        "bytes": held.MAX_ENQUEUE_BYTES,
    }
    assert seen["REQUEST_ID_BYTES"] == held.REQUEST_ID_BYTES


def test_the_docs_node_example_is_the_packages_and_runs(built: Path, redis: Redis, redis_url: str) -> None:
    """docs/producers.md shows clients/node/examples/producer.mjs as it is; it runs."""
    example = built / "examples" / "producer.mjs"
    code = example.read_text()
    assert f"```js\n{code}```\n" in (ROOT / "docs" / "producers.md").read_text()
    proc = subprocess.run(
        ["node", str(example)],
        cwd=built,
        env={"PATH": "/usr/bin:/bin", "XMC_REDIS_URL": redis_url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["held false paused", "2500 2500"]


def node_producer(url: str, steps: list[dict[str, Any]]) -> list[Any]:
    """Run ``steps`` with clients/node/test/run-steps.mjs (XmcProducer); returns each step's result."""
    plan = {"url": url, "stream": STREAM, "steps": steps}
    proc = subprocess.run(
        ["node", str(PACKAGE / "test" / "run-steps.mjs")],
        input=json.dumps(plan),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return list(json.loads(proc.stdout))


@pytest.fixture(scope="module")
def acl_urls(built: Path) -> Iterator[tuple[str, str]]:
    with producer_acl_redis() as urls:
        yield urls


def enqueue(experiment: str, *specs: tuple[str, str | None]) -> dict[str, Any]:
    return {
        "op": "enqueue",
        "experiment": experiment,
        "tasks": [{"task": name, "n": i} for i, (name, _) in enumerate(specs)],
        "keys": [key for _, key in specs],
    }


@pytest.mark.real_server
@pytest.mark.slow
async def test_a_node_producer_enqueues_as_the_acl_user_and_the_replay_is_exact(
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
                enqueue("N1", ("before", None)),
                {"op": "pause", "experiment": "N1"},
                enqueue("N1", ("t0", "k0"), ("t1", "k1"), ("t2", None)),
                enqueue("N1", ("t3", None)),
                enqueue("N1", ("t1", "k1")),  # another call with k1
                enqueue("N1", ("t4", "k4"), ("t4", "k4"), ("t5", "k5")),
            ],
        )
        assert [(r["destination"], r["duplicate"]) for r in before] == [("stream", False)]
        assert paused is None and await admin.get(keys.state) == b"paused"
        assert node_producer(admin_url, [{"op": "state", "experiment": "N1"}]) == ["paused"]  # GET: not the producer's
        assert [(r["destination"], r["duplicate"]) for r in first] == [("held", False)] * 3
        assert [(r["destination"], r["duplicate"]) for r in unkeyed] == [("held", False)]
        assert retried == [{"destination": "held", "entryId": first[1]["entryId"], "duplicate": True}]
        assert [r["duplicate"] for r in batch] == [False, True, False]
        assert batch[1]["entryId"] == batch[0]["entryId"]
        held_ids = [as_text(i) for i, _ in await admin.xrange(keys.held)]
        expected = [first[0], first[1], first[2], unkeyed[0], batch[0], batch[2]]
        assert held_ids == [r["entryId"] for r in expected]

        await admin.xgroup_create(STREAM, GROUP, id="$")  # the consumers' group: the replay waits for it
        async with resumption_worker(temporal_env.client, task_queue, admin_url):
            handle = await start(temporal_env.client, task_queue, experiment_id="N1", batch_size=2)
            result = await handle.result()
        assert (result.outcome.value, result.replayed, result.remaining) == ("completed", 6, 0)
        [after] = await asyncio.to_thread(node_producer, producer_url, [enqueue("N1", ("after", None))])
        assert after[0]["destination"] == "stream"
        replayed = [as_text(f[b"task"]) for _, f in await admin.xrange(STREAM)]
        assert replayed == ["before", "t0", "t1", "t2", "t3", "t4", "t5", "after"]
        assert (await admin.xrange(STREAM))[2][1] == {b"task": b"t1", b"n": b"1"}  # byte for byte
        assert [e for e in await admin.acl_log() if as_text(e["object"]) != "client|setinfo"] == []
    finally:
        await admin.aclose()


def test_built_files_and_node_modules_are_not_in_the_repository() -> None:
    for generated in ("node_modules/redis", "src/script.js", "types/index.d.ts"):
        ignored = subprocess.run(["git", "check-ignore", "-q", str(PACKAGE / generated)], cwd=ROOT, check=False)
        assert ignored.returncode == 0, generated
    assert (PACKAGE / "package-lock.json").is_file()
