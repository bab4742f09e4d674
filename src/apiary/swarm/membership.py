"""One agent's view of its swarms and the rules of every membership operation (pure).

Each operation takes the state and returns the new state plus the system notices to send
(`Notice`: recipients and body; the transport signs and posts them). Refusals are
SwarmErrors with the protocol's codes. Nothing here does I/O or reads a clock: times are
ISO-8601 strings the caller passes in.

Member lists stay in sync on every member: a member_joined notice carries the new member's
endpoint and public key, member_left / member_kicked remove it, master_changed moves the
master role.

member_joined travels in two shapes, and Apiary sends both at once: the member nested with
its key (`member`: agent_id, endpoint, public_key, joined_at; operations/join.json's
member_joined_broadcast) and flat (`agent_id`, `endpoint`, `joined_at`: what the reference
implementation reads, and the only shape it sends). A flat notice carries no key: the
receiver fetches it from the new member's /info (swarm/reception.py), and takes only what
the master announced in the signed content.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from apiary.swarm.errors import SwarmError, not_found, unauthorized
from apiary.swarm.keys import normalize_key
from apiary.swarm.wire import BROADCAST, SwarmMessage, check_endpoint, parse_timestamp

SCHEMA_VERSION = "1.0.0"
LIFECYCLE_ACTIONS = (
    "member_joined", "member_left", "member_kicked", "member_muted", "member_unmuted",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Member:
    agent_id: str
    endpoint: str
    public_key: str
    joined_at: str

    def to_json(self) -> dict[str, str]:
        return {
            "agent_id": self.agent_id, "endpoint": self.endpoint,
            "public_key": self.public_key, "joined_at": self.joined_at,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class Settings:
    allow_member_invite: bool = False
    require_approval: bool = False


@dataclass(frozen=True, slots=True)
class Swarm:
    swarm_id: str
    name: str
    master: str
    members: tuple[Member, ...]
    joined_at: str
    settings: Settings = Settings()
    pending: tuple[Member, ...] = ()
    """Join requests waiting for the master's approval (require_approval)."""
    invite_uses: Mapping[str, int] = field(default_factory=dict)
    """Joins per invite token (keyed by the token's signature), for max_uses."""

    def member(self, agent_id: str) -> Member | None:
        return next((m for m in self.members if m.agent_id == agent_id), None)

    def others(self, me: str) -> tuple[str, ...]:
        return tuple(m.agent_id for m in self.members if m.agent_id != me)


@dataclass(frozen=True, slots=True)
class KeyEntry:
    public_key: str
    fetched_at: str
    endpoint: str


@dataclass(frozen=True, slots=True)
class MembershipState:
    agent_id: str
    swarms: Mapping[str, Swarm] = field(default_factory=dict)
    muted_swarms: frozenset[str] = frozenset()
    muted_agents: frozenset[str] = frozenset()
    public_keys: Mapping[str, KeyEntry] = field(default_factory=dict)

    def swarm(self, swarm_id: str) -> Swarm:
        found = self.swarms.get(swarm_id)
        if found is None:
            raise not_found(swarm_id)
        return found

    def with_swarm(self, swarm: Swarm) -> MembershipState:
        return replace(self, swarms=MappingProxyType({**self.swarms, swarm.swarm_id: swarm}))

    def without_swarm(self, swarm_id: str) -> MembershipState:
        return replace(
            self, swarms=MappingProxyType({k: v for k, v in self.swarms.items() if k != swarm_id})
        )

    def with_key(self, agent_id: str, entry: KeyEntry) -> MembershipState:
        return replace(self, public_keys=MappingProxyType({**self.public_keys, agent_id: entry}))


@dataclass(frozen=True, slots=True)
class Notice:
    """A system message to send: `recipients` are agent ids, `body` the operation's fields."""

    swarm_id: str
    recipients: tuple[str, ...]
    body: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Outcome:
    state: MembershipState
    notices: tuple[Notice, ...] = ()
    status: str = "ok"
    """join: accepted, pending or already (a re-join)."""

    def split(self) -> tuple[MembershipState, Outcome]:
        """(new state, this outcome): the form a state file's update takes."""
        return self.state, self


def _lifecycle(swarm: Swarm, action: str, agent_id: str, recipients: Iterable[str],
               **fields: Any) -> Notice:  # fmt: skip
    body = {"type": "system", "action": action, "swarm_id": swarm.swarm_id,
            "agent_id": agent_id, "initiated_by": None, "reason": None, **fields}  # fmt: skip
    return Notice(swarm.swarm_id, tuple(recipients), MappingProxyType(body))


def _require_master(swarm: Swarm, by: str) -> None:
    if swarm.master != by:
        raise SwarmError(403, "NOT_MASTER", f"only the master ({swarm.master}) may do this")


# --- operations of this agent ------------------------------------------------------------------


def create(state: MembershipState, swarm_id: str, name: str, me: Member,
           settings: Settings = Settings()) -> Outcome:  # fmt: skip
    if not 1 <= len(name) <= 256:
        raise SwarmError(400, "INVALID_SWARM_NAME", "a swarm name has 1 to 256 characters",
                         field="name")  # fmt: skip
    if swarm_id in state.swarms:
        raise SwarmError(400, "ALREADY_MEMBER", f"swarm {swarm_id} exists already")
    swarm = Swarm(swarm_id, name, me.agent_id, (me,), me.joined_at, settings)
    return Outcome(state.with_swarm(swarm))


def may_invite(state: MembershipState, swarm_id: str) -> Swarm:
    """The swarm, if this agent may invite to it (the master, or members when allowed)."""
    swarm = state.swarm(swarm_id)
    me = state.agent_id
    if swarm.master == me:
        return swarm
    if swarm.member(me) is None:
        raise unauthorized(f"{me} is not a member of {swarm_id}", "NOT_MEMBER")
    if not swarm.settings.allow_member_invite:
        raise SwarmError(403, "INVITES_DISABLED", "only the master may invite to this swarm")
    return swarm


def leave(state: MembershipState, swarm_id: str) -> Outcome:
    swarm = state.swarm(swarm_id)
    me = state.agent_id
    if swarm.master == me and len(swarm.members) > 1:
        raise SwarmError(403, "NOT_AUTHORIZED",
                         "the master must transfer the swarm before leaving it")  # fmt: skip
    notice = _lifecycle(swarm, "member_left", me, swarm.others(me))
    return Outcome(state.without_swarm(swarm_id), (notice,) if notice.recipients else ())


def kick(state: MembershipState, swarm_id: str, agent_id: str, reason: str = "") -> Outcome:
    swarm = state.swarm(swarm_id)
    me = state.agent_id
    _require_master(swarm, me)
    if agent_id == me:
        raise SwarmError(400, "NOT_AUTHORIZED", "the master cannot kick itself", field="agent_id")
    if swarm.member(agent_id) is None:
        raise SwarmError(404, "MEMBER_NOT_FOUND", f"{agent_id} is not a member of {swarm_id}")
    kept = replace(swarm, members=tuple(m for m in swarm.members if m.agent_id != agent_id))
    kicked = Notice(swarm_id, (agent_id,), MappingProxyType({
        "type": "system", "action": "kicked", "swarm_id": swarm_id, "reason": reason or None,
    }))  # fmt: skip
    told = _lifecycle(kept, "member_kicked", agent_id, kept.others(me), initiated_by=me,
                      reason=reason or None)  # fmt: skip
    return Outcome(state.with_swarm(kept), (kicked, told) if told.recipients else (kicked,))


def transfer(state: MembershipState, swarm_id: str, new_master: str) -> Outcome:
    swarm = state.swarm(swarm_id)
    me = state.agent_id
    _require_master(swarm, me)
    if swarm.member(new_master) is None:
        raise SwarmError(404, "MEMBER_NOT_FOUND", f"{new_master} is not a member of {swarm_id}")
    moved = replace(swarm, master=new_master)
    to_new = Notice(swarm_id, (new_master,), MappingProxyType({
        "type": "system", "action": "master_transfer", "swarm_id": swarm_id,
        "new_master": new_master,
    }))  # fmt: skip
    changed = Notice(swarm_id, moved.others(me), MappingProxyType({
        "type": "system", "action": "master_changed", "swarm_id": swarm_id,
        "new_master": new_master, "previous_master": me,
    }))  # fmt: skip
    return Outcome(state.with_swarm(moved), (to_new, changed))


def mute_swarm(state: MembershipState, swarm_id: str, muted: bool = True) -> Outcome:
    found = set(state.muted_swarms)
    (found.add if muted else found.discard)(swarm_id)
    return Outcome(replace(state, muted_swarms=frozenset(found)))


def mute_agent(state: MembershipState, agent_id: str, muted: bool = True,
               swarm_id: str = "", reason: str = "") -> Outcome:  # fmt: skip
    """Mute (or unmute) an agent everywhere; with `swarm_id` the swarm's members are told
    (member_muted / member_unmuted)."""
    found = set(state.muted_agents)
    (found.add if muted else found.discard)(agent_id)
    state = replace(state, muted_agents=frozenset(found))
    if not swarm_id:
        return Outcome(state)
    swarm = state.swarm(swarm_id)
    fields: dict[str, Any] = {"initiated_by": state.agent_id}
    if muted:
        fields["reason"] = reason or None
    action = "member_muted" if muted else "member_unmuted"
    notice = _lifecycle(swarm, action, agent_id, swarm.others(state.agent_id), **fields)
    return Outcome(state, (notice,) if notice.recipients else ())


# --- joins, at the master --------------------------------------------------------------------


def admit(state: MembershipState, swarm_id: str, joiner: Member, token_key: str) -> Outcome:
    """A join request whose token checked out: accepted, pending approval, or a re-join."""
    swarm = state.swarm(swarm_id)
    if swarm.member(joiner.agent_id) is not None:
        return Outcome(state, status="already")  # idempotent: no member_joined again
    uses = {**swarm.invite_uses, token_key: swarm.invite_uses.get(token_key, 0) + 1}
    if swarm.settings.require_approval:
        pending = tuple(m for m in swarm.pending if m.agent_id != joiner.agent_id)
        swarm = replace(swarm, pending=(*pending, joiner), invite_uses=uses)
        return Outcome(state.with_swarm(swarm), status="pending")
    return _add(state, replace(swarm, invite_uses=uses), joiner)


def approve(state: MembershipState, swarm_id: str, agent_id: str) -> Outcome:
    swarm = state.swarm(swarm_id)
    _require_master(swarm, state.agent_id)
    joiner = next((m for m in swarm.pending if m.agent_id == agent_id), None)
    if joiner is None:
        raise SwarmError(404, "MEMBER_NOT_FOUND", f"no pending join of {agent_id} to {swarm_id}")
    swarm = replace(swarm, pending=tuple(m for m in swarm.pending if m.agent_id != agent_id))
    return _add(state, swarm, joiner)


def _add(state: MembershipState, swarm: Swarm, joiner: Member) -> Outcome:
    before = swarm.others(state.agent_id)
    swarm = replace(swarm, members=(*swarm.members, joiner))
    # Announced to the members there were; with none yet, the notice still goes to the
    # master's own inbox (the protocol: the master persists member_joined).
    notice = _lifecycle(
        swarm, "member_joined", joiner.agent_id, before, endpoint=joiner.endpoint,
        joined_at=joiner.joined_at, member=joiner.to_json(),
    )  # fmt: skip
    return Outcome(state.with_swarm(swarm), (notice,), status="accepted")


def joined(state: MembershipState, swarm_id: str, name: str, master: str,
           members: Iterable[Member], joined_at: str) -> Outcome:  # fmt: skip
    """This agent's join was accepted: record the swarm as the master described it."""
    swarm = Swarm(swarm_id, name, master, tuple(members), joined_at)
    return Outcome(state.with_swarm(swarm))


# --- incoming messages -------------------------------------------------------------------------


def screen(state: MembershipState, message: SwarmMessage) -> bool:
    """Whether an incoming message may be processed: False for a muted swarm or sender (the
    protocol: answered 200, silently dropped); 404 unknown swarm, 403 not a member or not
    addressed to this agent."""
    swarm = state.swarm(message.swarm_id)
    sender = message.sender.agent_id
    if swarm.member(sender) is None:
        raise unauthorized(f"{sender} is not a member of swarm {message.swarm_id}", "NOT_MEMBER")
    if message.recipient not in (BROADCAST, state.agent_id):
        raise unauthorized(f"message for {message.recipient}, not {state.agent_id}")
    return message.swarm_id not in state.muted_swarms and sender not in state.muted_agents


def announced_member(
    state: MembershipState, message: SwarmMessage, *, insecure: bool = False
) -> Member | None:
    """The member a member_joined notice announces, when this agent may list it: the notice
    comes from the swarm's master (the caller verified its signature), names the operation
    in its signed content (top-level copies are not signed, so never trusted with a key),
    and announces an agent not listed yet, with a usable endpoint (https://; with `insecure`
    also loopback http://). The nested `member` gives the key; a flat notice gives none, and
    the Member's public_key is then '' (the caller fetches it). None otherwise."""
    body = message.signed_system_body() if message.type == "system" else {}
    swarm = state.swarms.get(message.swarm_id)
    if body.get("action") != "member_joined" or swarm is None:
        return None
    if message.sender.agent_id != swarm.master:
        return None
    member = body.get("member")
    nested: dict[str, Any] = member if isinstance(member, dict) else {}
    agent_id = nested.get("agent_id", body.get("agent_id"))
    if not isinstance(agent_id, str) or not agent_id or swarm.member(agent_id) is not None:
        return None
    if body.get("agent_id", agent_id) != agent_id:
        return None  # the two shapes name different agents: neither is taken
    try:
        endpoint = check_endpoint(nested.get("endpoint", body.get("endpoint")), "endpoint",
                                  insecure=insecure)  # fmt: skip
        key = normalize_key(nested["public_key"], "member.public_key") if nested else ""
    except (KeyError, SwarmError):
        return None
    joined_at = nested.get("joined_at") or body.get("joined_at")
    try:
        parse_timestamp(joined_at, "joined_at")
    except SwarmError:
        joined_at = message.timestamp  # when we learnt of it (the reference's fallback too)
    return Member(agent_id, endpoint.rstrip("/"), key, str(joined_at))


def apply_system(
    state: MembershipState, message: SwarmMessage, fetched_key: str = "", *,
    insecure: bool = False,
) -> MembershipState:  # fmt: skip
    """Keep the member list in sync with a screened system message from a member.
    `fetched_key` is the public key the new member's /info served, for a member_joined
    notice that carries none (`announced_member`); without one, such a notice changes
    nothing."""
    body = message.system_body()
    action = body.get("action")
    swarm = state.swarm(message.swarm_id)
    sender = message.sender.agent_id
    if action == "member_joined":
        member = announced_member(state, message, insecure=insecure)
        if member is not None and not member.public_key:
            member = replace(member, public_key=fetched_key) if fetched_key else None
        if member is not None:
            return state.with_swarm(replace(swarm, members=(*swarm.members, member)))
    elif action == "member_left":
        gone = sender
        return state.with_swarm(
            replace(swarm, members=tuple(m for m in swarm.members if m.agent_id != gone))
        )
    elif action == "member_kicked" and sender == swarm.master:
        gone = str(body.get("agent_id"))
        return state.with_swarm(
            replace(swarm, members=tuple(m for m in swarm.members if m.agent_id != gone))
        )
    elif action == "kicked" and sender == swarm.master:
        return state.without_swarm(swarm.swarm_id)
    elif action in ("master_transfer", "master_changed") and sender == swarm.master:
        new_master = str(body.get("new_master"))
        if swarm.member(new_master) is not None:
            return state.with_swarm(replace(swarm, master=new_master))
    return state


def _member(value: object) -> Member | None:
    if not isinstance(value, dict):
        return None
    try:
        return Member(str(value["agent_id"]), str(value["endpoint"]), str(value["public_key"]),
                      str(value.get("joined_at", "")))  # fmt: skip
    except KeyError:
        return None


# --- the state file's JSON (schemas/membership-state.json) ------------------------------------


def state_to_json(state: MembershipState) -> dict[str, Any]:
    swarms = {}
    for swarm in state.swarms.values():
        entry: dict[str, Any] = {
            "swarm_id": swarm.swarm_id, "name": swarm.name, "master": swarm.master,
            "members": [m.to_json() for m in swarm.members], "joined_at": swarm.joined_at,
            "settings": {"allow_member_invite": swarm.settings.allow_member_invite,
                         "require_approval": swarm.settings.require_approval},
        }  # fmt: skip
        if swarm.pending:
            entry["pending"] = [m.to_json() for m in swarm.pending]
        if swarm.invite_uses:
            entry["invite_uses"] = dict(swarm.invite_uses)
        swarms[swarm.swarm_id] = entry
    return {
        "schema_version": SCHEMA_VERSION,
        "agent_id": state.agent_id,
        "swarms": swarms,
        "muted_swarms": sorted(state.muted_swarms),
        "muted_agents": sorted(state.muted_agents),
        "public_keys": {agent: _key_json(k) for agent, k in sorted(state.public_keys.items())},
    }


def _key_json(entry: KeyEntry) -> dict[str, str]:
    body = {"public_key": entry.public_key, "fetched_at": entry.fetched_at}
    if entry.endpoint:  # optional, and an https:// URL when present
        body["endpoint"] = entry.endpoint
    return body


def state_from_json(body: Mapping[str, Any]) -> MembershipState:
    """The inverse of `state_to_json`, for a body already validated against the schema."""
    swarms = {}
    for swarm_id, entry in body["swarms"].items():
        settings = entry.get("settings", {})
        swarms[swarm_id] = Swarm(
            swarm_id=entry["swarm_id"], name=entry["name"], master=entry["master"],
            members=tuple(_member(m) or _bad_member(m) for m in entry["members"]),
            joined_at=entry["joined_at"],
            settings=Settings(bool(settings.get("allow_member_invite", False)),
                              bool(settings.get("require_approval", False))),
            pending=tuple(_member(m) or _bad_member(m) for m in entry.get("pending", [])),
            invite_uses=dict(entry.get("invite_uses", {})),
        )  # fmt: skip
    keys = {
        agent: KeyEntry(k["public_key"], k["fetched_at"], k.get("endpoint", ""))
        for agent, k in body["public_keys"].items()
    }
    return MembershipState(
        agent_id=body["agent_id"], swarms=MappingProxyType(swarms),
        muted_swarms=frozenset(body["muted_swarms"]), muted_agents=frozenset(body["muted_agents"]),
        public_keys=MappingProxyType(keys),
    )  # fmt: skip


def _bad_member(value: object) -> Member:
    raise SwarmError(400, "INVALID_FORMAT", f"bad member entry {value!r}", field="members")
