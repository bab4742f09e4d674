"""A PostgreSQL store that goes away and comes back (issue 22, honest answers under store
faults): while it cannot be reached the coordinator's health is NOT_SERVING and calls that
need it answer `unavailable` (retry), never internal_error; it reconnects by itself and is
SERVING again once the database is back.

The outage is real: the coordinator reaches PostgreSQL through a TCP relay in the test that
cuts every connection and refuses new ones, then accepts again on the same port."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb
from tests.server.wire_client import descriptor, error_detail

WAIT_S = 30.0
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Relay:
    """127.0.0.1:port -> the database; `cut` drops every connection and stops listening,
    `restore` listens on the same port again."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._link, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._links):
            writer.transport.abort()
        self._links.clear()
        await self._server.wait_closed()

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        self._links |= {writer, up_writer}

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))


@pytest.fixture
async def relay(postgres_dsn: str) -> AsyncIterator[Relay]:
    params = psycopg.conninfo.conninfo_to_dict(postgres_dsn)
    found = Relay(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
    await found.start()
    yield found
    with contextlib.suppress(AssertionError):
        await found.cut()


def _through(postgres_dsn: str, relay: Relay, schema: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(postgres_dsn)
    user = params.get("user") or "postgres"
    return (
        f"postgresql://{user}@127.0.0.1:{relay.port}/{params.get('dbname') or 'test'}"
        f"?apiary_schema={schema}&connect_timeout=2"
    )


async def _until(watch: grpc.aio.UnaryStreamCall, status: int) -> None:
    async with asyncio.timeout(WAIT_S):
        async for reply in watch:
            if reply.status == status:
                return
    raise AssertionError("the health watch ended")


async def test_health_follows_the_database_and_calls_answer_unavailable_meanwhile(
    tmp_path: Path, postgres_dsn: str, postgres_schema: str, relay: Relay
) -> None:
    url = _through(postgres_dsn, relay, postgres_schema)
    async with (
        open_test_coordinator(tmp_path, url) as coordinator,
        grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel,
    ):
        health = health_pb2_grpc.HealthStub(channel)
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""))
        await _until(watch, SERVING)
        registry = pb.registry_pb2_grpc.RegistryServiceStub(channel)
        request = pb.registry_pb2.RegisterAgentRequest(agent=descriptor("alice"))
        assert (await registry.RegisterAgent(request)).accepted

        await relay.cut()
        await _until(watch, NOT_SERVING)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await registry.RegisterAgent(
                pb.registry_pb2.RegisterAgentRequest(agent=descriptor("bob"))
            )
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
        assert error_detail(caught.value).error_code == "unavailable"

        await relay.start()
        await _until(watch, SERVING)
        retried = await registry.RegisterAgent(
            pb.registry_pb2.RegisterAgentRequest(agent=descriptor("bob"))
        )
        assert retried.accepted
        watch.cancel()
        agents = [a.agent_id for a in await coordinator.store.agents.list()]
    assert agents == ["alice", "bob"]
