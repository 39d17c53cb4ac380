"""What the replay reads of Redis, as pydantic models: backlog readings, idle consumers, memory.

Importing neither Redis nor Temporal, so workflow code may use them (they cross the activity boundary through
Temporal's pydantic data converter). The replies of the scripts that write are in ``results``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, model_validator

from xmc_resumption.redisclient.text import show_name


class GroupStatus(StrEnum):
    """What the backlog measurement found: the group, no stream at all, or no such group."""

    OK = "ok"
    NO_STREAM = "no_stream"
    NO_GROUP = "no_group"


class LagSource(StrEnum):
    """How a group's lag was known (``lua/backlog.lua``; docs/memory.md, "How the lag is measured")."""

    CAUGHT_UP = "caught_up"
    """The stream is empty, or the last-delivered-id is at or past its last-generated-id: 0, exact."""
    BEHIND = "behind"
    """The last-delivered-id is before the first entry: every entry (XLEN), exact."""
    RECORDED = "recorded"
    """entries-added - entries-read, exact by the group's record (``{S}:backlog``): nothing was deleted or trimmed
    since entries-read was last known exact."""
    COUNTED = "counted"
    """Counted by XRANGE: exact, or at or past the threshold with ``capped``."""
    BOUND = "bound"
    """Where a count could not finish: the least of XLEN and entries-added - entries-read, an upper bound (never
    below the lag)."""
    STREAM = "stream"
    """A missing group under ``zero``: the stream's entries (XLEN)."""
    MISSING = "missing"
    """A missing group under ``wait`` or ``error``: 0, and no headroom."""
    NOT_COUNTED = "not_counted"
    """Not counted: another group's backlog already left no headroom, or pending alone reached the threshold."""


class GroupBacklog(BaseModel):
    """One consumer group's part of a backlog reading (``lua/backlog.lua``).

    Attributes:
        name: the group.
        pending: its PEL size (entries).
        lag: entries after its last-delivered-id (``lag_source`` says how it is known); for a missing group under
            ``zero``, the stream's entries.
        capped: the count stopped at the cap (threshold - pending + 1 entries): the lag is at least ``lag``.
        bytes_capped: the count stopped at the byte budget at the cap too (a count cut short before the cap takes
            an upper bound instead: ``lag_source`` ``bound``).
        counted: False when its lag is not known, because an earlier group's backlog already reached the threshold
            (or a required group is missing under ``wait`` or ``error``, or pending alone reached the threshold):
            then ``lag`` is 0 and the backlog at least ``pending``.
        missing: the group does not exist (or the stream does not).
        consumers: its consumers (XINFO GROUPS; 0 for a missing group, and in readings recorded before it existed).
        bounds: its backlog bounds the replay. False for a group with no consumer that the replay does not name
            (``consumer_groups``) and that is not the consumer group: it is reported, not waited for.
        lag_source: how ``lag`` was known (``LagSource``; None in readings recorded before it existed).
        exact: ``lag`` is the true lag (False: a bound, or a count at the cap).
    """

    name: str
    pending: int
    lag: int
    capped: bool
    bytes_capped: bool = False
    counted: bool = True
    missing: bool = False
    consumers: int = 0
    bounds: bool = True
    lag_source: LagSource | None = None
    exact: bool = False

    @property
    def backlog(self) -> int:
        """The group's backlog, pending + lag (entries): exact when ``exact``."""
        return self.pending + self.lag


class UnattendedGroup(BaseModel):
    """A consumer group with no consumer that does not bound the replay, named with its backlog.

    Attributes:
        name: the group.
        pending: its PEL size (entries).
        lag: entries after its last-delivered-id, as far as measured (0 when not counted).
        exact: ``lag`` is the true lag.
    """

    name: str
    pending: int
    lag: int
    exact: bool = False


def _lua_list(value: Any) -> Any:
    # Lua's cjson encodes an empty table as an object
    return [] if value == {} else value


class BacklogReading(BaseModel):
    """One backlog measurement of the consumer groups of a stream (docs/contract.md, "Backlog"; docs/memory.md).

    The replay is bounded by the largest backlog among the groups that bound it (the ones named, else the
    consumer group and every group with a consumer); ``pending``, ``lag``, ``capped``, ``bytes_capped``, ``lag_bytes``,
    ``last_delivered_id`` and ``xinfo_lag`` are those of that group, ``limiting_group``.

    Attributes:
        status: ``ok``, or ``no_stream`` / ``no_group`` when the stream or a required group (the
            consumer group, or every named one) does not exist: ``missing_group`` names it.
        pending: entries delivered to the group and not yet acknowledged (its PEL size).
        lag: entries after the group's last-delivered-id, counted by a capped XRANGE.
        capped: True when the count stopped at the cap, so the true backlog may be larger
            (it is then at least the threshold).
        headroom: ``threshold - backlog``, at least 0 (entries): what a publish may add. The throttle
            rule is computed once, in ``lua/backlog.lua``; 0 means the replay must wait (always 0
            while a required group is missing under ``wait`` or ``error``).
        bytes_capped: the lag count stopped at the byte budget past the threshold (a count cut short
            by it before takes an upper bound instead, ``lag_source`` ``bound``).
        lag_bytes: bytes of the entries read counting the lag.
        last_delivered_id: the group's last-delivered-id ('' without a group).
        xinfo_lag: XINFO GROUPS' own ``lag`` field, for logs only (None when Redis reports NULL).
        threshold: the threshold (entries) the measurement was capped against.
        limiting_group: the group with the largest backlog, the one that holds the replay back
            ('' in readings recorded before it existed).
        missing_group: the first required group not found ('' when none).
        groups: every group measured, the required one first (empty in readings recorded before it
            existed).
        lag_source, exact: how the limiting group's lag was known, and whether it is the true lag
            (``GroupBacklog``; None and False in readings recorded before they existed).
        unattended: the groups with no consumer that do not bound the replay, each with its backlog (empty when
            none, and in readings recorded before it existed).
        limiting_idle_ms: with no headroom, the least idle time of the limiting group's consumers (milliseconds,
            XINFO CONSUMERS): how long since any of them read; None when not read (headroom left, no consumer,
            and readings recorded before it existed).
    """

    status: GroupStatus
    pending: int
    lag: int
    capped: bool
    headroom: int
    bytes_capped: bool = False
    lag_bytes: int = 0
    last_delivered_id: str
    xinfo_lag: int | None
    threshold: int
    limiting_group: str = ""
    missing_group: str = ""
    groups: list[GroupBacklog] = []
    lag_source: LagSource | None = None
    exact: bool = False
    unattended: list[UnattendedGroup] = []
    limiting_idle_ms: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_script(cls, data: Any) -> Any:
        # the script's reply: Lua's cjson encodes an empty list as an object, and "not read" as -1
        if isinstance(data, dict):
            data = {**data, **{k: _lua_list(data[k]) for k in ("groups", "unattended") if k in data}}
            if data.get("limiting_idle_ms") == -1:
                data["limiting_idle_ms"] = None
        return data

    @property
    def backlog(self) -> int:
        """The backlog, pending + lag (entries): exact below the threshold, >= threshold when capped."""
        return self.pending + self.lag


class DrainWait(BaseModel):
    """What a bounded poll of the backlog saw (``watch.BacklogWatches.wait_for_drain``).

    Attributes:
        reading: the last reading.
        reached: True when the backlog fell to the low watermark before the poll's bound.
        seconds: how long the poll lasted (seconds, measured in the activity).
        polls: readings taken.
        largest_drop: the largest fall of the backlog between two successive readings (entries;
            0 with one reading, or none that fell): what the consumers take at once. Absent from
            results recorded before it (0).
        queued: the poll reached its bound and its waiter stays in line: the worker signals the
            replay when its turn comes (``watch``'s module docstring). Absent from results recorded before it.
    """

    reading: BacklogReading
    reached: bool
    seconds: float
    polls: int
    largest_drop: int = 0
    queued: bool = False


class MissingGroupPolicy(StrEnum):
    """What a missing stream or required consumer group means for the replay (docs/memory.md).

    ``wait`` (the default): nothing moves while it is missing; the replay waits in phase
    ``waiting_for_group`` (stall detection and ``max_stall_seconds`` apply) and goes on once the
    group exists, so a group created later, at ``$`` too, sees every task.
    ``zero``: the missing group's backlog is the stream's own entries (counted like a lag, from the
    stream's start), so at most ``threshold`` tasks go into a stream no group reads, with a
    warning. Its cost: a group created later at ``$`` never sees the tasks moved before it (up to
    ``threshold``); one created at ``0`` sees them.
    ``error``: raise ``MissingConsumerGroupError`` and publish nothing, for a missing stream too
    (it has no group): the run fails and hands the experiment back as paused.
    """

    WAIT = "wait"
    ZERO = "zero"
    ERROR = "error"


class IdleConsumer(BaseModel):
    """A consumer holding pending entries and idle for a while (``XINFO CONSUMERS``; ``redisclient.consumers``).

    Entries it read and has not acknowledged stay in its group's backlog until it acknowledges them or
    another consumer claims them.

    Attributes:
        group: its consumer group.
        consumer: its name.
        pending: entries it holds (read, not acknowledged).
        idle_ms: milliseconds since it last interacted with Redis (read, claim), as Redis reports.
    """

    group: str
    consumer: str
    pending: int
    idle_ms: int

    def describe(self) -> str:
        """One phrase, e.g. ``taskiq/worker-1 holds 50 pending, idle 12s`` (the names as ``show_name`` shows them)."""
        who = f"{show_name(self.group)}/{show_name(self.consumer)}"
        return f"{who} holds {self.pending} pending, idle {self.idle_ms / 1000:.0f}s"


class RedisMemory(BaseModel):
    """Redis's memory settings as ``lua/memory.lua`` reads them (``INFO memory``).

    Attributes:
        policy: ``maxmemory-policy`` (e.g. ``noeviction``, ``allkeys-lru``).
        used_memory: bytes Redis has allocated (``used_memory``).
        maxmemory: the limit in bytes; 0 means none.
        problem: why the replay refuses this Redis (any policy but ``noeviction``, one line, the
            words of the scripts' ``XMCEVICTION`` reply), or None.
    """

    policy: str
    used_memory: int
    maxmemory: int
    problem: str | None = None

    @property
    def evicts(self) -> bool:
        """True when the policy can evict the replay's keys: the replay refuses to run."""
        return self.problem is not None

    @property
    def used_fraction(self) -> float | None:
        """``used_memory / maxmemory``, or None without a limit."""
        return self.used_memory / self.maxmemory if self.maxmemory else None
