"""`apiary cluster status` on the real PostgreSQL: the replicas, partitions, owners, epochs
and expiries of a cluster as a table and as JSON, read from the store without migrating it;
and the refusals: a store that is not PostgreSQL, a server that cannot be reached, a schema
no cluster has run on."""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest
from typer.testing import CliRunner, Result

from apiary.cli.main import app
from apiary.core.cluster.leases import LeaseAction
from apiary.store.cluster import Me
from apiary.store.postgres.cluster import PostgresClusterLeases
from apiary.store.postgres.cluster_leader import PostgresClusterLeader
from apiary.store.postgres.store import open_postgres_store

pytestmark = pytest.mark.postgres

A = Me("replica-a", "inc-a", "10.0.0.1:50051")
B = Me("replica-b", "inc-b", "10.0.0.2:50051")


def _url(dsn: str, schema: str) -> str:
    return f"{dsn}{'&' if '?' in dsn else '?'}apiary_schema={schema}"


def _cli(*argv: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(
        app, ["cluster", "status", *argv], env={"COLUMNS": "250", **(env or {})}
    )


async def _two_replicas(dsn: str, schema: str) -> None:
    """a holds 0-2 and b 3; then b leaves 3 free (epoch kept); b leads."""
    async with open_postgres_store(dsn, schema=schema) as store:
        leases = PostgresClusterLeases(store.pool)
        await leases.join(A, 4, 60.0)
        await leases.join(B, 4, 60.0)
        await leases.acquire(A, [0, 1, 2], 60.0)
        await leases.acquire(B, [3], 60.0)
        await leases.release(B, [3])
        leader = PostgresClusterLeader(store.pool)
        await leader.seed("the-forwarding-key")
        await leader.step(B, LeaseAction.ACQUIRE, 60.0, B.address)


def test_status_prints_replicas_and_partitions(postgres_dsn: str, postgres_schema: str) -> None:
    asyncio.run(_two_replicas(postgres_dsn, postgres_schema))
    result = _cli("--store", _url(postgres_dsn, postgres_schema))
    assert result.exit_code == 0, result.output
    out = result.output
    assert "Replicas (2 live)" in out and "Partitions (4, 1 unowned)" in out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 3}
    assert "10.0.0.1:50051" in rows["replica-a"] and "live" in rows["replica-a"]
    assert [c.strip() for c in rows["0"].split("│")[1:4]] == ["0", "replica-a", "1"]
    assert [c.strip() for c in rows["3"].split("│")[1:4]] == ["3", "none", "1"]

    as_json = _cli("--json", env={"APIARY_STORE": _url(postgres_dsn, postgres_schema)})
    assert as_json.exit_code == 0, as_json.output
    doc = json.loads(as_json.output)
    assert [(r["replica_id"], r["live"], r["partitions"]) for r in doc["replicas"]] == [
        ("replica-a", True, 3),
        ("replica-b", True, 0),
    ]
    assert [(p["owner"], p["epoch"]) for p in doc["partitions"]] == [
        ("replica-a", 1), ("replica-a", 1), ("replica-a", 1), (None, 1),
    ]  # fmt: skip
    assert all(p["expires_at"] > doc["now"] for p in doc["partitions"][:3])
    # The lag: time since each replica's heartbeat, on the database's clock.
    for r in doc["replicas"]:
        assert r["lag_s"] == round(max(doc["now"] - r["heartbeat_at"], 0.0), 3)
        assert 0 <= r["lag_s"] < 60
    assert "lag" in out
    # The leader, and never the forwarding key.
    assert "Leader: replica-b, epoch 1, at 10.0.0.2:50051" in out
    leader = doc["leader"]
    assert (leader["replica_id"], leader["epoch"], leader["address"]) == (
        "replica-b", 1, "10.0.0.2:50051"
    )  # fmt: skip
    assert "the-forwarding-key" not in out + as_json.output


def test_a_migrated_store_without_replicas_says_so(postgres_dsn: str, postgres_schema: str) -> None:
    async def migrate() -> None:
        async with open_postgres_store(postgres_dsn, schema=postgres_schema):
            pass

    asyncio.run(migrate())
    result = _cli("--store", _url(postgres_dsn, postgres_schema))
    assert result.exit_code == 0, result.output
    assert "no replica has joined a cluster on this store yet" in result.output


def test_a_schema_no_cluster_ran_on_is_refused_and_left_alone(
    postgres_dsn: str, postgres_schema: str
) -> None:
    result = _cli("--store", _url(postgres_dsn, postgres_schema))
    assert result.exit_code == 1
    assert f"no cluster has run on the PostgreSQL schema {postgres_schema}" in result.output
    # Read only: nothing was created.
    with psycopg.connect(postgres_dsn) as conn:
        found = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = %s", [postgres_schema]
        ).fetchone()
    assert found == (0,)


@pytest.mark.parametrize("store", ["", "sqlite", "memory://", "sqlite:///tmp/x.db"])
def test_a_store_that_is_not_postgresql_is_refused(store: str) -> None:
    result = _cli("--store", store, env={"APIARY_STORE": ""})
    assert result.exit_code == 2
    assert "--store must name the replicas' PostgreSQL store" in result.output


def test_an_unreachable_server_is_reported() -> None:
    result = _cli("--store", "postgresql://postgres@127.0.0.1:1/test?connect_timeout=2")
    assert result.exit_code == 1
    assert result.output.startswith("apiary cluster status: ")
    assert "cannot connect to PostgreSQL" in result.output
