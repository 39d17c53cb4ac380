"""Errors raised by the Redis layer (connection and server errors of redis-py pass through)."""

from __future__ import annotations


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
