"""Key layout of docs/contract.md, "Redis keys".

Companion keys carry the stream's name as a hash tag, ``{S}:experiment:E:...``, so they hash to
the same Redis Cluster slot as the stream ``S`` itself (Redis Cluster spec, "Hash tags") and one
Lua script may touch them all.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

NAME_CHARACTERS = "letters, digits and . _ : / @ + = -"
_NAME = re.compile(r"[A-Za-z0-9._:/@+=-]{1,200}")
MAX_NAME_LENGTH = 200


def validate_name(what: str, value: str) -> str:
    r"""The one rule for a name that becomes part of a key (an experiment ID, a stream); returns ``value``.

    1 to 200 of ``NAME_CHARACTERS``. So no whitespace, no brace (it would move the ``{S}`` hash tag and
    split an experiment's keys across cluster slots) and no glob character (``*``, ``?``, ``[``,
    ``\``) where a key pattern is built; every entry point (workflow input, activities, CLI,
    producers) goes through it.

    Raises:
        ValueError: naming ``what`` and the rule.
    """
    if not _NAME.fullmatch(value):
        shown = repr(value[:40]) + ("..." if len(value) > 40 else "")
        raise ValueError(
            f"{what} {shown} ({len(value)} characters) must be 1 to {MAX_NAME_LENGTH} of {NAME_CHARACTERS}"
        )
    return value


DEFAULT_STREAM = "xmc-tasks-stream"
DEFAULT_GROUP = "xmc-workers"


@dataclass(frozen=True)
class ExperimentKeys:
    """The Redis keys of one experiment on one task stream.

    Attributes:
        stream: the task stream ``S`` the workers read with ``XREADGROUP``.
        experiment_id: the experiment ``E``.

    Raises:
        ValueError: when ``stream`` or ``experiment_id`` breaks ``validate_name``'s rule.
    """

    stream: str
    experiment_id: str

    def __post_init__(self) -> None:
        validate_name("stream", self.stream)
        validate_name("experiment_id", self.experiment_id)

    @property
    def _prefix(self) -> str:
        return f"{{{self.stream}}}:experiment:{self.experiment_id}"

    @property
    def state(self) -> str:
        """String key: ``paused`` or ``resuming``; absent means running."""
        return f"{self._prefix}:state"

    @property
    def held(self) -> str:
        """Stream key: the held tasks, oldest first."""
        return f"{self._prefix}:held"

    @property
    def claim(self) -> str:
        """Hash key: ``token``, ``owner``; its TTL is the claim's lease."""
        return f"{self._prefix}:claim"

    @property
    def publish(self) -> str:
        """Hash key: ``token``, ``seq``, ``result`` of the last publish (its idempotency record).

        Kept apart from the claim so that it does not lapse with the lease: a publish retried after
        a lapse still returns its recorded result instead of moving a second batch.
        """
        return f"{self._prefix}:publish"

    @property
    def acquire_log(self) -> str:
        """List key: the last 16 ``request:token`` pairs of ``acquire_claim``, its idempotency record."""
        return f"{self._prefix}:acquired"

    @property
    def replay(self) -> str:
        """Hash key: ``moved``, the tasks the resume in progress moved, whatever claim moved them.

        It is the authority for a resumption's ``replayed``: set to 0 by the claim that starts a resume (the
        experiment was not ``resuming``), counted by the publish script, dropped by the release that ends
        the resume (``lua/acquire.lua``, ``lua/publish.lua``, ``lua/release.lua``).
        """
        return f"{self._prefix}:replay"

    @property
    def released(self) -> str:
        """List key: the last 16 releases, newest first, each ``<token> <outcome> <replayed> <remaining>``.

        ``-`` stands for an unknown count. A re-executed turn of a run that already released its claim
        reads it to report its own release instead of a takeover (``lua/tokens.lua``).
        """
        return f"{self._prefix}:released"

    @property
    def dead(self) -> str:
        """Stream key: the experiment's dead-letter stream of held tasks the publish script cannot move.

        Such a task has more fields than a script can pass to XADD; they are set aside in order with their
        field maps byte for byte, for an operator to retry or drop (``xmc dead``).
        """
        return f"{self._prefix}:dead"

    @property
    def idempotency(self) -> str:
        """Hash key: the enqueue script's idempotency record (``lua/enqueue.lua``; bounded, with a TTL).

        Idempotency key -> ``<destination> <entry ID>`` of the task's first enqueue.
        """
        return f"{self._prefix}:idempotency"

    @property
    def idempotency_previous(self) -> str:
        """Hash key: the idempotency record's previous generation (same layout)."""
        return f"{self._prefix}:idempotency-previous"

    @property
    def enqueue_keys(self) -> list[str]:
        """The enqueue script's KEYS, in order (docs/producers.md).

        The task stream, state, held stream and the two generations of the idempotency record.
        """
        return [self.stream, self.state, self.held, self.idempotency, self.idempotency_previous]

    @property
    def fence(self) -> str:
        """Integer key: the last fencing token issued (``INCR``)."""
        return f"{self._prefix}:fence"


def weights_key(stream: str) -> str:
    """``{S}:weights``: the fair share's weights hash of task stream ``stream`` (``redisclient.weights``)."""
    return f"{{{validate_name('stream', stream)}}}:weights"


def replayers_key(stream: str) -> str:
    """``{S}:replayers``: the sorted set of the active fair-share replayers of ``stream``."""
    return f"{{{validate_name('stream', stream)}}}:replayers"


def backlog_key(stream: str) -> str:
    """``{S}:backlog``: the backlog records of task stream ``stream`` (a hash, a field per group; ``lua/backlog.lua``).

    A cache the measuring scripts keep: where a group's entries-read was last known exact. Deleting it costs only
    counts until the scripts write it again.
    """
    return f"{{{validate_name('stream', stream)}}}:backlog"


def as_text(value: bytes | str) -> str:
    r"""A reply as text, whether the client decodes responses or not.

    UTF-8; a byte that is no part of a UTF-8 character becomes the four characters ``\xNN``. Redis
    takes any bytes as a name (a consumer group, a consumer), so a name found in Redis may not be
    UTF-8: it is then never an error, and two such names stay apart. ``show_name``
    (``redisclient.text``) shows it on one line.
    """
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


def json_reply(raw: bytes | str) -> Any:
    """A script's JSON reply, parsed; its strings as ``as_text`` makes them.

    ``cjson`` passes the bytes of a name found in Redis through as they are, so the reply need not be
    UTF-8 (``json.loads`` would refuse it).
    """
    if isinstance(raw, str):
        return json.loads(raw)
    return _as_text_strings(json.loads(raw.decode("utf-8", "surrogateescape")))


def _as_text_strings(value: Any) -> Any:
    if isinstance(value, str):
        return as_text(value.encode("utf-8", "surrogateescape")) if not value.isascii() else value
    if isinstance(value, list):
        return [_as_text_strings(v) for v in value]
    if isinstance(value, dict):
        return {_as_text_strings(k): _as_text_strings(v) for k, v in value.items()}
    return value


_TYPES = {
    "state": "string",
    "held": "stream",
    "claim": "hash",
    "fence": "string",
    "publish": "hash",
    "acquired": "list",
    "replay": "hash",
    "released": "list",
    "dead": "stream",
    "idempotency": "hash",
    "idempotency-previous": "hash",
}


def wrong_type(key: str, actual: str) -> str | None:
    """``"<key> is a <actual>, expected a <type>"`` when ``actual`` is not what ``key`` holds in the layout.

    ``actual`` is a ``TYPE`` reply; None when it is ``none`` or the type ``expected_type`` gives.
    """
    expected = expected_type(key)
    return None if actual in ("none", expected) else f"{key} is a {actual}, expected a {expected}"


def expected_type(key: str) -> str:
    """The Redis type a key of the layout holds (a ``TYPE`` reply).

    An experiment's key by its last part (docs/contract.md, "Redis keys"), any other key (the task
    stream) ``stream``.
    """
    if key.startswith("{") and ":experiment:" in key:
        return _TYPES.get(key.rsplit(":", 1)[1], "stream")
    if key.startswith("{") and key.endswith(("}:weights", "}:replayers")):
        return "hash" if key.endswith(":weights") else "zset"  # the fair share's (redisclient/weights.py)
    if key.startswith("{") and key.endswith(("}:rate", "}:backlog")):
        return "hash"  # the stream-wide rate cap (redisclient/ratecap.py), the backlog records (lua/backlog.lua)
    return "stream"
