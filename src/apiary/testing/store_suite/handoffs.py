"""Checks of the handoff store (`HandoffStore`): what the handoff engine relies on to find
pending offers and re-arm their deadlines after a restart (RFC 17.6)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from apiary.core.handoff import HandoffState
from apiary.core.records import HandoffRecord
from apiary.store.protocols import Store
from apiary.testing.store_suite.base import (
    T0,
    UNICODE,
    Check,
    CheckNotApplicable,
    StoreFactory,
    registry,
)

CHECKS: list[Check] = []
_check = registry(CHECKS)

_INT64_MAX = (1 << 63) - 1
BINARY_SNAPSHOT = b"\x00" + bytes(range(256)) + b"\x00\x00 trailing NULs\x00"
PENDING, ACCEPTED = HandoffState.PENDING.value, HandoffState.ACCEPTED.value
COMPLETED, REJECTED = HandoffState.COMPLETED.value, HandoffState.REJECTED.value


def handoff_record(request_id: str, n: int = 0, **fields: Any) -> HandoffRecord:
    """A PENDING handoff from agent-a to agent-b created at T0 + n, with a JSON snapshot."""
    values: dict[str, Any] = {
        "request_id": request_id,
        "from_agent": "agent-a",
        "to_agent": "agent-b",
        "state": PENDING,
        "created_at": T0 + n,
        "updated_at": T0 + n,
        "deadline": T0 + n + 30,
        "timeout_s": 30.0,
        "requested_to": "agent-b",
        "reason": f"hand {request_id} over",
        "context_snapshot": f'{{"handoff": "{request_id}"}}'.encode(),
        "snapshot_content_type": "application/json",
        "capabilities_required": ("review",),
        "tried": ("agent-b",),
        "context_holders": ("agent-a", "agent-b"),
    }
    values.update(fields)
    return HandoffRecord(**values)


async def _ids(
    store: Store,
    states: Iterable[str] | None = None,
    *,
    from_agent: str | None = None,
    to_agent: str | None = None,
    after_created: float = 0.0,
    limit: int = 100,
) -> list[str]:
    wanted = None if states is None else frozenset(states)
    found = await store.handoffs.list(
        wanted, from_agent=from_agent, to_agent=to_agent, after_created=after_created,
        limit=limit,
    )  # fmt: skip
    return [h.request_id for h in found]


@_check
async def handoffs_are_put_and_read(factory: StoreFactory) -> None:
    full = HandoffRecord(
        request_id="h-1",
        from_agent="agent-a",
        to_agent="agent-c",
        state=REJECTED,
        created_at=T0 + 0.25,
        updated_at=T0 + 1.5,
        deadline=T0 + 30.25,
        timeout_s=30.0,
        requested_to="",
        reason="needs a security review",
        context_snapshot=BINARY_SNAPSHOT,
        snapshot_content_type="application/octet-stream",
        capabilities_required=("security-review", "python"),
        priority=-19,
        attempt=2,
        tried=("agent-b", "agent-c"),
        accepting_agent="",
        rejection_reason="no capacity",
        context_holders=("agent-a",),
    )
    minimal = HandoffRecord(
        request_id="h-2",
        from_agent="agent-a",
        to_agent="agent-b",
        state=PENDING,
        created_at=T0 + 1,
        updated_at=T0 + 1,
        deadline=T0 + 301,
        timeout_s=300.0,
    )
    async with factory.open() as store:
        assert await store.handoffs.get("h-1") is None
        assert await store.handoffs.list() == []
        await store.handoffs.put(full)
        await store.handoffs.put(minimal)
        stored = await store.handoffs.get("h-1")
        assert stored == full
        assert stored is not None
        assert type(stored.context_snapshot) is bytes
        assert type(stored.capabilities_required) is tuple
        assert (type(stored.tried), type(stored.context_holders)) == (tuple, tuple)
        other = await store.handoffs.get("h-2")
        assert other == minimal
        assert other is not None
        assert (other.context_snapshot, other.capabilities_required, other.tried) == (b"", (), ())
        assert (other.attempt, other.priority, other.context_holders) == (1, 0, ())
        assert await store.handoffs.list() == [full, minimal]
        assert await store.handoffs.get("H-1") is None
        assert await store.handoffs.get("") is None


@_check
async def handoffs_keep_unicode_extremes_and_coerce_like_sql(factory: StoreFactory) -> None:
    record = handoff_record(
        f"h {UNICODE}",
        from_agent=f"from {UNICODE}",
        to_agent=f"to {UNICODE}",
        reason=UNICODE * 50,
        context_snapshot=UNICODE.encode(),
        snapshot_content_type=f"text/plain; {UNICODE}",
        capabilities_required=(UNICODE, f"{UNICODE} 2"),
        priority=-_INT64_MAX - 1,
        attempt=_INT64_MAX,
        tried=(f"to {UNICODE}",),
        rejection_reason=UNICODE,
        context_holders=(f"from {UNICODE}", f"to {UNICODE}"),
    )
    async with factory.open() as store:
        await store.handoffs.put(record)
        assert await store.handoffs.get(f"h {UNICODE}") == record
        assert await _ids(store, to_agent=f"to {UNICODE}") == [f"h {UNICODE}"]
        assert await _ids(store, from_agent=f"from {UNICODE}") == [f"h {UNICODE}"]
        loose = handoff_record(
            "h-loose",
            created_at=1_700_000_000,
            deadline=1_700_000_030,
            timeout_s=30,
            context_snapshot=bytearray(b"\x00mutable\x00"),
            state=HandoffState.ACCEPTED,
            capabilities_required=["a", "b"],
        )
        await store.handoffs.put(loose)
        stored = await store.handoffs.get("h-loose")
        assert stored is not None
        assert (type(stored.created_at), type(stored.timeout_s)) == (float, float)
        assert type(stored.context_snapshot) is bytes
        assert stored.context_snapshot == b"\x00mutable\x00"
        assert type(stored.state) is str
        assert stored.state == ACCEPTED
        assert stored.capabilities_required == ("a", "b")


@_check
async def large_handoff_snapshots_round_trip(factory: StoreFactory) -> None:
    snapshot = bytes(range(256)) * 4096  # 1 MiB, NULs every 256 bytes
    async with factory.open() as store:
        await store.handoffs.put(handoff_record("big", 1, context_snapshot=snapshot))
        await store.handoffs.put(handoff_record("big-reversed", 2, context_snapshot=snapshot[::-1]))
        stored = await store.handoffs.get("big")
        assert stored is not None
        assert stored.context_snapshot == snapshot
        assert [h.context_snapshot for h in await store.handoffs.list()] == [
            snapshot,
            snapshot[::-1],
        ]


@_check
async def putting_a_handoff_again_replaces_its_record(factory: StoreFactory) -> None:
    async with factory.open() as store:
        pending = handoff_record("h-1", 1)
        await store.handoffs.put(pending)
        await store.handoffs.put(handoff_record("h-2", 2))
        accepted = replace(pending, state=ACCEPTED, accepting_agent="agent-b", updated_at=T0 + 5)
        await store.handoffs.put(accepted)
        assert await store.handoffs.get("h-1") == accepted
        assert await _ids(store) == ["h-1", "h-2"]
        assert await _ids(store, {PENDING}) == ["h-2"]
        assert await _ids(store, {ACCEPTED}) == ["h-1"]
        # Replaced as a whole, not merged: emptied fields come back empty, and the target
        # (the key of a pending listing) moves with the record.
        rerouted = replace(
            accepted, state=PENDING, to_agent="agent-c", accepting_agent="", reason="",
            context_snapshot=b"", capabilities_required=(), tried=("agent-b", "agent-c"),
            context_holders=("agent-a", "agent-c"), attempt=2,
        )  # fmt: skip
        await store.handoffs.put(rerouted)
        assert await store.handoffs.get("h-1") == rerouted
        assert await _ids(store, {PENDING}, to_agent="agent-b") == ["h-2"]
        assert await _ids(store, {PENDING}, to_agent="agent-c") == ["h-1"]
        assert len(await store.handoffs.list()) == 2


async def _list_fixture(store: Store) -> None:
    # Put out of creation order, with ids that disagree with it: the listing orders by
    # (created_at, request_id).
    records = [
        handoff_record("h-f", 5, from_agent="x", to_agent="b", state=COMPLETED),
        handoff_record("h-a", 1, from_agent="x", to_agent="b"),
        handoff_record("h-e", 3, from_agent="y", to_agent="b", state=ACCEPTED),
        handoff_record("h-d", 3, from_agent="x", to_agent="c"),
        handoff_record("h-c", 0, from_agent="y", to_agent="b", priority=-5),
        handoff_record("h-b", 4, from_agent="y", to_agent="c", state=REJECTED),
    ]
    for record in records:
        await store.handoffs.put(record)


@_check
async def handoff_list_filters_by_states_agents_and_creation(factory: StoreFactory) -> None:
    everything = ["h-c", "h-a", "h-d", "h-e", "h-b", "h-f"]
    async with factory.open() as store:
        await _list_fixture(store)
        assert await _ids(store) == everything
        assert await _ids(store, {PENDING}) == ["h-c", "h-a", "h-d"]
        assert await _ids(store, {PENDING, ACCEPTED}) == ["h-c", "h-a", "h-d", "h-e"]
        assert await _ids(store, {s.value for s in HandoffState}) == everything
        # An empty set of states matches nothing; nor do unknown or differently cased ones.
        assert await _ids(store, set()) == []
        assert await _ids(store, set(), to_agent="b") == []
        assert await _ids(store, {"UNKNOWN"}) == []
        assert await _ids(store, {"pending"}) == []
        # Agents are exact matches, on either side.
        assert await _ids(store, to_agent="b") == ["h-c", "h-a", "h-e", "h-f"]
        assert await _ids(store, from_agent="y") == ["h-c", "h-e", "h-b"]
        assert await _ids(store, to_agent="B") == []
        assert await _ids(store, from_agent="") == []
        # after_created is a strict bound.
        assert await _ids(store, after_created=T0 + 3) == ["h-b", "h-f"]
        assert await _ids(store, after_created=T0) == everything[1:]
        assert await _ids(store, after_created=T0 + 5) == []
        # Combinations: every filter applies (GetPendingHandoffs is states + to_agent).
        assert await _ids(store, {PENDING}, to_agent="b") == ["h-c", "h-a"]
        assert await _ids(store, {PENDING}, to_agent="b", from_agent="y") == ["h-c"]
        assert await _ids(store, {PENDING}, from_agent="x", after_created=T0 + 1) == ["h-d"]
        assert await _ids(store, {ACCEPTED}, to_agent="c") == []


@_check
async def handoff_list_pages_by_limit(factory: StoreFactory) -> None:
    async with factory.open() as store:
        await _list_fixture(store)
        assert await _ids(store, limit=2) == ["h-c", "h-a"]
        assert await _ids(store, {PENDING}, limit=2) == ["h-c", "h-a"]
        assert await _ids(store, to_agent="b", limit=3) == ["h-c", "h-a", "h-e"]
        assert await _ids(store, limit=0) == []
        assert len(await store.handoffs.list(limit=1000)) == 6
        for states in (None, frozenset({PENDING}), frozenset()):
            try:
                await store.handoffs.list(states, limit=-1)
            except ValueError:
                pass
            else:
                raise AssertionError(f"handoffs.list({states!r}, limit=-1) did not raise")


@_check
async def handoffs_that_do_not_fit_are_refused(factory: StoreFactory) -> None:
    bad_fields: list[dict[str, Any]] = [
        {"state": "NOT_A_STATE"},
        {"state": "pending"},
        {"priority": 1 << 63},
        {"attempt": -(1 << 63) - 1},
        {"capabilities_required": "review"},
        {"tried": ("agent-b", 7)},
        {"context_holders": (b"agent-a",)},
    ]
    good = handoff_record("h-1", 1)
    async with factory.open() as store:
        for fields in bad_fields:
            try:
                await store.handoffs.put(replace(good, **fields))
            except ValueError:
                pass
            else:
                raise AssertionError(f"a handoff with {fields!r} was accepted")
        assert await store.handoffs.get("h-1") is None
        await store.handoffs.put(good)
        for fields in bad_fields:
            with contextlib.suppress(ValueError):
                await store.handoffs.put(replace(good, reason="replaced", **fields))
        assert await store.handoffs.list() == [good]


@_check
async def many_concurrent_handoff_puts_are_all_stored(factory: StoreFactory) -> None:
    count = 300
    records = [
        handoff_record(
            f"h-{i:03}", i, to_agent=f"agent-{i % 7}", context_snapshot=bytes([i % 256]) * i
        )
        for i in range(count)
    ]
    async with factory.open() as store:
        await asyncio.gather(*(store.handoffs.put(r) for r in reversed(records)))
        assert await store.handoffs.list(limit=count + 1) == records
        fetched = await asyncio.gather(*(store.handoffs.get(r.request_id) for r in records))
        assert fetched == records
        assert await _ids(store, to_agent="agent-3", limit=count) == [
            r.request_id for r in records if r.to_agent == "agent-3"
        ]
        done = [replace(r, state=COMPLETED, context_holders=(r.to_agent,)) for r in records]
        await asyncio.gather(*(store.handoffs.put(r) for r in done))
        assert await store.handoffs.list(frozenset({COMPLETED}), limit=count) == done
        assert await store.handoffs.list(frozenset({PENDING})) == []


@_check
async def handoffs_survive_closing_and_reopening(factory: StoreFactory) -> None:
    if not factory.durable:
        raise CheckNotApplicable(f"the {factory.backend} backend is not durable")
    pending = handoff_record("h-1", 1, context_snapshot=BINARY_SNAPSHOT)
    accepted = handoff_record("h-2", 2, state=ACCEPTED, accepting_agent="agent-b")
    async with factory.open() as store:
        await store.handoffs.put(pending)
        await store.handoffs.put(handoff_record("h-2", 2))
        await store.handoffs.put(accepted)
    async with factory.open() as store:
        assert await store.handoffs.get("h-1") == pending
        assert await store.handoffs.list() == [pending, accepted]
        assert await _ids(store, {PENDING}, to_agent="agent-b") == ["h-1"]
        expired = replace(pending, state=HandoffState.EXPIRED.value, updated_at=T0 + 40)
        await store.handoffs.put(expired)
    async with factory.open() as store:
        assert await store.handoffs.list(frozenset({PENDING})) == []
        assert await store.handoffs.get("h-1") == expired
