"""A partition's lease as a pure, table-driven machine.

A lease says which replica owns a partition (`owner`, None when free), until when
(`expires_at`, seconds on the one clock every replica's decisions are read against: the
database's, docs/cluster.md) and under which fencing `epoch`. The epoch grows by one each
time a term of ownership begins (an acquisition of a free lease, a takeover of an expired
one, an owner taking its own lapsed lease back) and never otherwise: a write that carries the
epoch it was decided under is refused once the partition has a newer term (store fencing),
so a replica that lost its lease without noticing cannot write over its successor.

`LeaseMachine.step(lease, replica, action, now, lease_s)` looks up the row for (how the lease
stands for `replica` at `now`, action) and returns the lease after it and the verdict. Every
(standing, action) pair has a row: a refusal (another replica holds it, the lease lapsed) is
an ordinary outcome of a race between replicas, not an error, and changes nothing.

Decisions:
- A renewal extends a live lease only. A lapsed lease is acquired again, with a new epoch,
  even by its own owner: between expiry and renewal a successor may have been due, and the
  owner itself stopped acting on it when its local deadline passed, so what it resumes is a
  new term.
- Acquiring a lease one already holds live renews it (an acquisition is idempotent).
- A release frees the lease at once (expires_at = now) and keeps its epoch: the next owner's
  acquisition bumps it. A release by a replica that does not hold the lease is refused.
- A lease is expired at `expires_at` itself (`expires_at <= now`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Final

from apiary.core.machine import TransitionTable


@dataclass(frozen=True, slots=True)
class Lease:
    """One partition's lease as stored."""

    partition: int
    owner: str | None = None
    """The replica holding it; None when free (never taken, or released)."""
    epoch: int = 0
    """The fencing epoch of the current (or last) term; 0 before the first."""
    expires_at: float = 0.0

    def live(self, now: float) -> bool:
        """Whether it is held and not expired at `now`."""
        return self.owner is not None and now < self.expires_at


class Standing(StrEnum):
    """How a lease stands for one replica at one instant."""

    FREE = "FREE"
    HELD_BY_ME = "HELD_BY_ME"
    LAPSED_MINE = "LAPSED_MINE"
    HELD_BY_OTHER = "HELD_BY_OTHER"
    LAPSED_OTHER = "LAPSED_OTHER"


class LeaseAction(StrEnum):
    """What a replica asks of a lease."""

    ACQUIRE = "ACQUIRE"
    RENEW = "RENEW"
    RELEASE = "RELEASE"


class Verdict(StrEnum):
    """What became of the request."""

    ACQUIRED = "ACQUIRED"
    """A new term for a free lease, or for the requester's own lapsed one: epoch + 1."""
    TOOK_OVER = "TOOK_OVER"
    """A new term for a lease another replica let lapse: epoch + 1, the old owner fenced."""
    RENEWED = "RENEWED"
    """The live term extended: same epoch."""
    RELEASED = "RELEASED"
    """Freed now: same epoch, no owner."""
    HELD_ELSEWHERE = "HELD_ELSEWHERE"
    """Refused: another replica holds it live."""
    LOST = "LOST"
    """Refused: not the requester's live lease (lapsed, taken over, or never held)."""
    NOT_OWNER = "NOT_OWNER"
    """Refused: a release by a replica that does not hold it."""

    @property
    def granted(self) -> bool:
        """Whether the lease changed as asked."""
        return self in _GRANTED

    @property
    def new_term(self) -> bool:
        """Whether a new term began (the epoch grew)."""
        return self in (Verdict.ACQUIRED, Verdict.TOOK_OVER)


_GRANTED: Final = frozenset(
    {Verdict.ACQUIRED, Verdict.TOOK_OVER, Verdict.RENEWED, Verdict.RELEASED}
)

_S, _A, _V = Standing, LeaseAction, Verdict
ROWS: Final = MappingProxyType(
    {
        _S.FREE: {_A.ACQUIRE: _V.ACQUIRED, _A.RENEW: _V.LOST, _A.RELEASE: _V.NOT_OWNER},
        _S.HELD_BY_ME: {_A.ACQUIRE: _V.RENEWED, _A.RENEW: _V.RENEWED, _A.RELEASE: _V.RELEASED},
        _S.LAPSED_MINE: {_A.ACQUIRE: _V.ACQUIRED, _A.RENEW: _V.LOST, _A.RELEASE: _V.RELEASED},
        _S.HELD_BY_OTHER: {
            _A.ACQUIRE: _V.HELD_ELSEWHERE, _A.RENEW: _V.LOST, _A.RELEASE: _V.NOT_OWNER,
        },
        _S.LAPSED_OTHER: {
            _A.ACQUIRE: _V.TOOK_OVER, _A.RENEW: _V.LOST, _A.RELEASE: _V.NOT_OWNER,
        },
    }
)  # fmt: skip
"""(standing, action) -> verdict; every pair has a row."""


@dataclass(frozen=True, slots=True)
class LeaseStep:
    """A lease after a request, and what became of the request."""

    lease: Lease
    verdict: Verdict


def standing(lease: Lease, replica: str, now: float) -> Standing:
    """How `lease` stands for `replica` at `now`."""
    if lease.owner is None:
        return Standing.FREE
    mine = lease.owner == replica
    if lease.live(now):
        return Standing.HELD_BY_ME if mine else Standing.HELD_BY_OTHER
    return Standing.LAPSED_MINE if mine else Standing.LAPSED_OTHER


class LeaseMachine:
    """The lease rules (module docstring)."""

    TRANSITIONS: Final = TransitionTable(ROWS, "partition lease")

    @classmethod
    def step(
        cls, lease: Lease, replica: str, action: LeaseAction, now: float, lease_s: float
    ) -> LeaseStep:
        """The lease after `replica` asks `action` of it at `now`; a granted acquisition
        or renewal runs until `now + lease_s`. ValueError for an empty replica id or a
        lease_s that is not positive (a caller's bug, not a race)."""
        if not replica:
            raise ValueError("a lease request needs the replica's id")
        if not lease_s > 0:
            raise ValueError(f"lease_s must be > 0, not {lease_s}")
        verdict = cls.TRANSITIONS.step(standing(lease, replica, now), action)
        if verdict.new_term:
            after = Lease(lease.partition, replica, lease.epoch + 1, now + lease_s)
        elif verdict is Verdict.RENEWED:
            after = replace(lease, expires_at=now + lease_s)
        elif verdict is Verdict.RELEASED:
            after = replace(lease, owner=None, expires_at=now)
        else:
            after = lease
        return LeaseStep(after, verdict)


def markdown() -> str:
    """The lease table as a markdown table (docs/cluster.md, generated)."""
    actions = list(LeaseAction)
    lines = [
        "| how the lease stands for the replica | " + " | ".join(a.value for a in actions) + " |",
        "|---" * (len(actions) + 1) + "|",
    ]
    for state, row in ROWS.items():
        cells = " | ".join(_cell(row[a]) for a in actions)
        lines.append(f"| {state.value} | {cells} |")
    return "\n".join(lines) + "\n"


def _cell(verdict: Verdict) -> str:
    if verdict.new_term:
        return f"{verdict.value} (epoch + 1)"
    return verdict.value if verdict.granted else f"refused: {verdict.value}"
