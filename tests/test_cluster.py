"""Redis Cluster (issue 8, item 2): a 3-primary cluster on loopback ports (``tests.support.cluster``).

The Redis layer's tests of the other modules run here again against the cluster client: they are
imported below, and this module's ``redis`` fixture (a cluster client) replaces conftest's for
them. Then what only a cluster shows: the one-slot check before a script call, the hash tag, the
dead-letter transaction, a slot map refreshed after a wrong-node reply, and replays through
Temporal whose streams live on different primaries, one of them moved to another primary mid-run.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any

import pytest
import pytest_asyncio
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import ConnectionError, MovedError, ResponseError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.support.cluster import LocalCluster, local_cluster
from tests.support.helpers import GROUP, RUNNER, STREAM, history_calls
from tests.test_backlog import (  # noqa: F401  (collected again here, against the cluster)
    test_backlog_case,
    test_lag_count_stops_just_past_the_threshold,
    test_missing_group_error_policy_raises,
    test_missing_group_wait_policy_leaves_no_headroom,
    test_missing_group_zero_policy_counts_the_stream_and_warns,
    test_missing_stream_is_zero_under_the_zero_policy_and_an_error_under_error,
    test_pending_alone_at_threshold_skips_the_count,
    test_threshold_below_one_is_refused,
)
from tests.test_claims_and_enqueue import (  # noqa: F401
    test_a_late_repeat_of_an_acquire_changes_nothing,
    test_a_released_token_is_fenced_for_good,
    test_acquire_resumes_held_tasks_whose_state_key_is_gone,
    test_check_extends_the_lease,
    test_empty_task_is_refused,
    test_enqueue_follows_the_pause_state,
    test_enqueue_keeps_field_maps_byte_for_byte,
    test_lapsed_lease_is_reestablished_for_the_current_token,
    test_lease_below_one_ms_is_refused,
    test_newest_claim_wins_and_stale_tokens_are_fenced,
    test_release_by_owner_when_the_token_is_unknown,
    test_release_can_hand_the_experiment_back_as_paused,
)
from tests.test_dead_letters import (  # noqa: F401
    POISON,
    test_a_dead_letter_key_of_the_wrong_type_moves_nothing,
    test_a_producer_cannot_enqueue_a_task_the_scripts_could_not_move,
    test_set_aside_moves_it_byte_for_byte_once_and_only_under_the_current_token,
    test_the_publish_stops_before_a_poison_task_and_writes_nothing_half_done,
)
from tests.test_publish import (  # noqa: F401
    test_a_count_cut_by_the_byte_budget_takes_an_upper_bound,
    test_a_publish_moves_about_its_byte_budget_of_large_tasks,
    test_a_publish_sets_the_claims_lease,
    test_a_released_token_publishes_nothing,
    test_a_retry_after_the_lease_lapsed_still_returns_the_recorded_result,
    test_bad_arguments_are_refused,
    test_binary_values_a_1_mib_value_and_1000_fields_move_byte_for_byte,
    test_exactly_once_in_order_under_consumers_and_racing_replayers,
    test_field_maps_move_byte_for_byte,
    test_missing_group_policies,
    test_missing_stream_refuses_under_the_error_policy,
    test_moves_oldest_first_and_completes,
    test_never_takes_the_backlog_past_the_threshold,
    test_paused_experiment_publishes_nothing,
    test_repeated_seq_returns_the_recorded_result_and_older_seq_moves_nothing,
    test_stale_token_publishes_nothing,
    test_wrong_type_task_stream_raises_and_moves_nothing,
)
from tests.test_redis_contents import (  # noqa: F401
    test_a_corrupt_fence_fails_every_script_before_any_write_naming_the_key,
    test_a_fence_at_the_incr_limit_refuses_a_new_claim_and_writes_nothing,
    test_a_fence_that_went_back_is_data_loss_not_a_takeover,
    test_a_fenced_publish_reports_no_count_and_the_caller_keeps_its_own,
    test_a_key_of_the_wrong_type_is_named,
    test_a_record_written_before_the_count_existed_keeps_no_count,
    test_a_state_value_the_contract_does_not_know_never_reorders_tasks,
    test_every_claim_script_reads_before_it_writes,
    test_held_tasks_without_a_state_key_still_hold_new_ones,
    test_the_count_is_the_publish_scripts_whatever_the_caller_lost,
    test_tokens_are_exact_up_to_the_incr_limit,
)
from xmc_resumption.activities.resumption import ResumptionActivities
from xmc_resumption.consumer import run_consumer
from xmc_resumption.redisclient import deadletter, fencing, held
from xmc_resumption.redisclient.connection import drop_stale_connections
from xmc_resumption.redisclient.keys import ExperimentKeys, validate_name
from xmc_resumption.redisclient.results import ExperimentState, SetAsideStatus
from xmc_resumption.redisclient.scripts import CrossSlotKeysError, run_script
from xmc_resumption.services import free_port
from xmc_resumption.settings import Settings
from xmc_resumption.workflows.models import Outcome, ResumptionInput, ResumptionResult, ThrottlePolicy
from xmc_resumption.workflows.resumption import ResumptionWorkflow

pytestmark = [pytest.mark.real_server, pytest.mark.slow]

OTHER_STREAM = "clicks"
"""A second task stream: slot 12981, served by another primary than ``STREAM`` (slot 5175) in the
slot ranges ``redis-cli --cluster create`` hands out (checked by the tests that rely on it)."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(log_dir=tmp_path_factory.mktemp("cluster")) as running:
        yield running


def cluster_settings(cluster: LocalCluster) -> Settings:
    return Settings(redis_url=cluster.url, redis_cluster=True)


@pytest_asyncio.fixture
async def redis(cluster: LocalCluster) -> AsyncIterator[RedisCluster]:
    """A cluster client as ``Settings.redis()`` builds it, on emptied primaries (replaces
    conftest's ``redis`` for every test of this module, the imported ones too)."""
    client = cluster_settings(cluster).redis()
    assert isinstance(client, RedisCluster)
    await client.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield client
    await client.aclose()


def test_the_settings_choose_the_client_and_refuse_what_a_cluster_cannot_be() -> None:
    assert isinstance(Settings(redis_cluster=True).redis(), RedisCluster)
    assert not isinstance(Settings().redis(), RedisCluster)
    for url, why in [("unix:///tmp/r.sock", "redis:// or rediss://"), ("redis://h:1/2", "database 0 only")]:
        with pytest.raises(ValueError, match=why) as caught:
            Settings(redis_url=url, redis_cluster=True)
        assert caught.value.errors()[0]["loc"] == ("redis_cluster",)  # type: ignore[attr-defined]


async def test_a_cluster_that_cannot_be_read_fails_like_a_single_redis(redis_url: str) -> None:
    """No node answers: the seed's own ConnectionError (a RedisError: retried by the activities,
    one line from the CLI and the worker). A seed that is no cluster node: an error reply naming
    the setting (not retried)."""
    down = Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0", redis_cluster=True).redis()
    with pytest.raises(ConnectionError, match="Error 111"):
        await down.ping()
    single = Settings(redis_url=redis_url, redis_cluster=True).redis()
    with pytest.raises(ResponseError, match=r"Cluster mode is not enabled.*XMC_REDIS_CLUSTER"):
        await single.ping()
    await single.aclose()


async def test_the_cli_reads_an_experiment_on_the_cluster(cluster: LocalCluster, redis: RedisCluster) -> None:
    keys = ExperimentKeys(OTHER_STREAM, "E1")
    await hold(redis, keys, 3)
    env = {"PATH": "/usr/bin:/bin", "XMC_REDIS_URL": cluster.url, "XMC_REDIS_CLUSTER": "true"}
    out = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "xmc_resumption", "status", "E1", "--stream", OTHER_STREAM, "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    status = json.loads(out.stdout)
    assert (status["state"], status["held"], status["backlog"]["status"]) == ("paused", 3, "no_stream")


async def test_keys_of_two_slots_are_refused_before_redis_sees_them(redis: RedisCluster) -> None:
    a, b = ExperimentKeys(STREAM, "E1"), ExperimentKeys(OTHER_STREAM, "E1")
    keys = [a.fence, a.claim, a.state, b.held]
    with pytest.raises(CrossSlotKeysError) as caught:
        await run_script(redis, "check", keys, [1, "me", 1000])
    assert isinstance(caught.value, ValueError)  # the activities fail it without retrying
    message = str(caught.value)
    assert f"{a.fence} (slot 5175)" in message and f"{b.held} (slot 12981)" in message, message
    assert "2 slots" in message
    assert caught.value.slots == {key: key_slot(key.encode()) for key in keys}
    assert await redis.dbsize() == 0  # nothing was sent (dbsize sums every primary)


async def test_an_experiments_keys_share_the_streams_slot_on_the_server(redis: RedisCluster) -> None:
    """The server's own CLUSTER KEYSLOT agrees: ``S`` and ``{S}:experiment:E:...`` share a slot, and
    only because ``S`` has no brace; a name with one would move the hash tag, so it is refused."""
    keys = ExperimentKeys(OTHER_STREAM, "E1")
    every = [keys.stream, keys.state, keys.held, keys.claim, keys.fence, keys.publish, keys.acquire_log, keys.dead]
    assert {await redis.cluster_keyslot(key) for key in every} == {key_slot(OTHER_STREAM.encode())}
    braced = "tasks{a}"
    assert key_slot(braced.encode()) != key_slot(f"{{{braced}}}:experiment:E1:held".encode())  # what it would do
    with pytest.raises(ValueError, match="must be 1 to 200 of"):
        validate_name("stream", braced)


async def test_the_dead_letter_transaction_runs_on_the_slots_primary_and_fails_if_it_moved(
    cluster: LocalCluster, redis: RedisCluster
) -> None:
    """The dead-letter transaction runs on one connection to the primary the client's map names.
    Slot moved behind the client's back: it fails with MOVED and moves nothing; once the map is
    re-read (what the activity does on a MOVED before its retry) it moves the task, and the
    operator's retry puts it back where the experiment's state says."""
    keys = ExperimentKeys(OTHER_STREAM, "E1")
    await hold(redis, keys, 1)
    grant = await fencing.acquire_claim(redis, keys, "me", 60_000)
    [(entry_id, _)] = await redis.xrange(keys.held)
    slot = key_slot(OTHER_STREAM.encode())
    before = cluster.owner(slot)
    await asyncio.to_thread(cluster.move_slot, slot, next(port for port in cluster.ports if port != before))
    try:
        with pytest.raises(MovedError) as moved:
            await deadletter.set_aside(redis, keys, grant.token, entry_id.decode())
        await drop_stale_connections(redis, moved.value)
        result = await deadletter.set_aside(redis, keys, grant.token, entry_id.decode())
        assert (result.status, result.dead, await redis.xlen(keys.held)) == (SetAsideStatus.SET_ASIDE, 1, 0)
        [(dead_id, fields)] = await redis.xrange(keys.dead)
        assert await deadletter.retry(redis, keys, dead_id.decode()) == "held"  # resuming: back to the held stream
        assert (await redis.xlen(keys.dead), [f for _, f in await redis.xrange(keys.held)]) == (0, [fields])
        [(entry_id, _)] = await redis.xrange(keys.held)
        await deadletter.set_aside(redis, keys, grant.token, entry_id.decode())
        [(dead_id, _)] = await redis.xrange(keys.dead)
        await redis.delete(keys.state)  # the experiment runs again: a retried task goes to the consumers
        assert await deadletter.retry(redis, keys, dead_id.decode()) == "stream"
        assert [f for _, f in await redis.xrange(keys.stream)] == [fields]
    finally:
        await asyncio.to_thread(cluster.move_slot, slot, before)  # the other tests rely on the slot ranges


async def test_a_wrong_node_reply_rereads_the_slot_map(cluster: LocalCluster, redis: RedisCluster) -> None:
    """A slot moved behind the client's back: after a MOVED reaches the activities (or a READONLY,
    the same path), ``drop_stale_connections`` re-reads the map, so Temporal's retry goes to the
    slot's primary of now."""
    keys = ExperimentKeys(OTHER_STREAM, "E1")
    await held.pause(redis, keys)
    slot = key_slot(OTHER_STREAM.encode())
    before = cluster.owner(slot)
    assert redis.get_node_from_key(keys.state).port == before
    target = next(port for port in cluster.ports if port != before)
    assert await asyncio.to_thread(cluster.move_slot, slot, target) == 1
    try:
        assert redis.get_node_from_key(keys.state).port == before  # the client's map is stale
        await drop_stale_connections(redis, MovedError(f"{slot} 127.0.0.1:{target}"))
        assert redis.get_node_from_key(keys.state).port == target
        assert await held.get_state(redis, keys) is ExperimentState.PAUSED
    finally:
        await asyncio.to_thread(cluster.move_slot, slot, before)  # the other tests rely on the slot ranges


async def hold(redis: RedisCluster, keys: ExperimentKeys, n: int, poison_at: int | None = None) -> list[bytes]:
    """Pause the experiment and hold ``n`` tasks; with ``poison_at``, a task of 4,000 fields (one the
    scripts cannot move: the replay sets it aside) is held before the ``poison_at``-th. Returns the
    names of the tasks that can move, in order."""
    await held.pause(redis, keys)
    names = [f"{keys.stream}-{keys.experiment_id}-t{i}".encode() for i in range(n)]
    for i, name in enumerate(names):
        if i == poison_at:
            await redis.xadd(keys.held, {"task": b"poison", **POISON})
        await held.enqueue_task(redis, keys, {b"task": name})
    return names


async def replay(
    env: WorkflowEnvironment,
    worker_redis: RedisCluster,
    redis: RedisCluster,
    experiments: list[ExperimentKeys],
    during: Coroutine[Any, Any, None],
) -> list[ResumptionResult]:
    """Replay ``experiments`` at once through a worker whose activities use ``worker_redis``, while a
    consumer per stream (on ``redis``) drains it at 1,000 tasks/s and ``during`` runs alongside.
    Checks that each consumer read its held tasks exactly once, in order, and that no publish took
    a backlog past the threshold (50); returns the results."""
    task_queue = f"xmc-cluster-{uuid.uuid4().hex[:8]}"
    stop = asyncio.Event()
    seen: list[list[bytes]] = [[] for _ in experiments]
    for keys in experiments:
        await redis.xgroup_create(keys.stream, GROUP, id="$", mkstream=True)
    consumers = [
        asyncio.create_task(run_consumer(redis, keys.stream, GROUP, "c1", stop, out, count=10, rate=1_000))
        for keys, out in zip(experiments, seen, strict=True)
    ]
    expected = [[f[b"task"] for _, f in await redis.xrange(keys.held)] for keys in experiments]
    activities = ResumptionActivities(worker_redis).all()
    async with Worker(
        env.client, task_queue=task_queue, workflows=[ResumptionWorkflow], activities=activities, workflow_runner=RUNNER
    ):
        inputs = [
            ResumptionInput(
                experiment_id=keys.experiment_id,
                stream=keys.stream,
                max_backlog_threshold=50,
                batch_size=25,
                throttle_policy=ThrottlePolicy.ADAPTIVE,
            )
            for keys in experiments
        ]
        handles = [
            await env.client.start_workflow(ResumptionWorkflow.run, i, **i.start_options(task_queue)) for i in inputs
        ]
        await during
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 60)
        for handle in handles:
            calls = history_calls(await handle.fetch_history())
            assert all(r["backlog"] + r["moved"] <= 50 for kind, r in calls if kind == "publish_batch")
    stop.set()
    await asyncio.gather(*consumers)
    for keys, out, tasks in zip(experiments, seen, expected, strict=True):
        movable = [t for t in tasks if t != b"poison"]
        assert out == movable and [f[b"task"] for _, f in await redis.xrange(keys.stream)] == movable
    return results


async def test_replays_on_two_primaries_and_one_slot_moved_mid_run_deliver_every_task_once(
    temporal_env: WorkflowEnvironment, cluster: LocalCluster, redis: RedisCluster
) -> None:
    """Two experiments on two streams served by different primaries, replayed at once by one
    worker on its own cluster client (dev server: real time, as in production); the second holds
    a task the scripts cannot move, which the dead-letter transaction sets aside. Mid-run the
    first stream's slot moves, keys and all, to the third primary (ASK and TRYAGAIN while it
    moves, MOVED after): both replays complete, every task reaches its stream once, in order."""
    run = uuid.uuid4().hex[:6]
    a, b = ExperimentKeys(STREAM, f"E1-{run}"), ExperimentKeys(OTHER_STREAM, f"E2-{run}")
    slot_a, slot_b = key_slot(a.stream.encode()), key_slot(b.stream.encode())
    assert cluster.owner(slot_a) != cluster.owner(slot_b)
    third = next(port for port in cluster.ports if port not in (cluster.owner(slot_a), cluster.owner(slot_b)))
    await hold(redis, a, 600)
    await hold(redis, b, 600, poison_at=300)

    async def move_when_under_way() -> None:
        while await redis.xlen(a.stream) < 100:
            await asyncio.sleep(0.01)
        assert await redis.xlen(a.held) > 100  # mid-run: most tasks still held
        assert await asyncio.to_thread(cluster.move_slot, slot_a, third) >= 6  # the stream and its keys

    worker_redis = cluster_settings(cluster).redis()
    assert isinstance(worker_redis, RedisCluster)
    try:
        result_a, result_b = await replay(temporal_env, worker_redis, redis, [a, b], move_when_under_way())
        assert worker_redis.get_node_from_key(a.stream).port == third  # the worker's client followed a MOVED
    finally:
        await worker_redis.aclose()
    assert cluster.owner(slot_a) == third
    assert (result_a.outcome, result_a.replayed, result_a.set_aside) == (Outcome.COMPLETED, 600, 0)
    assert (result_b.outcome, result_b.replayed, result_b.set_aside) == (Outcome.COMPLETED, 600, 1)
    assert [f[b"task"] for _, f in await redis.xrange(b.dead)] == [b"poison"]
    for keys in (a, b):
        assert await held.get_state(redis, keys) is ExperimentState.RUNNING
        assert await redis.xlen(keys.held) == 0
