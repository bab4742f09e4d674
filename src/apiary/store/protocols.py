"""The storage protocols every backend implements (DESIGN.md section 6).

Each aggregate has a small async protocol; a `Store` bundles them. One conformance suite
(`apiary.testing.store_suite`) runs against every backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from apiary.core.events import Event, EventDraft, EventFilter
from apiary.core.negotiation.records import ArtifactRecord, NegotiationRecord, RoundRecord
from apiary.core.records import (
    AdmissionWrites,
    AgentRecord,
    DlqEntry,
    DlqFilter,
    HandoffRecord,
    HitlRecord,
    IdempotencyRecord,
    MessageState,
    StateChange,
    StoredMessage,
    TaskRecord,
    TokenProgress,
)
from apiary.core.rooms.records import (
    DecisionRecord,
    PolicyVersionRecord,
    ProposalRecord,
    VoteRecord,
)
from apiary.core.runtime.actions import ActionRecord
from apiary.core.runtime.jobs import JobItemRecord, JobRecord
from apiary.core.runtime.records import (
    ChannelRecord,
    RuntimeWrite,
    SessionRecord,
    ThreadRecord,
    TurnRecord,
)
from apiary.core.runtime.task_records import (
    CommandKeyRecord,
    RuntimeTaskRecord,
    TaskLinkRecord,
    TaskRunRecord,
)
from apiary.core.swarm_mail import InboxEntry, OutboxEntry
from apiary.core.tools.descriptor import ToolProviderRecord
from apiary.core.workflow.definition import WorkflowSpec
from apiary.core.workflow.node import NodeRun
from apiary.core.workflow.run import StoredWorkflow, WorkflowRun, WorkflowSummary
from apiary.core.worktrees.records import WorktreeBinding
from apiary.store.errors import (
    AdmissionRefusal,
)


class EventLog(Protocol):
    """Append-only event log with gap-free sequence numbers starting at 1."""

    async def append(self, drafts: Sequence[EventDraft]) -> list[Event]:
        """Append the drafts atomically, in order; return them with their sequences."""
        ...

    async def read(
        self, after: int = 0, limit: int = 500, where: EventFilter | None = None
    ) -> list[Event]:
        """Events with sequence > `after` that match `where`, ascending, at most `limit`."""
        ...

    async def last_sequence(self) -> int:
        """The highest sequence appended so far (0 for an empty log)."""
        ...

    def listen(self, listener: Callable[[Sequence[Event]], None]) -> None:
        """Call `listener` with the events of every append through this store once they are
        committed: by `append`, or with a state change of another aggregate that took
        `events` (committed in that change's transaction)."""
        ...


class AgentStore(Protocol):
    async def put(self, agent: AgentRecord, events: Sequence[EventDraft] = ()) -> None:
        """Insert or replace the agent with this agent_id, appending `events` to the event
        log in the same transaction."""
        ...

    async def get(self, agent_id: str) -> AgentRecord | None: ...

    async def list(self) -> list[AgentRecord]:
        """All agents, ordered by agent_id."""
        ...

    async def delete(self, agent_id: str, events: Sequence[EventDraft] = ()) -> bool:
        """Remove the agent; False when it was not there. `events` are appended to the
        event log in the removal's transaction: with events, an agent that is not there
        raises LookupError instead (nothing is appended)."""
        ...


class MessageStore(Protocol):
    async def admit(self, message: StoredMessage) -> StoredMessage:
        """Durably record a new message; returns it with its inbox offset assigned.

        The store assigns `offset` (the input's offset is ignored): strictly increasing per
        recipient from 1, with no gaps. Raises `apiary.store.errors.DuplicateMessageError` when
        a message with the same message_id exists; nothing changes then.
        """
        ...

    async def get(self, message_id: str) -> StoredMessage | None: ...

    async def set_state(
        self, message_id: str, state: MessageState, at: float, error_code: str = ""
    ) -> StoredMessage:
        """Record a state change; raises LookupError for an unknown message_id."""
        ...

    async def inbox(
        self,
        recipient: str,
        after_offset: int = 0,
        limit: int = 100,
        states: frozenset[MessageState] | None = None,
    ) -> list[StoredMessage]:
        """The recipient's messages with offset > after_offset (ascending), optionally
        only those in `states`."""
        ...

    async def count(self, recipient: str, states: frozenset[MessageState]) -> int:
        """How many of the recipient's messages are in one of `states`."""
        ...

    async def admit_many(
        self,
        messages: Sequence[StoredMessage],
        writes: Sequence[AdmissionWrites] = (),
        events: Sequence[EventDraft] = (),
    ) -> list[StoredMessage | AdmissionRefusal]:
        """Admit each message as `admit` does, in one transaction where the backend has
        them; a duplicate fails only its own member (per-message outcomes, RFC 5.4), and so
        does a member whose token's record is no longer the one its admission found
        (`AdmissionWrites.idempotency_found`: another admission of the token came first),
        and a requeue whose dead letter another requeue marked (`AdmissionWrites.requeues`).
        `writes` (empty, or one per message) commit with the members admitted; `events`
        are appended in the transaction in any case, ahead of the members' events."""
        ...

    async def apply(
        self,
        changes: Sequence[StateChange],
        events: Sequence[EventDraft] = (),
        tokens: Sequence[TokenProgress] = (),
        tasks: Sequence[TaskRecord] = (),
    ) -> list[StoredMessage]:
        """Apply state changes in order (one transaction, which appends `events` to the event
        log too, reflects each of `tokens` in order in its idempotency record as the
        transaction reads it, with the token's event when its cached outcome changes:
        core/dedup.py `advance`, and inserts or replaces the task records `tasks`: the
        Scheduler's transitions the ACKs of its dispatches cause); unknown ids raise
        LookupError and apply nothing."""
        ...

    async def record(
        self,
        changes: Sequence[StateChange],
        events: Sequence[EventDraft] = (),
        tokens: Sequence[TokenProgress] = (),
        tasks: Sequence[TaskRecord] = (),
    ) -> None:
        """Apply state changes as `apply` does, without reading the messages back: for a
        caller that holds them already (`core.records.changed` gives the result)."""
        ...

    async def record_deliveries(self, counts: Sequence[tuple[str, int, float]]) -> None:
        """For each (message_id, deliveries, last_delivered_at): keep the larger of the given
        and the stored count, and of the two times (unknown ids are ignored)."""
        ...

    async def finish_delivered(self, message_ids: Sequence[str], at: float) -> None:
        """One more delivery at `at` and then `record` FULFILLED at `at` for each message, as
        one write: what a notice goes through when it is handed out. Unknown ids are ignored."""
        ...

    async def due(self, now: float, limit: int = 500) -> list[StoredMessage]:
        """Unfinished messages whose ack_deadline or expires_at is set and <= now,
        ordered by the earlier of the two."""
        ...

    async def next_deadline(self) -> float | None:
        """The earliest set ack_deadline/expires_at of any unfinished message, or None."""
        ...

    async def by_sequence(self, producer_id: str, sequence_number: int) -> StoredMessage | None:
        """The most recent message of `producer_id` with that sequence number."""
        ...

    async def max_sequence(self, producer_id: str) -> int:
        """The highest sequence number of any retained message of `producer_id` (0: none)."""
        ...

    async def oldest_offset(self, recipient: str) -> int:
        """The lowest offset still retained in the recipient's inbox (0 when empty)."""
        ...

    async def purge_finished(self, before: float) -> int:
        """Delete messages in a terminal state last updated before `before`; returns how
        many. Offsets of the remaining messages never change."""
        ...


class IdempotencyStore(Protocol):
    """The persistent idempotency cache (RFC 11.2)."""

    async def get(self, token: str) -> IdempotencyRecord | None: ...

    async def put(self, record: IdempotencyRecord) -> None:
        """Insert or replace the record for record.token."""
        ...

    async def purge(self, before: float) -> int:
        """Delete records last updated before `before`; returns how many."""
        ...


class DlqStore(Protocol):
    """The dead letter queue (RFC 21.1)."""

    async def add(self, entry: DlqEntry) -> DlqEntry:
        """Record an entry; returns it with its entry_id assigned (the given one ignored)."""
        ...

    async def get(self, entry_id: int) -> DlqEntry | None: ...

    async def list(
        self, where: DlqFilter | None = None, after_id: int = 0, limit: int = 100
    ) -> list[DlqEntry]:
        """Entries with entry_id > after_id matching `where`, ascending, at most `limit`."""
        ...

    async def mark_requeued(self, entry_id: int, at: float, new_message_id: str) -> DlqEntry:
        """Record that the entry was requeued; LookupError for an unknown id."""
        ...

    async def purge(self, before: float) -> int:
        """Delete entries that failed before `before` (retention); returns how many."""
        ...


class HitlStore(Protocol):
    """HITL invocations and their decisions (RFC 15): pending ones survive restarts."""

    async def put(self, record: HitlRecord, events: Sequence[EventDraft] = ()) -> None:
        """Insert or replace the record with this invocation_id, appending `events` to the
        event log in the same transaction."""
        ...

    async def get(self, invocation_id: str) -> HitlRecord | None: ...

    async def list(
        self, states: frozenset[str] | None = None, after_created: float = 0.0, limit: int = 100
    ) -> list[HitlRecord]:
        """Records in `states` (all when None) created after `after_created`, oldest first
        (by created_at, then invocation_id), at most `limit`."""
        ...


class TaskStore(Protocol):
    """Scheduler tasks (RFC 7, 9): their state survives a restart."""

    async def put(self, record: TaskRecord, events: Sequence[EventDraft] = ()) -> None:
        """Insert or replace the record with this task_id, appending `events` to the event
        log in the same transaction."""
        ...

    async def create(self, record: TaskRecord, events: Sequence[EventDraft] = ()) -> None:
        """Insert a new task, appending `events` in the same transaction; TaskExistsError,
        with nothing stored, when a task with its task_id is stored already (the check is
        the write's: a submission needs no read to know its id is new)."""
        ...

    async def create_many(
        self, records: Sequence[TaskRecord], events: Sequence[EventDraft] = ()
    ) -> None:
        """Insert new tasks (distinct task_ids), all or none, appending `events` in the same
        transaction (one for the lot: a burst of submissions is one commit); TaskExistsError,
        naming the first taken task_id, with nothing stored when any is stored already."""
        ...

    async def get(self, task_id: str) -> TaskRecord | None: ...

    async def list(
        self,
        states: frozenset[str] | None = None,
        agent_id: str | None = None,
        after_seq: int = -1,
        limit: int = 100,
        queue: str | None = None,
        submitter: str | None = None,
    ) -> list[TaskRecord]:
        """Records in `states` (all when None) for `agent_id` (all when None) in the shared
        `queue` (all when None; '' for the tasks submitted to one agent) submitted by
        `submitter` (all when None) with seq above `after_seq`, in seq order, at most
        `limit`."""
        ...

    async def max_seq(self) -> int:
        """The highest seq stored, -1 when there are no tasks."""
        ...


class WorkflowStore(Protocol):
    """DAG workflows (RFC 17.7): definitions and run state survive a restart."""

    async def create(
        self,
        spec: WorkflowSpec,
        run: WorkflowRun,
        nodes: Sequence[NodeRun],
        events: Sequence[EventDraft] = (),
    ) -> None:
        """Store a new workflow, appending `events` to the event log in the same transaction;
        DuplicateWorkflowError (a StoreError) when its id is taken (nothing is stored then,
        events included)."""
        ...

    async def get(self, workflow_id: str) -> StoredWorkflow | None:
        """The workflow with every node's run (in definition order), or None."""
        ...

    async def save(
        self, run: WorkflowRun, nodes: Sequence[NodeRun], events: Sequence[EventDraft] = ()
    ) -> None:
        """Replace the run and the runs of `nodes`, all in one transaction, which appends
        `events` to the event log too; StoreError when the workflow or one of the nodes does
        not exist (nothing is changed then, events included)."""
        ...

    async def list(
        self, statuses: frozenset[str] | None = None, after_id: str = "", limit: int = 100
    ) -> list[WorkflowRun]:
        """Runs in `statuses` (all when None) with workflow_id above `after_id`, by
        workflow_id, at most `limit`."""
        ...

    async def summaries(
        self, statuses: frozenset[str] | None = None, after_id: str = "", limit: int = 100
    ) -> Sequence[WorkflowSummary]:
        """As `list`, each run without its data and with its nodes counted (all, and those
        COMPLETED, FAILED or SKIPPED)."""
        ...

    async def summary(self, workflow_id: str) -> WorkflowSummary | None:
        """The summary of one workflow (as `summaries`), or None."""
        ...


class HandoffStore(Protocol):
    """Agent handoffs (RFC 17.6): pending offers and their deadlines survive a restart."""

    async def put(self, record: HandoffRecord, events: Sequence[EventDraft] = ()) -> None:
        """Insert or replace the record with this request_id, appending `events` to the
        event log in the same transaction."""
        ...

    async def get(self, request_id: str) -> HandoffRecord | None: ...

    async def list(
        self,
        states: frozenset[str] | None = None,
        *,
        from_agent: str | None = None,
        to_agent: str | None = None,
        after_created: float = 0.0,
        limit: int = 100,
    ) -> list[HandoffRecord]:
        """Records in `states` (all when None), from `from_agent` and to `to_agent` (any when
        None), created after `after_created`, oldest first (by created_at, then
        request_id), at most `limit`."""
        ...


class WorktreeStore(Protocol):
    """Worktree bindings (RFC 16), one per agent: homes, switches and bind failures survive
    a restart."""

    async def put(self, binding: WorktreeBinding, events: Sequence[EventDraft] = ()) -> None:
        """Store `binding` when its version is the stored one's plus one (1 for an agent with
        no record yet), appending `events` to the event log in the same transaction;
        otherwise raise `apiary.store.errors.VersionConflictError` and change nothing (events
        included). ValueError for a record no backend can store (a bad state, version < 1)."""
        ...

    async def get(self, agent_id: str) -> WorktreeBinding | None: ...

    async def list(
        self, states: frozenset[str] | None = None, repo_id: str | None = None
    ) -> list[WorktreeBinding]:
        """Bindings in `states` (all when None) whose home or current repository is `repo_id`
        (any when None), ordered by agent_id."""
        ...


class RoomStore(Protocol):
    """Negotiation rooms (RFC 17.5): proposals, votes, decisions and policy versions; what
    the room service needs to resume every room after a restart, and the audit record."""

    async def put_policy(self, record: PolicyVersionRecord) -> bool:
        """Record a policy version; True when it is new. A version already stored with the
        same settings changes nothing (False); with other settings it raises StoreError and
        changes nothing (a version always names the same settings)."""
        ...

    async def get_policy(self, version: str) -> PolicyVersionRecord | None: ...

    async def list_policies(self) -> list[PolicyVersionRecord]:
        """Every policy version, oldest first (by created_at, then version)."""
        ...

    async def put_proposal(self, record: ProposalRecord, events: Sequence[EventDraft] = ()) -> None:
        """Insert or replace the proposal with this artifact_id, appending `events` to the
        event log in the same transaction."""
        ...

    async def get_proposal(self, artifact_id: str) -> ProposalRecord | None: ...

    async def list_proposals(
        self,
        states: frozenset[str] | None = None,
        room_id: str | None = None,
        after_created: float = 0.0,
        limit: int = 100,
    ) -> list[ProposalRecord]:
        """Proposals in `states` (all when None) of room `room_id` (all when None) created
        after `after_created`, oldest first (by created_at, then artifact_id), at most
        `limit`."""
        ...

    async def add_vote(self, vote: VoteRecord, events: Sequence[EventDraft] = ()) -> None:
        """Record a vote, appending `events` to the event log in the same transaction; a
        second vote of the same critic on the same artifact raises StoreError and changes
        nothing (events included)."""
        ...

    async def votes(self, artifact_id: str) -> list[VoteRecord]:
        """The artifact's votes, oldest first (by voted_at, then critic_id)."""
        ...

    async def decide(
        self,
        proposal: ProposalRecord,
        decision: DecisionRecord,
        events: Sequence[EventDraft] = (),
    ) -> None:
        """Replace the proposal and append the decision and `events` (to the event log),
        atomically. A decision whose (artifact_id, sequence) exists raises StoreError and
        changes nothing, the proposal and events included."""
        ...

    async def decisions(self, artifact_id: str) -> list[DecisionRecord]:
        """The artifact's decisions by sequence."""
        ...


class ToolStore(Protocol):
    """Tool providers and their descriptors (RFC 18.1): the catalogue survives a restart."""

    async def put(self, record: ToolProviderRecord) -> None:
        """Insert or replace the provider with this provider_id and all of its tools, at once
        (no reader sees a mix of the old and the new tools)."""
        ...

    async def get(self, provider_id: str) -> ToolProviderRecord | None:
        """The provider with its tools in the order it gave them, or None."""
        ...

    async def list(self) -> list[ToolProviderRecord]:
        """Every provider, ordered by provider_id."""
        ...

    async def delete(self, provider_id: str) -> bool:
        """Remove the provider and its tools; False when it was not there."""
        ...


class NegotiationStore(Protocol):
    """Negotiations (RFC 17): rooms with their EffectivePolicy, their rounds, and the
    Scheduler's base policy and profiles; open negotiations survive a restart."""

    async def save(
        self,
        record: NegotiationRecord,
        round_: RoundRecord | None = None,
        artifacts: Sequence[ArtifactRecord] = (),
        events: Sequence[EventDraft] = (),
        artifact_events: Sequence[EventDraft] = (),
    ) -> list[bool]:
        """Insert or replace the record (by negotiation_id) and, when given, the round (by
        negotiation_id and round), and append the artifacts (as `ArtifactStore.append`:
        False for one whose (negotiation_id, kind, version) exists, which stays as it was),
        all in one transaction: a reader never sees a state without the artifacts that came
        with it. The transaction appends `events` to the event log, then the event of each
        artifact added (`artifact_events`: none, or one per artifact; ValueError otherwise).
        Returns, per artifact, whether it was added."""
        ...

    async def get(self, negotiation_id: str) -> NegotiationRecord | None: ...

    async def rounds(self, negotiation_id: str) -> list[RoundRecord]:
        """The negotiation's rounds, ascending."""
        ...

    async def list(
        self, states: frozenset[str] | None = None, after_created: float = 0.0, limit: int = 100
    ) -> list[NegotiationRecord]:
        """Records in `states` (all when None) created after `after_created`, oldest first
        (by created_at, then negotiation_id), at most `limit`."""
        ...

    async def put_policy(
        self, name: str, policy: Mapping[str, Any], at: float, events: Sequence[EventDraft] = ()
    ) -> None:
        """Insert or replace one policy: name '' is the base policy, any other a profile;
        `events` are appended to the event log in the same transaction."""
        ...

    async def replace_profiles(
        self,
        profiles: Mapping[str, Mapping[str, Any]],
        at: float,
        events: Sequence[EventDraft] = (),
    ) -> None:
        """Make `profiles` the whole set of profiles, in one transaction (the base policy
        stays) that appends `events` to the event log. A profile may not be named ''."""
        ...

    async def policies(self) -> dict[str, dict[str, Any]]:
        """Every stored policy by name ('' for the base policy when one was set)."""
        ...


class ArtifactStore(Protocol):
    """Negotiation artifacts (RFC 17.4, sw4rm.activity.ActivityService)."""

    async def append(self, artifact: ArtifactRecord, events: Sequence[EventDraft] = ()) -> bool:
        """Record the artifact, appending `events` to the event log in the same transaction;
        False (and nothing changes, events included) when one with the same
        (negotiation_id, kind, version) exists."""
        ...

    async def get(self, negotiation_id: str, kind: str, version: str) -> ArtifactRecord | None: ...

    async def list(self, negotiation_id: str, kind: str | None = None) -> list[ArtifactRecord]:
        """The negotiation's artifacts (of `kind` when given) in the order appended."""
        ...


class SwarmStore(Protocol):
    """The Agent Swarm Protocol's inbox and outbox (core/swarm_mail.py)."""

    async def receive(self, entry: InboxEntry) -> bool:
        """Add a received message; False, changing nothing, when its message_id is already
        in the inbox (a re-post is ignored, whatever its content)."""
        ...

    async def inbox_get(self, message_id: str) -> InboxEntry | None: ...

    async def list_recent(
        self,
        swarm_id: str | None = None,
        limit: int = 50,
        statuses: frozenset[str] | None = None,
    ) -> list[InboxEntry]:
        """Messages of `swarm_id` (all swarms when None) in `statuses` (when None: all but
        deleted), newest received first (ties by message_id, descending), at most
        min(limit, 100); ValueError for a negative limit or an unknown status."""
        ...

    async def set_status(self, message_id: str, status: str, at: float) -> InboxEntry | None:
        """Record `status` (not checked against the current one: see `inbox_move`); the first
        move to read sets read_at, a move to deleted sets deleted_at. None when unknown."""
        ...

    async def thread_latest(self, key: str) -> InboxEntry | None:
        """The newest received message whose message_id or thread_id is `key`."""
        ...

    async def outbox_put(self, entry: OutboxEntry) -> None:
        """Insert or replace the row of (message_id, destination)."""
        ...

    async def outbox_get(self, message_id: str) -> list[OutboxEntry]:
        """Every destination's row of one message, by destination."""
        ...

    async def outbox_recent(
        self,
        swarm_id: str | None = None,
        limit: int = 50,
        statuses: frozenset[str] | None = None,
    ) -> list[OutboxEntry]:
        """Rows newest first (created_at, then message_id and destination descending), at
        most min(limit, 100)."""
        ...

    async def outbox_pending(self, limit: int = 100) -> list[OutboxEntry]:
        """Rows whose delivery has not ended (`PENDING_STATUSES`), soonest `next_attempt_at`
        first (then created_at, message_id, destination), at most `limit`."""
        ...


class RuntimeStore(Protocol):
    """The runtime control plane's sessions, threads, turns and channels
    (spec/runtime-control-plane.txt): a thread's queue and its turns survive a restart."""

    async def save(self, write: RuntimeWrite, events: Sequence[EventDraft] = ()) -> None:
        """Insert or replace every record of `write` (by its id), appending `events` to the
        event log, all in one transaction. StoreError, changing nothing (events included),
        when a turn's (thread_id, ordinal) or task_id belongs to another turn; ValueError
        for a record no backend can store (an unknown turn state, an ordinal outside int64)."""
        ...

    async def session(self, session_id: str) -> SessionRecord | None: ...

    async def thread(self, thread_id: str) -> ThreadRecord | None: ...

    async def threads(self, session_id: str) -> list[ThreadRecord]:
        """The session's threads, oldest first (by created_at, then thread_id)."""
        ...

    async def turn(self, turn_id: str) -> TurnRecord | None: ...

    async def turn_of_task(self, task_id: str) -> TurnRecord | None:
        """The turn that runs as the Scheduler task `task_id`, if any."""
        ...

    async def turns(self, thread_id: str, last: int = 100) -> list[TurnRecord]:
        """The thread's last `last` turns by ordinal, in ordinal order."""
        ...

    async def open_turns(self, thread_id: str | None = None) -> list[TurnRecord]:
        """Turns not ended (queued, preparing, running) of `thread_id` (every thread when
        None), by thread_id, then queue order (`queue_key`: queue_rank, ordinal)."""
        ...

    async def channel(self, channel_id: str) -> ChannelRecord | None: ...

    async def task(self, task_id: str) -> RuntimeTaskRecord | None:
        """A runtime agent task (not a Scheduler task: its runs are those)."""
        ...

    async def session_tasks(self, session_id: str, last: int = 100) -> list[RuntimeTaskRecord]:
        """The session's last `last` agent tasks by creation, oldest first."""
        ...

    async def open_tasks(self) -> list[RuntimeTaskRecord]:
        """Agent tasks with a run in hand (queued, preparing, running, cancelling)."""
        ...

    async def runs(self, task_id: str) -> list[TaskRunRecord]:
        """The task's runs by attempt (ended ones too)."""
        ...

    async def run(self, run_id: str) -> TaskRunRecord | None: ...

    async def links(self, task_id: str) -> list[TaskLinkRecord]:
        """The edges from the task, removed ones too."""
        ...

    async def links_to(self, target_id: str) -> list[TaskLinkRecord]:
        """The edges to `target_id`, removed ones too."""
        ...

    async def command_key(self, owner: str, key: str) -> CommandKeyRecord | None:
        """The idempotency key `key` of `owner`, once a command stored it."""
        ...

    async def action(self, action_id: str) -> ActionRecord | None:
        """An action (a HITL invocation) the runtime reported."""
        ...

    async def open_actions(self) -> list[ActionRecord]:
        """The actions still pending, oldest first."""
        ...

    async def job(self, job_id: str) -> JobRecord | None:
        """A runtime job (create_job)."""
        ...

    async def session_jobs(self, session_id: str, last: int = 100) -> list[JobRecord]:
        """The session's last `last` jobs by creation, oldest first."""
        ...

    async def child_jobs(self, task_id: str) -> list[JobRecord]:
        """The jobs not ended whose parent task is `task_id`, by job_id."""
        ...

    async def job_item_of(self, task_id: str) -> JobItemRecord | None:
        """The job item whose task is `task_id`, if it is one."""
        ...

    async def job_items(self, job_id: str) -> list[tuple[JobItemRecord, RuntimeTaskRecord]]:
        """The job's items by ordinal, each with its task."""
        ...


class Store(Protocol):
    """One backend: every aggregate over one connection pool / file / process memory."""

    @property
    def events(self) -> EventLog: ...

    @property
    def agents(self) -> AgentStore: ...

    @property
    def messages(self) -> MessageStore: ...

    @property
    def idempotency(self) -> IdempotencyStore: ...

    @property
    def dlq(self) -> DlqStore: ...

    @property
    def hitl(self) -> HitlStore: ...

    @property
    def tasks(self) -> TaskStore: ...

    @property
    def workflows(self) -> WorkflowStore: ...

    @property
    def handoffs(self) -> HandoffStore: ...

    @property
    def worktrees(self) -> WorktreeStore: ...

    @property
    def rooms(self) -> RoomStore: ...

    @property
    def tools(self) -> ToolStore: ...

    @property
    def negotiations(self) -> NegotiationStore: ...

    @property
    def artifacts(self) -> ArtifactStore: ...

    @property
    def swarm(self) -> SwarmStore: ...

    @property
    def runtime(self) -> RuntimeStore: ...

    @property
    def backend(self) -> str:
        """'memory', 'sqlite' or 'postgresql'."""
        ...

    async def ping(self) -> None:
        """Reach the database once (a trivial read); StoreError when it cannot be reached.
        The coordinator's health follows it."""
        ...
