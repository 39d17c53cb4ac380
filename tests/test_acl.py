"""Issue 9, item 1: the Redis ACL of ``deploy/redis-acl.conf`` lets the worker and the CLI do their
job and nothing else. A real redis-server loads the file; the Redis layer, the CLI and one replay
run as its user; calls outside the rule are refused, and a refusal inside a replay fails the run at
once with an error naming the user and the command, the experiment handed back as paused."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import re
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from redis.asyncio import Redis
from redis.exceptions import NoPermissionError, ResponseError
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from tests.support.helpers import resumption_worker, run_module, start
from tests.support.secure import ACL_FILE, ACL_USER, ROOT, SECRET, acl_redis
from xmc_resumption.activities.requests import (
    AcquireRequest,
    CheckRequest,
    DrainWaitRequest,
    ExperimentRef,
    IdleConsumersRequest,
    PublishRequest,
    ReleaseRequest,
    SetAsideRequest,
)
from xmc_resumption.activities.resumption import ResumptionActivities
from xmc_resumption.redisclient import deadletter, held, weights
from xmc_resumption.redisclient.acl import denial_message
from xmc_resumption.redisclient.keys import ExperimentKeys, as_text
from xmc_resumption.redisclient.publish import PublishParams
from xmc_resumption.redisclient.scripts import source
from xmc_resumption.services import free_port
from xmc_resumption.status import experiment_status

pytestmark = [pytest.mark.real_server, pytest.mark.slow]

STREAM = "xmc-tasks-stream"
GROUP = "xmc-workers"
NARROW_USER = "xmc-narrow"


@pytest.fixture(scope="module")
def acl_urls() -> Iterator[tuple[str, str]]:
    """(admin URL, ACL user URL) of a redis-server that loaded ``deploy/redis-acl.conf``."""
    with acl_redis() as urls:
        yield urls


@pytest_asyncio.fixture
async def admin(acl_urls: tuple[str, str]) -> AsyncIterator[Redis]:
    """The admin (the ``default`` user) on an emptied database, its ACL log reset."""
    client = Redis.from_url(acl_urls[0], decode_responses=False)
    await client.flushall()
    await client.execute_command("ACL", "LOG", "RESET")
    yield client
    await client.aclose()


@pytest_asyncio.fixture
async def user(acl_urls: tuple[str, str]) -> AsyncIterator[Redis]:
    """A client of the ACL user, as ``Settings.redis()`` would make it (bytes, the URL's user)."""
    client = Redis.from_url(acl_urls[1], decode_responses=False)
    yield client
    await client.aclose()


def activity_env(activity_type: str) -> ActivityEnvironment:
    """An SDK activity environment whose ``activity.info()`` names ``activity_type``."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, activity_type=activity_type)
    return env


def file_rule() -> list[str]:
    """The rule of the shipped ACL file's user: its tokens after the name, without on/off."""
    [line] = [line for line in ACL_FILE.read_text().splitlines() if line.startswith(f"user {ACL_USER} ")]
    return [t for t in line.split()[2:] if t not in ("on", "off")]


async def refusals(admin: Redis) -> list[str]:
    """What the ACL log recorded as refused to the ACL user (``object`` of each entry). ``CLIENT
    SETINFO``, which redis-py sends on connect and whose refusal it ignores, is left out: Redis 7.0
    does not know it (and an ACL rule cannot name it there), Redis 7.2 refuses and logs it."""
    entries = await admin.acl_log()
    return [
        as_text(e["object"])
        for e in entries
        if as_text(e["username"]) == ACL_USER and as_text(e["object"]) != "client|setinfo"
    ]


def test_the_documented_line_is_the_files_rule() -> None:
    """The ``ACL SETUSER`` line an operator copies from docs/security.md grants exactly the file's rule."""
    page = (ROOT / "docs" / "security.md").read_text()
    [line] = [ln for ln in page.splitlines() if ln.startswith(f"ACL SETUSER {ACL_USER} ")]
    tokens = [t for t in line.split()[3:] if t not in ("on", "off") and not t.startswith(">")]
    assert tokens == file_rule()
    for forbidden in ("+@all", "allkeys", "~*", "+flushall", "+config", "+keys", "+scan", "+eval "):
        assert forbidden not in " ".join(tokens) + " ", forbidden


async def test_the_redis_layer_runs_as_the_acl_user(admin: Redis, user: Redis) -> None:
    """Every call of the worker's activities and of the CLI's Redis side, as the ACL user: pause,
    enqueue, status, acquire, check, measure, poll, publish, idle consumers, set aside, dead-letter
    list, retry and drop, release; nothing was refused (the server's ACL log is empty)."""
    keys = ExperimentKeys(STREAM, "A1")
    ref = ExperimentRef(experiment_id="A1", stream=STREAM, consumer_group=GROUP)
    await admin.xgroup_create(STREAM, GROUP, id="$", mkstream=True)  # the consumers' side, not ours
    acts, env = ResumptionActivities(user), ActivityEnvironment()

    await held.pause(user, keys)
    ids = [(await held.enqueue_task(user, keys, {"task": f"t{i}"})).entry_id for i in range(5)]
    grant = await env.run(acts.acquire_claim, AcquireRequest(ref=ref, owner="w1", lease_ms=60_000, request_id="r1"))
    token = grant.token
    assert grant.held == 5
    assert not (await env.run(acts.check_claim, CheckRequest(ref=ref, token=token, owner="w1", lease_ms=60_000))).fenced
    drained = DrainWaitRequest(
        ref=ref, threshold=10, low_watermark=0, min_seconds=0, max_seconds=0.1, poll_seconds=0.05
    )
    drain = await env.run(acts.wait_for_drain, drained)
    assert drain.reached and drain.reading.backlog == 0
    aside = await env.run(acts.set_aside, SetAsideRequest(ref=ref, token=token, entry_id=ids[0]))
    assert (aside.status.value, aside.dead) == ("set_aside", 1)
    published = await env.run(
        acts.publish_rounds,
        PublishRequest(
            ref=ref, params=PublishParams(token=token, seq=1, batch_size=2, threshold=10, owner="w1", lease_ms=60_000)
        ),
    )
    assert (published.scripts, published.moved) == (1, 2)
    # the fair share's weights and replayers (fair.lua) and the memory fraction (memory.lua)
    await weights.set_weight(user, STREAM, "A1", 3)
    fair = await env.run(
        acts.publish_rounds,
        PublishRequest(ref=ref, params=PublishParams(
            token=token, seq=2, batch_size=1, threshold=10, owner="w1", lease_ms=60_000,
            fair_share=True, max_memory_fraction=0.99,
        )),
    )  # fmt: skip
    assert (fair.final.status.value, fair.moved) == ("published", 1)
    status = await experiment_status(user, keys, GROUP, 10)
    assert (status["state"], status["held"], status["set_aside"], status["fence"]) == ("resuming", 1, 1, token)
    assert status["backlog"] == {
        "group": GROUP, "limiting_group": GROUP, "pending": 0, "lag": 3, "capped": False, "status": "ok",
        "missing_group": None, "threshold": 10,
        "groups": [{"name": GROUP, "pending": 0, "lag": 3, "capped": False, "bytes_capped": False, "counted": True,
                    "missing": False, "consumers": 0, "bounds": True, "lag_source": "behind", "exact": True}],
    }  # fmt: skip
    assert status["idle_consumers"] == []
    # who holds pending entries (XINFO CONSUMERS): read by a stalled replay
    await admin.xreadgroup(GROUP, "c1", {STREAM: ">"}, count=1)
    idle = await env.run(acts.idle_consumers, IdleConsumersRequest(ref=ref, groups=[GROUP], min_idle_ms=0))
    assert [(c.group, c.consumer, c.pending) for c in idle] == [(GROUP, "c1", 1)]
    [(dead_id, fields, _)] = await deadletter.dead_letters(user, keys)
    assert fields == 1 and await deadletter.retry(user, keys, dead_id) == "held"
    [(back_id, _)] = await admin.xrevrange(keys.held, count=1)
    assert (await deadletter.set_aside(user, keys, token, back_id.decode())).status.value == "set_aside"
    [(dead_id, _, _)] = await deadletter.dead_letters(user, keys)
    assert await deadletter.drop(user, keys, dead_id)
    released = await env.run(acts.release_claim, ReleaseRequest(ref=ref, token=token, owner="w1", back_to_paused=True))
    assert released.token == token
    # XMC_REPLICA_ACKS: WAIT after the claim, the publishes and the release (no replica here to wait for)
    assert await admin.execute_command("ACL", "DRYRUN", ACL_USER, "WAIT", "1", "1000") == b"OK"
    # the memory guard's reading, directly and from a script (registered: SCRIPT LOAD + EVALSHA)
    assert (await user.info("memory"))["used_memory"] > 0
    assert b"used_memory:" in await user.register_script("return redis.call('INFO', 'memory')")()
    assert await refusals(admin) == []
    assert await admin.xlen(STREAM) == 3 and await admin.get(keys.state) == b"paused"


@pytest.mark.parametrize(
    ("command", "refused"),
    [
        (["FLUSHALL"], "'flushall'"),
        (["CONFIG", "GET", "requirepass"], "'config|get'"),
        (["KEYS", "*"], "'keys'"),
        (["SCAN", "0"], "'scan'"),
        (["ACL", "LIST"], "'acl|list'"),
        (["EVAL", "return 1", "0"], "'eval'"),
        (["XGROUP", "DESTROY", STREAM, "g"], "'xgroup|destroy'"),
        (["GET", "some-other-key"], "keys"),
        (["XADD", "another-stream", "*", "f", "v"], "keys"),
        (["SET", "{another-stream}:experiment:E:state", "paused"], "keys"),
        (["GET", "xmc-tasks-stream-2"], "keys"),  # the pattern is the exact stream, not a prefix
    ],
)
async def test_calls_outside_the_rule_are_refused(admin: Redis, user: Redis, command: list[str], refused: str) -> None:
    with pytest.raises(NoPermissionError) as err:
        await user.execute_command(*command)
    assert "no permissions" in str(err.value) and refused in str(err.value)
    assert await refusals(admin) != []


async def test_a_script_on_another_stream_is_refused_without_retry(user: Redis) -> None:
    """The scripts touch only the keys they are given, and the ACL checks them inside the script:
    a replay pointed at a stream outside the rule fails at once (non-retryable), naming the user
    and the step."""
    ref = ExperimentRef(experiment_id="A2", stream="another-stream", consumer_group=GROUP)
    with pytest.raises(ApplicationError) as err:
        await activity_env("acquire_claim").run(
            ResumptionActivities(user).acquire_claim, AcquireRequest(ref=ref, owner="w", lease_ms=1000, request_id="r")
        )
    assert (err.value.type, err.value.non_retryable) == ("RedisPermissionDenied", True)
    message = str(err.value)
    # EVALSHA's declared keys are checked before the script runs: the step names the call
    assert (
        f"Redis ACL user '{ACL_USER}' may not access a key outside its key patterns, in acquire_claim: NOPERM"
        in message
    )
    assert SECRET not in message


@pytest_asyncio.fixture
async def narrow_url(admin: Redis, acl_urls: tuple[str, str]) -> AsyncIterator[str]:
    """A user with the file's rule minus ``XINFO GROUPS`` and ``XLEN`` (a rule that forgot them)."""
    rule = [t for t in file_rule() if t not in ("+xinfo|groups", "+xlen")]
    await admin.execute_command("ACL", "SETUSER", NARROW_USER, "reset", "on", f">{SECRET}", *rule)
    yield acl_urls[1].replace(f"{ACL_USER}:", f"{NARROW_USER}:")
    await admin.execute_command("ACL", "DELUSER", NARROW_USER)


async def test_a_command_refused_inside_a_script_names_the_script(admin: Redis, narrow_url: str) -> None:
    await admin.xadd(STREAM, {"task": "t"})  # the script calls XINFO GROUPS only on a stream that exists
    narrow = Redis.from_url(narrow_url)
    ref = ExperimentRef(experiment_id="A3", stream=STREAM, consumer_group=GROUP)
    try:
        with pytest.raises(ApplicationError) as err:
            await activity_env("wait_for_drain").run(
                ResumptionActivities(narrow).wait_for_drain,
                DrainWaitRequest(ref=ref, threshold=5, low_watermark=0, min_seconds=0, max_seconds=1, poll_seconds=0.1),
            )
    finally:
        await narrow.aclose()
    assert (err.value.type, err.value.non_retryable) == ("RedisPermissionDenied", True)
    # Redis 7.0 does not name the command refused inside a script (7.2 does: 'xinfo|groups')
    assert re.search(
        rf"Redis ACL user '{NARROW_USER}' may not run (XINFO\|GROUPS \(from the measure script\)|"
        r"a command of the measure script \(EVALSHA\)), in wait_for_drain: ",
        str(err.value),
    ), str(err.value)


@pytest.mark.parametrize("args", [["status", "A4"], ["dead", "A4", "--retry", "1-1"]])
async def test_the_cli_names_the_user_and_the_command(admin: Redis, narrow_url: str, args: list[str]) -> None:
    await admin.xadd(ExperimentKeys(STREAM, "A4").dead, {"task": "t"}, id="1-1")  # for --retry to move
    proc = run_module("xmc_resumption", *args, XMC_REDIS_URL=narrow_url)
    assert proc.returncode == 2, proc.stderr
    if args[0] == "status":  # every part it may not read is one line; the rest is shown on stdout
        lines = proc.stderr.splitlines()
        assert [line.split(", reading ")[1].split(":")[0] for line in lines] == ["state", "set_aside"], lines
        for line in lines:
            assert line.startswith(f"xmc status: Redis ACL user '{NARROW_USER}' may not run XLEN, reading "), line
        assert json.loads(run_module("xmc_resumption", *args, "--json", XMC_REDIS_URL=narrow_url).stdout)["fence"] == 0
        assert SECRET not in proc.stderr + proc.stdout
        return
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    line = proc.stderr.strip()
    assert line.startswith(f"xmc {args[0]}: Redis ACL user '{NARROW_USER}' may not run "), line
    assert f", at XMC_REDIS_URL=redis://{NARROW_USER}:***@127.0.0.1:" in line and SECRET not in line


async def test_the_plan_runs_as_the_acl_user_and_names_what_a_rule_refuses(
    admin: Redis, acl_urls: tuple[str, str]
) -> None:
    """``xmc plan`` as the shipped rule's user: every read allowed, no refusal in the plan nor in the
    ACL log. As a user whose rule lacks XDEL: the plan reads all the same and names XDEL on the
    held stream, asked of Redis without running it."""
    keys = ExperimentKeys(STREAM, "A7")
    await admin.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    await held.pause(admin, keys)
    for i in range(3):
        await held.enqueue_task(admin, keys, {"task": f"t{i}"})
    env = {"TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}"}
    shipped = run_module(
        "xmc_resumption", "plan", "A7", "--sample-seconds", "0.1", "--json", XMC_REDIS_URL=acl_urls[1], **env
    )
    assert shipped.returncode == 0, shipped.stderr
    doc = json.loads(shipped.stdout)
    assert (doc["held"], doc["refusals"], doc["newest"] is not None) == (3, [], True)
    assert await refusals(admin) == []
    rule = [t for t in file_rule() if t != "+xdel"]
    await admin.execute_command("ACL", "SETUSER", NARROW_USER, "reset", "on", f">{SECRET}", *rule)
    try:
        narrow = run_module(
            "xmc_resumption",
            "plan",
            "A7",
            "--sample-seconds",
            "0",
            "--json",
            XMC_REDIS_URL=acl_urls[1].replace(f"{ACL_USER}:", f"{NARROW_USER}:"),
            **env,
        )
    finally:
        await admin.execute_command("ACL", "DELUSER", NARROW_USER)
    assert narrow.returncode == 0, narrow.stderr
    assert json.loads(narrow.stdout)["refusals"] == [
        f"Redis ACL user '{NARROW_USER}' may not run XDEL on {keys.held} (see deploy/redis-acl.conf)"
    ]


async def test_the_cli_and_one_replay_run_as_the_acl_user(
    admin: Redis, acl_urls: tuple[str, str], temporal_env: WorkflowEnvironment, task_queue: str
) -> None:
    """``xmc pause``, ``enqueue``, ``status``, ``resume --wait`` and ``dead`` as the ACL user, with a
    worker whose Redis client is the ACL user's: the replay completes, every task reaches the
    stream once and in order, and the ACL log records no refusal."""
    env = {
        "XMC_REDIS_URL": acl_urls[1],
        "XMC_TASK_QUEUE": task_queue,
        "TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
    }
    await admin.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    for args in (["pause", "A5"], ["enqueue", "A5", "--count", "40"]):
        assert run_module("xmc_resumption", *args, **env).returncode == 0
    async with resumption_worker(temporal_env.client, task_queue, acl_urls[1]):
        # in a thread: the worker runs on this event loop while the command waits for the result
        resume = ("resume", "A5", "--batch", "15", "--threshold", "100", "--wait", "--json")
        proc = await asyncio.to_thread(run_module, "xmc_resumption", *resume, timeout=60, **env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["result"]["outcome"] == "completed"
    status = run_module("xmc_resumption", "status", "A5", "--json", **env)
    assert status.returncode == 0, status.stderr
    assert (json.loads(status.stdout)["state"], json.loads(status.stdout)["held"]) == ("running", 0)
    dead = run_module("xmc_resumption", "dead", "A5", "--json", **env)
    assert (dead.returncode, json.loads(dead.stdout)["tasks"]) == (0, []), dead.stderr
    tasks = [fields[b"task"] for _, fields in await admin.xrange(STREAM)]
    assert tasks == [f"A5:{i:06d}".encode() for i in range(40)]
    assert await refusals(admin) == []


async def test_a_refusal_fails_the_replay_at_once_and_hands_the_experiment_back(
    admin: Redis, narrow_url: str, temporal_env: WorkflowEnvironment, task_queue: str
) -> None:
    keys = ExperimentKeys(STREAM, "A6")
    await held.pause(admin, keys)
    for i in range(3):
        await held.enqueue_task(admin, keys, {"task": f"t{i}"})
    async with resumption_worker(temporal_env.client, task_queue, narrow_url):
        handle = await start(temporal_env.client, task_queue, experiment_id="A6")
        with pytest.raises(WorkflowFailureError) as err:
            await handle.result()
    cause = err.value.cause
    while cause is not None and not isinstance(cause, ApplicationError):
        cause = cause.__cause__
    assert isinstance(cause, ApplicationError) and cause.type == "RedisPermissionDenied", err.value
    # the acquire script is the first to call XLEN
    assert f"Redis ACL user '{NARROW_USER}' may not run " in str(cause) and "in acquire_claim" in str(cause)
    history = await handle.fetch_history()
    assert len(history.events) < 40  # failed at once: no retries, no waits for Redis
    assert await admin.get(keys.state) == b"paused" and await admin.xlen(keys.held) == 3


def test_acl_file_has_no_password() -> None:
    """The shipped file carries no secret: the user starts off, without a password."""
    text = ACL_FILE.read_text()
    assert " off " in text and ">" not in text and "#" not in text and "nopass" not in text


@pytest.mark.parametrize(
    ("reply", "error", "expected"),
    [
        # Redis 7.2 and later word refusals differently; this server (7.0) cannot produce them
        ("User u has no permissions to run the 'flushall' command", NoPermissionError, "may not run FLUSHALL, in x"),
        ("No permissions to access a key", NoPermissionError, "may not access a key outside its key patterns, in x"),
        (
            "ERR ACL failure in script: User u has no permissions to run the 'del' command script: {sha}, "
            "on @user_script:57.",
            ResponseError,
            "may not run DEL (from the publish script), in x: ERR ACL failure in script: User u has no permissions "
            "to run the 'del' command (see",
        ),
        ("WRONGTYPE Operation against a key holding the wrong kind of value", ResponseError, None),
    ],
)
def test_the_refusal_forms_of_later_redis_versions(reply: str, error: type[Exception], expected: str | None) -> None:
    sha = hashlib.sha1(source("publish").encode(), usedforsecurity=False).hexdigest()
    message = denial_message(error(reply.format(sha=sha)), "u", "in x")
    assert message is None if expected is None else (message and expected in message), message


@pytest_asyncio.fixture
async def no_info_url(admin: Redis, acl_urls: tuple[str, str]) -> AsyncIterator[str]:
    """A user with the file's rule minus ``INFO`` (which the scripts read the memory settings with)."""
    rule = [t for t in file_rule() if t != "+info"]
    await admin.execute_command("ACL", "SETUSER", "xmc-no-info", "reset", "on", f">{SECRET}", *rule)
    yield acl_urls[1].replace(f"{ACL_USER}:", "xmc-no-info:")
    await admin.execute_command("ACL", "DELUSER", "xmc-no-info")


async def test_a_refused_info_is_named_and_status_shows_the_rest(admin: Redis, no_info_url: str) -> None:
    """Redis 7.0 names no command refused inside a script, only the script's line: the message
    names INFO from that line (it said "EVALSHA" once). ``xmc status`` shows every part it can
    read and marks the memory part unknown with the reason (it failed outright once), exit 2."""
    keys = ExperimentKeys(STREAM, "A7")
    await held.pause(admin, keys)
    await held.enqueue_task(admin, keys, {"task": "t"})
    client = Redis.from_url(no_info_url)
    ref = ExperimentRef(experiment_id="A7", stream=STREAM, consumer_group=GROUP)
    try:
        with pytest.raises(ApplicationError) as err:
            await activity_env("acquire_claim").run(
                ResumptionActivities(client).acquire_claim,
                AcquireRequest(ref=ref, owner="me", lease_ms=60_000, request_id="r1"),
            )
    finally:
        await client.aclose()
    assert (err.value.type, err.value.non_retryable) == ("RedisPermissionDenied", True)
    assert "Redis ACL user 'xmc-no-info' may not run INFO (from the acquire script), in acquire_claim" in str(err.value)
    proc = run_module("xmc_resumption", "status", "A7", "--json", XMC_REDIS_URL=no_info_url)
    assert proc.returncode == 2, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["state"], doc["held"], doc["fence"], doc["set_aside"], doc["redis_memory"]) == ("paused", 1, 0, 0, None)
    assert doc["backlog"]["status"] == "no_stream"
    reason = "Redis ACL user 'xmc-no-info' may not run INFO (from the memory_status script), reading redis_memory"
    assert list(doc["unknown"]) == ["redis_memory"] and doc["unknown"]["redis_memory"].startswith(reason)
    assert proc.stderr.splitlines() == [f"xmc status: {doc['unknown']['redis_memory']}"]
    text = run_module("xmc_resumption", "status", "A7", XMC_REDIS_URL=no_info_url)
    assert text.returncode == 2 and f"A7 on {STREAM}: paused\n  held: 1 tasks; set aside: 0\n" in text.stdout
    assert f"  redis memory: unknown ({reason}" in text.stdout
    assert SECRET not in proc.stdout + proc.stderr + text.stdout + text.stderr
