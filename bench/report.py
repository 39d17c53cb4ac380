"""The bench's output: a table per figure on stdout, and the JSON results file."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import blocking, eta, group_cost, many, replicas, scenarios

HISTORY_BUDGET = 10_240
"""The largest single run of any continue-as-new chain must stay under this many events."""


def _f(value: Any, spec: str = ".2f") -> str:
    """A number for a table cell; '-' for None."""
    return "-" if value is None else format(value, spec)


def _lines_a(rows: list[dict[str, Any]]) -> list[str]:
    out = ["a. throughput, no throttling (best of repeats; ratio = workflow tasks/s / bare publish_batch tasks/s)"]
    out.append(f"{'batch':>6} {'tasks':>7} {'wf tasks/s':>11} {'bare tasks/s':>13} {'ratio':>6} "
               f"{'wf ms/turn':>10} {'bare ms/call':>12} {'redis ms/turn':>13} {'other ms/turn':>13} "
               f"{'once':>5}")  # fmt: skip
    for r in rows:
        out.append(
            f"{r['batch']:>6} {r['tasks']:>7} {r['workflow_tasks_per_s']:>11.0f} {r['bare_tasks_per_s']:>13.0f} "
            f"{r['ratio']:>6.3f} {r['workflow_ms_per_turn']:>10.2f} {r['bare_ms_per_publish']:>12.2f} "
            f"{r['redis_ms_per_turn']:>13.2f} {r['other_ms_per_turn']:>13.2f} "
            f"{'yes' if r['exactly_once'] else 'NO':>5}  longest script {r.get('longest_script_ms', 0):.1f} ms"
        )
    return out


def _lines_a_lagging(rows: list[dict[str, Any]]) -> list[str]:
    out = ["a. lagging: one fast consumer a little behind, threshold 100,000 (ratio = workflow / bare, same consumer)"]
    for r in rows:
        out.append(
            f"{r['batch']:>6} {r['tasks']:>7} {r['workflow_tasks_per_s']:>11.0f} {r['bare_tasks_per_s']:>13.0f} "
            f"{r['ratio']:>6.3f}  longest script {r['longest_script_ms']:.1f} ms "
            f"{'yes' if r['exactly_once'] else 'NO':>5}"
        )
    return out


_B_COLUMNS: list[tuple[str, int, Callable[[dict[str, Any]], str]]] = [
    ("R meas", 8, lambda r: f"{r['rate_measured']:.0f}"),
    ("N", 6, lambda r: str(r["tasks"])),
    ("wait s", 6, lambda r: f"{r['throttle_seconds']:g}"),
    ("wall s", 7, lambda r: f"{r['wall_s']:.2f}"),
    ("wall/ideal", 10, lambda r: _f(r["wall_over_ideal"])),
    ("drain/ideal", 11, lambda r: _f(r["drained_over_ideal"])),
    ("idle", 6, lambda r: f"{r['idle_fraction']:.1%}"),
    ("idle(empty)", 11, lambda r: f"{r['idle_fraction_empty_reads']:.1%}"),
    ("idle(smp)", 9, lambda r: f"{r['idle_fraction_sampled']:.1%}"),
    ("max bl", 6, lambda r: str(r["max_backlog"])),
    ("gap ms", 6, lambda r: f"{r['max_sample_gap_ms']:.1f}"),
    (">10ms", 5, lambda r: str(r["sample_gaps_over_10ms"])),
    ("waits", 5, lambda r: str(r["throttles"])),
    ("turns", 5, lambda r: str(r["turns"])),
    ("events", 6, lambda r: str(r["events"])),
    ("once", 4, lambda r: "yes" if r["exactly_once"] else "NO"),
]


def _lines_b(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "b. pacing (threshold 500; wall/ideal = (start -> result) / (N / R measured); drain/ideal = (start -> "
        "last task read) / (N / R); idle = consumers idle while tasks were held: by capacity, by empty reads, "
        "by the sampler; gap = longest time between two backlog samples, >10ms = gaps longer than 10 ms)"
    ]
    out.append(f"{'policy':>8} {'R target':>8} " + " ".join(f"{name:>{width}}" for name, width, _ in _B_COLUMNS))
    for r in rows:
        head = f"{r['policy']:>8} {r['rate_target']:>8.0f}"
        if "skipped" in r:
            out.append(f"{head} skipped: {r['skipped']}")
            continue
        out.append(f"{head} " + " ".join(f"{cell(r):>{width}}" for _, width, cell in _B_COLUMNS))
    return out


def _lines_c(c: dict[str, Any]) -> list[str]:
    out = ["c. backlog measurement cost (threshold 500, group at 0: the count stops at its cap)"]
    out.append(f"{'case':>29} {'redis ms':>9} {'client-ping':>11} {'PING p50 idle':>13} {'PING p50':>9} "
               f"{'PING max':>9} {'bytes capped':>12}")  # fmt: skip
    for r in c["rows"]:
        out.append(
            f"{r['case']:>29} {r['redis_ms_per_call']:>9.3f} {r['client_minus_ping_ms']:>11.3f} "
            f"{r['ping_ms_idle']['p50']:>13.3f} {r['ping_ms_during']['p50']:>9.3f} {r['ping_ms_during']['max']:>9.2f} "
            f"{'yes' if r['bytes_capped'] else 'no':>12}"
        )
    budget = f"; no byte budget / budget: {c['ratio_no_budget']:.1f}" if "ratio_no_budget" in c else ""
    out.append(f"  ratio {c['ratio_entries_label']}: {c['ratio_entries']:.2f}; "
               f"ratio {c['ratio_entry_size_label']}: {c['ratio_entry_size']:.1f}{budget}")  # fmt: skip
    return out


def _lines_d(d: dict[str, Any]) -> list[str]:
    out = ["d. worker peak RSS (VmHWM), no throttling, batch 1,000, a fresh worker per size"]
    out.append(f"{'tasks':>8} {'idle MiB':>9} {'peak MiB':>9} {'wall s':>7} {'turns':>6} {'runs':>5} {'once':>5}")
    for r in d["rows"]:
        out.append(
            f"{r['tasks']:>8} {r['peak_rss_mib_idle']:>9.1f} {r['peak_rss_mib']:>9.1f} {r['wall_s']:>7.2f} "
            f"{r['turns']:>6} {r['runs']:>5} {'yes' if r['exactly_once'] else 'NO':>5}"
        )
    out.append(f"  ratio {d['ratio_label']}: {d['ratio']:.3f}")
    return out


def _lines_e(e: dict[str, Any]) -> list[str]:
    out = ["e. history events (from b's runs)"]
    out.append(f"{'policy':>8} {'R target':>8} {'events':>7} {'runs':>5} {'per 1k tasks':>12} {'per wait':>9}")
    for r in e["rows"]:
        out.append(
            f"{r['policy']:>8} {r['rate_target']:>8.0f} {r['events']:>7} {r['runs']:>5} "
            f"{r['events_per_1000_tasks']:>12.1f} {_f(r['events_per_throttle_wait'], '.1f'):>9}"
        )
    out.append(f"  largest single run of any chain: {e['largest_run_events']} events "
               f"(budget {HISTORY_BUDGET}: {'ok' if e['under_budget'] else 'EXCEEDED'})")  # fmt: skip
    return out


def _lines_g(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "g. many replayers, one threshold, two workers (wall/ideal = (starts -> last result) / (tasks / R measured); "
        "finish = completion times in s after the starts: first / median / last, and last/first)"
    ]
    out.append(f"{'case':>6} {'policy':>8} {'fair':>4} {'exps':>4} {'tasks':>6} {'R meas':>6} {'wall s':>7} "
               f"{'wall/ideal':>10} {'max bl':>6} {'thr':>4} {'gap ms':>6} {'finish first/median/last':>24} "
               f"{'last/first':>10} {'wk cpu s':>8} {'redis cpu s':>11} {'once':>4}")  # fmt: skip
    for r in rows:
        f = r["finish"]
        out.append(
            f"{r['case']:>6} {r['policy']:>8} {'yes' if r['fair_share'] else 'no':>4} {r['experiments']:>4} "
            f"{r['tasks']:>6} {r['rate_measured']:>6.0f} {r['wall_s']:>7.2f} {r['wall_over_ideal']:>10.2f} "
            f"{r['max_backlog']:>6} {r['threshold']:>4} {r['max_sample_gap_ms']:>6.1f} "
            f"{f['first_s']:>7.2f} /{f['median_s']:>7.2f} /{f['last_s']:>7.2f} {f['last_over_first']:>10.2f} "
            f"{r['worker_cpu_s']:>8.1f} {r['redis_cpu_s']:>11.2f} {'yes' if r['exactly_once'] else 'NO':>4}"
        )
        if len(r["finish_by_group"]) > 1:
            for name, g in r["finish_by_group"].items():
                out.append(f"{'':>20} {name}: finish {g['first_s']:.2f} / {g['median_s']:.2f} / {g['last_s']:.2f}")
    return out


def table(results: dict[str, Any]) -> str:
    """The printed table of every figure in ``results``."""
    printers: dict[str, Callable[[Any], list[str]]] = {
        "a": _lines_a,
        "a_lagging": _lines_a_lagging,
        "b": _lines_b,
        "c": _lines_c,
        "d": _lines_d,
        "e": _lines_e,
        "f": blocking.lines,
        "g": _lines_g,
        "h": eta.lines,
        "k": group_cost.lines,
        "m": many.lines,
        "p": scenarios.lines,
        "r": replicas.lines,
    }
    blocks = [printers[key](results[key]) for key in printers if key in results]
    checks = results["checks"]
    blocks.append([f"checks: {'all ok' if all(checks.values()) else 'FAILED'} " + str(checks)])
    return "\n\n".join("\n".join(block) for block in blocks)


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def write_results(results: dict[str, Any], out_dir: Path, stamp: str) -> Path:
    """Write ``bench-<stamp>.json`` and ``latest.json`` under ``out_dir``; returns the first's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_finite(results), indent=2, sort_keys=False) + "\n"
    path = out_dir / f"bench-{stamp}.json"
    path.write_text(text)
    (out_dir / "latest.json").write_text(text)
    return path
