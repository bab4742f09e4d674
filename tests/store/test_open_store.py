"""`open_store`: which backend each `--store` URL opens, and the URLs it refuses."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from apiary.store.errors import StoreError
from apiary.store.open import open_store, sqlite_location
from apiary.store.postgres.store import PostgresStore
from apiary.store.sqlite.store import SqliteStore


@pytest.mark.parametrize("url", [None, "", "sqlite", "sqlite://"])
async def test_the_default_is_sqlite_in_the_data_dir(tmp_path: Path, url: str | None) -> None:
    data_dir = tmp_path / "nested" / "state"
    async with open_store(url, data_dir) as store:
        assert store.backend == "sqlite"
        assert isinstance(store, SqliteStore)
        assert store.database.path == data_dir / "apiary.db"
        await store.events.append([])
    assert (data_dir / "apiary.db").is_file()
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700


async def test_an_absolute_sqlite_path(tmp_path: Path) -> None:
    path = tmp_path / "elsewhere.db"
    async with open_store(f"sqlite://{path}?synchronous=full", tmp_path / "unused") as store:
        assert isinstance(store, SqliteStore)
        assert store.database.path == path
        assert store.database.options.synchronous == "FULL"
    assert path.is_file()
    assert not (tmp_path / "unused").exists()


def test_percent_escapes_in_a_sqlite_path_are_decoded(tmp_path: Path) -> None:
    path, options = sqlite_location("sqlite:///srv/my%20state/a.db", tmp_path)
    assert path == Path("/srv/my state/a.db")
    assert options.synchronous == "NORMAL"


@pytest.mark.parametrize("url", ["memory://", "memory"])
async def test_memory(tmp_path: Path, url: str) -> None:
    async with open_store(url, tmp_path / "unused") as store:
        assert store.backend == "memory"
        assert await store.events.last_sequence() == 0
    assert not (tmp_path / "unused").exists()


@pytest.mark.postgres
@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
async def test_postgresql(
    tmp_path: Path, postgres_dsn: str, postgres_schema: str, scheme: str
) -> None:
    url = f"{scheme}:{postgres_dsn.partition(':')[2]}"
    url += ("&" if "?" in url else "?") + f"apiary_schema={postgres_schema}"
    async with open_store(url, tmp_path) as store:
        assert store.backend == "postgresql"
        assert isinstance(store, PostgresStore)
        assert store.schema == postgres_schema


@pytest.mark.parametrize(
    "url",
    ["mysql://root:hunter2@db/apiary", "redis://h", "file:///tmp/x.db", "memory://elsewhere"],
)
async def test_unknown_forms_are_refused_naming_the_accepted_ones(tmp_path: Path, url: str) -> None:
    with pytest.raises(ValueError, match="accepted") as raised:
        async with open_store(url, tmp_path):
            pass
    text = str(raised.value)
    assert "sqlite:///" in text
    assert "memory://" in text
    assert "postgresql://" in text
    assert "hunter2" not in text


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://relative.db",
        "sqlite:relative.db",
        "sqlite:///tmp/x.db?journal=delete",
        "sqlite:///tmp/x.db?synchronous=off",
        "sqlite:///tmp/",
    ],
)
async def test_malformed_sqlite_urls_are_refused(tmp_path: Path, url: str) -> None:
    with pytest.raises(ValueError):
        async with open_store(url, tmp_path):
            pass


async def test_an_unreachable_postgresql_server_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cannot connect"):
        async with open_store("postgresql://nobody@127.0.0.1:1/none?connect_timeout=5", tmp_path):
            pass
