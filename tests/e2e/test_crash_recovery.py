"""Crash safety (DESIGN.md section 5): SIGKILL the coordinator mid-stream, restart it on the
same data directory, and check that no accepted message is lost, no operation with an
idempotency token ran twice, and nothing was delivered that had not been accepted."""

from __future__ import annotations

import asyncio
import signal
import socket
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from apiary.core.records import MessageState
from apiary.store.open import open_store
from apiary.wire import pb

PRODUCERS = ("p1", "p2", "p3")
CONSUMERS = ("c1", "c2")
PER_PRODUCER = 700
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _spawn(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, *args, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


class Coordinator:
    def __init__(self, data_dir: Path, config: Path, store: str | None = None) -> None:
        self.data_dir = data_dir
        self.config = config
        self.store = store
        self.grpc = f"127.0.0.1:{_free_port()}"
        self.http = f"127.0.0.1:{_free_port()}"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        # The event log goes to stderr as JSON lines: send it to a file, never to an
        # unread pipe (a full pipe would stall the coordinator).
        log = (self.data_dir.parent / "coordinator.log").open("ab")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "apiary.cli.main", "serve", "--data-dir", str(self.data_dir),
            "--grpc", self.grpc, "--http", self.http, "--config", str(self.config),
            *(("--store", self.store) if self.store else ()),
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=log,
        )  # fmt: skip
        log.close()
        assert self.proc.stdout is not None
        for _ in range(2):
            line = await asyncio.wait_for(self.proc.stdout.readline(), 30)
            assert line, "apiary serve exited early"

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def stop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(self.proc.wait(), 30) == 0


@pytest.fixture(params=[None, "sqlite:?writer=process"], ids=["writer-thread", "writer-process"])
async def coordinator(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Coordinator]:
    config = tmp_path / "apiary.toml"
    # A generous ack timeout: the restart must not turn in-flight deliveries into timeouts.
    config.write_text("[router]\nack_timeout_s = 60\nbuffer_capacity = 50\n")
    # The default SQLite file, its writer a thread of the coordinator or a process of its
    # own (which must end with the coordinator it served before the next one writes).
    running = Coordinator(tmp_path / "state", config, request.param)
    await running.start()
    yield running
    if running.proc is not None and running.proc.returncode is None:
        running.proc.kill()
        await running.proc.wait()


async def _count_lines(paths: list[Path]) -> int:
    return sum(len(p.read_text().splitlines()) for p in paths if p.exists())


async def _buffers_drained(address: str) -> bool:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb.apiary_pb2_grpc.DiscoveryServiceStub(channel)
        reply = await stub.ListAgents(pb.apiary_pb2.ListAgentsRequest(), timeout=5)
    return all(a.buffer_depth == 0 for a in reply.agents)


async def _registered(address: str) -> set[str]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb.apiary_pb2_grpc.DiscoveryServiceStub(channel)
        reply = await stub.ListAgents(pb.apiary_pb2.ListAgentsRequest(), timeout=5)
    return {a.descriptor.agent_id for a in reply.agents}


async def _finish(proc: asyncio.subprocess.Process, name: str) -> None:
    _, err = await asyncio.wait_for(proc.communicate(), 180)
    assert proc.returncode == 0, f"{name} failed: {err.decode()[-3000:]}"


@pytest.mark.conformance("backpressure.no-silent-drop")
async def test_sigkill_mid_stream_loses_nothing(coordinator: Coordinator, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    consumers = [
        await _spawn("-m", "tests.e2e.crash_roles", "consumer", c, coordinator.grpc, str(work))
        for c in CONSUMERS
    ]
    for _ in range(300):
        if set(CONSUMERS) <= await _registered(coordinator.grpc):
            break
        await asyncio.sleep(0.1)
    producers = [
        await _spawn(
            "-m",
            "tests.e2e.crash_roles",
            "producer",
            p,
            coordinator.grpc,
            str(work),
            str(PER_PRODUCER),
            *CONSUMERS,
        )
        for p in PRODUCERS
    ]
    accepted_logs = [work / f"accepted-{p}.log" for p in PRODUCERS]
    while await _count_lines(accepted_logs) < len(PRODUCERS) * PER_PRODUCER * 0.4:
        assert all(p.returncode is None for p in producers), "a producer ended early"
        await asyncio.sleep(0.05)
    await coordinator.kill()
    await coordinator.start()  # same data directory, same ports
    for proc, name in zip(producers, PRODUCERS, strict=True):
        await _finish(proc, name)
    for _ in range(600):
        if await _buffers_drained(coordinator.grpc):
            break
        await asyncio.sleep(0.1)
    (work / "stop").touch()
    for proc, name in zip(consumers, CONSUMERS, strict=True):
        await _finish(proc, name)
    await coordinator.stop()

    accepted = {
        line.split()[0]: line.split()[1]
        for log in accepted_logs
        for line in log.read_text().splitlines()
    }
    received = {m for c in CONSUMERS for m in (work / f"received-{c}.log").read_text().split()}
    executed: list[tuple[str, str]] = []
    for c in CONSUMERS:
        with sqlite3.connect(work / f"executed-{c}.db") as db:
            executed += db.execute("SELECT token, message_id FROM executed").fetchall()

    async with open_store(None, coordinator.data_dir) as store:
        states = {}
        for c in CONSUMERS:
            for m in await store.messages.inbox(c, 0, 100_000):
                if m.message_type == pb.common_pb2.DATA:
                    states[m.message_id] = m
        dead = {e.message_id for e in await store.dlq.list(limit=100_000)}

    assert len(accepted) >= len(PRODUCERS) * PER_PRODUCER * 0.9
    lost = [m for m in accepted if m not in states and m not in dead]
    assert not lost, f"{len(lost)} accepted messages are gone"
    stuck = [m for m, s in states.items() if not s.state.terminal and m not in dead]
    assert not stuck, f"{len(stuck)} messages never reached a terminal state"
    tokens = [t for t, _ in executed]
    assert len(tokens) == len(set(tokens)), "an operation ran twice"
    fulfilled_tokens = {
        s.idempotency_token for s in states.values() if s.state is MessageState.FULFILLED
    }
    assert fulfilled_tokens <= set(tokens), "a FULFILLED operation never ran"
    assert received <= set(states), "an agent received a message that was never accepted"
    assert set(accepted.values()) <= set(tokens) | {
        s.idempotency_token for s in states.values() if s.state is MessageState.TIMED_OUT
    }
