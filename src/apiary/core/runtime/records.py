"""What the runtime control plane stores (store/protocols.py `RuntimeStore`): sessions, their
threads, the turns queued and run on them, and the event channels applications follow.

A session belongs to the principal that created it (`owner`, `owner_of`) in its tenant (each
tenant has its own store). A thread is bound to one agent, whose Scheduler tasks its turns
run as; its turns are numbered in submission order (`ordinal`), and the queue is the turns
still `queued`, in that order unless a promotion ranked them anew (`queue_key`). Times are
UTC seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from apiary.core.access.principal import Principal, PrincipalKind
from apiary.core.access.rules import Role
from apiary.core.runtime.actions import ActionRecord
from apiary.core.runtime.jobs import JobItemRecord, JobRecord
from apiary.core.runtime.task_records import (
    CommandKeyRecord,
    RuntimeTaskRecord,
    TaskLinkRecord,
    TaskRunRecord,
)


class TurnState(StrEnum):
    """Where a turn stands (the contract's status words, `$defs.statusValue`)."""

    QUEUED = "queued"
    """Waiting in its thread's queue: no task yet."""
    PREPARING = "preparing"
    """Its task was submitted and waits for the agent (queued, held or dispatched)."""
    RUNNING = "running"
    """The agent is working on it (its task is RUNNING)."""
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in _ENDED

    @property
    def active(self) -> bool:
        """Holds its thread: its task exists and has not ended."""
        return self in (TurnState.PREPARING, TurnState.RUNNING)


_ENDED = frozenset({TurnState.COMPLETED, TurnState.FAILED, TurnState.CANCELLED})
OPEN_TURN_STATES = frozenset(s.value for s in TurnState if not s.terminal)


class QueuePolicy(StrEnum):
    """What a busy thread does with a new turn (the contract: queued work only if policy
    allows it)."""

    QUEUE = "queue"
    """Queue it behind the turns before it."""
    REJECT = "reject"
    """Refuse it (already_in_progress) while a turn runs or waits."""


def owner_of(principal: Principal) -> str:
    """How a session records its owner: `application:ci`, `agent:bob`, `anonymous:anonymous`
    (the tenant is the store's)."""
    return f"{principal.kind.value}:{principal.name}"


def may_use(principal: Principal, owner: str) -> bool:
    """Whether `principal` may read and drive a session `owner` owns: its owner, or an
    operator with the `tasks` role (who acts on other principals' tasks too)."""
    if owner_of(principal) == owner:
        return True
    return principal.kind is PrincipalKind.OPERATOR and principal.has_role(Role.TASKS)


@dataclass(frozen=True, slots=True)
class SessionRecord:
    session_id: str
    owner: str
    """`owner_of` its creator."""
    created_at: float
    updated_at: float
    workspace_id: str = ""
    title: str = ""


@dataclass(frozen=True, slots=True)
class ThreadRecord:
    thread_id: str
    session_id: str
    agent_id: str
    """The agent its turns run on ('' when it is bound to a capability queue)."""
    scope: str
    """The scope of its turns' tasks (RFC 9.2)."""
    queue_policy: str
    """A QueuePolicy value."""
    status: str
    """A ThreadStatus value, kept with every change (`thread_status`)."""
    created_at: float
    updated_at: float
    active_turn_id: str = ""
    """The turn whose task runs now ('' when none)."""
    turn_count: int = 0
    """Turns submitted so far: the next turn's ordinal."""
    parent_thread_id: str = ""
    """A subagent's thread: the thread that spawned it ('' for a top-level thread)."""
    parent_turn_id: str = ""
    """The parent's turn it was spawned for ('' when none was named)."""
    role: str = ""
    """A subagent's role in its parent's work (free text)."""
    closed_at: float = 0.0
    """When close_subagent closed it (0.0: open); a closed thread takes no turns."""
    capability: str = ""
    """Or the capability queue its turns' tasks go to: any capable agent runs each."""


@dataclass(frozen=True, slots=True)
class TurnRecord:
    turn_id: str
    session_id: str
    thread_id: str
    ordinal: int
    """Its place in the thread (0, 1, ...): the queue's order."""
    state: str
    """A TurnState value."""
    input_json: str
    """The turn's input, a JSON value as text."""
    task_id: str
    """The Scheduler task it runs as (chosen when it is submitted, so that starting it again
    after a crash is the same task)."""
    created_at: float
    updated_at: float
    started_at: float = 0.0
    ended_at: float = 0.0
    error_code: str = ""
    message: str = ""
    result_json: str = ""
    """What the agent returned (JSON text; '' for none)."""
    interrupt: str = ""
    """Why an interrupt was asked for ('' when none): the turn is to stop, not to finish."""
    status_reason: str = ""
    submitted_by: str = ""
    """`owner_of` the principal that submitted it (its task's submitter)."""
    priority: int = 0
    """Its task's priority (-19 highest .. 20)."""
    queue_rank: int = 0
    """Its place in its thread's queue before its ordinal (`queue_key`): 0 as submitted,
    below 0 once promote_queued_turn (or resume_thread) moved it ahead."""
    resumed_from: str = ""
    """The turn whose lost task resume_thread ran again as this turn ('' for none)."""
    agent_id: str = ""
    """The agent that took its task ('' until one did): a capability thread's turns may run
    on different agents."""


def queue_key(turn: TurnRecord) -> tuple[int, int]:
    """A thread's queue order: its queued turns by (queue_rank, ordinal)."""
    return (turn.queue_rank, turn.ordinal)


@dataclass(frozen=True, slots=True)
class ChannelRecord:
    """An application's event channel on a session: how far it acknowledged the session's
    events, and the digest of the token that resumes it."""

    channel_id: str
    session_id: str
    owner: str
    token_digest: str
    acked_sequence: int
    created_at: float
    updated_at: float
    expires_at: float


@dataclass(frozen=True, slots=True)
class RuntimeWrite:
    """Records to insert or replace together (`RuntimeStore.save`)."""

    sessions: tuple[SessionRecord, ...] = field(default_factory=tuple)
    threads: tuple[ThreadRecord, ...] = field(default_factory=tuple)
    turns: tuple[TurnRecord, ...] = field(default_factory=tuple)
    channels: tuple[ChannelRecord, ...] = field(default_factory=tuple)
    tasks: tuple[RuntimeTaskRecord, ...] = field(default_factory=tuple)
    runs: tuple[TaskRunRecord, ...] = field(default_factory=tuple)
    links: tuple[TaskLinkRecord, ...] = field(default_factory=tuple)
    keys: tuple[CommandKeyRecord, ...] = field(default_factory=tuple)
    """Idempotency keys are inserted once: a key stored already is a StoreError."""
    actions: tuple[ActionRecord, ...] = field(default_factory=tuple)
    jobs: tuple[JobRecord, ...] = field(default_factory=tuple)
    job_items: tuple[JobItemRecord, ...] = field(default_factory=tuple)

    def __bool__(self) -> bool:
        return bool(
            self.sessions or self.threads or self.turns or self.channels or self.tasks
            or self.runs or self.links or self.keys or self.actions or self.jobs
            or self.job_items
        )  # fmt: skip
