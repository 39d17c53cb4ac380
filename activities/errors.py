"""The types of the non-retryable ``ApplicationError``s the activities raise.

One enum, read by the activities (which raise them) and by the workflow (whose retry policy names
them as non-retryable and which tells a permanent fault from a Redis outage by them).
"""

from __future__ import annotations

from enum import StrEnum


class ErrorType(StrEnum):
    """A fault that retrying cannot mend; the value is the ``ApplicationError.type``.

    ``INVALID_ARGUMENT``: a request the Redis layer refuses (e.g. a stream name with a brace).
    ``MISSING_CONSUMER_GROUP``: the group (or its stream) is missing under ``missing_group: error``.
    ``REDIS_WRONG_TYPE``: a key of the wrong type is in the way (a WRONGTYPE reply).
    ``REDIS_COMMAND_ERROR``: any other error reply that repeats on every try (e.g. a fence key that
    is not an integer, NOPERM).
    ``REDIS_EVICTION_POLICY``: Redis's ``maxmemory-policy`` could evict the replay's keys (anything
    but ``noeviction``; ``redisclient.memory``): the acquire or publish script refused before its
    first write.
    """

    INVALID_ARGUMENT = "InvalidArgument"
    MISSING_CONSUMER_GROUP = "MissingConsumerGroup"
    REDIS_WRONG_TYPE = "RedisWrongType"
    REDIS_COMMAND_ERROR = "RedisCommandError"
    REDIS_EVICTION_POLICY = "RedisEvictionPolicy"


NON_RETRYABLE_ERROR_TYPES: tuple[str, ...] = tuple(t.value for t in ErrorType)
"""Every ``ErrorType`` value, for ``RetryPolicy(non_retryable_error_types=...)``."""
