"""The demo's HITL operator: watches the coordinator's invocations through
apiary.v1.HitlOperatorService and decides them, through the same API a person's CLI or
console uses. It authenticates by its operator certificate (mTLS: the certificate's
apiary://default/operator/<name>?roles=... SAN names it and its roles, demo/principals.py);
the event log's `hitl.decided` names who decided.

The decision itself comes from a `Decide` function: the terminal prompt of `apiary demo`,
or `auto_approve` (with `--yes` or without a terminal), which approves the merge the demo
exists for and denies anything else.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from apiary.sdk.client import Client
from apiary.sdk.credentials import ClientCredentials
from apiary.wire import pb

a = pb.apiary_pb2


@dataclass(frozen=True, slots=True)
class Invocation:
    """A pending HITL invocation, as the operator sees it."""

    invocation_id: str
    reason_type: str
    requested_by: str
    subject: dict[str, Any]
    context: dict[str, Any]

    @property
    def is_merge(self) -> bool:
        return (
            self.reason_type == "TOOL_PRIVILEGE_ESCALATION"
            and self.subject.get("tool_name") == "git_merge"
        )


@dataclass(frozen=True, slots=True)
class Verdict:
    action: str
    """approve or deny."""
    reason: str


Decide = Callable[[Invocation], Awaitable[Verdict]]


async def auto_approve(invocation: Invocation) -> Verdict:
    """The demo operator: approves the merge of the reviewed change, denies anything else."""
    if invocation.is_merge:
        return Verdict(
            "approve",
            "demo operator (--yes or no terminal): the change passed the review room, "
            "where the critics ran ruff and pytest on it",
        )
    return Verdict(
        "deny", f"the demo operator only approves the merge, not {invocation.reason_type}"
    )


class Operator:
    """Decides invocations as the operator whose credentials it presents."""

    def __init__(self, address: str, credentials: ClientCredentials, decide: Decide) -> None:
        self._client = Client(address, credentials=credentials)
        self._decide = decide
        self.decided: list[tuple[Invocation, Verdict]] = []

    async def run(self) -> None:
        """Decide every pending invocation as it comes, until cancelled."""
        operators = self._client.hitl_operator
        seen: set[str] = set()
        try:
            async for view in operators.Watch(a.WatchInvocationsRequest(include_pending=True)):
                if view.state != "PENDING" or view.invocation_id in seen:
                    continue
                seen.add(view.invocation_id)
                invocation = Invocation(
                    view.invocation_id,
                    view.reason_type,
                    view.requested_by,
                    json.loads(view.subject_json or "{}"),
                    json.loads(view.context_json or "{}"),
                )
                verdict = await self._decide(invocation)
                await operators.Decide(
                    a.DecideInvocationRequest(
                        invocation_id=view.invocation_id,
                        action=verdict.action,
                        rationale=verdict.reason,
                    )
                )
                self.decided.append((invocation, verdict))
        finally:
            await self._client.close()
