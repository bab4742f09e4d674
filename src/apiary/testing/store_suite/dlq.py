"""Checks of the dead letter queue (`DlqStore`)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from apiary.core.records import DlqFilter
from apiary.store.protocols import Store
from apiary.testing.store_suite.base import (
    T0,
    UNICODE,
    Check,
    StoreFactory,
    dlq_entry,
    registry,
)

CHECKS: list[Check] = []
_check = registry(CHECKS)


async def _entry_ids(
    store: Store, where: DlqFilter | None = None, after_id: int = 0, limit: int = 100
) -> list[int]:
    return [e.entry_id for e in await store.dlq.list(where, after_id=after_id, limit=limit)]


@_check
async def dlq_numbers_entries_from_one(factory: StoreFactory) -> None:
    async with factory.open() as store:
        assert await store.dlq.list() == []
        assert await store.dlq.get(1) is None
        first = await store.dlq.add(dlq_entry("m-1", entry_id=77))
        second = await store.dlq.add(dlq_entry("m-2"))
        assert (first.entry_id, second.entry_id) == (1, 2)
        assert first == dlq_entry("m-1", entry_id=1)
        assert await store.dlq.get(1) == first
        assert await store.dlq.get(2) == second
        assert await store.dlq.get(3) is None
        assert await store.dlq.list() == [first, second]


@_check
async def dlq_entry_ids_only_grow(factory: StoreFactory) -> None:
    async with factory.open() as store:
        for i in range(3):
            await store.dlq.add(dlq_entry(f"m-{i}"))
        assert await store.dlq.purge(T0 + 1000) == 3
        assert await store.dlq.list() == []
        # Purging the newest entries must not let their ids be handed out again.
        later = await store.dlq.add(dlq_entry("m-3"))
        assert later.entry_id > 3
        again = await store.dlq.add(dlq_entry("m-4"))
        assert again.entry_id > later.entry_id


@_check
async def dlq_list_pages_by_after_id_and_limit(factory: StoreFactory) -> None:
    async with factory.open() as store:
        for i in range(1, 26):
            await store.dlq.add(dlq_entry(f"m-{i}"))
        pages: list[list[int]] = []
        after = 0
        while page := await _entry_ids(store, after_id=after, limit=10):
            pages.append(page)
            after = page[-1]
        assert pages == [list(range(1, 11)), list(range(11, 21)), list(range(21, 26))]
        assert await _entry_ids(store, limit=0) == []
        assert await _entry_ids(store, after_id=25) == []
        assert len(await store.dlq.list()) == 25
        try:
            await store.dlq.list(limit=-1)
        except ValueError:
            pass
        else:
            raise AssertionError("dlq.list(limit=-1) did not raise ValueError")


async def _filter_fixture(store: Store) -> None:
    entries = [
        dlq_entry("m-1", failed_at=T0 + 1, error_code="ack_timeout", recipient="b"),
        dlq_entry("m-2", failed_at=T0 + 2, error_code="ttl_expired", recipient="c"),
        dlq_entry("m-3", failed_at=T0 + 3, error_code="ack_timeout", producer_id="p-2"),
        dlq_entry("m-4", failed_at=T0 + 4, error_code="ack_timeout", recipient="b"),
        dlq_entry("m-5", failed_at=T0 + 5, error_code="buffer_full", recipient="c"),
        dlq_entry("m-6", failed_at=T0 + 6, error_code="ack_timeout", recipient="b"),
    ]
    for entry in entries:
        await store.dlq.add(entry)
    await store.dlq.mark_requeued(4, T0 + 10, "m-4-requeued")


@_check
async def dlq_filters_by_each_field(factory: StoreFactory) -> None:
    async with factory.open() as store:
        await _filter_fixture(store)
        assert await _entry_ids(store, DlqFilter()) == [1, 2, 3, 4, 5, 6]
        # since and until are inclusive bounds on failed_at.
        assert await _entry_ids(store, DlqFilter(since=T0 + 3)) == [3, 4, 5, 6]
        assert await _entry_ids(store, DlqFilter(until=T0 + 3)) == [1, 2, 3]
        assert await _entry_ids(store, DlqFilter(since=T0 + 2, until=T0 + 4)) == [2, 3, 4]
        assert await _entry_ids(store, DlqFilter(since=T0 + 4, until=T0 + 2)) == []
        assert await _entry_ids(store, DlqFilter(error_code="ack_timeout")) == [1, 3, 4, 6]
        assert await _entry_ids(store, DlqFilter(error_code="no_route")) == []
        assert await _entry_ids(store, DlqFilter(recipient="c")) == [2, 5]
        assert await _entry_ids(store, DlqFilter(producer_id="p-2")) == [3]
        assert await _entry_ids(store, DlqFilter(producer_id="agent-a")) == [1, 2, 4, 5, 6]
        assert await _entry_ids(store, DlqFilter(include_requeued=False)) == [1, 2, 3, 5, 6]


@_check
async def dlq_filters_combine_with_paging(factory: StoreFactory) -> None:
    async with factory.open() as store:
        await _filter_fixture(store)
        where = DlqFilter(error_code="ack_timeout", recipient="b")
        assert await _entry_ids(store, where) == [1, 4, 6]
        assert await _entry_ids(store, replace(where, include_requeued=False)) == [1, 6]
        assert await _entry_ids(store, replace(where, since=T0 + 2, until=T0 + 5)) == [4]
        # `limit` counts matching entries, `after_id` is an id of the whole queue.
        assert await _entry_ids(store, where, limit=2) == [1, 4]
        assert await _entry_ids(store, where, after_id=1, limit=1) == [4]
        assert await _entry_ids(store, where, after_id=4) == [6]
        everything = DlqFilter(
            since=T0, until=T0 + 6, error_code="ack_timeout", recipient="b", producer_id="agent-a"
        )
        assert await _entry_ids(store, replace(everything, include_requeued=False)) == [1, 6]


@_check
async def requeueing_marks_the_entry(factory: StoreFactory) -> None:
    async with factory.open() as store:
        added = await store.dlq.add(dlq_entry("m-1"))
        other = await store.dlq.add(dlq_entry("m-2"))
        marked = await store.dlq.mark_requeued(added.entry_id, T0 + 60, "m-1-again")
        assert marked == replace(added, requeued_at=T0 + 60, requeued_as="m-1-again")
        assert await store.dlq.get(added.entry_id) == marked
        assert await store.dlq.get(other.entry_id) == other
        # Requeued a second time: the latest copy is recorded.
        again = await store.dlq.mark_requeued(added.entry_id, T0 + 90, "m-1-third")
        assert (again.requeued_at, again.requeued_as) == (T0 + 90, "m-1-third")
        try:
            await store.dlq.mark_requeued(999, T0 + 60, "x")
        except LookupError:
            pass
        else:
            raise AssertionError("mark_requeued of an unknown entry did not raise LookupError")
        assert await store.dlq.list() == [again, other]


@_check
async def dlq_purge_removes_entries_that_failed_before(factory: StoreFactory) -> None:
    async with factory.open() as store:
        for i in range(5):
            await store.dlq.add(dlq_entry(f"m-{i}", failed_at=T0 + i))
        assert await store.dlq.purge(T0) == 0
        assert await store.dlq.purge(T0 + 3) == 3  # strictly before: T0 + 3 stays
        assert await _entry_ids(store) == [4, 5]
        assert await store.dlq.get(1) is None
        assert await store.dlq.purge(T0 + 3) == 0


@_check
async def dlq_entries_keep_unicode_json_and_large_envelopes(factory: StoreFactory) -> None:
    envelope = bytes(range(256)) * (64 * 1024)  # 16 MiB, every byte value
    attempts: tuple[dict[str, Any], ...] = (
        {"at": T0, "what": "sent", "reason": UNICODE, "nested": {"list": [1, 2.5, None, True]}},
        {"at": T0 + 1, "what": UNICODE, "big": 2**53 + 1},
    )
    entry = dlq_entry(
        f"m {UNICODE}",
        producer_id=f"p {UNICODE}",
        recipient=f"r {UNICODE}",
        reason=UNICODE,
        route=f"a -> {UNICODE} -> b",
        envelope=envelope,
        payload_size=len(envelope),
        attempts=attempts,
        signature=bytes(range(64)) + b"\x00origin\xff",  # a signature and its origin
    )
    async with factory.open() as store:
        added = await store.dlq.add(entry)
        assert added == replace(entry, entry_id=1)
        stored = await store.dlq.get(1)
        assert stored == added
        assert stored is not None
        assert stored.envelope == envelope
        assert stored.signature == entry.signature
        assert [dict(a) for a in stored.attempts] == list(attempts)
        (listed,) = await store.dlq.list(DlqFilter(recipient=f"r {UNICODE}"))
        assert listed == added
        assert await store.dlq.list(DlqFilter(producer_id=f"p {UNICODE}")) == [added]


@_check
async def dlq_attempts_that_are_not_json_objects_are_refused(factory: StoreFactory) -> None:
    bad_attempts: list[Any] = [
        ("not an object",),
        ({"at": math.nan},),
        ({"x": object()},),
        ({"x": b"bytes"},),
        ({"x": "\ud800"},),
    ]
    async with factory.open() as store:
        for bad in bad_attempts:
            try:
                await store.dlq.add(dlq_entry("m-1", attempts=bad))
            except ValueError:
                pass
            else:
                raise AssertionError(f"attempts {bad!r} were accepted")
        assert await store.dlq.list() == []
        # Nothing was added, so no id was used up.
        assert (await store.dlq.add(dlq_entry("m-2"))).entry_id == 1
