"""Workflows, worktree bindings, negotiation rooms and negotiations commit the events of a
state change in the change's own transaction, on every backend: a write with events stores
both (and tells the log's listeners, with their sequences), a write that fails stores
neither (a refused record, a malformed event, a closed store)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from apiary.core.events import Event, EventDraft
from apiary.core.workflow.node import NodeRun, NodeStatus
from apiary.core.workflow.run import WorkflowRun, WorkflowStatus
from apiary.store.errors import DuplicateWorkflowError, StoreError, VersionConflictError
from apiary.store.protocols import Store
from apiary.testing.store_suite import StoreFactory
from apiary.testing.store_suite.base import T0, draft
from apiary.testing.store_suite.negotiations import artifact, negotiation, round_record
from apiary.testing.store_suite.rooms import decision, proposal, vote
from apiary.testing.store_suite.workflows import diamond, fresh_nodes
from apiary.testing.store_suite.worktrees import binding

BAD = draft(99, details={"not json": {1, 2}})
"""An event no log can store: a set is not JSON."""


def _told(store: Store) -> list[Event]:
    """What the log tells its listeners from now on."""
    told: list[Event] = []
    store.events.listen(told.extend)
    return told


async def _log(store: Store) -> list[tuple[int, str, Any]]:
    return [(e.sequence, e.event_type, e.details.get("n")) for e in await store.events.read()]


def _named(*pairs: tuple[str, int]) -> list[EventDraft]:
    return [draft(n, event_type=name) for name, n in pairs]


# --- workflows -------------------------------------------------------------------------------


async def test_a_workflow_commits_with_its_events(store_factory: StoreFactory) -> None:
    spec = diamond()
    run = WorkflowRun(spec.workflow_id, updated_at=T0)
    async with store_factory.open() as store:
        told = _told(store)
        await store.workflows.create(spec, run, fresh_nodes(spec), _named(("workflow.created", 1)))
        running = replace(run, status=WorkflowStatus.RUNNING, started_at=T0 + 1)
        ready = NodeRun("a", NodeStatus.READY, updated_at=T0 + 1)
        events = _named(("workflow.started", 2), ("workflow.node_ready", 3))
        await store.workflows.save(running, [ready], events)

        stored = await store.workflows.get(spec.workflow_id)
        assert stored is not None and stored.run.status is WorkflowStatus.RUNNING
        assert stored.nodes["a"].status is NodeStatus.READY
        expected = [
            (1, "workflow.created", 1), (2, "workflow.started", 2), (3, "workflow.node_ready", 3)
        ]  # fmt: skip
        assert await _log(store) == expected
        assert [(e.sequence, e.event_type, e.details["n"]) for e in told] == expected


async def test_a_workflow_write_that_fails_stores_no_event(store_factory: StoreFactory) -> None:
    spec = diamond()
    run = WorkflowRun(spec.workflow_id, updated_at=T0)
    async with store_factory.open() as store:
        await store.workflows.create(spec, run, fresh_nodes(spec))
        told = _told(store)
        with pytest.raises(DuplicateWorkflowError):
            await store.workflows.create(spec, run, fresh_nodes(spec), [draft(1)])
        # A node the workflow does not have: the run's change is undone with the events.
        running = replace(run, status=WorkflowStatus.RUNNING)
        with pytest.raises(StoreError):
            await store.workflows.save(running, [NodeRun("ghost")], [draft(2)])
        with pytest.raises(ValueError, match="JSON"):
            await store.workflows.save(running, [NodeRun("a", NodeStatus.READY)], [draft(3), BAD])
        other = diamond("wf-2")
        with pytest.raises(ValueError, match="JSON"):
            await store.workflows.create(other, WorkflowRun("wf-2"), fresh_nodes(other), [BAD])

        stored = await store.workflows.get(spec.workflow_id)
        assert stored is not None and stored.run == run
        assert {r.status for r in stored.nodes.values()} == {NodeStatus.PENDING}
        assert await store.workflows.get("wf-2") is None
        assert await _log(store) == [] and told == []


# --- worktree bindings -----------------------------------------------------------------------


async def test_a_binding_commits_with_its_event_or_not_at_all(
    store_factory: StoreFactory,
) -> None:
    first = binding("agent-1")
    async with store_factory.open() as store:
        told = _told(store)
        await store.worktrees.put(first, [draft(1, event_type="worktree.binding")])
        # Version 2 is the next one; version 3 and a second version 1 are conflicts.
        for conflicting in (replace(first, version=3), first):
            with pytest.raises(VersionConflictError):
                await store.worktrees.put(replace(conflicting, note="lost"), [draft(2)])
        with pytest.raises(ValueError, match="JSON"):
            await store.worktrees.put(replace(first, version=2, note="bad"), [BAD])
        second = replace(first, version=2, state="UNBOUND", note="unbound")
        await store.worktrees.put(second, [draft(3, event_type="worktree.binding")])

        assert await store.worktrees.get("agent-1") == second
        assert await _log(store) == [(1, "worktree.binding", 1), (2, "worktree.binding", 3)]
        assert [e.sequence for e in told] == [1, 2]


# --- negotiation rooms -----------------------------------------------------------------------


async def test_a_room_commits_proposals_votes_and_decisions_with_their_events(
    store_factory: StoreFactory,
) -> None:
    open_ = proposal("art-1")
    decided = replace(open_, state="APPROVED", updated_at=T0 + 20)
    async with store_factory.open() as store:
        told = _told(store)
        await store.rooms.put_proposal(open_, _named(("room.proposed", 1)))
        await store.rooms.add_vote(vote("art-1", "c1"), _named(("room.voted", 2)))
        await store.rooms.add_vote(vote("art-1", "c2", 1), _named(("room.voted", 3)))
        await store.rooms.decide(decided, decision("art-1"), _named(("room.decided", 4)))

        assert await store.rooms.get_proposal("art-1") == decided
        assert [v.critic_id for v in await store.rooms.votes("art-1")] == ["c1", "c2"]
        assert [d.sequence for d in await store.rooms.decisions("art-1")] == [1]
        assert await _log(store) == [
            (1, "room.proposed", 1), (2, "room.voted", 2), (3, "room.voted", 3),
            (4, "room.decided", 4),
        ]  # fmt: skip
        assert [e.sequence for e in told] == [1, 2, 3, 4]


async def test_a_room_write_that_fails_stores_no_event(store_factory: StoreFactory) -> None:
    open_ = proposal("art-1")
    async with store_factory.open() as store:
        await store.rooms.put_proposal(open_)
        await store.rooms.add_vote(vote("art-1", "c1"))
        await store.rooms.decide(replace(open_, state="ESCALATED"), decision("art-1"))
        told = _told(store)
        with pytest.raises(StoreError):  # the critic voted already
            await store.rooms.add_vote(vote("art-1", "c1", 5, score=1.0), [draft(1)])
        with pytest.raises(StoreError):  # decision 1 is recorded: the proposal stays too
            await store.rooms.decide(
                replace(open_, state="APPROVED"), decision("art-1"), [draft(2)]
            )
        with pytest.raises(ValueError, match="JSON"):
            await store.rooms.put_proposal(proposal("art-2"), [BAD])
        with pytest.raises(ValueError, match="JSON"):
            await store.rooms.add_vote(vote("art-1", "c2"), [draft(3), BAD])
        with pytest.raises(ValueError, match="JSON"):
            await store.rooms.decide(replace(open_, state="APPROVED"), decision("art-1", 2), [BAD])

        found = await store.rooms.get_proposal("art-1")
        assert found is not None and found.state == "ESCALATED"
        assert await store.rooms.get_proposal("art-2") is None
        assert [(v.critic_id, v.score) for v in await store.rooms.votes("art-1")] == [("c1", 8.0)]
        assert [d.sequence for d in await store.rooms.decisions("art-1")] == [1]
        assert await _log(store) == [] and told == []


# --- negotiations ----------------------------------------------------------------------------


async def test_a_negotiation_commits_its_state_artifacts_and_events_together(
    store_factory: StoreFactory,
) -> None:
    held = artifact("neg-1", "note", "v1", content=b"a client's note")
    contract = artifact("neg-1", "contract", "v1")
    note = artifact("neg-1", "note", "v1", content=b"the engine's note")
    async with store_factory.open() as store:
        told = _told(store)
        assert await store.artifacts.append(held, _named(("artifact.appended", 1)))
        # Held already: refused, and so is its event.
        assert not await store.artifacts.append(held, [draft(2)])
        added = await store.negotiations.save(
            negotiation("neg-1", state="NEGOTIATING", round=1), round_record("neg-1", 1),
            [contract, note], _named(("negotiation.proposed", 3)),
            _named(("artifact.appended", 4), ("artifact.appended", 5)),
        )  # fmt: skip
        assert added == [True, False]
        # The state's events first, then those of the artifacts added (the note was held).
        await store.negotiations.save(negotiation("neg-1", state="DECIDED"), events=[draft(6)])
        await store.negotiations.put_policy("", {"max_rounds": 3}, T0, [draft(7)])
        await store.negotiations.replace_profiles({"fast": {"max_rounds": 1}}, T0, [draft(8)])

        found = await store.negotiations.get("neg-1")
        assert found is not None and found.state == "DECIDED"
        assert [r.round for r in await store.negotiations.rounds("neg-1")] == [1]
        listed = await store.artifacts.list("neg-1")
        assert [(a.name, a.content) for a in listed] == [
            (held.name, held.content), (contract.name, contract.content)
        ]  # fmt: skip
        assert await store.negotiations.policies() == {
            "": {"max_rounds": 3}, "fast": {"max_rounds": 1}
        }  # fmt: skip
        assert await _log(store) == [
            (1, "artifact.appended", 1), (2, "negotiation.proposed", 3),
            (3, "artifact.appended", 4), (4, "test.event", 6), (5, "test.event", 7),
            (6, "test.event", 8),
        ]  # fmt: skip
        assert [e.sequence for e in told] == [1, 2, 3, 4, 5, 6]


async def test_a_negotiation_write_that_fails_stores_no_event(store_factory: StoreFactory) -> None:
    contract = artifact("neg-1", "contract", "v1")
    async with store_factory.open() as store:
        told = _told(store)
        opened = negotiation("neg-1")
        with pytest.raises(ValueError, match="JSON"):
            await store.negotiations.save(opened, None, [contract], [draft(1), BAD])
        with pytest.raises(ValueError, match="JSON"):
            await store.negotiations.save(opened, None, [contract], [draft(1)], [BAD])
        with pytest.raises(ValueError, match="one per artifact"):
            await store.negotiations.save(opened, None, [contract], [], [draft(1), draft(2)])
        with pytest.raises(ValueError, match="JSON"):
            await store.negotiations.put_policy("", {"max_rounds": 3}, T0, [BAD])
        with pytest.raises(ValueError, match="JSON"):
            await store.negotiations.replace_profiles({"fast": {"max_rounds": 1}}, T0, [BAD])
        with pytest.raises(ValueError, match="JSON"):
            await store.artifacts.append(contract, [BAD])

        assert await store.negotiations.get("neg-1") is None
        assert await store.artifacts.list("neg-1") == []
        assert await store.negotiations.policies() == {}
        assert await _log(store) == [] and told == []


# --- a store that is closed ------------------------------------------------------------------


async def test_a_closed_store_stores_neither_state_nor_events(store_factory: StoreFactory) -> None:
    if not store_factory.durable:
        pytest.skip("process memory is never closed")
    spec = diamond()
    run = WorkflowRun(spec.workflow_id, updated_at=T0)
    async with store_factory.open() as store:
        await store.workflows.create(spec, run, fresh_nodes(spec))
    writes: Sequence[Any] = (
        store.workflows.save(replace(run, status=WorkflowStatus.RUNNING), [], [draft(1)]),
        store.worktrees.put(binding("agent-1"), [draft(2)]),
        store.rooms.put_proposal(proposal("art-1"), [draft(3)]),
        store.negotiations.save(negotiation("neg-1"), events=[draft(4)]),
        store.artifacts.append(artifact("neg-1", "contract", "v1"), [draft(5)]),
    )
    for write in writes:
        with pytest.raises(StoreError):
            await write

    async with store_factory.open() as store:
        stored = await store.workflows.get(spec.workflow_id)
        assert stored is not None and stored.run == run
        assert await store.worktrees.get("agent-1") is None
        assert await store.rooms.get_proposal("art-1") is None
        assert await store.negotiations.get("neg-1") is None
        assert await store.artifacts.list("neg-1") == []
        assert await _log(store) == []
