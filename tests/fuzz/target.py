"""The coordinator under fuzzing, and what counts as a fault in its answers.

Each call is made the way a client makes it (real gRPC and HTTP on 127.0.0.1) and reduced to
an `Answer`; `fault` says what is wrong with one, None when it is a specific error or a
success. A fault is: gRPC UNKNOWN or INTERNAL, or any refusal without Apiary's error trailer
(grpc's own failures: oversized trailers, a crashed handler); HTTP 500 or internal_error, or
an error that is not the one JSON shape with a snake_case code.

Waiting is bounded, never slept: a server stream is read until its first item or for
STREAM_WINDOW_S (a stream with nothing to say yet is not a fault), a unary call for
CALL_TIMEOUT_S (blocking methods such as WaitForDecision wait for what they were asked).
"""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from yarl import URL

from apiary.server.coordinator import Coordinator
from apiary.wire import pb
from apiary.wire.errordetail import ERROR_TRAILER
from apiary.wire.services import SERVICES, RpcMethod
from tests.fuzz.strategies import KNOWN_AGENTS

CALL_TIMEOUT_S = 3.0
STREAM_WINDOW_S = 0.2
CLIENT_SIDE = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED})
"""Statuses a client's own deadline or cancellation produce: no trailer is expected."""
CLIENT_WRITE_RACE = "CLIENT_WRITE_RACE"
WRITE_RACE = 'Failed "execute_batch"'
"""grpc.aio's client, writing a client stream's next frame after the server ended the call
(an early refusal), reports INTERNAL "Internal error from Core" in place of the status the
server sent (grpc/grpc issue 36066): the server's answer was right, the client lost it."""
CHANNEL_OPTIONS = (("grpc.max_receive_message_length", 20 * 1024 * 1024),)
"""The client takes what the server may send (20 MB, not grpc's default 4 MB): an answer the
client refuses by size is the client's limit, not the server's fault."""
METHODS: tuple[RpcMethod, ...] = tuple(m for methods in SERVICES.values() for m in methods)
"""Every served method: the canonical services and apiary.v1."""


@dataclass(frozen=True, slots=True)
class Answer:
    """One call's outcome: `status` is the gRPC status name or the HTTP status; `code` the
    protocol error code the answer carried ("" when none); `body` what came back, cut."""

    transport: str
    target: str
    status: str
    code: str = ""
    message: str = ""
    trailer: bool = False
    body: str = ""

    def __str__(self) -> str:
        return (
            f"{self.transport} {self.target} -> {self.status} {self.code} "
            f"{self.message[:300]!r} {self.body[:300]!r}"
        )


def fault(answer: Answer) -> str | None:
    """What is wrong with `answer`, or None when it is a success or a specific error."""
    if answer.transport == "grpc":
        if answer.status in ("UNKNOWN", "INTERNAL") or answer.code == "internal_error":
            return "internal error"
        if answer.status not in ("OK", "TIMEOUT", CLIENT_WRITE_RACE) and not answer.trailer:
            client_side = {s.name for s in CLIENT_SIDE}
            if answer.status not in client_side:
                return "refusal without the error trailer (not an Apiary answer)"
        return None
    if answer.status == "500" or answer.code == "internal_error":
        return "internal error"
    head = answer.target.startswith("HEAD ")  # an answer without a body: the status only
    if answer.status.isdigit() and int(answer.status) >= 400 and not head:
        if not answer.code:
            return "error not in the JSON error shape"
        if answer.code != answer.code.lower():
            return f"error code {answer.code!r} is not snake_case"
    return None


def _grpc_answer(method: RpcMethod, exc: grpc.aio.AioRpcError) -> Answer:
    code, trailer = "", False
    for key, value in exc.trailing_metadata() or ():
        if key == ERROR_TRAILER and isinstance(value, bytes):
            detail = pb.apiary_pb2.ErrorDetail.FromString(value)
            code, trailer = detail.error_code, True
    status = exc.code().name
    if not trailer and WRITE_RACE in (exc.debug_error_string() or ""):
        status = CLIENT_WRITE_RACE
    return Answer("grpc", method.path, status, code, exc.details() or "", trailer)


class FuzzTarget:
    """One running coordinator and clients of both its ports."""

    def __init__(
        self, coordinator: Coordinator, channel: grpc.aio.Channel, http: aiohttp.ClientSession
    ) -> None:
        self.coordinator = coordinator
        self.channel = channel
        self.http = http
        self.baseline_rss = resident_bytes()
        """The process's RSS before fuzzing (reset once the fixture has set up)."""

    async def assert_still_serving(self, rss_growth_limit: int) -> None:
        """After fuzzing: health is SERVING and the process grew by less than the limit."""
        assert await self.serving()
        growth = resident_bytes() - self.baseline_rss
        assert growth < rss_growth_limit, f"RSS grew by {growth / 2**20:.0f} MiB"

    # ------------------------------------------------------------------------------ gRPC

    async def grpc(self, method: RpcMethod, frames: Sequence[bytes]) -> Answer:
        """Call `method` with raw request bytes (one frame, or several for a client stream)."""
        try:
            if method.client_streaming:
                return await self._grpc_client_stream(method, frames)
            if method.server_streaming:
                return await self._grpc_server_stream(method, frames[0])
            call = self.channel.unary_unary(method.path)
            await call(frames[0], timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            return _grpc_answer(method, exc)
        return Answer("grpc", method.path, "OK")

    async def _grpc_server_stream(self, method: RpcMethod, request: bytes) -> Answer:
        call = self.channel.unary_stream(method.path)(request)
        try:
            await asyncio.wait_for(call.read(), STREAM_WINDOW_S)  # an error status raises
        except TimeoutError:
            return Answer("grpc", method.path, "TIMEOUT")
        finally:
            call.cancel()
        return Answer("grpc", method.path, "OK")

    async def _grpc_client_stream(self, method: RpcMethod, frames: Sequence[bytes]) -> Answer:
        async def requests() -> AsyncIterator[bytes]:
            for frame in frames:
                yield frame

        call = self.channel.stream_stream(method.path)(requests())
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                async for _ in call:
                    pass
        except TimeoutError:
            return Answer("grpc", method.path, "TIMEOUT")
        finally:
            call.cancel()
        return Answer("grpc", method.path, "OK")

    # ------------------------------------------------------------------------------ HTTP

    async def gateway(self, method: RpcMethod, body: bytes) -> Answer:
        """POST a body to the gateway's route of `method`."""
        window = STREAM_WINDOW_S if method.server_streaming else CALL_TIMEOUT_S
        return await self.request("POST", f"/v1{method.path}", body=body, window=window)

    async def request(
        self,
        verb: str,
        path: str,
        *,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        params: dict[str, str] | None = None,
        window: float = CALL_TIMEOUT_S,
    ) -> Answer:
        """One HTTP request; a streamed answer is judged by its status and first line."""
        target = f"{verb} {path}"
        # Sent as given (percent-encoded by the caller); "//x" would name a host.
        url = URL("/" + path.lstrip("/"), encoded=True)
        try:
            async with (
                asyncio.timeout(window),
                self.http.request(
                    verb, url, data=body, headers=headers, params=params, allow_redirects=False
                ) as resp,
            ):
                status = str(resp.status)
                kind = resp.headers.get("Content-Type", "")
                if kind.startswith(("application/x-ndjson", "text/event-stream")):
                    return _streamed(target, status, await resp.content.readline())
                return _answered(target, status, await resp.read())
        except TimeoutError:
            return Answer("http", target, "TIMEOUT")

    # ------------------------------------------------------------------------------ after

    async def serving(self) -> bool:
        """Health says SERVING on gRPC and the HTTP port answers /healthz and /readyz."""
        stub = health_pb2_grpc.HealthStub(self.channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        async with self.http.get("/healthz") as health, self.http.get("/readyz") as ready:
            http_ok = health.status == 200 and ready.status == 200
        return reply.status == health_pb2.HealthCheckResponse.SERVING and http_ok

    async def register_known_agents(self) -> None:
        stub = pb.registry_pb2_grpc.RegistryServiceStub(self.channel)
        for agent_id in KNOWN_AGENTS:
            descriptor = pb.registry_pb2.AgentDescriptor(
                agent_id=agent_id, name=agent_id, reasoning_connectors=["builtin://rules"],
                modalities_supported=["application/json", "text/plain"],
            )  # fmt: skip
            reply = await stub.RegisterAgent(pb.registry_pb2.RegisterAgentRequest(agent=descriptor))
            assert reply.accepted, reply.reason


def _answered(target: str, status: str, raw: bytes) -> Answer:
    text = raw.decode("utf-8", "replace")
    if int(status) < 400:
        return Answer("http", target, status, body=text)
    code, message = _error_of(raw)
    return Answer("http", target, status, code, message, body=text)


def _streamed(target: str, status: str, line: bytes) -> Answer:
    """A stream's first line: an error line carries its code; data lines are a success."""
    if line.startswith(b"{"):
        try:
            document = json.loads(line)
        except ValueError:
            return Answer("http", target, "500", body=line.decode("utf-8", "replace"))
        if isinstance(document, dict) and "error" in document:
            error = document["error"]
            return Answer("http", target, status, str(error.get("code", "")), body=str(line))
    return Answer("http", target, status, body=line.decode("utf-8", "replace"))


def _error_of(raw: bytes) -> tuple[str, str]:
    """The code and message of the one JSON error shape, ("", "") for anything else."""
    try:
        document: Any = json.loads(raw)
    except ValueError:
        return "", ""
    error = document.get("error") if isinstance(document, dict) else None
    if not isinstance(error, dict) or set(error) != {"code", "message", "details"}:
        return "", ""
    return str(error["code"]), str(error["message"])


def resident_bytes() -> int:
    """This process's resident set size (Linux /proc), after a full collection."""
    gc.collect()
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")
