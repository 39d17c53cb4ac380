"""Key layout of DESIGN.md section 3.

Companion keys carry the stream's name as a hash tag, ``{S}:experiment:E:...``, so they hash to
the same Redis Cluster slot as the stream ``S`` itself (Redis Cluster spec, "Hash tags") and one
Lua script may touch them all.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_STREAM = "xmc-tasks-stream"
DEFAULT_GROUP = "xmc-workers"


@dataclass(frozen=True)
class ExperimentKeys:
    """The Redis keys of one experiment on one task stream.

    Attributes:
        stream: the task stream ``S`` the workers read with ``XREADGROUP``.
        experiment_id: the experiment ``E``.

    Raises:
        ValueError: when ``stream`` or ``experiment_id`` is empty, or ``stream`` contains a brace
            (it would change the hash tag and split the keys across cluster slots).
    """

    stream: str
    experiment_id: str

    def __post_init__(self) -> None:
        if not self.stream:
            raise ValueError("stream must not be empty")
        if "{" in self.stream or "}" in self.stream:
            raise ValueError(f"stream {self.stream!r} must not contain braces: they set the hash tag")
        if not self.experiment_id:
            raise ValueError("experiment_id must not be empty")

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
    def fence(self) -> str:
        """Integer key: the last fencing token issued (``INCR``)."""
        return f"{self._prefix}:fence"


def as_text(value: bytes | str) -> str:
    """A reply as text, whether the client decodes responses or not (UTF-8)."""
    return value.decode() if isinstance(value, bytes) else value


_TYPES = {
    "state": "string",
    "held": "stream",
    "claim": "hash",
    "fence": "string",
    "publish": "hash",
    "acquired": "list",
}


def expected_type(key: str) -> str:
    """The Redis type a key of the layout holds (``TYPE`` reply): an experiment's key by its last
    part (DESIGN.md section 3), any other key (the task stream) ``stream``."""
    if key.startswith("{") and ":experiment:" in key:
        return _TYPES.get(key.rsplit(":", 1)[1], "stream")
    return "stream"
