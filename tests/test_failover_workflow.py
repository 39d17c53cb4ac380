"""A crash failover with a delayed replica under the workflow (issue 23), once per mode.

The harness is ``tests.support.failover``: the replica's replication link is held by a proxy, so it
lags by exactly the writes made since; the primary is killed with SIGKILL and the replica promoted
behind the clients' stable address. A replay runs on a worker through that address, and the test
is its consumer, reading and acknowledging at chosen points, so that the loss window is exact.

- Without replica acknowledgements: every task the run was told it moved and Redis lost is moved
  again marked ``xmc-redelivery``; the run counts them (result, progress, ``XmcRedelivered``), and
  the count is the duplicates the consumer saw.
- With them: nothing the run was told it moved is lost, so nothing is moved twice; no
  acknowledged enqueue is lost.
- In both, no fencing token is handed out twice.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
import pytest_asyncio
from redis.asyncio import Redis
from temporalio.client import ScheduleActionStartWorkflow, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.support.failover import ACKS, HELD_ACKS, CrashFailover, crash_failover, until
from tests.support.helpers import GROUP, RUNNER, STREAM, start, wait_for
from tests.test_cli import Xmc, xmc_fixture  # noqa: F401  (the fixture)
from xmc_resumption.activities.resumption import ResumptionActivities
from xmc_resumption.reconcile import (
    MIN_SCHEDULE_SECONDS,
    UNDONE_COMPLETIONS,
    ReconcileActivities,
    schedule_id,
    schedule_reconcile,
)
from xmc_resumption.redisclient import failover, held
from xmc_resumption.redisclient.connection import require_replica_acks
from xmc_resumption.redisclient.errors import ReplicaAckError
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.workflows import fleet
from xmc_resumption.workflows.models import Outcome, Progress, ReconcileInput, ResumptionInput, ResumptionResult
from xmc_resumption.workflows.reconcile import ReconcileWorkflow
from xmc_resumption.workflows.resumption import ResumptionWorkflow

pytestmark = [pytest.mark.real_server, pytest.mark.slow]  # visibility holds the fleet view's search attributes

THRESHOLD = 10
TASKS = 40


@pytest_asyncio.fixture
async def servers(tmp_path: Path) -> AsyncIterator[CrashFailover]:
    async with crash_failover(tmp_path) as made:
        yield made


class Consumer:
    """The test's task worker in ``GROUP``: reads what the group has not delivered, acknowledging or not."""

    def __init__(self, servers: CrashFailover) -> None:
        self.servers = servers
        self.client = servers.client()
        self.seen: list[dict[bytes, bytes]] = []

    async def reconnect(self) -> None:
        """A new connection through the stable address (the old one died with the primary)."""
        await self.client.aclose()
        self.client = self.servers.client()

    async def read(self, *, ack: bool = True) -> int:
        """Read every entry not delivered yet; acknowledge them when ``ack``. Returns how many."""
        got = 0
        while reply := await self.client.xreadgroup(GROUP, "c1", {STREAM: ">"}, count=100):
            entries = [(entry_id, fields) for _, batch in reply for entry_id, fields in batch]
            self.seen += [fields for _, fields in entries]
            got += len(entries)
            if ack:
                await self.client.xack(STREAM, GROUP, *[entry_id for entry_id, _ in entries])
        return got

    def names(self) -> list[str]:
        return [fields[b"task"].decode() for fields in self.seen]

    def twice(self) -> list[str]:
        return sorted(name for name, count in Counter(self.names()).items() if count > 1)


async def replay_until(handle: WorkflowHandle, replayed: int) -> Progress:
    """The run's progress once it counts ``replayed`` moved and waits at the threshold."""
    return await wait_for(handle, lambda p: p.replayed == replayed and (p.backlog or 0) >= THRESHOLD, timeout=60)


async def drain_to_the_end(consumer: Consumer, handle: WorkflowHandle) -> None:
    """Consume (acknowledging) until the run ends."""
    task = asyncio.ensure_future(handle.result())
    while not task.done():
        await consumer.read()
        await asyncio.sleep(0.05)
    await consumer.read()


def worker(env: WorkflowEnvironment, task_queue: str, client: Redis) -> Worker:
    return Worker(
        env.client,
        task_queue=task_queue,
        workflows=[ResumptionWorkflow],
        activities=ResumptionActivities(client).all(),
        workflow_runner=RUNNER,
    )


async def listed(xmc: Xmc, env: WorkflowEnvironment, servers: CrashFailover, *args: str) -> list[dict[str, object]]:
    """``xmc list --json args``'s rows once visibility lists any (it lags the run by a moment)."""
    temporal = env.client.service_client.config.target_host
    rows: list[dict[str, object]] = []

    async def found() -> bool:
        nonlocal rows
        ran = await asyncio.to_thread(xmc, "list", "--json", *args, redis_at=servers.url, temporal=temporal)
        assert ran.returncode == 0, ran
        rows = json.loads(ran.stdout)["resumptions"]
        return bool(rows)

    await until(found, what=f"xmc list {' '.join(args)} listing a run")
    return rows


async def hold_all(client: Redis, keys: ExperimentKeys) -> tuple[list[str], list[str]]:
    """Pause the experiment and hold ``TASKS`` tasks behind a consumer group at 0; their names and held entry IDs."""
    await held.pause(client, keys)
    names = [f"t{i:02d}" for i in range(TASKS)]
    held_ids = [d.entry_id for d in await held.enqueue_tasks(client, keys, [{b"task": n.encode()} for n in names])]
    await client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    return names, held_ids


async def start_and_hold_the_link(
    env: WorkflowEnvironment, servers: CrashFailover, task_queue: str, experiment_id: str, consumer: Consumer
) -> WorkflowHandle:
    """Start the replay; once its first 10 moves were read and reached the replica, hold the replication link."""
    handle = await start(
        env.client, task_queue, experiment_id=experiment_id, max_backlog_threshold=THRESHOLD, batch_size=10,
        throttle_seconds=2.0,
    )  # fmt: skip
    await replay_until(handle, 10)
    assert await consumer.read() == 10
    await servers.in_sync()
    servers.hold()
    return handle


async def test_without_replica_acks_every_task_moved_twice_is_marked_and_counted(
    temporal_env: WorkflowEnvironment, servers: CrashFailover, task_queue: str, xmc: Xmc
) -> None:
    """40 held tasks, threshold 10. The first 10 moves and their acknowledgements reach the replica;
    then the link is held, and the run moves 20 more, which the consumer reads from the primary
    alone (the last 10 unacknowledged, so the run waits at the threshold, moving nothing, when the
    primary dies). On the promoted replica the run goes on with its token: it moves those 20 again,
    marked, and counts exactly the 20 duplicates the consumer saw."""
    keys = ExperimentKeys(STREAM, "WF1")
    setup = servers.client()
    names, held_ids = await hold_all(setup, keys)
    consumer, redis = Consumer(servers), servers.client()
    async with worker(temporal_env, task_queue, redis):
        handle = await start_and_hold_the_link(temporal_env, servers, task_queue, "WF1", consumer)
        await replay_until(handle, 20)
        assert await consumer.read() == 10
        told = await replay_until(handle, 30)
        assert await consumer.read(ack=False) == 10  # pending: the backlog stays at the threshold
        assert (told.last_moved_id, told.redelivered) == (held_ids[29], 0)
        await servers.crash()
        await consumer.reconnect()

        await drain_to_the_end(consumer, handle)
        result = await handle.result()
        shown = await handle.query(ResumptionWorkflow.progress)
        described = await handle.describe()
    assert (result.outcome, result.remaining, result.replayed) == (Outcome.COMPLETED, 0, TASKS)
    twice = consumer.twice()
    assert twice == names[10:30]  # read from the old primary, then again from the new one
    assert result.redelivered == len(twice) == shown.redelivered == 20
    assert described.typed_search_attributes.get(fleet.REDELIVERED) == 20
    assert described.typed_search_attributes.get(fleet.LAST_MOVED_ID) == held_ids[-1] == result.last_moved_id
    marked = [failover.redelivery_of(f) for f in consumer.seen]
    assert [m.held_id for m in marked if m] == held_ids[10:30]  # each second delivery marked, nothing else
    assert Counter(m.experiment_id for m in marked if m) == {"WF1": 20}
    # every task once on the new primary's stream, in order; one token, never handed out again
    assert [f[b"task"].decode() for _, f in await redis.xrange(STREAM)] == names
    assert result.token == int(await redis.get(keys.fence) or 0) - 1  # its release bumped the counter once
    # the fleet view: xmc list --redelivered shows the run and its count, and not a run without any
    [row] = await listed(xmc, temporal_env, servers, "--redelivered", "--experiment", "WF1", "--no-eta")
    assert (row["redelivered"], row["last_moved_id"], row["outcome"]) == (20, held_ids[-1], "completed")
    for client in (consumer.client, redis, setup):
        await client.aclose()


async def test_with_replica_acks_nothing_acknowledged_is_lost_and_nothing_moved_twice(
    temporal_env: WorkflowEnvironment, servers: CrashFailover, task_queue: str
) -> None:
    """The same replay on a worker and a producer in the acknowledged mode. While the link is held no
    write counts as done: the producer's enqueue raises ReplicaAckError (not acknowledged), and the
    run's publish is retried, its move never counted. After the crash (the old primary rejoining as
    the new one's replica): every acknowledged enqueue reached the stream once, the run moved nothing
    twice (0 redelivered), and a consumer got twice only tasks whose move was never acknowledged
    (what it read from the old primary: the documented limit)."""
    keys = ExperimentKeys(STREAM, "WA2")
    producer = servers.client()
    require_replica_acks(producer, ACKS)
    names, held_ids = await hold_all(producer, keys)
    consumer, redis = Consumer(servers), servers.client()
    require_replica_acks(redis, ACKS)
    async with worker(temporal_env, task_queue, redis):
        handle = await start_and_hold_the_link(temporal_env, servers, task_queue, "WA2", consumer)
        late = servers.client()
        require_replica_acks(late, HELD_ACKS)
        with pytest.raises(ReplicaAckError):
            await held.enqueue_tasks(late, keys, [{b"task": b"unacknowledged"}])
        waiting = await wait_for(handle, lambda p: p.redis_waits > 0, timeout=60)
        assert "replica(s) acknowledged the write" in (waiting.last_error or "")
        await consumer.read()  # whatever the unacknowledged moves put on the old primary
        told = await handle.query(ResumptionWorkflow.progress)
        assert (told.replayed, told.last_moved_id) == (10, held_ids[9])  # no unacknowledged move counted
        await servers.crash()
        await consumer.reconnect()
        await servers.rejoin()

        await drain_to_the_end(consumer, handle)
        result = await handle.result()
    assert (result.outcome, result.remaining, result.replayed, result.redelivered) == (Outcome.COMPLETED, 0, TASKS, 0)
    on_stream = [f[b"task"].decode() for _, f in await redis.xrange(STREAM)]
    assert on_stream == names  # every acknowledged enqueue, once, in order; the unacknowledged one is gone
    assert not any(failover.redelivery_of(f) for f in consumer.seen)
    assert set(consumer.twice()) <= set(names[10:])  # never a task whose move the run was told of
    assert result.token == int(await redis.get(keys.fence) or 0) - 1
    await until(lambda: _in_sync(servers), what="the rejoined replica in sync")
    for client in (consumer.client, redis, producer, late):
        await client.aclose()


async def _in_sync(servers: CrashFailover) -> bool:
    new, old = await servers.replica.info("replication"), await servers.primary.info("replication")
    return bool(old.get("slave_repl_offset") == new.get("master_repl_offset"))


class Gauges:
    """A metric meter that records what gauges are set to: ``{(name, labels): value}``."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}

    def create_gauge(self, name: str, *_: object) -> Gauges._Gauge:
        return Gauges._Gauge(self, name)

    class _Gauge:
        def __init__(self, meter: Gauges, name: str) -> None:
            self.meter, self.name = meter, name

        def set(self, value: int, labels: dict[str, str]) -> None:
            self.meter.values[(self.name, tuple(sorted(labels.items())))] = value


async def test_an_undone_completion_is_flagged_and_reconciled(
    temporal_env: WorkflowEnvironment, servers: CrashFailover, task_queue: str, xmc: Xmc
) -> None:
    """A resumption completes while the link is held (its claim, moves and release all lost): on the
    promoted replica the experiment is paused again with its 12 tasks held. ``xmc held --undone`` flags
    it, ``xmc reconcile --dry-run`` finds it, ``xmc reconcile --schedule`` creates then updates the
    Schedule, and ``ReconcileWorkflow`` (what the Schedule runs) resumes it with the completion's last
    moved ID: every task moved again is marked and counted, exactly the consumer's duplicates, under a
    token above the lost run's."""
    keys = ExperimentKeys(STREAM, "UC1")
    setup = servers.client()
    await held.pause(setup, keys)
    names = [f"u{i:02d}" for i in range(12)]
    held_ids = [d.entry_id for d in await held.enqueue_tasks(setup, keys, [{b"task": n.encode()} for n in names])]
    await setup.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    await servers.in_sync()
    servers.hold()
    consumer, redis, gauges = Consumer(servers), servers.client(), Gauges()
    resumption = ResumptionActivities(redis)
    reconciling = ReconcileActivities(resumption, meter=gauges)  # type: ignore[arg-type]
    temporal = temporal_env.client.service_client.config.target_host
    env = {"redis_at": servers.url, "temporal": temporal, "XMC_TASK_QUEUE": task_queue}
    async with Worker(
        temporal_env.client,
        task_queue=task_queue,
        workflows=[ResumptionWorkflow, ReconcileWorkflow],
        activities=[*resumption.all(), reconciling.reconcile_completions],
        workflow_runner=RUNNER,
    ):
        first = await (await start(temporal_env.client, task_queue, experiment_id="UC1")).result()
        assert (first.outcome, first.replayed, first.last_moved_id) == (Outcome.COMPLETED, 12, held_ids[-1])
        assert await consumer.read() == 12
        await servers.crash()
        await consumer.reconnect()

        async def flagged() -> bool:
            ran = await asyncio.to_thread(xmc, "held", "--undone", "--json", **env)
            assert ran.returncode == 0, ran
            [row] = json.loads(ran.stdout)["experiments"]
            return row["undone_completion"] is not None

        await until(flagged, what="xmc held --undone flagging UC1")
        shown = await asyncio.to_thread(xmc, "held", "--undone", **env)
        assert "12 held again after" in shown.stdout and "paused" in shown.stdout, shown
        dry = json.loads((await asyncio.to_thread(xmc, "reconcile", "--dry-run", "--json", **env)).stdout)
        assert [(u["experiment_id"], u["held_again"], u["started"]) for u in dry["undone"]] == [("UC1", 12, None)]
        assert (dry["undone"][0]["moved_through"], dry["undone"][0]["state"]) == (held_ids[-1], "paused")
        for expected in ("created", "updated"):
            made = await asyncio.to_thread(xmc, "reconcile", "--schedule", "1m", "--json", **env)
            assert json.loads(made.stdout) == {
                "schedule_id": f"xmc-reconcile-{STREAM}", "schedule": expected, "every_seconds": 60.0
            }, made  # fmt: skip
        schedule = temporal_env.client.get_schedule_handle(f"xmc-reconcile-{STREAM}")
        described = await schedule.describe()
        assert [i.every for i in described.schedule.spec.intervals] == [timedelta(minutes=1)]
        await schedule.delete()

        found = await temporal_env.client.execute_workflow(
            ReconcileWorkflow.run, ReconcileInput(task_queue=task_queue), id=f"reconcile-{task_queue}",
            task_queue=task_queue,
        )  # fmt: skip
        assert [(r.experiment_id, r.held_again, r.started) for r in found] == [("UC1", 12, "resumption-UC1")]
        assert gauges.values == {(UNDONE_COMPLETIONS, (("stream", STREAM),)): 1}
        again = temporal_env.client.get_workflow_handle("resumption-UC1", result_type=ResumptionResult)
        await drain_to_the_end(consumer, again)
        redone = await again.result()
    assert (redone.outcome, redone.replayed, redone.redelivered) == (Outcome.COMPLETED, 12, 12)
    assert consumer.twice() == names  # every task, delivered once before the failover and once after
    assert [failover.redelivery_of(f) for f in consumer.seen[12:]] == [
        failover.Redelivery("UC1", held_id) for held_id in held_ids
    ]
    assert redone.token > first.token  # the lost run's token is not handed out again
    for client in (consumer.client, redis, setup):
        await client.aclose()


async def test_the_reconcile_schedule_outlives_a_run_that_never_ran_and_stays_paused(
    temporal_env: WorkflowEnvironment, task_queue: str
) -> None:
    """No worker polls the Schedule's task queue (a mistyped one): its first run times out after the interval,
    so a later tick starts another. Paused by an operator, an update keeps it paused."""
    inp = ReconcileInput(stream=f"s-{task_queue}", task_queue=f"{task_queue}-nobody-polls")
    every = timedelta(seconds=MIN_SCHEDULE_SECONDS)
    assert await schedule_reconcile(temporal_env.client, inp, every) == "created"
    schedule = temporal_env.client.get_schedule_handle(schedule_id(inp.stream))
    try:
        action = (await schedule.describe()).schedule.action
        assert isinstance(action, ScheduleActionStartWorkflow) and action.execution_timeout == every

        async def started_twice() -> bool:
            await asyncio.sleep(0.2)
            return (await schedule.describe()).info.num_actions >= 2

        await until(started_twice, timeout=60, what="a second run after the first timed out")
        await schedule.pause(note="held by the operator")
        assert await schedule_reconcile(temporal_env.client, inp, timedelta(minutes=1)) == "updated"
        described = (await schedule.describe()).schedule
        assert (described.state.paused, described.state.note) == (True, "held by the operator")
        assert [i.every for i in described.spec.intervals] == [timedelta(minutes=1)]
    finally:
        await schedule.delete()


async def test_reconcile_refuses_bad_intervals_and_a_bad_input(xmc: Xmc) -> None:
    """The schedule's interval is a duration 10 s..7 d; the input's moved_through an entry ID."""
    for bad in ("5s", "8d", "10", "1w", "\u0661\u0660m"):
        ran = await asyncio.to_thread(xmc, "reconcile", "--schedule", bad)
        assert ran.returncode == 2 and "--schedule" in ran.stderr, ran
    with pytest.raises(ValueError, match="moved_through must be a stream entry ID"):
        ResumptionInput(experiment_id="E", moved_through="12")
    assert ResumptionInput(experiment_id="E", moved_through="1-2").moved_through == "1-2"
