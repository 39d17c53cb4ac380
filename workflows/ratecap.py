"""A replay's own rate cap (pure code): docs/pacing.md, "A replay's own cap: `max_tasks_per_second`"."""

from __future__ import annotations

import math
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from xmc_resumption.redisclient.ratecap import MAX_TASKS_PER_SECOND, bucket_capacity


class TaskBucket(BaseModel):
    """The bucket's state: ``tokens`` (tasks) at workflow time ``at`` (None: not used yet, full); carried on."""

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
        """``moved`` tasks moved by the publish that answered at workflow time ``now``; the bucket refills from then."""
        self.tokens = max(0.0, self.tokens - moved)
        self.at = now

    def wait_seconds(self, rate: float, want: int) -> float:
        """Seconds until the bucket holds ``want`` tasks (1 .. capacity) at ``rate`` (tasks/s), from its last use."""
        target = min(bucket_capacity(rate), max(1.0, float(want)))
        return max(0.0, target - self.tokens) / rate
