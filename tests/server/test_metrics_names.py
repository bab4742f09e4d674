"""/metrics over real HTTP: one `apiary_` prefix for every metric of Apiary's own, the
standard `process_*` metrics beside them, and label values from bounded sets only."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from apiary.server.coordinator import Coordinator

RFC13 = {
    # RFC 13's illustrative names -> what /metrics serves (docs/metrics.md).
    "router.inbound_queue_depth": "apiary_router_inbound_queue_depth",
    "router.inbound_queue_capacity": "apiary_router_inbound_queue_capacity",
    "router.enqueue_rejects_total": "apiary_router_enqueue_rejects",
    "router.nacks_total": "apiary_router_nacks",
    "router.enqueue_latency_seconds": "apiary_router_enqueue_latency_seconds",
    "agent.dequeue_latency_seconds": "apiary_agent_dequeue_latency_seconds",
    "agent.process_time_seconds": "apiary_agent_process_time_seconds",
    "router.oldest_enqueued_age_seconds": "apiary_router_oldest_enqueued_age_seconds",
}
PROCESS = (
    "process_cpu_seconds", "process_resident_memory_bytes", "process_virtual_memory_bytes",
    "process_open_fds", "process_max_fds", "process_start_time_seconds",
)  # fmt: skip


@pytest.fixture
async def http(coordinator: Coordinator) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=f"http://{coordinator.http_address}") as session:
        yield session


async def _scrape(http: aiohttp.ClientSession) -> tuple[dict[str, str], list[Sample]]:
    async with http.get("/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    families = list(text_string_to_metric_families(text))
    return {f.name: f.type for f in families}, [s for f in families for s in f.samples]


async def _register(http: aiohttp.ClientSession, agent_id: str) -> None:
    body = {"agent": {"agent_id": agent_id, "name": agent_id,
                      "reasoning_connectors": ["builtin://rules"]}}  # fmt: skip
    path = "/v1/sw4rm.registry.RegistryService/RegisterAgent"
    async with http.post(path, data=json.dumps(body)) as resp:
        assert resp.status == 200


async def test_every_metric_is_apiary_or_standard_process(http: aiohttp.ClientSession) -> None:
    await _register(http, "alice")
    names, _ = await _scrape(http)
    strays = sorted(n for n in names if not n.startswith(("apiary_", "process_")))
    assert strays == []
    for rfc, served in RFC13.items():
        assert served in names, f"{rfc} should be served as {served}"


async def test_standard_process_metrics_are_served(http: aiohttp.ClientSession) -> None:
    names, samples = await _scrape(http)
    for name in PROCESS:
        assert name in names
    values = {s.name: s.value for s in samples if s.name.startswith("process_")}
    assert names["process_cpu_seconds"] == "counter"
    assert values["process_cpu_seconds_total"] > 0
    assert values["process_resident_memory_bytes"] > 0
    assert values["process_open_fds"] >= 3  # at least the listening sockets and stdio
    assert values["process_start_time_seconds"] > 1_600_000_000


@pytest.mark.parametrize(
    "path",
    [
        "/v1/sw4rm.router.RouterService/Teleport",  # a service that exists, no such method
        "/v1/no.such.Service/Anything",  # no such service
        "/v1/%E2%9C%A8sparkle/%00",  # what no method is named
        "/etc/passwd",  # no route at all
        "/v1/x/y/z",
    ],
)
async def test_unknown_paths_share_one_fixed_label(http: aiohttp.ClientSession, path: str) -> None:
    for n in range(3):
        async with http.post(f"{path}{n}", data="{}") as resp:
            assert resp.status in (404, 405)
    _, samples = await _scrape(http)
    methods = {s.labels["method"] for s in samples if s.name == "apiary_rpc_total"}
    assert "unknown" in methods
    assert all(m == "unknown" or m.startswith("/") for m in methods), methods
    typed = path.rsplit("/", 1)[-1]
    assert not any(typed in m for m in methods if m != "unknown"), methods
