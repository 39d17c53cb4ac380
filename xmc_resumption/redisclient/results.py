"""Results of the Redis operations, as pydantic models.

These models import neither Redis nor Temporal, so workflow code may use them (they cross the
activity boundary through Temporal's pydantic data converter).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from xmc_resumption.redisclient.text import show_name


class ExperimentState(StrEnum):
    """An experiment's state (docs/contract.md, "The state machine"): absent key means running."""

    RUNNING = "running"
    PAUSED = "paused"
    RESUMING = "resuming"
    UNKNOWN = "unknown"
    """The state key holds a value the contract does not know: treated as holding (enqueue) and
    normalized to ``resuming`` by the next claim."""


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
        """pending + lag (entries): exact when ``exact``."""
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

    The replay is bounded by the largest backlog among the groups measured (every group of the
    stream, or the ones named); ``pending``, ``lag``, ``capped``, ``bytes_capped``, ``lag_bytes``,
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
        """pending + lag, in entries; exact below the threshold, >= threshold when capped."""
        return self.pending + self.lag


class ClaimGrant(BaseModel):
    """A claim just taken.

    The fencing token, the state after the claim and before it (None in a repeated grant and in results
    recorded before it existed), held tasks (entries); ``repeated`` when the request ID had been granted
    before (nothing changed then); ``replayed``: the tasks the resume has moved so far (0 for a claim
    that starts a resume; None when unknown: a resume begun before the replay record existed, and
    results recorded before it existed); ``redelivered``: of those, the tasks moved again after Redis
    lost their move (None with ``replayed``, and in results recorded before it existed);
    ``held_again``: held entries at or below the claim's ``moved_through`` (tasks a resumption was
    told it moved, held again: Redis lost their move; counted up to ``HELD_AGAIN_CAP``, and
    ``held_again_capped`` when there are more; 0 without ``moved_through``).
    """

    token: int
    state: ExperimentState
    previous_state: ExperimentState | None = None
    held: int
    repeated: bool = False
    replayed: int | None = None
    redelivered: int | None = None
    held_again: int = 0
    held_again_capped: bool = False


class HeldAgain(BaseModel):
    """What ``failover.held_again`` found: tasks an experiment holds again after Redis lost their move.

    Attributes:
        experiment_id: the experiment.
        held_again: held entries at or below the ``moved_through`` asked about (tasks a resumption
            was told it moved), counted up to ``failover.HELD_AGAIN_CAP``.
        held_again_capped: there are more than that.
        held: held entries in all.
        state: the experiment's state.
        token: the fence counter (0 when absent): with Redis behind, it may be below the token
            of the resumption that moved them.
    """

    experiment_id: str
    held_again: int
    held_again_capped: bool = False
    held: int
    state: ExperimentState
    token: int


class ReleaseRecord(BaseModel):
    """What a release recorded in the release log (``{S}:experiment:E:released``).

    The outcome the run ended with, the resume's tasks moved (None when unknown) and the held tasks left
    then (entries).
    """

    outcome: str
    replayed: int | None = None
    remaining: int


class Release(BaseModel):
    """The reply of ``fencing.release_claim``.

    Attributes:
        token: the released token; 0 when nothing was released (a newer claim owns the
            experiment, or the owner holds no claim).
        outcome: the outcome recorded with the release (``released`` when the caller gave none).
        replayed: the resume's tasks moved when it was released (None when unknown, or nothing
            was released).
        remaining: held tasks left (entries; 0 in results recorded before it existed).
        repeated: the token had been released before (a retry, a re-executed turn): nothing
            changed, and the fields are that release's.
    """

    token: int
    outcome: str = ""
    replayed: int | None = None
    remaining: int | None = None
    repeated: bool = False


class ClaimCheck(BaseModel):
    """The pause-and-fencing check of one turn.

    Attributes:
        fenced: True when a newer token was issued; the caller must stop publishing.
        fence_lost: True when the fence counter is below the token: Redis lost data (a restart
            without persistence), not a takeover; the caller must stop too.
        current_token: the fence counter's value.
        state: the experiment's state.
        held: held tasks left (entries).
        reestablished: True when the lease had lapsed and was taken again for the current token.
        released: when fenced by this very token's own release (a re-executed turn of a run that
            already released its claim): that release's record; else None.
        replayed: the tasks the resume has moved (None when unknown, and in results recorded
            before it existed): a reset run of a continued one, whose carry is older, reads it.
    """

    fenced: bool
    fence_lost: bool = False
    current_token: int
    state: ExperimentState
    held: int
    reestablished: bool
    released: ReleaseRecord | None = None
    replayed: int | None = None


class PublishStatus(StrEnum):
    """What one publish did: see ``redisclient/lua/publish.lua``."""

    PUBLISHED = "published"
    COMPLETED = "completed"
    THROTTLED = "throttled"
    PAUSED = "paused"
    FENCED = "fenced"
    FENCE_LOST = "fence_lost"
    STALE = "stale"
    NO_GROUP = "no_group"
    WAITING_FOR_GROUP = "waiting_for_group"
    """The stream or a required group is missing under ``missing_group: wait``: nothing moved or written."""
    MEMORY = "memory"
    """Redis's used memory reached the call's fraction of ``maxmemory``: nothing moved (a wait)."""
    RELEASED = "released"
    """The token was fenced by its own release (a re-executed turn of a run that already released
    its claim): nothing moved; ``outcome``, ``replayed`` and ``remaining`` are the release's."""
    RATE_LIMITED = "rate_limited"
    """The stream-wide rate cap's bucket (``{S}:rate``, ``lua/rate.lua``) held no whole task while
    there was headroom: nothing moved (a wait of ``rate_wait_ms``)."""


class PublishResult(BaseModel):
    """The result of one atomic publish.

    Attributes:
        status: see ``PublishStatus``.
        moved: tasks moved from the held stream to the task stream (entries); moved_bytes: their
            bytes (IDs, fields and values as read).
        poison_id: the held entry that stopped the move, '' when none: it has more fields than a
            script can pass to XADD, and the caller sets it aside (``deadletter.set_aside``).
        total_moved: tasks this token has moved in all, counted by the script in the publish
            record (None in results recorded before it existed).
        replayed: tasks the resume has moved in all, whatever claim moved them, counted by the
            script in the replay record: the authority for a resumption's ``replayed`` (None when
            unknown, and in results recorded before it existed).
        outcome: with ``released``, the outcome the release recorded ('' otherwise).
        repeated: the script returned the result recorded for this seq: it moved nothing now.
        remaining: held tasks left after the move (entries).
        reading: the backlog the script measured before the move; its ``headroom`` is
            ``threshold - backlog`` then (with the fair share on, this caller's share of it), so
            ``headroom - moved`` is what is left after the move. All zero when the script refused
            before measuring; ``threshold`` is the request's (0 in results recorded before a
            publish's reading carried it); ``xinfo_lag`` is None; ``limiting_group`` names the
            group whose backlog bounded the move, ``missing_group`` the first required group not
            found ('' when none, and in results recorded before they existed); ``groups`` is empty.
        last_seq: with ``stale``, the seq of the last publish recorded for the token.
        used_memory, maxmemory: Redis's ``INFO memory`` as the script read it before the move
            (bytes; maxmemory 0 means no limit; both 0 when the script refused before reading
            them, and in results recorded before they existed).
        rate_limit: the stream-wide rate cap (tasks per second, ``{S}:rate``); 0: none, or not
            read (the script refused before), or a result recorded before it existed.
        rate_limited: the cap's bucket cut this move short (``rate_limited`` status when nothing moved).
        rate_wait_ms: with ``rate_limited``, how long until the bucket holds what the move wanted
            (at most its capacity; milliseconds on Redis's clock), else 0.
        redelivered: of ``moved``, the tasks moved again: their held entry IDs were at or below the
            call's ``moved_through`` (the caller was told they moved: Redis lost the move), and each
            was marked with the ``xmc-redelivery`` field (``redisclient.failover``). 0 in results
            recorded before it existed.
        behind: the caller's ``replayed`` minus the replay record's count before the move, when
            Redis counts fewer (it lost moves); else 0.
        last_moved_id: the held entry ID of the last task moved ('' when none moved): what the
            caller passes back as ``moved_through``.
        redelivered_total: the tasks the resume moved again in all (the replay record's
            ``redelivered``); None when its count is unknown, and in results recorded before it existed.

    The wire format is the script's flat reply (``lua/publish.lua``: ``pending``, ``lag``,
    ``capped``, ``bytes_capped``, ``headroom``, ``last_delivered_id``, ``group_status``,
    ``limiting_group``, ``missing_group`` and ``backlog`` beside the other fields): it is what the
    publish record in Redis and the workflow histories' markers hold, so the model reads it and
    writes it back the same way.
    """

    status: PublishStatus
    moved: int
    moved_bytes: int = 0
    poison_id: str = ""
    total_moved: int | None = None
    replayed: int | None = None
    outcome: str = ""
    repeated: bool = False
    remaining: int
    reading: BacklogReading
    last_seq: int = 0
    used_memory: int = 0
    maxmemory: int = 0
    rate_limit: float = 0.0
    rate_limited: bool = False
    rate_wait_ms: int = 0
    redelivered: int = 0
    behind: int = 0
    last_moved_id: str = ""
    redelivered_total: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_flat(cls, data: Any) -> Any:
        # the script's reply and recorded results are flat; ``backlog`` is pending + lag
        if not isinstance(data, dict) or "reading" in data:
            return data
        flat = {k: v for k, v in data.items() if k != "backlog"}
        reading = {"capped": False, "bytes_capped": False, "headroom": 0, "last_delivered_id": "", "threshold": 0}
        keys = ("pending", "lag", "capped", "bytes_capped", "headroom", "last_delivered_id", "threshold",
                "limiting_group", "missing_group", "lag_source", "exact", "unattended", "limiting_idle_ms")  # fmt: skip
        for key in keys:
            if key in flat:
                reading[key] = flat.pop(key)
        if "group_status" in flat:
            reading["status"] = flat.pop("group_status")
        return {**flat, "reading": {**reading, "xinfo_lag": None}}

    @model_serializer(mode="wrap")
    def _to_flat(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        doc: dict[str, Any] = handler(self)
        reading = doc.pop("reading")
        group_status = reading.pop("status")
        for key in ("xinfo_lag", "lag_bytes", "groups"):  # not in the script's reply
            reading.pop(key, None)
        for key, absent in (("lag_source", None), ("limiting_idle_ms", None), ("exact", False), ("unattended", [])):
            if reading.get(key) == absent:  # as results recorded before they existed read
                reading.pop(key, None)
        return {**doc, **reading, "group_status": group_status, "backlog": self.reading.backlog}

    @property
    def headroom_left(self) -> int:
        """Entries the backlog may still grow by after this publish's move (at least 0)."""
        return max(0, self.reading.headroom - self.moved)


class PublishRounds(BaseModel):
    """What ``publish.publish_rounds`` did: several publish scripts in one call.

    Attributes:
        first: the first script's result (for a call asked again after its reply was lost: the
            recorded result of the last script it ran then).
        last: the last script's result when more than one ran, else None. Every script between
            them ``published`` and left headroom; only the last may have another status, a
            ``poison_id`` or ``rate_limited``.
        scripts: the seqs the call used (>= 1): ``seq .. seq + scripts - 1``.
        moved, moved_bytes: tasks (entries) and their bytes moved by all of them together.
        fresh_moved: of ``moved``, the tasks moved now (a recorded result returned again moved
            nothing now).
        fresh_redelivered: of ``fresh_moved``, the tasks moved again, marked (``PublishResult.redelivered``).
        last_moved_id: the held entry ID of the last task the scripts moved ('' when none moved).

    Folding ``first`` and then ``last`` into the workflow's state at one workflow time is
    folding every script's result: the ones between them change nothing the next reading's
    drain sample does not see.
    """

    first: PublishResult
    last: PublishResult | None = None
    scripts: int = Field(ge=1)
    moved: int = Field(ge=0)
    moved_bytes: int = Field(default=0, ge=0)
    fresh_moved: int = Field(default=0, ge=0)
    fresh_redelivered: int = Field(default=0, ge=0)
    last_moved_id: str = ""

    @property
    def final(self) -> PublishResult:
        """The last script's result (``first`` when only one ran)."""
        return self.last or self.first

    def results(self) -> list[PublishResult]:
        """``first``, then ``last`` when more than one script ran."""
        return [self.first] if self.last is None else [self.first, self.last]


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
    """

    reading: BacklogReading
    reached: bool
    seconds: float
    polls: int
    largest_drop: int = 0


class SetAsideStatus(StrEnum):
    """What ``deadletter.set_aside`` did.

    ``set_aside`` (moved to the dead-letter stream), ``gone`` (no such held entry: set aside already, by
    an earlier try), ``fenced`` (the token is not current).
    """

    SET_ASIDE = "set_aside"
    GONE = "gone"
    FENCED = "fenced"


class SetAside(BaseModel):
    """The result of setting a held entry aside.

    What happened, the dead-letter stream's key and its length after it (entries).
    """

    status: SetAsideStatus
    key: str
    dead: int


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
