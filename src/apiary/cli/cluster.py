"""`apiary cluster status`: the replicas of a cluster, who leases which partition and which
replica leads, read straight from the PostgreSQL store the replicas share
(docs/cluster.md).

It reads the store, not a coordinator: it works while replicas are down, which is when an
operator needs it. Access is the database's: whoever may connect with the DSN's credentials
may read the lease table; nothing is written. A replica's lag is the time since its last
heartbeat, on the database's clock: more than the lease renewal period (a third of
`lease_s`) means it is falling behind, more than `lease_s` that it is gone.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import typer
from rich.table import Table

from apiary.cli.output import console_for_output, utc_text
from apiary.core.cluster.assignment import ClusterView
from apiary.core.cluster.leases import Lease
from apiary.store.errors import StoreError
from apiary.store.postgres.cluster import read_cluster
from apiary.store.postgres.cluster_leader import read_leader

app = typer.Typer(no_args_is_help=True)  # help: cli/main.py SUBCOMMANDS

STORE = typer.Option(
    "",
    "--store",
    envvar="APIARY_STORE",
    metavar="URL",
    help="The replicas' PostgreSQL store: postgresql://...[?apiary_schema=NAME]",
)


@app.command()
def status(
    store: str = STORE,
    as_json: bool = typer.Option(False, "--json", help="One JSON document"),
) -> None:
    """Replicas (live or gone), partitions, their owners, epochs and expiries; the leader."""
    if store.partition(":")[0].lower() not in ("postgresql", "postgres"):
        typer.echo(
            "apiary cluster status: --store must name the replicas' PostgreSQL store "
            "(postgresql://...); cluster mode is PostgreSQL only",
            err=True,
        )
        raise typer.Exit(2)
    try:
        view = asyncio.run(read_cluster(store))
        leader = asyncio.run(read_leader(store))
    except StoreError as exc:
        typer.echo(f"apiary cluster status: {exc}", err=True)
        raise typer.Exit(1) from None
    doc = _document(view)
    doc["leader"] = _leader(leader)
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
    else:
        _print(view, doc)


def _document(view: ClusterView) -> dict[str, Any]:
    held: dict[str, int] = {}
    for owner in view.owners().values():
        held[owner] = held.get(owner, 0) + 1
    return {
        "now": view.now,
        "replicas": [
            {
                "replica_id": r.replica_id,
                "address": r.address,
                "live": r.live(view.now),
                "started_at": r.started_at,
                "heartbeat_at": r.heartbeat_at,
                "lag_s": round(max(view.now - r.heartbeat_at, 0.0), 3),
                "expires_at": r.expires_at,
                "partitions": held.get(r.replica_id, 0),
            }
            for r in view.replicas
        ],
        "partitions": [
            {
                "partition": lease.partition,
                "owner": lease.owner if lease.live(view.now) else None,
                "last_owner": lease.owner,
                "epoch": lease.epoch,
                "expires_at": lease.expires_at,
            }
            for lease in view.leases
        ],
        "unowned": sum(1 for lease in view.leases if not lease.live(view.now)),
    }


def _leader(found: tuple[Lease, str, float] | None) -> dict[str, Any] | None:
    """The leader's lease as the document shows it (docs/cluster.md, "The leader")."""
    if found is None:
        return None
    lease, address, now = found
    return {
        "replica_id": lease.owner if lease.live(now) else None,
        "last_replica_id": lease.owner,
        "address": address,
        "epoch": lease.epoch,
        "expires_at": lease.expires_at,
    }


def _print(view: ClusterView, doc: dict[str, Any]) -> None:
    console = console_for_output()
    if not view.leases:
        console.print("no replica has joined a cluster on this store yet", markup=False)
        return
    replicas = Table(title=f"Replicas ({len(view.live_replicas())} live)")
    for column in ("replica", "address", "state", "partitions", "heartbeat", "lag",
                   "expires in"):  # fmt: skip
        replicas.add_column(column, overflow="fold")
    for r in doc["replicas"]:
        replicas.add_row(
            r["replica_id"], r["address"], "live" if r["live"] else "gone",
            str(r["partitions"]), utc_text(r["heartbeat_at"]), f"{r['lag_s']:.1f} s",
            _left(r["expires_at"], view.now),
        )  # fmt: skip
    console.print(replicas)
    partitions = Table(title=f"Partitions ({len(view.leases)}, {doc['unowned']} unowned)")
    for column in ("partition", "owner", "epoch", "expires in"):
        partitions.add_column(column, overflow="fold")
    for p in doc["partitions"]:
        owner = p["owner"] or (f"none (was {p['last_owner']})" if p["last_owner"] else "none")
        partitions.add_row(
            str(p["partition"]), owner, str(p["epoch"]), _left(p["expires_at"], view.now)
        )
    console.print(partitions)
    leader = doc["leader"]
    if leader is not None:
        who = leader["replica_id"] or f"none (was {leader['last_replica_id'] or 'nobody'})"
        console.print(
            f"Leader: {who}, epoch {leader['epoch']}, at {leader['address'] or '-'}, "
            f"expires in {_left(leader['expires_at'], view.now)}",
            markup=False,
        )


def _left(expires_at: float, now: float) -> str:
    """Seconds until `expires_at`, or how long ago it passed."""
    if expires_at <= 0:
        return "-"
    left = expires_at - now
    return f"{left:.1f} s" if left > 0 else f"expired {-left:.1f} s ago"
