"""Crash safety (DESIGN.md section 5): SIGKILL the coordinator mid-stream, restart it on the
same data directory, and check that no accepted message is lost, no operation with an
idempotency token ran twice, nothing was delivered that had not been accepted, and every
accepted message ended FULFILLED or in the DLQ: none TIMED_OUT for having waited while the
coordinator was down (the ACK deadline runs from a hand-out to a live stream). And the audit
holds: every committed message and task state has its event in the event log (`_audit`), a
state and its event being committed together."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from apiary.core.envelope import Envelope
from apiary.core.events import EventFilter
from apiary.core.records import MessageState, StoredMessage
from apiary.engine.notices import SCHEDULER
from apiary.errors import ApiaryError
from apiary.sdk.agent import Agent
from apiary.sdk.scheduler import SchedulerClient
from apiary.store.open import open_store
from apiary.store.protocols import Store
from apiary.wire import pb

PRODUCERS = ("p1", "p2", "p3")
CONSUMERS = ("c1", "c2")
PER_PRODUCER = 700
STREAMED = 1500
"""Operations the streaming sender sends, FRAME envelopes per SendStream frame."""
FRAME = 50
OUTAGE_S = 11.0
"""How long the coordinator stays down in the streaming test: longer than the 10 s ACK
deadline, which must not run while nobody can acknowledge."""
RETRYABLE = {"agent_unavailable", "internal_error", "buffer_full"}
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
        self.log = data_dir.parent / "coordinator.log"

    async def start(self) -> None:
        # The event log goes to stderr as JSON lines: send it to a file, never to an
        # unread pipe (a full pipe would stall the coordinator).
        log = self.log.open("ab")
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
        try:
            await asyncio.wait_for(asyncio.shield(self.proc.wait()), 30)
        except TimeoutError:
            # It prints its threads' and tasks' stacks after 15 s (server/stall_report.py).
            self.proc.kill()
            await self.proc.wait()
            tail = self.log.read_text(errors="replace")[-20000:]
            pytest.fail(f"apiary serve did not stop within 30 s of SIGTERM; its stderr:\n{tail}")
        assert self.proc.returncode == 0, self.log.read_text(errors="replace")[-5000:]


@pytest.fixture(params=[None, "sqlite:?writer=process"], ids=["writer-thread", "writer-process"])
async def coordinator(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Coordinator]:
    config = tmp_path / "apiary.toml"
    # The RFC's 10 s ACK deadline: a restart must not turn waiting deliveries into timeouts.
    config.write_text("[router]\nbuffer_capacity = 50\n")
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


Processes = list[asyncio.subprocess.Process]


async def _start_consumers(coordinator: Coordinator, work: Path) -> Processes:
    consumers = [
        await _spawn("-m", "tests.e2e.crash_roles", "consumer", c, coordinator.grpc, str(work))
        for c in CONSUMERS
    ]
    for _ in range(300):
        if set(CONSUMERS) <= await _registered(coordinator.grpc):
            break
        await asyncio.sleep(0.1)
    return consumers


async def _drain_and_stop(coordinator: Coordinator, consumers: Processes, work: Path) -> None:
    """Wait (bounded) for every buffer to drain, stop the consumers, then the coordinator."""
    for _ in range(600):
        if await _buffers_drained(coordinator.grpc):
            break
        await asyncio.sleep(0.1)
    (work / "stop").touch()
    for proc, name in zip(consumers, CONSUMERS, strict=True):
        await _finish(proc, name)
    await coordinator.stop()


async def _check_outcome(coordinator: Coordinator, work: Path, accepted: dict[str, str]) -> None:
    """`accepted` (message_id -> idempotency token: what producers were told was accepted)
    lost nothing, ran nothing twice, and ended FULFILLED or in the DLQ, none TIMED_OUT."""
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

    lost = [m for m in accepted if m not in states and m not in dead]
    assert not lost, f"{len(lost)} accepted messages are gone"
    stuck = [m for m, s in states.items() if not s.state.terminal and m not in dead]
    assert not stuck, f"{len(stuck)} messages never reached a terminal state"
    timed_out = [m for m, s in states.items() if s.state is MessageState.TIMED_OUT]
    assert not timed_out, f"{len(timed_out)} of {len(states)} messages TIMED_OUT"
    unsettled = [
        m for m, s in states.items() if s.state is not MessageState.FULFILLED and m not in dead
    ]
    assert not unsettled, f"{len(unsettled)} messages ended neither FULFILLED nor dead-lettered"
    tokens = [t for t, _ in executed]
    assert len(tokens) == len(set(tokens)), "an operation ran twice"
    fulfilled_tokens = {
        s.idempotency_token for s in states.values() if s.state is MessageState.FULFILLED
    }
    assert fulfilled_tokens <= set(tokens), "a FULFILLED operation never ran"
    assert received <= set(states), "an agent received a message that was never accepted"
    dead_tokens = {s.idempotency_token for m, s in states.items() if m in dead}
    assert set(accepted.values()) <= set(tokens) | dead_tokens, "an accepted operation never ran"
    async with open_store(None, coordinator.data_dir) as store:
        await _audit(store, list(states.values()))


async def _events_of(store: Store, types: frozenset[str]) -> list[dict[str, object]]:
    """Every event of `types` in the log, as its details with its type (and its agent_id
    unless the details have one)."""
    found: list[dict[str, object]] = []
    after = 0
    while batch := await store.events.read(after, 5000, EventFilter(event_types=types)):
        found += [{"agent_id": e.agent_id, **e.details, "type": e.event_type} for e in batch]
        after = batch[-1].sequence
    return found


async def _audit(store: Store, messages: list[StoredMessage]) -> None:
    """Every message of `messages` has its admission's event and, when its state moved on,
    the event of the change to the state stored; every stored task has the event of its
    state, every stored agent that of its registration. (Before events committed with
    their changes, a SIGKILL left 1-4 committed transitions per run without one.) A task
    event that names a dispatch's message and its `message_state` is that message's event
    of the state (docs/scheduler.md, "Events of a task's messages")."""
    logged = await _events_of(store, frozenset({"message.received", "message.state", "task."}))
    merged = [e for e in logged if e["type"].startswith("task.") and "message_state" in e]
    received = {e["message_id"] for e in logged if e["type"] == "message.received"}
    received |= {e["message_id"] for e in merged if e["message_state"] == "RECEIVED"}
    reached = {(e["message_id"], e["to"]) for e in logged if e["type"] == "message.state"}
    reached |= {(e["message_id"], e["message_state"]) for e in merged}
    unlogged = [m.message_id for m in messages if m.message_id not in received]
    assert not unlogged, f"{len(unlogged)} admitted messages have no message.received event"
    silent = [
        (m.message_id, m.state.value)
        for m in messages
        if m.state is not MessageState.RECEIVED and (m.message_id, m.state.value) not in reached
    ]
    assert not silent, f"{len(silent)} message states have no event, e.g. {silent[:3]}"
    tasks = await store.tasks.list(limit=1_000_000)
    task_events = await _events_of(store, frozenset({"task."}))
    stated = {(e.get("task_id"), e.get("state")) for e in task_events}
    missing = [(t.task_id, str(t.state)) for t in tasks]
    missing = [pair for pair in missing if pair not in stated]
    assert not missing, f"{len(missing)} of {len(tasks)} task states have no event: {missing[:3]}"
    registered = {e["agent_id"] for e in await _events_of(store, frozenset({"agent.registered"}))}
    unregistered = [a.agent_id for a in await store.agents.list() if a.agent_id not in registered]
    assert not unregistered, f"stored agents without an agent.registered event: {unregistered}"


@pytest.mark.conformance("backpressure.no-silent-drop")
async def test_sigkill_mid_stream_loses_nothing(coordinator: Coordinator, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    consumers = await _start_consumers(coordinator, work)
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
    await _drain_and_stop(coordinator, consumers, work)

    accepted = {
        line.split()[0]: line.split()[1]
        for log in accepted_logs
        for line in log.read_text().splitlines()
    }
    assert len(accepted) >= len(PRODUCERS) * PER_PRODUCER * 0.9
    await _check_outcome(coordinator, work, accepted)


async def _stream_producer(agent_id: str, address: str, accepted: dict[str, str]) -> int:
    """Send STREAMED operations round-robin to the consumers over the streaming sender
    (SendStream, FRAME envelopes a frame), each under its own idempotency token; a frame
    that fails in transit, and each member refused as retryable, is sent again as a new
    attempt (new message_id, same token: RFC 11.2). Records what was accepted in
    `accepted`; returns how many frames failed in transit."""
    agent = Agent(agent_id, coordinator=address)
    await agent.start()
    loop = asyncio.get_running_loop()
    give_up, failed = loop.time() + 180, 0
    pending: list[tuple[Envelope, str]] = [
        (agent.envelope({"i": i}, idempotency_token=f"{agent_id}:op:{i}"), CONSUMERS[i % 2])
        for i in range(STREAMED)
    ]
    while pending:
        frame, pending = pending[:FRAME], pending[FRAME:]
        try:
            results = await agent.send_many(frame)
        except ApiaryError as exc:
            # The coordinator is down: the whole frame again, on a new connection.
            assert exc.code in RETRYABLE, exc
            assert loop.time() < give_up, "the streaming sender gave up"
            failed += 1
            with contextlib.suppress(Exception):
                await agent.stop(deregister=False)
            agent.connect()
            pending = [(agent.retry(env), to) for env, to in frame] + pending
            await asyncio.sleep(0.05)
            continue
        again = []
        for (env, to), result in zip(frame, results, strict=True):
            if result.accepted:
                accepted[env.message_id] = env.idempotency_token
            elif result.error_code not in ("already_in_progress", "duplicate_detected"):
                # (those two: an earlier attempt was admitted; its answer was lost)
                assert result.error_code in RETRYABLE, result
                again.append((agent.retry(env), to))
        if again:
            assert loop.time() < give_up, "the streaming sender gave up"
            pending = again + pending
            await asyncio.sleep(0.05)
    await agent.stop(deregister=False)
    return failed


@pytest.mark.parametrize("coordinator", [None], ids=["writer-thread"], indirect=True)
@pytest.mark.conformance("backpressure.no-silent-drop")
async def test_sigkill_and_an_outage_under_the_streaming_sender_time_nothing_out(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    consumers = await _start_consumers(coordinator, work)
    accepted: dict[str, str] = {}
    producer = asyncio.create_task(_stream_producer("s1", coordinator.grpc, accepted))
    while len(accepted) < STREAMED * 0.4:
        if producer.done():
            producer.result()  # its error, if it failed
            raise AssertionError("the streaming sender ended early")
        await asyncio.sleep(0.05)
    await coordinator.kill()
    # Down longer than the ACK deadline: what was admitted and handed out, or still waiting
    # in a buffer, must wait for the restart and the consumers' return, not time out.
    await asyncio.sleep(OUTAGE_S)
    await coordinator.start()
    assert await asyncio.wait_for(producer, 240) >= 1, "the kill never reached the sender"
    await _drain_and_stop(coordinator, consumers, work)
    # Every operation was accepted once (those whose answer the kill lost, at most a frame's,
    # were answered already_in_progress when sent again).
    assert len(accepted) >= STREAMED - FRAME
    await _check_outcome(coordinator, work, accepted)


TASKS = 600
"""Tasks the task test submits, IN_FLIGHT submissions at a time, to one quick worker."""
IN_FLIGHT = 8


async def _submit_tasks(address: str, submitted: list[str]) -> None:
    """Submit TASKS quick tasks for the worker `w`, IN_FLIGHT at a time; a submission the
    coordinator's death cut is given up (its task may or may not exist: the audit covers
    whatever is stored)."""
    async with SchedulerClient(address) as client:
        queue = iter(range(TASKS))

        async def submitter() -> None:
            for i in queue:
                with contextlib.suppress(ApiaryError, grpc.aio.AioRpcError):
                    outcome = await client.submit_task(
                        "w", f"t{i}", {"mode": "quick", "n": i}, scope=f"path:t/{i}/**"
                    )
                    if outcome.accepted:
                        submitted.append(f"t{i}")

        await asyncio.gather(*(submitter() for _ in range(IN_FLIGHT)))


@pytest.mark.parametrize("coordinator", [None], ids=["writer-thread"], indirect=True)
async def test_sigkill_under_tasks_leaves_every_task_state_with_its_event(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    worker = await _spawn("-m", "tests.e2e.task_agents", "w", coordinator.grpc)
    try:
        assert worker.stdout is not None
        line = await asyncio.wait_for(worker.stdout.readline(), 30)
        assert b"ready" in line, line
        submitted: list[str] = []
        submitting = asyncio.create_task(_submit_tasks(coordinator.grpc, submitted))
        while len(submitted) < TASKS * 0.3:
            assert not submitting.done(), "the submissions ended early"
            await asyncio.sleep(0.02)
        await coordinator.kill()  # mid-load: tasks being submitted, dispatched, completed
        await asyncio.wait_for(submitting, 120)
    finally:
        if worker.returncode is None:
            worker.kill()
        await worker.wait()
    await coordinator.start()
    await coordinator.stop()
    async with open_store(None, coordinator.data_dir) as store:
        tasks = await store.tasks.list(limit=1_000_000)
        assert len(tasks) >= TASKS * 0.3
        assert any(t.state == "COMPLETED" for t in tasks), "no task ran before the kill"
        dispatches = [
            m for m in await store.messages.inbox("w", 0, 1_000_000)
            if m.producer_id == SCHEDULER and m.message_type == pb.common_pb2.DATA
        ]  # fmt: skip
        assert len(dispatches) >= sum(t.state == "COMPLETED" for t in tasks)
        await _audit(store, dispatches)
