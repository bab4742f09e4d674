"""Negotiation rooms (RFC 17.5, Appendix C.10): the room service inside the coordinator.

Producers submit proposals, requested critics are notified and vote, and the room decides by
its policy (core/rooms/policy.py) or escalates to HITL (engine/hitl.py), whose decision then
becomes the room's, with the operator on record. The producer is notified of the decision
and may block on it (`wait`, WaitForDecision). Every transition is in the event log
(room.proposed, room.voted, room.decided, room.escalated), committed with the proposal, vote
or decision it records, in one transaction. The transitions are
`core.negotiation_room.RoomMachine`'s; this class performs their effects: store, timers,
notifications, HITL, waiters.

Everything survives a restart: `load()` re-arms the vote timers of open rooms, re-announces
open proposals to the critics that have not voted (idempotency tokens keep that from reaching
anyone twice), decides a room whose last vote arrived just before the stop, and resumes
waiting for the HITL decision of escalated rooms (an invocation opened just before a stop
is found again rather than opened twice). Policy versions are stored; a room is always
decided under the version it was submitted under, even after the configuration changed.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import Any

from apiary.core.clock import Clock
from apiary.core.envelope import Envelope, MessageType
from apiary.core.events import EventDraft
from apiary.core.ids import IdGenerator
from apiary.core.rooms.machine import (
    ROOM_SERVICE,
    Escalation,
    RoomEffect,
    RoomMachine,
    RoomStep,
)
from apiary.core.rooms.policy import RoomPolicy
from apiary.core.rooms.records import (
    DecisionRecord,
    PolicyVersionRecord,
    ProposalRecord,
    RoomState,
    VoteRecord,
)
from apiary.core.rooms.validation import (
    DEFAULT_MAX_ARTIFACT_BYTES,
    ProposalDraft,
    VoteDraft,
    check_proposal,
    identifier,
)
from apiary.engine.eventlog import EventRecorder
from apiary.engine.hitl import Hitl
from apiary.engine.negotiation.room_notices import RoomNotifier, decision_notice, proposal_notice
from apiary.engine.notices import NoticeFactory
from apiary.engine.router.router import Router
from apiary.engine.timers import Timers
from apiary.errors import (
    AlreadyExistsError,
    DeadlineExceededError,
    NotFoundError,
    ValidationError,
)
from apiary.store.protocols import RoomStore

log = logging.getLogger("apiary.rooms")
Sleep = Callable[[float], Awaitable[None]]
LIVE = frozenset({RoomState.OPEN.value, RoomState.ESCALATED.value})
VOTED = "room.voted"
_F = RoomEffect


@dataclass(frozen=True, slots=True)
class RoomSettings:
    """Negotiation-room configuration: TOML table [rooms] (docs/negotiation-rooms.md).

    The policy's settings (thresholds, vote_timeout_s, hitl_*, version) sit in the same
    table as these.
    """

    policy: RoomPolicy = field(default_factory=RoomPolicy)
    max_artifact_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES
    inline_artifact_bytes: int = 16 * 1024
    """Artifacts up to this size travel inside the critics' notification (base64)."""
    wait_default_s: float = 300.0
    """WaitForDecision's timeout when the request gives none (timeout_seconds 0)."""
    wait_max_s: float = 3600.0
    """The longest WaitForDecision may block."""

    def __post_init__(self) -> None:
        for name in ("max_artifact_bytes", "inline_artifact_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValidationError.for_field(f"rooms.{name}", "must be an integer >= 0")
        for name in ("wait_default_s", "wait_max_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValidationError.for_field(f"rooms.{name}", "must be a number")
            if not (math.isfinite(value) and value > 0):
                raise ValidationError.for_field(f"rooms.{name}", "must be a positive duration")

    @classmethod
    def from_settings(cls, values: Mapping[str, Any]) -> RoomSettings:
        """Settings from the [rooms] table: the policy's keys and these, side by side."""
        own = {f.name for f in fields(cls)} - {"policy"}
        policy = RoomPolicy.from_settings({k: v for k, v in values.items() if k not in own})
        return cls(policy=policy, **{k: v for k, v in values.items() if k in own})


class NegotiationRooms:
    """The room service: submissions, votes, decisions, escalations and waiting for them."""

    def __init__(
        self,
        store: RoomStore,
        router: Router,
        events: EventRecorder,
        clock: Clock,
        ids: IdGenerator,
        hitl: Hitl,
        settings: RoomSettings | None = None,
        *,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.settings = settings or RoomSettings()
        self.timers = Timers()
        """The vote timers, keyed by artifact_id (fired by `fire_due`)."""
        self._store = store
        self._events = events
        self._clock = clock
        self._ids = ids
        self._hitl = hitl
        self._sleep = sleep
        self._notifier = RoomNotifier(router, NoticeFactory(clock, ids, ROOM_SERVICE), events)
        self._check_flow_id = router.check_flow_id
        self._policies: dict[str, RoomPolicy] = {}
        self._live: dict[str, ProposalRecord] = {}
        """OPEN and ESCALATED proposals by artifact_id, with their votes in `_votes`."""
        self._votes: dict[str, list[VoteRecord]] = {}
        self._waiters: dict[str, list[asyncio.Future[DecisionRecord]]] = {}
        self._watchers: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        router.attach(ROOM_SERVICE, self._on_envelope)

    # ------------------------------------------------------------------ start-up

    async def load(self) -> int:
        """Resume every open and escalated room after a (re)start; returns how many."""
        await self._notifier.load()
        current = self.settings.policy
        await self._store.put_policy(current.record(self._clock.now()))
        for record in await self._store.list_policies():
            self._policies[record.version] = RoomPolicy.from_record(record)
        self._policies[current.policy_version] = current
        live = await self._store.list_proposals(LIVE, limit=1 << 62)
        async with self._lock:
            for proposal in live:
                votes = await self._store.votes(proposal.artifact_id)
                self._live[proposal.artifact_id] = proposal
                self._votes[proposal.artifact_id] = votes
                if proposal.state == RoomState.ESCALATED:
                    self._watch(proposal)
                elif len(votes) >= len(proposal.requested_critics):
                    step = RoomMachine.complete(
                        proposal, votes, now=self._clock.now(), policy=self._policy(proposal)
                    )
                    await self._perform(step)
                else:
                    self.timers.arm(proposal.artifact_id, proposal.vote_deadline)
                    await self._notify_critics(proposal, votes)
        return len(live)

    async def close(self) -> None:
        """Stop waiting for HITL decisions (they are picked up again by the next `load`)."""
        for watcher in list(self._watchers):
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)

    # ------------------------------------------------------------------ requests

    async def submit(self, draft: ProposalDraft, caller: str = "") -> ProposalRecord:
        """SubmitProposal: open a room for the proposal. Missing artifact and room ids are
        generated; a known artifact_id is refused with already_exists."""
        filled = replace(
            draft,
            artifact_id=draft.artifact_id or self._ids.new_id(),
            negotiation_room_id=draft.negotiation_room_id or self._ids.new_id(),
        )
        self._check_flow_id("proposal.negotiation_room_id", filled.negotiation_room_id)
        checked = check_proposal(
            filled, caller=caller, max_artifact_bytes=self.settings.max_artifact_bytes
        )
        async with self._lock:
            artifact_id = checked.artifact_id
            if artifact_id in self._live or await self._store.get_proposal(artifact_id):
                raise AlreadyExistsError(
                    f"artifact {artifact_id!r} was already proposed",
                    {"field": "proposal.artifact_id", "artifact_id": artifact_id},
                )
            step = RoomMachine.open(checked, now=self._clock.now(), policy=self.settings.policy)
            await self._perform(step)
        return step.proposal

    async def vote(self, draft: VoteDraft, caller: str = "") -> VoteRecord:
        """SubmitVote: record a critic's vote; the last requested vote decides the room."""
        artifact_id = identifier(draft.artifact_id, "vote.artifact_id")
        async with self._lock:
            proposal = await self._find(artifact_id)
            votes = self._votes.get(artifact_id)
            if votes is None:
                votes = await self._store.votes(artifact_id)
            step = RoomMachine.vote(
                proposal, votes, draft, caller=caller, now=self._clock.now(),
                policy=self._policy(proposal),
            )  # fmt: skip
            await self._perform(step)
        assert step.vote is not None
        return step.vote

    async def proposal(self, artifact_id: str, room_id: str = "") -> ProposalRecord:
        """The proposal; NotFoundError for an unknown artifact or one of another room."""
        found = await self._find(identifier(artifact_id, "artifact_id"))
        if room_id and found.negotiation_room_id != room_id:
            raise NotFoundError(
                f"artifact {artifact_id!r} is not in room {room_id!r}",
                {"artifact_id": artifact_id, "negotiation_room_id": room_id},
            )
        return found

    async def votes(self, artifact_id: str, room_id: str = "") -> list[VoteRecord]:
        """GetVotes: the votes so far, oldest first."""
        await self.proposal(artifact_id, room_id)
        return list(self._votes.get(artifact_id) or await self._store.votes(artifact_id))

    async def decisions(self, artifact_id: str, room_id: str = "") -> list[DecisionRecord]:
        """Every decision on the artifact, the policy's first."""
        await self.proposal(artifact_id, room_id)
        return await self._store.decisions(artifact_id)

    async def decision(self, artifact_id: str, room_id: str = "") -> DecisionRecord | None:
        """GetDecision: the latest decision (ESCALATED_TO_HITL while HITL decides), or None
        while the room is still collecting votes."""
        found = await self.decisions(artifact_id, room_id)
        return found[-1] if found else None

    async def wait(
        self, artifact_id: str, room_id: str = "", timeout_s: float = 0.0
    ) -> DecisionRecord:
        """WaitForDecision: the final decision (APPROVED or REVISION_REQUESTED; through an
        escalation, the human's), waiting up to `timeout_s` (0: the default window; at most
        `wait_max_s`). DeadlineExceededError when none came in time."""
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float):
            raise ValidationError.for_field("timeout_seconds", "must be a number")
        if not math.isfinite(timeout_s) or timeout_s < 0:
            raise ValidationError.for_field("timeout_seconds", "must be a finite number >= 0")
        window = min(timeout_s or self.settings.wait_default_s, self.settings.wait_max_s)
        async with self._lock:
            proposal = await self.proposal(artifact_id, room_id)
            if RoomState(proposal.state).terminal:
                return (await self._store.decisions(artifact_id))[-1]
            future: asyncio.Future[DecisionRecord] = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(artifact_id, []).append(future)
        sleeper: asyncio.Future[None] = asyncio.ensure_future(self._sleep(window))
        racing: set[asyncio.Future[Any]] = {future, sleeper}
        try:
            await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waiting = self._waiters.get(artifact_id, [])
            if future in waiting:
                waiting.remove(future)
            if not future.done():
                future.cancel()
        if future.cancelled():
            state = self._live.get(artifact_id, proposal).state
            raise DeadlineExceededError(
                f"no decision on {artifact_id!r} within {window:g} s (it is {state})",
                {"artifact_id": artifact_id, "state": state},
            )
        return future.result()

    async def list_proposals(
        self,
        *,
        room_id: str | None = None,
        states: frozenset[str] | None = None,
        critic_id: str | None = None,
        limit: int = 100,
    ) -> list[ProposalRecord]:
        """Proposals, oldest first; with `critic_id`, the open ones that critic still has to
        review (what a critic reads after being offline)."""
        if critic_id is not None:
            pending = [
                p for p in self._live.values()
                if p.state == RoomState.OPEN and critic_id in p.requested_critics
                and all(v.critic_id != critic_id for v in self._votes.get(p.artifact_id, []))
                and (room_id is None or p.negotiation_room_id == room_id)
            ]  # fmt: skip
            return sorted(pending, key=lambda p: (p.created_at, p.artifact_id))[:limit]
        return await self._store.list_proposals(states, room_id, limit=limit)

    def policy(self, version: str) -> RoomPolicy | None:
        """A known policy version's settings."""
        return self._policies.get(version)

    async def policy_versions(self) -> list[PolicyVersionRecord]:
        """Every policy version on record, oldest first (audit, rollback)."""
        return await self._store.list_policies()

    # ------------------------------------------------------------------ time

    async def fire_due(self) -> int:
        """Apply every vote timeout that is due; returns how many timers fired."""
        fired = 0
        async with self._lock:
            for artifact_id in self.timers.due(self._clock.now()):
                fired += 1
                proposal = self._live.get(artifact_id)
                if proposal is None or proposal.state != RoomState.OPEN:
                    continue
                step = RoomMachine.deadline_passed(
                    proposal, self._votes.get(artifact_id, []), now=self._clock.now(),
                    policy=self._policy(proposal),
                )  # fmt: skip
                await self._perform(step)
        return fired

    # ------------------------------------------------------------------ effects

    async def _perform(self, step: RoomStep) -> None:
        proposal, decision = step.proposal, step.decision
        artifact_id = proposal.artifact_id
        # The step's events commit with its write: a vote's (room.voted) with the vote, the
        # rest with the proposal or the decision; EMIT_EVENT logs them only for a step that
        # writes neither.
        logged = False
        for effect in step.effects:
            if effect is _F.PERSIST_PROPOSAL:
                drafts = [] if logged else self._drafts(step, proposal, voted=False)
                await self._events.commit(drafts, partial(self._store.put_proposal, proposal))
                logged = True
            elif effect is _F.PERSIST_VOTE and step.vote is not None:
                # Logged as it lands: before the escalation it may cause.
                drafts = self._drafts(step, proposal, voted=True)
                await self._events.commit(drafts, partial(self._store.add_vote, step.vote))
                self._votes.setdefault(artifact_id, []).append(step.vote)
            elif effect is _F.ESCALATE_TO_HITL and step.escalation is not None:
                invocation = await self._escalate(proposal, step.escalation)
                proposal = replace(proposal, invocation_id=invocation)
                decision = replace(decision, invocation_id=invocation) if decision else None
            elif effect is _F.RECORD_DECISION and decision is not None:
                drafts = [] if logged else self._drafts(step, proposal, voted=False)
                await self._events.commit(drafts, partial(self._store.decide, proposal, decision))
                logged = True
            elif effect is _F.START_TIMER:
                self.timers.arm(artifact_id, proposal.vote_deadline)
            elif effect is _F.CANCEL_TIMER:
                self.timers.cancel(artifact_id)
            elif effect is _F.NOTIFY_CRITICS:
                await self._notify_critics(proposal, [])
            elif effect is _F.NOTIFY_PRODUCER and decision is not None:
                body = decision_notice(proposal, decision)
                token = f"room:{artifact_id}:decision:{decision.sequence}"
                await self._notifier.send(
                    proposal.producer_id, body, token, proposal.negotiation_room_id
                )
            elif effect is _F.RESOLVE and decision is not None:
                for future in self._waiters.pop(artifact_id, []):
                    if not future.done():
                        future.set_result(decision)
            elif effect is _F.EMIT_EVENT and not logged:
                for draft in self._drafts(step, proposal, voted=False):
                    self._events.queue(draft)
        if RoomState(proposal.state).terminal:
            self._live.pop(artifact_id, None)
            self._votes.pop(artifact_id, None)
        else:
            self._live[artifact_id] = proposal
            self._votes.setdefault(artifact_id, [])
        if _F.ESCALATE_TO_HITL in step.effects:
            self._watch(proposal)

    def _drafts(self, step: RoomStep, proposal: ProposalRecord, *, voted: bool) -> list[EventDraft]:
        """The step's events: with `voted`, only its vote's (room.voted); else the rest."""
        drafts = []
        for event_type, details in step.events:
            if (event_type == VOTED) is not voted:
                continue
            extra = {"invocation_id": proposal.invocation_id} if proposal.invocation_id else {}
            agent = str(details.get("critic_id") or proposal.producer_id)
            drafts.append(self._events.draft(
                event_type, str(details.get("by") or ROOM_SERVICE),
                correlation_id=proposal.negotiation_room_id, agent_id=agent,
                **{**details, **extra},
            ))  # fmt: skip
        return drafts

    async def _notify_critics(self, proposal: ProposalRecord, votes: list[VoteRecord]) -> None:
        body = proposal_notice(proposal, self.settings.inline_artifact_bytes)
        voted = {v.critic_id for v in votes}
        for critic in proposal.requested_critics:
            if critic not in voted:
                token = f"room:{proposal.artifact_id}:review:{critic}"
                await self._notifier.send(critic, body, token, proposal.negotiation_room_id)

    async def _escalate(self, proposal: ProposalRecord, escalation: Escalation) -> str:
        """Open the HITL invocation, unless one for this artifact is pending already (opened
        just before a restart, before the room recorded it)."""
        for pending in await self._hitl.list(limit=10_000):
            subject = pending.subject
            if pending.requested_by == ROOM_SERVICE and subject.get("artifact_id") == (
                proposal.artifact_id
            ):
                return pending.invocation_id
        record = await self._hitl.open(
            escalation.reason_type.value, escalation.context, requested_by=ROOM_SERVICE,
            subject=escalation.subject, proposed_actions=escalation.proposed_actions,
            approver_roles=escalation.approver_roles, timeout_s=escalation.timeout_s,
            correlation_id=proposal.negotiation_room_id,
        )  # fmt: skip
        return record.invocation_id

    def _watch(self, proposal: ProposalRecord) -> None:
        watcher = asyncio.ensure_future(
            self._await_human(proposal.artifact_id, proposal.invocation_id)
        )
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)

    async def _await_human(self, artifact_id: str, invocation_id: str) -> None:
        try:
            record = await self._hitl.wait(invocation_id)
        except NotFoundError:
            log.error("room %s: HITL invocation %s is gone", artifact_id, invocation_id)
            return
        async with self._lock:
            proposal = self._live.get(artifact_id)
            if proposal is None or proposal.state != RoomState.ESCALATED:
                return
            if proposal.invocation_id != invocation_id:
                return
            step = RoomMachine.human_decision(
                proposal, self._votes.get(artifact_id, []), record.decision,
                now=self._clock.now(),
            )  # fmt: skip
            await self._perform(step)

    # ------------------------------------------------------------------ helpers

    async def _find(self, artifact_id: str) -> ProposalRecord:
        found = self._live.get(artifact_id) or await self._store.get_proposal(artifact_id)
        if found is None:
            raise NotFoundError(
                f"no proposal for artifact {artifact_id!r}", {"artifact_id": artifact_id}
            )
        return found

    def _policy(self, proposal: ProposalRecord) -> RoomPolicy:
        found = self._policies.get(proposal.policy_version)
        if found is None:
            log.warning(
                "room %s: policy version %s is unknown; deciding under %s",
                proposal.artifact_id, proposal.policy_version, self.settings.policy.policy_version,
            )  # fmt: skip
            return self.settings.policy
        return found

    async def _on_envelope(self, env: Envelope) -> None:
        """Router endpoint of the room service: agents' ACKs of its notifications."""
        if env.message_type is not MessageType.ACKNOWLEDGEMENT:
            raise ValidationError.for_field(
                "message_type",
                f"the negotiation room service takes no {env.message_type.name} envelopes; "
                "use NegotiationRoomService",
            )
