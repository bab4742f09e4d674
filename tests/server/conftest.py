from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path) as running:
        yield running


@pytest.fixture
async def channel(coordinator: Coordinator) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(str(coordinator.grpc_address)) as ch:
        yield ch
