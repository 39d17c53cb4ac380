"""The bench at smoke size (figures a, b and c; figure r apart): it runs, writes its JSON with every key,
and its own checks hold (exactly once and in order, the backlog within the threshold, finite ratios)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.run import main

# the benchmarks' own services and runs; one heavy test at a time
pytestmark = [pytest.mark.slow, pytest.mark.heavy]

A_KEYS = {
    "batch", "tasks", "repeats", "workflow_tasks_per_s", "bare_tasks_per_s", "ratio", "workflow_ms_per_turn",
    "bare_ms_per_publish", "bare_ms_check_and_measure", "redis_ms_per_turn", "other_ms_per_turn", "exactly_once",
    "workflow_runs", "bare_runs", "longest_script_ms",
}  # fmt: skip
B_RATIOS = ("rate_measured", "wall_over_ideal", "drained_over_ideal", "events_per_1000_tasks")
C_ROW_KEYS = {
    "case", "entries", "entry_bytes", "calls", "threshold", "max_bytes", "backlog", "capped", "bytes_capped",
    "lag_source", "redis_ms_per_call",
    "client_ms_per_call", "client_minus_ping_ms", "ping_ms_idle", "ping_ms_during",
}  # fmt: skip


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def test_bench_smoke_writes_real_figures(tmp_path: Path) -> None:
    assert main(["--smoke", "--only", "a,b,c", "--policies", "fixed,adaptive", "--out-dir", str(tmp_path)]) == 0

    files = sorted(tmp_path.glob("bench-*.json"))
    assert len(files) == 1 and (tmp_path / "latest.json").read_text() == files[0].read_text()
    results = json.loads(files[0].read_text())
    assert set(results) == {"meta", "a", "a_lagging", "b", "c", "checks"}
    assert results["meta"]["smoke"] is True and results["meta"]["figures"] == ["a", "b", "c"]
    assert results["checks"] == {"exactly_once": True, "max_backlog_within_threshold": True}

    assert [row["batch"] for row in results["a"]] == [100, 1_000, 5_000]
    for row in results["a"]:
        assert set(row) == A_KEYS
        assert row["exactly_once"] is True
        for key in ("workflow_tasks_per_s", "bare_tasks_per_s", "ratio", "workflow_ms_per_turn", "redis_ms_per_turn"):
            assert _positive(row[key]), (key, row[key])
        assert all(run["exactly_once"] and run["events"] > 0 for run in row["workflow_runs"])
    assert [row["batch"] for row in results["a_lagging"]] == ["auto", 5_000]
    assert all(row["exactly_once"] and _positive(row["ratio"]) for row in results["a_lagging"])

    fixed, adaptive = results["b"]
    assert fixed["policy"] == "fixed" and "skipped" not in fixed
    assert fixed["exactly_once"] is True and 0 < fixed["max_backlog"] <= fixed["threshold"] == 500
    assert all(_positive(fixed[key]) for key in B_RATIOS), {key: fixed[key] for key in B_RATIOS}
    assert 0 <= fixed["idle_fraction"] <= 1 and fixed["max_sample_gap_ms"] > 0
    assert fixed["events"] == sum(fixed["events_per_run"]) > 0
    assert adaptive["policy"] == "adaptive" and "skipped" not in adaptive
    assert adaptive["exactly_once"] is True and 0 < adaptive["max_backlog"] <= 500

    c = results["c"]
    assert _positive(c["ratio_entries"]) and _positive(c["ratio_entry_size"])
    for row in c["rows"]:
        assert set(row) == C_ROW_KEYS
        # a group Redis keeps no count for, more entries than the threshold behind: the count stops at its cap
        # (small entries), or its budget of bytes takes the stream's length as the bound (larger ones)
        assert row["backlog"] >= row["threshold"] and not row["bytes_capped"]
        # (calls that end before the other client's first PING leave its latency at 0)
        assert _positive(row["redis_ms_per_call"]) and row["ping_ms_during"]["p50"] >= 0
    assert [row["lag_source"] for row in c["rows"]] == ["counted", "counted", "bound", "bound", "bound"]
    assert [row["backlog"] for row in c["rows"]] == [501, 501, 520, 520, 520]


R_ROW_KEYS = {
    "what", "batch", "tasks", "plain_tasks_per_s", "acked_tasks_per_s", "ratio", "exactly_once", "plain_runs",
    "acked_runs",
}  # fmt: skip


def test_bench_smoke_measures_replica_acknowledgements(tmp_path: Path) -> None:
    """Figure r: against a replica in sync, each row is measured both ways and exactly once."""
    assert main(["--smoke", "--only", "r", "--out-dir", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "latest.json").read_text())
    assert set(results) == {"meta", "r", "checks"} and results["checks"] == {"exactly_once": True}
    r = results["r"]
    assert r["replica_link"] == "up" and r["acks"] == {"replicas": 1, "timeout_ms": 1000}
    assert [(row["what"], row["batch"]) for row in r["rows"]] == [
        ("replay", 100),
        ("replay", 500),
        ("bare publish", 100),
        ("bare publish", 500),
        ("enqueue", 100),
    ]
    for row in r["rows"]:
        assert set(row) == R_ROW_KEYS and row["exactly_once"] is True
        assert all(_positive(row[key]) for key in ("plain_tasks_per_s", "acked_tasks_per_s", "ratio")), row
        assert len(row["plain_runs"]) == len(row["acked_runs"]) == 1


M_ROW_KEYS = {
    "row", "replays", "tasks_each", "tasks", "rate_measured", "threshold", "batch", "starts_s", "wall_s",
    "drained_s", "over_ideal", "wall_over_ideal", "worker_cpu_s_per_1000_tasks", "redis_calls_per_1000_tasks",
    "events", "runs", "largest_run_events", "events_per_1000_tasks", "max_backlog", "throttles", "finish", "slots",
    "exactly_once", "cpu_over_first",
}  # fmt: skip


def test_bench_smoke_measures_many_replays(tmp_path: Path) -> None:
    """Figure m alone: each row's replays wait (threshold 20), every run's history is counted, exactly once."""
    assert main(["--smoke", "--only", "m", "--out-dir", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "latest.json").read_text())
    assert set(results) == {"meta", "m", "checks"}
    assert results["checks"] == {"exactly_once": True, "max_backlog_within_threshold": True}
    rows = results["m"]["rows"]
    assert [(r["replays"], r["tasks_each"], r["tasks"]) for r in rows] == [(2, 30, 60), (3, 20, 60)]
    for row in rows:
        assert set(row) == M_ROW_KEYS and row["exactly_once"] is True
        assert 0 < row["max_backlog"] <= row["threshold"] == 20
        # every chain has at least its first run; a run's history is at least its start and its completion
        assert row["runs"] >= row["replays"] and row["events"] >= 2 * row["runs"]
        assert 2 <= row["largest_run_events"] <= row["events"]
        assert row["events_per_1000_tasks"] == row["events"] / row["tasks"] * 1000
        keys = ("over_ideal", "wall_over_ideal", "worker_cpu_s_per_1000_tasks", "redis_calls_per_1000_tasks")
        assert all(_positive(row[key]) for key in keys), {key: row[key] for key in keys}
        assert set(row["slots"]) == {"workflow tasks", "activities", "local"}
        assert all(0 <= s["fewest_free"] <= 100 for s in row["slots"].values())
    assert rows[0]["cpu_over_first"] == 1.0
