"""Every ``xmc`` flag and argument with good and hostile values, enumerated from the click command
tree itself, so a new flag is covered the day it is added (issue 16, item 6).

A hostile value (nan, inf, an overflow to inf, below or above the bounds, a huge number, the
wrong type, an empty string, a bad name or entry ID, a value given to a flag) must be refused at
parse time: exit 2, nothing on stdout, one line on stderr naming the option, no traceback; nothing
is connected to (Redis and Temporal are unreachable here, so a value that got past the parser
would fail with another message). A good value (each bound, the default, each choice) must parse
to itself. An option whose type has no rule here fails the test: every option needs a type that
checks its value (``xmc_resumption.cli.params``)."""

from __future__ import annotations

import math
import types
from collections.abc import Iterator

import click
import pytest

from xmc_resumption.cli import AppState, cli, main
from xmc_resumption.cli.params import (
    MAX_ENTRY_ID_PART,
    MAX_TASK_QUEUE_LENGTH,
    DurationType,
    EntryIdType,
    FiniteFloat,
    IntegerRange,
    NameListType,
    NameType,
    TaskQueueType,
)
from xmc_resumption.services import free_port

NOT_NUMBERS = ["nan", "NaN", "inf", "-inf", "abc", "", " ", "true", "1,5", "0x10", "\u0661\u0660", "\uff11", "1_0"]
"""Never a number on the command line: Arabic-Indic and fullwidth digits and underscores too, which
Python's ``int()`` and ``float()`` take (issue 26, row 9)."""

NOT_INTEGERS = [*NOT_NUMBERS, "1.5", "1e3", "9" * 30]
BAD_NAMES = ["", "a b", "{S}", "x*", "é", "x" * 201, "a\nb", "a'b"]
GOOD_NAMES = ["E1", "a.b_c:d/e@f+g=h-i", "x" * 200]
BAD_ENTRY_IDS = [
    "",
    "abc",
    "1",
    "1-",
    "-1-0",
    "1-1-1",
    "1-1 ",
    f"{MAX_ENTRY_ID_PART + 1}-0",
    f"0-{'9' * 30}",
    "\u0661-0",
]
GOOD_TASK_QUEUES = ["xmc-resumption", "q/ü é", "x" * MAX_TASK_QUEUE_LENGTH]
BAD_TASK_QUEUES = ["", " q", "q ", "a\nb", "x" * (MAX_TASK_QUEUE_LENGTH + 1)]
GOOD_ENTRY_IDS = ["0-0", "1-1", f"{MAX_ENTRY_ID_PART}-{MAX_ENTRY_ID_PART}"]


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def values(param: click.Parameter) -> tuple[list[str], list[str]]:
    """(good values, hostile values) of ``param`` as command-line text, by its type.

    Raises:
        AssertionError: a type with no rule here (a plain INT, FLOAT or STRING option).
    """
    t = param.type
    if isinstance(param, click.Option) and param.is_flag:
        return [], []  # a flag takes no value: checked by test_a_flag_takes_no_value
    if isinstance(t, click.IntRange) and not isinstance(t, FiniteFloat):
        assert isinstance(t, IntegerRange), f"{param.opts}: click.IntRange takes any script's digits: use IntegerRange"
        assert t.min is not None and t.max is not None, f"{param.opts}: an integer range needs both bounds"
        assert not (t.min_open or t.max_open), f"{param.opts}: use closed integer bounds"
        good = [str(t.min), str(t.max)] + ([str(param.default)] if isinstance(param.default, int) else [])
        return good, [*NOT_INTEGERS, str(t.min - 1), str(t.max + 1), str(-abs(t.max) - 1), str(10 * t.max + 7)]
    if isinstance(t, FiniteFloat):
        assert t.min is not None and t.max is not None, f"{param.opts}: a decimal range needs both bounds"
        low, high = float(t.min), float(t.max)
        good = [_number(high), _number(low + (high - low) / 2)] + ([] if t.min_open else [_number(low)])
        if isinstance(param.default, float):
            good.append(_number(param.default))
        bad = [*NOT_NUMBERS, "1e999", "-1e999", _number(high * 2 + 1), _number(low - 1), "1" + "0" * 400]
        if t.min_open:
            bad.append(_number(low))
        return good, bad
    if isinstance(t, click.Choice):
        choices = [str(c) for c in t.choices]
        return choices, ["", "bogus", choices[0].upper(), " " + choices[0], "1"]
    if isinstance(t, NameType):
        return GOOD_NAMES, BAD_NAMES
    if isinstance(t, NameListType):
        return [*GOOD_NAMES, f"{GOOD_NAMES[0]},other"], [
            *BAD_NAMES,
            "a,,b",
            "a,a",
            ",".join(f"g{i}" for i in range(65)),
        ]
    if isinstance(t, EntryIdType):
        return GOOD_ENTRY_IDS, BAD_ENTRY_IDS
    if isinstance(t, TaskQueueType):
        return GOOD_TASK_QUEUES, BAD_TASK_QUEUES
    if isinstance(t, DurationType):
        good = [f"{_number(t.low)}s", f"{_number(t.high)}s", f"{_number(t.high / 60)}m"]
        too_short, too_long = f"{_number(t.low / 2)}s", f"{_number(t.high * 2)}s"
        return good, ["", "10", "10x", "m", "-1m", "1e3s", "\u0661\u0660m", "10 m", "inf", too_short, too_long]
    raise AssertionError(f"{param.opts} has type {t!r}: no rule checks its values (xmc_resumption.cli.params)")


def every_param() -> Iterator[tuple[str, click.Command, click.Parameter]]:
    for name, command in sorted(cli.commands.items()):
        for param in command.params:
            if isinstance(param, click.Option) and param.name == "help":
                continue
            yield name, command, param


def required_args(command: click.Command, but: click.Parameter | None = None) -> list[str]:
    """Good values of ``command``'s required arguments (an experiment ID), ``but`` left out."""
    return ["E1" for p in command.params if isinstance(p, click.Argument) and p.required and p is not but]


def placed(command: click.Command, param: click.Parameter, value: str) -> list[str]:
    """The command line of ``command`` with ``param`` set to ``value`` (``--opt=value``, so a value
    that starts with '-' is not read as an option; an argument after ``--``)."""
    if isinstance(param, click.Argument):
        return ["--", value]
    return [*required_args(command), f"{param.opts[0]}={value}"]


def what(param: click.Parameter) -> str:
    """How click names the parameter in an error: ``'--threshold'`` or ``'EXPERIMENT_ID'``."""
    return f"'{param.opts[0]}'" if isinstance(param, click.Option) else f"'{param.name.upper()}'"  # type: ignore[union-attr]


CASES = [
    pytest.param(name, command, param, value, id=f"{name}-{param.name}-{value[:20]!r}")
    for name, command, param in every_param()
    for value in values(param)[1]
]
GOOD = [
    pytest.param(name, command, param, value, id=f"{name}-{param.name}-{value[:20]!r}")
    for name, command, param in every_param()
    for value in values(param)[0]
]
FLAGS = [
    pytest.param(name, command, param, id=f"{name}-{param.name}")
    for name, command, param in every_param()
    if isinstance(param, click.Option) and param.is_flag
]


NOBODY = (free_port(), free_port())
"""Two loopback ports nobody listens on (Redis, Temporal)."""


@pytest.fixture(autouse=True)
def nowhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis and Temporal unreachable: a value that got past the parser fails another way. And
    ``main``'s closing ``gc.collect()`` (for the SDK's teardown; nothing here reaches the SDK)
    skipped: on the test session's heap it costs 0.1 s a call, 900 calls."""
    monkeypatch.setenv("XMC_REDIS_URL", f"redis://127.0.0.1:{NOBODY[0]}/0")
    monkeypatch.setenv("TEMPORAL_ADDRESS", f"127.0.0.1:{NOBODY[1]}")
    monkeypatch.setattr("xmc_resumption.cli.common.gc", types.SimpleNamespace(collect=lambda: 0))


def test_the_tree_is_walked() -> None:
    """The walk sees every command and the options of the input model (a walk that found nothing
    would pass every case vacuously)."""
    names = {name for name, _, _ in every_param()}
    assert names == set(cli.commands) == {
        "pause", "enqueue", "status", "dead", "held", "list", "resume", "set", "stop", "demo", "plan", "rate",
        "reconcile",
    }  # fmt: skip
    assert len(CASES) > 500 and len(GOOD) > 100 and len(FLAGS) >= 12


@pytest.mark.parametrize(("name", "command", "param", "value"), CASES)
def test_a_hostile_value_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], name: str, command: click.Command, param: click.Parameter, value: str
) -> None:
    capsys.readouterr()
    code = main([name, *placed(command, param, value)])
    out, err = capsys.readouterr()
    assert (code, out) == (2, ""), err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"xmc {name}: error: Invalid value for {what(param)}: "), lines[0]
    assert "Traceback" not in err


@pytest.mark.parametrize(("name", "command", "param", "value"), GOOD)
def test_a_good_value_parses_to_itself(name: str, command: click.Command, param: click.Parameter, value: str) -> None:
    args = [*placed(command, param, value)]
    ctx = command.make_context(name, args, obj=AppState())
    parsed = ctx.params[param.name]  # type: ignore[index]
    t = param.type
    if isinstance(t, FiniteFloat):
        assert math.isfinite(parsed) and parsed == float(value)
    elif isinstance(t, click.IntRange):
        assert parsed == int(value)
    elif isinstance(t, NameListType):
        assert parsed == value.split(",")
    elif isinstance(t, DurationType):
        assert parsed == float(value[:-1]) * DurationType.UNITS[value[-1]]
    elif param.nargs != 1:  # an argument of several values (xmc resume E1 E2 ...)
        assert parsed == (value,)
    else:
        assert parsed == value


@pytest.mark.parametrize(("name", "command", "param"), FLAGS)
def test_a_flag_takes_no_value(
    capsys: pytest.CaptureFixture[str], name: str, command: click.Command, param: click.Option
) -> None:
    code = main([name, *required_args(command), f"{param.opts[0]}=1"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, ""), err
    flag = param.opts[0]
    assert err.splitlines() == [f"xmc {name}: error: Option '{flag}' does not take a value. (see xmc {name} --help)"]
    ctx = command.make_context(name, [*required_args(command), param.opts[0]], obj=AppState())
    assert ctx.params[param.name] is True  # type: ignore[index]


UPDATE_COMMANDS = [
    pytest.param(name, command, param, value, id=f"{name}-{param.name}-{value[:20]!r}")
    for name, command, param in every_param()
    if name in ("set", "stop") and not isinstance(param, click.Argument)
    for value in values(param)[0]
]


@pytest.mark.parametrize(("name", "command", "param", "value"), UPDATE_COMMANDS)
def test_set_and_stop_with_a_good_value_get_as_far_as_temporal(
    capsys: pytest.CaptureFixture[str], name: str, command: click.Command, param: click.Parameter, value: str
) -> None:
    """The whole command runs (``xmc set E --policy fixed`` crashed in its own check once) up to
    Temporal, which is unreachable here: one line, exit 2."""
    args = placed(command, param, value)
    if name == "set" and param.name in ("timeout", "stream", "as_json"):
        args.append("--batch=5")  # set needs something to change
    code = main([name, *args])
    out, err = capsys.readouterr()
    assert (code, out) == (2, ""), err
    assert err.splitlines()[0].startswith(f"xmc {name}: cannot reach Temporal at TEMPORAL_ADDRESS="), err
    assert len(err.splitlines()) == 1, err


def test_a_rate_in_arabic_indic_digits_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 26, row 9: ``xmc rate --set`` with Arabic-Indic 10 is refused like any other number
    that is not in ASCII digits (before: read as 10 and written for every replay of the stream)."""
    code = main(["rate", "--set", "\u0661\u0660"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "xmc rate: error: Invalid value for '--set': '\u0661\u0660' is not a number in ASCII digits. "
        "(see xmc rate --help)"
    ]
