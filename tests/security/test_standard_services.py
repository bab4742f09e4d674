"""gRPC's health and reflection services are decided by their rules like every other method,
over real sockets against a coordinator in secure mode: health answers anyone (probes carry no
credentials), reflection answers principals only and refuses anonymous callers with
unauthenticated (it describes every service and message type), each refusal recorded as an
access decision; and every method those services serve has exactly one rule."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2

from apiary.core.access.table import STANDARD_RULES
from apiary.server.grpc.server import abort_call
from apiary.server.grpc.standard import GuardedHandlers
from apiary.server.metrics import Metrics
from apiary.testing.events import wait_for_event
from apiary.wire.errordetail import error_from_trailers
from tests.security.access_harness import Secure, open_secure

REFLECTION = {
    "v1alpha": "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "v1": "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
}


@pytest.fixture
async def secure(tmp_path: Path) -> AsyncIterator[Secure]:
    async with open_secure(tmp_path) as running:
        yield running


async def _list_services(secure: Secure, path: str, who: str | None) -> list[str]:
    ask = reflection_pb2.ServerReflectionRequest(list_services="")
    call = secure.channel.stream_stream(
        path,
        reflection_pb2.ServerReflectionRequest.SerializeToString,
        reflection_pb2.ServerReflectionResponse.FromString,
    )(iter([ask]), metadata=secure.metadata(who), timeout=10)
    answer = await call.read()
    return [s.name for s in answer.list_services_response.service]


@pytest.mark.parametrize("version", sorted(REFLECTION))
async def test_reflection_refuses_anonymous_callers(secure: Secure, version: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _list_services(secure, REFLECTION[version], None)
    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
    error = error_from_trailers(refused.value.trailing_metadata() or ())
    assert error is not None and error.code == "unauthenticated"
    decided = await wait_for_event(
        secure.coordinator.events,
        lambda e: (
            e.event_type == "access.decided" and e.details.get("action") == REFLECTION[version]
        ),
        timeout_s=10,
    )
    assert decided.details["allowed"] is False


@pytest.mark.parametrize("version", sorted(REFLECTION))
async def test_reflection_answers_a_principal(secure: Secure, version: str) -> None:
    services = await _list_services(secure, REFLECTION[version], "alice")
    assert "sw4rm.router.RouterService" in services
    assert "grpc.health.v1.Health" in services


async def test_health_answers_anyone(secure: Secure) -> None:
    stub = health_pb2_grpc.HealthStub(secure.channel)
    for who in (None, "alice"):
        answer = await stub.Check(health_pb2.HealthCheckRequest(), metadata=secure.metadata(who))
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    watch = stub.Watch(health_pb2.HealthCheckRequest(service="sw4rm.router.RouterService"))
    first = await watch.read()
    watch.cancel()
    assert first.status == health_pb2.HealthCheckResponse.SERVING


def test_every_standard_method_has_exactly_one_rule() -> None:
    """The methods the server adds beside Apiary's: what grpcio's health and reflection
    servicers register, read from their service descriptors."""
    served = {
        f"/{service.full_name}/{method.name}"
        for module in (health_pb2, reflection_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    } | {REFLECTION["v1"]}
    assert served == set(STANDARD_RULES)


async def test_a_standard_method_without_a_rule_is_refused() -> None:
    """A method of the standard servicers that the table does not name (as a newer grpcio
    could add) is refused before the guard is asked, not served unguarded."""

    async def ping(_request: bytes, _ctx: object) -> bytes:
        raise AssertionError("served without a rule")

    extra = grpc.method_handlers_generic_handler(
        "test.Extra", {"Ping": grpc.unary_unary_rpc_method_handler(ping)}
    )
    metrics = Metrics()
    guarded = GuardedHandlers(
        [extra], STANDARD_RULES, _NoGuard(), lambda _ctx: None,  # type: ignore[arg-type, return-value]
        lambda ctx, exc, path: abort_call(ctx, exc, path, metrics),
    )  # fmt: skip
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([guarded])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await channel.unary_unary("/test.Extra/Ping")(b"", timeout=10)
    finally:
        await server.stop(None)
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    error = error_from_trailers(refused.value.trailing_metadata() or ())
    assert error is not None and error.code == "permission_denied"
    assert "/test.Extra/Ping has no authorization rule" in error.message


class _NoGuard:
    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the guard is not asked about a method without a rule ({name})")
