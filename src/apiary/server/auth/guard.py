"""The access guard: the one place every call is decided (DESIGN.md section 9, RFC 6.5).

Before any handler runs, the guard resolves the call's principal (authenticator.py), finds
what the request names (the rule's subjects, the owner of the object), asks the pure
decision (core/access/decision.py), records it as an `access.decided` event (every denial;
allowed calls too in secure mode), counts denials at /metrics, and either refuses the call
with the specific error or hands the handler a context that carries the principal."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace

from apiary.core.access.decision import (
    PERMISSION_DENIED,
    UNAUTHENTICATED,
    Decision,
    decide,
    unconditional,
)
from apiary.core.access.principal import DEFAULT_TENANT, Principal
from apiary.core.access.rules import Rule, Who, subject_values
from apiary.engine.eventlog import EventRecorder
from apiary.errors import ApiaryError, PermissionDeniedError, UnauthenticatedError
from apiary.server.auth.authenticator import Authenticator
from apiary.server.context import AGENT_KEY, CallContext

OwnerOf = Callable[[str, str], Awaitable[str | None]]
"""The owner of an object by (tenant, id) (the agent that made a tool call, the principal
that submitted a task), None when there is none."""
MAX_OBJECT_TEXT = 256


class AccessGuard:
    def __init__(
        self,
        authenticator: Authenticator,
        events: Callable[[str], EventRecorder],
        *,
        secure: bool,
        denied: Callable[[str, str], None] = lambda _action, _refusal: None,
        owners: Mapping[str, OwnerOf] | None = None,
        log_allowed: bool | None = None,
    ) -> None:
        self._authenticator = authenticator
        self._events = events
        self.secure = secure
        self._denied = denied
        self._owners = dict(owners or {})
        self._log_allowed = secure if log_allowed is None else log_allowed

    def admit(
        self,
        action: str,
        rule: Rule,
        request: object | None,
        ctx: CallContext,
        *,
        again: bool = False,
    ) -> CallContext:
        """`ctx` with the call's principal once `rule` lets it make the call `action`, decided
        on the principal alone (as when a stream opens); else the refusal, recorded.
        `again`: the call was admitted before and is decided anew (a long-lived stream):
        only a refusal is recorded, so that deciding again makes no events for the stream to
        carry."""
        ctx, tenant = self.authenticate(action, ctx)
        self._decide(action, rule, [], None, ctx, tenant, again=again)
        return ctx

    def authenticate(self, action: str, ctx: CallContext) -> tuple[CallContext, str]:
        """`ctx` with the call's principal, and the tenant it acts in; a credential that
        does not hold, or a tenant the principal may not name, is refused and recorded (in
        the principal's own tenant's log)."""
        try:
            principal = self._authenticator.principal(ctx, action)
        except UnauthenticatedError as exc:
            self._record(action, ctx, None, "", Decision(False, exc.message, UNAUTHENTICATED))
            raise
        ctx = replace(ctx, principal=principal, allows=self.allows)
        try:
            tenant = ctx.tenant()
        except PermissionDeniedError as exc:
            refused = Decision(False, exc.message, PERMISSION_DENIED)
            self._record(action, ctx, principal, "", refused, principal.tenant)
            raise
        return ctx, tenant

    async def check(
        self,
        action: str,
        rule: Rule,
        request: object | None,
        ctx: CallContext,
        tenant: str = DEFAULT_TENANT,
    ) -> None:
        """Decide one request of a call whose principal is known (each frame of a stream)."""
        operators = self._authenticator.operators_configured
        if unconditional(ctx.principal, rule, secure=self.secure, operators=operators):
            return
        subjects = _subjects(rule, request)
        owner = None
        if rule.who is Who.OWNER and subjects:
            owner = await self._owners[rule.owner](tenant, subjects[0])
        self._decide(action, rule, subjects, owner, ctx, tenant)

    def _decide(
        self,
        action: str,
        rule: Rule,
        subjects: list[str],
        owner: str | None,
        ctx: CallContext,
        tenant: str,
        *,
        again: bool = False,
    ) -> None:
        """Decide a call once what its request names (subjects, the owner) is known."""
        principal = ctx.principal
        operators = self._authenticator.operators_configured
        if unconditional(principal, rule, secure=self.secure, operators=operators):
            return
        decision = decide(
            principal, rule, subjects, owner=owner, secure=self.secure,
            claimed=ctx.get(AGENT_KEY), operators=operators,
        )  # fmt: skip
        if not decision.allowed or (self._log_allowed and not again):
            self._record(action, ctx, principal, ", ".join(subjects), decision, tenant)
        if not decision.allowed:
            raise _refusal(action, principal, decision)

    def allows(
        self, action: str, rule: Rule, subject: str, owner: str | None, ctx: CallContext
    ) -> bool:
        """Whether `rule` lets the call act on `subject` (owned by `owner`): decided and
        recorded as a call's decision is, but a refusal is returned, not raised (a stream
        that follows several objects refuses one and goes on)."""
        try:
            self._decide(action, rule, [subject], owner, ctx, ctx.tenant())
        except (PermissionDeniedError, UnauthenticatedError):
            return False
        return True

    async def frames(
        self, action: str, rule: Rule, frames: AsyncIterator[object], ctx: CallContext
    ) -> AsyncIterator[object]:
        """A client stream's frames, each decided before the handler sees it."""
        checking = rule.subjects and not unconditional(
            ctx.principal, rule, secure=self.secure,
            operators=self._authenticator.operators_configured,
        )  # fmt: skip
        tenant = ctx.tenant()
        async for frame in frames:
            if checking:
                await self.check(action, rule, frame, ctx, tenant)
            yield frame

    def _record(
        self,
        action: str,
        ctx: CallContext,
        principal: Principal | None,
        subject: str,
        decision: Decision,
        tenant: str = DEFAULT_TENANT,
    ) -> None:
        if not decision.allowed:
            self._denied(action, decision.refusal)
        self._events(tenant).note(
            "access.decided",
            principal.label if principal is not None else f"unauthenticated:{ctx.peer}",
            allowed=decision.allowed, action=action, object=subject[:MAX_OBJECT_TEXT],
            reason=decision.reason, refusal=decision.refusal, transport=ctx.transport,
            peer=ctx.peer, mechanism=principal.mechanism.value if principal else "",
            tenant=tenant,
        )  # fmt: skip


def _subjects(rule: Rule, request: object | None) -> list[str]:
    if request is None:
        return []
    return [value for path in rule.subjects for value in subject_values(request, path)]


def _refusal(action: str, principal: Principal, decision: Decision) -> ApiaryError:
    details = {"principal": principal.label, "action": action}
    if decision.refusal == UNAUTHENTICATED:
        return UnauthenticatedError(decision.reason, details)
    return PermissionDeniedError(
        f"{principal.label} may not call {action}: {decision.reason}", details
    )
