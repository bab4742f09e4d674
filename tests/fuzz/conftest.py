"""One real coordinator per fuzz module (SQLite, dev mode, real sockets on 127.0.0.1), shared
by every example of every method: starting one per example would cost more than the calls.

APIARY_FUZZ_EXAMPLES sets the examples per method and transport (default FUZZ_EXAMPLES);
scripts/fuzz.py runs the same cases and checks for as long as asked.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import aiohttp
import grpc
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, Phase, settings

from apiary.server.inprocess import open_test_coordinator
from tests.fuzz.target import CHANNEL_OPTIONS, FuzzTarget, resident_bytes

FUZZ_EXAMPLES = 25
"""Examples per method and transport in `make test`: the folder (97 methods on two
transports, the read routes, any path) runs in about 15 s on two cores."""
EXAMPLES = int(os.environ.get("APIARY_FUZZ_EXAMPLES") or FUZZ_EXAMPLES)
RSS_GROWTH_LIMIT = 128 * 1024 * 1024
"""How much the process (the coordinator runs in it) may grow over one fuzz module: 5-30
MiB are Hypothesis's and the coordinator's caches warming up (measured at 25 and 200
examples); scripts/fuzz.py checks growth round after round, over hours."""
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,  # real sockets: the time of one call is not the property under test
    suppress_health_check=list(HealthCheck),
    # No explain phase: it would call the coordinator again only to annotate the report.
    phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
    print_blob=True,
)
"""The settings of every fuzz test."""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def target(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FuzzTarget]:
    data_dir = tmp_path_factory.mktemp("fuzz")
    store = f"sqlite:///{data_dir / 'apiary.db'}"
    async with (
        open_test_coordinator(data_dir, store) as coordinator,
        grpc.aio.insecure_channel(str(coordinator.grpc_address), CHANNEL_OPTIONS) as channel,
        aiohttp.ClientSession(base_url=f"http://{coordinator.http_address}") as http,
    ):
        running = FuzzTarget(coordinator, channel, http)
        await running.register_known_agents()
        running.baseline_rss = resident_bytes()
        yield running
