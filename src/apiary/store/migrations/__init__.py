"""Versioned schema migrations shared by the SQL backends.

Each backend keeps its scripts in a subdirectory of this package (`sqlite/`, `postgres/`),
named `NNNN_description.sql` with unique versions from 1 (a version reserved for an aggregate
still being written may be missing). A backend records what it
applied in a `schema_migrations` table (version, name, applied_at) and, inside one transaction,
applies the scripts it has not applied yet, in order. The decisions that do not depend on the
database (which scripts exist, which are pending, whether the database is newer than this
code) live here so that every backend makes them the same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal

from apiary.store.errors import SchemaVersionError

Dialect = Literal["sqlite", "postgres"]

_SCRIPT_NAME = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema script: applying it moves the schema from `version - 1` to `version`."""

    version: int
    name: str
    sql: str


@cache
def load_migrations(dialect: Dialect) -> tuple[Migration, ...]:
    """The dialect's migration scripts shipped with the package, ascending by version.

    Raises RuntimeError when the shipped scripts are malformed (a bad name, a gap in the
    versions): that is a packaging bug, not a state of the database.
    """
    root = resources.files(__name__).joinpath(dialect)
    migrations: list[Migration] = []
    for entry in root.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _SCRIPT_NAME.match(entry.name)
        if match is None:
            raise RuntimeError(f"badly named migration script {dialect}/{entry.name}")
        migrations.append(
            Migration(int(match["version"]), match["name"], entry.read_text(encoding="utf-8"))
        )
    migrations.sort(key=lambda m: m.version)
    versions = [m.version for m in migrations]
    # Versions are handed out to aggregates as they are designed, so a build may ship, say,
    # 1-4 and 11 while 5-10 are still being written; a database that applied 11 first gets
    # 5-10 when they ship (they are independent tables). What is refused is a version twice.
    if (versions and versions[0] != 1) or len(set(versions)) != len(versions):
        raise RuntimeError(
            f"{dialect} migration versions must start at 1 and be unique: {versions}"
        )
    return tuple(migrations)


def pending_migrations(
    available: Sequence[Migration], applied: Iterable[int], *, target: int | None = None
) -> tuple[Migration, ...]:
    """The migrations of `available` not yet in `applied`, in the order to apply them;
    with `target`, only those up to that version.

    Raises SchemaVersionError when the database records a version this code does not know:
    a newer Apiary has migrated it, and running older code against it could corrupt it.
    """
    done = set(applied)
    latest = available[-1].version if available else 0
    unknown = sorted(v for v in done if v > latest or v < 1)
    if unknown:
        raise SchemaVersionError(
            f"the database schema is at version {max(done)}, but this Apiary knows versions "
            f"up to {latest} only (unknown: {unknown}); upgrade Apiary to open it"
        )
    return tuple(
        m for m in available if m.version not in done and (target is None or m.version <= target)
    )
