"""A swarm node: one agent's identity, membership state, inbox and outbox, and peers, with
every operation of the protocol.

The rules are the pure modules' (membership, invite, freshness, ratelimit); this module does
their I/O: it reads and writes the state file (each change under its lock), signs and sends
through the `Courier`, and hands what arrives to `Reception` (swarm/reception.py). Notices
that membership operations produce are signed and delivered to every recipient; those of
operations started here are awaited, those a peer's join causes are sent in the background
(the join answers at once). Background work belongs to the node and ends with it.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

from apiary import __version__
from apiary.core.clock import Clock
from apiary.core.ids import IdGenerator
from apiary.core.swarm_mail import InboxEntry, OutboxEntry, inbox_move
from apiary.store.protocols import SwarmStore
from apiary.swarm import membership as ms
from apiary.swarm.client import Reply, SwarmClient, open_swarm_client
from apiary.swarm.courier import Courier
from apiary.swarm.errors import SwarmError, SwarmFileError, invalid, unauthorized
from apiary.swarm.home import NodeConfig
from apiary.swarm.invite import (
    InviteClaims,
    decode_invite,
    encode_invite,
    invite_url,
    parse_invite_url,
)
from apiary.swarm.keycache import KeyCache
from apiary.swarm.keys import Identity, normalize_key
from apiary.swarm.mail import mail_of
from apiary.swarm.reception import Reception
from apiary.swarm.settings import NodeSettings
from apiary.swarm.statefile import StateFile
from apiary.swarm.tls import client_context
from apiary.swarm.wire import (
    BROADCAST,
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    Sender,
    SwarmMessage,
    check_endpoint,
    format_timestamp,
    parse_message,
)
from apiary.system import SystemClock, UuidIds

log = logging.getLogger("apiary.swarm.node")

StoredHook = Callable[[SwarmMessage], Awaitable[None]]
"""Called with every message stored in the inbox (the bridge, the wake hook)."""
INVITE_SECONDS = (60, 2_592_000)
"""The range operations/invite.json allows for expires_in_seconds."""


@dataclass(frozen=True, slots=True)
class Invite:
    url: str
    token: str
    expires_at: str
    max_uses: int | None


@dataclass(frozen=True, slots=True)
class JoinResult:
    status: str
    """accepted, or pending (the master must approve; join again afterwards)."""
    swarm_id: str
    swarm: ms.Swarm | None = None


def endpoints_of(swarms: Iterable[ms.Swarm | None]) -> dict[str, str]:
    """agent_id -> endpoint over the members of `swarms` (before and after an operation)."""
    found: dict[str, str] = {}
    for swarm in swarms:
        for member in swarm.members if swarm else ():
            found.setdefault(member.agent_id, member.endpoint)
    return found


def error_of(reply: Reply) -> SwarmError:
    """A peer's refusal (or silence) as a SwarmError with the peer's code."""
    error = reply.body.get("error") if isinstance(reply.body.get("error"), dict) else None
    if error is None:
        return SwarmError(reply.status or 502, "UNREACHABLE" if not reply.status else
                          "PEER_ERROR", reply.problem())  # fmt: skip
    details = error.get("details") if isinstance(error.get("details"), dict) else {}
    return SwarmError(
        reply.status, str(error.get("code", "PEER_ERROR")), str(error.get("message", "")),
        field=str(details.get("field", "")), retry_after_s=int(reply.retry_after_s),
    )  # fmt: skip


class SwarmNode:
    def __init__(
        self, config: NodeConfig, identity: Identity, states: StateFile, store: SwarmStore,
        client: SwarmClient, clock: Clock, ids: IdGenerator, settings: NodeSettings,
    ) -> None:  # fmt: skip
        self.config = config
        self.identity = identity
        self.states = states
        self.store = store
        self.clock = clock
        self.ids = ids
        self.settings = settings
        self.client = client
        self.me = Sender(config.agent_id, config.endpoint)
        self.courier = Courier(
            identity, self.me, store, client, clock, ids, settings.retry_delays,
            retry=settings.retry,
        )  # fmt: skip
        self.keys = KeyCache(
            states, self._fetch_info, clock, settings.key_ttl_s, settings.key_cooldown_s
        )
        self._hooks: list[StoredHook] = []
        self.reception = Reception(self)
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def agent_id(self) -> str:
        return self.config.agent_id

    @property
    def hooks(self) -> tuple[StoredHook, ...]:
        """What runs on every stored message, in the order added (a snapshot)."""
        return tuple(self._hooks)

    def add_hook(self, hook: StoredHook) -> None:
        """Run `hook` on every message stored from now on (the SW4RM bridge, the wake
        command); its failures are logged, never the sender's."""
        self._hooks.append(hook)

    def rotate(self, identity: Identity) -> None:
        """Sign with `identity` from now on (its key file is the caller's to save). Peers
        learn the new key from /info when our next signature fails their check."""
        self.identity = identity
        self.courier.identity = identity

    @property
    def state(self) -> ms.MembershipState:
        return self.states.load()

    def now_iso(self) -> str:
        return format_timestamp(self.clock.now())

    # ------------------------------------------------------------------ public information

    def info(self) -> dict[str, Any]:
        """GET /info (schemas-responses.yaml AgentInfo)."""
        return {
            "agent_id": self.agent_id, "endpoint": self.config.endpoint,
            "public_key": self.identity.public_key, "protocol_version": PROTOCOL_VERSION,
            "capabilities": list(MESSAGE_TYPES),
            "metadata": {"implementation": "apiary", "version": __version__},
        }  # fmt: skip

    def health(self) -> dict[str, Any]:
        return {
            "status": "healthy", "agent_id": self.agent_id,
            "protocol_version": PROTOCOL_VERSION, "timestamp": self.now_iso(),
        }  # fmt: skip

    async def _fetch_info(self, url: str) -> dict[str, Any] | None:
        reply = await self.client.get(url)
        return reply.body if reply.ok else None

    # ------------------------------------------------------------------ swarms of this agent

    def create(self, name: str, settings: ms.Settings | None = None) -> ms.Swarm:
        settings = settings or ms.Settings()
        swarm_id = self.ids.new_id()
        me = ms.Member(self.agent_id, self.config.endpoint, self.identity.public_key,
                       self.now_iso())  # fmt: skip
        self.states.update(lambda s: ms.create(s, swarm_id, name, me, settings).split())
        return self.state.swarm(swarm_id)

    def invite(
        self, swarm_id: str, expires_in_s: int = 86_400, max_uses: int | None = None
    ) -> Invite:
        """An invite URL signed by this agent (the master, or a member where allowed); joins
        go to the master's endpoint."""
        low, high = INVITE_SECONDS
        if not low <= expires_in_s <= high:
            raise invalid("expires_in", f"must be {low} to {high} seconds")
        if max_uses is not None and max_uses < 1:
            raise invalid("max_uses", "must be at least 1 (or none for unlimited)")
        swarm = ms.may_invite(self.state, swarm_id)
        master = swarm.member(swarm.master)
        endpoint = master.endpoint if master else self.config.endpoint
        now = self.clock.now()
        expires_at = format_timestamp(now + expires_in_s)
        claims = InviteClaims(swarm_id, self.agent_id, endpoint, int(now), expires_at, max_uses)
        token = encode_invite(self.identity, claims)
        return Invite(invite_url(claims, token), token, expires_at, max_uses)

    async def join(self, invite: str) -> JoinResult:
        """Join with an invite URL (or a bare token): POST <endpoint claim>/join."""
        insecure = self.config.insecure
        swarm_id, host, token = parse_invite_url(invite.strip(), insecure=insecure)
        claims = decode_invite(token, insecure=insecure)
        if claims.swarm_id != swarm_id:
            raise SwarmError(400, "INVALID_TOKEN", f"the URL names swarm {swarm_id}, its token "
                             f"{claims.swarm_id}", field="invite")  # fmt: skip
        if urllib.parse.urlsplit(claims.endpoint).netloc != host:
            raise SwarmError(400, "INVALID_TOKEN", f"the URL names host {host}, its token "
                             f"{claims.endpoint}", field="invite")  # fmt: skip
        body = {
            "type": "system", "action": "join_request", "invite_token": token,
            "sender": {"agent_id": self.agent_id, "endpoint": self.config.endpoint,
                       "public_key": self.identity.public_key},
        }  # fmt: skip
        reply = await self.client.post(claims.endpoint.rstrip("/") + "/join", body)
        if reply.status == 202:
            return JoinResult("pending", swarm_id)
        if reply.status != 200:
            raise error_of(reply)
        swarm = self._joined(reply.body, claims)
        return JoinResult("accepted", swarm_id, swarm)

    def _joined(self, body: Mapping[str, Any], claims: InviteClaims) -> ms.Swarm:
        swarm_id = claims.swarm_id
        if body.get("status") != "accepted" or body.get("swarm_id") != swarm_id:
            raise SwarmError(502, "PEER_ERROR", f"the master answered {dict(body)!r}")
        members = [
            _member(m, n, self.now_iso(), insecure=self.config.insecure)
            for n, m in enumerate(body.get("members") or [])
        ]
        if not any(m.agent_id == self.agent_id for m in members):
            raise SwarmError(502, "PEER_ERROR", "the master's member list does not list us")
        name = str(body.get("swarm_name") or body.get("name") or swarm_id)
        master = str(body.get("master") or claims.master)
        raw = body.get("settings")
        raw = raw if isinstance(raw, dict) else {}
        settings = ms.Settings(bool(raw.get("allow_member_invite", False)),
                               bool(raw.get("require_approval", False)))  # fmt: skip

        def record(state: ms.MembershipState) -> tuple[ms.MembershipState, None]:
            joined = ms.joined(state, swarm_id, name, master, members, self.now_iso()).state
            return joined.with_swarm(replace(joined.swarm(swarm_id), settings=settings)), None

        self.states.update(record)
        return self.state.swarm(swarm_id)

    async def leave(self, swarm_id: str) -> list[OutboxEntry]:
        before = self.state.swarm(swarm_id)
        outcome = self.states.update(lambda s: ms.leave(s, swarm_id).split())
        return await self.announce(outcome.notices, endpoints_of([before]))

    async def kick(self, swarm_id: str, agent_id: str, reason: str = "") -> list[OutboxEntry]:
        before = self.state.swarm(swarm_id)
        outcome = self.states.update(lambda s: ms.kick(s, swarm_id, agent_id, reason).split())
        return await self.announce(outcome.notices, endpoints_of([before]))

    async def transfer(self, swarm_id: str, new_master: str) -> list[OutboxEntry]:
        outcome = self.states.update(lambda s: ms.transfer(s, swarm_id, new_master).split())
        return await self.announce(outcome.notices, endpoints_of([outcome.state.swarm(swarm_id)]))

    async def approve(self, swarm_id: str, agent_id: str) -> list[OutboxEntry]:
        outcome = self.states.update(lambda s: ms.approve(s, swarm_id, agent_id).split())
        return await self.announce(outcome.notices, endpoints_of([outcome.state.swarm(swarm_id)]))

    def mute_swarm(self, swarm_id: str, muted: bool = True) -> None:
        self.states.update(lambda s: ms.mute_swarm(s, swarm_id, muted).split())

    async def mute_agent(
        self, agent_id: str, muted: bool = True, swarm_id: str = "", reason: str = ""
    ) -> list[OutboxEntry]:
        """Mute (unmute) an agent everywhere; with `swarm_id` its members are told."""
        outcome = self.states.update(
            lambda s: ms.mute_agent(s, agent_id, muted, swarm_id, reason).split()
        )
        swarm = outcome.state.swarms.get(swarm_id) if swarm_id else None
        return await self.announce(outcome.notices, endpoints_of([swarm]))

    async def announce(
        self, notices: Iterable[ms.Notice], endpoints: Mapping[str, str]
    ) -> list[OutboxEntry]:
        """Sign and deliver each notice in order; lifecycle notices are kept in this agent's
        inbox too (the master "persists a member_joined notification")."""
        rows: list[OutboxEntry] = []
        for notice in notices:
            message = self.courier.notice(notice)
            if notice.body.get("action") in ms.LIFECYCLE_ACTIONS:
                await self.store.receive(InboxEntry(mail_of(message), self.clock.now()))
            targets = {
                agent: endpoints[agent] for agent in notice.recipients
                if agent in endpoints and agent != self.agent_id
            }  # fmt: skip
            rows += await self.courier.deliver(message, targets)
        return rows

    # ------------------------------------------------------------------ messages

    async def send(
        self, swarm_id: str, recipient: str, content: str, *, kind: str = "message",
        background: bool = False, **optional: Any,
    ) -> tuple[SwarmMessage, list[OutboxEntry]]:  # fmt: skip
        """Sign and send a message to one member or to every other member ("broadcast").

        Refusals (unknown swarm or member, a field a peer would refuse) raise before anything
        is sent. With `background` the deliveries run owned by the node and the rows are not
        awaited (the outbox records how they end)."""
        swarm = self.state.swarm(swarm_id)
        if swarm.member(self.agent_id) is None:
            raise unauthorized(f"{self.agent_id} is not a member of {swarm_id}", "NOT_MEMBER")
        if kind not in MESSAGE_TYPES:
            raise invalid("type", f"must be one of {', '.join(MESSAGE_TYPES)}")
        if recipient == BROADCAST:
            targets = {m.agent_id: m.endpoint for m in swarm.members if m.agent_id != self.agent_id}
        else:
            member = swarm.member(recipient)
            if member is None or recipient == self.agent_id:
                raise SwarmError(404, "MEMBER_NOT_FOUND",
                                 f"{recipient} is not another member of {swarm_id}",
                                 field="recipient")  # fmt: skip
            targets = {recipient: member.endpoint}
        message = self.courier.compose(swarm_id, recipient, kind, content, **optional)
        # What a peer would refuse is refused here, named.
        parse_message(message.to_json(), insecure=self.config.insecure)
        if background:
            self.spawn(self.courier.deliver(message, targets), f"send-{message.message_id}")
            return message, []
        return message, await self.courier.deliver(message, targets)

    async def broadcast(
        self, swarm_id: str, content: str, **optional: Any
    ) -> tuple[SwarmMessage, list[OutboxEntry]]:
        return await self.send(swarm_id, BROADCAST, content, **optional)

    async def mark(self, message_id: str, status: str) -> InboxEntry:
        """Move an inbox message to `status` (forward only: unread, read, archived, deleted)."""
        entry = await self.store.inbox_get(message_id)
        if entry is None:
            raise SwarmError(404, "MESSAGE_NOT_FOUND", f"no message {message_id} in the inbox",
                             field="message_id")  # fmt: skip
        try:
            inbox_move(entry.status, status)
        except ValueError as exc:
            raise invalid("status", str(exc)) from None
        updated = await self.store.set_status(message_id, status, self.clock.now())
        assert updated is not None
        return updated

    async def retry(self, message_id: str, destination: str = "") -> list[OutboxEntry]:
        """Deliver an outbox message again now, to every destination it has not reached (or
        only `destination`): one attempt each, a failed row included."""
        rows = await self.store.outbox_get(message_id)
        if destination:
            rows = [r for r in rows if r.destination == destination]
        if not rows:
            what = f" to {destination}" if destination else ""
            field = "destination" if destination else "message_id"
            problem = f"no message {message_id}{what} in the outbox"
            raise SwarmError(404, "MESSAGE_NOT_FOUND", problem, field=field)
        return await self.courier.retry_now(rows, self.endpoint_of)

    def endpoint_of(self, swarm_id: str, agent_id: str) -> str | None:
        """The endpoint `agent_id` has in `swarm_id` now; None when it is not a member (or
        this node is in no such swarm)."""
        swarm = self.state.swarms.get(swarm_id)
        member = swarm.member(agent_id) if swarm is not None else None
        return None if member is None else member.endpoint

    # ------------------------------------------------------------------ lifetime

    def spawn(self, work: Coroutine[Any, Any, Any], name: str) -> None:
        """Run `work` in the background, owned by the node (awaited or cancelled on close)."""
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s failed", task.get_name(), exc_info=task.exception())

    async def settle(self) -> None:
        """Wait for the background work running now (deliveries, hooks) to end."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        try:
            async with asyncio.timeout(self.settings.hook_grace_s):
                await self.settle()
        except TimeoutError:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


def _member(value: object, n: int, now: str, *, insecure: bool = False) -> ms.Member:
    where = f"members[{n}]"
    if not isinstance(value, dict):
        raise SwarmError(502, "PEER_ERROR", f"{where} is not an object")
    try:
        agent_id = value["agent_id"]
        endpoint = check_endpoint(value["endpoint"], f"{where}.endpoint", insecure=insecure)
        key = normalize_key(value["public_key"], f"{where}.public_key")
    except (KeyError, SwarmError) as exc:
        raise SwarmError(502, "PEER_ERROR", f"the master's {where} is unusable: {exc}") from None
    if not isinstance(agent_id, str) or not agent_id:
        raise SwarmError(502, "PEER_ERROR", f"the master's {where}.agent_id is unusable")
    return ms.Member(agent_id, endpoint, key, str(value.get("joined_at") or now))


@asynccontextmanager
async def open_swarm_node(
    config: NodeConfig, identity: Identity, states: StateFile, store: SwarmStore, *,
    clock: Clock | None = None, ids: IdGenerator | None = None,
    settings: NodeSettings | None = None, ssl_context: ssl.SSLContext | None = None,
) -> AsyncIterator[SwarmNode]:  # fmt: skip
    """A node for the duration of the block; its background work ends with it."""
    settings = settings or NodeSettings()
    if states.load().agent_id != config.agent_id:
        raise SwarmFileError(states.path, f"holds agent {states.load().agent_id!r}'s state, "
                             f"not {config.agent_id!r}'s", "agent_id")  # fmt: skip
    context = ssl_context or client_context(config.ca_file or None)
    async with open_swarm_client(config.agent_id, context, settings.request_timeout_s) as client:
        node = SwarmNode(
            config, identity, states, store, client, clock or SystemClock(), ids or UuidIds(),
            settings,
        )  # fmt: skip
        try:
            yield node
        finally:
            await node.close()
