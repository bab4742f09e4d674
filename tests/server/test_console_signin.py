"""Signing in to the operator console: the real page in headless Chromium against a
coordinator in secure mode (refused reads open the sign-in panel with the coordinator's
answer, a search of the finished work read again included; an operator's API key, kept in
sessionStorage only, is sent on every request including the live event stream; sign-out
forgets it), the same page in dev mode (no panel), and the page's server-sent-events parser
under Node."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from apiary.core.access.principal import PrincipalKind
from apiary.engine.assembly import Runtime
from apiary.engine.hitl import HitlSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.server.auth.keys import KeyRing, credentials_path
from apiary.server.auth.settings import AuthSettings
from apiary.server.config.address import Address
from apiary.server.config.server import ServerConfig
from apiary.server.coordinator import Coordinator, open_coordinator
from apiary.server.inprocess import open_test_coordinator
from tests.server.chromium import installed_chromium, open_console

ROOT = Path(__file__).resolve().parents[2]
CONSOLE_DIR = ROOT / "src" / "apiary" / "server" / "http" / "console"
NODE = shutil.which("node")
WAIT_S = 10.0
REGISTER = "sw4rm.registry.RegistryService/RegisterAgent"


# ---------------------------------------------------------------- the browser


@pytest.fixture
def chromium() -> Path:
    return installed_chromium()


# ---------------------------------------------------------------- coordinators and keys


@pytest.fixture
async def secure(tmp_path: Path) -> AsyncIterator[Coordinator]:
    config = ServerConfig(
        data_dir=tmp_path / "data",
        grpc=Address("127.0.0.1", 0),
        http=Address("127.0.0.1", 0),
        auth=AuthSettings(secure=True),
    )
    async with open_coordinator(config) as running:
        yield running


def _key(coordinator: Coordinator, name: str, *roles: str) -> str:
    keys = KeyRing(credentials_path(coordinator.config.data_dir))
    _, plain = keys.create(PrincipalKind.OPERATOR, name, roles=roles, now=time.time())
    return plain


async def _gateway(
    coordinator: Coordinator, path: str, body: object, credential: str | None
) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {credential}"} if credential else {}
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"http://{coordinator.http_address}/v1/{path}", json=body, headers=headers
        ) as resp,
    ):
        return resp.status, await resp.json()


async def _register(coordinator: Coordinator, agent_id: str, credential: str | None) -> None:
    agent = {
        "agent_id": agent_id,
        "name": agent_id,
        "capabilities": ["scouting"],
        "reasoning_connectors": ["builtin://rules"],
    }
    status, answer = await _gateway(coordinator, REGISTER, {"agent": agent}, credential)
    assert (status, answer.get("accepted")) == (200, True), answer


async def _refusal(coordinator: Coordinator, path: str, credential: str | None) -> str:
    """The message the coordinator answers a read of `path` with (what the panel must show)."""
    status, answer = await _gateway(coordinator, path, {}, credential)
    assert status in (401, 403), answer
    return f"{answer['error']['code']}: {answer['error']['message']}"


# ---------------------------------------------------------------- secure mode


async def test_a_secure_console_asks_for_a_key_then_reads_live_with_it_until_sign_out(
    secure: Coordinator, tmp_path: Path, chromium: Path
) -> None:
    admin = _key(secure, "admin", "agents")
    ops = _key(secure, "ops", "events", "dlq")
    await _register(secure, "scout-1", admin)
    unsigned = await _refusal(secure, "apiary.v1.DiscoveryService/ListAgents", None)
    assert "secure mode" in unsigned

    async with open_console(chromium, tmp_path / "profile", secure.http_address) as page:
        # Unsigned: every read is refused; the panel says what the coordinator answered.
        shown = await page.refusals(unsigned, "agents", "live events", "dead letter queue")
        assert shown.count(unsigned) == 1, "one line per answer, naming what it refused"
        assert not await page.hidden("signin")
        assert await page.shows("live-status", "refused")
        assert await page.text("agents-body") == ""
        assert not await page.hidden("signin-open") and await page.hidden("signout")

        await page.sign_in(ops)
        await page.until("() => document.getElementById('signin').hidden", "the panel closes")
        assert "scout-1" in await page.shows("agents-body", "scout-1")
        assert await page.shows("live-status", "live")
        assert "apk_" in await page.text("session")
        # Live: a new agent and a new event arrive through the stream.
        await _register(secure, "scout-2", admin)
        assert "scout-2" in await page.shows("agents-body", "scout-2")
        await secure.events.record("console.signin", "tester", agent_id="probe")
        await page.shows("feed-body", "console.signin")
        assert await page.text("signin-refusals") == ""

        # Kept in this tab only, never in the page, lasting storage or a URL.
        assert await page.value("sessionStorage.getItem('apiary.console.credential')") == ops
        assert await page.value("localStorage.length") == 0
        assert await page.value("document.getElementById('signin-credential').value") == ""
        sent = page.requests()
        secret = ops.split("_", 2)[2]
        assert not [r.url for r in sent if secret in r.url]
        signed = [r for r in sent if r.headers.get("Authorization") == f"Bearer {ops}"]
        paths = {r.url.split(str(secure.http_address), 1)[1].split("?")[0] for r in signed}
        assert {"/v1/events/stream", "/console/api/workflows"} <= paths
        assert "/v1/apiary.v1.DiscoveryService/ListAgents" in paths
        # The stream was authorized as the operator (secure mode records allowed decisions).
        decided = [
            e for e in await secure.events.read(limit=10_000)
            if e.event_type == "access.decided" and e.details["action"] == "GET /v1/events/stream"
        ]  # fmt: skip
        allowed = {(e.actor, e.details["allowed"]) for e in decided}
        assert ("operator:ops@default", True) in allowed

        # Sign-out forgets the key and what it showed; the panel is back.
        await page.value("document.getElementById('signout').click()")
        await page.refusals(unsigned, "agents", "live events")
        assert not await page.hidden("signin")
        assert await page.value("sessionStorage.length") == 0
        await page.until(
            "() => document.getElementById('agents-body').textContent === ''", "agents blanked"
        )
        assert await page.text("feed-body") == ""
        assert await page.text("session") == ""
        for path in ("/v1/events/stream", "/ListAgents", "/ReadEvents"):
            last = [r for r in page.requests() if path in r.url][-1]
            assert "Authorization" not in last.headers, path


async def test_a_wrong_key_shows_the_refusal_and_a_missing_role_only_its_panel(
    secure: Coordinator, tmp_path: Path, chromium: Path
) -> None:
    admin = _key(secure, "admin", "agents")
    viewer = _key(secure, "viewer", "events")  # no `dlq`
    await _register(secure, "scout-1", admin)
    key_id = viewer.split("_")[1]
    wrong = f"apk_{key_id}_{'A' * 43}"  # a real key id with a wrong secret
    unknown = await _refusal(secure, "apiary.v1.DiscoveryService/ListAgents", wrong)
    assert key_id in unknown and "A" * 43 not in unknown
    lacking = await _refusal(secure, "apiary.v1.DlqService/List", viewer)
    assert "operator:viewer@default" in lacking and "'dlq'" in lacking

    async with open_console(chromium, tmp_path / "profile", secure.http_address) as page:
        await page.refusals("secure mode", "agents", "live events")
        await page.sign_in(wrong)
        shown = await page.refusals(unknown, "agents", "live events")
        assert "secure mode" not in shown  # the earlier answer was for no credential
        assert "refused this tab's credential" in await page.text("signin-lead")
        assert await page.text("agents-body") == ""
        assert not await page.hidden("signout")  # a wrong key can be dropped too

        await page.sign_in(viewer)
        # Everything but the dead letter queue reads; the panel names what is missing.
        assert "scout-1" in await page.shows("agents-body", "scout-1")
        shown = await page.refusals(lacking, "dead letter queue")
        assert unknown not in shown and "agents" not in shown
        await page.shows("live-status", "live")
        assert "'dlq'" in await page.value(
            "document.querySelector('#dlq .panel-error').textContent"
        )

        # Closed, the panel opens again when something else is refused: here the key is
        # revoked, and the next read (an agent event on the live stream asks for one) says so.
        await page.value("document.getElementById('signin-close').click()")
        assert await page.hidden("signin")
        keys = KeyRing(credentials_path(secure.config.data_dir))
        keys.revoke(key_id, now=time.time())
        await secure.events.record("agent.probe", "tester", agent_id="scout-1")
        await page.refusals(f"API key {key_id} was revoked")
        assert not await page.hidden("signin")

        # A typed value a header cannot carry is refused in the page, and not kept.
        await page.value("document.getElementById('signout').click()")
        await page.until("() => !document.getElementById('signin').hidden", "the panel opens")
        await page.sign_in("ключ")
        assert "printable" in await page.shows("signin-problem", "printable")
        assert await page.value("sessionStorage.length") == 0


async def test_searching_the_finished_work_again_with_a_revoked_key_asks_to_sign_in(
    secure: Coordinator, tmp_path: Path, chromium: Path
) -> None:
    ops = _key(secure, "ops", "events", "dlq")
    key_id = ops.split("_")[1]
    async with open_console(chromium, tmp_path / "profile", secure.http_address) as page:
        await page.refusals("secure mode", "agents")
        await page.sign_in(ops)
        await page.until("() => document.getElementById('signin').hidden", "the panel closes")
        await page.value("location.hash = '#/finished?q=nothing'")
        await page.shows("finished-body", 'nothing finished matches "nothing"')

        KeyRing(credentials_path(secure.config.data_dir)).revoke(key_id, now=time.time())
        # The same search again (the address does not change): read as its panel is read,
        # so the refusal opens the sign-in panel and shows in the panel.
        await page.value("document.querySelector('#finished-form button[type=submit]').click()")
        await page.refusals(f"API key {key_id} was revoked", "finished work")
        assert not await page.hidden("signin")
        assert "was revoked" in await page.shows("finished", "was revoked")


# ---------------------------------------------------------------- dev mode

TOKEN = "console-signin-token"
# Notes whether the sign-in panel is ever shown, from before the page's own scripts run.
WATCH_SIGNIN = """
window.signinShown = false;
document.addEventListener("DOMContentLoaded", () => {
  const panel = document.getElementById("signin");
  const note = () => { if (!panel.hidden) window.signinShown = true; };
  note();
  new MutationObserver(note).observe(panel, {attributes: true});
});
"""


async def test_in_dev_mode_the_console_reads_without_a_panel_and_signs_in_on_request(
    tmp_path: Path, chromium: Path
) -> None:
    settings = HitlSettings(operators=(OperatorEntry("olivia", token_digest(TOKEN), ("admin",)),))
    async with open_test_coordinator(tmp_path / "data", runtime=Runtime(hitl=settings)) as dev:
        await _register(dev, "scout-1", None)
        profile = tmp_path / "profile"
        async with open_console(chromium, profile, dev.http_address, watch=WATCH_SIGNIN) as page:
            assert "scout-1" in await page.shows("agents-body", "scout-1")
            await page.shows("live-status", "live")
            await _register(dev, "scout-2", None)
            assert "scout-2" in await page.shows("agents-body", "scout-2")
            await dev.events.record("console.signin", "tester")
            await page.shows("feed-body", "console.signin")
            assert await page.value("window.signinShown") is False
            assert await page.text("signin-refusals") == ""
            assert not await page.hidden("hitl-locked")  # the inbox is an operator's
            assert not [r for r in page.requests() if "Authorization" in r.headers]

            # An operator signs in on purpose (the HITL operator token) and sees the inbox.
            status, escalated = await _gateway(
                dev, "apiary.v1.HitlOperatorService/Escalate",
                {"reason_type": "TOOL_PRIVILEGE_ESCALATION", "requested_by": "scheduler"}, None,
            )  # fmt: skip
            assert status == 200
            await page.value("document.getElementById('signin-open').click()")
            await page.until("() => !document.getElementById('signin').hidden", "the panel")
            await page.sign_in(TOKEN)
            await page.shows("hitl-body", escalated["invocation_id"][:8])
            assert "operator token" in await page.text("session")
            assert await page.hidden("signin")


# ---------------------------------------------------------------- reconnecting


async def test_the_stream_resumes_after_a_restart_from_the_last_id_with_the_key(
    tmp_path: Path, chromium: Path
) -> None:
    def config(http_port: int) -> ServerConfig:
        return ServerConfig(
            data_dir=tmp_path / "data",
            grpc=Address("127.0.0.1", 0),
            http=Address("127.0.0.1", http_port),
            auth=AuthSettings(secure=True),
        )

    async with AsyncExitStack() as first:
        coordinator = await first.enter_async_context(open_coordinator(config(0)))
        port = coordinator.http_address.port
        ops = _key(coordinator, "ops", "events", "dlq")
        async with AsyncExitStack() as browser:
            page = await browser.enter_async_context(
                open_console(chromium, tmp_path / "profile", coordinator.http_address)
            )
            await page.refusals("secure mode", "live events")
            await page.sign_in(ops)
            await page.shows("live-status", "live")
            await coordinator.events.record("console.before", "tester")
            await page.shows("feed-body", "console.before")
            seen = await page.value(
                "Number([...document.querySelectorAll('#feed-body li')]"
                ".find((li) => li.textContent.includes('console.before')).dataset.seq)"
            )
            before = len(page.requests())

            # The coordinator stops (its streams end) and starts again on the same port; what
            # it records meanwhile comes through the stream the page opens again.
            await first.aclose()
            await page.shows("live-status", "reconnecting")
            async with open_coordinator(config(port)) as again:
                for n in range(3):
                    await again.events.record("console.missed", "tester", n=n)
                await page.until(
                    "() => [...document.querySelectorAll('#feed-body li')]"
                    ".filter((li) => li.textContent.includes('console.missed')).length === 3",
                    "the three events recorded while the page was away",
                )
                await page.shows("live-status", "live")
                sequences = await page.value(
                    "[...document.querySelectorAll('#feed-body li')]"
                    ".map((li) => Number(li.dataset.seq))"
                )
            top = sequences[0]
            assert sequences == list(range(top, top - len(sequences), -1)), "no repeat, no gap"
            resumed = [r for r in page.requests()[before:] if "/v1/events/stream" in r.url]
            assert resumed, "the stream was opened again"
            assert {r.headers.get("Authorization") for r in resumed} == {f"Bearer {ops}"}
            # From the last id it saw, not from the first request's ?after=.
            assert int(resumed[-1].headers["Last-Event-ID"]) >= seen


# ---------------------------------------------------------------- the parser


@pytest.mark.skipif(NODE is None, reason="Node.js is not installed: the parser goes unchecked")
def test_the_event_stream_parser_reads_frames_split_anywhere(tmp_path: Path) -> None:
    assert NODE is not None
    copy = tmp_path / "console"
    shutil.copytree(CONSOLE_DIR, copy)
    (copy / "package.json").write_text('{"type": "module"}')
    stream = (
        "retry: 2500\n: stream after 0\n\n"
        'id: 7\ndata: {"sequence":7}\n\n'
        ": keep-alive\n\n"
        "id: 8\r\ndata: first\r\ndata: second\r\n\r\n"
        "id: 9\rdata\rdata:  spaced\rbogus: x\r\r"
        "id: 10\n\n"  # an id alone: no message, but the last id moves
        "event: other\ndata: typed\nid: 1\x002\n\n"
        "data: unfinished"
    )
    program = (
        f"import {{SseParser}} from {json.dumps((copy / 'sse.js').as_uri())};\n"
        f"const text = {json.dumps(stream)};\n"
        "const run = (cuts) => { const p = new SseParser('3'); const out = []; let at = 0;\n"
        "  for (const cut of [...cuts, text.length]) { out.push(...p.push(text.slice(at, cut)));"
        " at = cut; }\n"
        "  return {out, id: p.lastEventId, retry: p.retry}; };\n"
        "const whole = run([]);\n"
        "const differ = [];\n"
        "for (let i = 0; i <= text.length; i++) for (let j = i; j <= text.length; j++) {\n"
        "  if (JSON.stringify(run([i, j])) !== JSON.stringify(whole)) differ.push([i, j]); }\n"
        "console.log(JSON.stringify({whole, differ: differ.slice(0, 5)}));\n"
    )
    ran = subprocess.run(
        [NODE, "--input-type=module", "-e", program], capture_output=True, text=True, check=True
    )
    result = json.loads(ran.stdout)
    assert result["differ"] == [], "the same messages whichever way the text is split"
    whole = result["whole"]
    assert whole["out"] == [
        {"type": "message", "id": "7", "data": '{"sequence":7}'},
        {"type": "message", "id": "8", "data": "first\nsecond"},
        {"type": "message", "id": "9", "data": "\n spaced"},
        {"type": "other", "id": "10", "data": "typed"},  # an id with NUL is ignored
    ]
    assert whole["id"] == "10" and whole["retry"] == 2500
