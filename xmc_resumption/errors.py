"""Operator errors: the faults an operator can mend, each turned into one line naming the cause.

Each line names the setting, key or field at fault and never a secret.

The CLI and the worker both end with ``operator_message``: an exception it knows becomes one line
and exit code 2 (``RunFailedError``: 1); any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

from pydantic import ValidationError
from redis.asyncio.connection import parse_url
from redis.exceptions import (
    AuthenticationError,
    InvalidResponse,
    ResponseError,
)
from redis.exceptions import (
    ConnectionError as RedisConnectionError,
)
from redis.exceptions import (
    TimeoutError as RedisTimeoutError,
)
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from xmc_resumption.redisclient.acl import denial_message
from xmc_resumption.redisclient.text import MAX_DETAIL_CHARS, one_line
from xmc_resumption.search_attributes import SearchAttributesMissingError
from xmc_resumption.settings import Settings, TemporalUnreachableError, redacted_url, redis_db_of, temporal_target

EXIT_OPERATOR_ERROR = 2
"""Exit code of an error the operator can mend (bad setting, argument or key; a service away)."""

EXIT_RUN_FAILED = 1
"""Exit code of ``--wait`` when the awaited run did not return a result: it failed, was
terminated, cancelled or timed out (``RunFailedError``)."""

EXIT_BROKEN_PIPE = 141
"""Exit code when stdout's reader went away (``xmc status E | head``): 128 + SIGPIPE, as a shell
reports a command that SIGPIPE ended; nothing is printed."""


class OperatorError(Exception):
    """A fault the operator can mend; ``str()`` is the one-line message."""


class RunFailedError(OperatorError):
    """The run a command waited for ended without a result (failed, terminated, cancelled, timed out).

    The CLI exits ``EXIT_RUN_FAILED``, not 2: the command did its part.
    """


class KeyContentError(OperatorError):
    """A Redis key of the experiment holds something the contract does not allow.

    The wrong type, or a value that is no state / no integer (docs/contract.md, "Redis keys").
    """


def validation_message(err: ValidationError) -> str:
    """A pydantic error as one line: ``field: message`` per error, never the input value.

    The input value may be a password. Settings fields are named by their environment variable
    (``XMC_REDIS_URL``).
    """
    prefix = Settings.model_config.get("env_prefix", "") if err.title == Settings.__name__ else ""
    parts = []
    for e in err.errors(include_url=False, include_input=False, include_context=False):
        loc = ".".join(str(x) for x in e["loc"])
        name = f"{prefix}{loc}".upper() if prefix else loc
        msg = e["msg"].removeprefix("Value error, ")
        parts.append(f"{name}: {msg}" if loc else msg)  # a rule over several fields names them itself
    what = "setting" if prefix else err.title
    return one_line(f"invalid {what}: " + "; ".join(parts))


def is_certificate_refused(err: BaseException) -> bool:
    """True when a TLS connection to Redis failed because the server's certificate did not verify.

    Verified against ``XMC_REDIS_TLS_CA_FILE`` (or the system's CAs): a setting to mend, not an outage.
    """
    return isinstance(err, RedisConnectionError) and "CERTIFICATE_VERIFY_FAILED" in str(err)


def redis_message(err: Exception, redis_url: str, timeout: float) -> str:
    """A Redis client error as one line naming the Redis (password masked) and the setting."""
    where = redacted_url(redis_url)
    detail = one_line(str(err))
    denied = denial_message(err, parse_url(redis_url).get("username") or "default", f"at XMC_REDIS_URL={where}")
    if denied:
        return one_line(denied, limit=2 * MAX_DETAIL_CHARS)
    if isinstance(err, ResponseError) and "DB index is out of range" in str(err):
        return f"XMC_REDIS_URL: database {redis_db_of(redis_url)} does not exist on the Redis at {where} ({detail})"
    if isinstance(err, AuthenticationError):
        return f"the Redis at {where} refused the credentials of XMC_REDIS_URL: {detail}"
    if isinstance(err, RedisTimeoutError):
        return f"the Redis at {where} did not answer within XMC_REDIS_TIMEOUT_SECONDS={timeout:g}: {detail}"
    if isinstance(err, InvalidResponse):
        return f"the endpoint at {where} (XMC_REDIS_URL) does not speak the Redis protocol: {detail}"
    if is_certificate_refused(err):
        return (
            f"the Redis at {where} presented a certificate that XMC_REDIS_TLS_CA_FILE (the system's CAs when "
            f"unset) does not verify: {detail}"
        )
    if isinstance(err, RedisConnectionError):
        return f"cannot reach Redis at {where} (XMC_REDIS_URL): {detail}"
    return f"the Redis at {where} replied: {detail}"


def workflow_failure_message(err: WorkflowFailureError, workflow_id: str) -> str:
    """A failed run as one line: the workflow ID and the chain of causes, innermost last."""
    causes: list[str] = []
    cause: BaseException | None = err.cause
    while cause is not None and len(causes) < 4:
        kind = getattr(cause, "type", None) or type(cause).__name__
        causes.append(f"{kind}: {one_line(str(cause))}")
        cause = cause.__cause__
    return one_line(f"{workflow_id} failed: " + " <- ".join(causes or [str(err)]), limit=2 * MAX_DETAIL_CHARS)


def update_failure_message(err: WorkflowUpdateFailedError, workflow_id: str) -> str:
    """A rejected Update as one line: the workflow ID and the validator's reason (it names the field)."""
    cause = err.cause
    detail = getattr(cause, "message", None) or str(cause)
    return one_line(f"{workflow_id} rejected the change: {detail}")


def operator_message(err: BaseException, settings: Settings | None) -> str | None:
    """One line for an error the operator can mend, or None for anything else (a bug: let it raise).

    Args:
        err: what the command raised.
        settings: the settings in use (None when reading them failed), to name the Redis.
    """
    if isinstance(err, ValidationError):
        return validation_message(err)
    if isinstance(err, OperatorError):
        return one_line(str(err), limit=2 * MAX_DETAIL_CHARS)
    if isinstance(err, (RedisConnectionError, RedisTimeoutError, ResponseError, InvalidResponse)):
        if settings is None:
            return one_line(f"Redis: {err}")
        return redis_message(err, settings.redis_url, settings.redis_timeout_seconds)
    if isinstance(err, (TemporalUnreachableError, SearchAttributesMissingError)):
        return one_line(str(err), limit=4 * MAX_DETAIL_CHARS)
    if isinstance(err, WorkflowAlreadyStartedError):
        return one_line(
            f"a resumption is already running: {err.workflow_id} (run {err.run_id}); "
            f"see it with xmc status, change it with xmc set, stop it with xmc stop"
        )
    if isinstance(err, RPCError):
        address, namespace = temporal_target()
        return one_line(
            f"Temporal at TEMPORAL_ADDRESS={address}, TEMPORAL_NAMESPACE={namespace}: {err.status.name}: {err.message}"
        )
    return None
