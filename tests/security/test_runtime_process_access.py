"""write_process_stdin and terminate_process in secure mode: a process is its session
owner's; another principal is answered as if it did not exist (not_found, and nothing is
written to the process nor is it stopped), an operator with `tasks` reaches it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from apiary.core.access.principal import PrincipalKind
from apiary.engine.assembly import Runtime
from apiary.sdk.agent import Agent
from apiary.sdk.credentials import ClientCredentials
from apiary.sdk.tasks import TaskRunner
from apiary.server.auth.keys import KeyRing, credentials_path
from apiary.server.auth.settings import AuthSettings
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from tests.server.runtime_harness import RuntimeHttp, runtime_http, session_events
from tests.server.test_runtime_processes import AGENT, TOOLS, Shell, _events, _of, _printed

PRINCIPALS = {
    AGENT: (PrincipalKind.AGENT, AGENT, ()),
    "app": (PrincipalKind.APPLICATION, "ci", ()),
    "mallory": (PrincipalKind.APPLICATION, "mallory", ()),
    "no-role": (PrincipalKind.OPERATOR, "olivia", ()),
    "root": (PrincipalKind.OPERATOR, "root", ("admin",)),
}


@asynccontextmanager
async def _secure_shell(tmp_path: Path) -> AsyncIterator[tuple[Coordinator, dict[str, str]]]:
    ring = KeyRing(credentials_path(tmp_path))
    keys = {
        name: ring.create(kind, principal, roles=roles, now=time.time())[1]
        for name, (kind, principal, roles) in PRINCIPALS.items()
    }
    async with open_test_coordinator(
        tmp_path, runtime=Runtime(tools=TOOLS), auth=AuthSettings(secure=True)
    ) as coordinator:
        home = tmp_path / "home"
        home.mkdir()
        credentials = ClientCredentials.load({"HOME": str(home)}, api_key=keys[AGENT])
        address = str(coordinator.grpc_address)
        async with Agent(AGENT, coordinator=address, credentials=credentials) as agent:
            job = asyncio.create_task(TaskRunner(agent, Shell(agent).handle).run())
            try:
                yield coordinator, keys
            finally:
                job.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await job


async def test_only_the_sessions_owner_reaches_its_process(tmp_path: Path) -> None:
    async with _secure_shell(tmp_path) as (coordinator, keys), runtime_http(coordinator) as http:

        def as_(who: str) -> RuntimeHttp:
            return RuntimeHttp(http.http, {"authorization": f"Bearer {keys[who]}"})

        app = as_("app")
        turn = await app.ok("submit_turn", agent_id=AGENT, turn_id="t-1", input={"tool": "chat"})
        session_id = turn["sessionId"]
        events = await _events(coordinator, session_id, lambda f: "ready" in _printed(f))
        process_id = _of(events, "process.started")[0]["payload"]["processId"]
        for who in ("mallory", "no-role"):
            other = as_(who)
            for command, params in (
                ("write_process_stdin", {"process_id": process_id, "text": "evil\n"}),
                ("terminate_process", {"process_id": process_id}),
            ):
                error = await other.error(404, command, **params)
                assert error["code"] == "not_found", (who, command, error)
                assert error["details"]["field"] == "process_id"
        events = await session_events(coordinator, session_id)
        assert not _of(events, "process.input") and not _of(events, "runtime.warning")
        assert not _of(events, "process.terminated")
        # Its owner writes; an operator with `tasks` may too, and stops it.
        await app.ok("write_process_stdin", process_id=process_id, text="mine\n")
        root = as_("root")
        await root.ok("write_process_stdin", process_id=process_id, text="ops\n")
        events = await _events(coordinator, session_id, lambda f: "got ops" in _printed(f))
        assert _printed(events) == "ready\ngot mine\ngot ops\n"
        stopped = await root.ok("terminate_process", process_id=process_id)
        assert stopped["process"]["status"] == "terminated"
        # Anonymous callers reach nothing.
        refused = await http.error(401, "terminate_process", process_id=process_id)
        assert refused["code"] == "unauthenticated"
