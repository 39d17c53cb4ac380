"""The worker's ``xmc_resumption_held_remaining`` gauge (``activities.resumption.HeldRemaining``),
scraped from a real SDK runtime's Prometheus endpoint."""

from __future__ import annotations

import time

from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from tests.support.helpers import scrape
from xmc_resumption.activities.requests import ExperimentRef
from xmc_resumption.activities.resumption import HeldRemaining
from xmc_resumption.services import free_port

LABELS = {"stream": "s1", "consumer_group": "g1"}


def ref(experiment: str, stream: str = "s1") -> ExperimentRef:
    return ExperimentRef(experiment_id=experiment, stream=stream, consumer_group="g1")


def test_held_remaining_sums_the_experiments_of_a_stream_and_forgets_released_fenced_and_lapsed_ones() -> None:
    port = free_port()
    runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=f"127.0.0.1:{port}")))
    held = HeldRemaining(runtime.metric_meter)
    held.report(ref("A"), 100, 60_000)
    held.report(ref("B"), 30, 60_000)
    held.report(ref("C", stream="s2"), 7, 60_000)
    assert scrape(port)["xmc_resumption_held_remaining", LABELS] == 130
    assert scrape(port)["xmc_resumption_held_remaining", {**LABELS, "stream": "s2"}] == 7
    held.report(ref("A"), 60, 60_000)  # a later reading replaces the earlier one
    assert scrape(port)["xmc_resumption_held_remaining", LABELS] == 90
    held.report(ref("B"), None, 0)  # released, or fenced
    assert scrape(port)["xmc_resumption_held_remaining", LABELS] == 60
    held.report(ref("D"), 5, 1)  # a lease of 1 ms: gone by the next reading of the stream
    time.sleep(0.01)
    held.report(ref("A"), 50, 60_000)
    assert scrape(port)["xmc_resumption_held_remaining", LABELS] == 50
