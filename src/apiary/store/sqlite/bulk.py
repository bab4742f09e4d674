"""Multi-row SQLite statements for the writer's batches: one statement per chunk of rows.

`executemany` steps its statement once per row, and every step releases and retakes the
interpreter lock. On the writer thread, which shares that lock with the busy event loop,
each retake can wait for the loop's next switch, so a batch of a few hundred rows spends
most of its time waiting rather than writing (the route benchmark measured jobs at about 2.5
times their CPU time). A statement with many rows of values is stepped once per chunk, and
also binds with less per-row overhead.

Chunks keep the number of parameters under what the linked SQLite accepts (32766 by default
since 3.32, as low as 999 before) and bound the size of a statement SQLite must compile;
their texts are cached, so a steady load reuses a handful of prepared statements.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from functools import lru_cache
from itertools import chain
from typing import Any

MAX_ROWS = 250
"""Rows per statement at most, whatever the parameter limit allows."""


def rows_per_statement(conn: sqlite3.Connection, width: int) -> int:
    """How many rows of `width` parameters one statement may carry on `conn`."""
    return max(1, min(MAX_ROWS, conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // width))


def chunks(
    conn: sqlite3.Connection, rows: Sequence[Sequence[Any]], width: int
) -> Iterator[tuple[int, list[Any]]]:
    """(row count, flat parameters) per chunk of `rows`, in order."""
    size = rows_per_statement(conn, width)
    for start in range(0, len(rows), size):
        part = rows[start : start + size]
        # chain: flattened in C, while the writer holds the interpreter lock.
        yield len(part), list(chain.from_iterable(part))


@lru_cache(maxsize=256)
def values_rows(count: int, width: int) -> str:
    """`count` parenthesised rows of `width` parameter markers: "(?, ?), (?, ?)"."""
    row = "(" + ", ".join("?" * width) + ")"
    return ", ".join([row] * count)


@lru_cache(maxsize=256)
def markers(count: int) -> str:
    """`count` comma-separated parameter markers (for IN lists)."""
    return ", ".join("?" * count)


def insert_rows(
    conn: sqlite3.Connection, prefix: str, rows: Sequence[Sequence[Any]], width: int
) -> int:
    """Run `prefix` ("INSERT INTO t (a, b) VALUES") over `rows`, one statement per chunk;
    the rowid of the last row inserted (0 for none)."""
    last = 0
    for count, params in chunks(conn, rows, width):
        last = conn.execute(f"{prefix} {values_rows(count, width)}", params).lastrowid or 0
    return last
