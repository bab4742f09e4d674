"""The one access decision (RFC 6.5, DESIGN.md section 9): a principal, a rule and what the
request names in, allow or deny with the reason out. Pure: the edge resolves the principal,
the subjects and the owner; it records every decision and raises the refusal."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from apiary.core.access.principal import Principal, PrincipalKind
from apiary.core.access.rules import Rule, Who

UNAUTHENTICATED = "unauthenticated"
PERMISSION_DENIED = "permission_denied"


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str
    refusal: str = ""
    """With a denial: UNAUTHENTICATED (no usable credential) or PERMISSION_DENIED."""


def unconditional(
    principal: Principal, rule: Rule, *, secure: bool, operators: bool = False
) -> bool:
    """Whether `rule` lets `principal` call whatever the request says, with nothing to look
    up or record: a public rule, or an anonymous caller in dev mode under a rule that trusts
    it (not an OWNER one, whose owner is looked up against the agent the caller claims to
    be, nor one that asks for an operator)."""
    if rule.who is Who.PUBLIC:
        return True
    return (
        principal.kind is PrincipalKind.ANONYMOUS
        and not secure
        and rule.who is not Who.OWNER
        and not rule.dev_needs_operator(operators)
    )


def decide(
    principal: Principal,
    rule: Rule,
    subjects: Sequence[str] = (),
    *,
    owner: str | None = None,
    secure: bool,
    claimed: str = "",
    operators: bool = False,
) -> Decision:
    """Whether `principal` may make a call under `rule`.

    `subjects` are the agent ids the request names (rule.subjects); `owner` the owner of the
    object an OWNER rule protects (None when there is no such object: the handler then
    answers as for any missing object). In dev mode (`secure` false) an anonymous caller may
    do what any principal may, except cancel what the agent it `claimed` to be does not own;
    an authenticated agent that claims to be another (`sw4rm-agent-id`) is refused, and a
    rule may ask for an operator (`Rule.dev`; `operators`: the configuration has some). An
    authenticated principal is never worse off in dev mode than an anonymous caller, but is
    held to who it is: an agent still acts only as itself.
    """
    if rule.who is Who.PUBLIC:
        return Decision(True, "public")
    if principal.kind is PrincipalKind.AGENT and claimed and claimed != principal.name:
        return Decision(
            False,
            f"the call claims to be agent {claimed[:64]!r} but authenticates as {principal.label}",
            PERMISSION_DENIED,
        )
    if principal.kind is PrincipalKind.ANONYMOUS:
        return _anonymous(rule, owner, secure=secure, claimed=claimed, operators=operators)
    if not secure and _dev_trusts(principal, rule, operators):
        return Decision(True, f"dev mode: a {principal.kind.value} may")
    if rule.who is Who.PRINCIPAL:
        return Decision(True, f"any principal may ({principal.kind.value})")
    if principal.kind is PrincipalKind.OPERATOR:
        return _operator(principal, rule, owner)
    return _actor(principal, rule, subjects, owner)


def _dev_trusts(principal: Principal, rule: Rule, operators: bool) -> bool:
    """Dev mode: an operator may do anything; an agent or application what an anonymous
    caller may, where the rule does not turn on who it is (SELF, OWNER)."""
    if principal.kind is PrincipalKind.OPERATOR:
        return True
    return rule.who in (Who.ROLE, Who.OPERATOR) and not rule.dev_needs_operator(operators)


def _anonymous(
    rule: Rule, owner: str | None, *, secure: bool, claimed: str, operators: bool
) -> Decision:
    if secure:
        return Decision(
            False,
            "this coordinator runs in secure mode: the call needs a credential (a client "
            "certificate, an API key or an operator token as `authorization: Bearer ...`)",
            UNAUTHENTICATED,
        )
    if rule.dev_needs_operator(operators):
        return Decision(
            False,
            "this call needs an operator, in dev mode too: `authorization: Bearer <operator "
            "token or API key>` or an operator's client certificate",
            UNAUTHENTICATED,
        )
    if rule.who is Who.OWNER and claimed and owner is not None and owner != claimed:
        return Decision(False, f"{claimed} does not own it ({owner} does)", PERMISSION_DENIED)
    return Decision(True, "dev mode: anonymous callers are trusted on loopback")


def _operator(principal: Principal, rule: Rule, owner: str | None) -> Decision:
    if rule.who is Who.OPERATOR or rule.operators:
        return Decision(True, "an operator may")
    if rule.who is Who.OWNER and owner is not None and owner == principal.name:
        return Decision(True, "its owner")  # a task the operator submitted itself
    if rule.role is not None and principal.has_role(rule.role):
        return Decision(True, f"holds the role {rule.role.value}")
    if rule.role is None:
        return Decision(
            False, f"{principal.label} is an operator; only the agent itself may", PERMISSION_DENIED
        )
    held = ", ".join(sorted(principal.roles)) or "none"
    return Decision(
        False,
        f"{principal.label} needs the operator role {rule.role.value!r} (holds: {held})",
        PERMISSION_DENIED,
    )


def _actor(
    principal: Principal, rule: Rule, subjects: Sequence[str], owner: str | None
) -> Decision:
    """An agent or an application: it acts as itself only."""
    if rule.who in (Who.OPERATOR, Who.ROLE):
        needed = f"the role {rule.role.value!r}" if rule.role is not None else "any role"
        return Decision(
            False, f"{principal.label} is not an operator ({needed} needed)", PERMISSION_DENIED
        )
    if rule.who is Who.OWNER:
        if owner is None or owner == principal.name:
            return Decision(True, "its owner" if owner else "no such object")
        return Decision(False, f"{principal.label} does not own it", PERMISSION_DENIED)
    agent_only = not rule.applications and principal.kind is not PrincipalKind.AGENT
    if agent_only:
        return Decision(
            False,
            f"{principal.label} is not an agent: only the agent itself may",
            PERMISSION_DENIED,
        )
    others = sorted({s for s in subjects if s != principal.name})
    if others:
        return Decision(
            False,
            f"{principal.label} may act only as itself, not as {', '.join(others)}",
            PERMISSION_DENIED,
        )
    return Decision(True, "acts as itself")


def sees_every_row(principal: Principal, rule: Rule, *, secure: bool) -> bool:
    """Whether a listing under `rule` (table.LISTING_RULES) shows `principal` every row
    rather than its own: the rule's decision, so dev mode trusts as it does for calls."""
    return decide(principal, rule, secure=secure).allowed
