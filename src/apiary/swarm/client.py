"""The HTTP client side of the protocol: POST /message and /join, GET /info and /health at a
peer's endpoint, with the headers every request carries (INTEROP.md):
Content-Type: application/json, X-Agent-ID, X-Swarm-Protocol: 0.1.0."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from apiary.swarm.wire import PROTOCOL_VERSION


@dataclass(frozen=True, slots=True)
class Reply:
    """A peer's answer; status 0 when none came (`error` says why)."""

    status: int
    body: dict[str, Any] = field(default_factory=dict)
    retry_after_s: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def problem(self) -> str:
        """What went wrong, for people: the peer's error message or the transport's."""
        if self.error:
            return self.error
        error = self.body.get("error")
        if isinstance(error, dict):
            return f"HTTP {self.status} {error.get('code', '')}: {error.get('message', '')}"
        return f"HTTP {self.status}"


class SwarmClient:
    def __init__(self, session: aiohttp.ClientSession, agent_id: str) -> None:
        self._session = session
        self._headers = {
            "Content-Type": "application/json",
            "X-Agent-ID": agent_id,
            "X-Swarm-Protocol": PROTOCOL_VERSION,
        }

    async def post(self, url: str, body: dict[str, Any]) -> Reply:
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        return await self._call("POST", url, data)

    async def get(self, url: str) -> Reply:
        return await self._call("GET", url, None)

    async def _call(self, method: str, url: str, data: bytes | None) -> Reply:
        try:
            async with self._session.request(
                method, url, data=data, headers=self._headers
            ) as response:
                raw = await response.read()
                return Reply(response.status, _json(raw), _retry_after(response.headers))
        except (TimeoutError, aiohttp.ClientError, ssl.SSLError, OSError) as exc:
            return Reply(0, error=f"{method} {url}: {type(exc).__name__}: {exc}")


def _json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _retry_after(headers: Any) -> float:
    try:
        return max(0.0, float(headers.get("Retry-After", 0)))
    except ValueError:
        return 0.0  # an HTTP date: the existing implementation's defect; treated as unknown


@asynccontextmanager
async def open_swarm_client(
    agent_id: str, ssl_context: ssl.SSLContext, timeout_s: float = 10.0
) -> AsyncIterator[SwarmClient]:
    """A client over one connection pool, closed on exit."""
    connector = aiohttp.TCPConnector(ssl=ssl_context, limit=32)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        yield SwarmClient(session, agent_id)
