"""What an operator sees of a throttled replay in the Temporal web UI, checked in a real browser.

Headless Chromium (Debian's ``chromium``, installed by ``scripts/ensure-chromium`` from ``make test``)
driven by Python ``playwright``, which never downloads a browser of its own here, opens the dev
server's web UI (the demo's server, ``xmc.services.local_temporal``, with its UI on a free port) on
a replay waiting at its threshold, and finds there:

- on "User Metadata", the current details (``workflows.text.details_markdown``): the phase ``throttled``,
  the progress ``replayed: 0, remaining: 50`` and the backlog against the threshold;
- on "Timeline", the throttle timer with its summary ``throttled 10s: backlog 20 >= 20 ...``.

Set ``XMC_UI_SCREENSHOTS=docs`` to write the screenshots docs/operating.md shows (``docs/ui-throttled.png``
and ``docs/ui-throttled-timeline.png``); otherwise they go to the test's temporary directory.
"""

from __future__ import annotations

import asyncio
import os
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page, async_playwright, expect
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from tests.support.helpers import fill_backlog, hold_tasks, resumption_worker, throttled, wait_for
from xmc_resumption.services import free_port, local_temporal
from xmc_resumption.workflows.models import ResumptionInput
from xmc_resumption.workflows.resumption import ResumptionWorkflow
from xmc_resumption.workflows.text import ui_summary

CHROMIUM = "/usr/bin/chromium"
"""Debian's chromium (scripts/ensure-chromium)."""

VIEWPORT = {"width": 1400, "height": 1000}

pytestmark = pytest.mark.slow  # a dev server with its web UI, and chromium


@pytest.fixture(scope="module")
def temporal_with_ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A dev server with its web UI: (frontend address, UI base URL)."""
    ui = free_port()
    log = tmp_path_factory.mktemp("temporal-ui") / "temporal.log"
    with local_temporal(port=None, ui_port=ui, log_file=log) as address:
        yield address, f"http://127.0.0.1:{ui}"


async def _frame_with(page: Page, needle: str, timeout: float) -> str:
    """The text of the first frame of ``page`` (the UI renders markdown in iframes) that contains
    ``needle``; raises TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for frame in page.frames:
            try:
                text = await frame.locator("body").inner_text(timeout=1_000)
            except PlaywrightError:  # a frame that is being replaced
                continue
            if needle in text:
                return text
        await asyncio.sleep(0.2)
    raise TimeoutError(f"no frame shows {needle!r} after {timeout:g}s")


async def test_the_web_ui_shows_phase_progress_the_throttle_timer_and_the_fleet(
    temporal_with_ui, redis, redis_url, task_queue, tmp_path
) -> None:
    address, ui = temporal_with_ui
    shots = Path(os.environ.get("XMC_UI_SCREENSHOTS") or tmp_path)
    client = await Client.connect(address, data_converter=pydantic_data_converter)
    e = f"E{uuid.uuid4().hex[:6]}"
    await hold_tasks(redis, e, 50)
    await fill_backlog(redis, 20)  # at the threshold, and no consumer: the replay waits
    inp = ResumptionInput(experiment_id=e, max_backlog_threshold=20, throttle_seconds=10)
    async with resumption_worker(client, task_queue, redis_url):
        handle = await client.start_workflow(ResumptionWorkflow.run, inp, **inp.start_options(task_queue))
        await wait_for(handle, throttled)
        run_id = (await handle.describe()).run_id
        page_url = f"{ui}/namespaces/default/workflows/{handle.id}/{run_id}"
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = await browser.new_page(viewport=VIEWPORT)  # type: ignore[arg-type]
                # the UI polls the server, so "networkidle" never comes: wait for what must show
                await page.goto(f"{page_url}/user-metadata", wait_until="domcontentloaded")
                details = await _frame_with(page, f"{e}: throttled", timeout=30)
                assert "replayed: 0, remaining: 50" in details, details
                assert "backlog: 20 / threshold 20" in details, details
                await _frame_with(page, ui_summary(inp), timeout=10)  # the start's static summary
                await page.screenshot(path=shots / "ui-throttled.png")

                await page.goto(f"{page_url}/timeline", wait_until="domcontentloaded")
                timer = page.get_by_text("throttled 10s: backlog 20 >= 20 (pending 0 + lag 20)")
                await expect(timer.first).to_be_visible(timeout=30_000)
                await page.screenshot(path=shots / "ui-throttled-timeline.png")

                # the fleet view: the workflow list filtered by the search attribute
                query = urllib.parse.quote('XmcPhase="throttled"')
                await page.goto(f"{ui}/namespaces/default/workflows?query={query}", wait_until="domcontentloaded")
                await expect(page.get_by_text(handle.id).first).to_be_visible(timeout=30_000)
                await page.screenshot(path=shots / "ui-fleet.png")
            finally:
                await browser.close()
        await handle.cancel()
