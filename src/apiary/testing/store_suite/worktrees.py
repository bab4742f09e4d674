"""Checks of the worktree binding store (`WorktreeStore`): what the worktree manager relies on
to keep homes, switches and bind failures across restarts (RFC 16), and the version guard
that keeps two writers from overwriting each other."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import Any

from apiary.core.worktrees.records import BindingState, WorktreeBinding
from apiary.store.errors import VersionConflictError
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
_S = BindingState


def binding(agent_id: str, **fields: Any) -> WorktreeBinding:
    """A first-version BOUND_HOME binding of `agent_id` to repo-1/wt-<agent_id>."""
    values: dict[str, Any] = {
        "agent_id": agent_id,
        "state": _S.BOUND_HOME.value,
        "repo_id": "repo-1",
        "worktree_id": f"wt-{agent_id}",
        "branch": f"wt-{agent_id}",
        "current_repo_id": "repo-1",
        "current_worktree_id": f"wt-{agent_id}",
        "entered_at": T0,
        "updated_at": T0,
        "version": 1,
    }
    values.update(fields)
    return WorktreeBinding(**values)


async def _refused(store: Store, record: WorktreeBinding) -> None:
    try:
        await store.worktrees.put(record)
    except VersionConflictError:
        return
    raise AssertionError(f"version {record.version} of {record.agent_id} was accepted")


async def _agents(
    store: Store, states: set[str] | None = None, repo: str | None = None
) -> list[str]:
    wanted = None if states is None else frozenset(states)
    return [b.agent_id for b in await store.worktrees.list(wanted, repo_id=repo)]


@_check
async def bindings_are_put_and_read(factory: StoreFactory) -> None:
    full = WorktreeBinding(
        agent_id="agent-a",
        state=_S.BOUND_NON_HOME.value,
        repo_id="repo-1",
        worktree_id="frontend",
        branch="feat/oauth",
        commit_sha="abc123def456",
        current_repo_id="repo-2",
        current_worktree_id="shared-proto",
        target_repo_id="repo-3",
        target_worktree_id="later",
        reason="worktree_locked",
        note="approved by olivia",
        attempts=2,
        retry_at=T0 + 1.5,
        recovery_at=T0 + 60.25,
        expires_at=T0 + 900.125,
        ttl_s=900.0,
        invocation_id="inv-1",
        entered_at=T0 + 0.5,
        updated_at=T0 + 0.75,
        version=1,
    )
    minimal = WorktreeBinding(agent_id="agent-b", version=1)
    async with factory.open() as store:
        assert await store.worktrees.get("agent-a") is None
        assert await store.worktrees.list() == []
        await store.worktrees.put(full)
        await store.worktrees.put(minimal)
        assert await store.worktrees.get("agent-a") == full
        stored = await store.worktrees.get("agent-b")
        assert stored == minimal
        assert stored is not None
        assert (stored.state, stored.repo_id, stored.current_worktree_id) == ("UNBOUND", "", "")
        assert await store.worktrees.list() == [full, minimal]
        # Unknown ids, ids that differ in case only, and the empty id are not found.
        for missing in ("agent-c", "AGENT-A", ""):
            assert await store.worktrees.get(missing) is None


@_check
async def binding_versions_guard_every_write(factory: StoreFactory) -> None:
    first = binding("agent-a")
    async with factory.open() as store:
        # A new agent's first record is version 1; nothing else can start it.
        await _refused(store, binding("agent-b", version=2))
        await store.worktrees.put(first)
        second = replace(first, state=_S.SWITCH_PENDING.value, target_worktree_id="x", version=2)
        # Writing version 1 again (a second creator) or skipping a version is refused.
        await _refused(store, replace(first, note="another creator"))
        await _refused(store, replace(second, version=3))
        assert await store.worktrees.get("agent-a") == first
        await store.worktrees.put(second)
        assert await store.worktrees.get("agent-a") == second
        # A writer that read version 1 and writes 2 after someone else did: refused.
        stale = replace(first, state=_S.UNBOUND.value, version=2)
        await _refused(store, stale)
        assert await store.worktrees.get("agent-a") == second
        third = replace(second, state=_S.BOUND_HOME.value, target_worktree_id="", version=3)
        await store.worktrees.put(third)
        assert await store.worktrees.list() == [third]
        assert await store.worktrees.get("agent-b") is None


@_check
async def concurrent_writers_of_one_version_are_one_winner(factory: StoreFactory) -> None:
    async with factory.open() as store:
        await store.worktrees.put(binding("agent-a"))
        rivals = [binding("agent-a", note=f"writer {i}", version=2) for i in range(8)]
        outcomes = await asyncio.gather(
            *(store.worktrees.put(r) for r in rivals), return_exceptions=True
        )
        winners = [r for r, o in zip(rivals, outcomes, strict=True) if o is None]
        assert len(winners) == 1, outcomes
        assert all(isinstance(o, VersionConflictError) for o in outcomes if o is not None)
        assert await store.worktrees.get("agent-a") == winners[0]
        # Different agents never conflict.
        many = [binding(f"agent-{i:03}") for i in range(200)]
        await asyncio.gather(*(store.worktrees.put(b) for b in reversed(many)))
        assert len(await store.worktrees.list()) == 201


@_check
async def binding_list_filters_by_state_and_repository(factory: StoreFactory) -> None:
    records = [
        binding("d", state=_S.BIND_FAILED.value, repo_id="r2", current_repo_id=""),
        binding("a"),
        binding("c", state=_S.BOUND_NON_HOME.value, current_repo_id="r3"),
        binding("b", state=_S.UNBOUND.value, repo_id="", current_repo_id=""),
        binding("e", state=_S.SWITCH_PENDING.value, repo_id="r3", current_repo_id="r3"),
    ]
    async with factory.open() as store:
        for record in records:
            await store.worktrees.put(record)
        assert await _agents(store) == ["a", "b", "c", "d", "e"]
        assert await _agents(store, {"BIND_FAILED"}) == ["d"]
        assert await _agents(store, {"BOUND_HOME", "BOUND_NON_HOME"}) == ["a", "c"]
        # An empty set of states matches nothing; so do unknown spellings.
        assert await _agents(store, set()) == []
        assert await _agents(store, set(), repo="repo-1") == []
        assert await _agents(store, {"bound_home"}) == []
        # The repository matches the home or the current one, exactly.
        assert await _agents(store, repo="repo-1") == ["a", "c"]
        assert await _agents(store, repo="r3") == ["c", "e"]
        assert await _agents(store, repo="r2") == ["d"]
        assert await _agents(store, repo="R3") == []
        assert await _agents(store, {"SWITCH_PENDING"}, repo="r3") == ["e"]
        assert await _agents(store, {"BOUND_HOME"}, repo="r3") == []


@_check
async def bindings_keep_unicode_and_coerce_like_sql(factory: StoreFactory) -> None:
    record = binding(
        f"agent {UNICODE}",
        repo_id=UNICODE,
        worktree_id=UNICODE,
        note=UNICODE * 50,
        reason=UNICODE,
        attempts=_INT64_MAX,
        version=1,
    )
    async with factory.open() as store:
        await store.worktrees.put(record)
        assert await store.worktrees.get(f"agent {UNICODE}") == record
        assert await _agents(store, repo=UNICODE) == [f"agent {UNICODE}"]
        # What a caller may pass loosely comes back as the field's type, on every backend.
        loose = binding("agent-loose", state=_S.BOUND_HOME, retry_at=5, updated_at=1_700_000_000)
        await store.worktrees.put(loose)
        stored = await store.worktrees.get("agent-loose")
        assert stored is not None
        assert type(stored.state) is str
        assert stored.state == "BOUND_HOME"
        assert (type(stored.retry_at), type(stored.updated_at)) == (float, float)
        assert (stored.retry_at, stored.updated_at) == (5.0, 1_700_000_000.0)


@_check
async def bindings_that_do_not_fit_are_refused(factory: StoreFactory) -> None:
    bad_fields: list[dict[str, Any]] = [
        {"state": "NOT_A_STATE"},
        {"state": "bound_home"},
        {"version": 0},
        {"version": -1},
        {"attempts": 1 << 63},
    ]
    good = binding("agent-a")
    async with factory.open() as store:
        for fields in bad_fields:
            try:
                await store.worktrees.put(replace(good, **fields))
            except ValueError:
                pass
            else:
                raise AssertionError(f"a binding with {fields!r} was accepted")
        assert await store.worktrees.list() == []
        await store.worktrees.put(good)
        for fields in bad_fields:
            with contextlib.suppress(ValueError):
                await store.worktrees.put(replace(good, **{"note": "x", "version": 2, **fields}))
        assert await store.worktrees.list() == [good]


@_check
async def bindings_survive_closing_and_reopening(factory: StoreFactory) -> None:
    if not factory.durable:
        raise CheckNotApplicable(f"the {factory.backend} backend is not durable")
    failed = binding(
        "agent-a", state=_S.BIND_FAILED.value, reason="worktree_locked", attempts=2,
        retry_at=T0 + 2, recovery_at=T0 + 60, current_repo_id="", current_worktree_id="",
    )  # fmt: skip
    away = binding("agent-b", state=_S.BOUND_NON_HOME.value, expires_at=T0 + 900)
    async with factory.open() as store:
        await store.worktrees.put(failed)
        await store.worktrees.put(away)
        await store.worktrees.put(replace(away, note="renewed", version=2))
    async with factory.open() as store:
        assert await store.worktrees.list() == [failed, replace(away, note="renewed", version=2)]
        # The version guard holds across opens too.
        await _refused(store, replace(away, version=2))
        await store.worktrees.put(replace(away, version=3))
