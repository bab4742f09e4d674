"""A request head over its limits or not HTTP/1.1 at all (issue 22, part 2): the coordinator's
HTTP port answers in the one JSON error shape, never aiohttp's plain text, with 414 for a
long request target, 431 for a long or too many header fields, 400 for a malformed head, and
keeps serving. Raw sockets, so that the test controls every byte the server reads.

These also pin the aiohttp hook request_head.py relies on (RequestHandler.handle_error
installed through AppRunner._make_server): if aiohttp stops calling it, the answers past the
parser's caps turn plain text and these tests fail.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from apiary.server.coordinator import Coordinator
from apiary.server.http.request_head import (
    MAX_FIELD_BYTES,
    MAX_FIELDS,
    MAX_TARGET_BYTES,
    PARSER_FIELD_CAP,
    PARSER_LINE_CAP,
)

WAIT_S = 10.0


async def _exchange(coordinator: Coordinator, head: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `head` on a fresh connection; the status, headers and body of the answer (the
    server closes the connection after it: every request here asks it to)."""
    host, port = str(coordinator.http_address).rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), WAIT_S)
    finally:
        writer.close()
        await writer.wait_closed()
    head_part, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head_part.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    return int(status_line.split(" ")[1]), headers, body


def _get(target: str = "/healthz", fields: list[tuple[str, str]] | None = None) -> bytes:
    lines = [f"GET {target} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in fields or []]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _field_of_size(size: int, name: str = "X-Pad") -> tuple[str, str]:
    """A header whose name and value together are `size` bytes (as the limit counts)."""
    return name, "v" * (size - len(name))


def _target_of_size(size: int) -> str:
    prefix = "/healthz?pad="
    return prefix + "p" * (size - len(prefix))


def _error(headers: dict[str, str], body: bytes) -> dict[str, Any]:
    assert headers["content-type"].startswith("application/json"), body[:200]
    error: dict[str, Any] = json.loads(body)["error"]
    assert set(error) == {"code", "message", "details"}
    return error


async def _still_serving(coordinator: Coordinator) -> None:
    status, _, body = await _exchange(coordinator, _get())
    assert status == 200 and json.loads(body)["status"] == "ok"


@pytest.mark.parametrize("size", [MAX_FIELD_BYTES - 1, MAX_FIELD_BYTES])
async def test_a_header_field_up_to_the_limit_is_served(
    coordinator: Coordinator, size: int
) -> None:
    status, _, body = await _exchange(coordinator, _get(fields=[_field_of_size(size)]))
    assert status == 200, body


async def test_a_header_field_past_the_limit_is_431_naming_it(coordinator: Coordinator) -> None:
    status, headers, body = await _exchange(
        coordinator, _get(fields=[_field_of_size(MAX_FIELD_BYTES + 1, "X-Too-Long")])
    )
    error = _error(headers, body)
    assert status == 431
    assert error["code"] == "validation_error"
    assert error["details"] == {
        "field": "headers",
        "header": "X-Too-Long",
        "limit": str(MAX_FIELD_BYTES),
    }
    assert str(MAX_FIELD_BYTES + 1) in error["message"]
    await _still_serving(coordinator)


async def test_a_header_field_past_the_parsers_cap_is_431(
    coordinator: Coordinator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    status, headers, body = await _exchange(
        coordinator, _get(fields=[_field_of_size(2 * PARSER_FIELD_CAP)])
    )
    error = _error(headers, body)
    assert status == 431 and error["code"] == "validation_error"
    assert error["details"] == {"field": "headers", "limit": str(MAX_FIELD_BYTES)}
    # One line, no traceback, and the line does not carry the client's 16 KB.
    assert not [r for r in caplog.records if r.exc_info]
    assert all(len(r.getMessage()) < 1024 for r in caplog.records)
    await _still_serving(coordinator)


async def test_header_fields_up_to_the_count_limit_are_served(coordinator: Coordinator) -> None:
    # Host and Connection are two of them.
    fields = [(f"X-F{i}", "1") for i in range(MAX_FIELDS - 2)]
    status, _, body = await _exchange(coordinator, _get(fields=fields))
    assert status == 200, body


async def test_too_many_header_fields_is_431(coordinator: Coordinator) -> None:
    fields = [(f"X-F{i}", "1") for i in range(MAX_FIELDS - 1)]
    status, headers, body = await _exchange(coordinator, _get(fields=fields))
    error = _error(headers, body)
    assert status == 431
    assert error["code"] == "validation_error"
    assert error["details"] == {"field": "headers", "limit": str(MAX_FIELDS)}
    await _still_serving(coordinator)


@pytest.mark.parametrize("size", [MAX_TARGET_BYTES - 1, MAX_TARGET_BYTES])
async def test_a_request_target_up_to_the_limit_is_served(
    coordinator: Coordinator, size: int
) -> None:
    status, _, body = await _exchange(coordinator, _get(_target_of_size(size)))
    assert status == 200, body


@pytest.mark.parametrize(
    ("size", "said"), [(MAX_TARGET_BYTES + 1, str(MAX_TARGET_BYTES + 1)), (2 * PARSER_LINE_CAP, "")]
)
async def test_a_request_target_past_the_limit_is_414(
    coordinator: Coordinator, size: int, said: str
) -> None:
    status, headers, body = await _exchange(coordinator, _get(_target_of_size(size)))
    error = _error(headers, body)
    assert status == 414
    assert error["code"] == "validation_error"
    assert error["details"] == {"field": "request_target", "limit": str(MAX_TARGET_BYTES)}
    assert said in error["message"]
    assert len(body) < 1024  # the answer does not echo the target
    await _still_serving(coordinator)


@pytest.mark.parametrize(
    "head",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /healthz HTTP/9.9\r\nHost: 127.0.0.1\r\n\r\n",
        b"G\x00T /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nNo colon here\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Name: 1\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\n\r\n",  # HTTP/1.1 requires Host
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40,  # TLS on the HTTP port
    ],
    ids=["not-http", "version", "nul-in-method", "no-colon", "space-in-name", "no-host", "tls"],
)
async def test_a_malformed_head_is_400_validation_error(
    coordinator: Coordinator, head: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    status, headers, body = await _exchange(coordinator, head)
    error = _error(headers, body)
    assert status == 400
    assert error["code"] == "validation_error"
    assert error["details"] == {"field": "request"}
    assert len(error["message"]) < 256
    assert not [r for r in caplog.records if r.exc_info]
    await _still_serving(coordinator)
