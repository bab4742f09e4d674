"""Forwarding to a leader that requires client certificates (docs/cluster.md, "The
leader"; `tls_client_ca`): two replicas in process on one PostgreSQL schema, serving mTLS
with a CA made for the test.

- A replica presents its own certificate (the default, `tls_cert`) to the leader, which
  takes it: a call through the follower is answered by the leader.
- A replica configured with a client certificate the leader's CA did not sign
  (`cluster.client_cert`) has its forwarded calls refused with an error naming the setting.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from apiary.engine.cluster.settings import ClusterSettings
from apiary.sdk.channel import ClientTls, open_channel
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb
from apiary.wire.errordetail import error_from_trailers
from tests.server.test_cluster_replicas import _until
from tests.swarm.pki import Pki, make_pki

pytestmark = pytest.mark.postgres

WAIT_S = 30.0
SETTINGS = ClusterSettings(True, "", 1.5, 4)


def _leads(replica: Coordinator) -> bool:
    assert replica.cluster is not None and replica.cluster.leader is not None
    return replica.cluster.leader.leads()


def _sees_leader(replica: Coordinator) -> bool:
    assert replica.cluster is not None and replica.cluster.leader is not None
    return bool(replica.cluster.leader.lease.address)


@asynccontextmanager
async def _replica(
    tmp_path: Path, url: str, pki: Pki, name: str, client: Pki | None = None
) -> AsyncIterator[Coordinator]:
    settings = replace(SETTINGS, replica_id=name)
    if client is not None:
        settings = replace(settings, client_cert=client.client_cert, client_key=client.client_key)
    async with open_test_coordinator(
        tmp_path / name, url, cluster=settings,
        tls_cert=pki.cert_file, tls_key=pki.key_file, tls_client_ca=pki.ca_file,
    ) as replica:  # fmt: skip
        yield replica


async def _list_tasks(replica: Coordinator, pki: Pki) -> str:
    """What ListTasks through `replica` answers: 'ok', or the error's code and field."""
    tls = ClientTls(ca=pki.ca_file, cert=pki.client_cert, key=pki.client_key)
    async with open_channel(f"localhost:{replica.grpc_address.port}", tls) as channel:
        stub = pb.apiary_pb2_grpc.TaskQueryServiceStub(channel)
        try:
            await stub.ListTasks(pb.apiary_pb2.ListTasksRequest(), timeout=WAIT_S)
        except grpc.aio.AioRpcError as exc:
            error = error_from_trailers(exc.trailing_metadata() or ())
            assert error is not None, exc
            return f"{error.code} {error.details.get('field', '')}: {error.message}"
    return "ok"


async def test_a_call_through_a_follower_reaches_a_leader_that_requires_client_certificates(
    tmp_path: Path, url: str
) -> None:
    pki = make_pki(tmp_path / "pki")
    stranger = make_pki(tmp_path / "other-ca")
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(_replica(tmp_path, url, pki, "a"))
        await _until(lambda: _leads(first), "a leads")
        follower = await stack.enter_async_context(_replica(tmp_path, url, pki, "b"))
        await _until(lambda: _sees_leader(follower), "b sees the leader")
        assert not _leads(follower)
        assert await _list_tasks(follower, pki) == "ok"
        # A replica presenting a certificate of another CA: refused by the leader, and told
        # which setting to change.
        stray = await stack.enter_async_context(_replica(tmp_path, url, pki, "c", stranger))
        await _until(lambda: _sees_leader(stray), "c sees the leader")
        answer = await _list_tasks(stray, pki)
        assert answer.startswith("unavailable cluster.client_cert: "), answer
        assert f"cluster.client_cert = {stranger.client_cert}" in answer
        assert "refused this replica's client certificate" in answer
        assert await _list_tasks(follower, pki) == "ok"  # (the others go on)
