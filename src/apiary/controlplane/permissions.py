"""evaluate_permission and resolve_permission (core/runtime/permissions.py): whether a
thread's agent may call a tool, send a message or make a call, asked of Apiary's own
decisions, and the approval of what needs one.

evaluate_permission gathers the checks (the tool service's checks of a call and its policy's
approval, the message ACLs, the one access decision under the method's rule) for the
thread's agent, writes `permission.evaluated` and stores the permission (a runtime action of
kind `permission`). An `ask` opens a HITL invocation (`permission.requested`, its id the
permission id) that the thread shows in `pendingRequests` until it is resolved:
resolve_permission decides it through `Hitl.decide` as its session's owner, the HITL inbox
may too, and at its deadline the HITL timeout action decides; the actions follower
(controlplane/actions.py) writes `permission.resolved` whichever way it ends. Pending is
never allowed, and with no HITL engine to ask an `ask` is denied.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

from apiary.controlplane.actions import Actions
from apiary.controlplane.binding import agent_of
from apiary.controlplane.command_keys import CommandKeys
from apiary.controlplane.facts import FactWriter
from apiary.controlplane.permission_requests import EvaluatePermission, ResolvePermission
from apiary.controlplane.reads import Reads
from apiary.core.access.decision import decide
from apiary.core.access.principal import Principal, PrincipalKind
from apiary.core.access.rules import Who
from apiary.core.acl import AclPolicy
from apiary.core.clock import Clock
from apiary.core.dedup import iso_utc
from apiary.core.envelope import MessageType
from apiary.core.hitl.vocabulary import HitlReason, HitlState
from apiary.core.ids import IdGenerator
from apiary.core.records import HitlRecord
from apiary.core.runtime.actions import (
    ActionKind,
    ActionRecord,
    ActionState,
    required_payload,
)
from apiary.core.runtime.events import RuntimeEventType
from apiary.core.runtime.log import Fact
from apiary.core.runtime.permissions import (
    PERMISSION_DECISIONS,
    Check,
    Evaluation,
    PermissionType,
    Verdict,
    access_check,
    approval_check,
    evaluate,
    prompt_of,
    resolution,
    rule_for,
)
from apiary.core.runtime.records import RuntimeWrite, ThreadRecord, may_use
from apiary.core.tools.policy import approval
from apiary.core.tools.requests import RequestedPolicy
from apiary.core.tools.schema import JSON
from apiary.engine.hitl import Hitl
from apiary.engine.operators import Operator
from apiary.engine.scheduler.scheduler import Scheduler
from apiary.engine.tools.agent_tools import policy_json
from apiary.engine.tools.service import CallRequest, ToolService
from apiary.errors import (
    AlreadyCompletedError,
    NotFoundError,
    PermissionDeniedError,
    UnavailableError,
    ValidationError,
    WorktreeNotBoundError,
)

_T = RuntimeEventType


class Permissions:
    """The permissions of one control plane (module docstring)."""

    def __init__(
        self, facts: FactWriter, reads: Reads, actions: Actions, hitl: Hitl | None,
        tools: ToolService | None, acl: AclPolicy, scheduler: Scheduler, clock: Clock,
        ids: IdGenerator, lock: asyncio.Lock, *, secure: bool,
    ) -> None:  # fmt: skip
        self._facts = facts
        self._store = facts.store
        self._reads = reads
        self._actions = actions
        self._hitl = hitl
        self._tools = tools
        self._acl = acl
        self._scheduler = scheduler
        self._clock = clock
        self._ids = ids
        self._lock = lock
        self._secure = secure
        self._keys = CommandKeys(facts.store, clock)

    # ------------------------------------------------------------------ evaluate

    async def evaluate(self, caller: Principal, req: EvaluatePermission) -> dict[str, Any]:
        """Evaluate what `req` asks for the thread's agent; open the approval it needs."""
        async with self._lock:
            replayed, key = await self._keys.known(caller, "evaluate_permission", req)
            session, thread = await self._reads.thread(caller, req.thread_id, req.session_id)
            if replayed is not None:
                return await self._answer(str(replayed.get("permissionId")), replayed=True)
            if req.turn_id:
                await self._reads.turn(caller, req.turn_id, thread.thread_id)
            request, checks = await self._checks(caller, req, thread)
            evaluation = evaluate(checks)
            if evaluation.verdict is Verdict.ASK and self._hitl is None:
                none = Check("approval", Verdict.DENY, "no HITL engine to ask: never allowed")
                evaluation = evaluate([*checks, none])
            now = self._clock.now()
            action = ActionRecord(
                self._ids.new_id(), session.session_id, ActionState.RESOLVED.value, now, now,
                thread_id=thread.thread_id, turn_id=req.turn_id,
                decision=_decision(evaluation.verdict), via="policy",
                kind=ActionKind.PERMISSION.value,
                detail_json=_detail(request, evaluation),
            )  # fmt: skip
            evaluated = {**request, "reason": evaluation.reason}
            facts = [
                self._fact(
                    _T.PERMISSION_EVALUATED, action, evaluated, evaluation, evaluation.status
                )
            ]
            if evaluation.verdict is Verdict.ASK:
                action, asked = await self._ask(req, thread, action, request, evaluation)
                facts += asked
            keys = self._keys.keep(key, {"permissionId": action.action_id})
            await self._facts.commit(RuntimeWrite(actions=(action,), keys=keys), facts,
                                     caller.label)  # fmt: skip
            return await self._answer(action.action_id)

    async def _ask(
        self, req: EvaluatePermission, thread: ThreadRecord, action: ActionRecord,
        request: dict[str, Any], evaluation: Evaluation,
    ) -> tuple[ActionRecord, list[Fact]]:  # fmt: skip
        """Open the HITL invocation that decides the permission: the permission is it."""
        assert self._hitl is not None
        tool = req.kind is PermissionType.TOOL
        settings = self._tools.settings if tool and self._tools is not None else None
        prompt = req.prompt or prompt_of(req.kind, request, thread.agent_id)
        context = {
            "prompt": prompt, "permission": request, "reason": evaluation.reason,
            "scope": req.scope, "thread_id": thread.thread_id, "session_id": thread.session_id,
        }  # fmt: skip
        record = await self._hitl.open(
            (HitlReason.TOOL_PRIVILEGE_ESCALATION if tool else HitlReason.SECURITY_APPROVAL).value,
            context, requested_by=thread.agent_id,
            subject={"thread_id": thread.thread_id, "agent_id": thread.agent_id,
                     "permission": req.kind.value},
            proposed_actions=PERMISSION_DECISIONS,
            approver_roles=settings.hitl_approver_roles if settings is not None else (),
            timeout_s=float(req.timeout_s or (settings.hitl_timeout_s if settings else 0.0)),
        )  # fmt: skip
        asked = replace(
            action, action_id=record.invocation_id, state=ActionState.PENDING.value,
            decision="", via="",
        )  # fmt: skip
        scope = {"sessionId": thread.session_id, "threadId": thread.thread_id,
                 "turnId": req.turn_id}  # fmt: skip
        payload = {**required_payload(record, scope), "permission": request}
        if req.scope:
            payload["scope"] = {**payload["scope"], **req.scope}
        facts = [self._fact(_T.PERMISSION_REQUESTED, asked, payload, evaluation)]
        if record.state != HitlState.PENDING.value:  # no HITL component: decided at once
            decided = resolution(record)
            asked = replace(
                asked, state=ActionState.RESOLVED.value,
                decision=str(decided["decision"] or ""), via=str(decided["via"]),
            )  # fmt: skip
            facts.append(self._fact(_T.PERMISSION_RESOLVED, asked, decided, evaluation))
        return asked, facts

    def _fact(
        self, kind: str, action: ActionRecord, payload: dict[str, Any], evaluation: Evaluation,
        status: str = "",
    ) -> Fact:  # fmt: skip
        status = status or _status(action)
        return Fact(
            kind, action.session_id, action.thread_id, action.turn_id, status=status,
            payload=payload,
            extra={"actionId": action.action_id, "requestId": action.action_id,
                   "permissionDecision": {**evaluation.to_json(), "status": status}},
        )  # fmt: skip

    # ------------------------------------------------------------------ checks

    async def _checks(
        self, caller: Principal, req: EvaluatePermission, thread: ThreadRecord
    ) -> tuple[dict[str, Any], list[Check]]:
        """What is asked (as the events show it) and the checks' answers."""
        agent = agent_of(thread)
        request: dict[str, Any] = {"actionType": req.kind.value, "agentId": agent}
        if req.scope:
            request["scope"] = req.scope
        if req.kind is PermissionType.TOOL:
            return request, self._tool_checks(req, agent, request)
        if req.kind is PermissionType.MESSAGE:
            request.update(messageType=req.message_type, recipient=req.recipient)
            return request, [self._message_check(agent, req)]
        request["method"] = req.method
        rule = rule_for(req.method)
        if rule is None:
            raise ValidationError.for_field(
                "method", "names no gRPC method (/package.Service/Method) or runtime command"
            )
        owner = None
        if rule.who is Who.OWNER:
            if not req.object_id:
                raise ValidationError.for_field(
                    "object_id", f"is required: {req.method} is decided by the {rule.owner}'s owner"
                )
            owner = await self._owner(rule.owner, req.object_id)
            request["objectId"] = req.object_id
        subjects = list(req.subjects) or [agent]
        request["subjects"] = subjects
        operators = self._hitl is not None and self._hitl.operators.configured
        principal = Principal(PrincipalKind.AGENT, agent, caller.tenant)
        decision = decide(
            principal, rule, subjects, owner=owner, secure=self._secure, operators=operators
        )
        return request, [access_check(decision)]

    async def _owner(self, kind: str, object_id: str) -> str | None:
        if kind == "task":
            return await self._scheduler.owner(object_id)
        if kind == "tool_call" and self._tools is not None:
            return self._tools.owner_of(object_id)
        return None

    def _message_check(self, agent: str, req: EvaluatePermission) -> Check:
        if not self._acl.messages:
            return Check("message_acl", Verdict.ALLOW, "no message ACLs: messaging is open")
        try:
            self._acl.check_message(agent, MessageType[req.message_type], req.recipient)
        except PermissionDeniedError as exc:
            return Check("message_acl", Verdict.DENY, exc.message)
        return Check("message_acl", Verdict.ALLOW, "a grant of the message ACLs allows it")

    def _tool_checks(
        self, req: EvaluatePermission, agent: str, request: dict[str, Any]
    ) -> list[Check]:
        """The tool service's checks of the call (ToolService.prepare) and its approval."""
        tools = self._tools
        if tools is None:
            raise UnavailableError("this control plane has no tool service to ask")
        request.update(toolName=req.tool_name, providerId=req.provider_id or None)
        call = CallRequest(
            req.tool_name, req.provider_id, args=req.arguments_json.encode(), content_type=JSON,
            policy=RequestedPolicy(network_policy=req.network_policy,
                                   privilege_level=req.privilege_level),
            caller=agent,
        )  # fmt: skip
        try:
            prepared = tools.prepare(call)
        except NotFoundError as exc:
            field = "tool_name" if "tool_name" in exc.details else "provider_id"
            raise NotFoundError(exc.message, {**exc.details, "field": field}) from None
        except ValidationError as exc:
            if exc.details.get("field") != "args":
                raise
            raise ValidationError(
                exc.message.replace("args", "arguments", 1), {**exc.details, "field": "arguments"}
            ) from None
        except PermissionDeniedError as exc:  # the tool ACL
            return [Check("tool_acl", Verdict.DENY, exc.message)]
        except WorktreeNotBoundError as exc:
            return [_acl_allows(tools.settings.acl), Check("worktree", Verdict.DENY, exc.message)]
        provider, name = prepared.provider_id, prepared.tool.tool_name
        request.update(providerId=provider, policy=policy_json(prepared.policy))
        preapproved = tools.settings.preapproves(prepared.policy, provider, name)
        asks = approval(prepared.policy, preapproved=preapproved)
        return [_acl_allows(tools.settings.acl), approval_check(asks, preapproved)]

    # ------------------------------------------------------------------ resolve

    async def resolve(self, caller: Principal, req: ResolvePermission) -> dict[str, Any]:
        """Decide a pending permission as `caller` (its session's owner, or an operator with
        `tasks`) through the HITL engine (approver roles, deadline); resolved with its event
        before the answer."""
        hitl = self._hitl
        if hitl is None:
            raise UnavailableError("this control plane has no HITL engine to decide on")
        async with self._lock:
            replayed, key = await self._keys.known(caller, "resolve_permission", req)
            await self._actions.sync()
            action = await self._permission(caller, req.permission_id)
            if replayed is not None:
                return await self._answer(action.action_id, replayed=True)
            if action.state == ActionState.RESOLVED:
                raise AlreadyCompletedError(
                    f"permission {action.action_id} was resolved already "
                    f"({action.decision or 'no decision'} via {action.via})",
                    {"field": "permission_id", "permission_id": action.action_id,
                     "via": action.via},
                )  # fmt: skip
            roles = caller.roles if caller.kind is PrincipalKind.OPERATOR else frozenset()
            rationale = req.rationale or f"decided by {caller.label} (resolve_permission)"
            decided = await hitl.decide(
                action.action_id, req.decision, Operator(caller.label, frozenset(roles)),
                rationale,
            )  # fmt: skip
            await self._actions.resolved(action, decided)
            keys = self._keys.keep(key, {"permissionId": action.action_id})
            if keys:
                await self._facts.commit(RuntimeWrite(keys=keys), [], caller.label)
            return await self._answer(action.action_id)

    async def _permission(self, caller: Principal, permission_id: str) -> ActionRecord:
        action = await self._store.action(permission_id)
        session = await self._store.session(action.session_id) if action else None
        if (
            action is None or session is None or action.kind != ActionKind.PERMISSION
            or not may_use(caller, session.owner)
        ):  # fmt: skip
            raise NotFoundError(
                f"no permission {permission_id!r}",
                {"field": "permission_id", "permission_id": permission_id},
            )
        return action

    # ------------------------------------------------------------------ answers

    async def _answer(self, permission_id: str, **more: Any) -> dict[str, Any]:
        action = await self._store.action(permission_id)
        if action is None:  # a key kept with a write that named it: never without
            raise NotFoundError(f"no permission {permission_id!r}", {"field": "permission_id"})
        detail = json.loads(action.detail_json)
        evaluation: dict[str, Any] = detail.get("evaluation", {})
        found: dict[str, Any] = {
            "permissionId": action.action_id, "sessionId": action.session_id,
            "threadId": action.thread_id, "decision": evaluation.get("decision"),
            "status": _status(action), "reason": evaluation.get("reason"),
            "permissionDecision": {**evaluation, "status": _status(action)},
            "request": detail.get("request", {}), **more,
        }  # fmt: skip
        if action.turn_id:
            found["turnId"] = action.turn_id
        if evaluation.get("decision") == Verdict.ASK:
            found["actionId"] = action.action_id
            record = await self._record(action.action_id)
            if record is not None:
                found["deadline"] = iso_utc(record.deadline)
                if action.state == ActionState.RESOLVED:
                    found["resolution"] = resolution(record)
        return found

    async def _record(self, invocation_id: str) -> HitlRecord | None:
        if self._hitl is None:
            return None
        try:
            return await self._hitl.get(invocation_id)
        except NotFoundError:
            return None


def _acl_allows(acl: object) -> Check:
    why = "the tool ACL allows it" if acl else "no tool ACL: every agent may call every tool"
    return Check("tool_acl", Verdict.ALLOW, why)


def _decision(verdict: Verdict) -> str:
    return "approve" if verdict is Verdict.ALLOW else "deny"


def _status(action: ActionRecord) -> str:
    """A permission's status: pending until resolved, then allowed only by an approval."""
    if action.state == ActionState.PENDING:
        return Verdict.ASK.status
    return "allowed" if action.decision == "approve" else "denied"


def _detail(request: dict[str, Any], evaluation: Evaluation) -> str:
    return json.dumps({"request": request, "evaluation": evaluation.to_json()},
                      separators=(",", ":"), ensure_ascii=False)  # fmt: skip
