"""Checks of the idempotency cache (`IdempotencyStore`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from apiary.testing.store_suite.base import (
    T0,
    UNICODE,
    Check,
    StoreFactory,
    idempotency_record,
    registry,
)

CHECKS: list[Check] = []
_check = registry(CHECKS)


@_check
async def idempotency_records_are_put_and_read(factory: StoreFactory) -> None:
    async with factory.open() as store:
        assert await store.idempotency.get("tok-1") is None
        first = idempotency_record("tok-1")
        await store.idempotency.put(first)
        await store.idempotency.put(idempotency_record("tok-2", attempts=()))
        assert await store.idempotency.get("tok-1") == first
        other = await store.idempotency.get("tok-2")
        assert other is not None
        assert other.attempts == ()
        assert isinstance(first.attempts, tuple)
        assert (other.outcome_at, other.error_code, other.result) == (0.0, "", "")
        assert await store.idempotency.get("tok-3") is None


@_check
async def putting_a_token_again_replaces_its_record(factory: StoreFactory) -> None:
    async with factory.open() as store:
        await store.idempotency.put(idempotency_record("tok-1"))
        outcome = idempotency_record(
            "tok-1",
            current_message_id="tok-1-try-3",
            status="FULFILLED",
            updated_at=T0 + 20,
            outcome_at=T0 + 20.5,
            error_code="",
            result='{"answer": 42, "note": "done"}',
            attempts=("tok-1-try-1", "tok-1-try-2", "tok-1-try-3"),
        )
        await store.idempotency.put(outcome)
        assert await store.idempotency.get("tok-1") == outcome
        failed = replace(outcome, status="FAILED", error_code="ttl_expired", result="")
        await store.idempotency.put(failed)
        assert await store.idempotency.get("tok-1") == failed


@_check
async def idempotency_purge_removes_records_updated_before(factory: StoreFactory) -> None:
    async with factory.open() as store:
        for i in range(5):
            await store.idempotency.put(idempotency_record(f"tok-{i}", updated_at=T0 + i))
        assert await store.idempotency.purge(T0) == 0
        # Strictly before: the record updated at T0 + 2 stays.
        assert await store.idempotency.purge(T0 + 2) == 2
        assert await store.idempotency.get("tok-1") is None
        assert await store.idempotency.get("tok-2") is not None
        # A record touched again is kept by its new updated_at.
        await store.idempotency.put(idempotency_record("tok-2", updated_at=T0 + 100))
        assert await store.idempotency.purge(T0 + 50) == 2
        assert [await store.idempotency.get(f"tok-{i}") is not None for i in range(5)] == [
            False,
            False,
            True,
            False,
            False,
        ]


@_check
async def idempotency_records_keep_unicode_and_long_histories(factory: StoreFactory) -> None:
    attempts = tuple(f"{UNICODE}-try-{i}" for i in range(2000))
    record = idempotency_record(
        f"tok {UNICODE}",
        producer_id=f"producer {UNICODE}",
        original_message_id=attempts[0],
        current_message_id=attempts[-1],
        result=f'{{"text": "{UNICODE}"}}' + "x" * 100_000,
        attempts=attempts,
    )
    async with factory.open() as store:
        await store.idempotency.put(record)
        assert await store.idempotency.get(f"tok {UNICODE}") == record


@_check
async def attempts_that_are_not_message_ids_are_refused(factory: StoreFactory) -> None:
    bad_attempts: list[Any] = [(1, 2), ("ok", None), ("\ud800",), "a-string"]
    async with factory.open() as store:
        for bad in bad_attempts:
            try:
                await store.idempotency.put(idempotency_record("tok-1", attempts=bad))
            except ValueError:
                pass
            else:
                raise AssertionError(f"attempts {bad!r} were accepted")
        assert await store.idempotency.get("tok-1") is None
