"""Chaos run (issue 6, item 7): a resumption replayed through crashes, checked for exactly once.

Holds ``tasks`` tasks (each with a sequence number and a few random binary bytes, under a binary
field name too), drains the task stream with consumers slower than the replay, and meanwhile
SIGKILLs the worker (``python -m worker``) ``worker_kills`` times, SIGKILLs and restarts
redis-server (AOF, ``appendfsync always``, same port and directory) and SIGKILLs and restarts the
Temporal dev server (same port and SQLite db file). Every fault fires once the consumers have
recorded a seeded random number of tasks and then, right after the next publish moved tasks out of
the held stream (conditions, never a sleep): with a batch below the threshold a refill is several
publishes back to back in one workflow task, so the fault lands while tasks are moved that the
history does not record yet. The seed and the schedule are printed; ``--seed`` replays the schedule.

The run owns every process it starts (its own redis-server and dev server, not a test session's)
and stops them all at the end, whatever happens.

``python -m bench.chaos`` runs the large size (50,000 tasks, 5 worker kills) by hand;
``tests/test_chaos.py`` runs the small one in CI. Both check: delivered = held (every task once),
0 duplicates, order and bytes kept, the held stream empty, the experiment running, the outcome
``completed`` and the result's ``replayed`` equal to what was delivered.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError

from xmc_resumption import search_attributes
from xmc_resumption.consumer import entries_of
from xmc_resumption.redisclient import held
from xmc_resumption.redisclient.keys import DEFAULT_GROUP, DEFAULT_STREAM, ExperimentKeys
from xmc_resumption.runs import start_resumption
from xmc_resumption.services import free_port, installed_binary, wait_for_port, wait_until_serving
from xmc_resumption.workflows.models import ResumptionInput, ResumptionResult
from xmc_resumption.workflows.resumption import ResumptionWorkflow

ROOT = Path(__file__).resolve().parents[1]
SEQ = b"seq"
BLOB = b"\xffbin\x00"
"""The binary field of every task: its name and value are not UTF-8, and must arrive byte for byte."""

REDIS_FAULTS: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError, OSError)
"""What a client sees while redis-server is down or loading its AOF (BusyLoadingError is a
ConnectionError)."""

Say = Callable[[str], None]


@dataclass
class ChaosConfig:
    """The size and pacing of one chaos run.

    Attributes:
        tasks: held tasks (entries).
        worker_kills: worker SIGKILLs (each followed by a new worker).
        redis_restarts, temporal_restarts: SIGKILL + restart of each server.
        consumers: consumer tasks; rate: their total rate (tasks per second), below the replay's.
        threshold, batch: the replay's ``max_backlog_threshold`` and ``batch_size`` (entries).
        throttle_seconds: the fixed policy's wait (seconds); claim_lease_seconds: the claim's lease.
        seed: seeds the fault schedule and the payloads.
        stage_timeout: the longest wait for one stage (a fault's milestone, the result, the drain).
        log_dir: the servers' data and every process's log.
    """

    tasks: int
    worker_kills: int
    consumers: int
    rate: float
    threshold: int
    batch: int
    seed: int
    log_dir: Path
    redis_restarts: int = 1
    temporal_restarts: int = 1
    throttle_seconds: float = 0.5
    claim_lease_seconds: float = 5.0
    stage_timeout: float = 90.0


@dataclass
class Fault:
    """One fault of the schedule: ``kind`` (worker, redis or temporal) once ``at`` tasks were delivered."""

    kind: str
    at: int
    fired_at_delivered: int | None = None
    right_after_move: bool = False
    fired_after_seconds: float | None = None
    outage_seconds: float | None = None


@dataclass
class ChaosReport:
    """What a chaos run saw; ``checks()`` says which guarantee held."""

    seed: int
    tasks: int
    schedule: list[Fault]
    wall_seconds: float = 0.0
    held_before: int = 0
    delivered: int = 0
    distinct_tasks: int = 0
    duplicates: int = 0
    lost: int = 0
    in_order: bool = False
    bytes_kept: bool = False
    stream_entries: int = 0
    stream_matches_consumed: bool = False
    held_left: int = -1
    state: str = ""
    outcome: str = ""
    replayed: int = -1
    runs: int = 0
    redeliveries: int = 0
    consumer_reconnects: int = 0
    worker_starts: int = 0
    worker_exits_unasked: list[int] = field(default_factory=list)

    def count(self, kind: str) -> int:
        """Faults of ``kind`` that fired."""
        return sum(1 for f in self.schedule if f.kind == kind and f.fired_at_delivered is not None)

    def checks(self) -> dict[str, bool]:
        """Each guarantee of the chaos run, by name, and whether it held."""
        return {
            "delivered = held": self.delivered == self.held_before == self.tasks and self.distinct_tasks == self.tasks,
            "0 duplicates": self.duplicates == 0,
            "0 lost": self.lost == 0,
            "order kept": self.in_order,
            "bytes kept": self.bytes_kept,
            "task stream = what was consumed": self.stream_matches_consumed,
            "held stream empty": self.held_left == 0,
            "state running": self.state == "running",
            "outcome completed": self.outcome == "completed",
            "result replayed = delivered": self.replayed == self.delivered,
        }

    def summary(self) -> str:
        """Several lines: the figures and every check."""
        lines = [
            f"seed {self.seed}: {self.tasks} tasks; {self.count('worker')} worker kills, "
            f"{self.count('redis')} redis restarts, {self.count('temporal')} temporal restarts; "
            f"wall {self.wall_seconds:.1f} s",
            f"delivered {self.delivered}, duplicates {self.duplicates}, lost {self.lost}, "
            f"result replayed {self.replayed} (outcome {self.outcome}, {self.runs} runs), "
            f"held left {self.held_left}, state {self.state}",
            f"consumer redeliveries {self.redeliveries} (same entry ID again, after a reconnect), "
            f"consumer reconnects {self.consumer_reconnects}, worker starts {self.worker_starts}, "
            f"worker exits not asked for {self.worker_exits_unasked or 'none'}",
            "faults: "
            + "; ".join(
                f"{f.kind}@{f.fired_at_delivered}{'' if f.right_after_move else ' (no move seen)'} "
                f"(t={f.fired_after_seconds:.1f}s, back in {f.outage_seconds:.1f}s)"
                if f.fired_at_delivered is not None
                and f.fired_after_seconds is not None
                and f.outage_seconds is not None
                else f"{f.kind}@{f.at} (not fired)"
                for f in self.schedule
            ),
        ]
        lines += [f"  [{'ok' if ok else 'FAILED'}] {name}" for name, ok in self.checks().items()]
        return "\n".join(lines)


def make_schedule(cfg: ChaosConfig, rng: random.Random) -> list[Fault]:
    """The faults in firing order: the kinds shuffled, each in its own slot of 8%..85% of the tasks.

    Each fires at a random point of its slot, so faults are spread out and the replay moves between two of them.
    """
    kinds = ["worker"] * cfg.worker_kills + ["redis"] * cfg.redis_restarts + ["temporal"] * cfg.temporal_restarts
    rng.shuffle(kinds)
    lo, hi = 0.08 * cfg.tasks, 0.85 * cfg.tasks
    slot = (hi - lo) / max(1, len(kinds))
    return [Fault(kind, int(lo + slot * (i + rng.uniform(0.2, 0.8)))) for i, kind in enumerate(kinds)]


def make_tasks(n: int, rng: random.Random) -> list[dict[str | bytes, bytes]]:
    """``n`` tasks: a sequence number and 1..48 random bytes (any byte value) under a binary field name."""
    return [{SEQ: b"%07d" % i, BLOB: rng.randbytes(rng.randint(1, 48))} for i in range(n)]


class RedisServer:
    """A redis-server of the run's own, with AOF fsynced on every write.

    It can be SIGKILLed and started again on the same port and directory (held tasks and fence counters survive).
    """

    def __init__(self, data_dir: Path, log_file: Path) -> None:
        self.port = free_port()
        self.data_dir = data_dir
        self.log_file = log_file
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it; returns once its port listens (the AOF may still be loading: clients see LOADING)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [installed_binary("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1",
                "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--dir", str(self.data_dir),
                "--maxmemory-policy", "noeviction", "--protected-mode", "yes"]  # fmt: skip
        with open(self.log_file, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        wait_for_port(self.port, 20, self.proc)

    def kill(self) -> None:
        """SIGKILL it and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


class TemporalServer:
    """A headless Temporal dev server of the run's own on a SQLite file.

    SIGKILLed and started again on the same port and file.
    """

    def __init__(self, db_file: Path, log_file: Path) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.db_file = db_file
        self.log_file = log_file
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it; returns once ``temporal operator cluster health`` says SERVING."""
        args = [installed_binary("temporal"), "server", "start-dev", "--headless", "--ip", "127.0.0.1",
                "--port", str(self.port), "--db-filename", str(self.db_file), "--log-level", "warn",
                "--dynamic-config-value", 'history.workflowIdReuseMinimalInterval="0s"',
                *search_attributes.dev_server_args()]  # fmt: skip
        with open(self.log_file, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        wait_for_port(self.port, 60, self.proc)
        wait_until_serving(self.address, timeout=60)

    def kill(self) -> None:
        """SIGKILL it and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


class WorkerSupervisor:
    """``python -m worker`` configured through the environment, restarted after every kill.

    Also after any exit nobody asked for (recorded, with its exit code).
    """

    def __init__(self, temporal_address: str, redis_url: str, task_queue: str, log_file: Path) -> None:
        self.env = {**os.environ, "TEMPORAL_ADDRESS": temporal_address, "TEMPORAL_NAMESPACE": "default",
                    "XMC_REDIS_URL": redis_url, "XMC_TASK_QUEUE": task_queue}  # fmt: skip
        self.log_file = log_file
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.unasked_exits: list[int] = []

    def start(self) -> None:
        """Start a new worker process."""
        with open(self.log_file, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "worker"], cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        self.starts += 1

    def kill_and_restart(self) -> None:
        """SIGKILL the worker, reap it, start a new one."""
        self.stop()
        self.start()

    def watch(self) -> None:
        """Start a new worker if the current one exited by itself (its exit code is recorded)."""
        if self.proc is not None and (rc := self.proc.poll()) is not None:
            self.unasked_exits.append(rc)
            self.start()

    def stop(self) -> None:
        """SIGKILL the worker if it runs, and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


@dataclass
class Consumed:
    """What the consumers recorded: every entry ID with its field map, in the order first seen."""

    entries: dict[bytes, dict[bytes, bytes]] = field(default_factory=dict)
    redeliveries: int = 0
    reconnects: int = 0


async def consumer(
    url: str, stream: str, group: str, name: str, per_second: float, stop: asyncio.Event, out: Consumed
) -> None:
    """A task worker that survives a Redis restart.

    ``XREADGROUP`` up to 10 entries, record each (ID + fields), ``XACK``, at most ``per_second`` entries a second.
    After a connection fault it reconnects and first re-reads its own pending entries (delivered before the fault
    but maybe never received or never acknowledged), then goes on with new ones. An entry ID seen again is a
    redelivery to the consumer, not a duplicate in the stream; it is counted apart. Returns once ``stop`` is set and
    a read of new entries comes back empty.
    """
    redis: Redis | None = None
    own_pending_first = True
    try:
        while True:
            try:
                if redis is None:
                    redis = Redis.from_url(url, decode_responses=False, socket_timeout=2, socket_connect_timeout=2)
                started = time.monotonic()
                start_id = "0" if own_pending_first else ">"
                reply = await redis.xreadgroup(
                    group, name, {stream: start_id}, count=10, block=None if own_pending_first else 50
                )
                entries = entries_of(reply)
                if own_pending_first and not entries:
                    own_pending_first = False
                    continue
                if not entries:
                    if stop.is_set():
                        return
                    continue
                for entry_id, fields in entries:
                    if entry_id in out.entries:
                        out.redeliveries += 1
                    else:
                        out.entries[entry_id] = fields
                await redis.xack(stream, group, *[entry_id for entry_id, _ in entries])
                await asyncio.sleep(max(0.0, len(entries) / per_second - (time.monotonic() - started)))
            except REDIS_FAULTS:
                out.reconnects += 1
                if redis is not None:
                    with contextlib.suppress(Exception):
                        await redis.aclose()
                redis = None
                own_pending_first = True
                await asyncio.sleep(0.1)
    finally:
        if redis is not None:
            await redis.aclose()


async def retry_redis(call: Callable[[Redis], object], redis: Redis, timeout: float = 30) -> object:
    """``await call(redis)``, retried through connection faults (a restart, AOF loading) for ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call(redis)  # type: ignore[misc]
        except REDIS_FAULTS:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def until(what: str, ok: Callable[[], bool], timeout: float, tick: Callable[[], None]) -> None:
    """Wait until ``ok()``, calling ``tick()`` every 50 ms (the worker watch); TimeoutError names ``what``."""
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached in {timeout:g} s")
        tick()
        await asyncio.sleep(0.05)


async def await_result(
    handle: WorkflowHandle[ResumptionWorkflow, ResumptionResult], timeout: float, tick: Callable[[], None]
) -> ResumptionResult:
    """The run's result, waited for through the Temporal server's own restart (RPC errors retried)."""
    deadline = time.monotonic() + timeout
    while True:
        tick()
        try:
            return await asyncio.wait_for(handle.result(), max(0.5, min(5.0, deadline - time.monotonic())))
        except (TimeoutError, RPCError):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no result of {handle.id} in {timeout:g} s") from None
            await asyncio.sleep(0.2)


async def drained(redis: Redis, stream: str, group: str) -> bool:
    """True when the group has read every entry of the stream and acknowledged it."""
    info = await redis.xinfo_stream(stream)
    groups = {g["name"]: g for g in await redis.xinfo_groups(stream)}
    g = groups[group.encode()]
    return bool(g["pending"] == 0 and g["last-delivered-id"] == info["last-generated-id"])


async def next_move(redis: Redis, keys: ExperimentKeys, timeout: float) -> bool:
    """Wait until the held stream shrinks, polling every millisecond; False when none came in ``timeout``.

    A publish just ran (the next ones of the same refill, if any, are on their way); none: nothing left to move, or
    Redis down. A fault fired right then lands inside the window that matters: the script has moved tasks whose
    workflow task (its local-activity markers) is not in the history yet.
    """
    deadline = time.monotonic() + timeout
    try:
        before = await held.held_count(redis, keys)
        while time.monotonic() < deadline:
            if await held.held_count(redis, keys) < before:
                return True
            await asyncio.sleep(0.001)
    except REDIS_FAULTS:
        pass
    return False


async def fire(fault: Fault, redis_server: RedisServer, temporal: TemporalServer, workers: WorkerSupervisor) -> None:
    """SIGKILL what ``fault`` names and start it again; records how long it was away (seconds).

    Blocking waits run in a thread so the consumers keep going.
    """
    t0 = time.monotonic()
    if fault.kind == "worker":
        workers.kill_and_restart()
    elif fault.kind == "redis":
        redis_server.kill()
        await asyncio.to_thread(redis_server.start)
    else:
        temporal.kill()
        await asyncio.to_thread(temporal.start)
    fault.outage_seconds = time.monotonic() - t0


@contextlib.asynccontextmanager
async def chaos_services(cfg: ChaosConfig) -> AsyncIterator[tuple[RedisServer, TemporalServer, WorkerSupervisor]]:
    """The run's redis-server, dev server and worker; every process killed at the end of the block."""
    cfg.log_dir.mkdir(parents=True, exist_ok=True)
    redis_server = RedisServer(cfg.log_dir / "redis-data", cfg.log_dir / "redis.log")
    temporal = TemporalServer(cfg.log_dir / "temporal.db", cfg.log_dir / "temporal.log")
    workers = WorkerSupervisor(
        temporal.address, redis_server.url, f"xmc-chaos-{os.getpid()}", cfg.log_dir / "worker.log"
    )
    try:
        await asyncio.to_thread(redis_server.start)
        await asyncio.to_thread(temporal.start)
        yield redis_server, temporal, workers
    finally:
        workers.stop()
        temporal.kill()
        redis_server.kill()


async def run_chaos(cfg: ChaosConfig, say: Say = print) -> ChaosReport:
    """Run the chaos scenario of ``cfg``; returns what it saw (the caller asserts ``checks()``).

    Raises:
        TimeoutError: a stage did not finish within ``cfg.stage_timeout`` (the message names it).
    """
    rng = random.Random(cfg.seed)
    schedule = make_schedule(cfg, rng)
    tasks = make_tasks(cfg.tasks, rng)
    report = ChaosReport(seed=cfg.seed, tasks=cfg.tasks, schedule=schedule)
    say(f"chaos seed {cfg.seed}: {cfg.tasks} tasks, schedule " + ", ".join(f"{f.kind}@{f.at}" for f in schedule))
    experiment = f"chaos-{cfg.seed}"
    keys = ExperimentKeys(DEFAULT_STREAM, experiment)
    stop = asyncio.Event()
    consumed = Consumed()
    async with chaos_services(cfg) as (redis_server, temporal, workers):
        redis = Redis.from_url(redis_server.url, decode_responses=False, socket_timeout=10)
        consumers: list[asyncio.Task[None]] = []
        try:
            await held.pause(redis, keys)
            await redis.config_set("appendfsync", "everysec")  # holding only: one fsync per task is slow
            for fields in tasks:
                await held.enqueue_task(redis, keys, fields)
            await redis.config_set("appendfsync", "always")
            report.held_before = await held.held_count(redis, keys)
            with contextlib.suppress(ResponseError):  # BUSYGROUP
                await redis.xgroup_create(DEFAULT_STREAM, DEFAULT_GROUP, id="$", mkstream=True)
            client = await Client.connect(temporal.address, data_converter=pydantic_data_converter)
            workers.start()
            consumers = [
                asyncio.create_task(
                    consumer(
                        redis_server.url,
                        DEFAULT_STREAM,
                        DEFAULT_GROUP,
                        f"c{i}",
                        cfg.rate / cfg.consumers,
                        stop,
                        consumed,
                    )
                )
                for i in range(cfg.consumers)
            ]
            inp = ResumptionInput(
                experiment_id=experiment,
                batch_size=cfg.batch,
                max_backlog_threshold=cfg.threshold,
                throttle_seconds=cfg.throttle_seconds,
                claim_lease_seconds=cfg.claim_lease_seconds,
                redis_retry_seconds=0.5,
            )
            t0 = time.monotonic()
            handle = await start_resumption(client, inp, workers.env["XMC_TASK_QUEUE"])
            for fault in schedule:
                await until(
                    f"{fault.kind} fault at {fault.at} delivered (seen {len(consumed.entries)})",
                    lambda at=fault.at: len(consumed.entries) >= at,  # type: ignore[misc]
                    cfg.stage_timeout,
                    workers.watch,
                )
                fault.right_after_move = await next_move(redis, keys, min(20.0, cfg.stage_timeout / 3))
                fault.fired_at_delivered = len(consumed.entries)
                fault.fired_after_seconds = time.monotonic() - t0
                await fire(fault, redis_server, temporal, workers)
                say(
                    f"  {fault.kind} SIGKILLed at {fault.fired_at_delivered} delivered "
                    f"(t={fault.fired_after_seconds:.1f} s), back in {fault.outage_seconds:.1f} s"
                )
            result = await await_result(handle, cfg.stage_timeout, workers.watch)
            deadline = time.monotonic() + cfg.stage_timeout
            while not await retry_redis(lambda r: drained(r, DEFAULT_STREAM, DEFAULT_GROUP), redis):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"consumers did not drain the stream in {cfg.stage_timeout:g} s")
                await asyncio.sleep(0.05)
            report.wall_seconds = time.monotonic() - t0
            stop.set()
            await asyncio.gather(*consumers)
            report.outcome, report.replayed, report.runs = result.outcome.value, result.replayed, result.runs
            stream = await redis.xrange(DEFAULT_STREAM)
            report.held_left = await held.held_count(redis, keys)
            report.state = (await held.get_state(redis, keys)).value
        finally:
            stop.set()
            for task in consumers:
                task.cancel()
            await asyncio.gather(*consumers, return_exceptions=True)
            await redis.aclose()
    report.worker_starts, report.worker_exits_unasked = workers.starts, workers.unasked_exits
    report.redeliveries, report.consumer_reconnects = consumed.redeliveries, consumed.reconnects
    judge(report, tasks, consumed, entries_of([(DEFAULT_STREAM, stream)]))
    say(report.summary())
    return report


def judge(
    report: ChaosReport,
    tasks: list[dict[str | bytes, bytes]],
    consumed: Consumed,
    stream: list[tuple[bytes, dict[bytes, bytes]]],
) -> None:
    """Fill the report's delivery figures.

    What was consumed (ordered by entry ID) against the held tasks, and against the task stream itself.
    """

    def id_key(entry_id: bytes) -> tuple[int, int]:
        ms, seq = entry_id.split(b"-")
        return int(ms), int(seq)

    ordered = [consumed.entries[i] for i in sorted(consumed.entries, key=id_key)]
    seqs = [int(fields.get(SEQ, b"-1")) for fields in ordered]
    counts = Counter(seqs)
    report.delivered = len(ordered)
    report.distinct_tasks = sum(1 for s in counts if 0 <= s < len(tasks))
    report.duplicates = sum(c - 1 for c in counts.values())
    report.lost = len(tasks) - report.distinct_tasks
    report.in_order = seqs == sorted(seqs) and report.duplicates == 0
    report.bytes_kept = all(0 <= s < len(tasks) and fields == tasks[s] for s, fields in zip(seqs, ordered, strict=True))
    report.stream_entries = len(stream)
    report.stream_matches_consumed = [
        (i, f) for i, f in stream
    ] == [(i, consumed.entries[i]) for i in sorted(consumed.entries, key=id_key)]  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; see ``--help``."""
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=50_000, help="held tasks (default 50,000)")
    parser.add_argument("--kills", type=int, default=5, help="worker SIGKILLs (default 5)")
    parser.add_argument("--rate", type=float, default=1_000.0, help="consumers' total rate, tasks/s (default 1,000)")
    parser.add_argument("--consumers", type=int, default=4, help="consumer tasks (default 4)")
    parser.add_argument("--threshold", type=int, default=1_000, help="max_backlog_threshold (default 1,000)")
    parser.add_argument("--batch", type=int, default=200, help="batch_size (default 200)")
    parser.add_argument("--seed", type=int, default=None, help="fault schedule and payload seed (default: random)")
    parser.add_argument("--log-dir", type=Path, default=Path(".xmc") / "chaos", help="data and logs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the large chaos size; exit code 0 when every check held."""
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    log_dir = args.log_dir / f"seed-{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    cfg = ChaosConfig(
        tasks=args.tasks, worker_kills=args.kills, consumers=args.consumers, rate=args.rate,
        threshold=args.threshold, batch=args.batch, seed=seed, log_dir=log_dir, stage_timeout=300,
    )  # fmt: skip
    report = asyncio.run(run_chaos(cfg, say=lambda line: print(line, flush=True)))
    gc.collect()  # sdk-python#300: avoids an abort at interpreter exit (docs/development.md, "Temporal facts")
    return 0 if all(report.checks().values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
