"""``xmc resume --wait``'s watcher ends on Ctrl-C whatever its progress query was doing (``cli.watch.Watcher._ask``)."""

from __future__ import annotations

import asyncio
from typing import Any

import click
import pytest
from temporalio.service import RPCError, RPCStatusCode

from xmc_resumption.cli.watch import Watcher
from xmc_resumption.settings import Settings
from xmc_resumption.workflows.models import ResumptionInput


class _Handle:
    """A workflow handle whose progress query answers (None: no worker) once ``answer`` is set; cancelled before,
    it fails with the RPC layer's own error."""

    def __init__(self) -> None:
        self.answer = asyncio.Event()

    async def query(self, *_: Any) -> Any:
        try:
            await self.answer.wait()
        except asyncio.CancelledError:
            raise RPCError("cancelled", RPCStatusCode.CANCELLED, b"") from None
        return None


def _watcher() -> Watcher:
    return Watcher(
        click.Context(click.Command("resume")),
        None,  # type: ignore[arg-type]
        Settings(redis_url="redis://127.0.0.1:1/0"),
        ResumptionInput(experiment_id="E1"),
        "q",
        quiet=True,
    )


@pytest.mark.parametrize("answered", [False, True], ids=["cancelled-rpc", "answer-with-the-cancel"])
async def test_ctrl_c_during_a_query_ends_the_watch(answered: bool) -> None:
    """Cancelled during the query, ``_ask`` raises CancelledError: also when the query's RPC turns the cancel into
    an error, and when the answer arrives in the same loop turn as the cancel (Python 3.11's ``wait_for`` then
    returns the answer and drops the cancel: the ``xmc resume --wait`` that ignored Ctrl-C on a loaded machine)."""
    handle = _Handle()
    asking = asyncio.create_task(_watcher()._ask(handle))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    if answered:
        handle.answer.set()  # the query's task runs first, then the cancel reaches wait_for
    asking.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(asking, 10)
