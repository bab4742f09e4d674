"""Delivery to agents over their inbound stream (RFC 5.5, 7.3; DESIGN.md section 5).

At-least-once: a message handed out and not acknowledged is handed out again on the
agent's next stream (after a reconnect or a coordinator restart). One stream per agent: a
newer stream supersedes an older one. Each read hands out at most `max_batch` messages, so
backlog replay is bounded in memory and latency.

Each hand-out starts the message's ACK deadline (DELIVER, REDELIVER); when the agent's last
stream ends, the deadlines of what it held unacknowledged stop (STREAM_LOST) and its
messages wait for the next stream, bounded by their TTL and the maximum age.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from functools import lru_cache
from typing import Protocol

from apiary.core.message_machine import MessageInput
from apiary.core.records import StoredMessage, handed_out
from apiary.engine.eventlog import EventRecorder
from apiary.engine.notices import COORDINATOR
from apiary.engine.registry import Registry
from apiary.engine.router.admission import is_notice
from apiary.engine.router.inbox import Handout, Inbox
from apiary.engine.router.router import Router
from apiary.errors import (
    AgentUnavailableError,
    AlreadyInProgressError,
    ResumeExpiredError,
    ValidationError,
)
from apiary.store.protocols import MessageStore

log = logging.getLogger("apiary.delivery")

STARVATION_WARN_EVERY_S = 60.0
"""At most one starvation-risk warning per agent in this many seconds."""


STREAM_RELEASE_WAIT_S = 2.0
"""How long a new stream that cannot take over waits for the live one to end: a client that
closes its stream and opens another at once is not refused for the moment its old one takes
to be seen closed."""


async def _released(inbox: Inbox) -> bool:
    """Whether the inbox's live streams end within STREAM_RELEASE_WAIT_S and no other new
    stream took the inbox first (of several waiting, one opens: the first to wake)."""
    session = inbox.session
    inbox.released.clear()
    try:
        async with asyncio.timeout(STREAM_RELEASE_WAIT_S):
            await inbox.released.wait()
    except TimeoutError:
        return False
    return not inbox.streams and inbox.session == session


def resume_token(agent_id: str, offset: int) -> str:
    """Opaque resume token (RFC 5.5): encodes the agent and the position (one per delivery,
    so it is built without JSON)."""
    raw = f'{{"a":{_json_string(agent_id)},"o":{offset},"v":1}}'.encode()
    # base64.urlsafe_b64encode, minus its two Python frames (a token per delivery).
    return binascii.b2a_base64(raw, newline=False).translate(_URLSAFE).decode().rstrip("=")


_URLSAFE = bytes.maketrans(b"+/", b"-_")


@lru_cache(maxsize=4096)
def _json_string(text: str) -> str:
    """`text` as a JSON string (cached: a token per delivery, for a handful of agents)."""
    return json.dumps(text)


def parse_resume_token(token: str, agent_id: str) -> int:
    try:
        doc = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        offset = int(doc["o"])
        owner = str(doc["a"])
    except (ValueError, KeyError, TypeError):
        raise ValidationError.for_field(
            "resume_token", "is not a token this server issued"
        ) from None
    if owner != agent_id:
        raise ValidationError.for_field("resume_token", f"belongs to {owner}, not {agent_id}")
    return offset


AgentSignal = Callable[[str], Awaitable[None]]
"""Called with an agent's id when its stream reaches a point (see `Delivery`)."""


class StreamFollower(Protocol):
    """Cluster mode's part in an agent's streams (engine/cluster/follower.py): the agent's
    messages are read from the store the replicas share when a stream opens here, and
    followed while one is open."""

    async def opening(self, agent_id: str, take_over: bool) -> None:
        """A stream of `agent_id` is about to open here (before its session starts):
        AlreadyInProgressError when another replica's stream of the agent is live and
        `take_over` is false; with `take_over`, that stream is superseded."""

    def closed(self, agent_id: str, session: int) -> None:
        """The last stream of `agent_id` here ended; `session` is its inbox's session then."""


class Delivery:
    def __init__(
        self, router: Router, registry: Registry, messages: MessageStore, events: EventRecorder,
        opened: AgentSignal, connected: AgentSignal,
    ) -> None:  # fmt: skip
        """`opened` is called when a stream opens: the agent is ready for work (the
        Scheduler's readiness signal, RFC 8.1). `connected` is called once the stream counts
        as open (`Router.streaming`), before its first batch: Presence sends the agent the
        current directory."""
        self._router = router
        self._live = router.live
        self._lifecycle = router.lifecycle
        self._registry = registry
        self._messages = messages
        self._events = events
        self._opened = opened
        self._connected = connected
        self.follower: StreamFollower | None = None
        """Cluster mode only: see `StreamFollower`; None, the default, changes nothing."""

    async def _check_position(self, agent_id: str, resume_after: int) -> None:
        if resume_after <= 0:
            return
        last = await self._messages.inbox(agent_id, resume_after - 1, 1)
        oldest = await self._messages.oldest_offset(agent_id)
        if oldest and resume_after < oldest - 1:
            raise ResumeExpiredError(
                f"resume position {resume_after} of {agent_id} has expired: the oldest "
                f"retained offset is {oldest}. Reconnect with resume_after=0 to receive every "
                "unacknowledged message again.",
                {"resume_after": str(resume_after), "oldest_offset": str(oldest)},
            )
        if not last and not oldest:
            raise ResumeExpiredError(
                f"resume position {resume_after} is unknown for {agent_id}: its inbox is "
                "empty. Reconnect with resume_after=0.",
                {"resume_after": str(resume_after)},
            )

    async def open(self, agent_id: str, resume_after: int = 0, *, take_over: bool = True) -> int:
        """Start a new stream session for the agent; returns its session number.

        A live stream of the agent is superseded (the hand-over of a reconnecting agent) only
        when `take_over`: the caller proved it is the agent; else the new stream is refused,
        so that nobody else can read the agent's messages or spend its deliveries."""
        await self._registry.get(agent_id)
        await self._check_position(agent_id, resume_after)
        inbox = self._router.inbox(agent_id)
        if inbox.streams and not take_over and not await _released(inbox):
            raise AlreadyInProgressError(
                f"{agent_id} already has a live stream; a second one is refused. A "
                "reconnecting agent takes the stream over by proving it is the agent (its "
                "credential or an apiary-agent-proof), or once the old connection has closed",
                {"agent_id": agent_id, "reason": "stream_live"},
            )
        if self.follower is not None:
            await self.follower.opening(agent_id, take_over)
        session = inbox.open_session(resume_after)
        await self._events.record(
            "stream.opened", agent_id, agent_id=agent_id, resume_after=resume_after,
            session=session,
        )  # fmt: skip
        await self._opened(agent_id)
        return session

    async def poll(self, agent_id: str, session: int, max_batch: int = 0) -> list[Handout]:
        """The next batch of the session (empty when nothing is pending); never waits."""
        inbox = self._router.inbox(agent_id)
        if inbox.session != session:
            raise AgentUnavailableError(
                f"stream of {agent_id} was superseded by a newer connection",
                {"agent_id": agent_id},
            )
        limit = min(max_batch or self._router.settings.max_batch, self._router.settings.max_batch)
        inbox.arrived.clear()
        while batch := inbox.take(limit, self._router.clock_now()):
            handed = await self._handed_out(agent_id, batch)
            if handed:
                return handed
        return []

    async def stream(
        self, agent_id: str, resume_after: int = 0, max_batch: int = 0, *, take_over: bool = True
    ) -> AsyncGenerator[list[Handout], None]:
        """Batches of handouts for `agent_id`, forever (until superseded or cancelled); see
        `open` for `take_over`."""
        session = await self.open(agent_id, resume_after, take_over=take_over)
        inbox = self._router.inbox(agent_id)
        inbox.streams += 1
        try:
            await self._connected(agent_id)
            while True:
                batch = await self.poll(agent_id, session, max_batch)
                if batch:
                    yield batch
                else:
                    await inbox.arrived.wait()
        finally:
            inbox.streams -= 1
            if not inbox.streams:
                inbox.released.set()
                inbox.offline_since = now = self._router.clock_now()
                self._lifecycle.streams_ended(agent_id, now)
                if self.follower is not None:
                    self.follower.closed(agent_id, inbox.session)
            await self._events.record("stream.closed", agent_id, agent_id=agent_id, session=session)

    async def _exhausted(self, batch: list[Handout], now: float) -> list[Handout]:
        """Fail what has been handed out `max_deliveries` times without any ACK (the retry
        budget, RFC 21.1); returns the rest."""
        budget = self._router.settings.max_deliveries
        keep: list[Handout] = []
        for handout in batch:
            if budget and handout.attempt > budget and not is_notice(handout.message):
                await self._lifecycle.apply(
                    handout.message, MessageInput.DELIVERIES_EXHAUSTED, now,
                    error_code="agent_unavailable",
                    note=f"not acknowledged after {budget} deliveries",
                )  # fmt: skip
            else:
                keep.append(handout)
        return keep

    async def _handed_out(self, agent_id: str, batch: list[Handout]) -> list[Handout]:
        now = self._router.clock_now()
        batch = await self._exhausted(batch, now)
        if not batch:
            return []
        notices = [is_notice(h.message) for h in batch]
        stats = self._router.stats
        waited = stats.timing(stats.dequeue_latency, agent_id)
        for handout, notice in zip(batch, notices, strict=True):
            message = handout.message
            waited.observe(now - message.created_at)
            if not notice and handout.attempt > 1:
                await self._lifecycle.apply(message, MessageInput.REDELIVER, now)
            if handout.overflowed:
                await self._overflowed(agent_id, now)
            if handout.urgent:
                stats.urgent_dispatches[agent_id] += 1
                await self._events.record(
                    "message.urgent_dispatch", COORDINATOR, agent_id=agent_id,
                    correlation_id=message.correlation_id, message_id=message.message_id,
                    lane=message.lane,
                )  # fmt: skip
        if any(notices):
            # A notice is FULFILLED once handed out: delivery and state in one row update
            # (a notice handed over from memory has no row and nothing to forget).
            done = [
                h.message for h, notice in zip(batch, notices, strict=True)
                if notice and not h.direct
            ]  # fmt: skip
            if done:
                await self._messages.finish_delivered([m.message_id for m in done], now)
            for message in done:
                self._live.forget(message)
        # A redelivery's REDELIVER step changed the live copy (RETRYING): hand out that one.
        current = self._live.current
        handed = [h if h.direct else _delivered(h, now, current(h.message)) for h in batch]
        inbox = self._router.inbox(agent_id)
        counted, first = [], []
        for handout, notice in zip(handed, notices, strict=True):
            if not notice:
                message = handout.message
                self._live.refresh(message)
                inbox.update(message)
                counted.append(message)
                if handout.attempt == 1:
                    first.append(message)
        if first:
            # (A redelivery's REDELIVER step, above, started its deadline already.)
            self._lifecycle.deliver(first, now)
        if counted:
            await self._live.delivered(counted, now)
        return handed

    async def _overflowed(self, agent_id: str, now: float) -> None:
        """PRIVILEGED traffic over its rate limit (RFC 7.3 overflow): counted, and a
        starvation-risk warning (RFC 19) at most once a minute per agent."""
        stats = self._router.stats
        stats.urgent_overflows[agent_id] += 1
        last = stats.starvation_warned_at.get(agent_id)
        if last is not None and now - last < STARVATION_WARN_EVERY_S:
            return
        stats.starvation_warned_at[agent_id] = now
        inbox = self._router.inbox(agent_id)
        log.warning(
            "%s: PRIVILEGED traffic exceeds its rate limit; the overflow takes STANDARD's "
            "share and other lanes risk starving", agent_id,
        )  # fmt: skip
        await self._events.record(
            "lane.starvation_risk", COORDINATOR, agent_id=agent_id,
            overflowed=stats.urgent_overflows[agent_id],
            privileged_tokens=round(inbox.lanes.tokens, 3),
            rate_per_s=inbox.lanes.policy.privileged_rate,
        )  # fmt: skip


def _delivered(handout: Handout, now: float, current: StoredMessage) -> Handout:
    message = handed_out(current, now, handout.attempt)
    return Handout(message, handout.attempt, handout.urgent, handout.overflowed)
