"""What a node does with what peers send it: POST /message and POST /join.

A message goes through, in order: parsing (400 naming the field; headers that contradict the
body are refused too), the rate limits (60/min per sender, 100/min per swarm: 429 with
Retry-After seconds), screening (404 unknown swarm, 403 not a member or not addressed to
us; a muted swarm or sender is answered 200 and dropped unrecorded), the signature against
the sender's cached key (refreshed once on failure: 401), expiry and the replay window (400),
a message_id already in the inbox (the same message again: answered 200 and not processed
again; a different message under a used id: 400), the inbox, the member-list sync of a system
message (a member_joined from the master without the new member's key, the reference
implementation's flat form, has the key fetched from that member's /info first: it must
answer for the agent the master named), then the hooks (the SW4RM bridge, the wake
command), whose failures are logged and never change the answer: the message is safely in
the inbox by then.

A join (10/hour per IP) is decided by the master: the token must be signed by the master (or
by a member, when the swarm allows member invites), name this swarm and this endpoint, be
unexpired and have uses left. An agent already a member (same key) gets the member list again
without spending a use; a pending one hears 202 again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from apiary.core.swarm_mail import InboxEntry
from apiary.swarm import membership as ms
from apiary.swarm.errors import SwarmError, invalid, rate_limited, unauthorized
from apiary.swarm.freshness import check_fresh
from apiary.swarm.invite import check_invite, decode_invite, token_key, verify_invite
from apiary.swarm.keys import normalize_key
from apiary.swarm.mail import mail_of
from apiary.swarm.ratelimit import SlidingWindow
from apiary.swarm.wire import SwarmMessage, check_endpoint, check_version, parse_message

if TYPE_CHECKING:
    from apiary.swarm.node import SwarmNode

log = logging.getLogger("apiary.swarm.reception")


@dataclass(frozen=True, slots=True)
class JoinRequest:
    token: str
    joiner: ms.Member


def parse_join(body: object, joined_at: str, *, insecure: bool = False) -> JoinRequest:
    """A join request body; 400 naming the first bad field. With `insecure` the joiner's
    endpoint may be plain http:// to a loopback address."""
    if not isinstance(body, dict):
        raise invalid("body", "must be a JSON object")
    if "protocol_version" in body:
        check_version(body["protocol_version"])
    if body.get("type") != "system":
        raise invalid("type", 'must be "system"')
    if body.get("action") != "join_request":
        raise invalid("action", 'must be "join_request"')
    token = body.get("invite_token")
    if not isinstance(token, str) or not token:
        raise invalid("invite_token", "must be the invite's JWT")
    sender = body.get("sender")
    if not isinstance(sender, dict):
        raise invalid("sender", "must be an object with agent_id, endpoint and public_key")
    agent_id = sender.get("agent_id")
    if not isinstance(agent_id, str) or not agent_id:
        raise invalid("sender.agent_id", "must be a non-empty string")
    endpoint = check_endpoint(sender.get("endpoint"), "sender.endpoint", insecure=insecure)
    key = normalize_key(sender.get("public_key"), "sender.public_key")
    return JoinRequest(token, ms.Member(agent_id, endpoint.rstrip("/"), key, joined_at))


def queued(message_id: str) -> dict[str, Any]:
    return {"status": "queued", "message_id": message_id}


class Reception:
    def __init__(self, node: SwarmNode) -> None:
        self._node = node
        settings = node.settings
        self._per_sender = SlidingWindow(settings.per_sender)
        self._per_swarm = SlidingWindow(settings.per_swarm)
        self._joins = SlidingWindow(settings.joins_per_ip)

    # ------------------------------------------------------------------ POST /message

    async def message(self, body: object, headers: Mapping[str, str]) -> dict[str, Any]:
        """The 200 answer to a message; SwarmError for every refusal."""
        node = self._node
        insecure = node.config.insecure
        message = parse_message(body, insecure=insecure)
        _check_headers(message, headers)
        self._limit(message)
        state = node.state
        if not ms.screen(state, message):
            return queued(message.message_id)  # muted: accepted, dropped, not recorded
        member = state.swarm(message.swarm_id).member(message.sender.agent_id)
        assert member is not None  # screen refused non-members
        await node.keys.verify(message, member)
        now = node.clock.now()
        check_fresh(message, now, node.settings.window)
        seen = await node.store.inbox_get(message.message_id)
        if seen is not None:
            return self._replayed(message, seen)
        if not await node.store.receive(InboxEntry(mail_of(message), now)):
            return queued(message.message_id)  # the same message, arrived concurrently
        if message.type == "system":
            key = await self._announced_key(message)
            node.states.update(lambda s: (_apply(s, message, key, insecure), None))
        for hook in node.hooks:
            try:
                await hook(message)
            except Exception:  # the message is stored; a hook's failure is the hook's
                log.exception("hook %r failed on message %s", hook, message.message_id)
        return queued(message.message_id)

    async def _announced_key(self, message: SwarmMessage) -> str:
        """The key of the member a keyless member_joined announces, as its /info serves it
        ('' when there is no such member or its key cannot be had: the notice then changes
        nothing, and the master's next notice or a re-join can complete it)."""
        node = self._node
        member = ms.announced_member(node.state, message, insecure=node.config.insecure)
        if member is None or member.public_key:
            return ""
        key = await node.keys.fetch(member)
        if key is None:
            log.warning("member_joined of %s in %s: no key from %s/info; not listed",
                        member.agent_id, message.swarm_id, member.endpoint)  # fmt: skip
        return key or ""

    def _limit(self, message: SwarmMessage) -> None:
        now = self._node.clock.monotonic()
        sender, swarm = message.sender.agent_id, message.swarm_id
        for window, key, scope in (
            (self._per_sender, sender, f"sender {sender}"),
            (self._per_swarm, swarm, f"swarm {swarm}"),
        ):
            wait = window.retry_after(key, now)
            if wait:
                raise rate_limited(f"{window.limit.count} messages per "
                                   f"{window.limit.window_s:g} s per {scope}", wait)  # fmt: skip
        self._per_sender.record(sender, now)
        self._per_swarm.record(swarm, now)

    @staticmethod
    def _replayed(message: SwarmMessage, seen: InboxEntry) -> dict[str, Any]:
        if seen.mail.wire.get("signature") == message.signature:
            log.info("message %s received again: not processed again", message.message_id)
            return queued(message.message_id)
        raise SwarmError(
            400,
            "DUPLICATE_MESSAGE_ID",
            f"message_id {message.message_id} was already used by another message",
            field="message_id",
        )

    # ------------------------------------------------------------------ POST /join

    async def join(self, body: object, ip: str) -> tuple[int, dict[str, Any]]:
        """(200 accepted | 202 pending, answer); SwarmError for every refusal."""
        node = self._node
        wait = self._joins.check(ip, node.clock.monotonic())
        if wait:
            raise rate_limited(f"{self._joins.limit.count} joins per hour per address", wait)
        request = parse_join(body, node.now_iso(), insecure=node.config.insecure)
        claims = decode_invite(request.token, insecure=node.config.insecure)
        swarm = node.state.swarm(claims.swarm_id)
        if swarm.master != node.agent_id:
            raise SwarmError(
                403,
                "NOT_MASTER",
                f"joins of {swarm.swarm_id} are decided by its master {swarm.master}",
            )
        issuer = swarm.member(claims.master)
        if issuer is None:
            raise SwarmError(400, "INVALID_TOKEN", f"issued by {claims.master}, not a member",
                             field="invite_token")  # fmt: skip
        if issuer.agent_id != swarm.master and not swarm.settings.allow_member_invite:
            raise SwarmError(403, "INVITES_DISABLED", "only the master may invite to this swarm")
        verify_invite(request.token, issuer.public_key, swarm_id=swarm.swarm_id,
                      endpoint=node.config.endpoint,
                      insecure=node.config.insecure)  # fmt: skip
        joiner = request.joiner
        outcome = node.states.update(
            lambda state: decide_join(
                state,
                swarm.swarm_id,
                joiner,
                request.token,
                issuer.public_key,
                node.config.endpoint,
                node.clock.now(),
                insecure=node.config.insecure,
            )
        )
        if outcome.notices:
            before = outcome.state.swarm(swarm.swarm_id)
            node.spawn(
                node.announce(outcome.notices, {m.agent_id: m.endpoint for m in before.members}),
                f"announce-join-{joiner.agent_id}",
            )
        if outcome.status == "pending":
            return 202, {
                "status": "pending",
                "swarm_id": swarm.swarm_id,
                "message": "the master must approve this join; join again later",
            }
        return 200, accepted(outcome.state.swarm(swarm.swarm_id))


def decide_join(
    state: ms.MembershipState, swarm_id: str, joiner: ms.Member, token: str, issuer_key: str,
    endpoint: str, now: float, *, insecure: bool = False,
) -> tuple[ms.MembershipState, ms.Outcome]:  # fmt: skip
    """The join of a verified token on the current state (run under the state file's lock, so
    that two joins cannot both spend a token's last use). A member or pending joiner with the
    same key is answered again without spending a use; another key under its id is refused."""
    current = state.swarm(swarm_id)
    known = current.member(joiner.agent_id) or next(
        (m for m in current.pending if m.agent_id == joiner.agent_id), None
    )
    if known is not None:
        if known.public_key != joiner.public_key:
            raise unauthorized(f"{joiner.agent_id} is known with another public key")
        status = "already" if current.member(joiner.agent_id) else "pending"
        return state, ms.Outcome(state, status=status)
    key = token_key(token)
    check_invite(token, issuer_key, swarm_id=swarm_id, endpoint=endpoint, now=now,
                 uses=current.invite_uses.get(key, 0), insecure=insecure)  # fmt: skip
    return ms.admit(state, swarm_id, joiner, key).split()


def accepted(swarm: ms.Swarm) -> dict[str, Any]:
    return {
        "status": "accepted", "swarm_id": swarm.swarm_id, "swarm_name": swarm.name,
        "name": swarm.name, "master": swarm.master,
        "members": [m.to_json() for m in swarm.members],
        "settings": {"allow_member_invite": swarm.settings.allow_member_invite,
                     "require_approval": swarm.settings.require_approval},
    }  # fmt: skip


def _apply(
    state: ms.MembershipState, message: SwarmMessage, key: str, insecure: bool
) -> ms.MembershipState:
    if message.swarm_id not in state.swarms:
        return state  # left or kicked meanwhile
    return ms.apply_system(state, message, key, insecure=insecure)


def _check_headers(message: SwarmMessage, headers: Mapping[str, str]) -> None:
    """The headers are optional (Postel), but when present they must agree with the body."""
    claimed = headers.get("X-Agent-ID")
    if claimed is not None and claimed != message.sender.agent_id:
        raise invalid("X-Agent-ID", f"{claimed!r} is not the sender {message.sender.agent_id!r}")
    version = headers.get("X-Swarm-Protocol")
    if version is not None:
        check_version(version, "X-Swarm-Protocol")
