"""Credit-based flow control for one receiver (RFC 13.1, the optional profile).

A receiver advertises a window: the most deliveries it accepts in flight. A delivery consumes
one credit when it is sent and gives it back only on its terminal acknowledgement (FULFILLED
or a terminal error). On top of the window:

- a per-producer cap (optional) stops one producer from holding more than `cap` credits;
- fair share: while another producer is *waiting* and below its fair share, a producer that
  already holds its fair share, ceil(window / active producers), is denied, so the next
  credit freed goes to the one that is short. Active producers are those holding credits or
  waiting. A producer becomes waiting when it is denied for lack of credit, or explicitly
  through `note_waiting` (e.g. the engine knows it has queued messages); it stops waiting
  when it is granted a credit (so nothing stale is left behind by producers that got what
  they asked for: one with more queued is noted again) or through `cancel_waiting`. A
  waiting producer that goes away must be cancelled, or it keeps others at their share.

The ledger is pure: no clock, no I/O. Its window may be resized (`resize`, driven by
`core.credit_adaptation` when windows adapt): a smaller window revokes no credit in flight, it
only grants none until the credits in flight drop below it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from apiary.errors import ValidationError


class CreditReason(StrEnum):
    """Why a credit was granted or denied."""

    GRANTED = "granted"
    WINDOW_EXHAUSTED = "window_exhausted"
    """The receiver's whole window is in flight."""
    PRODUCER_CAP = "producer_cap"
    """This producer holds its per-producer cap."""
    FAIR_SHARE = "fair_share"
    """This producer holds its fair share while another waits below its own."""


@dataclass(frozen=True, slots=True)
class CreditDecision:
    """The answer to one `try_consume`."""

    granted: bool
    reason: CreditReason


class CreditLedger:
    """The credits of one receiver, shared by every producer that sends to it."""

    def __init__(self, window: int, per_producer_cap: int | None = None) -> None:
        """`window` >= 1; `per_producer_cap` >= 1 or None (no cap). Else ValidationError."""
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValidationError.for_field(
                "credits.window", f"must be an integer >= 1, got {window!r}"
            )
        cap = per_producer_cap
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ValidationError.for_field(
                "credits.per_producer_cap", f"must be an integer >= 1 or None, got {cap!r}"
            )
        self._window = window
        self._cap = cap
        self._in_flight: dict[str, int] = {}
        self._waiting: set[str] = set()
        self._total = 0

    @property
    def window(self) -> int:
        """The advertised credit window."""
        return self._window

    @property
    def per_producer_cap(self) -> int | None:
        """The per-producer cap, or None when there is none."""
        return self._cap

    @property
    def waiting(self) -> frozenset[str]:
        """Producers currently waiting for a credit."""
        return frozenset(self._waiting)

    def in_flight(self, producer: str) -> int:
        """Credits `producer` holds."""
        return self._in_flight.get(producer, 0)

    def total_in_flight(self) -> int:
        """Credits held by all producers together."""
        return self._total

    def available(self) -> int:
        """Credits not in flight (0 while a shrunk window is still overcommitted)."""
        return max(self._window - self._total, 0)

    def resize(self, window: int) -> None:
        """Advertise a new window (>= 1). Credits in flight stay valid: above a smaller
        window, nothing is granted until enough of them are released."""
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValidationError.for_field(
                "credits.window", f"must be an integer >= 1, got {window!r}"
            )
        self._window = window

    def fair_share(self, producer: str) -> int:
        """ceil(window / active producers), counting `producer` as active."""
        active = {p for p, n in self._in_flight.items() if n > 0} | self._waiting | {producer}
        return math.ceil(self._window / len(active))

    def try_consume(self, producer: str) -> CreditDecision:
        """Take one credit for a delivery from `producer`, or say why not.

        A denial changes nothing except that, when credit was lacking (window exhausted or
        fair share), the producer is now waiting. Checks in order: window, cap, fair share.
        """
        _check_producer(producer)
        held = self.in_flight(producer)
        if self._total >= self._window:
            self._waiting.add(producer)
            return CreditDecision(False, CreditReason.WINDOW_EXHAUSTED)
        if self._cap is not None and held >= self._cap:
            return CreditDecision(False, CreditReason.PRODUCER_CAP)
        share = self.fair_share(producer)
        if held >= share and self._someone_short(producer, share):
            self._waiting.add(producer)
            return CreditDecision(False, CreditReason.FAIR_SHARE)
        self._in_flight[producer] = held + 1
        self._total += 1
        self._waiting.discard(producer)
        return CreditDecision(True, CreditReason.GRANTED)

    def release(self, producer: str) -> None:
        """Give back one credit on a terminal acknowledgement of `producer`'s delivery.

        Raises ValueError when `producer` holds no credit: releasing more than was consumed
        would let the receiver's window grow without it saying so.
        """
        held = self.in_flight(producer)
        if held == 0:
            raise ValueError(f"producer {producer!r} holds no credit to release")
        if held == 1:
            del self._in_flight[producer]
        else:
            self._in_flight[producer] = held - 1
        self._total -= 1

    def note_waiting(self, producer: str) -> None:
        """Record that `producer` has deliveries waiting for this receiver's credit."""
        _check_producer(producer)
        self._waiting.add(producer)

    def cancel_waiting(self, producer: str) -> None:
        """Record that `producer` no longer waits (its queue drained, or it went away)."""
        self._waiting.discard(producer)

    def _someone_short(self, producer: str, share: int) -> bool:
        # Only a waiting producer below the fair share holds the credit back; one at or over
        # it could not be helped by the denial, and the credit would sit idle. The share is
        # the same for everyone: the requester holds credits, so it is already active. (A
        # waiter's cap needs no check: caps are uniform, so a waiter at its cap below the
        # share means the requester, over the share, was already denied by its own cap.)
        return any(other != producer and self.in_flight(other) < share for other in self._waiting)


def _check_producer(producer: str) -> None:
    if not producer:
        raise ValueError("producer must be a non-empty id")
