"""Multi-row statements for batches: one statement per chunk of rows, not one per row.

`executemany` steps its statement once per row. In SQLite every step releases and retakes
the interpreter lock, and on the writer thread, which shares that lock with the busy event
loop, each retake can wait for the loop's next switch, so a batch of a few hundred rows
spent most of its time waiting rather than writing (the route benchmark measured jobs at
about 2.5 times their CPU time); in PostgreSQL every row is a message of the protocol. A
statement with many rows of values (`VALUES (?, ?), (?, ?)`) runs once per chunk, and binds
with less per-row overhead.

Chunks keep the number of parameters under what the database accepts (the linked SQLite's
limit: 32766 by default since 3.32, as low as 999 before; PostgreSQL's 65535) and bound the
size of a statement the database must compile; their texts are cached, so a steady load
reuses a handful of prepared statements.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from functools import cache, lru_cache
from itertools import chain
from typing import Any, Final

from apiary.store.sql.dialect import Dialect

MAX_ROWS: Final = 250
"""Rows per statement at most, whatever the parameter limit allows."""
_POSTGRESQL_PARAMETERS: Final = 65535
"""The protocol counts a statement's parameters in 16 bits."""


@cache
def _sqlite_parameters() -> int:
    # The limit of the SQLite this process links (every connection gets the same, as none
    # is lowered with setlimit).
    conn = sqlite3.connect(":memory:")
    try:
        return conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    finally:
        conn.close()


def rows_per_statement(d: Dialect, width: int) -> int:
    """How many rows of `width` parameters one statement may carry in dialect `d`."""
    limit = _sqlite_parameters() if d.name == "sqlite" else _POSTGRESQL_PARAMETERS
    return max(1, min(MAX_ROWS, limit // width))


def chunks(
    d: Dialect, rows: Sequence[Sequence[Any]], width: int
) -> Iterator[tuple[int, list[Any]]]:
    """(row count, flat parameters) per chunk of `rows`, in order."""
    size = rows_per_statement(d, width)
    for start in range(0, len(rows), size):
        part = rows[start : start + size]
        # chain: flattened in C, while the SQLite writer holds the interpreter lock.
        yield len(part), list(chain.from_iterable(part))


@lru_cache(maxsize=512)
def values_rows(count: int, row: str) -> str:
    """`count` comma-separated copies of the parenthesised markers `row`: "(?, ?), (?, ?)"."""
    return ", ".join([f"({row})"] * count)


@lru_cache(maxsize=256)
def markers(count: int) -> str:
    """`count` comma-separated parameter markers (for IN lists)."""
    return ", ".join("?" * count)
