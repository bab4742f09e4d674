"""Headless Chromium for the console's browser tests: where it is, and a page's DevTools
socket for the duration of a block (the browser ended and its pipe drained afterwards)."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

CHROMIUM = Path("/usr/bin/chromium")


def installed_chromium() -> Path:
    """Debian's headless Chromium, or a skip (a failure under APIARY_REQUIRE_CHROMIUM=1, which
    .ci/run sets once it has installed the package)."""
    if not CHROMIUM.exists():
        reason = f"headless Chromium is not installed at {CHROMIUM}"
        if os.environ.get("APIARY_REQUIRE_CHROMIUM") == "1":
            pytest.fail(f"{reason} (APIARY_REQUIRE_CHROMIUM=1)")
        pytest.skip(reason)
    return CHROMIUM


@asynccontextmanager
async def open_page(
    chromium: Path, profile: Path
) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    """The DevTools socket of a blank page in a fresh headless Chromium using `profile`."""
    browser = await asyncio.create_subprocess_exec(
        str(chromium), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--no-default-browser-check", f"--user-data-dir={profile}",
        "--remote-debugging-port=0", "about:blank",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert browser.stderr is not None
    drain: asyncio.Task[bytes] | None = None
    try:
        async with asyncio.timeout(30):
            while not (found := re.search(rb"ws://([^/\s]+)/", await browser.stderr.readline())):
                assert browser.returncode is None, "chromium exited"
        drain = asyncio.create_task(browser.stderr.read())  # never let the pipe fill up
        async with aiohttp.ClientSession() as cdp:
            async with cdp.get(f"http://{found.group(1).decode()}/json/list") as resp:
                targets = await resp.json()
            target = next(t for t in targets if t["type"] == "page")
            async with cdp.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as socket:
                yield socket
    finally:
        if browser.returncode is None:
            browser.terminate()
        await browser.wait()
        if drain is not None:
            await drain
