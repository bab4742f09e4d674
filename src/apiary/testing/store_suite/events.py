"""Checks of the event log (`EventLog`)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from apiary.core.events import Event, EventDraft, EventFilter
from apiary.store.protocols import Store
from apiary.testing.store_suite.base import T0, Check, StoreFactory, draft, registry

CHECKS: list[Check] = []
_check = registry(CHECKS)


def _fields(event: Event) -> tuple[Any, ...]:
    return (
        event.event_type,
        event.actor,
        event.ts,
        event.correlation_id,
        event.agent_id,
        dict(event.details),
        event.hlc,
    )


def _draft_fields(d: EventDraft) -> tuple[Any, ...]:
    return (d.event_type, d.actor, d.ts, d.correlation_id, d.agent_id, dict(d.details), d.hlc)


@_check
async def empty_log_has_no_events(factory: StoreFactory) -> None:
    async with factory.open() as store:
        assert await store.events.last_sequence() == 0
        assert await store.events.read() == []
        assert await store.events.append([]) == []
        assert await store.events.last_sequence() == 0


@_check
async def append_numbers_events_from_one_and_keeps_every_field(factory: StoreFactory) -> None:
    drafts = [
        draft(1, correlation_id="c-1", agent_id="a-1", hlc="0001:0", details={"k": [1, 2]}),
        draft(2, event_type="other.event", actor="engine"),
    ]
    async with factory.open() as store:
        appended = await store.events.append(drafts)
        assert [e.sequence for e in appended] == [1, 2]
        assert [_fields(e) for e in appended] == [_draft_fields(d) for d in drafts]
        read = await store.events.read()
        assert [e.sequence for e in read] == [1, 2]
        assert [_fields(e) for e in read] == [_draft_fields(d) for d in drafts]
        assert await store.events.last_sequence() == 2
        more = await store.events.append([draft(3)])
        assert [e.sequence for e in more] == [3]
        assert await store.events.last_sequence() == 3


@_check
async def a_batch_keeps_its_insertion_order(factory: StoreFactory) -> None:
    # Types deliberately out of alphabetical order: nothing may sort them.
    types = [f"type.{name}" for name in ("zulu", "alpha", "mike", "bravo", "yankee", "echo")]
    async with factory.open() as store:
        await store.events.append([draft(0)])
        appended = await store.events.append([draft(i, event_type=t) for i, t in enumerate(types)])
        assert [e.event_type for e in appended] == types
        assert [e.sequence for e in appended] == list(range(2, 2 + len(types)))
        read = await store.events.read(after=1)
        assert [e.event_type for e in read] == types
        assert [e.details["n"] for e in read] == list(range(len(types)))


@_check
async def read_pages_by_after_and_limit(factory: StoreFactory) -> None:
    async with factory.open() as store:
        await store.events.append([draft(i) for i in range(1, 26)])
        pages: list[list[int]] = []
        after = 0
        while page := await store.events.read(after=after, limit=10):
            pages.append([e.sequence for e in page])
            after = page[-1].sequence
        assert pages == [list(range(1, 11)), list(range(11, 21)), list(range(21, 26))]
        assert await store.events.read(after=25) == []
        assert await store.events.read(after=1000) == []
        assert await store.events.read(limit=0) == []
        assert [e.sequence for e in await store.events.read(after=24, limit=10)] == [25]
        assert len(await store.events.read()) == 25


@_check
async def read_refuses_a_negative_limit(factory: StoreFactory) -> None:
    async with factory.open() as store:
        await store.events.append([draft(1)])
        try:
            await store.events.read(limit=-1)
        except ValueError:
            return
        raise AssertionError("read(limit=-1) did not raise ValueError")


async def _filter_fixture(store: Store) -> None:
    await store.events.append(
        [
            draft(1, correlation_id="c-1", agent_id="a-1", event_type="message.sent"),
            draft(2, correlation_id="c-2", agent_id="a-1", event_type="message.acked"),
            draft(3, correlation_id="c-1", agent_id="a-2", event_type="message.acked"),
            draft(4, correlation_id="", agent_id="", event_type="agent.joined"),
            draft(5, correlation_id="c-1", agent_id="a-1", event_type="message.failed"),
            draft(6, correlation_id="c-1", agent_id="a-1", event_type="message.acked"),
        ]
    )


async def _sequences(
    store: Store, where: EventFilter, after: int = 0, limit: int = 500
) -> list[int]:
    return [e.sequence for e in await store.events.read(after=after, limit=limit, where=where)]


@_check
async def read_filters_by_correlation_agent_and_type(factory: StoreFactory) -> None:
    async with factory.open() as store:
        await _filter_fixture(store)
        assert await _sequences(store, EventFilter()) == [1, 2, 3, 4, 5, 6]
        assert await _sequences(store, EventFilter(correlation_id="c-1")) == [1, 3, 5, 6]
        assert await _sequences(store, EventFilter(correlation_id="")) == [4]
        assert await _sequences(store, EventFilter(agent_id="a-1")) == [1, 2, 5, 6]
        assert await _sequences(store, EventFilter(event_types=frozenset({"message.acked"}))) == [
            2,
            3,
            6,
        ]
        types = frozenset({"message.sent", "agent.joined"})
        assert await _sequences(store, EventFilter(event_types=types)) == [1, 4]
        assert await _sequences(store, EventFilter(event_types=frozenset())) == []
        assert await _sequences(store, EventFilter(correlation_id="nope")) == []
        # A type ending with a dot is a family; exact types and families combine.
        family = frozenset({"message."})
        assert await _sequences(store, EventFilter(event_types=family)) == [1, 2, 3, 5, 6]
        mixed = frozenset({"agent.joined", "message.f"})  # no dot: an exact type, none such
        assert await _sequences(store, EventFilter(event_types=mixed)) == [4]
        both = frozenset({"agent.", "message.failed"})
        assert await _sequences(store, EventFilter(event_types=both)) == [4, 5]


@_check
async def correlation_ids_that_share_a_hash_stay_apart(factory: StoreFactory) -> None:
    # "plumless" and "buckeroo" have the same CRC-32, the key SQLite indexes them by.
    async with factory.open() as store:
        await store.events.append(
            [draft(1, correlation_id="plumless"), draft(2, correlation_id="buckeroo"),
             draft(3, correlation_id="plumless"), draft(4, correlation_id="Plumless")]
        )  # fmt: skip
        assert await _sequences(store, EventFilter(correlation_id="plumless")) == [1, 3]
        assert await _sequences(store, EventFilter(correlation_id="buckeroo")) == [2]
        assert await _sequences(store, EventFilter(correlation_id="buckeroo"), after=2) == []
        assert await _sequences(store, EventFilter(correlation_id="\u00e9t\u00e9 \U0001f41d")) == []


@_check
async def read_combines_correlation_id_and_event_types(factory: StoreFactory) -> None:
    acked_or_failed = frozenset({"message.acked", "message.failed"})
    async with factory.open() as store:
        await _filter_fixture(store)
        where = EventFilter(correlation_id="c-1", event_types=acked_or_failed)
        assert await _sequences(store, where) == [3, 5, 6]
        everything = EventFilter(correlation_id="c-1", agent_id="a-1", event_types=acked_or_failed)
        assert await _sequences(store, everything) == [5, 6]
        # `limit` counts matching events, `after` is a sequence of the whole log.
        assert await _sequences(store, where, limit=2) == [3, 5]
        assert await _sequences(store, where, after=3, limit=1) == [5]
        assert await _sequences(store, where, after=5) == [6]


@_check
async def read_stops_below_before(factory: StoreFactory) -> None:
    async with factory.open() as store:
        await _filter_fixture(store)
        assert await _sequences(store, EventFilter(before=4)) == [1, 2, 3]
        assert await _sequences(store, EventFilter(before=4), after=2) == [3]
        assert await _sequences(store, EventFilter(before=1)) == []
        assert await _sequences(store, EventFilter(before=99)) == [1, 2, 3, 4, 5, 6]
        # With the other terms, the correlation path (SQLite's buckets) included.
        by_correlation = EventFilter(correlation_id="c-1", before=6)
        assert await _sequences(store, by_correlation) == [1, 3, 5]
        acked = EventFilter(event_types=frozenset({"message."}), agent_id="a-1", before=6)
        assert await _sequences(store, acked) == [1, 2, 5]


@_check
async def concurrent_appends_get_gap_free_contiguous_sequences(factory: StoreFactory) -> None:
    callers = 100
    async with factory.open() as store:
        results = await asyncio.gather(
            *(
                store.events.append([draft(c, details={"c": c, "i": i}) for i in range(c % 3 + 1)])
                for c in range(callers)
            )
        )
        total = sum(c % 3 + 1 for c in range(callers))
        every = sorted(e.sequence for batch in results for e in batch)
        assert every == list(range(1, total + 1))
        for batch in results:  # a batch is never interleaved with another
            seqs = [e.sequence for e in batch]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        assert await store.events.last_sequence() == total
        by_sequence = {e.sequence: dict(e.details) for batch in results for e in batch}
        read = await store.events.read(limit=total)
        assert [(e.sequence, dict(e.details)) for e in read] == sorted(by_sequence.items())


@_check
async def details_keep_json_types(factory: StoreFactory) -> None:
    details: dict[str, Any] = {
        "int": 42,
        "negative": -7,
        "big": 2**53 + 1,
        "float": 0.1 + 0.2,
        "tiny": 1e-300,
        "true": True,
        "false": False,
        "null": None,
        "empty": {},
        "list": [1, "two", [3.5, None], {"four": 4}],
        "nested": {"a": {"b": {"c": ["d"]}}},
        'quote"key': "back\\slash 'single' \"double\" \n\t",
    }
    async with factory.open() as store:
        await store.events.append([draft(1, details=details), draft(2, details={})])
        first, second = await store.events.read()
        assert dict(first.details) == details
        assert dict(second.details) == {}
        assert isinstance(first.details["int"], int)
        assert isinstance(first.details["float"], float)
        assert first.ts == T0 + 1


@_check
async def large_details_round_trip(factory: StoreFactory) -> None:
    details = {
        "blob": "x" * (1024 * 1024),
        "items": [{"index": i, "label": f"item-{i}"} for i in range(5000)],
    }
    async with factory.open() as store:
        (appended,) = await store.events.append([draft(1, details=details)])
        (read,) = await store.events.read()
        assert read.sequence == appended.sequence
        assert dict(read.details) == details


@_check
async def non_json_details_are_refused_and_nothing_is_appended(factory: StoreFactory) -> None:
    cycle: dict[str, Any] = {}
    cycle["self"] = cycle
    bad_values: list[Any] = [math.nan, math.inf, {1, 2}, object(), b"bytes", "\ud800", cycle]
    async with factory.open() as store:
        for bad in bad_values:
            try:
                await store.events.append([draft(1), draft(2, details={"bad": bad})])
            except ValueError:
                pass
            else:
                raise AssertionError(f"details {bad!r} were accepted")
        assert await store.events.last_sequence() == 0
        assert await store.events.read() == []
        assert [e.sequence for e in await store.events.append([draft(3)])] == [1]
