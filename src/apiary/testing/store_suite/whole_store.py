"""Checks of the store as a whole: its backend name, text in every aggregate, persistence."""

from __future__ import annotations

from dataclasses import replace

from apiary.core.events import EventFilter
from apiary.core.records import MessageState
from apiary.testing.store_suite.base import (
    T0,
    UNICODE,
    Check,
    CheckNotApplicable,
    StoreFactory,
    agent,
    draft,
    message,
    registry,
)

CHECKS: list[Check] = []
_check = registry(CHECKS)


@_check
async def store_reports_its_backend(factory: StoreFactory) -> None:
    async with factory.open() as store:
        assert store.backend == factory.backend


@_check
async def unicode_round_trips_everywhere(factory: StoreFactory) -> None:
    async with factory.open() as store:
        await store.events.append(
            [
                draft(
                    1,
                    event_type=f"type {UNICODE}",
                    actor=f"actor {UNICODE}",
                    correlation_id=f"corr {UNICODE}",
                    agent_id=f"agent {UNICODE}",
                    hlc=UNICODE,
                    details={UNICODE: UNICODE, "list": [UNICODE]},
                )
            ]
        )
        where = EventFilter(correlation_id=f"corr {UNICODE}", agent_id=f"agent {UNICODE}")
        (event,) = await store.events.read(where=where)
        assert event.event_type == f"type {UNICODE}"
        assert event.actor == f"actor {UNICODE}"
        assert event.hlc == UNICODE
        assert dict(event.details) == {UNICODE: UNICODE, "list": [UNICODE]}

        await store.agents.put(agent(f"id {UNICODE}", name=UNICODE, descriptor={"d": UNICODE}))
        stored_agent = await store.agents.get(f"id {UNICODE}")
        assert stored_agent is not None
        assert stored_agent.name == UNICODE
        assert dict(stored_agent.descriptor) == {"d": UNICODE}

        envelope = UNICODE.encode()
        await store.messages.admit(message(f"m {UNICODE}", f"to {UNICODE}", envelope=envelope))
        (stored,) = await store.messages.inbox(f"to {UNICODE}")
        assert stored.message_id == f"m {UNICODE}"
        assert stored.envelope == envelope


@_check
async def everything_survives_closing_and_reopening(factory: StoreFactory) -> None:
    if not factory.durable:
        raise CheckNotApplicable(f"the {factory.backend} backend is not durable")
    async with factory.open() as store:
        appended = await store.events.append([draft(1, correlation_id="c"), draft(2)])
        await store.agents.put(agent("a-1"))
        await store.messages.admit(message("m-1", "b"))
        await store.messages.set_state("m-1", MessageState.READ, T0 + 3)
    async with factory.open() as store:
        assert await store.events.read() == appended
        assert await store.events.last_sequence() == 2
        assert await store.agents.get("a-1") == agent("a-1")
        stored = await store.messages.get("m-1")
        assert stored == replace(
            message("m-1", "b"), offset=1, state=MessageState.READ, updated_at=T0 + 3
        )
        # Numbering continues where it stopped.
        assert [e.sequence for e in await store.events.append([draft(3)])] == [3]
        assert (await store.messages.admit(message("m-2", "b"))).offset == 2
    async with factory.open() as store:
        assert await store.events.last_sequence() == 3
        assert [m.message_id for m in await store.messages.inbox("b")] == ["m-1", "m-2"]
