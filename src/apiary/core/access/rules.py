"""What a rule says about who may make a call, and how a rule finds, in a request, the agents
the call acts for (the `subjects`)."""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass


class Who(enum.StrEnum):
    """Who a rule lets call."""

    PUBLIC = "public"
    """Anyone, anonymous included, in every mode (health, the console's static files)."""
    PRINCIPAL = "principal"
    """Any authenticated principal (in dev mode, anyone)."""
    SELF = "self"
    """The agent or application every subject names, or an operator holding `role` when the
    rule names one."""
    OWNER = "owner"
    """The principal that owns the object `subjects` name (a tool call's caller), or an
    operator holding `role`."""
    OPERATOR = "operator"
    """Any authenticated operator (what it may decide is judged by the object: a HITL
    invocation's approver roles)."""
    ROLE = "role"
    """An operator holding `role` (`admin` holds every role)."""


class Role(enum.StrEnum):
    """The operator roles the rules name (docs/security.md)."""

    ADMIN = "admin"
    AGENTS = "agents"
    """Act on other agents: register new agent ids, deregister, suspend, resume, shut down,
    set buffers, bind worktrees, purge activity."""
    EVENTS = "events"
    """Read the event log, its live stream and the console's data."""
    DLQ = "dlq"
    TASKS = "tasks"
    """Cancel and preempt tasks; wait for, watch and cancel other principals' tasks."""
    TOOLS = "tools"
    """Start and remove tool providers; cancel other principals' tool calls."""
    POLICY = "policy"
    """Change negotiation policies and profiles; act on negotiations as HITL."""
    WORKTREES = "worktrees"
    """Approve worktree switches."""
    METRICS = "metrics"
    TENANTS = "tenants"
    """A global operator (in the default tenant): acts in any tenant it names with the
    `apiary-tenant` metadata."""


class DevMode(enum.StrEnum):
    """What a rule asks of callers in dev mode, where anonymous callers are trusted."""

    TRUSTED = "trusted"
    """Anyone may (anonymous included)."""
    OPERATOR = "operator"
    """An operator even in dev mode: the call acts as a person (a HITL decision, starting a
    tool provider)."""
    OPERATOR_IF_CONFIGURED = "operator_if_configured"
    """An operator once the configuration has operators (changing policies, cancelling
    tasks, approving worktree switches), else anyone."""


@dataclass(frozen=True, slots=True)
class Rule:
    who: Who
    role: Role | None = None
    subjects: tuple[str, ...] = ()
    """Dotted field paths of the request naming the agent the call acts for; `[]` after a
    repeated field takes every element (`items[].envelope.producer_id`)."""
    owner: str = ""
    """With Who.OWNER: the kind of object whose owner may call (`tool_call`)."""
    applications: bool = False
    """With Who.SELF: an application may act as itself too (a producer of messages); else
    only an agent may (an inbox, a registration, a heartbeat are an agent's)."""
    operators: bool = False
    """With Who.SELF: any operator may make the call, under any name (an operator's HITL
    decision sent as a message names the console it came from)."""
    dev: DevMode = DevMode.TRUSTED
    """What the rule asks of callers in dev mode (in secure mode, `who` decides alone)."""

    def dev_needs_operator(self, operators: bool) -> bool:
        """Whether dev mode asks for an operator, `operators` telling whether the
        configuration has any."""
        return self.dev is DevMode.OPERATOR or (
            self.dev is DevMode.OPERATOR_IF_CONFIGURED and operators
        )

    def __post_init__(self) -> None:
        if self.who is Who.ROLE and self.role is None:
            raise ValueError("a ROLE rule names its role")
        if self.who is Who.OWNER and not (self.owner and self.subjects):
            raise ValueError("an OWNER rule names the object kind and the field of its id")


def subject_values(request: object, path: str) -> Iterator[str]:
    """The non-empty strings at `path` in `request` (protobuf messages or plain objects)."""
    yield from _walk(request, path.split("."))


def _walk(value: object, parts: list[str]) -> Iterator[str]:
    if not parts:
        if isinstance(value, str) and value:
            yield value
        return
    head, rest = parts[0], parts[1:]
    if head.endswith("[]"):
        for item in getattr(value, head[:-2], ()):
            yield from _walk(item, rest)
        return
    yield from _walk(getattr(value, head, None), rest)
