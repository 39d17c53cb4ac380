"""``python -m bench``: the benchmarks of issue 5 on a fresh redis-server and a fresh dev server.

Figures (every one a ratio measured side by side in the same run; absolute times drift here):
  a  throughput with no throttling: workflow tasks/s over the bare atomic move's, per batch size; and under one
     fast consumer that falls a little behind, at the automatic batch and 5,000 (the lagging rows)
  b  pacing per throttle policy and consumer rate: wall / (N / R), consumers' idle fraction, max backlog
  c  the backlog measurement's cost on long streams and large entries, and what another client sees
  d  the worker's peak RSS replaying 1e4 against 1e6 tasks
  e  history events per 1,000 tasks and per throttle wait (from b), the largest single run
  f  Redis blocking during a replay of 1 KiB and 1 MiB tasks: another client's PING, each script's longest call
  g  many replayers on one threshold under two workers: wall / (tasks / R), max backlog, exactly
     once, the spread of completion times, without and with the fair share (``bench.scale``)
  h  the ETA against a steady consumer: its error at 10, 25, 50 and 75 % moved (``bench.eta``)
  k  one backlog measurement's Redis CPU at threshold 100,000 with 1, 16 and 64 groups, and the rule of 72bd4ad
     beside it (``bench.group_cost``)
  m  many replays of one stream: 10, 100 and 1,000 at once, 60,000 tasks in all, two workers: x ideal, worker
     CPU, Redis calls and history events per 1,000 tasks, the workers' free slots (``bench.many``)
  p  the pacing cases of issue 17: bursty, stopped and faster consumers, the defaults, batch sizes,
     history events per 1,000 tasks (``bench.scenarios``)
  r  replica acknowledgements' cost: replay, bare publish and enqueue tasks/s with and without
     ``XMC_REPLICA_ACKS=1`` against a replica (``bench.replicas``)
Prints a table and writes ``bench/results/bench-<timestamp>.json`` and ``bench/results/latest.json``.
Exits 0 when every replay was exactly once and in order, no sampled backlog passed the threshold and
every run's history stayed under its budget and (full runs) the ETA stayed within 20 % once 10 %
had moved; 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import subprocess
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from bench import backlog_cost, blocking, eta, group_cost, many, memory, pacing, replicas, scale, scenarios, throughput
from bench.env import BenchEnv, bench_services, worker_process
from bench.report import HISTORY_BUDGET, table, write_results

FIGURES = ("a", "b", "c", "d", "e", "f", "g", "h", "k", "m", "p", "r")
RESULTS_DIR = Path(__file__).parent / "results"
A_BATCHES = (100, 1_000, 5_000)
A_LAGGING_BATCHES: tuple[int | None, ...] = (None, 5_000)
A_TASKS_FULL, A_TASKS_SMOKE = 50_000, 2_000
R_TASKS_FULL, R_TASKS_SMOKE = 20_000, 1_000
WARM_UP_TASKS = 200
ETA_TARGET = 0.20
"""Figure h's target: the ETA within 20 % of the actual time left once 10 % of a replay has moved."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; see ``--help``."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (the whole run in about a minute)")
    parser.add_argument("--only", default=",".join(FIGURES), help="figures to run, e.g. a,c (default: all)")
    parser.add_argument(
        "--policies", default="fixed,adaptive", help="throttle policies for b (default: fixed,adaptive)"
    )
    parser.add_argument("--repeats", type=int, default=None, help="runs per batch size in a (default 2; smoke 1)")
    parser.add_argument("--tasks", type=int, default=None, help="held tasks per run in a (default 50,000; smoke 2,000)")
    parser.add_argument(
        "--consumer-ack",
        choices=("after", "read"),
        default="after",
        help="b's consumers acknowledge after processing (default; entries stay pending meanwhile) or on read",
    )
    parser.add_argument("--batch-b", type=int, default=100, help="batch size of b's replays (default 100)")
    parser.add_argument(
        "--out-dir", type=Path, default=RESULTS_DIR, help=f"where the JSON goes (default {RESULTS_DIR})"
    )
    args = parser.parse_args(argv)
    args.only = {f.strip() for f in args.only.split(",") if f.strip()}
    unknown = args.only - set(FIGURES)
    if unknown:
        parser.error(f"unknown figure(s) {sorted(unknown)}; choose from {','.join(FIGURES)}")
    if "e" in args.only:
        args.only.add("b")  # e is computed from b's runs
    args.policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    args.repeats = args.repeats or (1 if args.smoke else 2)
    args.tasks = args.tasks or (A_TASKS_SMOKE if args.smoke else A_TASKS_FULL)
    return args


def history_figure(b_rows: list[dict[str, Any]], largest_elsewhere: int) -> dict[str, Any]:
    """Figure e from b's rows; the largest single run also counts a's and d's chains."""
    rows = [
        {
            k: r[k]
            for k in ("policy", "rate_target", "events", "runs", "events_per_1000_tasks", "events_per_throttle_wait")
        }
        for r in b_rows
        if "skipped" not in r
    ]
    largest = max([largest_elsewhere, *(r["largest_run_events"] for r in b_rows if "skipped" not in r)])
    return {
        "rows": rows,
        "largest_run_events": largest,
        "budget": HISTORY_BUDGET,
        "under_budget": largest < HISTORY_BUDGET,
    }


async def _meta(env: BenchEnv, args: argparse.Namespace) -> dict[str, Any]:
    """What the run ran on: versions, machine, options."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    server = await env.redis.info("server")
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "smoke": args.smoke,
        "figures": sorted(args.only),
        "policies": list(args.policies),
        "consumer_ack": args.consumer_ack,
        "git_commit": commit.stdout.strip() or None,
        "python": platform.python_version(),
        "temporalio": version("temporalio"),
        "redis_server": server["redis_version"],
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
    }


async def _workflow_figures(env: BenchEnv, args: argparse.Namespace, results: dict[str, Any]) -> None:
    """Figures a, b and h under one worker, warmed up by a small replay first."""
    async with worker_process(env):
        await throughput.workflow_move(env, WARM_UP_TASKS, 100)
        if "a" in args.only:
            print(f"a: {args.tasks} tasks per run, batches {A_BATCHES}, {args.repeats} repeat(s)", flush=True)
            results["a"] = await throughput.throughput(env, args.tasks, A_BATCHES, args.repeats)
            results["a_lagging"] = await throughput.lagging_rows(env, args.tasks, A_LAGGING_BATCHES, args.repeats)
        if "b" in args.only:
            cases = pacing.SMOKE_CASES if args.smoke else pacing.FULL_CASES
            print(f"b: policies {args.policies}, rates {[c.rate for c in cases]}", flush=True)
            results["b"] = await pacing.pacing(
                env, cases, args.policies, args.batch_b, ack_on_read=args.consumer_ack == "read"
            )
        if "h" in args.only:
            eta_cases = eta.SMOKE_CASES if args.smoke else eta.FULL_CASES
            print(f"h: ETA accuracy, {[(c.policy, c.rate, c.tasks) for c in eta_cases]}", flush=True)
            results["h"] = await eta.eta(env, eta_cases)
        if "p" in args.only:
            results["p"] = await scenarios.scenarios(env)


def _checks(results: dict[str, Any]) -> dict[str, bool]:
    """Exactly once everywhere, the threshold never passed, every run under the history budget."""
    once: list[bool] = [r["exactly_once"] for r in results.get("a", []) + results.get("a_lagging", [])]
    once += [r["exactly_once"] for r in results.get("b", []) if "skipped" not in r]
    once += [r["exactly_once"] for r in results.get("d", {}).get("rows", [])]
    once += [r["exactly_once"] for r in results.get("f", {}).get("rows", [])]
    once += [r["exactly_once"] for r in results.get("g", [])]
    once += [r["exactly_once"] for r in results.get("h", [])]
    once += [r["exactly_once"] for r in results.get("r", {}).get("rows", [])]
    p = results.get("p", {})
    once += [r["exactly_once"] for r in p.get("rows", []) + p.get("batches", [])]
    m = results.get("m", {}).get("rows", [])
    once += [r["exactly_once"] for r in m]
    checks = {"exactly_once": all(once)}
    bounded = [r for r in results.get("b", []) if "skipped" not in r] + results.get("g", []) + m
    if bounded:
        checks["max_backlog_within_threshold"] = all(r["max_backlog"] <= r["threshold"] for r in bounded)
    if "e" in results:
        checks["history_under_budget"] = results["e"]["under_budget"]
    if "f" in results:
        checks["scripts_within_target"] = all(r["within_target"] for r in results["f"]["rows"])
    if "k" in results:
        checks["measurement_within_10ms"] = results["k"]["within_target"]
    if "h" in results and not results["meta"]["smoke"]:
        worst = [r["worst_error"] for r in results["h"]]
        checks["eta_within_target"] = None not in worst and max(worst) <= ETA_TARGET
    return checks


async def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Start the services, run the chosen figures, return the results (JSON-ready)."""
    async with bench_services() as env:
        results: dict[str, Any] = {"meta": await _meta(env, args)}
        if {"a", "b", "h", "p"} & args.only:
            await _workflow_figures(env, args, results)
        if "c" in args.only:
            print("c: backlog measurement cost", flush=True)
            cases = backlog_cost.SMOKE_CASES if args.smoke else backlog_cost.FULL_CASES
            results["c"] = await backlog_cost.backlog_cost(env.redis, env.redis_url, cases)
        if "k" in args.only:
            print("k: one measurement's Redis CPU at threshold 100,000", flush=True)
            counts = (1, 4) if args.smoke else group_cost.GROUP_COUNTS
            results["k"] = await group_cost.group_cost(env.redis, counts, 3 if args.smoke else group_cost.CALLS)
        if "d" in args.only:
            sizes = memory.SMOKE_SIZES if args.smoke else memory.FULL_SIZES
            print(f"d: worker peak RSS for {sizes} tasks", flush=True)
            results["d"] = await memory.worker_memory(env, sizes)
        if "f" in args.only:
            results["f"] = await blocking.blocking(env, blocking.SMOKE_CASES if args.smoke else blocking.FULL_CASES)
        if "g" in args.only:
            size = scale.SMOKE_SIZE if args.smoke else scale.FULL_SIZE
            print(f"g: {size.experiments} experiments x {size.tasks} tasks, two workers, R {size.rate:g}/s", flush=True)
            results["g"] = await scale.scale(env, size, args.policies)
        if "m" in args.only:
            results["m"] = await many.many(env, many.SMOKE_SIZE if args.smoke else many.FULL_SIZE)
        if "r" in args.only:
            r_tasks = R_TASKS_SMOKE if args.smoke else R_TASKS_FULL
            print(f"r: replica acknowledgements, {r_tasks} tasks per run, {args.repeats} repeat(s)", flush=True)
            results["r"] = await replicas.replicas(env, r_tasks, args.repeats)
    if "e" in args.only:
        elsewhere = [r["largest_run_events"] for row in results.get("a", []) for r in row["workflow_runs"]]
        elsewhere += [r["largest_run_events"] for r in results.get("d", {}).get("rows", [])]
        results["e"] = history_figure(results["b"], max(elsewhere, default=0))
    results["checks"] = _checks(results)
    return results


def main(argv: list[str] | None = None) -> int:
    """Run the bench; print the table and the results file's path. Returns the exit code."""
    args = parse_args(argv)
    started = time.monotonic()
    results = asyncio.run(run_bench(args))
    gc.collect()  # sdk-python#300: avoids an abort at interpreter exit (docs/development.md, "Temporal facts")
    results["meta"]["seconds"] = time.monotonic() - started
    path = write_results(results, args.out_dir, time.strftime("%Y%m%d-%H%M%S"))
    print()
    print(table(results))
    print(f"\nresults: {path} (and {path.parent / 'latest.json'}); {results['meta']['seconds']:.0f} s")
    return 0 if all(results["checks"].values()) else 1
