"""Headless Chromium for the console's browser tests: where it is, a page's DevTools socket
for the duration of a block (the browser ended and its pipe drained afterwards), and `Page`,
the DevTools calls the tests make (evaluate, wait for the DOM to say something, type, list
the requests sent), with `open_console` to load a coordinator's console in it."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

CHROMIUM = Path("/usr/bin/chromium")
WAIT_S = 10.0


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


# Resolves with the predicate's value once it is truthy, checked on every DOM change (a
# MutationObserver, not polling); rejects after a bound.
UNTIL = """
new Promise((resolve, reject) => {
  const probe = %s;
  const seen = new MutationObserver(() => settle());
  const timer = setTimeout(() => {
    seen.disconnect();
    reject(new Error("never seen: " + %s));
  }, %d);
  function settle() {
    let value;
    try { value = probe(); } catch (err) { value = null; }
    if (!value) return false;
    seen.disconnect();
    clearTimeout(timer);
    resolve(value);
    return true;
  }
  if (!settle()) {
    seen.observe(document.documentElement,
      {subtree: true, childList: true, characterData: true, attributes: true});
  }
})
"""


@dataclass
class Sent:
    """One request the page sent, as Chromium's network domain reported it."""

    url: str
    headers: dict[str, str]


class Page:
    """The Chrome DevTools protocol calls these tests need, over one page's websocket."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self._socket = socket
        self._next = 0
        self.seen: list[dict[str, Any]] = []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._next += 1
        await self._socket.send_json({"id": self._next, "method": method, "params": params})
        while True:
            message = await self._socket.receive_json()
            if message.get("id") == self._next:
                assert "error" not in message, message
                return dict(message.get("result", {}))
            self.seen.append(message)

    async def until_event(self, method: str) -> None:
        while not any(m.get("method") == method for m in self.seen):
            self.seen.append(await self._socket.receive_json())

    async def value(self, expression: str) -> Any:
        """The value of a JavaScript expression (awaited when it is a promise)."""
        answer = await self.call(
            "Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True
        )
        assert "exceptionDetails" not in answer, answer["exceptionDetails"]
        return answer["result"].get("value")

    async def until(self, predicate: str, what: str) -> Any:
        """The truthy value of `predicate` (a JavaScript arrow function) once it has one."""
        return await self.value(UNTIL % (predicate, json.dumps(what), int(WAIT_S * 1000)))

    async def text(self, element_id: str) -> str:
        return str(
            await self.value(f"document.getElementById({json.dumps(element_id)}).textContent")
        )

    async def hidden(self, element_id: str) -> bool:
        return bool(await self.value(f"document.getElementById({json.dumps(element_id)}).hidden"))

    async def shows(self, element_id: str, text: str) -> str:
        """The text of `element_id` once it contains `text`."""
        return str(
            await self.until(
                f"() => {{ const n = document.getElementById({json.dumps(element_id)});"
                f" return n && n.textContent.includes({json.dumps(text)}) && n.textContent; }}",
                f"{text!r} in #{element_id}",
            )
        )

    async def refusals(self, *parts: str) -> str:
        """The sign-in panel's list of refusals once it mentions every one of `parts`."""
        wanted = json.dumps(parts)
        return str(
            await self.until(
                "() => { const t = document.getElementById('signin-refusals').textContent;"
                f" return {wanted}.every((part) => t.includes(part)) && t; }}",
                f"refusals naming {parts}",
            )
        )

    async def sign_in(self, credential: str) -> None:
        """Type `credential` into the sign-in panel and press its button, as an operator would."""
        await self.value("document.getElementById('signin-credential').focus()")
        await self.call("Input.insertText", text=credential)
        await self.value("document.querySelector('#signin-form button[type=submit]').click()")

    def requests(self) -> list[Sent]:
        """Every request the page sent so far (Network.enable must have been called)."""
        return [
            Sent(m["params"]["request"]["url"], dict(m["params"]["request"]["headers"]))
            for m in self.seen
            if m.get("method") == "Network.requestWillBeSent"
        ]


@asynccontextmanager
async def open_console(
    chromium: Path, profile: Path, http_address: object, *, watch: str = "", path: str = ""
) -> AsyncIterator[Page]:
    """The console served at `http_address` loaded in a fresh headless Chromium, network
    recorded; `watch` is a script run in the page before its own; `path` what follows
    /console in the address (a page's #/...)."""
    async with open_page(chromium, profile) as socket:
        page = Page(socket)
        await page.call("Page.enable")
        await page.call("Network.enable")
        if watch:
            await page.call("Page.addScriptToEvaluateOnNewDocument", source=watch)
        await page.call("Page.navigate", url=f"http://{http_address}/console{path}")
        async with asyncio.timeout(WAIT_S * 2):
            await page.until_event("Page.loadEventFired")
        async with asyncio.timeout(WAIT_S * 6):
            yield page
