"""A coordinator in secure mode with a credential per principal the access tests act as, and
how to call any method as any of them over real gRPC."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import Message

from apiary.core.access.principal import PrincipalKind
from apiary.server.auth.keys import KeyRing, credentials_path
from apiary.server.auth.settings import AuthSettings
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.wire.services import RpcMethod

PRINCIPALS: dict[str, tuple[PrincipalKind, str, tuple[str, ...]]] = {
    "alice": (PrincipalKind.AGENT, "alice", ()),
    "bob": (PrincipalKind.AGENT, "bob", ()),
    "mallory": (PrincipalKind.AGENT, "mallory", ()),
    "app": (PrincipalKind.APPLICATION, "ci", ()),
    "no-role": (PrincipalKind.OPERATOR, "olivia", ()),
    "root": (PrincipalKind.OPERATOR, "root", ("admin",)),
}


@dataclass
class Secure:
    coordinator: Coordinator
    channel: grpc.aio.Channel
    keys: dict[str, str]
    """The API key of each name of PRINCIPALS."""

    def metadata(self, who: str | None) -> tuple[tuple[str, str], ...]:
        return () if who is None else (("authorization", f"Bearer {self.keys[who]}"),)

    async def call(self, method: RpcMethod, request: Message, who: str | None) -> Any:
        """Call `method` as `who` (None: anonymous); the first answer of a stream."""
        path = method.path
        serialize = method.request_type.SerializeToString
        parse = method.response_type.FromString
        metadata = self.metadata(who)
        if method.client_streaming:
            call = self.channel.stream_stream(path, serialize, parse)(
                iter([request]), metadata=metadata, timeout=10
            )
            return await call.read()
        if method.server_streaming:
            call = self.channel.unary_stream(path, serialize, parse)(
                request, metadata=metadata, timeout=10
            )
            return await call.read()
        return await self.channel.unary_unary(path, serialize, parse)(
            request, metadata=metadata, timeout=10
        )


@asynccontextmanager
async def open_secure(tmp_path: Path, **auth: Any) -> AsyncIterator[Secure]:
    ring = KeyRing(credentials_path(tmp_path))
    keys = {
        name: ring.create(kind, principal, roles=roles, now=time.time())[1]
        for name, (kind, principal, roles) in PRINCIPALS.items()
    }
    async with (
        open_test_coordinator(tmp_path, auth=AuthSettings(secure=True, **auth)) as coordinator,
        grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel,
    ):
        yield Secure(coordinator, channel, keys)


def set_path(message: Message, path: str, value: str) -> None:
    """Set the string field at a rule's subject path (`items[].msg.producer_id` adds one
    item) in `message`."""
    head, _, rest = path.partition(".")
    if head.endswith("[]"):
        item = getattr(message, head[:-2]).add()
        set_path(item, rest, value)
    elif rest:
        set_path(getattr(message, head), rest, value)
    else:
        setattr(message, head, value)
