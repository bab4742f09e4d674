"""Delivery of NEGOTIATION events (RFC 17.1) to a negotiation's participants.

Each event becomes one NEGOTIATION envelope from the coordinator whose payload is the
event's JSON bytes, with correlation_id = negotiation_id; every participant receives the same
bytes. The caller holds the negotiation's lock, and events are handed to the router one
after the other, so each participant's inbox holds them in the order of the service stream.
Coordinator envelopes are notices: durable in the inbox until handed out, no buffer space,
no acknowledgement needed. A participant that is not registered (any more) misses the event;
that is logged, and the negotiation goes on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from apiary.core.envelope import MessageType
from apiary.core.negotiation.events import encode
from apiary.engine.eventlog import EventRecorder
from apiary.engine.notices import NoticeFactory
from apiary.engine.router.router import Router
from apiary.errors import ApiaryError

CONTENT_TYPE = "application/json"


class Fanout:
    def __init__(self, router: Router, notices: NoticeFactory, events: EventRecorder) -> None:
        self._router = router
        self._notices = notices
        self._events = events

    async def send(
        self, negotiation_id: str, participants: Sequence[str], docs: Sequence[Mapping[str, Any]]
    ) -> list[bytes]:
        """Deliver each event to every participant, in order; returns the payloads."""
        payloads = []
        for doc in docs:
            payload = encode(doc)
            payloads.append(payload)
            for agent in participants:
                env = self._notices.envelope(
                    MessageType.NEGOTIATION, payload, CONTENT_TYPE, negotiation_id
                )
                try:
                    outcome = await self._router.notify(agent, env)
                    failure = "" if outcome.accepted else outcome.reason or str(outcome.error)
                except ApiaryError as exc:
                    failure = str(exc)
                if failure:
                    await self._events.record(
                        "negotiation.fanout_failed", "scheduler", correlation_id=negotiation_id,
                        negotiation_id=negotiation_id, agent=agent, kind=doc.get("kind"),
                        reason=failure,
                    )  # fmt: skip
        return payloads
