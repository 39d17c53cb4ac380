"""The operator CLI against a real redis-server: pause, enqueue, status (unknown, orphaned), held,
--json on every command, refusals (one line, exit 2). The Temporal side: tests/test_cli_temporal.py."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from redis.asyncio import Redis

from tests.support.helpers import xmc_process
from xmc_resumption.cli import INPUT_OPTIONS, main
from xmc_resumption.redisclient import fencing, held
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.services import free_port
from xmc_resumption.workflows.models import ResumptionInput

STREAM = "xmc-tasks-stream"


@dataclass
class Ran:
    """What one ``xmc`` command did: its exit code and what it printed."""

    returncode: int
    stdout: str
    stderr: str


Xmc = Callable[..., Ran]


@pytest.fixture(name="xmc")
def xmc_fixture(capsys: pytest.CaptureFixture[str], redis_url: str) -> Xmc:
    """Run ``xmc.cli.main(args)`` in this process (a process per command costs about a second)
    on a thread of its own (it runs its own event loop), with ``XMC_REDIS_URL`` (default: the
    session's redis-server), ``TEMPORAL_ADDRESS`` (default: a port nobody listens on) and ``env``."""

    def run(*args: str, redis_at: str | None = None, temporal: str | None = None, **env: str) -> Ran:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("XMC_REDIS_URL", redis_at or redis_url)
            mp.setenv("TEMPORAL_ADDRESS", temporal or f"127.0.0.1:{free_port()}")
            for name, value in env.items():
                mp.setenv(name, value)
            capsys.readouterr()
            with ThreadPoolExecutor(1) as pool:
                code = pool.submit(main, list(args)).result()
            out, err = capsys.readouterr()
        return Ran(code, out, err)

    return run


def one_line(proc: Ran | subprocess.CompletedProcess[str], *parts: str) -> str:
    """Assert exit 2, nothing on stdout and one stderr line holding ``parts``; return the line."""
    assert (proc.returncode, proc.stdout) == (2, ""), proc
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


async def test_pause_enqueue_status_and_orphan(redis: Redis, xmc: Xmc) -> None:
    paused = xmc("pause", "E7", "--json")
    assert json.loads(paused.stdout) == {"experiment_id": "E7", "stream": STREAM, "state": "paused"}
    enqueued = xmc("enqueue", "E7", "--count", "25", "--json")
    assert json.loads(enqueued.stdout) == {"experiment_id": "E7", "enqueued": {"held": 25}}
    assert xmc("enqueue", "E7", "--count", "2").stdout == "enqueued 2 tasks of E7: 2 to held\n"
    keys = ExperimentKeys(STREAM, "E7")
    grant = await fencing.acquire_claim(redis, keys, "resumption-E7", 60_000)
    status = json.loads(xmc("status", "E7", "--json").stdout)
    assert (status["state"], status["held"], status["fence"], status["orphaned"]) == (
        "resuming",
        27,
        grant.token,
        False,
    )
    assert status["claim"]["owner"] == "resumption-E7"
    assert status["run"]["error"].startswith("cannot reach Temporal at TEMPORAL_ADDRESS=127.0.0.1:")
    await redis.delete(keys.claim)  # the lease lapsed with no replayer left
    status = json.loads(xmc("status", "E7", "--json").stdout)
    assert (status["state"], status["orphaned"], status["exists"]) == ("resuming", True, True)
    text = xmc("status", "E7")
    assert text.returncode == 0 and text.stderr == ""
    assert text.stdout.startswith(f"E7 on {STREAM}: resuming (orphaned: resuming, no live claim)\n  held: 27 tasks")
    assert "resumption: unknown (cannot reach Temporal" in text.stdout


async def test_status_of_an_experiment_with_no_keys_is_unknown(redis: Redis, xmc: Xmc) -> None:
    doc = json.loads(xmc("status", "TYPO", "--json").stdout)
    assert (doc["state"], doc["exists"], doc["held"], doc["claim"]) == ("unknown", False, 0, {})
    assert xmc("status", "TYPO").stdout.startswith(f"TYPO on {STREAM}: unknown: no key of this experiment")
    await held.pause(redis, ExperimentKeys(STREAM, "E8"))
    await redis.delete(ExperimentKeys(STREAM, "E8").state)  # resumed and done: only the fence counter is left
    await redis.set(ExperimentKeys(STREAM, "E8").fence, 3)
    doc = json.loads(xmc("status", "E8", "--json").stdout)
    assert (doc["state"], doc["exists"], doc["fence"]) == ("running", True, 3)


async def test_held_lists_paused_orphaned_resuming_and_stranded(redis: Redis, xmc: Xmc) -> None:
    for name, n in (("P1", 3), ("O1", 2), ("R1", 4), ("S1", 1), ("done", 0)):
        keys = ExperimentKeys(STREAM, name)
        await held.pause(redis, keys)
        for i in range(n):
            await held.enqueue_task(redis, keys, {"t": str(i)})
    await fencing.acquire_claim(redis, ExperimentKeys(STREAM, "O1"), "resumption-O1", 60_000)
    await redis.delete(ExperimentKeys(STREAM, "O1").claim)  # its replayer is gone
    r1 = await fencing.acquire_claim(redis, ExperimentKeys(STREAM, "R1"), "resumption-R1", 60_000)
    await redis.delete(ExperimentKeys(STREAM, "S1").state, ExperimentKeys(STREAM, "done").state)
    await held.pause(redis, ExperimentKeys("other-stream", "X1"))  # another stream's: not listed
    doc = json.loads(xmc("held", "--json").stdout)
    rows = {r["experiment_id"]: (r["condition"], r["state"], r["held"]) for r in doc["experiments"]}
    assert rows == {
        "O1": ("orphaned", "resuming", 2),
        "P1": ("paused", "paused", 3),
        "R1": ("resuming", "resuming", 4),
        "S1": ("stranded", "running", 1),
    }
    assert doc["truncated"] is False
    orphaned = json.loads(xmc("held", "--orphaned", "--json").stdout)
    assert [r["experiment_id"] for r in orphaned["experiments"]] == ["O1"]
    text = xmc("held").stdout.splitlines()
    assert text[0].split() == ["EXPERIMENT", "CONDITION", "STATE", "HELD", "CLAIM"]
    assert text[1].split()[:4] == ["O1", "orphaned", "resuming", "2"]
    assert text[3].split()[:6] == ["R1", "resuming", "resuming", "4", "token", str(r1.token)]
    limited = json.loads(xmc("held", "--limit", "2", "--json").stdout)
    assert limited["truncated"] is True and len(limited["experiments"]) == 2
    assert json.loads(xmc("held", "--stream", "other-stream", "--json").stdout)["experiments"][0]["experiment_id"] == (
        "X1"
    )


async def test_held_names_a_key_of_the_wrong_type(redis: Redis, xmc: Xmc) -> None:
    keys = ExperimentKeys(STREAM, "B1")
    await redis.rpush(keys.state, "x")
    rows = json.loads(xmc("held", "--json").stdout)["experiments"]
    assert rows == [
        {
            "experiment_id": "B1",
            "state": None,
            "held": None,
            "claim": {},
            "condition": "bad_keys",
            "error": f"key {keys.state} is a list, expected a string: paused, resuming (absent: running)",
        }
    ]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["enqueue", "E7", "--count", "-5"], "Invalid value for '--count': -5 is not in the range 1<=x<=1000000"),
        (["enqueue", "E7", "--count", "0"], "Invalid value for '--count': 0 is not in the range"),
        (["status", "E7", "--threshold", "100001"], "Invalid value for '--threshold': 100001 is not in the range"),
        (["held", "--limit", "0"], "Invalid value for '--limit': 0 is not in the range"),
        (["list", "--phase", "sleeping"], "Invalid value for '--phase': 'sleeping' is not one of 'claiming'"),
        (["resume", "E7", "--policy", "eager"], "Invalid value for '--policy': 'eager' is not one of 'fixed'"),
        (["resume", "E7", "--nope"], "No such option '--nope'"),
        (["dead", "E7", "--retry", "1-1", "--drop", "1-2"], "--retry and --drop exclude each other"),
        (["set", "E7"], "nothing to change: give --threshold, --batch"),
        (["stop"], "Missing argument 'EXPERIMENT_ID'"),
        (["frobnicate"], "No such command 'frobnicate'"),
    ],
)
def test_bad_arguments_are_one_line(xmc: Xmc, args: list[str], expected: str) -> None:
    line = one_line(xmc(*args), expected, "--help)")
    assert line.startswith("xmc"), line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["resume", "E7", "--throttle-seconds", "200"],
            "xmc resume: invalid ResumptionInput: claim_lease_seconds (120) must be longer than throttle_seconds (200)",
        ),
        (["resume", "E7", "--min-wait", "5", "--max-wait", "1", "--policy", "adaptive"], "max_wait_seconds (1)"),
        (
            ["resume", "E7", "--policy", "adaptive", "--max-wait", "120"],
            "claim_lease_seconds (120) must be longer than max_wait_seconds (120)",
        ),
    ],
)
def test_bad_values_are_checked_by_the_model(xmc: Xmc, args: list[str], expected: str) -> None:
    """Rules over several fields, checked by the model before Redis or Temporal is asked (neither
    is reachable here); a value out of its own bounds is refused by its option's type
    (tests/test_cli_values.py)."""
    one_line(xmc(*args, redis_at="redis://127.0.0.1:1/0"), f"xmc {args[0]}: ", expected)


def test_resume_flags_take_the_models_defaults_and_bounds(xmc: Xmc) -> None:
    text = xmc("resume", "--help").stdout
    for flag in ("--claim-lease-seconds", "--missing-group", "--min-wait", "--max-wait", "--max-stall-seconds"):
        assert flag in text
    assert "claim_lease_seconds: the claim's lease" in " ".join(text.split())
    flat = " ".join(text.split())  # click wraps help to its column width
    assert "[default: 120.0; 0<x<=604800.0]" in flat and "[default: (automatic); 1<=x<=10000]" in flat


async def test_a_long_claim_lease_lets_a_long_throttle_validate(redis: Redis, xmc: Xmc) -> None:
    """--throttle-seconds 200 needs --claim-lease-seconds above it; it then gets as far as Temporal."""
    await held.pause(redis, ExperimentKeys(STREAM, "E7"))
    proc = xmc("resume", "E7", "--throttle-seconds", "200", "--claim-lease-seconds", "300")
    one_line(proc, "xmc resume: cannot reach Temporal at TEMPORAL_ADDRESS=")


async def test_nothing_to_resume_is_refused_with_exit_2(redis: Redis, xmc: Xmc) -> None:
    """A name never paused here (no key at all) is told apart from a finished experiment (its
    fence counter is left: running, nothing held)."""
    one_line(
        xmc("resume", "E-none"),
        f"xmc resume: experiment E-none has no key on {STREAM} (never paused here: a typo, or another --stream?): "
        "nothing to resume (--force starts the workflow anyway)",
    )
    await redis.set(ExperimentKeys(STREAM, "E-done").fence, 1)
    one_line(xmc("resume", "E-done"), f"xmc resume: experiment E-done is running and holds no tasks on {STREAM}")


async def test_held_orphaned_says_when_none_is(redis: Redis, xmc: Xmc) -> None:
    await held.pause(redis, ExperimentKeys(STREAM, "E-paused"))
    assert xmc("held", "--orphaned").stdout == f"no experiment on {STREAM} is orphaned\n"
    assert xmc("held").stdout.split()[:2] == ["EXPERIMENT", "CONDITION"]


def test_errors_are_one_line_and_exit_2(redis_url: str, xmc: Xmc) -> None:
    bad = xmc_process("redis://127.0.0.1:1/0", "status", "E7")
    assert one_line(bad).startswith("xmc status: cannot reach Redis at redis://127.0.0.1:1/0")
    held_bad = xmc("held", "--json", redis_at="redis://127.0.0.1:1/0")
    assert one_line(held_bad).startswith("xmc held: cannot reach Redis at redis://127.0.0.1:1/0")
    unreachable = xmc("list", "--json")
    assert one_line(unreachable).startswith("xmc list: cannot reach Temporal at TEMPORAL_ADDRESS=127.0.0.1:")


async def test_every_command_prints_one_json_document(redis: Redis, xmc: Xmc) -> None:
    keys = ExperimentKeys(STREAM, "J1")
    for args in (
        ["pause", "J1"],
        ["enqueue", "J1", "--count", "3"],
        ["status", "J1"],
        ["dead", "J1"],
        ["held"],
    ):
        proc = xmc(*args, "--json")
        assert (proc.returncode, proc.stderr) == (0, ""), proc
        assert isinstance(json.loads(proc.stdout), dict)  # one document, nothing else
        text = xmc(*args)
        assert text.returncode == 0
        with pytest.raises(json.JSONDecodeError):
            json.loads(text.stdout)
    assert await redis.xlen(keys.held) == 6


def test_help_exits_0(redis_url: str) -> None:
    proc = xmc_process(redis_url, "--help")
    assert proc.returncode == 0 and "held" in proc.stdout and "Exit codes: 0 done, 1" in " ".join(proc.stdout.split())


def test_resume_has_an_option_for_every_input_field() -> None:
    """A field added to ``ResumptionInput`` needs its ``xmc resume`` option (two were missed once)."""
    own = {"experiment_id", "stream", "carry"}
    assert {o.field for o in INPUT_OPTIONS} == set(ResumptionInput.model_fields) - own


def test_resume_passes_the_memory_fraction_and_the_fair_share(redis_url: str) -> None:
    """Both reach the input model: a bad fraction is refused by the field's bounds before anything starts."""
    bad = xmc_process(redis_url, "resume", "E9", "--max-memory-fraction", "1.5")
    assert (bad.returncode, bad.stderr.count("\n")) == (2, 1), bad.stderr
    assert "Invalid value for '--max-memory-fraction': 1.5 is not in the range 0<x<=1" in bad.stderr
    shown = xmc_process(redis_url, "resume", "--help").stdout
    assert "--fair-share / --no-fair-share" in shown and "--max-memory-fraction" in shown


@pytest.mark.parametrize("action", [[], ["--retry", "1-1"], ["--drop", "1-1"]], ids=["list", "retry", "drop"])
async def test_dead_names_a_dead_letter_key_of_the_wrong_type(redis: Redis, xmc: Xmc, action: list[str]) -> None:
    keys = ExperimentKeys(STREAM, "D1")
    await redis.set(keys.dead, "text")
    line = one_line(xmc("dead", "D1", *action), f"WRONGTYPE {keys.dead} is a string, expected a stream")
    assert line.startswith("xmc dead: " + ("nothing moved: " if action else "WRONGTYPE"))
    assert await redis.get(keys.dead) == b"text"
