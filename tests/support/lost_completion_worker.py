"""A worker whose workflow task is lost after its release ran in Redis, for tests/test_truth.py:
``python -m tests.support.lost_completion_worker TEMPORAL_ADDRESS REDIS_URL TASK_QUEUE``.

Its ``release_claim`` releases the claim for real, then never answers, so the workflow task that
drained and released never completes; the test kills this process, and the task runs again on
another worker (the server times it out), as when a completion is lost (temporalio/temporal#5921).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from temporalio import activity
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from tests.support.helpers import RUNNER
from xmc_resumption.activities.requests import ReleaseRequest
from xmc_resumption.activities.resumption import ResumptionActivities
from xmc_resumption.redisclient.results import Release
from xmc_resumption.workflows.resumption import ResumptionWorkflow


class ReleaseThenHang(ResumptionActivities):
    """The real activities, but the release never answers after it ran."""

    def all(self) -> list[Callable[..., Any]]:
        return [self.release_then_hang if f.__name__ == "release_claim" else f for f in super().all()]

    @activity.defn(name="release_claim")
    async def release_then_hang(self, req: ReleaseRequest) -> Release:
        await ResumptionActivities.release_claim(self, req)
        await asyncio.Event().wait()
        raise AssertionError("never answers")


async def main(address: str, redis_url: str, task_queue: str) -> None:
    client = await Client.connect(address, data_converter=pydantic_data_converter)
    redis = Redis.from_url(redis_url, decode_responses=False)
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[ResumptionWorkflow],
        activities=ReleaseThenHang(redis).all(),
        workflow_runner=RUNNER,
    ):
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
