"""Three `apiary serve --cluster` replicas on one PostgreSQL schema, and a load of SDK
producers and agents spread over them, for the failover tests (test_cluster_failover.py).

Each replica listens on a port fixed for the test, so that it can be stopped and started
again at the address the clients were given. Every client is given all three addresses,
its own replica first (`host:port,host:port,...`): when its replica goes, its channel moves
to the next one it reaches, and an agent's stream reconnects and registers there.

The load: each producer sends to each agent, one message at a time per pair, each message
with an idempotency token of its own. A send that fails without an answer (`unavailable`:
its replica went away mid-call) is sent again with the same token (a new message id, as
`Connection.retry` makes it) until the cluster answers; an answer that the token is already
in progress or done names the message that was admitted, which is what the send admitted.
The agents acknowledge each data message FULFILLED as it arrives, and keep every delivery.
What the checks then hold the cluster to is in `Load.check`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import sys
from asyncio.subprocess import Process
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql

from apiary.core.envelope import AckStage, Envelope, MessageType
from apiary.errors import AlreadyInProgressError, ApiaryError, DuplicateDetectedError
from apiary.sdk.connection import Connection
from apiary.sdk.errors import CoordinatorUnreachableError

APIARY = [sys.executable, "-m", "apiary.cli.main"]
ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 60.0
LEASE_S = 1.0
"""The cluster's `lease_s`: a dead replica's partitions are taken over within it."""
PARTITIONS = 16
RESEND_PAUSE_S = 0.05
UNANSWERED = frozenset({"unavailable", "deadline_exceeded"})
"""Answers that leave a send's outcome unknown (besides no answer at all,
`CoordinatorUnreachableError`): sent again with the same token."""
CLIENT_VARIABLES = (
    "APIARY_COORDINATOR", "APIARY_PROFILE", "APIARY_API_KEY", "APIARY_TLS_CA", "APIARY_TLS_CERT",
    "APIARY_TLS_KEY", "APIARY_SIGNING_KEY", "APIARY_TOKEN", "APIARY_CLIENT_CONFIG",
    "APIARY_DATA_DIR", "APIARY_TENANT", "XDG_CONFIG_HOME", "APIARY_GRPC", "APIARY_HTTP",
    "APIARY_CONFIG", "APIARY_STORE",
)  # fmt: skip


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(tmp_path: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in CLIENT_VARIABLES}
    src = str(ROOT / "src")
    path = os.pathsep.join(p for p in (src, base.get("PYTHONPATH", "")) if p)
    return {**base, "HOME": str(tmp_path / "home"), "PYTHONPATH": path}


class Replica:
    """One `apiary serve --cluster` of the cluster, by its replica id and fixed address."""

    def __init__(self, tmp_path: Path, url: str, replica_id: str) -> None:
        self.replica_id = replica_id
        self.address = f"127.0.0.1:{_port()}"
        self._tmp = tmp_path
        self._url = url
        self._config = tmp_path / f"{replica_id}.toml"
        self._config.write_text(
            "[router]\nack_timeout_s = 120\nbuffer_capacity = 1000000\n"
            f'[cluster]\nreplica_id = "{replica_id}"\nlease_s = {LEASE_S}\n'
            f"partitions = {PARTITIONS}\n"
        )
        self._log = tmp_path / f"{replica_id}.log"
        self.proc: Process | None = None

    async def start(self) -> None:
        """Start it; return once it serves gRPC."""
        with self._log.open("ab") as log:
            proc = await asyncio.create_subprocess_exec(
                *APIARY, "serve", "--cluster", "--store", self._url, "--config",
                str(self._config), "--data-dir", str(self._tmp / self.replica_id),
                "--grpc", self.address, "--http", "127.0.0.1:0", "--log-level", "WARNING",
                env=_env(self._tmp), stdout=asyncio.subprocess.PIPE, stderr=log,
            )  # fmt: skip
        self.proc = proc
        assert proc.stdout is not None
        while True:
            line = (await asyncio.wait_for(proc.stdout.readline(), WAIT_S)).decode()
            assert line, f"{self.replica_id} exited before serving: {self.log_tail()}"
            if line.startswith("grpc="):
                return

    def kill(self) -> None:
        """SIGKILL: it releases nothing, answers nothing more."""
        assert self.proc is not None
        self.proc.kill()

    async def stop(self) -> int:
        """SIGTERM, and its exit status once it has stopped."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.proc.wait(), WAIT_S)

    async def close(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()

    def log_tail(self) -> str:
        return self._log.read_text(errors="replace")[-3000:] if self._log.exists() else ""


@dataclass(frozen=True)
class Seen:
    """One delivery to an agent."""

    agent: str
    producer: str
    n: int
    token: str
    message_id: str


@dataclass
class Load:
    """Producers and agents on the replicas, and what each saw."""

    per_pair: int
    """Messages each producer sends each agent (unless stopped first)."""
    accepted: dict[str, str] = field(default_factory=dict)
    """Token -> the message id the cluster admitted for it."""
    refused: dict[str, str] = field(default_factory=dict)
    """Token -> the error code of a definite refusal."""
    resent: int = 0
    """Sends made again after an unanswered attempt."""
    seen: list[Seen] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    """Set: each pair ends after its current message."""

    @property
    def answered(self) -> int:
        return len(self.accepted) + len(self.refused)

    async def progress(self, count: int) -> None:
        """Until `count` sends were answered."""
        await _until(lambda: self.answered >= count, f"{count} sends answered")

    async def produce(self, conn: Connection, recipient: str) -> None:
        """One pair's messages, one at a time, in order."""
        for n in range(self.per_pair):
            if self.stop.is_set():
                return
            token = f"{conn.agent_id}>{recipient}#{n}"
            env = conn.envelope({"n": n}, idempotency_token=token)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + WAIT_S
            while True:
                try:
                    await conn.send_envelope(env, recipient)
                    self.accepted[token] = env.message_id
                    break
                except (AlreadyInProgressError, DuplicateDetectedError) as answer:
                    self.accepted[token] = _original(answer)
                    break
                except ApiaryError as exc:
                    unanswered = isinstance(exc, CoordinatorUnreachableError)
                    if not unanswered and exc.code not in UNANSWERED:
                        self.refused[token] = f"{exc.code}: {exc.message[:160]}"
                        break
                    if loop.time() > deadline:
                        raise AssertionError(f"{token}: no answer within {WAIT_S} s") from exc
                await asyncio.sleep(RESEND_PAUSE_S)
                env = conn.retry(env)
                self.resent += 1

    async def consume(self, conn: Connection) -> None:
        """An agent's deliveries, each data message acknowledged FULFILLED as it arrives,
        without waiting for the ACK's answer before taking the next (an ACK that does not
        reach a replica leaves its message unacknowledged: it comes again)."""
        acks: set[asyncio.Task[None]] = set()
        try:
            async for delivery in conn.deliveries(reconnect=True):
                env = delivery.envelope
                if env.message_type is not MessageType.DATA:
                    continue
                n = json.loads(env.payload)["n"]
                self.seen.append(
                    Seen(conn.agent_id, env.producer_id, n, env.idempotency_token, env.message_id)
                )
                ack = asyncio.create_task(_ack(conn, env))
                acks.add(ack)
                ack.add_done_callback(acks.discard)
        finally:
            for ack in acks:
                ack.cancel()

    async def settled(self, dsn: str, schema: str) -> dict[str, str]:
        """Until every accepted token's message was delivered and is FULFILLED in the store
        (or `WAIT_S` passed); the stored state of each accepted message."""
        states: dict[str, str] = {}

        async def done() -> bool:
            nonlocal states
            states = await _states(dsn, schema, list(self.accepted.values()))
            delivered = {s.token for s in self.seen}
            return all(t in delivered for t in self.accepted) and all(
                states.get(m) == "FULFILLED" for m in self.accepted.values()
            )

        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while loop.time() < deadline:
            if await done():
                break
            await asyncio.sleep(0.2)
        return states

    def check(self, states: dict[str, str]) -> None:
        """Nothing accepted lost, nothing refused delivered, each pair in order, each token
        run once."""
        delivered: dict[str, set[str]] = defaultdict(set)
        for s in self.seen:
            delivered[s.token].add(s.message_id)
        lost = [t for t in self.accepted if t not in delivered]
        assert not lost, f"{len(lost)} accepted messages never delivered: {lost[:5]}"
        unfinished = {
            t: states.get(m) for t, m in self.accepted.items() if states.get(m) != "FULFILLED"
        }
        assert not unfinished, (
            f"{len(unfinished)} accepted not FULFILLED: {list(unfinished.items())[:5]}"
        )
        refused_delivered = [t for t in self.refused if t in delivered]
        assert not refused_delivered, f"refused but delivered: {refused_delivered[:5]}"
        twice = {t: ids for t, ids in delivered.items() if len(ids) > 1}
        assert not twice, f"tokens run as more than one message: {list(twice.items())[:5]}"
        wrong = [t for t, ids in delivered.items() if ids != {self.accepted.get(t)}]
        assert not wrong, f"delivered a message other than the one admitted: {wrong[:5]}"
        firsts: dict[tuple[str, str], list[int]] = defaultdict(list)
        known: set[str] = set()
        for s in self.seen:
            if s.message_id not in known:
                known.add(s.message_id)
                firsts[(s.producer, s.agent)].append(s.n)
        for pair, order in firsts.items():
            assert order == sorted(order), f"{pair} out of order: {_first_disorder(order)}"

    def summary(self) -> str:
        again = len(self.seen) - len({s.message_id for s in self.seen})
        codes = sorted(set(self.refused.values()))
        return (
            f"{len(self.accepted)} accepted, {len(self.refused)} refused {codes}, {self.resent}"
            f" sent again after no answer, {len(self.seen)} deliveries ({again} redelivered)"
        )


async def _ack(conn: Connection, env: Envelope) -> None:
    with contextlib.suppress(ApiaryError):
        await conn.ack(env, AckStage.FULFILLED)


def _first_disorder(order: list[int]) -> str:
    for i in range(1, len(order)):
        if order[i] < order[i - 1]:
            return f"{order[i]} after {order[i - 1]} (position {i})"
    return "none"


async def settle(check: Callable[[], Awaitable[bool]], what: str) -> float:
    """Seconds until `check()` is true (polled); AssertionError after WAIT_S."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not await check():
        if loop.time() - start > WAIT_S:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0.05)
    return loop.time() - start


async def _until(condition: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0.02)


async def _states(dsn: str, schema: str, message_ids: list[str]) -> dict[str, str]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        query = sql.SQL("SELECT message_id, state FROM {}.messages WHERE message_id = ANY(%s)")
        cursor = await conn.execute(query.format(sql.Identifier(schema)), [message_ids])
        return {str(m): str(s) for m, s in await cursor.fetchall()}


async def lapsed_or_held_by(dsn: str, schema: str, replica_id: str) -> int:
    """How many partitions are free, lapsed or still `replica_id`'s (database clock)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        query = sql.SQL(
            "SELECT count(*) FROM {}.partition_leases WHERE owner IS NULL OR owner = %s"
            " OR expires_at <= extract(epoch FROM clock_timestamp())"
        )
        cursor = await conn.execute(query.format(sql.Identifier(schema)), [replica_id])
        row = await cursor.fetchone()
        assert row is not None
        return int(row[0])


async def owned_by(dsn: str, schema: str, replica_id: str) -> int:
    """How many live leases `replica_id` holds."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        query = sql.SQL(
            "SELECT count(*) FROM {}.partition_leases WHERE owner = %s"
            " AND expires_at > extract(epoch FROM clock_timestamp())"
        )
        cursor = await conn.execute(query.format(sql.Identifier(schema)), [replica_id])
        row = await cursor.fetchone()
        assert row is not None
        return int(row[0])


ORIGINAL = re.compile(r" as ([0-9a-f-]{36}) ")


def _original(answer: ApiaryError) -> str:
    """The message a resent token was admitted as: the refusal's details when it came as a
    gRPC error, else its text (SendMessage answers `accepted=false` with the reason only,
    "token T already completed as <id> (...)"; the producer's ACK carries the details)."""
    named = answer.details.get("original_message_id")
    if named:
        return str(named)
    found = ORIGINAL.search(answer.message)
    assert found is not None, f"the refusal names no original message: {answer.message}"
    return found.group(1)
