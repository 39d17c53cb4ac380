"""What the consumers can take, sampled before a resume: ``xmc plan``'s drain figures and its estimate.

See docs/operating.md, "Plan".

A group's consumers show how fast they go only while they have entries to read: a group that caught
up (nothing undelivered) takes what producers add, whatever more it could take. So the sample polls
``XINFO GROUPS`` and the stream's newest entry every ``POLL_SECONDS``, and a group's rate counts as
what its consumers can take only when it had undelivered entries at every poll; otherwise it is a
lower bound (``caught_up``), or unknown when nothing reached it. What producers added to the stream
meanwhile is sampled too: a replay gets what the consumers take beyond it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from xmc_resumption.redisclient.backlog import measure_group
from xmc_resumption.redisclient.connection import RedisClient
from xmc_resumption.redisclient.keys import as_text
from xmc_resumption.redisclient.text import show_name
from xmc_resumption.workflows.eta import eta_seconds
from xmc_resumption.workflows.models import ResumptionInput, ThrottlePolicy

POLL_SECONDS = 0.25
"""How often the sample reads the groups (seconds): a group caught up between two polls may go unseen."""

COUNT_LIMIT = 100_000
"""Entries counted by XRANGE at most, for a group's deliveries or the producers' additions (entries)."""

READ_CHUNK = 1_000
"""Entries per XRANGE of a count."""


class GroupReading(BaseModel):
    """One consumer group of the task stream.

    Attributes:
        group: its name (as ``keys.as_text`` gives it); consumers: its consumers (XINFO GROUPS).
        pending, lag, backlog: by the replay's rule (``redisclient.backlog``), counted up to the
            threshold (``capped``: the true backlog is larger).
        drain_rate: entries it acknowledged per second over the sample (entries delivered to it
            minus the growth of its PEL), None when not sampled or when nothing reached it.
        caught_up: at some poll of the sample it had nothing undelivered: ``drain_rate`` is what
            reached it, a lower bound of what its consumers can take.
        drain_note: why the rate is unknown or only a lower bound, or None.
    """

    group: str
    consumers: int
    pending: int
    lag: int
    backlog: int
    capped: bool
    drain_rate: float | None = None
    caught_up: bool = False
    drain_note: str | None = None


def bounding_groups(inp: ResumptionInput, groups: Sequence[GroupReading]) -> list[GroupReading]:
    """The groups whose backlog bounds the replay, its own first, as the replay's rule picks them.

    The input's ``consumer_groups`` when it names them; else the consumer group and every group that has
    a consumer (a group no consumer reads is named, not waited for: docs/memory.md).
    """
    if inp.consumer_groups is not None:
        chosen = [g for g in groups if g.group in inp.consumer_groups]
    else:
        chosen = [g for g in groups if g.group == inp.consumer_group or g.consumers > 0]
    return sorted(chosen, key=lambda g: g.group != inp.consumer_group)


async def read_groups(redis: RedisClient, stream: str, threshold: int, max_bytes: int) -> list[GroupReading]:
    """Every consumer group of ``stream``, each measured alone by the replay's rule (``backlog.measure_group``).

    Raises:
        redis.exceptions.ResponseError: e.g. WRONGTYPE when ``stream`` is no stream, NOPERM.
    """
    groups: list[GroupReading] = []
    for g in await redis.xinfo_groups(stream):
        reading = await measure_group(redis, stream, g["name"], threshold, max_bytes=max_bytes)
        groups.append(
            GroupReading(
                group=as_text(g["name"]),
                consumers=int(g["consumers"]),
                pending=reading.pending,
                lag=reading.lag,
                backlog=reading.backlog,
                capped=reading.capped,
            )
        )
    return groups


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass
class _Poll:
    """One look at the stream: Redis's clock (seconds), XINFO GROUPS by name, the newest entry's ID."""

    at: float
    groups: dict[str, dict[str, Any]]
    newest: str | None

    def caught_up(self, group: str) -> bool:
        """True when ``group`` has nothing undelivered: no entry after its last-delivered-id."""
        last = as_text(self.groups[group]["last-delivered-id"])
        return self.newest is None or _id(self.newest) <= _id(last)


async def _poll(redis: RedisClient, stream: str) -> _Poll:
    seconds, micros = await redis.time()
    groups = {as_text(g["name"]): g for g in await redis.xinfo_groups(stream)}
    top: list[Any] = await redis.xrevrange(stream, count=1) or []
    return _Poll(seconds + micros / 1e6, groups, as_text(top[0][0]) if top else None)


async def _count_between(redis: RedisClient, stream: str, first: str | None, last: str) -> tuple[int, bool]:
    """Entries of ``stream`` after ``first`` (None: from the start) up to ``last``, as (entries, exact).

    At most ``COUNT_LIMIT`` are counted.
    """
    counted, start = 0, "-" if first is None else "(" + first
    while counted < COUNT_LIMIT:
        chunk: list[Any] = await redis.xrange(stream, min=start, max=last, count=READ_CHUNK) or []
        counted += len(chunk)
        if len(chunk) < READ_CHUNK:
            return counted, True
        start = "(" + as_text(chunk[-1][0])
    return counted, False


async def _delivered(
    redis: RedisClient, stream: str, before: dict[str, Any], after: dict[str, Any]
) -> tuple[int, bool]:
    """Entries delivered to a group between two XINFO GROUPS readings; returns (entries, exact).

    The change of its ``entries-read`` when Redis knows both, else counted by XRANGE between the two
    last-delivered-ids.
    """
    first, last = as_text(before["last-delivered-id"]), as_text(after["last-delivered-id"])
    if first == last:
        return 0, True
    read0, read1 = before.get("entries-read"), after.get("entries-read")
    if isinstance(read0, int) and isinstance(read1, int) and read1 >= read0:
        return read1 - read0, True
    return await _count_between(redis, stream, first, last)


async def sample_drain(redis: RedisClient, stream: str, groups: list[GroupReading], seconds: float) -> float | None:
    """Fill in each group's drain rate over ``seconds`` of polls; returns what producers added per second.

    What producers added: the entries added to the stream over the sample (those still in it at its
    end), None when more than ``COUNT_LIMIT`` came.
    """
    first = await _poll(redis, stream)
    polls = [first]
    deadline = first.at + seconds
    while polls[-1].at < deadline:
        await asyncio.sleep(min(POLL_SECONDS, max(0.0, deadline - polls[-1].at)))
        polls.append(await _poll(redis, stream))
    last = polls[-1]
    elapsed = max(last.at - first.at, 1e-6)
    for g in groups:
        if g.group not in first.groups or g.group not in last.groups:
            g.drain_note = "the group appeared or went away during the sample"
            continue
        delivered, exact = await _delivered(redis, stream, first.groups[g.group], last.groups[g.group])
        acked = delivered + int(first.groups[g.group]["pending"]) - int(last.groups[g.group]["pending"])
        g.caught_up = any(p.caught_up(g.group) for p in polls if g.group in p.groups)
        if g.caught_up and acked <= 0 and delivered == 0:
            g.drain_note = "nothing reached it during the sample: how fast its consumers go is unknown"
            continue
        g.drain_rate = max(0, acked) / elapsed
        if not exact:
            g.drain_note = f"more than {COUNT_LIMIT:,} entries delivered: the rate is a lower bound"
        elif g.caught_up:
            g.drain_note = "it caught up during the sample: the rate is what reached it, its consumers may take more"
    if last.newest is None or last.newest == first.newest:
        return 0.0
    added, exact = await _count_between(redis, stream, first.newest, last.newest)
    return added / elapsed if exact else None


@dataclass(frozen=True)
class Estimate:
    """The plan's estimate (``estimate``).

    Attributes:
        rate: the tasks per second the replay would move (None when unknown); seconds: the time it
            would take, None when unknown; at_least: ``held / cap`` under a rate cap, else None;
        basis: which figures were measured and how they were used, in words.
    """

    rate: float | None
    seconds: float | None
    at_least: float | None
    basis: str


def estimate(
    inp: ResumptionInput,
    held: int,
    headroom: int,
    groups: list[GroupReading],
    added: float | None,
    cap: float | None,
    sampled: float,
) -> Estimate:
    """The time ``held`` tasks would take with ``headroom`` at the start, from the sample (``sample_drain``).

    The replay is bounded by the slowest of the groups that bound it (``inp.consumer_groups``, or
    every group): of those, the lowest rate measured while its consumers had a backlog all along is
    what they take; producers' additions (``added``) come first, so the replay gets what is left.
    Unknown when a bounding group's rate is unknown, or only a lower bound under that figure, or
    none had a backlog all along. Under ``fixed`` no faster than ``threshold / throttle_seconds``,
    and no faster than the rate ``cap`` (the ETA's rule, ``workflows/eta.py``).
    """
    at_least = eta_seconds(held, headroom, cap, cap) if cap is not None else None
    capped = f"; at least held / the rate cap ({cap:g}/s)" if cap is not None else ""

    def unknown(why: str) -> Estimate:
        return Estimate(None, None, at_least, f"no estimate: {why}{capped}")

    bounding = bounding_groups(inp, groups)
    if sampled <= 0 or not bounding:
        return unknown("the groups' drain was not sampled")
    stuck = next((g for g in bounding if g.drain_rate == 0), None)
    if stuck is not None:
        return unknown(f"{show_name(stuck.group)} drained nothing over the {sampled:g}s sample")
    busy = [g for g in bounding if g.drain_rate is not None and not g.caught_up and not g.drain_note]
    if not busy:
        g = bounding[0]
        return unknown(
            f"{show_name(g.group)}: {g.drain_note or 'no backlog during the sample'}; a sample shows what the "
            "consumers can take only while they have entries to read (the run's ETA tells once it feeds them)"
        )
    slowest = min(busy, key=lambda g: g.drain_rate or 0.0)
    took = slowest.drain_rate or 0.0
    below = next((g for g in bounding if g not in busy and (g.drain_rate is None or g.drain_rate < took)), None)
    if below is not None:
        return unknown(f"{show_name(below.group)} may be slower: {below.drain_note or 'its rate is unknown'}")
    if added is None:
        return unknown("what producers added during the sample is unknown")
    rate = took - added
    basis = (
        f"{show_name(slowest.group)} took {took:,.1f}/s with a backlog all along over a {sampled:g}s sample "
        f"(what its consumers can take), producers added {added:,.1f}/s"
    )
    if rate <= 0:
        return unknown(f"{basis}: nothing left for the replay")
    basis += f": {rate:,.1f}/s left for the replay"
    if inp.throttle_policy is ThrottlePolicy.FIXED and inp.max_backlog_threshold / inp.throttle_seconds < rate:
        # fixed waits let about a threshold through per wait once the consumers outpace that
        rate = inp.max_backlog_threshold / inp.throttle_seconds
        basis += f", bounded by fixed waits: threshold / throttle_seconds = {rate:,.1f}/s"
    if cap is not None and cap < rate:
        basis += f", and by the rate cap ({cap:g}/s)"
    return Estimate(min(rate, cap or rate), eta_seconds(held, headroom, rate, cap), at_least, basis)
