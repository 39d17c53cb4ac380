"""Replies of the Redis scripts that write, as pydantic models: claims, checks, releases, publishes, set-asides.

Importing neither Redis nor Temporal, so workflow code may use them (they cross the activity boundary through
Temporal's pydantic data converter). What the replay reads (backlog, consumers, memory) is in ``readings``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from xmc_resumption.redisclient.readings import BacklogReading


class ExperimentState(StrEnum):
    """An experiment's state (docs/contract.md, "The state machine"): absent key means running."""

    RUNNING = "running"
    PAUSED = "paused"
    RESUMING = "resuming"
    UNKNOWN = "unknown"
    """The state key holds a value the contract does not know: treated as holding (enqueue) and
    normalized to ``resuming`` by the next claim."""


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
        last_moved_id: the latest held entry ID the token moved, by this script or an earlier one
            (the publish record's ``last_moved_id``; '' when it moved none, or the record is another
            token's), in every reply, a recorded or stale one too: what the caller passes back as
            ``moved_through``, the later of it and what it knew (``failover.later_id``). In results
            recorded before the record kept it: the last task this script moved ('' when none).
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
        last_moved_id: the latest of the scripts' ``last_moved_id`` (``PublishResult``): the latest held
            entry ID the token moved ('' when none).
        seconds: how long the call ran its scripts (seconds, the worker's monotonic clock): what a local call counts
            against its workflow task's budget (``workflows.calls.TaskClock``); 0 in a result recorded before it.

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
    seconds: float = Field(default=0.0, ge=0, allow_inf_nan=False)

    @property
    def final(self) -> PublishResult:
        """The last script's result (``first`` when only one ran)."""
        return self.last or self.first

    def results(self) -> list[PublishResult]:
        """``first``, then ``last`` when more than one script ran."""
        return [self.first] if self.last is None else [self.first, self.last]


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
