"""The replay's Prometheus metrics, emitted through the Temporal SDK's runtime (docs/contract.md, "Metrics").

Named by Prometheus conventions: base units, ``_total`` on counters (added by the exporter; the names below are
without it), labels of bounded cardinality (``stream``, ``consumer_group``; never the experiment). The workflow's
meter skips replays; the counts Redis decides (``REPLAYED``, ``OUTCOMES`` of a release) and ``HELD_REMAINING`` are
the activities' (``activities/metrics.py``): a workflow task whose completion is lost runs again live, not replayed
(temporalio/temporal#5921), while the scripts tell a fresh move or release from a repeated one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from temporalio import workflow
from temporalio.common import MetricCounter, MetricGauge, MetricHistogramFloat

from xmc_resumption.activities import metrics as activity_metrics

REPLAYED = activity_metrics.REPLAYED
"""Counter (the publish activity's, ``activities/metrics.py``; scraped
``xmc_resumption_replayed_tasks_total``): tasks moved into the task stream, by the script's count
of each fresh move."""
THROTTLES = "xmc_resumption_throttles"
"""Counter (scraped ``xmc_resumption_throttles_total``): throttle waits taken; label ``policy``."""
THROTTLE_WAIT = "xmc_resumption_throttle_wait_seconds"
"""Histogram: the planned length of each throttle wait (seconds): a durable timer's length, or a
short poll's bound."""
OUTCOMES = activity_metrics.OUTCOMES
"""Counter (scraped ``xmc_resumption_outcomes_total``): resumptions ended; label ``outcome``: the
release activity's when it releases the claim, else the workflow's (``activities/metrics.py``)."""
BACKLOG = "xmc_resumption_backlog"
"""Gauge: the consumer group's backlog at the last reading (entries; capped readings give the
lower bound the replay saw, at least the threshold)."""
HELD_REMAINING = activity_metrics.HELD_REMAINING
"""Gauge (the worker's, ``activities/metrics.py``): held tasks left, summed over the experiments
whose claims this worker extended within their lease (entries)."""

WAIT_BUCKETS: Sequence[float] = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600)
"""Buckets of ``THROTTLE_WAIT`` (seconds): from a 50 ms poll to an hour-long timer (waits are
bounded by a day; longer ones land in ``+Inf``). The SDK's default buckets are for milliseconds."""

BUCKET_OVERRIDES: Mapping[str, Sequence[float]] = {THROTTLE_WAIT: WAIT_BUCKETS}
"""``PrometheusConfig(histogram_bucket_overrides=...)`` for the worker's runtime."""


@dataclass(frozen=True)
class Instruments:
    """The workflow's metric instruments, labelled with the run's stream and consumer group.

    On ``workflow.metric_meter()``, which skips replays. Workflow code only.
    """

    throttles: MetricCounter
    wait: MetricHistogramFloat
    outcomes: MetricCounter
    backlog: MetricGauge

    @classmethod
    def create(cls, stream: str, consumer_group: str) -> Instruments:
        """The instruments of a run replaying into ``stream`` for ``consumer_group``."""
        meter = workflow.metric_meter().with_additional_attributes({"stream": stream, "consumer_group": consumer_group})
        return cls(
            throttles=meter.create_counter(THROTTLES, "throttle waits taken"),
            wait=meter.create_histogram_float(THROTTLE_WAIT, "planned throttle wait", "s"),
            outcomes=meter.create_counter(OUTCOMES, "resumptions ended, by outcome"),
            backlog=meter.create_gauge(BACKLOG, "consumer group backlog at the last reading"),
        )
