"""What differs between the SQLite and PostgreSQL dialects, and nothing else.

Statements are written once, in the canonical form: `?` marks a parameter, as in SQLite.
`Dialect.render` turns that into what the driver takes (psycopg's `%s`, with a literal `%`
doubled); a statement that must differ in more than its markers (a JSON parameter, which
PostgreSQL casts to JSONB; a row lock) is built per dialect by `by_dialect` once, at import,
and the driver picks its text. The canonical form cannot use PostgreSQL's `?` operators on
JSONB (use `jsonb_exists` and friends instead).

A `Dialect` is immutable and pickles as the name of its module-level instance, so that a
write job crossing to the SQLite writer process carries a few bytes, not a render cache.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

from apiary.store.sql.columns import Columns

DialectName: TypeAlias = Literal["sqlite", "postgresql"]

_CACHE_LIMIT: Final = 4096
"""Rendered texts a dialect keeps; past it the cache starts over (texts built per call, such
as IN lists of every length, must not grow it without bound)."""


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one database spells what the two spell differently."""

    name: DialectName
    placeholder: str
    """A parameter marker as the driver takes it: `?` (sqlite3) or `%s` (psycopg)."""
    json_marker: str
    """The canonical marker of a JSON parameter (JSON text bound): `?`, or `?::jsonb`."""
    lock_rows: str
    """The suffix of a SELECT that locks the rows it reads until the transaction ends:
    PostgreSQL's ` FOR UPDATE`; empty for SQLite, whose single writer excludes others."""
    greatest: str
    """The scalar function of the larger of two values: SQLite's MAX, PostgreSQL's
    GREATEST."""
    _rendered: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def render(self, sql: Sql) -> str:
        """The driver's text of the statement `sql` (cached)."""
        if not isinstance(sql, str):
            return sql.sqlite if self.name == "sqlite" else sql.postgresql
        if self.placeholder == "?":
            return sql
        text = self._rendered.get(sql)
        if text is None:
            if len(self._rendered) >= _CACHE_LIMIT:
                self._rendered.clear()
            text = self._rendered[sql] = sql.replace("%", "%%").replace("?", self.placeholder)
        return text

    def markers(self, names: Collection[str], json: Collection[str] = ()) -> str:
        """The canonical VALUES markers of columns `names`, those in `json` JSON ones."""
        return ", ".join(self.json_marker if name in json else "?" for name in names)

    def insert(self, table: str, columns: Columns[Any], suffix: str = "", rows: int = 1) -> str:
        """`INSERT INTO table (columns) VALUES (...)` and `suffix` (canonical), of the
        columns an insert lists (`Columns.inserted`: the generated ones left out), with
        `rows` rows of values."""
        names = columns.inserted
        values = ", ".join([f"({self.markers(names, columns.json)})"] * rows)
        return f"INSERT INTO {table} ({', '.join(names)}) VALUES {values}{suffix}"

    def upsert(
        self, table: str, columns: Columns[Any], key: str | tuple[str, ...], *,
        rows: int = 1, kept: tuple[str, ...] = (),
    ) -> str:  # fmt: skip
        """An insert that replaces every other column of the row whose `key` columns match.

        `ON CONFLICT ... DO UPDATE` in both dialects, not SQLite's INSERT OR REPLACE: REPLACE
        would also delete any other row a second unique index holds the same values for,
        where PostgreSQL refuses the clash; and it costs SQLite no more (measured: 13.7 µs a
        new row, 15-16 µs a replaced one, either way).

        `kept` columns are left out of the update, which then replaces only a row that
        already holds the same values in them (a row it leaves alone is not counted in the
        statement's rowcount): SQLite rewrites the entries of every index a column of an
        UPDATE's SET list is in, whatever the values, so this spares the indexes of columns
        that seldom change (the caller puts the rows not counted again without `kept`)."""
        keys = (key,) if isinstance(key, str) else key
        sets = ", ".join(f"{c} = excluded.{c}" for c in columns.names if c not in keys + kept)
        same = " AND ".join(f"{table}.{c} = excluded.{c}" for c in kept)
        upsert = f" ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {sets}"
        return self.insert(table, columns, f"{upsert} WHERE {same}" if kept else upsert, rows)

    def __reduce__(self) -> tuple[Callable[[DialectName], Dialect], tuple[DialectName]]:
        return dialect_named, (self.name,)


SQLITE: Final = Dialect("sqlite", "?", "?", "", "MAX")
POSTGRESQL: Final = Dialect("postgresql", "%s", "?::jsonb", " FOR UPDATE", "GREATEST")
DIALECTS: Final = (SQLITE, POSTGRESQL)


def dialect_named(name: DialectName) -> Dialect:
    """The module-level dialect called `name`."""
    return SQLITE if name == "sqlite" else POSTGRESQL


@dataclass(frozen=True, slots=True, eq=False)
class ByDialect:
    """A statement whose text differs by dialect, rendered for each once (`by_dialect`)."""

    sqlite: str
    postgresql: str


Sql: TypeAlias = str | ByDialect
"""A statement: canonical text (`?` markers), or one rendered per dialect."""


def by_dialect(build: Callable[[Dialect], str]) -> ByDialect:
    """The statement `build(dialect)` returns (canonical text), rendered for each dialect.

    For module-level statements: `_PUT = by_dialect(lambda d: d.upsert("t", T, "id"))`."""
    return ByDialect(SQLITE.render(build(SQLITE)), POSTGRESQL.render(build(POSTGRESQL)))


def in_list(column: str, count: int) -> str:
    """`column IN (?, ?, ...)` with `count` markers (canonical)."""
    return f"{column} IN ({', '.join('?' * count)})"
