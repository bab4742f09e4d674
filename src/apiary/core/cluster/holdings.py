"""What one replica believes it owns, and until when on its own monotonic clock.

The database decides who holds a lease; the replica must stop acting on a partition before
the database could give it to another. It cannot read the database's clock on every step,
so it counts on its own: a lease granted by a request sent at local time `t` runs until
`t + lease_s` locally at most (the database set `expires_at` from its clock at or after
receiving the request, which is no earlier). Past that local deadline the partition is not
owned here any more, whether or not the keeper has run since: `owned(now)` decides at the
moment it is asked. Fencing (docs/cluster.md) is what makes a late write harmless; this is
what keeps a replica from attempting one in the common case.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Term:
    """A term of ownership held here: its epoch and its local deadline."""

    epoch: int
    until: float
    """Local monotonic time after which the term is not acted on."""


class Holdings:
    """The terms this replica holds (module docstring)."""

    def __init__(self) -> None:
        self._terms: dict[int, Term] = {}

    def granted(self, partition: int, epoch: int, sent_at: float, lease_s: float) -> None:
        """The database granted (or renewed) `partition` under `epoch` for a request sent
        at local time `sent_at`."""
        self._terms[partition] = Term(epoch, sent_at + lease_s)

    def dropped(self, partitions: Iterable[int]) -> None:
        """Released, refused or taken over: not held any more."""
        for p in partitions:
            self._terms.pop(p, None)

    def clear(self) -> None:
        self._terms.clear()

    def owned(self, now: float) -> dict[int, int]:
        """Partition -> epoch of every term still within its local deadline at `now`."""
        return {p: t.epoch for p, t in self._terms.items() if now < t.until}

    def epoch(self, partition: int, now: float) -> int | None:
        """The epoch `partition` is held under at `now`, None when it is not held."""
        term = self._terms.get(partition)
        return term.epoch if term is not None and now < term.until else None

    def terms(self) -> Mapping[int, Term]:
        """Every term recorded, lapsed ones included (until the keeper drops them)."""
        return dict(self._terms)
