"""The registry, HITL and handoffs commit each state change with its audit event: when the
event log refuses the append, the change is refused with it (the engine's memory included)
instead of being stored without its event, and events noted before are kept for later."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from apiary.core.agent_state import UNAVAILABLE
from apiary.core.handoff_request import HandoffDraft
from apiary.engine.hitl import HitlSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.store.errors import StoreError
from apiary.testing.clock import FakeClock
from apiary.testing.engine import EngineHarness, open_test_engine
from apiary.testing.ids import SequentialIds

HITL = HitlSettings(operators=(OperatorEntry("ann", token_digest("ann-token"), ("admin",)),))
DRAFT = HandoffDraft(
    request_id="h-1", from_agent="alice", to_agent="bob", reason="review", timeout_s=30.0
)
AUDITED = (
    "agent.registered", "agent.state", "agent.deregistered", "hitl.decided", "hitl.cancelled",
    "handoff.requested",
)  # fmt: skip


@asynccontextmanager
async def _engine(path: Path, clock: FakeClock, ids: SequentialIds) -> AsyncIterator[EngineHarness]:
    async with open_test_engine(
        store_url=f"sqlite:///{path}", data_dir=path.parent, clock=clock, ids=ids, hitl=HITL
    ) as harness:
        yield harness


def _events_refused(path: Path, refused: bool) -> None:
    """Make the database refuse (or take again) every insert into `events`."""
    with sqlite3.connect(path) as raw:
        raw.execute(
            "CREATE TRIGGER refuse_events BEFORE INSERT ON events"
            " BEGIN SELECT RAISE(ABORT, 'events refused'); END"
            if refused
            else "DROP TRIGGER refuse_events"
        )


async def test_a_change_whose_event_is_refused_is_not_made(tmp_path: Path) -> None:
    path, clock, ids = tmp_path / "apiary.db", FakeClock(), SequentialIds()
    async with _engine(path, clock, ids) as h:
        await h.register("alice")
        await h.register("bob")
        invocation = (
            await h.engine.hitl.open("SECURITY_APPROVAL", {"op": "x"}, requested_by="alice")
        ).invocation_id
        await h.engine.events.flush()
        before = len(await h.events())
    _events_refused(path, True)
    async with _engine(path, clock, ids) as h:
        engine, ann = h.engine, h.engine.hitl.operators.authenticate("Bearer ann-token")
        engine.events.note("test.noted", "test")  # to be kept through the refusals
        alice = await engine.registry.get("alice")
        with pytest.raises(StoreError):
            await engine.registry.register({**alice.descriptor, "agent_id": "carol"})
        with pytest.raises(StoreError):
            await engine.registry.set_state("alice", UNAVAILABLE, "test")
        with pytest.raises(StoreError):
            await engine.registry.deregister("bob", "test")
        with pytest.raises(StoreError):
            await engine.hitl.decide(invocation, "approve", ann, "fine")
        with pytest.raises(StoreError):
            await engine.hitl.cancel(invocation, "alice", "no longer needed")
        with pytest.raises(StoreError):
            await engine.handoffs.request(DRAFT)
        # Nothing changed, in memory or in the store.
        assert [a.agent_id for a in await engine.registry.list()] == ["alice", "bob"]
        assert (await engine.registry.get("alice")).state != UNAVAILABLE
        assert (await engine.hitl.get(invocation)).state == "PENDING"
        assert [r.invocation_id for r in await engine.hitl.list()] == [invocation]
        assert not engine.handoffs.timers.next()
        _events_refused(path, False)
        await engine.events.flush()
        assert [a.agent_id for a in await h.store.agents.list()] == ["alice", "bob"]
        stored_agent, stored_invocation = (
            await h.store.agents.get("alice"),
            await h.store.hitl.get(invocation),
        )
        assert stored_agent is not None and stored_agent.state != UNAVAILABLE
        assert stored_invocation is not None and stored_invocation.state == "PENDING"
        assert await h.store.handoffs.get("h-1") is None
        after = await h.events()
        assert not [e.event_type for e in after[before:] if e.event_type in AUDITED]
        assert [e.event_type for e in after].count("test.noted") == 1
        # Taken again, the same changes commit with their events.
        await engine.registry.set_state("alice", UNAVAILABLE, "test")
        await engine.handoffs.request(DRAFT)
        await engine.hitl.cancel(invocation, "alice", "no longer needed")
        assert await engine.registry.deregister("bob", "test") is True
        assert await engine.registry.deregister("bob", "again") is False
        kinds = [e.event_type for e in await h.events()]
        assert [k for k in kinds if k in AUDITED][-4:] == [
            "agent.state", "handoff.requested", "hitl.cancelled", "agent.deregistered",
        ]  # fmt: skip
