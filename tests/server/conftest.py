from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from tests.server.runtime_harness import Answerer, RuntimeHttp, running_answerer, runtime_http


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path) as running:
        yield running


@pytest.fixture
async def channel(coordinator: Coordinator) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(str(coordinator.grpc_address)) as ch:
        yield ch


@pytest.fixture
async def runtime(coordinator: Coordinator) -> AsyncIterator[RuntimeHttp]:
    """The runtime control plane's HTTP port of `coordinator`."""
    async with runtime_http(coordinator) as http:
        yield http


@pytest.fixture
async def answerer(coordinator: Coordinator) -> AsyncIterator[Answerer]:
    """An SDK agent `answerer` answering the turns of `coordinator`'s threads."""
    async with running_answerer(coordinator, "answerer") as running:
        yield running


@pytest.fixture
def url(postgres_dsn: str, postgres_schema: str) -> str:
    """A PostgreSQL store URL on the test's own schema (the cluster tests' replicas share it)."""
    return f"{postgres_dsn}?apiary_schema={postgres_schema}"
