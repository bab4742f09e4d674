"""One error surface (issue 22, part 2): whatever a client sends, the answer is a specific
protocol error in the transport's one format, never internal_error, UNKNOWN or a 500.

gRPC: bytes that are not the request message answer INVALID_ARGUMENT validation_error with
one log line. HTTP: every error (aiohttp's 404, 405 and 413 included) is the JSON error
object with snake_case codes; bad query parameters and malformed bodies are 400 naming
what is wrong; bytes fields take strict base64. Answers quote bounded input only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from apiary.errors import NoRouteError, ValidationError
from apiary.server.coordinator import Coordinator
from apiary.server.errormap import MAX_DETAILS, MAX_MESSAGE_BYTES, answer_for
from apiary.server.http.errors import error_middleware
from apiary.server.http.gateway import MAX_BODY
from apiary.server.inprocess import open_test_coordinator
from apiary.server.metrics import Metrics
from apiary.wire import pb
from tests.server.wire_client import envelope, error_detail

CORRUPT = b"\xff\xff\xff"
"""Not a protobuf encoding of anything (a field with tag number 0x1fffff... truncated)."""
REGISTER = "/sw4rm.registry.RegistryService/RegisterAgent"
INCOMING = "/sw4rm.router.RouterService/StreamIncoming"
SEND_STREAM = "/apiary.v1.RouterStreamService/SendStream"
WAIT_S = 10.0


@pytest.fixture
async def http(coordinator: Coordinator) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=f"http://{coordinator.http_address}") as session:
        yield session


async def _post(http: aiohttp.ClientSession, path: str, data: bytes | str) -> tuple[int, Any]:
    async with http.post(path, data=data) as resp:
        return resp.status, await resp.json()


def _refused_once(caplog: pytest.LogCaptureFixture, path: str) -> None:
    """Exactly one log line names the refused call, and no record carries a traceback."""
    mine = [r for r in caplog.records if path in r.getMessage()]
    assert len(mine) == 1 and mine[0].levelno == logging.WARNING
    assert all(r.exc_info is None for r in caplog.records), [r.getMessage() for r in caplog.records]


# ----------------------------------------------------------------------- gRPC decoding


async def test_undecodable_unary_request_is_a_validation_error_logged_once(
    channel: grpc.aio.Channel, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await channel.unary_unary(REGISTER)(CORRUPT, timeout=WAIT_S)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    detail = error_detail(caught.value)
    assert (detail.error_code, detail.details["field"]) == ("validation_error", "request")
    assert "sw4rm.registry.RegisterAgentRequest" in detail.message
    _refused_once(caplog, REGISTER)


async def test_undecodable_streaming_request_is_a_validation_error(
    channel: grpc.aio.Channel, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    call = channel.unary_stream(INCOMING)(CORRUPT, timeout=WAIT_S)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in call:
            pass
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error_detail(caught.value).error_code == "validation_error"
    _refused_once(caplog, INCOMING)


async def test_an_undecodable_frame_ends_a_client_stream_with_a_validation_error(
    channel: grpc.aio.Channel, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)

    async def frames() -> AsyncIterator[bytes]:
        yield CORRUPT

    call = channel.stream_stream(SEND_STREAM)(frames(), timeout=WAIT_S)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in call:
            pass
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    detail = error_detail(caught.value)
    assert (detail.error_code, detail.details["type"]) == (
        "validation_error",
        "apiary.v1.SendFrame",
    )
    _refused_once(caplog, SEND_STREAM)


async def test_an_error_quoting_a_huge_recipient_stays_small(channel: grpc.aio.Channel) -> None:
    """The answer is the real refusal (no_route, or validation_error where ids have a
    length limit), not RESOURCE_EXHAUSTED from trailers the client refuses: what an answer
    quotes of its request is bounded."""
    stub = pb.router_pb2_grpc.RouterServiceStub(channel)
    request = pb.router_pb2.SendMessageRequest(msg=envelope("alice"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.SendMessage(request, metadata=(("sw4rm-recipient", "r" * 7000),), timeout=WAIT_S)
    detail = error_detail(caught.value)
    assert detail.error_code in {"no_route", "validation_error"}
    assert len(detail.SerializeToString()) < 4096
    assert len(caught.value.details() or "") < 1024


def test_every_answer_is_bounded_whatever_the_error_quotes() -> None:
    huge = ValidationError("x" * 100_000 + "é", {f"k{n}" * 50: "v" * 10_000 for n in range(40)})
    answer = answer_for(huge, "/test")
    assert len(answer.message.encode()) <= MAX_MESSAGE_BYTES and answer.message.endswith("…")
    assert len(answer.details) == MAX_DETAILS
    assert all(len(k.encode()) <= 64 and len(v.encode()) <= 160 for k, v in answer.details.items())
    assert answer_for(NoRouteError("no agent 'bob'"), "/t").message == "no agent 'bob'"
    lone = answer_for(ValidationError("bad \ud800 here"), "/t").message
    assert lone.encode("utf-8") == b"bad ? here"  # every transport can encode it


# ---------------------------------------------------------------- HTTP: aiohttp's refusals


async def test_an_unknown_route_is_the_json_error(http: aiohttp.ClientSession) -> None:
    async with http.get("/no/such/page") as resp:
        body = await resp.json()
    assert resp.status == 404
    assert body["error"]["code"] == "not_found"
    assert "GET /no/such/page" in body["error"]["message"]


async def test_a_wrong_method_is_405_in_the_json_error_with_allow(
    http: aiohttp.ClientSession,
) -> None:
    async with http.get("/v1/sw4rm.registry.RegistryService/RegisterAgent") as resp:
        body = await resp.json()
    assert (resp.status, resp.headers["Allow"]) == (405, "POST")
    assert (body["error"]["code"], body["error"]["details"]["field"]) == (
        "validation_error", "method",
    )  # fmt: skip
    assert "use POST" in body["error"]["message"]


async def test_a_body_over_the_limit_is_413(http: aiohttp.ClientSession) -> None:
    status, body = await _post(
        http, "/v1/sw4rm.registry.RegistryService/RegisterAgent", b" " * (MAX_BODY + 1)
    )
    assert status == 413
    assert body["error"]["code"] == "oversize_payload"
    assert body["error"]["details"] == {"field": "body", "limit": str(MAX_BODY)}


async def test_every_code_is_snake_case(http: aiohttp.ClientSession) -> None:
    """NotFoundError's code is written NOT_FOUND (RFC 18.6); the JSON error spells every
    code one way."""
    status, body = await _post(http, "/v1/sw4rm.router.RouterService/Teleport", "{}")
    assert (status, body["error"]["code"]) == (404, "not_found")
    status, body = await _post(http, "/v1/apiary.v1.DiscoveryService/GetAgent", '{"agent_id": "x"}')
    assert (status, body["error"]["code"]) == (404, "not_found")


async def test_unknown_methods_share_one_metrics_label(http: aiohttp.ClientSession) -> None:
    """What a client types as a path never becomes a metrics label (labels live forever)."""
    for n in range(3):
        await _post(http, f"/v1/sw4rm.router.RouterService/Nope{n}", "{}")
    async with http.get("/metrics") as resp:
        text = await resp.text()
    assert "Nope0" not in text
    assert 'method="unknown"' in text


# ------------------------------------------------------------------- HTTP: query parameters


@pytest.mark.parametrize(
    ("query", "headers"),
    [
        ("?after=%C2%B2", {}),  # '²' is a digit to str.isdigit, not to int()
        ("?after=%D9%A3", {}),  # ARABIC-INDIC DIGIT THREE
        (f"?after={2**63}", {}),  # past every store's 64-bit sequence
        ("?after=1" + "0" * 5000, {}),  # past Python's int() digit limit
        ("", {"Last-Event-ID": "²"}),
        ("?keepalive=nan", {}),
    ],
)
async def test_a_bad_event_stream_cursor_is_400_naming_it(
    tmp_path: Path, query: str, headers: dict[str, str]
) -> None:
    store = f"sqlite:///{tmp_path / 'apiary.db'}"
    async with (
        open_test_coordinator(tmp_path, store) as coordinator,
        aiohttp.ClientSession(base_url=f"http://{coordinator.http_address}") as http,
        http.get(f"/v1/events/stream{query}", headers=headers) as resp,
    ):
        body = await resp.json()
    assert resp.status == 400
    assert body["error"]["code"] == "validation_error"
    assert body["error"]["details"]["field"] in {"after", "Last-Event-ID", "keepalive"}
    assert len(body["error"]["message"]) < 200


async def test_a_bad_workflow_limit_is_400(http: aiohttp.ClientSession) -> None:
    async with http.get("/console/api/workflows?limit=%C2%B2") as resp:
        body = await resp.json()
    assert (resp.status, body["error"]["details"]["field"]) == (400, "limit")


# ---------------------------------------------------------------------- HTTP: bodies


@pytest.mark.parametrize(
    "value",
    ["!!!!", "aGk=aGk=", "aG k=", "é", "a", "aGk===", "aGk\n="],
)
async def test_invalid_base64_names_the_bytes_field(
    http: aiohttp.ClientSession, value: str
) -> None:
    body = {"agent": {"agent_id": "b64", "name": "b64", "public_key": value}}
    status, answer = await _post(http, f"/v1{REGISTER}", json.dumps(body))
    assert status == 400
    assert answer["error"]["code"] == "validation_error"
    assert answer["error"]["details"]["field"] == "agent.public_key"


@pytest.mark.parametrize("value", ["aGk=", "aGk", "-_-_", "+/+/", ""])
async def test_valid_base64_in_either_alphabet_is_taken(
    http: aiohttp.ClientSession, value: str
) -> None:
    body = {"msg": {"message_id": "x", "payload": value}}
    status, answer = await _post(
        http, "/v1/sw4rm.router.RouterService/SendMessage", json.dumps(body)
    )
    # Past decoding, the envelope is refused for its own reasons, never for its payload.
    assert status == 400 and answer["error"]["details"].get("field") != "msg.payload"


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ('{"agent_id": "a", "state": "\\ud800"}', "lone surrogate"),
        ('{"agent_id": "\\udfff"}', "lone surrogate"),
        ('{"\\ud800": 1}', "lone surrogate"),
        (
            '{"agent_id": "a", "state": Infinity}',
            'Infinity is not JSON; proto3 JSON writes it as the string "Infinity"',
        ),
        ('{"agent_id": "a", "state": NaN}', "NaN is not JSON"),
        ('{"agent_id": "a", "state": 1e400}', ""),
        ('{"agent_id": "a", "state": ' + "9" * 5000 + "}", "more than 4300 digits"),
        ("[" * 100_000 + "]" * 100_000, "deeper than 100 levels"),
        ('{"agent_id": ' + "[" * 150 + "]" * 150 + "}", "deeper than 100 levels"),
        (b'{"agent_id": "\xff"}', "is not UTF-8"),
    ],
)
async def test_a_malformed_body_is_400_never_500(
    http: aiohttp.ClientSession, raw: str | bytes, why: str
) -> None:
    status, answer = await _post(http, "/v1/sw4rm.registry.RegistryService/Heartbeat", raw)
    assert status == 400, answer
    assert answer["error"]["code"] == "validation_error"
    assert why in answer["error"]["message"]


async def test_a_streaming_frame_line_is_parsed_the_same_way(http: aiohttp.ClientSession) -> None:
    line = json.dumps({"items": [{"msg": {"payload": "aGk="}, "signature": "!!"}]})
    status, answer = await _post(http, f"/v1{SEND_STREAM}", line + "\n")
    assert status == 400
    assert answer["error"]["details"]["field"] == "items[0].signature"


async def test_head_on_the_event_stream_is_405_not_a_body_after_headers(
    http: aiohttp.ClientSession,
) -> None:
    """A HEAD answer has no body; the stream's would desynchronize the connection."""
    async with http.head("/v1/events/stream") as resp:
        assert resp.status == 405 and "HEAD" not in resp.headers["Allow"]
    async with http.get("/healthz") as after:  # the same connection still reads answers
        assert after.status == 200


async def test_an_unmounted_swarm_path_is_the_json_404(http: aiohttp.ClientSession) -> None:
    """/swarm routes answer in the swarm protocol's own error object when mounted; a path
    there that matches nothing is an unknown route like any other."""
    async with http.get("/swarm/info") as resp:
        body = await resp.json()
    assert (resp.status, body["error"]["code"]) == (404, "not_found")


async def test_an_exception_escaping_a_route_is_the_json_internal_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = web.Application(middlewares=[error_middleware(Metrics(), MAX_BODY)])

    async def broken(_: web.Request) -> web.Response:
        raise RuntimeError("secret detail")

    app.router.add_get("/broken", broken)
    async with TestServer(app) as server, TestClient(server) as client:
        resp = await client.get("/broken")
        body = await resp.json()
    assert resp.status == 500
    assert body == {
        "error": {
            "code": "internal_error",
            "message": "internal error; see the coordinator log",
            "details": {},
        }
    }
    assert "secret detail" in caplog.text  # logged, never answered
