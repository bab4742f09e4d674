"""Checks of the HITL store (`HitlStore`)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from apiary.core.records import HitlRecord
from apiary.store.protocols import Store
from apiary.testing.store_suite.base import (
    T0,
    UNICODE,
    Check,
    CheckNotApplicable,
    StoreFactory,
    hitl_record,
    registry,
)

CHECKS: list[Check] = []
_check = registry(CHECKS)

_INT64_MAX = (1 << 63) - 1

NESTED_CONTEXT: dict[str, Any] = {
    "facts": [{"file": f"src/{UNICODE}.py", "lines": [1, 2, 3]}, {"file": "b.py", "lines": []}],
    "diff": f'--- a\n+++ b\n@@ -1 +1 @@\n-{UNICODE}\n+\t"quoted" \\ backslash\n',
    "risk": {"score": 0.75, "notes": None, "flags": {"network": True, "secrets": False}},
    "prior_attempts": [[], [{}], [[[]]]],
    # No float written with a positive exponent (1e300): JSONB keeps numbers as NUMERIC and
    # gives them back in positional notation, which then parses as an int.
    "numbers": [0, -1, 2.5, -0.125, 1.25e-300, 0.1, 2**53 + 1, -(2**62)],
    UNICODE: {UNICODE: [UNICODE, {"": ""}]},
    "engine": {"model": "m-1", "latency_ms": 12.5, "tokens": {"in": 100, "out": 20}},
}


def decided(record: HitlRecord, at: float, **fields: Any) -> HitlRecord:
    """`record` decided by an operator at `at`."""
    decision = {
        "action": "APPROVE",
        "rationale": "reviewed the diff",
        "decided_by": "alice",
        "decided_at": at,
        "via": "operator",
        "policy": {"name": "two-person", "approvals": ["alice", "bob"]},
    }
    values: dict[str, Any] = {"state": "DECIDED", "updated_at": at, "decision": decision}
    values.update(fields)
    return replace(record, **values)


async def _ids(
    store: Store,
    states: Iterable[str] | None = None,
    after_created: float = 0.0,
    limit: int = 100,
) -> list[str]:
    wanted = None if states is None else frozenset(states)
    records = await store.hitl.list(wanted, after_created=after_created, limit=limit)
    return [r.invocation_id for r in records]


@_check
async def hitl_records_are_put_and_read(factory: StoreFactory) -> None:
    full = hitl_record(
        "inv-1",
        priority=7,
        extensions=2,
        timeout_action="AUTO_RESOLVE",
        proposed_actions=("APPROVE", "DENY", "MODIFY"),
        approver_roles=("security", "lead"),
        deadline=T0 + 300.1,
        updated_at=T0 + 0.5,
    )
    full = decided(full, T0 + 42.25)
    minimal = HitlRecord(
        invocation_id="inv-2",
        reason_type="CONFLICT",
        state="PENDING",
        created_at=T0,
        updated_at=T0,
        deadline=T0 + 60,
        requested_by="engine.negotiation",
    )
    async with factory.open() as store:
        assert await store.hitl.get("inv-1") is None
        assert await store.hitl.list() == []
        await store.hitl.put(full)
        await store.hitl.put(minimal)
        stored = await store.hitl.get("inv-1")
        assert stored == full
        assert stored is not None
        assert isinstance(stored.proposed_actions, tuple)
        assert isinstance(stored.approver_roles, tuple)
        assert dict(stored.decision) == dict(full.decision)
        other = await store.hitl.get("inv-2")
        assert other == minimal
        assert other is not None
        assert (other.proposed_actions, other.approver_roles) == ((), ())
        assert (dict(other.subject), dict(other.context), dict(other.decision)) == ({}, {}, {})
        assert (other.correlation_id, other.suggested_action, other.timeout_action) == (
            "",
            "",
            "DENY",
        )
        assert (other.priority, other.extensions) == (0, 0)
        assert await store.hitl.list() == [full, minimal]
        assert await store.hitl.get("inv-3") is None
        assert await store.hitl.get("INV-1") is None
        assert await store.hitl.get("") is None


@_check
async def hitl_records_keep_unicode_nested_json_and_extremes(factory: StoreFactory) -> None:
    record = hitl_record(
        f"inv {UNICODE}",
        reason_type=f"reason {UNICODE}",
        state=f"state {UNICODE}",
        requested_by=f"agent {UNICODE}",
        correlation_id=f"corr {UNICODE}",
        subject={"repo_id": UNICODE, "worktree_id": f"wt {UNICODE}", "ids": [1, UNICODE]},
        context=NESTED_CONTEXT,
        suggested_action=f"action {UNICODE}",
        proposed_actions=(UNICODE, "", f"{UNICODE} 2"),
        approver_roles=(f"role {UNICODE}",),
        timeout_action=UNICODE,
        priority=-_INT64_MAX - 1,
        extensions=_INT64_MAX,
        decision={"rationale": UNICODE * 100, "patch": "x" * 100_000, "nested": NESTED_CONTEXT},
    )
    async with factory.open() as store:
        await store.hitl.put(record)
        stored = await store.hitl.get(f"inv {UNICODE}")
        assert stored == record
        assert stored is not None
        assert dict(stored.context) == NESTED_CONTEXT
        assert await store.hitl.list(frozenset({f"state {UNICODE}"})) == [record]


@_check
async def hitl_records_are_detached_from_the_caller(factory: StoreFactory) -> None:
    context: dict[str, Any] = {"facts": ["a"]}
    async with factory.open() as store:
        await store.hitl.put(hitl_record("inv-1", context=context))
        context["facts"].append("changed after put")
        first = await store.hitl.get("inv-1")
        assert first is not None
        assert dict(first.context) == {"facts": ["a"]}
        first.context["facts"].append("changed after get")
        second = await store.hitl.get("inv-1")
        assert second is not None
        assert dict(second.context) == {"facts": ["a"]}
        (listed,) = await store.hitl.list()
        listed.subject["repo_id"] = "changed after list"  # type: ignore[index]
        assert await store.hitl.get("inv-1") == second


@_check
async def putting_an_invocation_again_replaces_its_record(factory: StoreFactory) -> None:
    async with factory.open() as store:
        pending = hitl_record("inv-1")
        await store.hitl.put(pending)
        await store.hitl.put(hitl_record("inv-2", created_at=T0 + 1))
        extended = replace(pending, deadline=T0 + 600, extensions=1, updated_at=T0 + 10)
        await store.hitl.put(extended)
        assert await store.hitl.get("inv-1") == extended
        done = decided(extended, T0 + 20)
        await store.hitl.put(done)
        assert await store.hitl.get("inv-1") == done
        assert await _ids(store) == ["inv-1", "inv-2"]
        assert await _ids(store, {"PENDING"}) == ["inv-2"]
        assert await _ids(store, {"DECIDED"}) == ["inv-1"]
        # Replaced as a whole, not merged: emptied fields come back empty.
        emptied = replace(
            done,
            subject={},
            context={},
            decision={},
            proposed_actions=(),
            approver_roles=(),
            correlation_id="",
            state="CANCELLED",
        )
        await store.hitl.put(emptied)
        assert await store.hitl.get("inv-1") == emptied
        # created_at is replaced too, and the listing follows it.
        await store.hitl.put(replace(emptied, created_at=T0 + 2))
        assert await _ids(store) == ["inv-2", "inv-1"]
        assert len(await store.hitl.list()) == 2


async def _list_fixture(store: Store) -> None:
    records = [
        hitl_record("inv-6", created_at=T0 + 6, state="CANCELLED"),
        hitl_record("inv-1", created_at=T0 + 1, state="PENDING"),
        hitl_record("inv-3", created_at=T0 + 3, state="PENDING"),
        hitl_record("inv-2", created_at=T0 + 2, state="DECIDED"),
        hitl_record("inv-5", created_at=T0 + 5, state="PENDING"),
        hitl_record("inv-4", created_at=T0 + 4, state="TIMED_OUT"),
        hitl_record("inv-7", created_at=T0 + 7, state="FALLBACK_APPLIED"),
    ]
    for record in records:
        await store.hitl.put(record)


@_check
async def hitl_list_filters_by_states_and_created_after(factory: StoreFactory) -> None:
    everything = [f"inv-{i}" for i in range(1, 8)]
    async with factory.open() as store:
        await _list_fixture(store)
        assert await _ids(store) == everything
        assert await _ids(store, {"PENDING"}) == ["inv-1", "inv-3", "inv-5"]
        assert await _ids(store, {"PENDING", "DECIDED"}) == ["inv-1", "inv-2", "inv-3", "inv-5"]
        terminal = {"DECIDED", "TIMED_OUT", "FALLBACK_APPLIED", "CANCELLED"}
        assert await _ids(store, terminal) == ["inv-2", "inv-4", "inv-6", "inv-7"]
        all_states = terminal | {"PENDING"}
        assert await _ids(store, all_states) == everything
        # An empty set of states matches nothing; an unknown state matches nothing.
        assert await _ids(store, set()) == []
        assert await _ids(store, {"UNKNOWN"}) == []
        assert await _ids(store, {"pending"}) == []
        # after_created is a strict bound on created_at.
        assert await _ids(store, after_created=T0 + 3) == everything[3:]
        assert await _ids(store, after_created=T0 + 2.5) == everything[2:]
        assert await _ids(store, after_created=T0 + 7) == []
        assert await _ids(store, after_created=T0) == everything
        assert await _ids(store, after_created=-math.inf) == everything
        assert await _ids(store, {"PENDING"}, after_created=T0 + 1) == ["inv-3", "inv-5"]
        assert await _ids(store, set(), after_created=T0) == []


@_check
async def hitl_list_pages_by_created_and_limit(factory: StoreFactory) -> None:
    async with factory.open() as store:
        await _list_fixture(store)
        pages: list[list[str]] = []
        after = 0.0
        for _ in range(5):  # bounded: a store that ignored after_created would loop forever
            page = await store.hitl.list(after_created=after, limit=3)
            if not page:
                break
            pages.append([r.invocation_id for r in page])
            after = page[-1].created_at
        assert pages == [["inv-1", "inv-2", "inv-3"], ["inv-4", "inv-5", "inv-6"], ["inv-7"]]
        # `limit` counts matching records.
        assert await _ids(store, {"PENDING"}, limit=2) == ["inv-1", "inv-3"]
        assert await _ids(store, {"PENDING"}, after_created=T0 + 1, limit=1) == ["inv-3"]
        assert await _ids(store, limit=0) == []
        assert await _ids(store, limit=1) == ["inv-1"]
        assert len(await store.hitl.list(limit=1000)) == 7
        assert len(await store.hitl.list()) == 7
        for states in (None, frozenset({"PENDING"}), frozenset()):
            try:
                await store.hitl.list(states, limit=-1)
            except ValueError:
                pass
            else:
                raise AssertionError(f"hitl.list({states!r}, limit=-1) did not raise ValueError")


@_check
async def hitl_list_breaks_created_at_ties_by_invocation_id(factory: StoreFactory) -> None:
    # Code point order, whatever the database's collation: "B" < "a" < "é" < "你" < "🐝".
    tied = ["inv-b", "inv-B", "inv-🐝", "inv-a", "inv-你", "inv-é", "inv-a0", "inv-"]
    async with factory.open() as store:
        for invocation_id in tied:
            await store.hitl.put(hitl_record(invocation_id, created_at=T0 + 5))
        await store.hitl.put(hitl_record("zz-earlier", created_at=T0 + 4.5))
        await store.hitl.put(hitl_record("aa-later", created_at=T0 + 5.5))
        expected = ["zz-earlier", *sorted(tied), "aa-later"]
        assert expected[1:4] == ["inv-", "inv-B", "inv-a"]
        assert await _ids(store) == expected
        assert await _ids(store, {"PENDING"}) == expected
        assert await _ids(store, limit=4) == expected[:4]
        assert await _ids(store, after_created=T0 + 4.5) == expected[1:]


@_check
async def hitl_records_that_are_not_json_are_refused(factory: StoreFactory) -> None:
    bad_fields: list[dict[str, Any]] = [
        {"subject": ["not", "an", "object"]},
        {"subject": {"x": object()}},
        {"context": {"x": math.nan}},
        {"context": {"x": math.inf}},
        {"context": {"x": b"bytes"}},
        {"context": {"x": "\ud800"}},
        {"decision": "not an object"},
        {"decision": {1.5j: "complex key"}},
        {"proposed_actions": ("APPROVE", 1)},
        {"proposed_actions": "APPROVE"},
        {"proposed_actions": ("\udc80",)},
        {"approver_roles": (None,)},
        {"approver_roles": {"security"}},
        {"priority": 1 << 63},
        {"extensions": -(1 << 63) - 1},
    ]
    async with factory.open() as store:
        for fields in bad_fields:
            try:
                await store.hitl.put(hitl_record("inv-1", **fields))
            except ValueError:
                pass
            else:
                raise AssertionError(f"a record with {fields!r} was accepted")
        assert await store.hitl.get("inv-1") is None
        assert await store.hitl.list() == []
        # A refused replacement leaves the stored record as it was.
        good = hitl_record("inv-1")
        await store.hitl.put(good)
        for fields in bad_fields:
            with contextlib.suppress(ValueError):
                await store.hitl.put(hitl_record("inv-1", state="DECIDED", **fields))
        assert await store.hitl.get("inv-1") == good


@_check
async def hitl_records_survive_closing_and_reopening(factory: StoreFactory) -> None:
    if not factory.durable:
        raise CheckNotApplicable(f"the {factory.backend} backend is not durable")
    pending = hitl_record("inv-1", context=NESTED_CONTEXT, priority=3)
    done = decided(hitl_record("inv-2", created_at=T0 + 1), T0 + 30)
    async with factory.open() as store:
        await store.hitl.put(pending)
        await store.hitl.put(hitl_record("inv-2", created_at=T0 + 1))
        await store.hitl.put(done)
    async with factory.open() as store:
        assert await store.hitl.get("inv-1") == pending
        assert await store.hitl.get("inv-2") == done
        assert await store.hitl.list(frozenset({"PENDING"})) == [pending]
        assert await store.hitl.list() == [pending, done]
        timed_out = replace(pending, state="TIMED_OUT", updated_at=T0 + 300)
        await store.hitl.put(timed_out)
    async with factory.open() as store:
        assert await store.hitl.list(frozenset({"PENDING"})) == []
        assert await store.hitl.list() == [timed_out, done]
