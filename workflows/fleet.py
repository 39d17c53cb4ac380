"""The fleet view: the custom search attributes every resumption keeps up to date in Temporal
visibility, so ``temporal workflow list --query 'XmcPhase="throttled"'`` (and ``xmc list``, and the
web UI's list) show every replay without asking a live worker.

Custom search attributes must be registered on the namespace before a workflow may set them
(Temporal docs, "Custom Search Attributes"): the demo's and the tests' dev servers register them
with ``--search-attribute NAME=TYPE`` (``dev_server_args``); on a real cluster an operator runs
``register_commands`` once; the worker refuses to start without them (``missing``), because a
workflow task that upserts an unknown attribute fails and retries for ever.
"""

from __future__ import annotations

from enum import StrEnum

from temporalio.common import SearchAttributeIndexedValueType, SearchAttributeKey

from xmc_resumption.workflows.models import Outcome

EXPERIMENT_ID = SearchAttributeKey.for_keyword("XmcExperimentId")
"""The experiment being resumed (Keyword)."""
STREAM = SearchAttributeKey.for_keyword("XmcStream")
"""The task stream it replays into (Keyword)."""
PHASE = SearchAttributeKey.for_keyword("XmcPhase")
"""``FleetPhase`` while running; the outcome once ended (Keyword)."""
OUTCOME = SearchAttributeKey.for_keyword("XmcOutcome")
"""The ``Outcome`` once ended; absent while running (Keyword)."""
REPLAYED = SearchAttributeKey.for_int("XmcReplayed")
"""Tasks replayed so far (Int, entries)."""
REMAINING = SearchAttributeKey.for_int("XmcRemaining")
"""Held tasks left at the last reading (Int, entries)."""

ALL: tuple[SearchAttributeKey, ...] = (EXPERIMENT_ID, STREAM, PHASE, OUTCOME, REPLAYED, REMAINING)

_CLI_TYPE = {
    SearchAttributeIndexedValueType.KEYWORD: "Keyword",
    SearchAttributeIndexedValueType.INT: "Int",
}


class FleetPhase(StrEnum):
    """``XmcPhase`` while a resumption runs: coarser than ``Phase`` (checking, measuring and
    publishing are all ``replaying``), so that it changes only when an operator would care. Once
    the run ends, ``XmcPhase`` holds the outcome (``completed``, ``paused``, ``fenced``, ...)."""

    CLAIMING = "claiming"
    REPLAYING = "replaying"
    THROTTLED = "throttled"
    STALLED = "stalled"
    REDIS_UNAVAILABLE = "redis_unavailable"
    STOPPING = "stopping"


FAILED = "failed"
"""``XmcPhase`` and ``XmcOutcome`` of a run that failed (a fault retrying cannot mend, or a fault of
the workflow code): the experiment was handed back as paused; the run has no ``Outcome``."""


def phase_values() -> list[str]:
    """Every value ``XmcPhase`` takes (``ResumptionWorkflow._fleet_phase`` sets it): a ``FleetPhase``
    while running, an ``Outcome`` once ended, ``FAILED`` for a failed run; each once, in that order.
    ``xmc list --phase`` takes its choices from here."""
    values = [p.value for p in FleetPhase] + [o.value for o in Outcome] + [FAILED]
    return list(dict.fromkeys(values))


def dev_server_args() -> list[str]:
    """``temporal server start-dev`` flags that register ``ALL``: ``--search-attribute NAME=TYPE``."""
    args: list[str] = []
    for key in ALL:
        args += ["--search-attribute", f"{key.name}={_CLI_TYPE[key.indexed_value_type]}"]
    return args


def register_commands(namespace: str = "default") -> list[str]:
    """The ``temporal operator search-attribute create`` command lines that register ``ALL`` on
    ``namespace`` of a real cluster (one line per attribute; Temporal Cloud: ``tcld namespace
    search-attributes add`` with the same names and types)."""
    return [
        f"temporal operator search-attribute create --namespace {namespace} "
        f"--name {key.name} --type {_CLI_TYPE[key.indexed_value_type]}"
        for key in ALL
    ]


def missing(registered: dict[str, SearchAttributeIndexedValueType | int]) -> list[SearchAttributeKey]:
    """The keys of ``ALL`` that ``registered`` (name -> type, as the operator service lists a
    namespace's custom search attributes) lacks, or holds with another type."""
    return [key for key in ALL if int(registered.get(key.name, -1)) != int(key.indexed_value_type)]
