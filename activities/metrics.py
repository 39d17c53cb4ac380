"""The metric names the activities emit: the worker's held-tasks gauge and the counters Redis decides.

docs/contract.md, "Metrics" lists every metric of the replay, these among them; conventions as ``workflows/metrics.py``.
"""

from __future__ import annotations

HELD_REMAINING = "xmc_resumption_held_remaining"
"""Gauge (the worker's): held tasks left, summed over the experiments whose claims this worker
extended within their lease (entries)."""

REPLAYED = "xmc_resumption_replayed_tasks"
"""Counter (scraped ``xmc_resumption_replayed_tasks_total``): tasks moved into the task stream,
counted by the publish activity from the script's own count of what it moved in that call (a
recorded result returned again moved nothing and counts nothing), so a workflow task whose
completion was lost, a reset or a replay never counts a task twice."""
REDELIVERED = "xmc_resumption_redelivered_tasks"
"""Counter (scraped ``xmc_resumption_redelivered_tasks_total``): of ``REPLAYED``, the tasks moved again, marked
``xmc-redelivery``, because Redis lost their earlier move (a crash failover to a replica that never got it;
docs/contract.md, "Redelivered tasks"); counted as ``REPLAYED`` is. Above 0: consumers got these tasks twice unless
they deduplicate."""
OUTCOMES = "xmc_resumption_outcomes"
"""Counter (scraped ``xmc_resumption_outcomes_total``): resumptions ended; label ``outcome``.
Counted by the release activity when it releases a claim (once per claim: a repeated release
counts nothing), else by the workflow when it ends without releasing."""
