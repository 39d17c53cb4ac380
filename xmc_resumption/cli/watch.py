"""``xmc resume --wait``: follow a running resumption, show its progress and warn when nothing drains it."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import click
from redis.exceptions import RedisError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.progress import Progress as ProgressBar
from temporalio.client import (
    Client,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
)
from temporalio.service import RPCError

from xmc_resumption.cli.common import QUERY_TIMEOUT_SECONDS, eta_text, or_missing
from xmc_resumption.errors import RunFailedError, workflow_failure_message
from xmc_resumption.redisclient.connection import RedisClient
from xmc_resumption.redisclient.keys import as_text
from xmc_resumption.redisclient.text import one_line, show_name
from xmc_resumption.settings import Settings
from xmc_resumption.workflows.models import Phase, Progress, ResumptionInput, ResumptionResult
from xmc_resumption.workflows.resumption import ResumptionWorkflow

POLL_SECONDS = 1.0
"""``--wait``: how often the progress query is asked (seconds)."""

NO_WORKER_WARNING_SECONDS = 10.0
"""``--wait``: warn when no worker has answered the progress query for this long (seconds)."""

PLAIN_LINE_SECONDS = 5.0
"""``--wait`` when stderr is no terminal: at most one progress line this often (seconds), and one
whenever the phase changes."""

MIN_DRAIN_WARNING_SECONDS = 15.0
"""``--wait``: the least time (seconds) the backlog must sit unchanged at the threshold, nothing
replayed, before the "no consumer is draining" warning; the wait is also at least 2.5 of the
run's longest throttle wait, so a healthy fixed-wait replay never triggers it."""


class Watcher:
    """Follows a running resumption until it ends, showing its progress; it never waits silently.

    Asks ``progress`` every ``POLL_SECONDS``, shows it on stderr (a rich progress bar on a terminal,
    plain lines otherwise; nothing when ``quiet``) and warns once, on stderr, when no consumer drains
    the stream (the workflow says ``stalled``; the group has no consumer while the replay is throttled;
    or the backlog sat at the threshold, nothing replayed, for ``drain_warning_seconds``) and once when
    no worker answers the query for ``NO_WORKER_WARNING_SECONDS``.
    """

    def __init__(
        self,
        ctx: click.Context,
        client: Client,
        settings: Settings,
        inp: ResumptionInput,
        task_queue: str,
        *,
        quiet: bool,
    ):
        self._ctx, self._client, self._settings, self._inp, self._quiet = ctx, client, settings, inp, quiet
        self._task_queue = task_queue
        self.drain_warning_seconds = max(MIN_DRAIN_WARNING_SECONDS, 2.5 * inp.longest_wait_seconds)
        self._console = Console(stderr=True)
        self._bar: ProgressBar | None = None
        self._task: TaskID | None = None
        self._warned: set[str] = set()
        self._last_line = 0.0
        self._last_phase: Phase | None = None
        self._still: tuple[int, int | None] | None = None
        self._still_since = time.monotonic()

    async def run(self, workflow_id: str) -> ResumptionResult:
        """Follow ``workflow_id`` (its newest run) to its end; returns its result.

        Raises:
            RunFailedError: the run ended without a result.
        """
        handle = self._client.get_workflow_handle(workflow_id, result_type=ResumptionResult)
        result: asyncio.Future[ResumptionResult] = asyncio.ensure_future(handle.result())
        redis = self._settings.redis()
        if not self._quiet and self._console.is_terminal:
            self._bar = ProgressBar(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[detail]}"),
                TimeElapsedColumn(),
                console=self._console,
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(workflow_id, total=None, detail="starting")
        answered = time.monotonic()
        try:
            while not (await asyncio.wait({result}, timeout=POLL_SECONDS))[0]:
                progress = await self._ask(handle)
                if progress is None:
                    if time.monotonic() - answered > NO_WORKER_WARNING_SECONDS:
                        self._warn_once(
                            "worker",
                            f"no worker has answered {workflow_id}'s progress query for "
                            f"{NO_WORKER_WARNING_SECONDS:g}s: is a worker polling task queue "
                            f"{self._task_queue}?",
                        )
                    continue
                answered = time.monotonic()
                self._show(workflow_id, progress)
                reason = await self._not_draining(redis, progress)
                if reason:
                    self._warn_once("drain", reason + f"; start consumers, or xmc stop {self._inp.experiment_id}")
            try:
                return result.result()
            except WorkflowFailureError as err:
                raise RunFailedError(workflow_failure_message(err, workflow_id)) from err
        finally:
            result.cancel()
            if self._bar is not None:
                self._bar.stop()
            await redis.aclose()

    async def _ask(self, handle: WorkflowHandle[Any, Any]) -> Progress | None:
        """The progress, or None when the run has not answered (no worker, or not ready yet).

        Raises:
            asyncio.CancelledError: the command was cancelled (Ctrl-C) during the query, even when the query
                ended meanwhile (Python 3.11's ``wait_for`` then returns its result) or failed with an RPC error.
        """
        progress: Progress | None
        try:
            progress = await asyncio.wait_for(handle.query(ResumptionWorkflow.progress), QUERY_TIMEOUT_SECONDS)
        except (TimeoutError, RPCError, WorkflowQueryFailedError, WorkflowQueryRejectedError):
            progress = None  # no worker, not ready yet, or the run is ending: the loop sees its end
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError
        return progress

    def _show(self, workflow_id: str, p: Progress) -> None:
        total = p.replayed + p.remaining if p.remaining is not None else None
        backlog = f"backlog {or_missing(p.backlog)}/{p.threshold}"
        eta = f"ETA {eta_text(p.eta_seconds, p.eta_at)}"
        detail = f"{p.phase.value}, {backlog}, {eta}" + (", STALLED" if p.stalled else "")
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=p.replayed, total=total, detail=detail)
            return
        now = time.monotonic()
        if self._quiet or (p.phase is self._last_phase and now - self._last_line < PLAIN_LINE_SECONDS):
            return
        self._last_phase, self._last_line = p.phase, now
        print(
            f"{workflow_id}: {p.phase.value}: {p.replayed}/{or_missing(total)} replayed, "
            f"remaining {or_missing(p.remaining)}, "
            f"{backlog}, {eta}" + (", STALLED" if p.stalled else ""),
            file=sys.stderr,
            flush=True,
        )

    async def _not_draining(self, redis: RedisClient, p: Progress) -> str | None:
        """Why no consumer seems to drain the stream, or None."""
        # the group that holds the replay back: its own, or another found in Redis (any name)
        group, stream = p.limiting_group or self._inp.consumer_group, self._inp.stream
        shown = show_name(group)
        if p.phase is Phase.WAITING_FOR_GROUP:
            return f"waiting: {p.throttle_reason}"
        if p.stalled:
            return f"no consumer is draining {shown}: {p.stall_reason} (stalled for {p.stalled_seconds:.0f}s)"
        still = (p.replayed, p.backlog)
        if still != self._still:
            self._still, self._still_since = still, time.monotonic()
        if p.phase not in (Phase.THROTTLED, Phase.STALLED):
            return None
        try:
            groups = await redis.xinfo_groups(stream)
        except RedisError:
            groups = None  # a missing stream, or Redis away: the workflow reports that itself
        consumers = next((int(g["consumers"]) for g in groups or [] if as_text(g["name"]) == group), None)
        if consumers == 0:
            return (
                f"no consumer in group {shown} of {stream}: the backlog ({or_missing(p.backlog)}) stays at the "
                f"threshold ({p.threshold}) until one reads"
            )
        idle = time.monotonic() - self._still_since
        if idle >= self.drain_warning_seconds:
            return (
                f"no consumer seems to drain {shown}: backlog {or_missing(p.backlog)} >= threshold {p.threshold}, "
                f"nothing replayed for {idle:.0f}s ({or_missing(consumers)} consumers registered)"
            )
        return None

    def _warn_once(self, kind: str, message: str) -> None:
        if kind in self._warned:
            return
        self._warned.add(kind)
        line = f"{self._ctx.command_path}: warning: {one_line(message)}"
        if self._bar is not None:
            self._bar.console.print(line, markup=False, highlight=False)
        else:
            print(line, file=sys.stderr, flush=True)
