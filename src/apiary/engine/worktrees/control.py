"""The `worktrees` endpoint: agents' WORKTREE_CONTROL requests in, status envelopes out
(RFC 16 "MUST support WORKTREE_CONTROL operations"; message-types "WORKTREE_CONTROL").

An agent sends a WORKTREE_CONTROL envelope to the reserved participant `worktrees` (by the
`sw4rm-recipient` metadata or `"to": "worktrees"` in the payload) with a JSON payload
(core/worktrees/control.py). A request that is malformed, names another agent, or that the
binding's state does not allow is rejected with its error (the sender's SendMessage answer
and a NACK): validation_error naming the field, permission_denied, already_exists,
worktree_not_bound, NOT_FOUND.

Every change of an agent's binding, whoever caused it (its own request, an RPC, a HITL
decision, a timer), reaches the agent as a WORKTREE_CONTROL envelope from `coordinator`
(a notice: no acknowledgement needed) whose JSON payload is

    {"action": "status", "event": "<what happened>", "in_reply_to": "<request id or ''>",
     "ok": <false in BIND_FAILED>, "error_code": "<the BIND_FAILED reason or ''>",
     "agent_id": ..., "state": ..., "repo_id": ..., "worktree_id": ..., "path": ...,
     "home": {...}, "target": {...}, "expires_at": "...", ...}

`event` is the machine input in lower case (bind_ok, bind_error, retry_ok, retry_error,
unbind, switch_request, switch_approve, switch_reject, switch_revoke, ttl_expired) or
`status` for a STATUS request; `in_reply_to` is the message id of the request that caused
it. WORKTREE_CONTROL rather than NOTIFICATION: the reply is the same operation family (C.7
shows the coordinator sending WORKTREE_CONTROL SWITCH_APPROVE to the agent), and an agent
needs one handler for its binding.

Agents may bind, unbind, request a switch, withdraw their pending request (switch_reject),
give up a non-home binding early (switch_revoke) and ask for their status; approving a
switch is for HITL or an operator (the ApproveSwitch RPC), never the agent itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from apiary.core.envelope import Envelope, MessageType
from apiary.core.worktrees.control import ControlAction, ControlRequest, parse_control, status_body
from apiary.core.worktrees.records import BindingState, WorktreeBinding
from apiary.engine.notices import NoticeFactory
from apiary.engine.registry import Registry
from apiary.engine.router.router import Router
from apiary.engine.worktrees.worktrees import Notify, Worktrees
from apiary.errors import PermissionDeniedError, ValidationError

_A = ControlAction


class WorktreeStatus:
    """Sends an agent its binding's status as a WORKTREE_CONTROL notice (the `Notify` of
    `Worktrees`, and the answer to a STATUS request)."""

    def __init__(self, router: Router, registry: Registry, notices: NoticeFactory) -> None:
        self._router = router
        self._registry = registry
        self._notices = notices

    async def __call__(
        self, record: WorktreeBinding, path: Path | None, event: str, reply_to: str
    ) -> None:
        """Send the agent its binding's status (a coordinator notice); an agent that is not
        registered (bound by an operator ahead of its start) asks STATUS when it comes."""
        if self._registry.known(record.agent_id) is None:
            return
        body = {
            "action": "status",
            "event": event,
            "in_reply_to": reply_to,
            "ok": record.state != BindingState.BIND_FAILED,
            "error_code": record.reason,
            **status_body(record, "" if path is None else str(path)),
        }
        await self._router.notify(record.agent_id, self._notices.worktree_control(body))


class WorktreeControl:
    """The router's `worktrees` endpoint (WORKTREES): agents' requests to `Worktrees`."""

    def __init__(self, worktrees: Worktrees, notify: Notify) -> None:
        self._worktrees = worktrees
        self._notify = notify

    async def on_envelope(self, env: Envelope) -> None:
        """Router endpoint: one agent's WORKTREE_CONTROL request (raising rejects it)."""
        request = self.check(env)
        if request is not None:
            await self._handle(request, env)

    @staticmethod
    def check(env: Envelope) -> ControlRequest | None:
        """The request `env` carries, checked: its type, its payload, the sender's own
        binding (None for an ACK, which asks nothing). Raising refuses it."""
        if env.message_type is MessageType.ACKNOWLEDGEMENT:
            return None  # nothing the endpoint sends asks for one
        if env.message_type is not MessageType.WORKTREE_CONTROL:
            raise ValidationError.for_field(
                "message_type",
                f"the worktrees endpoint takes WORKTREE_CONTROL, not {env.message_type.name}",
            )
        request = parse_control(env.payload, env.producer_id)
        if request.agent_id != env.producer_id:
            raise PermissionDeniedError(
                f"{env.producer_id} may not control the worktree binding of {request.agent_id}",
                {"field": "agent_id", "agent_id": request.agent_id},
            )
        return request

    async def _handle(self, request: ControlRequest, env: Envelope) -> None:
        wt, agent = self._worktrees, request.agent_id
        common: dict[str, Any] = {
            "actor": env.producer_id, "correlation_id": env.correlation_id,
            "reply_to": env.message_id,
        }  # fmt: skip
        if request.action is _A.BIND:
            await wt.bind(
                agent, request.repo_id, request.worktree_id, branch=request.branch,
                commit_sha=request.commit_sha, **common,
            )  # fmt: skip
        elif request.action is _A.UNBIND:
            await wt.unbind(agent, **common)
        elif request.action is _A.SWITCH_REQUEST:
            await wt.request_switch(
                agent, request.worktree_id, repo_id=request.repo_id, ttl_s=request.ttl_s,
                requires_hitl=request.requires_hitl, **common,
            )  # fmt: skip
        elif request.action is _A.SWITCH_APPROVE:
            raise PermissionDeniedError(
                "an agent cannot approve its own worktree switch: HITL or an operator does",
                {"field": "action", "agent_id": agent},
            )
        elif request.action is _A.SWITCH_REJECT:
            await wt.reject_switch(agent, request.reason or "withdrawn by the agent", **common)
        elif request.action is _A.SWITCH_REVOKE:
            await wt.revoke_switch(agent, request.reason or "given up by the agent", **common)
        else:
            record = wt.binding(agent)
            await self._notify(record, wt.path_of(record), "status", env.message_id)
