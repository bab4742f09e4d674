"""What the runtime control plane's tests share: the contract's schemas (every event and
snapshot a test sees is validated against them), an HTTP caller of the commands (HTTP JSON
and JSON-RPC), and an SDK agent whose turns' inputs (an agent task's run's too, known by its
task id) choose what it does:

    {"mode": "answer", "value": V}   returns {"answer": V}
    {"mode": "fail"}                 fails with error code no_answer
    {"mode": "hold"}                 waits until the test releases the turn (`Answerer.release`)
    {"mode": "loop"}                 steps with safe points until it is preempted
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
from jsonschema import Draft202012Validator, FormatChecker

from apiary.core.runtime.log import is_runtime, runtime_event, session_filter
from apiary.sdk.agent import Agent
from apiary.sdk.errors import TaskFailedError
from apiary.sdk.tasks import TaskContext, TaskRunner
from apiary.server.coordinator import Coordinator

VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "agentruntime"
WAIT_S = 20.0
_FORMATS = FormatChecker()


@_FORMATS.checks("date-time", raises=ValueError)
def _date_time(value: object) -> bool:
    """RFC 3339 date-time (jsonschema checks the format only with an extra package)."""
    if not isinstance(value, str):
        return True
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed.tzinfo is not None and "T" in value


def _validator(name: str) -> Draft202012Validator:
    schema = json.loads((VECTORS / name).read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=_FORMATS)


EVENT_SCHEMA = _validator("agentruntime-event.schema.json")
SNAPSHOT_SCHEMA = _validator("agentruntime-snapshot.schema.json")


def check_event(doc: object) -> None:
    """`doc` is valid against the event schema (the failures listed when it is not)."""
    errors = [e.message for e in EVENT_SCHEMA.iter_errors(doc)]
    assert not errors, (errors, doc)


def check_snapshot(doc: object) -> None:
    errors = [f"{list(e.path)}: {e.message}" for e in SNAPSHOT_SCHEMA.iter_errors(doc)]
    assert not errors, (errors, doc)


def check_answer(doc: dict[str, Any]) -> dict[str, Any]:
    """A command's answer with every snapshot and event in it validated; `doc` itself."""
    if "threads" in doc:
        check_snapshot(doc)
    if "snapshot" in doc:
        check_snapshot(doc["snapshot"])
    for event in doc.get("events", ()):
        check_event(event)
    return doc


async def session_events(coordinator: Coordinator, session_id: str) -> list[dict[str, Any]]:
    """Every runtime event of the session in the log, as contract events, each validated."""
    found = await coordinator.events.read(limit=10_000, where=session_filter(session_id))
    docs = [runtime_event(e).to_json() for e in found if is_runtime(e)]
    for doc in docs:
        check_event(doc)
    return docs


def types(events: Iterable[dict[str, Any]], turn_id: str | None = None) -> list[str]:
    return [e["type"] for e in events if turn_id is None or e.get("turnId") == turn_id]


class RuntimeHttp:
    """The control plane's commands over HTTP: `post` (HTTP JSON) and `rpc` (JSON-RPC)."""

    def __init__(self, http: aiohttp.ClientSession, headers: dict[str, str] | None = None):
        self.http = http
        self.headers = headers or {}
        self._id = 0

    async def post(self, command: str, **params: Any) -> tuple[int, dict[str, Any]]:
        async with self.http.post(
            f"/runtime/v1/{command}", json=params, headers=self.headers
        ) as response:
            return response.status, check_answer(await response.json())

    async def ok(self, command: str, **params: Any) -> dict[str, Any]:
        status, doc = await self.post(command, **params)
        assert status == 200, (command, status, doc)
        return doc

    async def error(self, status: int, command: str, **params: Any) -> dict[str, Any]:
        """The error object of a call expected to fail with `status`."""
        got, doc = await self.post(command, **params)
        assert got == status, (command, got, doc)
        return dict(doc["error"])

    async def rpc(self, body: object) -> tuple[int, Any]:
        async with self.http.post("/runtime/v1/rpc", json=body, headers=self.headers) as r:
            return r.status, (await r.json() if r.status != 204 else None)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One JSON-RPC call's response object."""
        self._id += 1
        status, doc = await self.rpc(
            {"jsonrpc": "2.0", "id": self._id, "method": method, "params": params}
        )
        assert status == 200 and doc["id"] == self._id, doc
        if "result" in doc:
            check_answer(doc["result"])
        return dict(doc)

    async def until(self, command: str, ready: Any, **params: Any) -> dict[str, Any]:
        """Ask `command` again until `ready(answer)` (bounded by WAIT_S)."""

        async def poll() -> dict[str, Any]:
            while True:
                doc = await self.ok(command, **params)
                if ready(doc):
                    return doc
                await asyncio.sleep(0.02)

        return await asyncio.wait_for(poll(), WAIT_S)

    async def thread_status(self, thread_id: str, status: str) -> dict[str, Any]:
        return await self.until(
            "get_thread_read", lambda d: d["threads"][0]["status"] == status, thread_id=thread_id
        )


@asynccontextmanager
async def runtime_http(
    coordinator: Coordinator, headers: dict[str, str] | None = None
) -> AsyncIterator[RuntimeHttp]:
    base = f"http://{coordinator.http_address}"
    async with aiohttp.ClientSession(base_url=base) as http:
        yield RuntimeHttp(http, headers)


class Answerer:
    """The turns' agent (module docstring), run by the SDK's TaskRunner."""

    def __init__(self) -> None:
        self.started: dict[str, asyncio.Event] = {}
        self.releases: dict[str, asyncio.Event] = {}
        self.seen: list[str] = []

    def _event(self, table: dict[str, asyncio.Event], turn_id: str) -> asyncio.Event:
        return table.setdefault(turn_id, asyncio.Event())

    def release(self, turn_id: str) -> None:
        self._event(self.releases, turn_id).set()

    async def running(self, turn_id: str) -> None:
        await asyncio.wait_for(self._event(self.started, turn_id).wait(), WAIT_S)

    async def handle(self, task: TaskContext) -> object:
        body = task.json()
        turn_id, given = body.get("turnId") or body["taskId"], body["input"]
        self.seen.append(turn_id)
        self._event(self.started, turn_id).set()
        mode = given.get("mode", "answer") if isinstance(given, dict) else "answer"
        if mode == "fail":
            raise TaskFailedError("no answer to that", error_code="no_answer")
        if mode == "hold":
            await self._event(self.releases, turn_id).wait()
        if mode == "loop":
            while True:
                await task.safe_point()
                await asyncio.sleep(0.01)
        return {"answer": given.get("value") if isinstance(given, dict) else given}


@asynccontextmanager
async def running_answerer(
    coordinator: Coordinator, agent_id: str = "answerer", capabilities: tuple[str, ...] = ()
) -> AsyncIterator[Answerer]:
    answerer = Answerer()
    address = str(coordinator.grpc_address)
    async with Agent(agent_id, coordinator=address, capabilities=capabilities) as agent:
        job = asyncio.create_task(TaskRunner(agent, answerer.handle).run())
        try:
            yield answerer
        finally:
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job
