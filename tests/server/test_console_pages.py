"""The console's reads for its pages, over real sockets against a coordinator on SQLite:
histories paged back through the event log (GET /console/api/history), finished work with
search and paging (GET /console/api/finished), a workflow read by id, the parameters each
refuses with a 400 naming it, the role they need in secure mode; decided things carry no
deadline on any surface; and an agent whose recovery timed out is FAILED for the gateway and
`apiary status` alike, not UNAVAILABLE."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from apiary.core.access.principal import PrincipalKind
from apiary.core.events import Event, EventFilter
from apiary.engine.eventlog import EventRecorder
from apiary.server.auth.keys import KeyRing, credentials_path
from apiary.server.auth.settings import AuthSettings
from apiary.server.coordinator import Coordinator
from apiary.server.http.history import read_back
from apiary.server.inprocess import open_test_coordinator
from apiary.store.memory.store import MemoryStore
from apiary.testing.clock import FakeClock
from tests.server.console_scenario import OPERATOR_HEADERS, open_world

HISTORY = "/console/api/history"
FINISHED = "/console/api/finished"


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path, f"sqlite:///{tmp_path / 'apiary.db'}") as running:
        yield running


@pytest.fixture
async def http(coordinator: Coordinator) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=f"http://{coordinator.http_address}") as session:
        yield session


async def _get(http: aiohttp.ClientSession, path: str, **params: str) -> tuple[int, Any]:
    async with http.get(path, params=params) as resp:
        return resp.status, await resp.json()


async def _pages(http: aiohttp.ClientSession, path: str, key: str, **params: str) -> list[Any]:
    """Every page of a read, following `next`."""
    pages: list[Any] = []
    before = ""
    while True:
        query = {**params, **({"before": before} if before else {})}
        status, page = await _get(http, path, **query)
        assert status == 200, page
        pages.append(page[key])
        if page["next"] is None:
            return pages
        before = str(page["next"])


# ---------------------------------------------------------------- histories


async def test_a_history_pages_back_newest_first_without_gaps_or_repeats(
    coordinator: Coordinator, http: aiohttp.ClientSession
) -> None:
    for n in range(23):
        await coordinator.events.record("console.probe", "tester", agent_id="a1", n=n)
        await coordinator.events.record("console.probe", "tester", agent_id="a2", n=n)
    pages = await _pages(http, HISTORY, "events", kind="agent", id="a1", limit="5")
    assert [len(p) for p in pages] == [5, 5, 5, 5, 3]
    shown = [e for page in pages for e in page]
    assert {e["agent_id"] for e in shown} == {"a1"}
    assert [e["details"]["n"] for e in shown] == list(range(22, -1, -1))
    sequences = [e["sequence"] for e in shown]
    assert sequences == sorted(sequences, reverse=True)
    status, first = await _get(http, HISTORY, kind="agent", id="a1", limit="2")
    assert (status, [e["details"]["n"] for e in first["events"]]) == (200, [22, 21])
    assert first["next"] == first["events"][-1]["sequence"]


async def test_a_sparse_search_reads_within_its_budget_and_goes_on_from_where_it_stopped(
    coordinator: Coordinator,
) -> None:
    events = coordinator.events
    await events.record("console.probe", "tester", agent_id="rare", n=0)
    for n in range(300):
        await events.record("console.probe", "tester", agent_id="busy", n=n)
    await events.record("console.probe", "tester", agent_id="rare", n=1)
    where = EventFilter(event_types=frozenset({"console.probe"}))

    def rare(e: Event) -> bool:
        return e.agent_id == "rare"

    first = await read_back(events, where, rare, None, 5, budget=50)
    assert [e.details["n"] for e in first.events] == [1]  # the budget ran out meanwhile
    assert first.next is not None
    found: list[Any] = []
    before: int | None = first.next
    while before is not None:
        page = await read_back(events, where, rare, before, 5, budget=50)
        found += [e.details["n"] for e in page.events]
        before = page.next
    assert found == [0]  # the rest, nothing twice


class CountingReads:
    """An event log reader that counts the events its reads return."""

    def __init__(self, events: EventRecorder) -> None:
        self._events = events
        self.returned = 0

    async def last_sequence(self) -> int:
        return await self._events.last_sequence()

    async def read(self, after: int, limit: int, where: EventFilter) -> list[Event]:
        found = await self._events.read(after=after, limit=limit, where=where)
        self.returned += len(found)
        return found


async def test_a_dense_window_is_narrowed_to_the_budget_and_no_read_goes_past_before() -> None:
    events = EventRecorder(MemoryStore().events, FakeClock())
    for n in range(2000):  # old and dense: every one selected
        await events.record("console.probe", "tester", agent_id="busy", n=n)
    for n in range(3000):  # newer, none selected: the windows grow wide across them
        await events.record("console.other", "tester", n=n)
    where = EventFilter(event_types=frozenset({"console.probe"}))
    reads = CountingReads(events)

    def never(e: Event) -> bool:
        return False

    page = await read_back(reads, where, never, None, 5, budget=100)  # type: ignore[arg-type]
    assert page.events == []
    assert page.next is not None and page.next > 1  # the budget ran out, older ones remain
    # The window that reaches the dense part is narrowed instead of read whole (2,000
    # events): each try gives up one read past the budget left.
    assert reads.returned < 1000, reads.returned
    # A `before` past the log's end is the end.
    far = await read_back(events, where, lambda e: True, 2**62, 3, budget=100)
    assert [e.details["n"] for e in far.events] == [1999, 1998, 1997]


async def test_a_hitl_invocations_history_is_its_own_events_and_a_missing_one_is_404(
    tmp_path: Path,
) -> None:
    async with open_world(tmp_path) as world:
        status, page = await world.get(HISTORY, kind="hitl", id=world.decided_hitl)
        assert status == 200
        assert [e["event_type"] for e in page["events"]] == ["hitl.decided", "hitl.opened"]
        assert {e["details"]["invocation_id"] for e in page["events"]} == {world.decided_hitl}
        status, task = await world.get(HISTORY, kind="task", id="task-ok-1")
        assert [e["event_type"] for e in task["events"] if e["event_type"].startswith("task.")][
            ::-1
        ] == ["task.submitted", "task.dispatched", "task.running", "task.completed"]
        status, missing = await world.get(HISTORY, kind="hitl", id="no-such-invocation")
        assert (status, missing["error"]["code"]) == (404, "not_found")


# ---------------------------------------------------------------- finished work


async def test_finished_work_is_listed_newest_first_searched_and_paged(tmp_path: Path) -> None:
    async with open_world(tmp_path, bulk=4) as world:
        status, listed = await world.get(FINISHED)
        assert status == 200 and listed["next"] is None
        kinds = {(i["kind"], i["id"]) for i in listed["items"]}
        assert {
            ("task", "task-ok-1"),
            ("task", "task-bad"),
            ("workflow", "wf-1"),
            ("room", "ops"),
            ("negotiation", "neg-1"),
            ("hitl", world.decided_hitl),
        } <= kinds
        assert ("negotiation", "neg-2") not in kinds  # still open
        assert ("hitl", world.pending_hitl) not in kinds
        sequences = [i["sequence"] for i in listed["items"]]
        assert sequences == sorted(sequences, reverse=True)
        failed = next(i for i in listed["items"] if i["id"] == "task-bad")
        assert (failed["state"], failed["agent_id"], failed["summary"]) == (
            "FAILED", "worker", "internal_error",
        )  # fmt: skip
        room = next(i for i in listed["items"] if i["kind"] == "room")
        assert (room["state"], room["detail"]) == ("APPROVED", world.decided_artifact)

        status, tasks = await world.get(FINISHED, kind="task", q="TASK-OK")
        assert [i["id"] for i in tasks["items"]] == ["task-ok-2", "task-ok-1"]
        prefix = world.decided_hitl[:8]
        status, found = await world.get(FINISHED, q=prefix)
        assert [i["id"] for i in found["items"]] == [world.decided_hitl]
        status, by_text = await world.get(FINISHED, q="batch 2")  # a decision's rationale
        assert [i["id"] for i in by_text["items"]] == [world.bulk_hitl[2]]
        status, none = await world.get(FINISHED, q="nothing like this")
        assert (none["items"], none["next"]) == ([], None)

        pages = await _pages(world.http, FINISHED, "items", kind="hitl", limit="2")
        assert [len(p) for p in pages] == [2, 2, 1]
        assert [i["id"] for p in pages for i in p] == [*reversed(world.bulk_hitl),
                                                        world.decided_hitl]  # fmt: skip


async def test_a_workflow_is_read_by_its_id(tmp_path: Path) -> None:
    async with open_world(tmp_path) as world:
        status, found = await world.get("/console/api/workflows", workflow_id="wf-1")
        assert status == 200
        (shown,) = found["workflows"]
        assert shown["definition"]["nodes"]["b"]["dependencies"] == ["a"]
        assert shown["state"]["metadata"]["status"] == "COMPLETED"
        status, missing = await world.get("/console/api/workflows", workflow_id="nope")
        assert (status, missing["error"]["code"]) == (404, "not_found")


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        (HISTORY, {"id": "a1"}, "kind"),
        (HISTORY, {"kind": "planet", "id": "a1"}, "kind"),
        (HISTORY, {"kind": "agent"}, "id"),
        (HISTORY, {"kind": "agent", "id": "a\x01"}, "id"),
        (HISTORY, {"kind": "task", "id": "t", "before": "-1"}, "before"),
        (HISTORY, {"kind": "task", "id": "t", "before": "²"}, "before"),
        (HISTORY, {"kind": "task", "id": "t", "limit": "0"}, "limit"),
        (HISTORY, {"kind": "task", "id": "t", "limit": "501"}, "limit"),
        (FINISHED, {"kind": "agent"}, "kind"),
        (FINISHED, {"kind": "tasks"}, "kind"),
        (FINISHED, {"q": "x" * 201}, "q"),
        (FINISHED, {"q": "a\x00b"}, "q"),
        (FINISHED, {"before": str(2**63)}, "before"),
        (FINISHED, {"limit": "many"}, "limit"),
        ("/console/api/workflows", {"workflow_id": "a\x7f"}, "workflow_id"),
    ],
)
async def test_a_bad_parameter_is_a_400_naming_it(
    http: aiohttp.ClientSession, path: str, params: dict[str, str], field: str
) -> None:
    status, body = await _get(http, path, **params)
    assert status == 400, body
    assert body["error"]["code"] == "validation_error"
    assert body["error"]["details"]["field"] == field
    assert body["error"]["message"].startswith(f"{field}: ")


async def test_in_secure_mode_the_reads_need_the_role_events(tmp_path: Path) -> None:
    async with open_test_coordinator(tmp_path, auth=AuthSettings(secure=True)) as secure:
        keys = KeyRing(credentials_path(secure.config.data_dir))
        _, reader = keys.create(
            PrincipalKind.OPERATOR, "reader", roles=("events",), now=time.time()
        )
        _, other = keys.create(PrincipalKind.OPERATOR, "dana", roles=("dlq",), now=time.time())
        async with aiohttp.ClientSession(base_url=f"http://{secure.http_address}") as http:
            for path, params in ((HISTORY, {"kind": "agent", "id": "a1"}), (FINISHED, {})):
                for credential, expected in ((None, 401), (other, 403), (reader, 200)):
                    headers = {"Authorization": f"Bearer {credential}"} if credential else {}
                    async with http.get(path, params=params, headers=headers) as resp:
                        body = await resp.json()
                    assert resp.status == expected, (path, credential, body)
                    if expected == 403:
                        assert body["error"]["code"] == "permission_denied"
                        assert "'events'" in body["error"]["message"]


# ---------------------------------------------------------------- what every surface says


async def test_decided_things_have_no_deadline_and_open_ones_do(tmp_path: Path) -> None:
    async with open_world(tmp_path) as world:
        proposals = (await world.call("apiary.v1.NegotiationRoomQueryService/ListProposals",
                                      {"negotiation_room_id": "ops"}))["proposals"]  # fmt: skip
        by_id = {p["proposal"]["artifact_id"]: p for p in proposals}
        decided, still_open = by_id[world.decided_artifact], by_id[world.open_artifact]
        assert decided["state"] == "APPROVED" and "vote_deadline" not in decided
        assert still_open["state"] == "OPEN" and still_open["vote_deadline"]
        negotiation = "apiary.v1.NegotiationOperatorService/Get"
        done = await world.call(negotiation, {"negotiation_id": "neg-1"})
        assert done["state"] == "DECIDED"
        assert "deadline" not in done and "round_deadline" not in done
        going = await world.call(negotiation, {"negotiation_id": "neg-2"})
        assert going["state"] == "OPEN" and going["deadline"]
        hitl = "apiary.v1.HitlOperatorService/Get"
        answered = await world.call(hitl, {"invocation_id": world.decided_hitl}, OPERATOR_HEADERS)
        assert answered["state"] == "DECIDED" and "deadline" not in answered
        waiting = await world.call(hitl, {"invocation_id": world.pending_hitl}, OPERATOR_HEADERS)
        assert waiting["state"] == "PENDING" and waiting["deadline"]


def _status_json(coordinator: Coordinator) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "apiary.cli.main", "status", "--json"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "APIARY_COORDINATOR": str(coordinator.grpc_address)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


async def test_an_agent_whose_recovery_timed_out_is_failed_for_every_reader(
    tmp_path: Path,
) -> None:
    async with open_world(tmp_path) as world:
        history = [e["details"] for e in (await world.get(HISTORY, kind="agent", id="ghost"))[1][
            "events"] if e["event_type"] in ("agent.lifecycle", "agent.state")]  # fmt: skip
        moves = [(d["from"], d["to"]) for d in reversed(history)]
        assert moves[-3:] == [
            ("FAILED", "RECOVERING"), ("RECOVERING", "FAILED"), ("RUNNABLE", "UNAVAILABLE"),
        ]  # fmt: skip
        listed = await world.call("apiary.v1.DiscoveryService/ListAgents", {})
        states = {a["descriptor"]["agent_id"]: a["state"] for a in listed["agents"]}
        assert states["ghost"] == "FAILED"
        assert states["worker"] == "RUNNABLE"
        status = await asyncio.to_thread(_status_json, world.coordinator)
        assert {a["agent_id"]: a["state"] for a in status["agents"]} == states
