"""The resumable channel (the contract's reconnect_channel and ack_events): an application's
cursor over one session's events, resumed with its id, its resume token and the sequence of
the last event it holds. Resuming answers the session's snapshot first, then the events after
that position (core/runtime/channels.py has the rules; core/runtime/log.py how a session's
events are read from the event log)."""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from typing import Any

from apiary.controlplane.facts import FactWriter
from apiary.controlplane.reads import Reads
from apiary.controlplane.requests import AckEvents, ReconnectChannel
from apiary.controlplane.settings import RuntimeSettings
from apiary.core.access.principal import Principal
from apiary.core.clock import Clock
from apiary.core.dedup import iso_utc
from apiary.core.ids import IdGenerator
from apiary.core.runtime.channels import RECOVER, acknowledged, opened, resume_position, touched
from apiary.core.runtime.events import RuntimeEvent, RuntimeEventType
from apiary.core.runtime.log import Fact, runtime_event, session_filter
from apiary.core.runtime.records import ChannelRecord, RuntimeWrite, SessionRecord, owner_of
from apiary.core.runtime.snapshot import RuntimeSnapshot
from apiary.errors import NotFoundError, ValidationError


def channel_json(channel: ChannelRecord, token: str = "") -> dict[str, Any]:
    """A channel as the commands answer it (its resume token only when it was opened)."""
    shown: dict[str, Any] = {
        "channelId": channel.channel_id, "sessionId": channel.session_id,
        "acknowledgedSequence": channel.acked_sequence,
        "expiresAt": iso_utc(channel.expires_at),
    }  # fmt: skip
    if token:
        shown["resumeToken"] = token
    return shown


@dataclass(frozen=True, slots=True)
class ChannelStart:
    """A channel opened or resumed: the channel, its snapshot, and the position whose
    following events are to be replayed."""

    channel: dict[str, Any]
    snapshot: RuntimeSnapshot
    after: int


@dataclass(frozen=True, slots=True)
class Replay:
    events: list[RuntimeEvent]
    cursor: int
    """Follow from here: the last event replayed, or the log's end when all were."""
    more: bool


class Channels:
    """The channels of one control plane (module docstring)."""

    def __init__(
        self,
        facts: FactWriter,
        reads: Reads,
        clock: Clock,
        ids: IdGenerator,
        settings: RuntimeSettings,
        lock: asyncio.Lock,
    ) -> None:
        self._facts = facts
        self._store = facts.store
        self._events = facts.events
        self._reads = reads
        self._clock = clock
        self._ids = ids
        self._settings = settings
        self._lock = lock

    async def start(self, caller: Principal, req: ReconnectChannel) -> ChannelStart:
        """Open a channel (no channel_id: at the log's end, or at the position given) or
        resume one; its snapshot first."""
        async with self._lock:
            session = await self._reads.session(caller, req.session_id)
            now = self._clock.now()
            last = await self._events.last_sequence()
            ttl = self._settings.channel_ttl_s
            token = ""
            if req.channel_id:
                channel = await self._channel(session, req.channel_id)
                after = resume_position(
                    channel, req.resume_token, req.last_acknowledged_sequence, now=now, last=last
                )
                channel = touched(channel, now=now, ttl_s=ttl)
                kind = RuntimeEventType.CHANNEL_RESUMED
            else:
                after = _opening_position(req.last_acknowledged_sequence, last)
                token = secrets.token_urlsafe(32)
                channel = opened(
                    self._ids.new_id(), session.session_id, owner_of(caller), token,
                    at=after, now=now, ttl_s=ttl,
                )  # fmt: skip
                kind = RuntimeEventType.CHANNEL_CONNECTED
            fact = Fact(
                kind, session.session_id, channel_id=channel.channel_id,
                payload={"after": after, "acknowledgedSequence": channel.acked_sequence},
            )  # fmt: skip
            await self._facts.commit(RuntimeWrite(channels=(channel,)), [fact], caller.label)
            cursor = await self._events.last_sequence()
            threads = await self._store.threads(session.session_id)
            snapshot = await self._reads.snapshot(session, threads, cursor)
        return ChannelStart(channel_json(channel, token), snapshot, after)

    async def _channel(self, session: SessionRecord, channel_id: str) -> ChannelRecord:
        channel = await self._store.channel(channel_id)
        if channel is None or channel.session_id != session.session_id:
            raise NotFoundError(
                f"no channel {channel_id!r} on session {session.session_id!r}; {RECOVER}",
                {"field": "channel_id", "channel_id": channel_id},
            )
        return channel

    async def replay(self, session_id: str, after: int, limit: int) -> Replay:
        """The session's events after sequence `after`, at most `limit`."""
        top = await self._events.last_sequence()
        where = session_filter(session_id)
        batch = await self._events.read(after=after, limit=limit + 1, where=where)
        if len(batch) > limit:
            shown = batch[:limit]
            cursor = shown[-1].sequence if shown else after
            return Replay([runtime_event(e) for e in shown], cursor, True)
        last = batch[-1].sequence if batch else after
        return Replay([runtime_event(e) for e in batch], max(top, last), False)

    async def ack(self, caller: Principal, req: AckEvents) -> ChannelRecord:
        """Acknowledge the channel's events up to `req.sequence`."""
        async with self._lock:
            channel = await self._store.channel(req.channel_id)
            if channel is None:
                raise NotFoundError(
                    f"no channel {req.channel_id!r}; {RECOVER}",
                    {"field": "channel_id", "channel_id": req.channel_id},
                )
            session = await self._reads.session(caller, channel.session_id)
            now = self._clock.now()
            last = await self._events.last_sequence()
            resume_position(channel, req.resume_token, None, now=now, last=last)
            channel = acknowledged(
                channel, req.sequence, now=now, last=last, ttl_s=self._settings.channel_ttl_s
            )
            assert channel.session_id == session.session_id
            await self._store.save(RuntimeWrite(channels=(channel,)))
        return channel


def _opening_position(position: int | None, last: int) -> int:
    """Where a new channel starts: the log's end, or the position the application holds
    (a browser's event stream reconnecting with Last-Event-ID and no channel)."""
    if position is None:
        return last
    if not 0 <= position <= last:
        raise ValidationError.for_field(
            "last_acknowledged_sequence", f"{position} is not within 0..{last} (the last event)"
        )
    return position
