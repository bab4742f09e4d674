"""Checks of the runtime store's agent tasks (`RuntimeStore` task methods, schema version 21):
a task with its runs and edges survives a restart, a retry's new run keeps the old one, an
unlinked edge is kept as removed, an idempotency key is stored once, with its write, and an
action is pending until it is resolved."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from apiary.core.runtime.actions import ActionRecord
from apiary.core.runtime.records import RuntimeWrite
from apiary.core.runtime.task_records import (
    CommandKeyRecord,
    RuntimeTaskRecord,
    TaskLinkRecord,
    TaskRunRecord,
)
from apiary.store.errors import StoreError
from apiary.store.protocols import Store
from apiary.testing.store_suite.base import T0, UNICODE, Check, StoreFactory, draft, registry

CHECKS: list[Check] = []
_check = registry(CHECKS)


def task(task_id: str, n: float = 0, **fields: Any) -> RuntimeTaskRecord:
    values: dict[str, Any] = {
        "task_id": task_id, "session_id": "s-1", "owner": "application:ci", "state": "draft",
        "created_at": T0 + n, "updated_at": T0 + n, "agent_id": "coder",
        "meta_json": f'{{"title": "{UNICODE}"}}', "input_json": '{"ask": 1}',
    }  # fmt: skip
    values.update(fields)
    return RuntimeTaskRecord(**values)


def run(run_id: str, task_id: str, attempt: int, **fields: Any) -> TaskRunRecord:
    values: dict[str, Any] = {
        "run_id": run_id, "task_id": task_id, "attempt": attempt, "state": "queued",
        "reason": "start", "created_at": T0 + attempt, "updated_at": T0 + attempt,
    }  # fmt: skip
    values.update(fields)
    return TaskRunRecord(**values)


def link(task_id: str, kind: str, target_id: str, n: float = 0) -> TaskLinkRecord:
    return TaskLinkRecord(task_id, kind, target_id, "active", T0 + n, T0 + n)


async def _fixture(store: Store) -> RuntimeWrite:
    write = RuntimeWrite(
        tasks=(
            task("a", 1, state="running", run_count=2, current_run_id="r-2"),
            task("b", 2), task("c", 3, state="completed"), task("z", 0, session_id="s-2"),
        ),
        runs=(run("r-1", "a", 1, state="failed", error_code="tool_failed"), run("r-2", "a", 2)),
        links=(link("b", "parent", "a", 1), link("c", "parent", "a", 2), link("b", "source", "x")),
    )  # fmt: skip
    await store.runtime.save(write)
    return write


@_check
async def runtime_tasks_runs_and_links_are_saved_and_read(factory: StoreFactory) -> None:
    async with factory.open() as store:
        write = await _fixture(store)
        runtime = store.runtime
        for record in write.tasks:
            assert await runtime.task(record.task_id) == record
        assert [t.task_id for t in await runtime.session_tasks("s-1")] == ["a", "b", "c"]
        assert [t.task_id for t in await runtime.session_tasks("s-1", 2)] == ["b", "c"]
        assert [t.task_id for t in await runtime.open_tasks()] == ["a"]
        assert await runtime.runs("a") == list(write.runs)
        assert await runtime.run("r-1") == write.runs[0]
        assert [(x.task_id, x.kind) for x in await runtime.links_to("a")] == [
            ("b", "parent"), ("c", "parent"),
        ]  # fmt: skip
        assert [x.target_id for x in await runtime.links("b")] == ["x", "a"]  # oldest first
        for missing in (runtime.task("x"), runtime.run("x"), runtime.command_key("o", "k")):
            assert await missing is None
        assert await runtime.runs("x") == [] and await runtime.links("x") == []


@_check
async def a_retry_adds_a_run_and_an_unlink_keeps_the_edge(factory: StoreFactory) -> None:
    async with factory.open() as store:
        write = await _fixture(store)
        retried = replace(write.tasks[0], state="queued", run_count=3, current_run_id="r-3")
        removed = replace(write.links[0], status="removed", updated_at=T0 + 9)
        await store.runtime.save(
            RuntimeWrite(tasks=(retried,), runs=(run("r-3", "a", 3),), links=(removed,))
        )
        assert [r.run_id for r in await store.runtime.runs("a")] == ["r-1", "r-2", "r-3"]
        assert await store.runtime.task("a") == retried
        assert (await store.runtime.links_to("a"))[0] == removed
        # A second run under the same attempt number is refused, with nothing written.
        try:
            await store.runtime.save(RuntimeWrite(runs=(run("r-4", "a", 3),)), [draft(1)])
        except StoreError:
            pass
        else:
            raise AssertionError("a second run took attempt 3")
        assert await store.runtime.run("r-4") is None


@_check
async def a_command_key_is_stored_once_with_its_write(factory: StoreFactory) -> None:
    async with factory.open() as store:
        key = CommandKeyRecord("application:ci", "k-1", "retry_task", "d1", '{"taskId": "a"}', T0)
        await store.runtime.save(RuntimeWrite(tasks=(task("a"),), keys=(key,)))
        assert await store.runtime.command_key("application:ci", "k-1") == key
        assert await store.runtime.command_key("application:other", "k-1") is None
        before = await store.events.last_sequence()
        again = replace(key, digest="d2")
        try:
            await store.runtime.save(
                RuntimeWrite(tasks=(task("a", state="queued"),), keys=(again,)), [draft(1)]
            )
        except StoreError:
            pass
        else:
            raise AssertionError("a key was stored twice")
        assert await store.runtime.command_key("application:ci", "k-1") == key
        assert (await store.runtime.task("a") or task("x")).state == "draft"
        assert await store.events.last_sequence() == before


@_check
async def runtime_task_records_that_do_not_fit_are_refused(factory: StoreFactory) -> None:
    async with factory.open() as store:
        bad = (
            RuntimeWrite(tasks=(task("x", state="lost-ish"),)),
            RuntimeWrite(tasks=(task("x", intent="stop"),)),
            RuntimeWrite(runs=(run("r", "x", 1, state="done"),)),
            RuntimeWrite(links=(replace(link("x", "friend", "y")),)),
            RuntimeWrite(tasks=(task("x", priority=1 << 63),)),
        )
        for write in bad:
            try:
                await store.runtime.save(write)
            except ValueError:
                continue
            raise AssertionError(f"{write} was stored")
        assert await store.runtime.task("x") is None


@_check
async def runtime_actions_are_pending_until_resolved(factory: StoreFactory) -> None:
    async with factory.open() as store:
        first = ActionRecord("a-1", "s-1", "pending", T0 + 1, T0 + 1, "t-1", "u-1", "task-u-1")
        second = ActionRecord("a-2", "s-1", "pending", T0 + 2, T0 + 2, task_id="x", run_id="r")
        await store.runtime.save(RuntimeWrite(actions=(second, first)))
        assert await store.runtime.open_actions() == [first, second]
        done = replace(first, state="resolved", updated_at=T0 + 5, decision="deny", via="deadline")
        await store.runtime.save(RuntimeWrite(actions=(done,)))
        assert await store.runtime.action("a-1") == done
        assert await store.runtime.open_actions() == [second]
        assert await store.runtime.action("x") is None
        try:
            await store.runtime.save(RuntimeWrite(actions=(replace(second, state="maybe"),)))
        except ValueError:
            pass
        else:
            raise AssertionError("an action state that is none was stored")


@_check
async def runtime_permissions_keep_their_kind_and_detail(factory: StoreFactory) -> None:
    async with factory.open() as store:
        permission = ActionRecord(
            "p-1", "s-1", "pending", T0 + 1, T0 + 1, "t-1", kind="permission",
            detail_json='{"request":{"toolName":"write_file"}}',
        )  # fmt: skip
        action = ActionRecord("a-1", "s-1", "pending", T0 + 2, T0 + 2, "t-1")
        await store.runtime.save(RuntimeWrite(actions=(permission, action)))
        assert await store.runtime.action("p-1") == permission
        assert (await store.runtime.action("a-1") or action).kind == "action"
        assert await store.runtime.open_actions() == [permission, action]
        try:
            await store.runtime.save(RuntimeWrite(actions=(replace(action, kind="wish"),)))
        except ValueError:
            pass
        else:
            raise AssertionError("an action kind that is none was stored")
