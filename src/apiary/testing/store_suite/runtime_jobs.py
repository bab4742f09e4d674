"""Checks of the runtime store's jobs (`RuntimeStore` job methods, schema version 25): a job
is saved with its items and their tasks in one write and read back (its items in order, each
with its task as it stands), a session's jobs and a task's child jobs not ended are found,
a task is the item of one job at most, and a job whose state is none is refused."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from apiary.core.runtime.jobs import JobItemRecord, JobRecord
from apiary.core.runtime.records import RuntimeWrite
from apiary.store.errors import StoreError
from apiary.store.protocols import Store
from apiary.testing.store_suite.base import T0, UNICODE, Check, StoreFactory, draft, registry
from apiary.testing.store_suite.runtime_tasks import task

CHECKS: list[Check] = []
_check = registry(CHECKS)


def job(job_id: str, n: float = 0, **fields: Any) -> JobRecord:
    values: dict[str, Any] = {
        "job_id": job_id, "session_id": "s-1", "owner": "application:ci", "state": "queued",
        "created_at": T0 + n, "updated_at": T0 + n, "item_count": 2,
        "counts_json": '{"queued":2}', "meta_json": f'{{"title": "{UNICODE}"}}',
    }  # fmt: skip
    values.update(fields)
    return JobRecord(**values)


async def _fixture(store: Store) -> RuntimeWrite:
    write = RuntimeWrite(
        tasks=(task("b", 1, state="queued"), task("a", 2, state="queued"), task("c", 3)),
        jobs=(job("j-1", 1, parent_task_id="c"), job("j-2", 2, session_id="s-2", item_count=0,
                                                     counts_json="{}")),
        job_items=(JobItemRecord("j-1", 0, "b", T0), JobItemRecord("j-1", 1, "a", T0)),
    )  # fmt: skip
    await store.runtime.save(write, [draft(1)])
    return write


@_check
async def runtime_jobs_and_their_items_are_saved_and_read(factory: StoreFactory) -> None:
    async with factory.open() as store:
        write = await _fixture(store)
        runtime = store.runtime
        assert await runtime.job("j-1") == write.jobs[0]
        items = await runtime.job_items("j-1")
        assert [(i.ordinal, t.task_id, t.state) for i, t in items] == [
            (0, "b", "queued"), (1, "a", "queued"),
        ]  # fmt: skip
        assert await runtime.job_item_of("a") == write.job_items[1]
        assert [j.job_id for j in await runtime.session_jobs("s-1")] == ["j-1"]
        assert [j.job_id for j in await runtime.child_jobs("c")] == ["j-1"]
        # An item's task moves on its own; the job's items show it as it stands.
        await store.runtime.save(RuntimeWrite(tasks=(task("a", 2, state="completed"),)))
        assert [t.state for _, t in await runtime.job_items("j-1")] == ["queued", "completed"]
        ended = replace(write.jobs[0], state="cancelled", intent="cancel", ended_at=T0 + 9)
        await store.runtime.save(RuntimeWrite(jobs=(ended,)))
        assert await runtime.job("j-1") == ended
        assert await runtime.child_jobs("c") == []  # ended: nothing left to cancel
        for missing in (runtime.job("x"), runtime.job_item_of("c")):
            assert await missing is None
        assert await runtime.job_items("x") == [] and await runtime.session_jobs("s-9") == []


@_check
async def a_task_is_the_item_of_one_job_at_most(factory: StoreFactory) -> None:
    async with factory.open() as store:
        await _fixture(store)
        before = await store.events.last_sequence()
        for item in (JobItemRecord("j-2", 0, "a", T0), JobItemRecord("j-1", 1, "c", T0)):
            try:
                await store.runtime.save(
                    RuntimeWrite(jobs=(job("j-3"),), job_items=(item,)), [draft(2)]
                )
            except StoreError:
                continue
            raise AssertionError(f"{item} was stored")
        assert await store.runtime.job("j-3") is None
        assert await store.runtime.job_item_of("c") is None
        assert await store.events.last_sequence() == before


@_check
async def runtime_job_records_that_do_not_fit_are_refused(factory: StoreFactory) -> None:
    async with factory.open() as store:
        for bad in (job("x", state="done-ish"), job("x", item_count=1 << 63)):
            try:
                await store.runtime.save(RuntimeWrite(jobs=(bad,)))
            except ValueError:
                continue
            raise AssertionError(f"{bad} was stored")
        assert await store.runtime.job("x") is None
