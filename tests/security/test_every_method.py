"""Every registered gRPC method and HTTP route has an authorization rule, and in secure mode
every method refuses the caller its rule does not let in: anonymous callers, agents acting as
another agent, principals that are not operators, operators without the role. A refused call
changes nothing in any store."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from apiary.core.access.rules import Who
from apiary.core.access.table import HTTP_RULES, METHOD_RULES
from apiary.server import dispatch
from apiary.server.dispatch import Dispatcher
from apiary.server.http.access import route_key
from apiary.server.http.app import build_http_app
from apiary.server.metrics import Metrics
from apiary.swarm.transport import add_swarm_routes
from apiary.wire.services import SERVICES, RpcMethod
from tests.security.access_harness import Secure, open_secure, set_path

METHODS = [method for methods in SERVICES.values() for method in methods]
REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)

pytestmark = pytest.mark.conformance(
    "security.multitenant.authorization", "security.multitenant.strong-authentication"
)


def test_every_method_has_exactly_one_rule() -> None:
    served = {method.path for method in METHODS}
    assert served - set(METHOD_RULES) == set(), "methods without an authorization rule"
    assert set(METHOD_RULES) - served == set(), "rules for methods nobody serves"


def test_a_method_without_a_rule_stops_the_dispatcher_being_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    forgotten = "/apiary.v1.DlqService/Requeue"
    monkeypatch.setattr(
        dispatch, "METHOD_RULES", {k: v for k, v in METHOD_RULES.items() if k != forgotten}
    )
    with pytest.raises(ValueError, match="without an authorization rule") as caught:
        Dispatcher({})
    assert forgotten in str(caught.value)


class _NoSwarm:
    """Enough of a swarm node for its routes to be mounted (they are never called here)."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the swarm node is not used here ({name})")


def test_every_http_route_has_a_rule() -> None:
    app = build_http_app(Dispatcher({}), Metrics(), lambda: True)
    add_swarm_routes(app, _NoSwarm())  # type: ignore[arg-type]
    keys = set()
    for resource in app.router.resources():
        for route in resource:
            if route.method == "HEAD":
                continue
            keys.add(f"{route.method} {resource.canonical}")
    assert keys - set(HTTP_RULES) == set(), "routes without an authorization rule"
    assert set(HTTP_RULES) - keys == set(), "rules for routes nobody serves"
    assert route_key  # the middleware keys routes the same way (GET for HEAD)


def _request(method: RpcMethod, subject: str = "bob") -> object:
    request = method.request_type()
    for path in METHOD_RULES[method.path].subjects:
        set_path(request, path, subject)
    return request


async def _status(secure: Secure, method: RpcMethod, who: str | None) -> grpc.StatusCode:
    try:
        await secure.call(method, _request(method), who)  # type: ignore[arg-type]
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def _footprint(secure: Secure) -> tuple[object, ...]:
    """What a call could have changed: agents, tasks, dead letters, worktree bindings, HITL
    invocations, and every event but the access decisions themselves."""
    c = secure.coordinator
    await c.events.flush()
    events = [
        (e.event_type, e.actor) for e in await c.events.read(after=0, limit=10_000)
        if e.event_type != "access.decided"
    ]  # fmt: skip
    store = c.store
    return (
        [(a.agent_id, a.state, a.descriptor) for a in await store.agents.list()],
        [e.entry_id for e in await store.dlq.list(limit=10_000)],
        [r.invocation_id for r in await store.hitl.list(limit=10_000)],
        events,
    )


async def test_in_secure_mode_anonymous_callers_reach_no_method(tmp_path: Path) -> None:
    async with open_secure(tmp_path) as secure:
        before = await _footprint(secure)
        answers = {m.path: await _status(secure, m, None) for m in METHODS}
        assert {p: s for p, s in answers.items() if s != grpc.StatusCode.UNAUTHENTICATED} == {}
        assert await _footprint(secure) == before


async def test_an_agent_acts_only_as_itself(tmp_path: Path) -> None:
    """mallory names bob wherever a method acts for an agent: refused every time."""
    selfish = [m for m in METHODS if METHOD_RULES[m.path].who is Who.SELF]
    assert len(selfish) >= 25
    async with open_secure(tmp_path) as secure:
        before = await _footprint(secure)
        answers = {m.path: await _status(secure, m, "mallory") for m in selfish}
        assert {p: s for p, s in answers.items() if s != grpc.StatusCode.PERMISSION_DENIED} == {}
        assert await _footprint(secure) == before


async def test_operator_methods_refuse_agents_applications_and_operators_without_the_role(
    tmp_path: Path,
) -> None:
    guarded = [m for m in METHODS if METHOD_RULES[m.path].who in (Who.ROLE, Who.OPERATOR)]
    async with open_secure(tmp_path) as secure:
        before = await _footprint(secure)
        for who in ("alice", "app"):
            answers = {m.path: await _status(secure, m, who) for m in guarded}
            assert {
                p: s for p, s in answers.items() if s != grpc.StatusCode.PERMISSION_DENIED
            } == {}
        role_bound = [m for m in guarded if METHOD_RULES[m.path].who is Who.ROLE]
        answers = {m.path: await _status(secure, m, "no-role") for m in role_bound}
        assert {p: s for p, s in answers.items() if s != grpc.StatusCode.PERMISSION_DENIED} == {}
        assert await _footprint(secure) == before


async def test_an_admin_operator_passes_every_role_check(tmp_path: Path) -> None:
    """The refusals above are the rules' doing: an admin gets past every ROLE method's guard
    (whatever the handler then says of the empty request)."""
    role_bound = [m for m in METHODS if METHOD_RULES[m.path].who is Who.ROLE]
    async with open_secure(tmp_path) as secure:
        answers = {m.path: await _status(secure, m, "root") for m in role_bound}
    assert {p: s for p, s in answers.items() if s in REFUSED} == {}


async def test_every_denial_is_an_access_decided_event_and_counted(tmp_path: Path) -> None:
    method = next(m for m in METHODS if m.path == "/apiary.v1.DlqService/List")
    async with open_secure(tmp_path) as secure:
        assert await _status(secure, method, "no-role") == grpc.StatusCode.PERMISSION_DENIED
        assert await _status(secure, method, "root") == grpc.StatusCode.OK
        c = secure.coordinator
        await c.events.flush()
        decided = [
            e for e in await c.events.read(after=0, limit=10_000)
            if e.event_type == "access.decided" and e.details["action"] == method.path
        ]  # fmt: skip
    assert [(e.actor, e.details["allowed"]) for e in decided] == [
        ("operator:olivia@default", False),
        ("operator:root@default", True),
    ]
    denied = decided[0].details
    assert denied["refusal"] == "permission_denied" and "dlq" in denied["reason"]
    assert denied["mechanism"] == "api_key" and denied["tenant"] == "default"
