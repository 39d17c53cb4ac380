"""Operator actions shared by the CLI and the demo: status of an experiment, starting a resumption."""

from __future__ import annotations

from redis.asyncio import Redis
from temporalio.client import Client, WorkflowHandle

from redisclient import fencing, held
from redisclient.backlog import measure_backlog
from redisclient.keys import ExperimentKeys
from redisclient.results import ExperimentState
from workflows.models import ResumptionInput, ResumptionResult
from workflows.resumption import ResumptionWorkflow


async def experiment_status(redis: Redis, keys: ExperimentKeys, group: str, threshold: int) -> dict[str, object]:
    """State, held tasks (entries), claim, last fencing token and the group's backlog, as a dict.

    ``orphaned`` is True for an experiment that is resuming with no live claim: its replayer is
    gone (a failed or terminated run whose lease lapsed) and producers are still holding its tasks;
    starting a resumption again continues the replay in order.
    """
    reading = await measure_backlog(redis, keys.stream, group, threshold)
    state = await held.get_state(redis, keys)
    claim = await fencing.claim_info(redis, keys)
    return {
        "experiment_id": keys.experiment_id,
        "state": state.value,
        "orphaned": state is ExperimentState.RESUMING and not claim,
        "held": await held.held_count(redis, keys),
        "claim": claim,
        "fence": await fencing.current_token(redis, keys),
        "backlog": {
            "group": group,
            "pending": reading.pending,
            "lag": reading.lag,
            "capped": reading.capped,
            "status": reading.status.value,
            "threshold": threshold,
        },
    }


async def start_resumption(
    client: Client, inp: ResumptionInput, task_queue: str
) -> WorkflowHandle[ResumptionWorkflow, ResumptionResult]:
    """Start ``ResumptionWorkflow`` with the conventional ID ``resumption-<E>``.

    Raises:
        temporalio.exceptions.WorkflowAlreadyStartedError: a resumption of this experiment runs.
    """
    return await client.start_workflow(ResumptionWorkflow.run, inp, **inp.start_options(task_queue))
