"""Credit-based flow control (RFC 13.1): per recipient, how many of each producer's messages
may be in flight at once; with adaptation on, each recipient's window follows its latency.

Off (`credit_window` 0) it holds nothing and admission never asks it.
"""

from __future__ import annotations

from apiary.core.credit_adaptation import AdaptivePolicy, CreditAdapter
from apiary.core.credits import CreditLedger
from apiary.core.records import StoredMessage
from apiary.engine.eventlog import EventRecorder
from apiary.engine.notices import COORDINATOR
from apiary.engine.settings import RouterSettings, adaptive_policy
from apiary.errors import BufferFullError


class CreditControl:
    def __init__(self, settings: RouterSettings, events: EventRecorder) -> None:
        self._window = settings.credit_window
        self._cap = settings.per_producer_cap or None
        self._policy: AdaptivePolicy | None = (
            adaptive_policy(settings) if settings.credit_adaptive else None
        )
        self._events = events
        self._ledgers: dict[str, CreditLedger] = {}
        self._adapters: dict[str, CreditAdapter] = {}
        self.enabled = bool(self._window)
        """Whether admission takes a credit per message (read per message: an attribute)."""
        self.adaptive = self._policy is not None
        """Whether finished messages' service times resize the windows (`observe`)."""
        self.in_store = False
        """Cluster mode: credits are counted by the store in each admitting transaction,
        over every replica's messages (`bound`), not in this replica's ledgers: a message
        admitted here may finish on another replica, whose release this one never sees."""

    def consume(self, recipient: str, producer: str) -> None:
        """Take one of `producer`'s credits at `recipient`; BufferFullError when none is left
        (nothing when `in_store`: the store decides)."""
        if self.in_store:
            return
        decision = self._ledger(recipient).try_consume(producer)
        if not decision.granted:
            raise BufferFullError(
                f"no credit for {producer} at {recipient}: {decision.reason}",
                {"recipient": recipient, "reason": "credit"},
            )

    def release(self, message: StoredMessage) -> None:
        """Give back the credit `message` took (its recipient acknowledged or it ended)."""
        if self.in_store:
            return
        ledger = self._ledgers.get(message.recipient)
        if ledger is not None and ledger.in_flight(message.producer_id) > 0:
            ledger.release(message.producer_id)

    def observe(self, recipient: str, latency_s: float) -> None:
        """Let the recipient's credit window follow its delivery latency (RFC 13.1)."""
        ledger = self._ledgers.get(recipient)
        adapter = self._adapters.get(recipient)
        if ledger is None or adapter is None:
            return
        change = adapter.observe(latency_s)
        if change is not None:
            ledger.resize(change.after)
            self._events.note(
                "credit.window_changed", COORDINATOR, agent_id=recipient,
                before=change.before, after=change.after, reason=change.reason,
                smoothed_latency_s=round(change.smoothed_latency_s, 6),
            )  # fmt: skip

    def bound(self, recipient: str) -> tuple[int, int]:
        """The recipient's credit window and the per-producer cap the store holds an
        admission to (`in_store`; 0: none): the window as it stands here (adapted by what
        this replica observed, with adaptation on)."""
        if not self.enabled:
            return 0, 0
        return self._ledger(recipient).window, self._cap or 0

    def window(self, recipient: str) -> int | None:
        """The recipient's current credit window (None until it has one)."""
        ledger = self._ledgers.get(recipient)
        return None if ledger is None else ledger.window

    def _ledger(self, recipient: str) -> CreditLedger:
        ledger = self._ledgers.get(recipient)
        if ledger is None:
            ledger = self._ledgers[recipient] = CreditLedger(self._window, self._cap)
            if self._policy is not None:
                self._adapters[recipient] = CreditAdapter(self._window, self._policy)
        return ledger
