"""A replay's own rate cap, ``max_tasks_per_second``, as a token bucket on workflow time (pure code, no I/O).

The rule (a bucket of ``bucket_capacity(rate)`` tasks that starts full and refills at the rate; a publish moves at most
its ``allowance`` and ``take``s what moved once it has answered, the bucket refilling from then on): docs/pacing.md,
"A replay's own cap: `max_tasks_per_second`". The stream-wide cap (``{S}:rate``) is the same arithmetic inside the
publish script, on Redis's clock (``redisclient/lua/rate.lua``). Deterministic: its clock is ``workflow.now()``.
"""

from __future__ import annotations

import math
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from xmc_resumption.redisclient.ratecap import MAX_TASKS_PER_SECOND, bucket_capacity


class TaskBucket(BaseModel):
    """The bucket's state; carried across continue-as-new, so a new run does not start full.

    Attributes:
        tokens: tasks the bucket held at ``at`` (>= 0).
        at: when ``tokens`` was counted (workflow time: an ``allowance``, or the end of the publish that
            ``take`` charged), or None before the first use (a full bucket).
    """

    model_config = ConfigDict(extra="forbid")

    tokens: float = Field(default=0.0, ge=0, le=MAX_TASKS_PER_SECOND, allow_inf_nan=False)
    at: datetime | None = None

    def allowance(self, rate: float, now: datetime) -> int:
        """Whole tasks a cap of ``rate`` (tasks/s) lets move at workflow time ``now``; refills the bucket."""
        capacity = bucket_capacity(rate)
        if self.at is None:
            self.tokens = capacity
        else:
            elapsed = max(0.0, (now - self.at).total_seconds())
            self.tokens = min(capacity, self.tokens + elapsed * rate)
        self.at = now
        return math.floor(self.tokens)

    def take(self, moved: int, now: datetime) -> None:
        """``moved`` tasks moved by the publish that answered at workflow time ``now`` (after an ``allowance``).

        The bucket refills from ``now``: not for the time between the ``allowance`` and the answer.
        """
        self.tokens = max(0.0, self.tokens - moved)
        self.at = now

    def wait_seconds(self, rate: float, want: int) -> float:
        """Seconds until the bucket holds ``want`` tasks at ``rate`` (tasks/s), as of its last ``allowance`` or take.

        ``want`` counts as at least 1 and at most the bucket's capacity.
        """
        target = min(bucket_capacity(rate), max(1.0, float(want)))
        return max(0.0, target - self.tokens) / rate
