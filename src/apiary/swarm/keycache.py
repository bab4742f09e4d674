"""Which public key a member's messages are verified against, and keeping it current
(agent-swarm-protocol 0.1.0, "Public Key Registry").

The key of record is the state's `public_keys` entry for the agent; an agent without one is
seeded from its member entry (the key the master announced when it joined) with fetched_at
now. An entry older than the TTL (24 h) is refreshed from GET {member endpoint}/info before
use, and a signature that does not verify triggers one refresh (the key may have rotated)
and a second try. The endpoint asked is always the one recorded for the member, never the
one a message claims: otherwise a forger could point us at a key of its own. Refreshes of
one agent are at most one per `cooldown_s`, so forged messages cannot make us hammer a peer.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from apiary.core.clock import Clock
from apiary.swarm.errors import SwarmError, bad_signature
from apiary.swarm.keys import normalize_key, verify
from apiary.swarm.membership import KeyEntry, Member, MembershipState
from apiary.swarm.statefile import StateFile
from apiary.swarm.wire import SwarmMessage, format_timestamp, parse_timestamp, signing_input

log = logging.getLogger("apiary.swarm.keys")

FetchInfo = Callable[[str], Awaitable[dict[str, Any] | None]]
"""GET a URL, answer its JSON body (None when the peer could not be asked)."""

KEY_TTL_S = 24 * 3600.0
REFRESH_COOLDOWN_S = 60.0


class KeyCache:
    def __init__(
        self, states: StateFile, fetch_info: FetchInfo, clock: Clock,
        ttl_s: float = KEY_TTL_S, cooldown_s: float = REFRESH_COOLDOWN_S,
    ) -> None:  # fmt: skip
        self._states = states
        self._fetch = fetch_info
        self._clock = clock
        self._ttl = ttl_s
        self._cooldown = cooldown_s
        self._asked: dict[str, float] = {}

    async def verify(self, message: SwarmMessage, member: Member) -> None:
        """401 INVALID_SIGNATURE unless `member` signed `message` (refreshing its key once)."""
        agent = member.agent_id
        entry = self._states.load().public_keys.get(agent)
        if entry is None:
            entry = self._remember(agent, member.public_key, member.endpoint)
        key = entry.public_key
        if self._age(entry) > self._ttl:
            key = await self._refresh(member) or key
        data = signing_input(message)
        if verify(key, data, message.signature):
            return
        fresh = await self._refresh(member)
        if fresh is not None and fresh != key and verify(fresh, data, message.signature):
            return
        raise bad_signature(
            f"signature of message {message.message_id} does not verify for {agent}"
        )

    async def fetch(self, member: Member) -> str | None:
        """The key `member`'s endpoint serves now (GET /info answering for that agent),
        recorded as its key of record; None when it cannot be had. For a member the master
        announced without its key: the endpoint is the master's word, never a message's."""
        return await self._refresh(member)

    def _age(self, entry: KeyEntry) -> float:
        try:
            return self._clock.now() - parse_timestamp(entry.fetched_at, "fetched_at")
        except SwarmError:
            return float("inf")

    def _remember(self, agent: str, key: str, endpoint: str) -> KeyEntry:
        entry = KeyEntry(key, format_timestamp(self._clock.now()), info_url(endpoint))

        def put(state: MembershipState) -> tuple[MembershipState, None]:
            return state.with_key(agent, entry), None

        self._states.update(put)
        return entry

    async def _refresh(self, member: Member) -> str | None:
        """The key the member's endpoint serves now (cached), or None when it could not be
        had (asked too recently, unreachable, or an answer for another agent)."""
        agent = member.agent_id
        now = self._clock.monotonic()
        last = self._asked.get(agent)
        if last is not None and now - last < self._cooldown:
            return None
        self._asked[agent] = now
        url = info_url(member.endpoint)
        info = await self._fetch(url)
        if info is None:
            log.warning("cannot refresh the key of %s from %s", agent, url)
            return None
        if info.get("agent_id") != agent:
            log.warning("%s answered for %r, not %s", url, info.get("agent_id"), agent)
            return None
        try:
            key = normalize_key(info.get("public_key"))
        except SwarmError:
            log.warning("%s served no usable public key", url)
            return None
        self._remember(agent, key, member.endpoint)
        return key


def info_url(endpoint: str) -> str:
    return endpoint.rstrip("/") + "/info"
