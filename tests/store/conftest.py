"""`store_factory`: every backend behind the one conformance suite (memory, sqlite with its
writer on a thread and in a process, postgresql)."""

from __future__ import annotations

from pathlib import Path

import pytest

# Before the import below: the suite's plain asserts then explain themselves like a test's.
pytest.register_assert_rewrite("apiary.testing.store_suite")

from apiary.store.memory.store import open_memory_store  # noqa: E402
from apiary.store.postgres.store import open_postgres_store  # noqa: E402
from apiary.store.sqlite.database import SqliteOptions  # noqa: E402
from apiary.store.sqlite.store import open_sqlite_store  # noqa: E402
from apiary.testing.store_suite import StoreFactory  # noqa: E402

BACKENDS = [
    "memory",
    "sqlite",
    "sqlite-process",
    pytest.param("postgresql", marks=pytest.mark.postgres),
]


@pytest.fixture(params=BACKENDS)
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """Opens one backend over storage that is fresh for the test and shared by its opens."""
    backend: str = request.param
    if backend == "memory":
        return StoreFactory("memory", open_memory_store, durable=False)
    if backend == "sqlite":
        path = tmp_path / "apiary.db"
        return StoreFactory("sqlite", lambda: open_sqlite_store(path), durable=True)
    if backend == "sqlite-process":
        # The writer in a process of its own: every write job crosses a pipe, pickled.
        path, options = tmp_path / "apiary.db", SqliteOptions(writer="process")
        return StoreFactory("sqlite", lambda: open_sqlite_store(path, options), durable=True)
    dsn: str = request.getfixturevalue("postgres_dsn")
    schema: str = request.getfixturevalue("postgres_schema")
    return StoreFactory("postgresql", lambda: open_postgres_store(dsn, schema=schema), durable=True)
