"""Agent handoffs from the agent's side (RFC 17.6; docs/handoff.md).

    class Reviewer(apiary.Agent):
        capabilities = ("security-review",)

        async def on_handoff(self, offer: apiary.Handoff) -> None:
            if self.too_busy():
                raise apiary.Rejected(note="on leave this week")   # RejectHandoff
            # returning accepts it (AcceptHandoff)

        async def on_handoff_completed(self, handoff: apiary.Handoff) -> None:
            await self.resume(handoff.json())                    # the context_snapshot

    # The origin:
    ticket = await agent.handoff("reviewer", context={"todo": [...]},
                                 capabilities=["security-review"], reason="needs review")
    if await ticket.outcome() == "ACCEPTED":
        ...                                                      # stop work on the context
        await ticket.complete()

`HandoffClient` makes the five calls of the canonical HandoffService as one agent (and reads
a handoff through apiary.v1.HandoffQueryService, which also gives the snapshot's declared
content type). `HandoffDesk` is what `apiary.Agent` runs: it turns the coordinator's handoff
notifications into `on_handoff` / `on_handoff_completed` calls and ticket updates, and asks
for pending offers with GetPendingHandoffs when the agent starts and every `handoff_poll_s`
(RFC 17.6: "particularly after recovery from failure states").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from apiary.errors import ApiaryError
from apiary.sdk import errors
from apiary.wire import pb
from apiary.wire.convert import timestamp_to_float
from apiary.wire.handoff import SNAPSHOT_CONTENT_TYPE_KEY, duration_seconds, seconds_duration

log = logging.getLogger("apiary.sdk.handoff")

AGENT_KEY = "sw4rm-agent-id"
JSON = "application/json"
ANSWERED = frozenset({"ACCEPTED", "COMPLETED"})
"""States that end a ticket's wait at once; REJECTED and EXPIRED end it once final."""
h = pb.handoff_pb2
a = pb.apiary_pb2


@dataclass(frozen=True, slots=True)
class Handoff:
    """One handoff as an agent sees it; `snapshot` is empty unless the agent may read it."""

    request_id: str
    from_agent: str
    to_agent: str
    state: str
    reason: str = ""
    capabilities_required: tuple[str, ...] = ()
    priority: int = 0
    attempt: int = 1
    timeout_s: float = 0.0
    snapshot: bytes = b""
    content_type: str = ""
    """The snapshot's declared media type ("" when undeclared: opaque bytes)."""
    accepting_agent: str = ""
    rejection_reason: str = ""
    deadline: float = 0.0

    def text(self) -> str:
        return self.snapshot.decode("utf-8")

    def json(self) -> Any:
        """The snapshot decoded as JSON (None when empty)."""
        return json.loads(self.snapshot) if self.snapshot else None

    @classmethod
    def from_view(cls, view: a.HandoffView) -> Handoff:
        r = view.request
        return cls(
            request_id=r.request_id, from_agent=r.from_agent, to_agent=r.to_agent,
            state=h.HandoffStatus.Name(view.status), reason=r.reason,
            capabilities_required=tuple(r.capabilities_required), priority=r.priority,
            attempt=view.attempt, timeout_s=duration_seconds(r.timeout),
            snapshot=bytes(r.context_snapshot), content_type=view.snapshot_content_type,
            accepting_agent=view.accepting_agent, rejection_reason=view.rejection_reason,
            deadline=timestamp_to_float(view.deadline),
        )  # fmt: skip


class HandoffClient:
    """The handoff calls of one agent over a channel; failures raise `apiary.errors`."""

    def __init__(self, channel: grpc.aio.Channel, agent_id: str) -> None:
        self.agent_id = agent_id
        self._handoff = pb.handoff_pb2_grpc.HandoffServiceStub(channel)
        self._query = pb.apiary_pb2_grpc.HandoffQueryServiceStub(channel)
        self._as = ((AGENT_KEY, agent_id),)

    async def request(
        self,
        to_agent: str = "",
        *,
        context: Any,
        content_type: str | None = None,
        reason: str = "",
        capabilities: Sequence[str] = (),
        priority: int = 0,
        timeout_s: float | None = None,
        request_id: str = "",
    ) -> str:
        """Hand work off to `to_agent` ("" routes by `capabilities`); returns the request_id.

        `context` is the snapshot: bytes as they are (declare `content_type` for them), any
        other value as JSON (application/json).
        """
        snapshot = context if isinstance(context, bytes) else json.dumps(context).encode()
        declared = content_type if content_type is not None else _default_type(context)
        message = h.HandoffRequest(
            request_id=request_id or str(uuid.uuid4()), from_agent=self.agent_id,
            to_agent=to_agent, reason=reason, context_snapshot=snapshot,
            capabilities_required=list(capabilities), priority=priority,
        )  # fmt: skip
        if timeout_s is not None:
            message.timeout.CopyFrom(seconds_duration(timeout_s))
        metadata = self._as + (((SNAPSHOT_CONTENT_TYPE_KEY, declared),) if declared else ())
        await errors.call(lambda: self._handoff.RequestHandoff(message, metadata=metadata))
        return message.request_id

    async def accept(self, request_id: str) -> None:
        message = h.HandoffResponse(
            request_id=request_id, accepted=True, accepting_agent=self.agent_id
        )
        await errors.call(lambda: self._handoff.AcceptHandoff(message, metadata=self._as))

    async def reject(self, request_id: str, reason: str) -> None:
        message = h.HandoffResponse(
            request_id=request_id, accepting_agent=self.agent_id, rejection_reason=reason
        )
        await errors.call(lambda: self._handoff.RejectHandoff(message, metadata=self._as))

    async def complete(self, request_id: str) -> str:
        """Report the handoff COMPLETED: the context is transferred (and no longer ours)."""
        message = h.CompleteHandoffRequest(request_id=request_id, status=h.COMPLETED)
        reply = await errors.call(lambda: self._handoff.CompleteHandoff(message, metadata=self._as))
        return str(reply.message)

    async def pending(self) -> list[h.HandoffRequest]:
        """The offers waiting for this agent's answer (GetPendingHandoffs), most urgent first."""
        message = h.GetPendingHandoffsRequest(agent_id=self.agent_id)
        reply = await errors.call(
            lambda: self._handoff.GetPendingHandoffs(message, metadata=self._as)
        )
        return list(reply.pending_requests)

    async def get(self, request_id: str, *, snapshot: bool = True) -> Handoff:
        """One handoff, with its snapshot when asked (permission_denied when this agent may
        not read it: the origin after completion)."""
        message = a.GetHandoffRequest(request_id=request_id, include_snapshot=snapshot)
        view = await errors.call(lambda: self._query.GetHandoff(message, metadata=self._as))
        return Handoff.from_view(view)


class HandoffTicket:
    """The origin's view of one handoff it requested, kept current by notifications."""

    def __init__(self, client: HandoffClient, request_id: str) -> None:
        self.request_id = request_id
        self.state = "PENDING"
        self.updates: list[dict[str, Any]] = []
        """Every handoff notification received for it, oldest first."""
        self._client = client
        self._settled = asyncio.Event()

    def update(self, body: dict[str, Any]) -> None:
        self.updates.append(body)
        self.state = str(body.get("state", self.state))
        # REJECTED and EXPIRED are final only when no reroute follows: the coordinator says
        # which with handoff.rerouted or handoff.not_rerouted.
        final = body.get("event") == "handoff.not_rerouted"
        if self.state in ANSWERED or final:
            self._settled.set()
        elif body.get("event") == "handoff.rerouted":
            self._settled.clear()

    async def outcome(self, timeout_s: float | None = None) -> str:
        """Wait until the handoff is accepted (or completed), or finally rejected or expired;
        returns that state."""
        async with asyncio.timeout(timeout_s):
            await self._settled.wait()
        return self.state

    async def complete(self) -> str:
        return await self._client.complete(self.request_id)


OfferHandler = Callable[[Handoff], Awaitable[object]]


class HandoffDesk:
    """Runs an agent's side of handoffs: offers to `on_offer` (returning accepts it, raising
    rejects it with the error's text), completions to `on_completed`, updates to tickets."""

    def __init__(
        self,
        client: HandoffClient,
        on_offer: OfferHandler | None,
        on_completed: OfferHandler | None,
        refusal: Callable[[BaseException], str],
    ) -> None:
        self.client = client
        self.tickets: dict[str, HandoffTicket] = {}
        self._on_offer = on_offer
        self._on_completed = on_completed
        self._refusal = refusal
        self._notices: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._offered: set[str] = set()

    def notice(self, body: dict[str, Any]) -> None:
        """A handoff NOTIFICATION from the coordinator (called from the inbound reader)."""
        self._notices.put_nowait(body)

    def ticket(self, request_id: str) -> HandoffTicket:
        found = self.tickets.get(request_id)
        if found is None:
            found = self.tickets[request_id] = HandoffTicket(self.client, request_id)
        return found

    async def run(self, poll_s: float) -> None:
        """Forever: offers found by GetPendingHandoffs now and every `poll_s` (0: only now),
        and notifications as they come, one at a time."""
        poller = asyncio.ensure_future(self._poll(poll_s))
        try:
            while True:
                await self._handle(await self._notices.get())
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller

    async def _poll(self, poll_s: float) -> None:
        if self._on_offer is None:
            return  # an agent that takes no handoffs has nothing to look for
        while True:
            try:
                for offer in await self.client.pending():
                    self._notices.put_nowait(
                        {"event": "handoff.pending", "request_id": offer.request_id,
                         "from_agent": offer.from_agent, "to_agent": offer.to_agent,
                         "state": "PENDING"}
                    )  # fmt: skip
            except ApiaryError as exc:
                log.warning("%s: GetPendingHandoffs failed: %s", self.client.agent_id, exc)
            if poll_s <= 0:
                return
            await asyncio.sleep(poll_s)

    async def _handle(self, body: dict[str, Any]) -> None:
        me = self.client.agent_id
        request_id = str(body.get("request_id", ""))
        ticket = self.tickets.get(request_id) if body.get("from_agent") == me else None
        if ticket is not None:
            ticket.update(body)
            if ticket.state == "COMPLETED" or body.get("event") == "handoff.not_rerouted":
                del self.tickets[request_id]  # nothing more will come for it
        if body.get("to_agent") != me:
            return
        try:
            if body.get("state") == "PENDING":
                await self._offer(request_id)
            elif body.get("event") == "handoff.completed" and self._on_completed is not None:
                await self._on_completed(await self.client.get(request_id))
        except ApiaryError as exc:
            log.warning("%s: handoff %s: %s", me, request_id, exc)
        except Exception:  # a failing callback must not stop the agent's handoffs
            log.exception("%s: handling handoff %s failed", me, request_id)

    async def _offer(self, request_id: str) -> None:
        # A target is offered a handoff once: rerouting never comes back to it.
        if self._on_offer is None or request_id in self._offered:
            return
        self._offered.add(request_id)
        offer = await self.client.get(request_id)
        try:
            await self._on_offer(offer)
        except Exception as exc:  # any refusal becomes the rejection reason
            await self.client.reject(request_id, self._refusal(exc))
            return
        await self.client.accept(request_id)


def _default_type(context: Any) -> str:
    return "" if isinstance(context, bytes) else JSON
