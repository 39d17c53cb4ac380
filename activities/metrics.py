"""The metric names the activities emit (the worker's own gauge), below the workflow's names in
``workflows/metrics.py``, which lists them all; conventions as there."""

from __future__ import annotations

HELD_REMAINING = "xmc_resumption_held_remaining"
"""Gauge (the worker's): held tasks left, summed over the experiments whose claims this worker
extended within their lease (entries)."""
