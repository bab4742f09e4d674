"""The operator console over real sockets: the page and its files, the live event stream,
HITL decisions sent the way the page sends them, workflow reads, and the page itself in
headless Chromium when it is installed."""

from __future__ import annotations

import asyncio
import fnmatch
import json
import re
import shutil
import subprocess
import tomllib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from apiary.engine.assembly import Runtime
from apiary.engine.hitl import HitlSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.engine.scheduler.scheduler import Submission
from apiary.server.coordinator import SHUTDOWN_GRACE_S, Coordinator
from apiary.server.inprocess import open_test_coordinator
from tests.server.chromium import installed_chromium, open_page

ROOT = Path(__file__).resolve().parents[2]
CONSOLE_DIR = ROOT / "src" / "apiary" / "server" / "http" / "console"
STREAM = "/v1/events/stream"
HITL = "/v1/apiary.v1.HitlOperatorService"
TOKEN = "console-operator-token"
SETTINGS = HitlSettings(operators=(OperatorEntry("olivia", token_digest(TOKEN), ("admin",)),))
CONTENT_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
}
WAIT_S = 10.0


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path, runtime=Runtime(hitl=SETTINGS)) as running:
        yield running


@pytest.fixture
async def http(coordinator: Coordinator) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=f"http://{coordinator.http_address}") as session:
        yield session


# ---------------------------------------------------------------- server-sent events


@dataclass
class Frame:
    """One server-sent-events frame: the lines up to a blank line."""

    id: int | None = None
    data: dict[str, Any] | None = None
    comments: list[str] = field(default_factory=list)
    retry: int | None = None


class SseReader:
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._content = response.content

    async def frame(self) -> Frame:
        frame = Frame()
        async with asyncio.timeout(WAIT_S):
            while True:
                raw = await self._content.readline()
                if not raw:
                    raise EOFError("the stream ended")
                line = raw.decode().rstrip("\n")
                if not line:
                    return frame
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "":
                    frame.comments.append(value)
                elif name == "id":
                    frame.id = int(value)
                elif name == "data":
                    assert frame.data is None, "one data line per event"
                    frame.data = json.loads(value)
                elif name == "retry":
                    frame.retry = int(value)

    async def events(self, count: int, event_type: str) -> list[Frame]:
        """Every event frame until `count` of type `event_type` arrived."""
        frames: list[Frame] = []
        while sum(1 for f in frames if f.data and f.data["event_type"] == event_type) < count:
            frame = await self.frame()
            if frame.data is not None:
                frames.append(frame)
        return frames


def _assert_contiguous(frames: list[Frame], first: int) -> None:
    ids = [f.id for f in frames]
    assert ids == list(range(first, first + len(frames))), ids
    assert all(f.data is not None and f.data["sequence"] == f.id for f in frames)


async def _record(coordinator: Coordinator, *numbers: int) -> None:
    for n in numbers:
        await coordinator.events.record("console.test", "tester", agent_id="probe", n=n)


async def test_the_stream_delivers_new_events_in_order_with_their_ids(
    coordinator: Coordinator, http: aiohttp.ClientSession
) -> None:
    start = await coordinator.events.last_sequence()
    await _record(coordinator, 0, 1)  # before the stream opens: replayed from ?after
    async with http.get(STREAM, params={"after": str(start)}) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        reader = SseReader(resp)
        opening = await reader.frame()
        assert opening.retry is not None and opening.data is None
        await _record(coordinator, 2, 3, 4)  # while it waits
        frames = await reader.events(5, "console.test")
    _assert_contiguous(frames, start + 1)
    mine = [f.data for f in frames if f.data and f.data["event_type"] == "console.test"]
    assert [d["details"]["n"] for d in mine] == [0, 1, 2, 3, 4]
    assert {(d["actor"], d["agent_id"]) for d in mine} == {("tester", "probe")}
    assert all(isinstance(d["ts"], float) for d in mine)


async def test_the_stream_resumes_after_last_event_id_without_repeats_or_gaps(
    coordinator: Coordinator, http: aiohttp.ClientSession
) -> None:
    start = await coordinator.events.last_sequence()
    await _record(coordinator, 0, 1, 2)
    async with http.get(STREAM, params={"after": str(start)}) as resp:
        first = await SseReader(resp).events(3, "console.test")
    seen = first[1].id  # the client saw two events before it lost the connection
    assert seen is not None
    await _record(coordinator, 3, 4)
    # Last-Event-ID, as a browser's EventSource sends it on reconnecting, wins over ?after.
    headers = {"Last-Event-ID": str(seen)}
    async with http.get(STREAM, params={"after": "0"}, headers=headers) as resp:
        again = await SseReader(resp).events(3, "console.test")
    _assert_contiguous(again, seen + 1)
    numbers = [f.data["details"]["n"] for f in first[:2] + again if f.data]
    assert [n for n in numbers if isinstance(n, int)] == [0, 1, 2, 3, 4]


async def test_the_stream_refuses_a_malformed_cursor(http: aiohttp.ClientSession) -> None:
    for headers, params in (({"Last-Event-ID": "x7"}, {}), ({}, {"after": "-1"})):
        async with http.get(STREAM, headers=headers, params=params) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["code"] == "validation_error"


async def test_the_stream_sends_keep_alives_while_idle(http: aiohttp.ClientSession) -> None:
    async with http.get(STREAM, params={"keepalive": "0.1"}) as resp:
        reader = SseReader(resp)
        await reader.frame()  # the opening frame
        for _ in range(50):  # events may arrive too; a keep-alive must come in between
            frame = await reader.frame()
            if "keep-alive" in frame.comments:
                assert frame.id is None and frame.data is None
                return
    raise AssertionError("no keep-alive comment")


async def test_streams_end_cleanly_when_the_coordinator_shuts_down(tmp_path: Path) -> None:
    stack = AsyncExitStack()
    coordinator = await stack.enter_async_context(open_test_coordinator(tmp_path))
    loop = asyncio.get_running_loop()
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://{coordinator.http_address}{STREAM}") as resp,
    ):
        await SseReader(resp).frame()  # the stream is being served
        began = loop.time()
        shutdown = asyncio.create_task(stack.aclose())
        async with asyncio.timeout(SHUTDOWN_GRACE_S * 2):
            # A complete chunked body: a stream cut off at the grace period's end would
            # raise ClientPayloadError here instead.
            await resp.content.read()
            await shutdown
        # Well before the grace period, after which the server cancels what still runs.
        assert loop.time() - began < SHUTDOWN_GRACE_S / 2


# ---------------------------------------------------------------- the page and its files


def _assets() -> list[Path]:
    return sorted(p for p in CONSOLE_DIR.iterdir() if p.is_file())


async def test_the_page_and_its_files_are_served_with_their_content_types(
    http: aiohttp.ClientSession,
) -> None:
    async with http.get("/console") as resp:
        assert resp.status == 200
        assert resp.content_type == "text/html"
        assert resp.charset == "utf-8"
        policy = resp.headers["Content-Security-Policy"]
        assert "default-src 'self'" in policy and "script-src 'self'" in policy
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        page = await resp.text()
    referenced = set(re.findall(r'(?:src|href)="/console/([^"]+)"', page))
    for script in CONSOLE_DIR.glob("*.js"):
        referenced |= set(re.findall(r'from "\./([^"]+)"', script.read_text()))
    files = {p.name for p in _assets()} - {"index.html"}
    assert referenced == files, "every file is used and every reference exists"
    for name in sorted(files):
        async with http.get(f"/console/{name}") as resp:
            assert resp.status == 200, name
            assert resp.content_type == CONTENT_TYPES[Path(name).suffix], name
            assert await resp.read() == (CONSOLE_DIR / name).read_bytes()
    for missing in ("/console/nope.js", "/console/%2E%2E%2Fconsole.py", "/console/api"):
        async with http.get(missing) as resp:
            assert resp.status == 404, missing


def test_the_pages_code_never_puts_markup_from_data_into_the_dom() -> None:
    forbidden = re.compile(
        r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|DOMParser|"
        r"createContextualFragment|\beval\s*\(|new\s+Function|setAttribute\(\s*[\"']on"
    )
    external = re.compile(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}", re.IGNORECASE)
    for path in _assets():
        text = path.read_text()
        found = forbidden.search(text)
        assert found is None, f"{path.name}: {found and found.group(0)}"
        urls = set(external.findall(text)) - {"http://www.w3.org"}  # the SVG namespace
        assert not urls, f"{path.name} loads from elsewhere: {urls}"
    page = (CONSOLE_DIR / "index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)", page), "no inline script"
    assert not re.search(r"\son[a-z]+\s*=", page), "no inline event handlers"


def test_the_console_files_ship_as_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["apiary"]
    for path in _assets():
        relative = path.relative_to(ROOT / "src" / "apiary").as_posix()
        assert any(fnmatch.fnmatch(relative, p) for p in patterns), relative


# ---------------------------------------------------------------- decisions and reads


async def _call(
    http: aiohttp.ClientSession, path: str, body: object, token: str | None = None
) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with http.post(f"/v1/{path}", json=body, headers=headers) as resp:
        return resp.status, await resp.json()


def test_the_page_decides_with_this_request() -> None:
    """Ties the next test to api.js: the request it sends is the one the page sends."""
    script = (CONSOLE_DIR / "api.js").read_text()
    assert 'HITL = "apiary.v1.HitlOperatorService"' in script
    assert "const body = {invocation_id: invocationId, action, rationale};" in script
    assert 'call(HITL, "Decide", body, {operator: true})' in script
    assert "headers.Authorization = `Bearer ${bearer}`;" in script
    assert "sessionStorage" in script and "localStorage" not in script


async def test_a_decision_sent_as_the_page_sends_it_is_applied_and_audited(
    coordinator: Coordinator, http: aiohttp.ClientSession
) -> None:
    status, view = await _call(
        http,
        "apiary.v1.HitlOperatorService/Escalate",
        {"reason_type": "TOOL_PRIVILEGE_ESCALATION", "requested_by": "scheduler"},
    )
    assert status == 200
    invocation = view["invocation_id"]
    body = {"invocation_id": invocation, "action": "approve", "rationale": "reviewed the diff"}
    decide = "apiary.v1.HitlOperatorService/Decide"
    for token in (None, "not-the-token"):
        status, refused = await _call(http, decide, body, token)
        assert status == 401
        assert refused["error"]["code"] == "unauthenticated"
        assert refused["error"]["message"]  # what the page shows
    status, listed = await _call(http, "apiary.v1.HitlOperatorService/List", {}, TOKEN)
    assert [v["invocation_id"] for v in listed["invocations"]] == [invocation]

    status, decided = await _call(http, decide, body, TOKEN)
    assert status == 200
    assert decided["state"] == "DECIDED"
    assert json.loads(decided["decision_json"])["action"] == "approve"
    events = await coordinator.events.read(limit=1000)
    audit = [e for e in events if e.event_type == "hitl.decided"]
    assert [(e.actor, e.details["by"], e.details["why"]) for e in audit] == [
        ("olivia", "olivia", "reviewed the diff")
    ]


async def test_workflows_are_read_with_their_dependencies_and_states(
    http: aiohttp.ClientSession,
) -> None:
    def node(node_id: str, *deps: str) -> dict[str, Any]:
        return {"node_id": node_id, "agent_id": "worker", "dependencies": list(deps)}

    for workflow_id in ("diamond", "single"):
        nodes = (
            {"a": node("a"), "b": node("b", "a"), "c": node("c", "a"), "d": node("d", "b", "c")}
            if workflow_id == "diamond"
            else {"only": node("only")}
        )
        status, _ = await _call(
            http,
            "sw4rm.workflow.WorkflowService/CreateWorkflow",
            {"definition": {"workflow_id": workflow_id, "nodes": nodes}},
        )
        assert status == 200
    async with http.get("/console/api/workflows") as resp:
        assert resp.status == 200
        shown = (await resp.json())["workflows"]
    assert [w["definition"]["workflow_id"] for w in shown] == ["single", "diamond"]
    diamond = shown[1]
    assert sorted(diamond["definition"]["nodes"]["d"]["dependencies"]) == ["b", "c"]
    assert set(diamond["state"]["node_states"]) == {"a", "b", "c", "d"}
    assert diamond["state"]["metadata"]["status"]
    async with http.get("/console/api/workflows", params={"limit": "1"}) as resp:
        assert [w["definition"]["workflow_id"] for w in (await resp.json())["workflows"]] == [
            "single"
        ]


# ---------------------------------------------------------------- the page's code itself

NODE = shutil.which("node")


@pytest.mark.skipif(
    NODE is None, reason="Node.js is not installed: the page's modules go unchecked"
)
def test_the_page_modules_parse_and_lay_out_a_graph_by_depth(tmp_path: Path) -> None:
    assert NODE is not None
    copy = tmp_path / "console"
    shutil.copytree(CONSOLE_DIR, copy)
    (copy / "package.json").write_text('{"type": "module"}')
    for script in sorted(copy.glob("*.js")):
        checked = subprocess.run(
            [NODE, "--check", str(script)], capture_output=True, text=True, check=False
        )
        assert checked.returncode == 0, f"{script.name}: {checked.stderr}"
    program = (
        f"import {{depths, layout}} from {json.dumps((copy / 'graph.js').as_uri())};\n"
        "const nodes = {a: {}, b: {dependencies: ['a']}, c: {dependencies: ['a']},\n"
        "  d: {dependencies: ['b', 'c']}, e: {dependencies: ['a', 'd']}};\n"
        "const {at} = layout(nodes);\n"
        "console.log(JSON.stringify({depths: Object.fromEntries(depths(nodes)),\n"
        "  x: Object.fromEntries([...at].map(([id, p]) => [id, p.x]))}));\n"
    )
    ran = subprocess.run(
        [NODE, "--input-type=module", "-e", program], capture_output=True, text=True, check=True
    )
    result = json.loads(ran.stdout)
    assert result["depths"] == {"a": 0, "b": 1, "c": 1, "d": 2, "e": 3}
    x = result["x"]
    assert x["a"] < x["b"] == x["c"] < x["d"] < x["e"]


# ---------------------------------------------------------------- headless Chromium

# Resolves with the agents panel's text once it names the agent (a MutationObserver, not
# polling); rejects after a bound.
SHOWS_AGENT = """
new Promise((resolve, reject) => {
  const agent = %s;
  const body = () => document.getElementById(%s);
  const check = () => body() && body().textContent.includes(agent);
  if (check()) return resolve(body().textContent);
  const seen = new MutationObserver(() => {
    if (check()) { seen.disconnect(); resolve(body().textContent); }
  });
  seen.observe(document.documentElement, {subtree: true, childList: true, characterData: true});
  setTimeout(() => { seen.disconnect(); reject(new Error("not shown: " + agent)); }, %d);
})
"""


class DevTools:
    """The few Chrome DevTools protocol calls the test needs, over one websocket."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self._socket = socket
        self._next = 0
        self.seen: list[str] = []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._next += 1
        await self._socket.send_json({"id": self._next, "method": method, "params": params})
        while True:
            message = await self._socket.receive_json()
            if message.get("id") == self._next:
                assert "error" not in message, message
                return dict(message.get("result", {}))
            self.seen.append(str(message.get("method", "")))

    async def until(self, event: str) -> None:
        while event not in self.seen:
            message = await self._socket.receive_json()
            self.seen.append(str(message.get("method", "")))

    async def shows_agent(self, agent_id: str, body: str = "agents-body") -> str:
        """The text of table `body` once it mentions `agent_id` (any text, in fact)."""
        answer = await self.call(
            "Runtime.evaluate",
            expression=SHOWS_AGENT % (json.dumps(agent_id), json.dumps(body), int(WAIT_S * 1000)),
            awaitPromise=True,
            returnByValue=True,
        )
        assert "exceptionDetails" not in answer, answer["exceptionDetails"]
        return str(answer["result"]["value"])


async def _register(http: aiohttp.ClientSession, agent_id: str) -> None:
    agent = {
        "agent_id": agent_id,
        "name": agent_id,
        "capabilities": ["scouting"],
        "reasoning_connectors": ["builtin://rules"],
    }
    status, answer = await _call(
        http, "sw4rm.registry.RegistryService/RegisterAgent", {"agent": agent}
    )
    assert (status, answer.get("accepted")) == (200, True), answer


@pytest.fixture
def chromium() -> Path:
    return installed_chromium()


async def test_the_page_in_headless_chromium_shows_agents_live(
    coordinator: Coordinator, http: aiohttp.ClientSession, tmp_path: Path, chromium: Path
) -> None:
    await _register(http, "scout-1")
    async with open_page(chromium, tmp_path / "profile") as socket:
        tools = DevTools(socket)
        await tools.call("Page.enable")
        await tools.call("Page.navigate", url=f"http://{coordinator.http_address}/console")
        async with asyncio.timeout(WAIT_S * 2):
            await tools.until("Page.loadEventFired")
            assert "scout-1" in await tools.shows_agent("scout-1")
            await _register(http, "scout-2")  # shown through the live stream
            assert "scout-2" in await tools.shows_agent("scout-2")
            # A task submitted now appears among the open tasks, live too.
            await coordinator.scheduler.submit(
                Submission("scout-2", "task-console-1", None, b"{}",
                           "application/json", "repo:app")
            )  # fmt: skip
            shown = await tools.shows_agent("task-console-1", "tasks-body")
            assert "scout-2" in shown and "QUEUED" in shown
