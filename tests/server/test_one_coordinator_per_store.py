"""One serving coordinator per store (no silent split brain): a second coordinator on a
store another live coordinator serves is refused, naming the holder, on SQLite and
PostgreSQL, in process and as `apiary serve`; the claim ends with its holder, SIGKILL
included; on PostgreSQL a claim the database dropped is taken again."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from apiary.server.inprocess import open_test_coordinator
from apiary.store import claim as claim_module
from apiary.store.claim import LOCK_NAMESPACE, Holder, StoreClaimedError, claim_store
from apiary.store.open import open_store


async def test_a_second_coordinator_on_a_sqlite_file_is_refused_naming_the_first(
    tmp_path: Path,
) -> None:
    url = f"sqlite://{tmp_path / 'apiary.db'}"
    async with open_test_coordinator(tmp_path, url) as first:
        with pytest.raises(StoreClaimedError) as refused:
            async with open_test_coordinator(tmp_path / "second", url):
                pytest.fail("two coordinators served one SQLite file")
        message = str(refused.value)
        assert f"the SQLite database {tmp_path / 'apiary.db'} is served by another" in message
        assert f"pid {os.getpid()}" in message
        assert f"grpc {first.grpc_address}" in message
        assert "cluster mode" in message
    # The first is gone: its claim with it.
    async with open_test_coordinator(tmp_path, url) as again:
        assert again.grpc_address.port > 0


async def test_a_second_coordinator_on_a_postgresql_schema_is_refused_naming_the_first(
    tmp_path: Path, postgres_dsn: str, postgres_schema: str
) -> None:
    url = f"{postgres_dsn}?apiary_schema={postgres_schema}"
    async with open_test_coordinator(tmp_path, url) as first:
        with pytest.raises(StoreClaimedError) as refused:
            async with open_test_coordinator(tmp_path / "second", url):
                pytest.fail("two coordinators served one PostgreSQL schema")
        message = str(refused.value)
        assert f"the PostgreSQL schema {postgres_schema} is served by another" in message
        assert f"apiary pid={os.getpid()} grpc {first.grpc_address}" in message
        # Another schema of the same database is another store.
        other = f"{postgres_dsn}?apiary_schema={postgres_schema}_b"
        try:
            async with open_test_coordinator(tmp_path / "third", other) as third:
                assert third.grpc_address != first.grpc_address
        finally:
            with psycopg.connect(postgres_dsn, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{postgres_schema}_b" CASCADE')
    async with open_test_coordinator(tmp_path, url):
        pass


@pytest.fixture
def checked_on_demand(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The claim's connection is checked when the test says (Claim.check_now), not by time."""
    monkeypatch.setattr(claim_module, "WATCH_EVERY_S", 3600.0)
    yield


async def _until(condition: object, what: str) -> None:
    for _ in range(400):
        if callable(condition) and condition():
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"never: {what}")


_TERMINATE_HOLDER = (
    "SELECT pg_terminate_backend(l.pid, 5000) FROM pg_locks l"
    " WHERE l.locktype = 'advisory' AND l.classid = %s::bigint::oid"
    " AND l.objid = (hashtext(%s)::bigint & 4294967295)::oid"
)
"""Ends the session holding the schema's claim (as a database restart or a cut would)."""


async def test_a_postgresql_claim_the_database_dropped_is_taken_again(
    tmp_path: Path, postgres_dsn: str, postgres_schema: str, checked_on_demand: None
) -> None:
    holder = Holder.here("2026-11-27T00:00:00Z")
    async with (
        open_store(f"{postgres_dsn}?apiary_schema={postgres_schema}", tmp_path) as store,
        claim_store(store, holder) as claim,
    ):
        assert not claim.lost
        async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as admin:
            key = [LOCK_NAMESPACE, postgres_schema]
            await admin.execute(_TERMINATE_HOLDER, key)
            claim.check_now()

            # Nobody took it meanwhile: held again on a new connection.
            async def held_again() -> bool:
                taken = await admin.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", key)
                row = await taken.fetchone()
                if row == (True,):
                    await admin.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", key)
                return row == (False,)

            for _ in range(400):
                if await held_again():
                    break
                await asyncio.sleep(0.025)
            else:
                raise AssertionError("the dropped claim was never taken again")
            assert not claim.lost


async def test_a_postgresql_claim_another_coordinator_took_is_lost_for_good(
    tmp_path: Path, postgres_dsn: str, postgres_schema: str, checked_on_demand: None
) -> None:
    holder = Holder.here("2026-11-27T00:00:00Z")
    async with (
        open_store(f"{postgres_dsn}?apiary_schema={postgres_schema}", tmp_path) as store,
        claim_store(store, holder) as claim,
    ):
        assert not claim.lost
        async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as admin:
            key = [LOCK_NAMESPACE, postgres_schema]
            await admin.execute(_TERMINATE_HOLDER, key)
            # Someone else holds it before the claim is checked again: lost...
            taken = await admin.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", key)
            assert (await taken.fetchone()) == (True,)
            claim.check_now()
            await asyncio.wait_for(claim.taken.wait(), 10)
            await admin.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", key)
            # ... for good: the other may have served the store meanwhile.
            claim.check_now()
            await asyncio.sleep(0.2)
            assert claim.lost
            free = await admin.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", key)
            assert (await free.fetchone()) == (True,), "the lost claim was taken again"


def test_apiary_serve_stops_when_another_coordinator_takes_its_claim(
    tmp_path: Path, postgres_dsn: str, postgres_schema: str
) -> None:
    """The database drops the serving coordinator's claim and another session takes it
    before it can take it back: `apiary serve` stops (exit 2) instead of serving a store
    another coordinator may serve."""
    url = f"{postgres_dsn}?apiary_schema={postgres_schema}"
    serving = _serve(tmp_path, "--store", url)
    try:
        assert _grpc_line(serving)
        key = [LOCK_NAMESPACE, postgres_schema]
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            for _ in range(200):  # the claim's connection may be replaced meanwhile
                admin.execute(_TERMINATE_HOLDER, key)
                row = admin.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", key)
                if row.fetchone() == (True,):
                    break
            else:
                raise AssertionError("the claim could not be taken from apiary serve")
            try:
                _, err = serving.communicate(timeout=60)
            except subprocess.TimeoutExpired as exc:
                # It printed its threads' and tasks' stacks after 15 s (server/stall_report.py).
                serving.kill()
                _, rest = serving.communicate(timeout=30)
                said = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
                pytest.fail(f"apiary serve did not stop; its stderr:\n{said}{rest}"[-30000:])
        assert serving.returncode == 2, err
        assert "another coordinator took this one's claim on the store" in err, err
        assert "lost the claim on the PostgreSQL schema" in err, err
    finally:
        if serving.poll() is None:
            serving.kill()
            serving.wait(timeout=30)


def _serve(data_dir: Path, *more: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "apiary.cli.main", "serve", "--data-dir", str(data_dir),
         "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", *more],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _grpc_line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("grpc="):
            return line.strip().removeprefix("grpc=")
    raise AssertionError(f"apiary serve ended: {process.wait()} {process.stderr}")


def test_apiary_serve_twice_on_one_data_directory(tmp_path: Path) -> None:
    first = _serve(tmp_path)
    try:
        address = _grpc_line(first)
        second = _serve(tmp_path)
        _, err = second.communicate(timeout=60)
        assert second.returncode == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert lines[0].startswith(f"apiary serve: the SQLite database {tmp_path}"), lines[0]
        assert f"pid {first.pid}" in lines[0] and f"grpc {address}" in lines[0]
        # SIGKILL ends the claim with its holder: a new coordinator serves at once.
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        third = _serve(tmp_path)
        try:
            assert _grpc_line(third)
        finally:
            third.terminate()
            third.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=30)
