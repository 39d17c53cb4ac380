"""The replay's ETA: held tasks left over the measured net drain rate (pure code, no I/O; docs/operating.md, "ETA")."""

from __future__ import annotations

import math
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

ETA_TIME_CONSTANT_SECONDS = 30.0
"""Time constant of the net drain rate's average (seconds)."""

ETA_FIRST_SECONDS = 1.0
"""The net drain rate (and so the ETA) is known once this much time between readings was measured (seconds)."""

MAX_NET_RATE = 10_000_000.0
"""The highest net drain rate believed (tasks per second)."""

MAX_ETA_SECONDS = 366 * 86_400.0
"""An ETA further away than this (a year, in seconds) is no estimate: it shows as unknown."""


class NetRate(BaseModel):
    """The net drain rate's running average (docs/operating.md, "ETA"); carried across continue-as-new."""

    model_config = ConfigDict(extra="forbid")

    rate: float | None = Field(default=None, ge=0, le=MAX_NET_RATE, allow_inf_nan=False)
    weighted: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    weight: float = Field(default=0.0, ge=0, le=1, allow_inf_nan=False)
    seconds: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    anchor: tuple[int, datetime] | None = None

    def observe(self, replayed: int, backlog: int, capped: bool, at: datetime) -> None:
        """Fold in a reading at workflow time ``at``: ``replayed`` tasks moved by then, ``backlog`` entries."""
        if capped:
            return
        drained, last = replayed - backlog, self.anchor
        self.anchor = (drained, at)
        if last is None:
            return
        seconds = (at - last[1]).total_seconds()
        if seconds <= 0:
            return
        sample = min(MAX_NET_RATE, max(0.0, (drained - last[0]) / seconds))
        decay = math.exp(-seconds / ETA_TIME_CONSTANT_SECONDS)
        self.weighted = self.weighted * decay + (1 - decay) * sample
        self.weight = self.weight * decay + (1 - decay)
        self.seconds = min(self.seconds + seconds, ETA_FIRST_SECONDS)
        if self.seconds >= ETA_FIRST_SECONDS and self.weight > 0:
            self.rate = min(MAX_NET_RATE, self.weighted / self.weight)


def eta_seconds(
    remaining: int | None,
    headroom: int,
    rate: float | None,
    cap: float | None = None,
    refill: int = 0,
    wait_left: float = 0.0,
) -> float | None:
    """The time left (seconds) until the last held task moves, or None: docs/operating.md, "ETA" (entries, tasks/s)."""
    if remaining is None:
        return None
    if remaining <= 0:
        return 0.0
    if rate is None or rate <= 0:
        return None
    headroom = max(0, headroom)
    seconds = (max(remaining - headroom, refill) if remaining > headroom else 0) / rate
    if cap is not None and cap > 0:
        seconds = max(seconds, remaining / cap)
    seconds = max(seconds, wait_left)
    return seconds if seconds <= MAX_ETA_SECONDS else None
