"""Checks of the runtime control-plane store (`RuntimeStore`): what the control plane relies
on to keep sessions, thread queues and turns across a restart, and to commit each change
with its events."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from apiary.core.events import EventFilter
from apiary.core.runtime.records import (
    ChannelRecord,
    RuntimeWrite,
    SessionRecord,
    ThreadRecord,
    TurnRecord,
)
from apiary.store.errors import StoreError
from apiary.store.protocols import Store
from apiary.testing.store_suite.base import (
    T0,
    UNICODE,
    Check,
    CheckNotApplicable,
    StoreFactory,
    draft,
    registry,
)

CHECKS: list[Check] = []
_check = registry(CHECKS)

_INT64_MAX = (1 << 63) - 1


def session(session_id: str = "s-1", **fields: Any) -> SessionRecord:
    values: dict[str, Any] = {
        "session_id": session_id, "owner": "application:ci", "created_at": T0,
        "updated_at": T0, "workspace_id": "ws", "title": "a session",
    }  # fmt: skip
    values.update(fields)
    return SessionRecord(**values)


def thread(thread_id: str = "t-1", n: float = 0, **fields: Any) -> ThreadRecord:
    values: dict[str, Any] = {
        "thread_id": thread_id, "session_id": "s-1", "agent_id": "coder",
        "scope": f"resource:thread/{thread_id}", "queue_policy": "queue", "status": "idle",
        "created_at": T0 + n, "updated_at": T0 + n,
    }  # fmt: skip
    values.update(fields)
    return ThreadRecord(**values)


def turn(turn_id: str, ordinal: int, **fields: Any) -> TurnRecord:
    values: dict[str, Any] = {
        "turn_id": turn_id, "session_id": "s-1", "thread_id": "t-1", "ordinal": ordinal,
        "state": "queued", "input_json": f'{{"say": "{turn_id}"}}', "task_id": f"task-{turn_id}",
        "created_at": T0 + ordinal, "updated_at": T0 + ordinal, "priority": -ordinal,
    }  # fmt: skip
    values.update(fields)
    return TurnRecord(**values)


def channel(channel_id: str = "c-1", **fields: Any) -> ChannelRecord:
    values: dict[str, Any] = {
        "channel_id": channel_id, "session_id": "s-1", "owner": "application:ci",
        "token_digest": "ab" * 32, "acked_sequence": 7, "created_at": T0,
        "updated_at": T0 + 1, "expires_at": T0 + 86_400,
    }  # fmt: skip
    values.update(fields)
    return ChannelRecord(**values)


async def _fixture(store: Store) -> RuntimeWrite:
    write = RuntimeWrite(
        sessions=(session(),),
        threads=(
            thread("t-2", 5, agent_id="", capability="review"), thread("t-1", 1),
            thread("t-other", 0, session_id="s-2"),
        ),
        turns=(
            turn("u-0", 0, state="completed", result_json='{"answer": 42}', ended_at=T0 + 3,
                 agent_id="coder"),
            turn("u-1", 1, state="running", started_at=T0 + 4),
            turn("u-2", 2), turn("u-3", 3),
            turn("v-0", 0, thread_id="t-2", state="preparing"),
        ),
        channels=(channel(),),
    )  # fmt: skip
    await store.runtime.save(write)
    return write


async def _turn_ids(
    store: Store, thread_id: str | None = None, last: int | None = None
) -> list[str]:
    if last is None:
        return [t.turn_id for t in await store.runtime.open_turns(thread_id)]
    assert thread_id is not None
    return [t.turn_id for t in await store.runtime.turns(thread_id, last)]


@_check
async def runtime_records_are_saved_and_read(factory: StoreFactory) -> None:
    async with factory.open() as store:
        write = await _fixture(store)
        runtime = store.runtime
        assert await runtime.session("s-1") == write.sessions[0]
        assert await runtime.thread("t-1") == write.threads[1]
        assert await runtime.thread("t-2") == write.threads[0]  # bound to a capability
        assert [t.thread_id for t in await runtime.threads("s-1")] == ["t-1", "t-2"]
        assert await runtime.threads("s-none") == []
        for record in write.turns:
            assert await runtime.turn(record.turn_id) == record
            assert await runtime.turn_of_task(record.task_id) == record
        assert await runtime.channel("c-1") == write.channels[0]
        for missing in (
            runtime.session("x"), runtime.thread("x"), runtime.turn("x"),
            runtime.turn_of_task("x"), runtime.channel("x"),
        ):  # fmt: skip
            assert await missing is None


@_check
async def runtime_turns_are_listed_in_their_threads_order(factory: StoreFactory) -> None:
    async with factory.open() as store:
        await _fixture(store)
        assert await _turn_ids(store, "t-1", 100) == ["u-0", "u-1", "u-2", "u-3"]
        assert await _turn_ids(store, "t-1", 2) == ["u-2", "u-3"]
        assert await _turn_ids(store, "t-1", 0) == []
        assert await _turn_ids(store) == ["u-1", "u-2", "u-3", "v-0"]
        assert await _turn_ids(store, "t-1") == ["u-1", "u-2", "u-3"]
        assert await _turn_ids(store, "t-none") == []


@_check
async def open_turns_follow_their_queue_rank_then_their_ordinal(factory: StoreFactory) -> None:
    """A promoted turn (a lower queue_rank) is ahead in its thread's queue; turns keep their
    ordinal (history order), and a resumed turn names the turn it runs again."""
    async with factory.open() as store:
        write = await _fixture(store)
        u1, u2, u3 = write.turns[1:4]
        promoted = (replace(u3, queue_rank=-2), replace(u2, queue_rank=-1, resumed_from="u-0"))
        await store.runtime.save(RuntimeWrite(turns=promoted))
        assert await _turn_ids(store, "t-1") == ["u-3", "u-2", "u-1"]
        assert await _turn_ids(store, "t-1", 100) == ["u-0", "u-1", "u-2", "u-3"]
        assert await store.runtime.turn("u-2") == promoted[1]
        late = turn("u-4", 4)
        await store.runtime.save(RuntimeWrite(turns=(late,)))
        assert await _turn_ids(store, "t-1") == ["u-3", "u-2", "u-1", "u-4"]
        assert u1.queue_rank == 0 and (await store.runtime.turn("u-1")) == u1


@_check
async def a_runtime_save_replaces_records_whole(factory: StoreFactory) -> None:
    async with factory.open() as store:
        write = await _fixture(store)
        ended = replace(
            write.turns[1], state="cancelled", interrupt="stop it", ended_at=T0 + 9,
            error_code="cancelled", message=UNICODE, status_reason="interrupted",
        )  # fmt: skip
        moved = replace(write.threads[1], active_turn_id="", status="cancelled", turn_count=4)
        acked = replace(write.channels[0], acked_sequence=_INT64_MAX, expires_at=T0 + 99)
        await store.runtime.save(RuntimeWrite(threads=(moved,), turns=(ended,), channels=(acked,)))
        assert await store.runtime.turn("u-1") == ended
        assert await store.runtime.thread("t-1") == moved
        assert await store.runtime.channel("c-1") == acked
        assert await store.runtime.session("s-1") == write.sessions[0]  # untouched
        assert await _turn_ids(store, "t-1") == ["u-2", "u-3"]


@_check
async def a_runtime_save_commits_with_its_events(factory: StoreFactory) -> None:
    async with factory.open() as store:
        events = [draft(1, event_type="runtime.turn.submitted", correlation_id="s-1"), draft(2)]
        await store.runtime.save(RuntimeWrite(sessions=(session(),)), events)
        found = await store.events.read(where=EventFilter(correlation_id="s-1"))
        assert [e.event_type for e in found] == ["runtime.turn.submitted"]
        assert await store.events.last_sequence() == 2


@_check
async def a_turn_that_takes_another_turns_place_or_task_is_refused(factory: StoreFactory) -> None:
    async with factory.open() as store:
        write = await _fixture(store)
        before = await store.events.last_sequence()
        clashes = (
            turn("w-1", 2),  # u-2's place in t-1
            turn("w-2", 9, task_id="task-u-3"),  # u-3's task
        )
        for clash in clashes:
            newer = replace(write.sessions[0], title="changed")
            try:
                await store.runtime.save(
                    RuntimeWrite(sessions=(newer,), turns=(clash,)), [draft(1)]
                )
            except StoreError:
                pass
            else:
                raise AssertionError(f"{clash.turn_id} was stored over another turn")
            assert await store.runtime.turn(clash.turn_id) is None
            assert await store.runtime.session("s-1") == write.sessions[0]
            assert await store.events.last_sequence() == before
        # The same turn may keep its place and task, and move to a free place.
        await store.runtime.save(RuntimeWrite(turns=(replace(write.turns[2], ordinal=10),)))
        assert await _turn_ids(store, "t-1", 100) == ["u-0", "u-1", "u-3", "u-2"]


@_check
async def runtime_records_that_do_not_fit_are_refused(factory: StoreFactory) -> None:
    async with factory.open() as store:
        bad = (
            RuntimeWrite(turns=(turn("x-1", 1, state="lost"),)),
            RuntimeWrite(turns=(turn("x-2", 1 << 63),)),
            RuntimeWrite(threads=(thread("t-x", queue_policy="drop"),)),
            RuntimeWrite(threads=(thread("t-y", status="busy"),)),
        )
        for write in bad:
            try:
                await store.runtime.save(write)
            except ValueError:
                continue
            raise AssertionError(f"{write} was stored")
        assert await store.runtime.open_turns() == []
        assert await store.runtime.thread("t-x") is None


@_check
async def runtime_records_survive_closing_and_reopening(factory: StoreFactory) -> None:
    if not factory.durable:
        raise CheckNotApplicable("the memory backend keeps nothing across opens")
    async with factory.open() as store:
        write = await _fixture(store)
    async with factory.open() as store:
        assert await store.runtime.session("s-1") == write.sessions[0]
        assert [t.turn_id for t in await store.runtime.turns("t-1")] == ["u-0", "u-1", "u-2", "u-3"]
        assert await _turn_ids(store) == ["u-1", "u-2", "u-3", "v-0"]
        assert await store.runtime.channel("c-1") == write.channels[0]
