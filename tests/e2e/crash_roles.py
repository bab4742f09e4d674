"""Processes of the crash-recovery test (test_crash_recovery.py), run as
`python -m tests.e2e.crash_roles ROLE ...`.

consumer AGENT COORD WORKDIR
    Receives DATA messages, executes each logical operation (idempotency token) at most once
    (a local SQLite table of executed tokens is the side effect), logs every message_id it
    received, and acknowledges FULFILLED. Survives the coordinator's death by reconnecting.
    Stops when WORKDIR/stop exists.
producer AGENT COORD WORKDIR COUNT TARGET...
    Sends COUNT operations round-robin to the targets, each with its own idempotency token;
    on a transport failure retries the same operation with a new message_id (RFC 11.2).
    Logs every accepted message_id.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import sys
from pathlib import Path

from apiary.core.envelope import AckStage, MessageType
from apiary.errors import ApiaryError
from apiary.sdk.agent import Agent

RETRYABLE = {"agent_unavailable", "internal_error", "buffer_full"}
GIVE_UP_S = 120.0


async def _connect(agent: Agent) -> None:
    for _ in range(600):
        try:
            await agent.start()
            return
        except ApiaryError:
            await asyncio.sleep(0.1)
    raise SystemExit(f"{agent.agent_id}: coordinator never answered")


async def consumer(agent_id: str, coordinator: str, workdir: Path) -> None:
    executed = sqlite3.connect(workdir / f"executed-{agent_id}.db", isolation_level=None)
    executed.execute(
        "CREATE TABLE IF NOT EXISTS executed (token TEXT PRIMARY KEY, message_id TEXT)"
    )
    received = (workdir / f"received-{agent_id}.log").open("a", buffering=1)
    agent = Agent(agent_id, coordinator=coordinator)
    await _connect(agent)

    async def work() -> None:
        async for delivery in agent.deliveries(reconnect=True):
            env = delivery.envelope
            if env.message_type is not MessageType.DATA:
                continue
            received.write(env.message_id + "\n")
            with contextlib.suppress(sqlite3.IntegrityError):
                executed.execute(
                    "INSERT INTO executed VALUES (?, ?)", (env.idempotency_token, env.message_id)
                )
            with contextlib.suppress(ApiaryError):
                await agent.ack(env, AckStage.FULFILLED)

    task = asyncio.create_task(work())
    # The test says "stop" with a file; check for it while the work runs.
    while not (workdir / "stop").exists():
        done, _ = await asyncio.wait({task}, timeout=0.1)
        if done:
            break
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await agent.stop(deregister=False)


async def producer(
    agent_id: str, coordinator: str, workdir: Path, count: int, targets: list[str]
) -> None:
    accepted = (workdir / f"accepted-{agent_id}.log").open("a", buffering=1)
    agent = Agent(agent_id, coordinator=coordinator)
    await _connect(agent)
    loop = asyncio.get_running_loop()
    for i in range(count):
        target = targets[i % len(targets)]
        env = agent.envelope({"i": i}, idempotency_token=f"{agent_id}:op:{i}")
        deadline = loop.time() + GIVE_UP_S
        while True:
            try:
                await agent.send_envelope(env, target)
                accepted.write(f"{env.message_id} {env.idempotency_token}\n")
                break
            except ApiaryError as exc:
                if exc.code in ("already_in_progress", "duplicate_detected"):
                    break  # an earlier attempt was admitted; its reply was lost in the crash
                if exc.code not in RETRYABLE or loop.time() > deadline:
                    raise
                await asyncio.sleep(0.05)
                env = agent.retry(env)
    await agent.stop(deregister=False)


def main(argv: list[str]) -> int:
    role, agent_id, coordinator, workdir = argv[:4]
    if role == "consumer":
        asyncio.run(consumer(agent_id, coordinator, Path(workdir)))
    else:
        asyncio.run(producer(agent_id, coordinator, Path(workdir), int(argv[4]), argv[5:]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
