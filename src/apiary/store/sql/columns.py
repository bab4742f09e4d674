"""Column lists named by a row type's fields: SQL never counts columns by hand.

A table's row type is a `NamedTuple` whose fields are its column names (in the order
statements list them); `Columns` derives the SQL column list, the number of columns and which
hold JSON from it, and turns a fetched row into that type, so code reads `row.seq`, never
`row[4]`.

What an aggregate writes is a plain tuple of the columns' values in that order, each element
the record's field of the column's name (`(record.task_id, record.agent_id, ...)`), which a
reader checks at a glance and `tests/store/test_sql_rows.py` checks by a round trip of
distinct values. Not the row type itself: building it costs 13.8k instructions for 18
columns with keywords, 5.0k positionally, against 0.4k for the tuple, and sqlite3 binds a
tuple subclass 14k instructions slower than a tuple, on every write of a busy coordinator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial
from operator import itemgetter
from typing import Any, Generic, TypeAlias, TypeVar

R = TypeVar("R", bound=tuple[Any, ...])

Json: TypeAlias = Any
"""A JSON column's value in a row type: JSON text written (`json_codec.dump_json`); read
back as that text (SQLite) or already parsed (PostgreSQL's JSONB)."""


class Columns(Generic[R]):
    """The columns of a table as the fields of the NamedTuple `row`.

    `json` names the columns that hold JSON (text in SQLite, JSONB in PostgreSQL, which
    psycopg hands back parsed: read them with `json_codec.json_object_of` or `json_list_of`).
    `generated` names those the database assigns (an identity or AUTOINCREMENT key), which
    an insert leaves out: `inserted` and `insert_values`.
    """

    __slots__ = ("_pick", "count", "inserted", "json", "names", "of", "row", "sql")

    def __init__(
        self, row: type[R], *, json: Iterable[str] = (), generated: Iterable[str] = ()
    ) -> None:
        names: tuple[str, ...] = row._fields  # type: ignore[attr-defined]
        json, generated = frozenset(json), frozenset(generated)
        unknown = (json | generated) - set(names)
        if unknown:
            raise ValueError(f"columns not in {row.__name__}: {sorted(unknown)}")
        self.row = row
        self.names = names
        self.json = json
        self.sql = ", ".join(names)
        self.count = len(names)
        self.inserted = tuple(n for n in names if n not in generated)
        self._pick = itemgetter(*(names.index(n) for n in self.inserted))
        # tuple.__new__ through partial: a quarter cheaper than NamedTuple._make (2.2k against
        # 2.9k instructions for 18 columns), without its length check, which rows selected
        # by this list and built by the aggregate's own `*_row` cannot fail.
        self.of: Callable[[Iterable[Any]], R] = partial(tuple.__new__, row)

    def insert_values(self, row: Sequence[Any]) -> tuple[Any, ...]:
        """The values of the `inserted` columns of `row`, in their order."""
        if len(self.inserted) == self.count:
            return tuple(row)
        picked = self._pick(row)
        return (picked,) if len(self.inserted) == 1 else tuple(picked)

    def prefixed(self, alias: str) -> str:
        """The column list qualified by a table alias: "m.a, m.b"."""
        return ", ".join(f"{alias}.{name}" for name in self.names)

    def __repr__(self) -> str:
        return f"Columns({self.row.__name__})"
