"""The runtime control plane's channel over a WebSocket, against a real coordinator (HTTP
socket, an SDK agent over gRPC): the snapshot first, then the session's events with the
same sequence numbers as the server-sent stream, live; acknowledgements on the socket;
every message the server cannot take answered with an error naming what is wrong while the
socket stays open; refusals before the upgrade in the one JSON error shape, in dev mode and
in secure mode. Every event and snapshot is validated against the contract's schemas."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from apiary.server.auth.settings import AuthSettings
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from tests.server.runtime_harness import (
    WAIT_S,
    Answerer,
    RuntimeHttp,
    check_event,
    check_snapshot,
    session_events,
)

AGENT = "answerer"
UPGRADE = {
    "Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
}  # fmt: skip
"""A WebSocket handshake's headers, sent by hand to read the refusal's body."""


def _socket_path(session_id: str, **query: Any) -> str:
    shown = "&".join(f"{k}={v}" for k, v in query.items())
    return f"/runtime/v1/sessions/{session_id}/socket" + (f"?{shown}" if shown else "")


async def _receive(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    message = await asyncio.wait_for(ws.receive(), WAIT_S)
    assert message.type is aiohttp.WSMsgType.TEXT, message
    doc: dict[str, Any] = message.json()
    return doc


async def test_the_socket_sends_the_snapshot_then_events_live_and_takes_acks(
    coordinator: Coordinator, runtime: RuntimeHttp, answerer: Answerer
) -> None:
    first = await runtime.ok("submit_turn", agent_id=AGENT, turn_id="w-1", input="one")
    session_id = first["sessionId"]
    await runtime.thread_status(first["threadId"], "completed")
    logged = await session_events(coordinator, session_id)
    async with runtime.http.ws_connect(_socket_path(session_id, after=0)) as ws:
        snapshot = await _receive(ws)
        assert snapshot["type"] == "snapshot" and snapshot["after"] == 0
        check_snapshot(snapshot["snapshot"])
        channel = snapshot["channel"]
        # The replay: the session's events in order, with the stream's sequence numbers.
        replayed = [await _receive(ws) for _ in logged]
        assert [m["type"] for m in replayed] == ["event"] * len(logged)
        assert [m["id"] for m in replayed] == [e["sequence"] for e in logged]
        for message in replayed:
            check_event(message["event"])
            assert message["event"]["sequence"] == message["id"]
        # Live: a turn submitted now comes over the socket as it happens.
        await runtime.ok("submit_turn", thread_id=first["threadId"], turn_id="w-2", input="two")
        live: list[dict[str, Any]] = []
        while not live or live[-1]["event"]["type"] != "turn.completed":
            message = await _receive(ws)
            if message["type"] == "event" and message["event"]["type"] == "channel.resumed":
                continue
            live.append(message)
        assert live[-1]["event"]["turnId"] == "w-2"
        assert live[0]["id"] > replayed[-1]["id"]
        # Acknowledged on the socket: the channel holds the position.
        await ws.send_json({"type": "ack", "sequence": live[-1]["id"]})
        acked = await _receive(ws)
        while acked["type"] == "event":  # events may still come between
            acked = await _receive(ws)
        assert acked["type"] == "acked"
        assert acked["channel"]["channelId"] == channel["channelId"]
        assert acked["channel"]["acknowledgedSequence"] == live[-1]["id"]


async def test_a_message_the_socket_cannot_take_is_answered_and_the_socket_stays_open(
    coordinator: Coordinator, runtime: RuntimeHttp, answerer: Answerer
) -> None:
    made = await runtime.ok("submit_turn", agent_id=AGENT, turn_id="b-1", input="one")
    await runtime.thread_status(made["threadId"], "completed")
    top = (await session_events(coordinator, made["sessionId"]))[-1]["sequence"]
    async with runtime.http.ws_connect(_socket_path(made["sessionId"])) as ws:
        assert (await _receive(ws))["type"] == "snapshot"

        async def answer_to(send: Any) -> dict[str, Any]:
            await send
            while (message := await _receive(ws))["type"] == "event":
                pass
            return message

        for send, field in [
            (ws.send_bytes(b"\x00\x01"), "message"),
            (ws.send_str("not json"), "message"),
            (ws.send_json({"type": "subscribe"}), "type"),
            (ws.send_json(["ack", 1]), "type"),
            (ws.send_json({"type": "ack"}), "sequence"),
            (ws.send_json({"type": "ack", "sequence": "5"}), "sequence"),
            (ws.send_json({"type": "ack", "sequence": True}), "sequence"),
            (ws.send_json({"type": "ack", "sequence": top + 1000}), None),
        ]:
            error = await answer_to(send)
            assert error["type"] == "error" and error["code"] == "validation_error", error
            if field is not None:
                assert error["details"]["field"] == field, error
        # Still open: an acknowledgement within the log is taken.
        acked = await answer_to(ws.send_json({"type": "ack", "sequence": top}))
        assert acked["type"] == "acked" and acked["channel"]["acknowledgedSequence"] == top


async def test_refusals_before_the_upgrade_are_json_errors(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    path = _socket_path("no-such-session")
    async with runtime.http.get(path, headers=UPGRADE) as got:
        assert got.status == 404
        assert (await got.json())["error"]["details"]["field"] == "session_id"
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await runtime.http.ws_connect(_socket_path("no-such-session", keepalive="x"))
    assert refused.value.status == 400


async def test_in_secure_mode_an_anonymous_socket_is_refused(tmp_path: Path) -> None:
    async with (
        open_test_coordinator(tmp_path, auth=AuthSettings(secure=True)) as secure,
        aiohttp.ClientSession(base_url=f"http://{secure.http_address}") as http,
    ):
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(_socket_path("any-session"))
        assert refused.value.status == 401
