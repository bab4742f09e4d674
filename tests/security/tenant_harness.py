"""A secure coordinator whose principals live in two tenants, acme and globex, beside a global
operator in the default tenant; how to call any method as any of them over real gRPC, and
how to compare a refusal with the one for an object that does not exist (RFC 6.5, DESIGN.md
section 9: another tenant's objects answer exactly like missing ones)."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import psycopg
from google.protobuf import text_format
from google.protobuf.message import Message
from psycopg import sql

from apiary.core.access.principal import TENANT_KEY, PrincipalKind
from apiary.engine.assembly import Runtime
from apiary.engine.hitl import HitlSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.engine.worktrees.settings import WorktreeSettings
from apiary.server.auth.keys import KeyRing, credentials_path
from apiary.server.auth.settings import AuthSettings
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.store.open import tenant_schema
from apiary.wire import pb
from apiary.wire.errordetail import ERROR_TRAILER
from apiary.wire.services import SERVICES, RpcMethod

ACME = "acme"
GLOBEX = "globex"
TENANTS = (ACME, GLOBEX)
"""The tenants the credentials name (each gets its engine and store when the coordinator
starts)."""
WAIT_S = 10.0
"""Bound on every wait for the server: generous, since nothing here waits on time."""

PRINCIPALS: dict[str, tuple[PrincipalKind, str, str, tuple[str, ...]]] = {
    "alice@acme": (PrincipalKind.AGENT, "alice", ACME, ()),
    "app@acme": (PrincipalKind.APPLICATION, "app", ACME, ()),
    "ops@acme": (PrincipalKind.OPERATOR, "ops", ACME, ("admin",)),
    "bob@globex": (PrincipalKind.AGENT, "bob", GLOBEX, ()),
    "alice@globex": (PrincipalKind.AGENT, "alice", GLOBEX, ()),
    "ops@globex": (PrincipalKind.OPERATOR, "ops", GLOBEX, ("admin",)),
    "root@default": (PrincipalKind.OPERATOR, "root", "default", ("admin", "tenants")),
    "auditor@default": (PrincipalKind.OPERATOR, "auditor", "default", ("events",)),
}
"""Who the tests act as, by 'name@tenant': kind, principal name, tenant, roles. The operators
of acme and globex are admins of their own tenant only; root is the global operator (an
admin of the default tenant holds every role, `tenants` included); the auditor reads the
default tenant's event log and acts in no other tenant."""

HITL = HitlSettings(operators=(OperatorEntry("hitl", token_digest(secrets.token_hex(16))),))
"""A HITL component exists (an operator is configured; its token is thrown away), so that an
invocation waits for an operator's decision instead of being decided by policy at once
(RFC 15.3)."""

_METHODS = {m.path: m for methods in SERVICES.values() for m in methods}


def method(name: str) -> RpcMethod:
    """The method 'Service/Method' names (its package left out: 'DiscoveryService/GetAgent')."""
    found = [m for path, m in _METHODS.items() if path.endswith(f".{name}")]
    if len(found) != 1:
        raise KeyError(f"{name!r} names {len(found)} methods")
    return found[0]


@dataclass(frozen=True)
class Refusal:
    """What a failed call answers: gRPC status, protocol error code, message and details."""

    status: grpc.StatusCode
    code: str
    message: str
    details: dict[str, str]

    def naming(self, *values: str) -> Refusal:
        """The refusal with each of `values` (the ids the request named) written as '<id>':
        what a refusal naming other ids must equal for the two to be indistinguishable."""
        return Refusal(
            self.status,
            self.code,
            without(self.message, values),
            {key: without(value, values) for key, value in self.details.items()},
        )


def without(text: str, values: Iterable[str]) -> str:
    """`text` with each of `values` written as '<id>'."""
    for value in values:
        text = text.replace(value, "<id>")
    return text


def refusal_of(error: grpc.aio.AioRpcError) -> Refusal:
    for key, value in error.trailing_metadata() or ():
        if key == ERROR_TRAILER and isinstance(value, bytes):
            detail = pb.apiary_pb2.ErrorDetail.FromString(value)
            return Refusal(error.code(), detail.error_code, detail.message, dict(detail.details))
    raise AssertionError(f"no {ERROR_TRAILER} trailer on {error}")


@dataclass
class Tenants:
    """A running secure coordinator, a channel to it, and every principal's key."""

    coordinator: Coordinator
    channel: grpc.aio.Channel
    keys: dict[str, str]
    """The API key of each name of PRINCIPALS."""

    def metadata(self, who: str, tenant: str = "") -> tuple[tuple[str, str], ...]:
        """`who`'s credential, and the tenant it names with `apiary-tenant` when `tenant`."""
        found = (("authorization", f"Bearer {self.keys[who]}"),)
        return (*found, (TENANT_KEY, tenant)) if tenant else found

    def add_key(self, kind: PrincipalKind, who: str) -> None:
        """A key made while the coordinator runs for the principal `who` ('name@tenant'), as
        `apiary auth` makes one; the coordinator reads the key ring afresh."""
        name, _, tenant = who.partition("@")
        ring = KeyRing(credentials_path(self.coordinator.config.data_dir))
        self.keys[who] = ring.create(kind, name, tenant=tenant, now=time.time())[1]

    async def call(self, name: str, request: Message, who: str, *, tenant: str = "") -> Any:
        """Call the method `name` names as `who` (acting in `tenant` when it is given); the
        answer, or a stream's first item."""
        rpc = method(name)
        metadata = self.metadata(who, tenant)
        serialize, parse = rpc.request_type.SerializeToString, rpc.response_type.FromString
        if rpc.client_streaming:
            stream = self.channel.stream_stream(rpc.path, serialize, parse)(
                iter([request]), metadata=metadata, timeout=WAIT_S
            )
            return await stream.read()
        if rpc.server_streaming:
            call = self.channel.unary_stream(rpc.path, serialize, parse)(
                request, metadata=metadata, timeout=WAIT_S
            )
            return await call.read()
        return await self.channel.unary_unary(rpc.path, serialize, parse)(
            request, metadata=metadata, timeout=WAIT_S
        )

    async def refused(self, name: str, request: Message, who: str, *, tenant: str = "") -> Refusal:
        """The refusal of a call that must fail."""
        try:
            answer = await self.call(name, request, who, tenant=tenant)
        except grpc.aio.AioRpcError as exc:
            return refusal_of(exc)
        raise AssertionError(f"{name} as {who} answered {answer!r}, not an error")

    async def shape(
        self, name: str, request: Message, who: str, *ids: str, tenant: str = ""
    ) -> Refusal | str:
        """What the call answers with each of `ids` written as '<id>': the refusal, or the
        answer's text. Two calls naming different objects are indistinguishable to the
        caller exactly when their shapes are equal."""
        try:
            answer = await self.call(name, request, who, tenant=tenant)
        except grpc.aio.AioRpcError as exc:
            return refusal_of(exc).naming(*ids)
        return without(text_format.MessageToString(answer), ids)

    def stream(self, name: str, request: Message, who: str) -> Any:
        """A server stream of `name` opened as `who` (cancel it when done)."""
        rpc = method(name)
        return self.channel.unary_stream(
            rpc.path, rpc.request_type.SerializeToString, rpc.response_type.FromString
        )(request, metadata=self.metadata(who))


def create_keys(data_dir: Path) -> dict[str, str]:
    """An API key for every principal of PRINCIPALS, in `data_dir`'s key ring."""
    ring = KeyRing(credentials_path(data_dir))
    return {
        who: ring.create(kind, name, tenant=tenant, roles=roles, now=time.time())[1]
        for who, (kind, name, tenant, roles) in PRINCIPALS.items()
    }


@asynccontextmanager
async def open_tenants(
    data_dir: Path,
    store: str,
    keys: dict[str, str] | None = None,
    worktrees: WorktreeSettings | None = None,
) -> AsyncIterator[Tenants]:
    """A secure coordinator over `store` (a `--store` URL; "" for DATA_DIR/apiary.db) whose
    key ring holds `keys`, made afresh when None (a restart passes the keys it made), with
    the `[worktrees]` table `worktrees`."""
    keys = keys if keys is not None else create_keys(data_dir)
    async with (
        open_test_coordinator(
            data_dir,
            store=store,
            runtime=Runtime(hitl=HITL),
            auth=AuthSettings(secure=True),
            worktrees=worktrees,
        ) as running,
        grpc.aio.insecure_channel(str(running.grpc_address)) as channel,
    ):
        yield Tenants(running, channel, keys)


def postgres_url(dsn: str, schema: str) -> str:
    """The `--store` URL of `dsn` with its schema named."""
    separator = "&" if "?" in dsn else "?"
    return f"{dsn}{separator}apiary_schema={schema}&connect_timeout=5"


def tenant_schemas(base: str, tenants: Iterable[str] = TENANTS) -> list[str]:
    return [tenant_schema(base, tenant) for tenant in tenants]


def existing_schemas(dsn: str, names: Iterable[str]) -> set[str]:
    with psycopg.connect(dsn, connect_timeout=5) as conn:
        rows = conn.execute(
            "SELECT schema_name FROM information_schema.schemata WHERE schema_name = ANY(%s)",
            (list(names),),
        ).fetchall()
    return {row[0] for row in rows}


def drop_schemas(dsn: str, names: Iterable[str]) -> None:
    with psycopg.connect(dsn, connect_timeout=5, autocommit=True) as conn:
        for name in names:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


async def items_until(call: Any, marker: str) -> list[Any]:
    """The StreamItems an inbox stream delivers (coordinator notices left out) up to and
    including the message `marker`: the inbox is FIFO, so anything that reached it before
    the marker is among them."""
    found: list[Any] = []
    while not found or found[-1].msg.message_id != marker:
        item = await asyncio.wait_for(call.read(), WAIT_S)
        assert item is not grpc.aio.EOF, "the stream ended"
        if item.msg.producer_id != "coordinator":
            found.append(item)
    return found
