"""The HTTP port: health, readiness, metrics and the JSON gateway over the same handlers."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from apiary.server.coordinator import Coordinator
from apiary.server.dispatch import Dispatcher
from apiary.server.http.app import build_http_app
from apiary.server.inprocess import open_test_coordinator
from apiary.server.metrics import Metrics


@pytest.fixture
async def http(coordinator: Coordinator) -> AsyncIterator[aiohttp.ClientSession]:
    base = f"http://{coordinator.http_address}"
    async with aiohttp.ClientSession(base_url=base) as session:
        yield session


async def _call(
    http: aiohttp.ClientSession, path: str, body: object
) -> tuple[int, dict[str, object]]:
    async with http.post(f"/v1/{path}", data=json.dumps(body)) as resp:
        return resp.status, await resp.json()


async def _register(http: aiohttp.ClientSession, agent_id: str) -> None:
    status, _ = await _call(
        http,
        "sw4rm.registry.RegistryService/RegisterAgent",
        {
            "agent": {
                "agent_id": agent_id,
                "name": agent_id,
                "reasoning_connectors": ["builtin://rules"],
            }
        },
    )
    assert status == 200


def _envelope(producer: str, body: dict[str, object]) -> dict[str, object]:
    payload = json.dumps(body).encode()
    return {
        "message_id": str(uuid.uuid4()),
        "correlation_id": str(uuid.uuid4()),
        "producer_id": producer,
        "message_type": "DATA",
        "content_type": "application/json",
        "content_length": len(payload),
        "payload": base64.b64encode(payload).decode(),
    }


@pytest.mark.conformance("transport.health.healthz-fallback")
async def test_healthz_and_readyz(http: aiohttp.ClientSession) -> None:
    async with http.get("/healthz") as resp:
        assert resp.status == 200
        assert (await resp.json())["status"] == "ok"
    async with http.get("/readyz") as resp:
        assert resp.status == 200


async def test_metrics_count_rpcs(http: aiohttp.ClientSession) -> None:
    await _register(http, "alice")
    async with http.get("/metrics") as resp:
        text = await resp.text()
    assert resp.status == 200
    assert (
        'apiary_rpc_total{code="ok",method="/sw4rm.registry.RegistryService/RegisterAgent"' in text
    )
    # Every kind of event is counted too (tool calls, handoffs, workflow nodes, ...).
    assert 'apiary_events_total{event_type="agent.registered"} 1.0' in text
    assert 'apiary_events_total{event_type="coordinator.started"} 1.0' in text


def _sample(text: str, name: str) -> float:
    (line,) = [line for line in text.splitlines() if line.startswith(f"{name} ")]
    return float(line.split()[1])


async def test_metrics_show_the_embedded_stores_writer(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    # The memory store (the `http` fixture's coordinator) has no writer to show.
    async with http.get("/metrics") as resp:
        assert "apiary_store_" not in await resp.text()
    store = f"sqlite:///{tmp_path / 'apiary.db'}"
    async with (
        open_test_coordinator(tmp_path / "sqlite", store) as coordinator,
        aiohttp.ClientSession(base_url=f"http://{coordinator.http_address}") as session,
    ):
        await _register(session, "alice")
        async with session.get("/metrics") as resp:
            text = await resp.text()
    commits, jobs = (
        _sample(text, "apiary_store_commits_total"),
        _sample(text, "apiary_store_jobs_total"),
    )
    assert 1 <= commits <= jobs
    assert _sample(text, "apiary_store_largest_batch") >= 1
    assert _sample(text, "apiary_store_checkpoints_total") >= 0
    assert _sample(text, "apiary_store_wal_restarts_total") == 0
    # Where the coordinator's threads spend their time (Linux: read from /proc).
    threads = {
        line.split('"')[1]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("apiary_thread_cpu_seconds_total{")
    }
    assert threads["MainThread"] > 0
    # The store's writer is the event loop (writer=loop, the default): no thread of its own.
    assert "apiary-sqlite-writer" not in threads
    assert "apiary-sqlite-checkpointer" in threads
    assert "apiary_store_writer_process_cpu_seconds_total" not in text


async def test_metrics_show_the_writer_process_cpu(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'apiary.db'}?writer=process"
    async with (
        open_test_coordinator(tmp_path / "sqlite", store) as coordinator,
        aiohttp.ClientSession(base_url=f"http://{coordinator.http_address}") as session,
    ):
        for agent in ("alice", "bob", "carol"):
            await _register(session, agent)
        async with session.get("/metrics") as resp:
            text = await resp.text()
    assert (
        1 <= _sample(text, "apiary_store_commits_total") <= _sample(text, "apiary_store_jobs_total")
    )
    # The writer's CPU is its process's, read from /proc; it ran the migrations and commits.
    assert _sample(text, "apiary_store_writer_process_cpu_seconds_total") > 0
    threads = {
        line.split('"')[1]
        for line in text.splitlines()
        if line.startswith("apiary_thread_cpu_seconds_total{")
    }
    assert "MainThread" in threads
    assert "apiary-sqlite-writer" not in threads


@pytest.mark.conformance("transport.http.prefer-http2")
async def test_the_grpc_port_speaks_http2_and_the_gateway_is_the_http1_fallback(
    coordinator: Coordinator, http: aiohttp.ClientSession
) -> None:
    # The SDK, apiary.Client and every CLI command use the gRPC port, which is HTTP/2: the
    # client preface is answered with a SETTINGS frame (type 4 on stream 0).
    host, port = str(coordinator.grpc_address).rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
        await writer.drain()
        header = await asyncio.wait_for(reader.readexactly(9), 10)
    finally:
        writer.close()
        await writer.wait_closed()
    length, frame_type, stream = int.from_bytes(header[:3], "big"), header[3], header[5:]
    assert (frame_type, stream) == (4, b"\x00\x00\x00\x00") and length % 6 == 0
    # HTTP/1.1 is the fallback, on the HTTP port: the JSON gateway answers it.
    async with http.get("/healthz") as resp:
        assert resp.status == 200 and resp.version == aiohttp.HttpVersion11


@pytest.mark.conformance("transport.http.http1-fallback")
async def test_gateway_send_with_recipient_field(
    coordinator: Coordinator, http: aiohttp.ClientSession
) -> None:
    await _register(http, "alice")
    await _register(http, "bob")
    env = _envelope("alice", {"text": "hi"})
    status, body = await _call(
        http, "sw4rm.router.RouterService/SendMessage", {"msg": env, "recipient": "bob"}
    )
    assert status == 200 and body["accepted"] is True
    stored = await coordinator.store.messages.get(str(env["message_id"]))
    assert stored is not None and stored.recipient == "bob"


async def test_gateway_streams_ndjson(http: aiohttp.ClientSession) -> None:
    await _register(http, "alice")
    await _register(http, "bob")
    env = _envelope("alice", {"to": "bob"})
    await _call(http, "sw4rm.router.RouterService/SendMessage", {"msg": env})
    async with http.post(
        "/v1/sw4rm.router.RouterService/StreamIncoming", json={"agent_id": "bob"}
    ) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "application/x-ndjson"
        while True:
            item = json.loads(await resp.content.readline())["msg"]
            if item.get("message_type") == "DATA":
                break
    assert item["message_id"] == env["message_id"]


async def test_gateway_errors_use_the_error_table(http: aiohttp.ClientSession) -> None:
    status, body = await _call(
        http, "sw4rm.router.RouterService/SendMessage", {"msg": _envelope("alice", {})}
    )
    assert status == 404
    assert body["error"]["code"] == "no_route"  # type: ignore[index]


async def test_gateway_unknown_field_is_400_naming_it(http: aiohttp.ClientSession) -> None:
    status, body = await _call(
        http, "sw4rm.registry.RegistryService/RegisterAgent", {"agent": {"agent_idd": "x"}}
    )
    assert status == 400
    error = body["error"]
    assert error["code"] == "validation_error"  # type: ignore[index]
    assert "agent_idd" in error["message"]  # type: ignore[index]


async def test_gateway_bad_json_is_400(http: aiohttp.ClientSession) -> None:
    async with http.post("/v1/sw4rm.router.RouterService/SendMessage", data=b"{nope") as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["code"] == "validation_error"


async def test_gateway_unknown_method_is_404(http: aiohttp.ClientSession) -> None:
    status, _ = await _call(http, "sw4rm.router.RouterService/Teleport", {})
    assert status == 404


async def test_gateway_unbuilt_method_is_501() -> None:
    app = build_http_app(Dispatcher({}), Metrics(), lambda: True)  # no handler at all
    async with TestServer(app) as server, TestClient(server) as client:
        resp = await client.post("/v1/sw4rm.handoff.HandoffService/RequestHandoff", data="{}")
        body = await resp.json()
        listed = await (await client.get("/v1")).json()
    assert resp.status == 501
    assert "handoff" in body["error"]["message"]
    paths = {m["path"]: m["implemented"] for m in listed["methods"]}
    assert paths["/v1/sw4rm.handoff.HandoffService/RequestHandoff"] is False


async def test_gateway_lists_methods(http: aiohttp.ClientSession) -> None:
    async with http.get("/v1") as resp:
        methods = (await resp.json())["methods"]
    paths = {m["path"]: m["implemented"] for m in methods}
    assert paths["/v1/sw4rm.router.RouterService/SendMessage"] is True
    assert paths["/v1/sw4rm.scheduler.SchedulerService/SubmitTask"] is True
    assert paths["/v1/sw4rm.worktree.WorktreeService/Bind"] is True
    assert paths["/v1/sw4rm.handoff.HandoffService/RequestHandoff"] is True


@pytest.mark.conformance("dlq.tools.inspection")
async def test_dead_letters_are_listed_and_exported_over_the_gateway(
    http: aiohttp.ClientSession,
) -> None:
    await _register(http, "alice")
    await _register(http, "bob")
    send = "sw4rm.router.RouterService/SendMessage"
    bad = _envelope("alice", {"to": "bob"})
    bad["content_type"] = "image/png"  # bob declared no images: refused, answered, no letter
    status, _ = await _call(http, send, {"msg": bad, "recipient": "bob"})
    assert status == 415
    status, body = await _call(http, "apiary.v1.DlqService/List", {})
    assert (status, body["entries"]) == (200, [])
    sent = _envelope("alice", {"n": 1})  # admitted, then bob refuses it: a dead letter
    status, _ = await _call(http, send, {"msg": sent, "recipient": "bob"})
    assert status == 200
    ack = _envelope("bob", {"ack_for_message_id": sent["message_id"], "ack_stage": "REJECTED",
                            "error_code": "unsupported_message_type"})  # fmt: skip
    ack["message_type"] = "ACKNOWLEDGEMENT"
    status, _ = await _call(http, send, {"msg": ack})
    assert status == 200
    status, body = await _call(
        http, "apiary.v1.DlqService/List", {"filter": {"error_code": "unsupported_message_type"}}
    )
    assert status == 200
    (entry,) = body["entries"]  # type: ignore[misc]
    assert entry["message_id"] == sent["message_id"]
    status, body = await _call(http, "apiary.v1.DlqService/Export", {})
    assert status == 200 and body["entries"] == 1


async def test_a_cross_site_browser_request_is_refused(
    http: aiohttp.ClientSession, coordinator: Coordinator
) -> None:
    """A page elsewhere cannot make an operator's browser call the gateway (no CSRF, no DNS
    rebinding): a request whose Origin is not this coordinator is refused; the console's own
    page (same origin) and clients without an Origin are served."""
    path = "/v1/apiary.v1.DiscoveryService/ListAgents"
    async with http.post(path, data="{}", headers={"Origin": "http://evil.example"}) as resp:
        body = await resp.json()
    assert resp.status == 403
    assert (body["error"]["code"], body["error"]["details"]["reason"]) == (
        "permission_denied", "cross_site",
    )  # fmt: skip
    host = str(coordinator.http_address)
    async with http.post(path, data="{}", headers={"Origin": f"http://{host}"}) as same:
        assert same.status == 200
    async with http.post(path, data="{}") as plain:
        assert plain.status == 200
    rebound = {"Origin": "http://evil.example:8080", "Host": "evil.example:8080"}
    async with http.post(path, data="{}", headers=rebound) as resp:
        body = await resp.json()
    assert (resp.status, body["error"]["details"]["reason"]) == (403, "not_loopback_host")
