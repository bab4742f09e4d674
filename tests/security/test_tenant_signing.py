"""Tenants besides `default` are served only with message signing (RFC 6.2: signing MUST be
on when the framework supports multiple tenants; RFC 6.5: all communications signed)."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from apiary.core.access.principal import PrincipalKind
from apiary.errors import ValidationError
from apiary.server.auth.keys import KeyRing, credentials_path
from apiary.server.config.loader import checked_serving, load_config
from apiary.server.config.server import secured
from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb
from tests.server.wire_client import error_detail

pytestmark = pytest.mark.conformance(
    "security.signing.required-multi-tenant", "security.multitenant.sign-all"
)


def test_configured_tenants_without_signing_stop_serve(tmp_path: Path) -> None:
    path = tmp_path / "apiary.toml"
    path.write_text('[auth]\ntenants = ["acme"]\n')
    with pytest.raises(ValidationError) as caught:
        checked_serving(load_config(path, {}, {}))
    assert caught.value.details["field"] == "tenants"
    assert "signing" in caught.value.message and "--secure" in caught.value.message
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("c")
    key.write_text("k")
    tls = {"tls_cert": str(cert), "tls_key": str(key)}
    served = checked_serving(secured(load_config(path, {}, tls)))
    assert served.router.signing_required and served.auth.tenants == ("acme",)


async def test_a_dev_coordinator_serves_no_other_tenant(tmp_path: Path) -> None:
    """A key for tenant acme on a coordinator without signing: its calls are refused with
    the reason, and the default tenant is untouched."""
    _, secret = KeyRing(credentials_path(tmp_path)).create(
        PrincipalKind.OPERATOR, "ops", tenant="acme", roles=("admin",), now=time.time()
    )
    async with (
        open_test_coordinator(tmp_path) as coordinator,
        grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel,
    ):
        discovery = pb.apiary_pb2_grpc.DiscoveryServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await discovery.ListAgents(
                pb.apiary_pb2.ListAgentsRequest(),
                metadata=(("authorization", f"Bearer {secret}"),),
            )
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
        detail = error_detail(caught.value)
        assert detail.details["reason"] == "tenants_need_signing"
        assert coordinator.tenancy is not None and coordinator.tenancy.names() == ["default"]
        assert not (tmp_path / "tenants").exists()
