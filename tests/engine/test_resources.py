"""Resource tracking and cleanup (RFC 8.4) with real directories."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path
from typing import Any

import pytest

from apiary.core.events import EventFilter
from apiary.engine.eventlog import EventRecorder
from apiary.engine.resources import ReleaseFailure, ResourceKind, ResourceTracker
from apiary.errors import ValidationError
from apiary.store.memory.store import MemoryStore
from apiary.testing.clock import FakeClock

K = ResourceKind


def make(root: Path | None) -> tuple[ResourceTracker, EventRecorder]:
    events = EventRecorder(MemoryStore().events, FakeClock())
    return ResourceTracker(events, root), events


async def released_events(events: EventRecorder) -> list[dict[str, Any]]:
    where = EventFilter(event_types=frozenset({"agent.resources_released"}))
    return [dict(e.details) for e in await events.read(where=where)]


@pytest.mark.conformance(
    "lifecycle.cleanup.resource-kinds", "lifecycle.cleanup.resource-tracking",
    "lifecycle.cleanup.complete",
)  # fmt: skip
async def test_every_kind_is_released_newest_first_and_logged(tmp_path: Path) -> None:
    tracker, events = make(tmp_path)
    order: list[str] = []

    async def close() -> None:
        await asyncio.sleep(0)
        order.append("connection")

    temp = tracker.temp_dir("a")
    (temp / "scratch.bin").write_bytes(b"x" * 10)
    tracker.track("a", K.CONNECTION, "db:5432", close)
    tracker.track("a", K.LOCK, "repo.lock", lambda: order.append("lock"))
    tracker.track("a", K.OTHER, "gpu-slot-1", lambda: order.append("other"))
    tracker.track("b", K.LOCK, "b.lock", lambda: order.append("b"))
    assert tracker.held("a") == [
        (K.TEMP_FILE, str(temp)), (K.CONNECTION, "db:5432"), (K.LOCK, "repo.lock"),
        (K.OTHER, "gpu-slot-1"),
    ]  # fmt: skip
    report = await tracker.release_all("a", "shutdown_complete")
    assert order == ["other", "lock", "connection"]
    assert not temp.exists() and not temp.parent.exists()
    assert report.complete and len(report.released) == 4
    assert tracker.held("a") == [] and tracker.held("b") == [(K.LOCK, "b.lock")]
    (event,) = await released_events(events)
    assert event["reason"] == "shutdown_complete" and event["failures"] == []
    assert {r["kind"] for r in event["released"]} == {"TEMP_FILE", "CONNECTION", "LOCK", "OTHER"}


@pytest.mark.conformance("lifecycle.cleanup.complete")
async def test_a_failing_release_is_reported_and_does_not_stop_the_others(tmp_path: Path) -> None:
    tracker, events = make(tmp_path)
    released: list[str] = []

    def broken() -> None:
        raise OSError("connection reset")

    tracker.track("a", K.LOCK, "first", lambda: released.append("first"))
    tracker.track("a", K.CONNECTION, "flaky", broken)
    tracker.track("a", K.LOCK, "last", lambda: released.append("last"))
    report = await tracker.release_all("a", "agent_shutdown_timeout")
    assert released == ["last", "first"]
    assert report.failures == (ReleaseFailure(K.CONNECTION, "flaky", "OSError: connection reset"),)
    assert not report.complete
    assert tracker.held("a") == []  # forgotten: a failed release is not retried for ever
    (event,) = await released_events(events)
    assert event["failures"] == [
        {"kind": "CONNECTION", "name": "flaky", "error": "OSError: connection reset"}
    ]
    assert [r["name"] for r in event["released"]] == ["last", "first"]


async def test_releasing_nothing_is_still_logged(tmp_path: Path) -> None:
    tracker, events = make(tmp_path)
    report = await tracker.release_all("nobody", "deregistered")
    assert report.released == () and report.complete
    assert (await released_events(events))[0]["released"] == []


async def test_an_untracked_resource_is_not_released(tmp_path: Path) -> None:
    tracker, _ = make(tmp_path)
    released: list[str] = []
    handle = tracker.track("a", K.LOCK, "l", lambda: released.append("l"))
    assert tracker.untrack(handle)
    assert not tracker.untrack(handle)
    await tracker.release_all("a", "deregistered")
    assert released == []


async def test_a_cancelled_release_leaves_the_rest_tracked(tmp_path: Path) -> None:
    tracker, _ = make(tmp_path)
    gate = asyncio.Event()

    async def slow() -> None:
        await gate.wait()

    tracker.track("a", K.LOCK, "old", lambda: None)
    tracker.track("a", K.CONNECTION, "slow", slow)
    releasing = asyncio.create_task(tracker.release_all("a", "shutdown_complete"))
    await asyncio.sleep(0)
    releasing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await releasing
    assert tracker.held("a") == [(K.LOCK, "old"), (K.CONNECTION, "slow")]


async def test_the_temp_dir_is_private_created_once_and_new_after_release(tmp_path: Path) -> None:
    tracker, _ = make(tmp_path)
    path = tracker.temp_dir("agent-1")
    assert path == tmp_path / "agent-1" / "tmp" and path.is_dir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert tracker.temp_dir("agent-1") == path
    assert tracker.held("agent-1") == [(K.TEMP_FILE, str(path))]  # tracked once
    await tracker.release_all("agent-1", "deregistered")
    assert not path.exists()
    assert tracker.temp_dir("agent-1") == path and path.is_dir()
    assert tracker.held("agent-1") == [(K.TEMP_FILE, str(path))]


async def test_the_agents_directory_stays_when_something_else_lives_there(tmp_path: Path) -> None:
    tracker, _ = make(tmp_path)
    path = tracker.temp_dir("a")
    (path.parent / "keep.json").write_text("{}")
    await tracker.release_all("a", "deregistered")
    assert not path.exists() and (path.parent / "keep.json").exists()


@pytest.mark.parametrize("agent_id", ["", ".", "..", "../x", "a/b", "/etc", "a\\b", "a\x00b"])
def test_agent_ids_that_would_leave_their_directory_are_refused(
    tmp_path: Path, agent_id: str
) -> None:
    tracker, _ = make(tmp_path / "agents")
    with pytest.raises(ValidationError) as raised:
        tracker.temp_dir(agent_id)
    assert raised.value.details["field"] == "agent_id"
    assert not (tmp_path / "agents").exists()
    assert tracker.held(agent_id) == []


def test_a_symlinked_agent_directory_cannot_lead_outside(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "a").symlink_to(outside)
    tracker, _ = make(tmp_path / "agents")
    with pytest.raises(ValidationError):
        tracker.temp_dir("a")
    assert list(outside.iterdir()) == []


def test_without_a_data_directory_there_are_no_temp_dirs() -> None:
    tracker, _ = make(None)
    with pytest.raises(RuntimeError, match="no data directory"):
        tracker.temp_dir("a")
