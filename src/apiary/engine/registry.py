"""Agent registry: registration with descriptor validation, heartbeats, deregistration and
discovery reads (RFC 14). Deregistration is explicit only: missed heartbeats mark an agent
UNAVAILABLE (see engine/presence.py), never remove it."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from apiary.core.agent_state import UNAVAILABLE
from apiary.core.clock import Clock
from apiary.core.descriptor import AgentDescriptorFields, validate_descriptor
from apiary.core.events import EventDraft
from apiary.core.records import AgentRecord
from apiary.core.signatures import SIGNATURE_KEY, verifies
from apiary.core.tasks.capacity import TASK_CONCURRENCY
from apiary.engine.eventlog import EventRecorder
from apiary.engine.notices import COORDINATOR, RESERVED_IDS
from apiary.errors import NotFoundError, PermissionDeniedError, ValidationError
from apiary.store.protocols import AgentStore

AVAILABLE = "RUNNABLE"


def _strings(value: Any) -> tuple[str, ...]:
    return (
        tuple(str(v) for v in value)
        if isinstance(value, Sequence) and not isinstance(value, str)
        else ()
    )


def descriptor_fields(descriptor: Mapping[str, Any], public_key: bytes) -> AgentDescriptorFields:
    return AgentDescriptorFields(
        agent_id=str(descriptor.get("agent_id") or ""),
        name=str(descriptor.get("name") or ""),
        description=str(descriptor.get("description") or ""),
        capabilities=_strings(descriptor.get("capabilities")),
        communication_class=str(descriptor.get("communication_class") or "COMM_CLASS_UNSPECIFIED"),
        modalities_supported=_strings(descriptor.get("modalities_supported")),
        reasoning_connectors=_strings(descriptor.get("reasoning_connectors")),
        public_key=public_key,
    )


RETIRED_KEYS = "retired_keys"
"""The stored descriptor's list of keys rotated away: {"public_key": base64, "retired_at":
seconds}, newest first. The coordinator's record, never taken from a registration."""
RETIRED_KEY_GRACE_S = 86_400.0
"""How long a rotated-away key still vouches, for recipients, for messages signed before the
rotation (admission only ever accepts the current key)."""
MAX_RETIRED_KEYS = 4


def public_key_of(record: AgentRecord) -> bytes:
    """The raw Ed25519 key the agent registered (b"" when none; the stored descriptor holds
    it as base64, as the protobuf JSON mapping writes bytes)."""
    text = record.descriptor.get("public_key") or ""
    if not isinstance(text, str) or not text:
        return b""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return b""


def retired_keys_of(record: AgentRecord, now: float) -> list[tuple[bytes, float]]:
    """The keys `record`'s agent rotated away less than `RETIRED_KEY_GRACE_S` ago, newest
    first: (raw key, retired at)."""
    found = []
    entries = record.descriptor.get(RETIRED_KEYS)
    for entry in entries if isinstance(entries, list) else ():
        try:
            key = base64.b64decode(str(entry["public_key"]), validate=True)
            retired_at = float(entry["retired_at"])
        except (KeyError, TypeError, ValueError, binascii.Error):
            continue
        if now - retired_at < RETIRED_KEY_GRACE_S:
            found.append((key, retired_at))
    return found


def _retired(
    previous: AgentRecord | None, rotated_from: bytes, now: float, new_key: bytes
) -> list[dict[str, Any]]:
    """The retired-key entries to store with a registration: the key rotated away now (if
    any) before those still within their grace, without the key now registered."""
    keys = [(rotated_from, now)] if rotated_from else []
    if previous is not None:
        keys += retired_keys_of(previous, now)
    return [
        {"public_key": base64.b64encode(key).decode(), "retired_at": at}
        for key, at in keys[:MAX_RETIRED_KEYS]
        if key != new_key
    ]


class Registry:
    def __init__(
        self,
        agents: AgentStore,
        events: EventRecorder,
        clock: Clock,
        *,
        signing_required: bool = False,
    ) -> None:
        self._agents = agents
        self._events = events
        self._clock = clock
        self._signing_required = signing_required
        # Lookups are on every message's path: serve them from memory, write through.
        self._cache: dict[str, AgentRecord] = {}
        self._keys: dict[str, bytes] = {}
        """Registered public keys by agent id, decoded from the descriptors."""
        self.on_change: Callable[[str], None] | None = None
        """Cluster mode only (engine/cluster/follower.py): told the id of each agent
        registered or deregistered here, so that the other replicas look again."""
        self.reads_through = False
        """Cluster mode only: an agent this view does not know is looked up in the store
        (`refresh`) before the router refuses it no_route, or `get` not_found (other
        replicas register agents in the store this replica reads only now and then)."""

    async def load(self) -> None:
        """Fill the in-memory view from the store (at start-up)."""
        self._cache = {a.agent_id: a for a in await self._agents.list()}
        self._keys = {a.agent_id: public_key_of(a) for a in self._cache.values()}

    async def reload(self) -> tuple[list[AgentRecord], list[str]]:
        """Read the in-memory view again from the store (cluster mode: other replicas
        register and deregister agents in it); returns the agents new to this view and the
        ids of those gone from it."""
        before = self._cache
        await self.load()
        joined = [a for i, a in self._cache.items() if i not in before]
        return joined, [i for i in before if i not in self._cache]

    async def refresh(self, agent_id: str) -> AgentRecord | None:
        """`agent_id`'s registration as the store holds it now, taken into this view (or
        taken out of it when the store has none)."""
        record = await self._agents.get(agent_id)
        if record is None:
            self._cache.pop(agent_id, None)
            self._keys.pop(agent_id, None)
        else:
            self._cache[agent_id] = record
            self._keys[agent_id] = public_key_of(record)
        return record

    def _changed(self, agent_id: str) -> None:
        if self.on_change is not None:
            self.on_change(agent_id)

    async def _put(self, record: AgentRecord, events: Sequence[EventDraft] = ()) -> None:
        """Store `record` with the `events` of its change, in one transaction."""
        await self._events.commit(events, partial(self._agents.put, record))
        self._cache[record.agent_id] = record
        self._keys[record.agent_id] = public_key_of(record)

    def now(self) -> float:
        return self._clock.now()

    @property
    def signing_required(self) -> bool:
        """Whether message signing is on: keys are required and prove identity."""
        return self._signing_required

    async def register(
        self, descriptor: Mapping[str, Any], public_key: bytes = b"", *,
        proof: bytes = b"", signed: bytes = b"", vouched: bool = False,
        task_concurrency: int | None = None,
    ) -> AgentRecord:  # fmt: skip
        """Validate and register (or re-register) the agent the descriptor describes.

        `task_concurrency` is how many Scheduler tasks it runs at once, when it declares it
        (core/tasks/capacity.py: checked by the caller); it is kept with the registration
        (under TASK_CONCURRENCY) until the next one, which declares it again or not.

        An agent registered with a public key is re-registered (a changed descriptor, a new
        key) only with `proof`, the signature of `signed` (the request's bytes) by the key
        registered now, or when the call is `vouched` for (it authenticated as that agent or
        as an operator allowed to act for it); else PermissionDeniedError. A lost or
        compromised key is revoked by deregistering the agent (`deregister`), after which
        any key may register."""
        fields = descriptor_fields(descriptor, public_key)
        validate_descriptor(fields, signing_required=self._signing_required)
        if fields.agent_id in RESERVED_IDS:
            raise ValidationError.for_field("agent.agent_id", f"{fields.agent_id!r} is reserved")
        now = self._clock.now()
        previous = await self._agents.get(fields.agent_id)
        current = public_key_of(previous) if previous is not None else b""
        rotated = bool(current) and current != fields.public_key
        _check_vouched(
            fields.agent_id, current, signed, proof, vouched,
            "registering it again (a changed descriptor or a new key)", "agent.public_key",
        )  # fmt: skip
        stored = dict(descriptor)
        stored.pop(RETIRED_KEYS, None)
        stored.pop(TASK_CONCURRENCY, None)
        if task_concurrency is not None:
            stored[TASK_CONCURRENCY] = task_concurrency
        retired = _retired(previous, current if rotated else b"", now, fields.public_key)
        if retired:
            stored[RETIRED_KEYS] = retired
        if stored.get("communication_class") in (None, "", "COMM_CLASS_UNSPECIFIED"):
            stored["communication_class"] = "STANDARD"
        record = AgentRecord(
            agent_id=fields.agent_id,
            name=fields.name,
            state=AVAILABLE,
            registered_at=previous.registered_at if previous else now,
            last_heartbeat_at=now,
            descriptor=stored,
        )
        registered = self._events.draft(
            "agent.registered", fields.agent_id, agent_id=fields.agent_id, name=record.name,
            reregistered=previous is not None, capabilities=list(fields.capabilities),
            communication_class=stored["communication_class"],
            signing_key=bool(fields.public_key), task_concurrency=task_concurrency or 1,
        )  # fmt: skip
        events = [registered]
        if rotated:
            events.append(self._events.draft(
                "agent.key_rotated", fields.agent_id, agent_id=fields.agent_id,
                proven=verifies(current, signed, proof),
            ))  # fmt: skip
        await self._put(record, events)
        self._changed(record.agent_id)
        return record

    def check_proof(self, agent_id: str, signed: bytes, proof: bytes) -> bool:
        """Whether `proof` is the agent's signature of `signed` by its registered key (False
        for an unknown agent or one without a key)."""
        key = self.public_key(agent_id)
        return bool(key) and verifies(key, signed, proof)

    def count(self) -> int:
        """Registered agents (a tenant's `agents` quota)."""
        return len(self._cache)

    def vouches(self, agent_id: str, data: bytes, signature: bytes) -> bool:
        """Whether `signature` over `data` is the agent's, by its registered key or one it
        rotated away within `RETIRED_KEY_GRACE_S` (what was signed before a rotation)."""
        record = self._cache.get(agent_id)
        if record is None or not data:
            return False
        keys = [self.public_key(agent_id), *(k for k, _ in retired_keys_of(record, self.now()))]
        return any(key and verifies(key, data, signature) for key in keys)

    def public_key(self, agent_id: str) -> bytes:
        """The raw Ed25519 key the agent registered; b"" for none or an unknown agent.
        Decoded once per registration (the router asks once per signed message)."""
        return self._keys.get(agent_id, b"")

    async def heartbeat(self, agent_id: str, state: str, health: Mapping[str, str]) -> AgentRecord:
        """An agent's answer to a heartbeat; an UNAVAILABLE agent becomes available again."""
        record = await self.get(agent_id)
        revived = record.state == UNAVAILABLE
        updated = replace(
            record,
            state=AVAILABLE if revived or not state else state,
            last_heartbeat_at=self._clock.now(),
        )
        events: list[EventDraft] = []
        if revived:
            events.append(
                self._events.draft(
                    "agent.available", agent_id, agent_id=agent_id, health=dict(health)
                )
            )
        await self._put(updated, events)
        return updated

    async def set_state(self, agent_id: str, state: str, reason: str) -> AgentRecord:
        record = await self.get(agent_id)
        updated = replace(record, state=state)
        event = self._events.draft(
            "agent.state", COORDINATOR, agent_id=agent_id,
            **{"from": record.state, "to": state}, reason=reason,
        )  # fmt: skip
        await self._put(updated, [event])
        return updated

    def check_removal(self, agent_id: str, *, signed: bytes, proof: bytes, vouched: bool) -> None:
        """Refuse a caller's deregistration of an agent registered with a key unless
        `proof` is that key's signature of `signed` (the request's bytes) or the call is
        `vouched` for (the agent's own credential, an operator revoking a lost key): the
        same rule as re-registering it, so that nobody frees an agent's id to take it."""
        _check_vouched(
            agent_id, self.public_key(agent_id), signed, proof, vouched, "deregistering it",
            SIGNATURE_KEY,
        )  # fmt: skip

    async def deregister(self, agent_id: str, reason: str) -> bool:
        """Remove the agent's registration, with its `agent.deregistered` event in the same
        transaction; False when it was not registered (no event then: deregistration is
        idempotent, and the lifecycle's end asks again for an agent that left by itself)."""
        events = (
            [self._events.draft("agent.deregistered", agent_id, agent_id=agent_id, reason=reason)]
            if agent_id in self._cache
            else []
        )
        try:
            removed = await self._events.commit(
                events, lambda drafts: self._agents.delete(agent_id, drafts)
            )
        except LookupError:  # not stored after all: nothing was removed, nothing appended
            removed = False
        self._cache.pop(agent_id, None)
        self._keys.pop(agent_id, None)
        self._changed(agent_id)
        return removed

    async def get(self, agent_id: str) -> AgentRecord:
        """The agent's registration; NotFoundError when it has none (in cluster mode, once
        the store was asked too: another replica may have registered it a moment ago)."""
        record = self._cache.get(agent_id)
        if record is None and self.reads_through:
            record = await self.refresh(agent_id)
        if record is None:
            raise NotFoundError(f"agent {agent_id!r} is not registered", {"agent_id": agent_id})
        return record

    async def find(self, agent_id: str) -> AgentRecord | None:
        return self._cache.get(agent_id)

    def known(self, agent_id: str) -> AgentRecord | None:
        """`find` without the coroutine (the registry is served from memory): for the
        router, which asks twice per message."""
        return self._cache.get(agent_id)

    async def list(self) -> list[AgentRecord]:
        return [self._cache[k] for k in sorted(self._cache)]


def _check_vouched(
    agent_id: str,
    key: bytes,
    signed: bytes,
    proof: bytes,
    vouched: bool,
    doing: str,
    field: str,
) -> None:
    """The rule for changing an agent registered with `key`: its signature or a credential
    that speaks for it."""
    if key and not vouched and not verifies(key, signed, proof):
        raise PermissionDeniedError(
            f"{agent_id} is registered with a public key: {doing} must be signed by that key "
            f"({SIGNATURE_KEY} metadata) or made with the agent's own credential or an "
            "operator's; a lost key is revoked by an operator deregistering the agent",
            {"field": field, "agent_id": agent_id},
        )
