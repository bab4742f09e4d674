"""One live stream per agent across replicas (docs/cluster.md, "One stream per agent"): two
coordinators serving one PostgreSQL schema. A newer stream of an agent opened on the other
replica by the agent itself supersedes the older one, which ends there as it would on one
coordinator; one that did not prove it is the agent is refused while the older one is live,
and opens once it ended; two opened at once on the two replicas leave one live stream, the
one the store's holder row names; a replica that missed the note ends its superseded
stream at its next poll."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest

from apiary.engine.router.inbox import Handout
from apiary.errors import AgentUnavailableError, AlreadyInProgressError
from apiary.server.coordinator import Coordinator
from apiary.store.postgres.cluster_streams import PostgresStreamHolders
from apiary.store.postgres.store import PostgresStore
from tests.server.test_cluster_replicas import (
    Reader,
    _read,
    _register,
    _send,
    _stop,
    _two,
    _until,
)

pytestmark = pytest.mark.postgres


def _ended(reader: Reader) -> BaseException | None:
    """What ended the reader's stream (None while it runs)."""
    task = reader.task
    assert task is not None
    if not task.done():
        return None
    return task.exception() if not task.cancelled() else asyncio.CancelledError()


async def _holder(replica: Coordinator, agent_id: str) -> str:
    assert isinstance(replica.store, PostgresStore)
    rows = await PostgresStreamHolders(replica.store.pool).holders([agent_id])
    return rows[agent_id].replica_id if agent_id in rows else ""


async def test_a_newer_stream_on_the_other_replica_supersedes_the_older_one(
    tmp_path: Path, url: str
) -> None:
    async with _two(tmp_path, url) as (a, b):
        await _register(a, "bob")
        await _register(a, "alice")
        old = _read(a, "bob")
        await _until(lambda: a.router.streaming("bob"), "bob streams on A")
        sent = await _send(a, "alice", "bob", {"n": 1})
        await _until(lambda: len(old.messages) == 1, "bob's stream on A receives the first")
        assert await _holder(a, "bob") == "a"

        new = _read(b, "bob")  # the agent itself (take over), on B
        await _until(lambda: _ended(old) is not None, "the older stream, on A, ends")
        assert isinstance(_ended(old), AgentUnavailableError)
        assert "superseded" in str(_ended(old))
        await _until(lambda: not a.router.streaming("bob"), "A no longer streams bob")
        assert await _holder(b, "bob") == "b"

        # The newer stream is the agent's: it is handed what A held unacknowledged, and
        # what comes next, whichever replica admits it.
        later = await _send(a, "alice", "bob", {"n": 2})
        await _until(lambda: len(new.messages) == 2, "bob's stream on B receives both")
        assert [m.message_id for m in new.messages] == [sent, later]
        assert _ended(new) is None
        await _stop(new)
        await _until(lambda: not b.router.streaming("bob"), "B's stream ended")
        await _until(lambda: b.cluster is not None and not b.cluster.follower.following("bob"),
                     "B lets bob go")  # fmt: skip
        assert await _holder(b, "bob") == ""


async def test_a_stream_not_proved_is_refused_while_another_replicas_is_live(
    tmp_path: Path, url: str
) -> None:
    async with _two(tmp_path, url) as (a, b):
        await _register(a, "bob")
        live = _read(a, "bob")
        await _until(lambda: a.router.streaming("bob"), "bob streams on A")

        stream: AsyncGenerator[list[Handout], None] = b.delivery.stream("bob", take_over=False)
        with pytest.raises(AlreadyInProgressError) as refused:
            await anext(stream)
        assert refused.value.details["reason"] == "stream_live"
        assert refused.value.details["replica"] == "a"
        assert _ended(live) is None and a.router.streaming("bob")
        assert not b.router.streaming("bob")

        # Once A's stream ended, a stream on B opens without proof, as on one coordinator.
        await _stop(live)
        second = b.delivery.stream("bob", take_over=False)
        first = asyncio.create_task(anext(second))
        await _until(lambda: b.router.streaming("bob"), "bob's second stream opens on B")
        assert await _holder(b, "bob") == "b"
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        await second.aclose()


async def test_two_streams_of_one_agent_opened_at_once_on_both_replicas_leave_one(
    tmp_path: Path, url: str
) -> None:
    async with _two(tmp_path, url) as (a, b):
        await _register(a, "bob")
        await _register(a, "alice")
        await _until(lambda: b.registry.known("bob") is not None, "B knows bob")
        on_a, on_b = _read(a, "bob"), _read(b, "bob")
        await _until(
            lambda: (_ended(on_a) is None) != (_ended(on_b) is None),
            "exactly one of the two streams ends",
        )
        survivor, loser = (on_a, on_b) if _ended(on_b) is not None else (on_b, on_a)
        home, gone = (a, b) if survivor is on_a else (b, a)
        assert isinstance(_ended(loser), AgentUnavailableError)
        assert await _holder(a, "bob") == ("a" if home is a else "b")
        await _until(lambda: not gone.router.streaming("bob"), "the loser's replica lets go")
        sent = await _send(gone, "alice", "bob", {"n": 1})
        await _until(lambda: len(survivor.messages) == 1, "the live stream receives it")
        assert survivor.messages[0].message_id == sent
        assert _ended(survivor) is None
        await _stop(survivor)


async def test_a_superseded_replica_that_missed_the_note_ends_its_stream_at_its_next_poll(
    tmp_path: Path, url: str
) -> None:
    """The note is a hint, the poll the guarantee: with A not listening, bob's newer stream
    on B still ends his older one on A, at A's next full poll."""
    async with _two(tmp_path, url) as (a, b):
        assert a.cluster is not None
        (listening,) = [t for t in a.cluster.tasks if t.get_name().endswith("-listen")]
        listening.cancel()
        await _register(a, "bob")
        old = _read(a, "bob")
        await _until(lambda: a.router.streaming("bob"), "bob streams on A")
        new = _read(b, "bob")
        await _until(lambda: _ended(old) is not None, "the older stream, on A, ends")
        assert isinstance(_ended(old), AgentUnavailableError)
        assert _ended(new) is None and await _holder(a, "bob") == "b"
        await _stop(new)
