"""The writes of the cluster leader's components (docs/cluster.md, "The leader"): the
Scheduler's tasks, HITL's invocations, workflows, handoffs, rooms and negotiations.

`SqlStore` builds those aggregates' stores over `LeaderWrites`, a `SqlDatabase` that runs
their writes on the store's database. Outside cluster mode it does nothing more (no
statement is added: `fence` is None). In cluster mode the replica's leader role sets
`fence`: each write then runs in a transaction that first locks the leader's row of
`cluster_leader` FOR KEY SHARE and checks that the lease is still this replica's term
(`check_leader_term`; the same check fences the leader's reads of the relay), else
FencedError, with nothing written, and the fence is told (`LeaderTerm.refused`: the
replica stops leading). A takeover locks the row FOR UPDATE, which waits for every KEY
SHARE holder, so every write of a term commits before the next term begins and none after
it. The table exists in PostgreSQL only: a fence is only ever set there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar, TypeVarTuple

from apiary.core.cluster.leases import Lease
from apiary.store.cluster import LEADER, LEADER_PARTITION, FencedError
from apiary.store.sql.database import SqlDatabase
from apiary.store.sql.dialect import Dialect
from apiary.store.sql.statements import QueryOne, Statement, Transaction

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

LEADER_TABLE = "cluster_leader"
"""The leader's table of the store's own schema: the cluster's (a tenant's store names the
cluster's schema's, `LeaderWrites.table`)."""


class LeaderTerm(Protocol):
    """The term the leader's writes are made under (the leader role, engine/cluster)."""

    def term(self) -> tuple[str, int]:
        """(replica id, epoch) of the last term this replica held as leader (epoch 0 when
        it never led: every write is refused)."""
        ...

    def refused(self, error: FencedError) -> None:
        """A write was refused: another term began (or none is held). Called before the
        error is raised to the writer."""
        ...


def check_leader_term(
    _d: Dialect, replica_id: str, epoch: int, table: str = LEADER_TABLE
) -> Transaction[None]:
    """Lock the leader's row of `table` FOR KEY SHARE (until the transaction ends) and check
    that the lease is `replica_id`'s term `epoch`; FencedError otherwise."""
    term = f"SELECT owner, epoch, expires_at FROM {table} WHERE name = ? FOR KEY SHARE"
    row = yield from QueryOne(term, (LEADER,))
    owner, found_epoch, expires_at = row if row is not None else (None, 0, 0.0)
    found = Lease(LEADER_PARTITION, owner, int(found_epoch), float(expires_at))
    if found.owner != replica_id or found.epoch != epoch:
        raise FencedError(LEADER_PARTITION, epoch, found)


def fenced(
    d: Dialect, replica_id: str, epoch: int, table: str, work: Any, args: tuple[Any, ...]
) -> Transaction[Any]:
    """`check_leader_term` on `table`, then `work` (a statement, or a transaction function
    with `args`), in one transaction."""
    yield from check_leader_term(d, replica_id, epoch, table)
    if isinstance(work, Statement):
        return (yield from type(work)(work.sql, args[0] if args else work.params))
    return (yield from work(d, *args))


class LeaderWrites:
    """`SqlDatabase` of the leader's components' stores (module docstring)."""

    def __init__(self, database: SqlDatabase) -> None:
        self._db = database
        self.fence: LeaderTerm | None = None
        """Cluster mode: the leader's term every write is checked against."""
        self.table = LEADER_TABLE
        """The leader's table the term is read in: another tenant's store names the
        cluster's schema's (`store.postgres.cluster.qualified`)."""

    @property
    def dialect(self) -> Dialect:
        return self._db.dialect

    async def write(
        self, work: Statement[T] | Callable[[Dialect, *Ts], Transaction[T]], /, *args: *Ts
    ) -> T:
        fence = self.fence
        if fence is None:
            return await self._db.write(work, *args)  # type: ignore[arg-type]
        replica_id, epoch = fence.term()
        try:
            result: T = await self._db.write(fenced, replica_id, epoch, self.table, work, args)
        except FencedError as exc:
            fence.refused(exc)
            raise
        return result

    async def read(
        self, work: Statement[T] | Callable[[Dialect, *Ts], Transaction[T]], /, *args: *Ts
    ) -> T:
        return await self._db.read(work, *args)  # type: ignore[arg-type]
