"""Errors raised by the Redis layer (connection and server errors of redis-py pass through)."""

from __future__ import annotations

from redis.exceptions import RedisError


class MissingConsumerGroupError(LookupError):
    """The consumer group (or its stream) does not exist and the policy is ``error``.

    Attributes:
        stream: the task stream's key.
        group: the consumer group's name.
    """

    def __init__(self, stream: str, group: str) -> None:
        super().__init__(f"consumer group {group!r} does not exist on stream {stream!r} (or the stream does not)")
        self.stream = stream
        self.group = group


class ReplicaAckError(RedisError):
    """Fewer replicas than required acknowledged a script's writes within the timeout (``XMC_REPLICA_ACKS``).

    The script ran on the primary, and a failover now may lose what it wrote: the call does not
    count as done. A transient fault: retry it. A retried publish (same seq) returns its recorded
    result, a retried acquire (same request ID) its token, a retried release its record, a retried
    enqueue whose tasks all carry idempotency keys its first answer, and each waits for the replicas
    again (docs/contract.md, "Replica acknowledgements").

    Attributes:
        script: the script's name.
        acked: replicas that acknowledged (``WAIT``'s reply).
        required: replicas required.
        timeout_ms: how long ``WAIT`` waited (milliseconds).
    """

    def __init__(self, script: str, acked: int, required: int, timeout_ms: int) -> None:
        super().__init__(
            f"{script}: {acked} of {required} replica(s) acknowledged the write within {timeout_ms} ms "
            "(XMC_REPLICA_ACKS): it ran on the primary, but may be lost if Redis fails over now; retry it"
        )
        self.script, self.acked, self.required, self.timeout_ms = script, acked, required, timeout_ms
