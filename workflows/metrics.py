"""The workflow's Prometheus metrics, emitted through the Temporal SDK's runtime (docs/contract.md, "Metrics")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from temporalio import workflow
from temporalio.common import MetricCounter, MetricGauge, MetricHistogramFloat

from xmc_resumption.activities import metrics as activity_metrics

THROTTLES = "xmc_resumption_throttles"
THROTTLE_WAIT = "xmc_resumption_throttle_wait_seconds"
OUTCOMES = activity_metrics.OUTCOMES
"""Counted by the release activity when it releases the claim, else by the workflow."""
BACKLOG = "xmc_resumption_backlog"

WAIT_BUCKETS: Sequence[float] = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600)
"""Buckets of ``THROTTLE_WAIT`` (seconds; the SDK's default buckets are for milliseconds)."""

BUCKET_OVERRIDES: Mapping[str, Sequence[float]] = {THROTTLE_WAIT: WAIT_BUCKETS}
"""``PrometheusConfig(histogram_bucket_overrides=...)`` for the worker's runtime."""


@dataclass(frozen=True)
class Instruments:
    """The workflow's metric instruments, labelled with the run's stream and consumer group (workflow code only)."""

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
