"""The Updates' contract: names, changes, their checks and what they return (docs/contract.md, "Updates")."""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from xmc_resumption.workflows.models import ResumptionInput, ThrottlePolicy


class ControlChange(BaseModel):
    """The argument of the ``configure`` Update: the settings to change, None kept (docs/contract.md, "Updates")."""

    model_config = ConfigDict(extra="forbid")

    max_backlog_threshold: int | None = Field(default=None, strict=True)
    batch_size: int | None = Field(default=None, strict=True)
    throttle_seconds: float | None = Field(default=None, allow_inf_nan=False, strict=True)
    throttle_policy: ThrottlePolicy | None = None
    max_tasks_per_second: float | None = Field(default=None, allow_inf_nan=False, strict=True)

    def applied_to(self, inp: ResumptionInput) -> ResumptionInput:
        """``inp`` with this change, validated as a start's input would be.

        Raises:
            pydantic.ValidationError: naming the field, when the result breaks a bound or a rule.
        """
        changes = self.model_dump(exclude_none=True)
        if changes.get("max_tasks_per_second") == 0:
            changes["max_tasks_per_second"] = None  # 0 removes the cap
        return ResumptionInput.model_validate({**inp.model_dump(), **changes})

    def checked_against(self, inp: ResumptionInput) -> ResumptionInput:
        """``applied_to``, its refusal on one line.

        Raises:
            InvalidControlError: ``<field>: <message>`` when the result breaks a bound or a rule.
        """
        try:
            return self.applied_to(inp)
        except ValidationError as err:
            raise InvalidControlError(first_error(None, err, self.model_dump(exclude_none=True))) from None

    @classmethod
    def of_update(cls, update: Control, args: Sequence[object]) -> ControlChange:
        """The change an Update asks for, from its arguments as JSON decoded them (any type).

        Raises:
            InvalidControlError: one line naming the Update and the field (docs/contract.md, "Updates").
        """
        wanted = 0 if update is Control.PAUSE else 1
        if len(args) != wanted:
            raise InvalidControlError(f"{update.value}: takes {wanted} argument(s), got {len(args)}")
        if update is Control.PAUSE:
            return cls()
        value = args[0]
        if update is Control.CONFIGURE:
            if not isinstance(value, dict | ControlChange):
                raise InvalidControlError(
                    f"configure: the change must be a JSON object of {', '.join(cls.model_fields)}, "
                    f"got {_json_kind(value)}"
                )
            data = value.model_dump(exclude_none=True) if isinstance(value, ControlChange) else value
        else:
            field = SET_FIELDS[update]
            if value is None:
                raise InvalidControlError(f"{update.value}: {field}: a value is required, got null")
            data = {field: value}
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise InvalidControlError(first_error(update, err, data)) from None


def _json_kind(value: object) -> str:
    """What a JSON-decoded value is, for a message: ``a bool``, ``a str``, ``null``, ..."""
    if value is None:
        return "null"
    return f"a {type(value).__name__}"


def first_error(update: Control | None, err: ValidationError, data: object, whole: str = "change") -> str:
    """``[<update>: ]<field>: <pydantic's message> (got <kind>)``, ``whole`` for the value itself, never the value."""
    first = err.errors(include_url=False)[0]
    field = ".".join(str(x) for x in first["loc"]) or whole
    msg = first["msg"].removeprefix("Value error, ")
    given = first.get("input", data)
    got = f" (got {_json_kind(given)})" if first["type"].endswith("_type") else ""
    prefix = f"{update.value}: " if update is not None else ""
    return " ".join(f"{prefix}{field}: {msg}{got}".split())


INVALID_CONTROL = "InvalidControl"
"""``ApplicationError.type`` of an Update refused for its argument (non-retryable)."""

RESUMPTION_ENDING = "ResumptionEnding"
"""``ApplicationError.type`` of an Update refused because the run is ending (non-retryable)."""


class InvalidControlError(ValueError):
    """An Update's arguments break the contract; ``str()`` is one line naming the Update and the field."""


class EffectiveSettings(BaseModel):
    """What every control Update returns: the settings the replay runs with now (docs/contract.md, "Updates")."""

    max_backlog_threshold: int
    batch_size: int
    throttle_seconds: float
    throttle_policy: ThrottlePolicy
    stopping: bool = False
    max_tasks_per_second: float | None = None

    @classmethod
    def of(cls, inp: ResumptionInput, *, batch_size: int, stopping: bool) -> EffectiveSettings:
        """The effective settings of input ``inp``, whose batch in use is ``batch_size`` (entries)."""
        return cls(
            max_backlog_threshold=inp.max_backlog_threshold,
            batch_size=batch_size,
            throttle_seconds=inp.throttle_seconds,
            throttle_policy=inp.throttle_policy,
            stopping=stopping,
            max_tasks_per_second=inp.max_tasks_per_second,
        )


class Control(StrEnum):
    """Names of the workflow's Updates (``temporal workflow update execute --name <name>``): docs/contract.md."""

    CONFIGURE = "configure"
    SET_THRESHOLD = "set_threshold"
    SET_BATCH_SIZE = "set_batch_size"
    SET_THROTTLE_SECONDS = "set_throttle_seconds"
    SET_THROTTLE_POLICY = "set_throttle_policy"
    SET_MAX_TASKS_PER_SECOND = "set_max_tasks_per_second"
    PAUSE = "pause"


SET_FIELDS: dict[Control, str] = {
    Control.SET_THRESHOLD: "max_backlog_threshold",
    Control.SET_BATCH_SIZE: "batch_size",
    Control.SET_THROTTLE_SECONDS: "throttle_seconds",
    Control.SET_THROTTLE_POLICY: "throttle_policy",
    Control.SET_MAX_TASKS_PER_SECOND: "max_tasks_per_second",
}
"""The ``ControlChange`` field each one-value Update sets."""
