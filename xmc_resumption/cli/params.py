"""Click parameter types of the ``xmc`` command: every value is checked at parse time.

A value that breaks the rule of the thing it sets is refused with one line naming the option.

A number that reaches Redis, a timer or a timeout is finite and bounded (the house rule), so there
is no plain ``click.INT`` / ``click.FLOAT`` / ``click.STRING`` option: integers are
``IntegerRange`` with both bounds, decimals ``FiniteFloat`` (nan and inf refused, both bounds),
each written in ASCII digits only (``INTEGER``, ``DECIMAL``: Python's ``int()`` and ``float()`` take
any script's digits, Arabic-Indic U+0661 U+0660 for 10, and the Lua scripts and Redis take none),
names ``NameType`` (``redisclient.keys.validate_name``), lists of names ``NameListType``, entry
IDs ``EntryIdType``, task queues ``TaskQueueType``, choices ``click.Choice``. An option that sets
a field of a pydantic model takes its type from that field (``field_type``), so the model stays the
one rule; tests/test_cli_values.py walks the command tree and checks every option against this list.
"""

from __future__ import annotations

import enum
import math
import re
import types
import typing
from typing import Any

import annotated_types
import click
from pydantic import BaseModel

from xmc_resumption.redisclient.keys import validate_name

MAX_ENTRY_ID_PART = 2**64 - 1
"""Each part of a stream entry ID (``<ms>-<seq>``) is an unsigned 64-bit integer (Redis streams)."""


INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*", re.ASCII)
"""An integer as the command line takes it: ASCII digits, a sign, blanks around."""

DECIMAL = re.compile(r"\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\s*", re.ASCII)
"""A decimal as the command line takes it: ASCII digits, a point, an exponent, a sign, blanks around."""


def _ascii_number(
    kind: click.ParamType[Any],
    pattern: re.Pattern[str],
    value: Any,
    param: click.Parameter | None,
    ctx: click.Context | None,
) -> None:
    """Fail unless ``value`` (a command-line text; a number given in code passes) matches ``pattern``."""
    if isinstance(value, str) and not pattern.fullmatch(value):
        kind.fail(f"{value[:40]!r} is not a number in ASCII digits.", param, ctx)


class IntegerRange(click.IntRange):
    """An integer within ``min``..``max``, both bounds given, written in ASCII digits (``INTEGER``).

    ``click.IntRange`` alone takes any script's digits (Arabic-Indic U+0661 U+0660 as 10) and underscores.
    """

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """The integer ``value`` stands for; ``fail`` when it breaks the rule above."""
        _ascii_number(self, INTEGER, value, param, ctx)
        return super().convert(value, param, ctx)


class FiniteFloat(click.FloatRange):
    """A decimal within ``min``..``max``; nan, inf and values that overflow to inf (``1e999``) are refused.

    Written in ASCII digits (``DECIMAL``: ``float()`` takes any script's digits, and ``1_0``). ``min_open`` /
    ``max_open`` exclude the bound. ``click.FloatRange`` alone lets nan through: every comparison with nan
    is false.
    """

    name = "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """The finite number ``value`` stands for; ``fail`` when it breaks the rule above."""
        if isinstance(value, str) and value.strip().lower().lstrip("+-") in ("nan", "inf", "infinity"):
            self.fail(f"{value[:40]!r} is not a finite number.", param, ctx)
        _ascii_number(self, DECIMAL, value, param, ctx)
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{str(value)[:40]!r} is not a finite number.", param, ctx)
        return super().convert(number, param, ctx)


class NameType(click.ParamType[str]):
    """A name that becomes part of a key (an experiment ID, a stream, a group): ``validate_name``."""

    name = "name"

    def __init__(self, what: str) -> None:
        self.what = what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        """``value`` as a checked name; ``fail`` names the rule it breaks."""
        try:
            return validate_name(self.what, str(value))
        except ValueError as err:
            self.fail(str(err), param, ctx)


class NameListType(click.ParamType[list[str]]):
    """Names separated by commas (``a,b``); the value is the list.

    Each by ``validate_name``'s rule, none twice, at most ``MAX_LISTED_NAMES``.
    """

    name = "names"

    def __init__(self, what: str) -> None:
        self.what = what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> list[str]:
        """The names ``value`` lists; ``fail`` names the rule it breaks."""
        if isinstance(value, list):
            return value
        try:
            names = [validate_name(self.what, part) for part in str(value).split(",")]
        except ValueError as err:
            self.fail(str(err), param, ctx)
        if len(set(names)) != len(names) or len(names) > MAX_LISTED_NAMES:
            self.fail(f"{self.what}: 1..{MAX_LISTED_NAMES} distinct names, separated by commas", param, ctx)
        return names


MAX_LISTED_NAMES = 64
"""The most names a ``NameListType`` takes (``redisclient.backlog.MAX_GROUPS``: the groups one
reading measures)."""


class EntryIdType(click.ParamType[str]):
    """A stream entry ID, ``<ms>-<seq>``, each part 0..2^64-1."""

    name = "entry-id"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        """``value`` as an entry ID; ``fail`` when it is none."""
        text = str(value)
        match = re.fullmatch(r"([0-9]{1,20})-([0-9]{1,20})", text)
        if not match or any(int(part) > MAX_ENTRY_ID_PART for part in match.groups()):
            self.fail(f"not a stream entry ID (<ms>-<seq>, each 0..2^64-1): {text[:40]!r}", param, ctx)
        return text


class DurationType(click.ParamType[float]):
    """A duration of ``low``..``high`` seconds, converted to seconds.

    ASCII digits with a unit, ``s``, ``m``, ``h`` or ``d`` (``90s``, ``10m``, ``1.5h``).
    """

    name = "duration"
    UNITS = {"s": 1, "m": 60, "h": 3_600, "d": 86_400}

    def __init__(self, low: float, high: float) -> None:
        self.low, self.high = low, high

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        """The duration in seconds; a usage error for anything else, or out of bounds."""
        text = str(value).strip()
        match = re.fullmatch(r"([0-9]{1,7}(?:\.[0-9]{1,3})?)([smhd])", text, re.ASCII)
        if not match:
            self.fail(f"not a duration (a number and s, m, h or d, e.g. 10m): {text[:40]!r}", param, ctx)
        seconds = float(match.group(1)) * self.UNITS[match.group(2)]
        if not self.low <= seconds <= self.high:
            self.fail(f"{text} is not within {self.low:g}s..{self.high:g}s", param, ctx)
        return seconds


MAX_TASK_QUEUE_LENGTH = 1000
"""The longest task queue name (characters): the Temporal server's default ``limit.maxIDLength``."""


class TaskQueueType(click.ParamType[str]):
    """A Temporal task queue name: 1..``MAX_TASK_QUEUE_LENGTH`` printable characters, no leading or trailing blank.

    A queue that differs from the workers' by a blank is never polled.
    """

    name = "task-queue"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        """``value`` as a task queue name; ``fail`` when it is none."""
        text = str(value)
        if not text or len(text) > MAX_TASK_QUEUE_LENGTH or text != text.strip() or not text.isprintable():
            self.fail(
                f"not a task queue name (1..{MAX_TASK_QUEUE_LENGTH} printable characters, no leading or "
                f"trailing blank): {text[:40]!r}",
                param,
                ctx,
            )
        return text


def _bound(metadata: list[Any], kind: str) -> float | None:
    return next(
        (getattr(m, kind) for m in metadata if isinstance(m, annotated_types.BaseMetadata) and hasattr(m, kind)), None
    )


def field_type(model: type[BaseModel], name: str) -> click.ParamType[Any]:
    """The click type of an option that sets field ``name`` of ``model``: its type and bounds.

    Raises:
        TypeError: a field type with no finite, bounded command-line form (then the option needs a
            type of its own).
    """
    info = model.model_fields[name]
    annotation = info.annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = members[0] if len(members) == 1 else annotation
    ge, gt, le, lt = (_bound(info.metadata, k) for k in ("ge", "gt", "le", "lt"))
    if annotation is bool:
        return click.BOOL
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return click.Choice([str(m.value) for m in annotation])
    if annotation is int and (ge is not None or gt is not None) and (le is not None or lt is not None):
        low = int(ge) if ge is not None else int(gt) + 1  # type: ignore[arg-type]
        high = int(le) if le is not None else int(lt) - 1  # type: ignore[arg-type]
        return IntegerRange(low, high)
    if annotation is float and (ge is not None or gt is not None) and (le is not None or lt is not None):
        return FiniteFloat(
            ge if ge is not None else gt, le if le is not None else lt, min_open=ge is None, max_open=le is None
        )
    if annotation is str:
        return NameType(name)
    if typing.get_origin(annotation) is list and typing.get_args(annotation) == (str,):
        return NameListType(name)
    raise TypeError(f"{model.__name__}.{name} ({annotation}) has no bounded command-line type")
