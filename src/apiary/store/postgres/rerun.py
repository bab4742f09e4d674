"""Transactions PostgreSQL aborted to resolve a conflict, run again whole.

PostgreSQL breaks a deadlock by aborting one of the transactions in it (SQLSTATE 40P01)
and may abort one whose snapshot it cannot serialize (40001). Neither did anything: the
transaction rolled back, and the same work run again on a fresh transaction usually
succeeds, the other side having committed meanwhile. So a transaction that is safe to run
again as a whole (a description of statements that keeps no state outside itself,
`store.sql.statements`, or a block that only writes the database) is run again here, a
bounded number of times after a short jittered pause, instead of its abort reaching the
caller as `unavailable`. Other errors, and a conflict that outlasts the attempts, pass
through unchanged.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import psycopg.errors

T = TypeVar("T")

ATTEMPTS: Final = 6
"""How many times a transaction is run at most (the first run included)."""
FIRST_PAUSE_S: Final = 0.005
"""The longest pause before the second run; it doubles for each further run."""
_CONFLICTS: Final = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


def aborted_by_conflict(error: BaseException) -> bool:
    """Whether `error` is, or was raised from, PostgreSQL aborting the transaction for a
    deadlock or a serialization failure (the store's errors keep the driver's as their
    cause)."""
    seen: BaseException | None = error
    for _ in range(4):  # the driver's error is at most a few causes down
        if seen is None:
            return False
        if isinstance(seen, _CONFLICTS):
            return True
        seen = seen.__cause__
    return False


async def rerun_when_aborted(run: Callable[[], Awaitable[T]]) -> T:
    """`await run()`, run again (at most `ATTEMPTS` runs in all) while PostgreSQL aborts it
    for a deadlock or a serialization failure; each pause drawn at random up to
    `FIRST_PAUSE_S`, doubled per run, so that the two sides of a deadlock do not meet again
    in step."""
    for attempt in range(1, ATTEMPTS):
        try:
            return await run()
        except Exception as exc:
            if not aborted_by_conflict(exc):
                raise
        await asyncio.sleep(random.uniform(0, FIRST_PAUSE_S * 2 ** (attempt - 1)))
    return await run()
