"""Fixtures for tests that need a real PostgreSQL server (DESIGN.md section 6).

`postgres_dsn` is the server to use: $APIARY_TEST_POSTGRES_DSN, default
postgresql://postgres@127.0.0.1:5432/test. When it cannot be reached, tests that use it are
skipped with the reason shown, unless APIARY_REQUIRE_POSTGRES=1 (as in CI), which makes
them fail instead. `postgres_schema` gives each test a fresh schema and drops it afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import settings
from psycopg import sql

DEFAULT_POSTGRES_DSN = "postgresql://postgres@127.0.0.1:5432/test"

# Property tests assert behaviour, never wall-clock time: Hypothesis's default 200 ms deadline
# per example failed them on a loaded 2-core machine (the whole suite on xdist workers).
settings.register_profile("apiary", deadline=None)
settings.load_profile("apiary")


@pytest.fixture(scope="session")
def postgres_dsn() -> str:
    """A reachable PostgreSQL server's DSN, or skip (fail under APIARY_REQUIRE_POSTGRES=1)."""
    dsn = os.environ.get("APIARY_TEST_POSTGRES_DSN") or DEFAULT_POSTGRES_DSN
    try:
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        reason = f"PostgreSQL unreachable at {_without_password(dsn)}: {exc}".strip()
        if os.environ.get("APIARY_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{reason} (APIARY_REQUIRE_POSTGRES=1 requires it)", pytrace=False)
        pytest.skip(f"{reason} (set APIARY_TEST_POSTGRES_DSN to point at a server)")
    return dsn


@pytest.fixture
def postgres_schema(postgres_dsn: str) -> Iterator[str]:
    """The name of a schema no other test uses; it is dropped after the test."""
    schema = f"apiary_test_{uuid.uuid4().hex[:16]}"
    yield schema
    with psycopg.connect(postgres_dsn, connect_timeout=5, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def _without_password(dsn: str) -> str:
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        return "<unparsable DSN>"
    params.pop("password", None)
    return psycopg.conninfo.make_conninfo("", **params)
