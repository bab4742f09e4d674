"""`apiary task`, `apiary send` and `apiary status` against a running coordinator (real
sockets, real CLI processes)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from apiary.core.envelope import AckStage
from apiary.engine.assembly import Runtime
from apiary.engine.hitl import HitlSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.sdk.connection import Connection
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator

TOKEN = "status-operator-token"
HITL = HitlSettings(operators=(OperatorEntry("olivia", token_digest(TOKEN), ("admin",)),))


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path, runtime=Runtime(hitl=HITL)) as running:
        await running.registry.register({
            "agent_id": "worker", "name": "worker", "reasoning_connectors": ["builtin://rules"],
            "modalities_supported": ["application/json", "text/plain"],
        })  # fmt: skip
        yield running


async def _cli(coordinator: Coordinator, *args: str, code: int = 0) -> tuple[str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "apiary.cli.main", *args, "--grpc", str(coordinator.grpc_address),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={k: v for k, v in {**os.environ, "COLUMNS": "200"}.items() if k != "APIARY_TOKEN"},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == code, (proc.returncode, err.decode())
    return out.decode(), err.decode()


async def test_tasks_are_submitted_listed_and_shown(coordinator: Coordinator) -> None:
    params = '{"fix": "bug-7"}'
    out, err = await _cli(coordinator, "task", "submit", "worker", "--scope", "repo:app",
                          "--params", params, "--priority", "-5", "--id", "t-1")  # fmt: skip
    assert out.strip() == "t-1" and "queued" in err
    listed = [
        json.loads(line)
        for line in (await _cli(coordinator, "task", "list", "--json"))[0].splitlines()
    ]
    assert [(t["task_id"], t["state"], t["priority"]) for t in listed] == [("t-1", "QUEUED", -5)]
    assert listed[0]["params_size"] == len('{"fix": "bug-7"}') and "params" not in listed[0]
    shown = json.loads((await _cli(coordinator, "task", "show", "t-1"))[0])
    assert (shown["params"], shown["scope"], shown["correlation_id"]) == (
        {"fix": "bug-7"}, "repo:app", "t-1",
    )  # fmt: skip
    table, _ = await _cli(coordinator, "task", "list", "--state", "queued", "--agent", "worker")
    assert "t-1" in table and "QUEUED" in table
    await _cli(coordinator, "task", "submit", "worker", "--scope", "repo:app", "--id", "t-2")
    first, hint = await _cli(coordinator, "task", "list", "--limit", "1")
    seq = listed[0]["seq"]
    assert "t-1" in first and f"more may follow: --after {seq}" in hint
    rest, _ = await _cli(coordinator, "task", "list", "--after", str(seq))
    assert "t-2" in rest and "t-1" not in rest
    assert (await _cli(coordinator, "task", "preempt", "worker"))[0].strip() == (
        "nothing to preempt"
    )


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (("task", "submit", "worker", "--scope", "repo:app", "--params", "{bad"), 2,
         "--params is not JSON"),
        (("task", "submit", "ghost", "--scope", "repo:app"), 1, "ghost"),
        (("task", "submit", "worker", "--scope", " "), 1, "scope: is required"),
        (("task", "list", "--state", "DONE"), 1, "states: must be among"),
        (("task", "show", "nope"), 1, "NOT_FOUND: no task 'nope'"),
        (("send", "worker", "--json", "{bad"), 2, "--json is not JSON"),
        (("send", "worker"), 2, "exactly one of --json, --text, --file"),
        (("send", "worker", "--text", "hi", "--json", "{}"), 2, "exactly one"),
        (("send", "ghost", "--json", "{}"), 1, "no_route"),
    ],
)  # fmt: skip
async def test_bad_input_is_refused_naming_what_is_wrong(
    coordinator: Coordinator, args: tuple[str, ...], code: int, words: str
) -> None:
    _, err = await _cli(coordinator, *args, code=code)
    assert words in err, err


async def test_a_message_is_sent_from_the_command_line(coordinator: Coordinator) -> None:
    out, err = await _cli(coordinator, "send", "worker", "--from", "ops", "--json", '{"n": 1}')
    message_id = out.strip()
    assert err.startswith("accepted")
    stored = await coordinator.store.messages.get(message_id)
    assert stored is not None and (stored.recipient, stored.producer_id) == ("worker", "ops")
    text_id = (await _cli(coordinator, "send", "worker", "--text", "hello"))[0].strip()
    stored = await coordinator.store.messages.get(text_id)
    assert stored is not None and b"hello" in stored.envelope


async def test_status_shows_agents_queues_tasks_dead_letters_and_hitl(
    coordinator: Coordinator,
) -> None:
    await _cli(coordinator, "send", "worker", "--json", "{}")
    await _cli(coordinator, "task", "submit", "worker", "--scope", "repo:app", "--id", "t-9")
    await _cli(coordinator, "send", "worker", "--json", "{}", "--content-type", "image/png",
               code=1)  # refused (worker takes no images): answered, not a dead letter  # fmt: skip
    failing = (await _cli(coordinator, "send", "worker", "--json", '{"n": 2}'))[0].strip()
    stored = await coordinator.store.messages.get(failing)
    assert stored is not None
    worker = Connection("worker", coordinator=str(coordinator.grpc_address))
    worker.connect()  # as the registered worker
    try:
        env = coordinator.router.codec.decode(stored.envelope)
        await worker.ack(env, AckStage.FAILED, error_code="internal_error", note="disk full")
    finally:
        await worker.stop(deregister=False)
    doc = json.loads((await _cli(coordinator, "status", "--json"))[0])
    (worker,) = doc["agents"]
    assert (worker["agent_id"], worker["inbox"] >= 1) == ("worker", True)
    assert doc["tasks"]["QUEUED"] == 1 and doc["dead_letters"] == 1
    assert "operator token" in doc["hitl_pending"]
    with_token = json.loads((await _cli(coordinator, "status", "--json", "--token", TOKEN))[0])
    assert with_token["hitl_pending"] == 0
    table, _ = await _cli(coordinator, "status")
    assert "worker" in table and "tasks QUEUED" in table and "dead letters" in table


async def test_an_operator_cancels_a_task_that_has_not_started(coordinator: Coordinator) -> None:
    await _cli(coordinator, "task", "submit", "worker", "--scope", "repo:app", "--id", "t-c")
    refused = (await _cli(coordinator, "task", "cancel", "t-c", code=1))[1]
    assert "unauthenticated" in refused.lower() and "operator" in refused
    out, _ = await _cli(coordinator, "task", "cancel", "t-c", "--reason", "wrong repo",
                        "--token", TOKEN)  # fmt: skip
    assert out.strip() == "t-c: FAILED (cancelled: cancelled by olivia: wrong repo)"
    again = (await _cli(coordinator, "task", "cancel", "t-c", "--token", TOKEN, code=1))[1]
    assert "ALREADY_COMPLETED" in again.upper() and "already ended (FAILED)" in again
    missing = (await _cli(coordinator, "task", "cancel", "nope", "--token", TOKEN, code=1))[1]
    assert "NOT_FOUND" in missing
    (event,) = [e for e in await coordinator.events.read(limit=1000)
                if e.event_type == "task.failed"]  # fmt: skip
    assert event.details["error_code"] == "cancelled"


async def test_events_are_followed_as_they_are_logged(coordinator: Coordinator) -> None:
    start = await coordinator.events.last_sequence()
    argv = ["events", "--follow", "--json", "--type", "agent.", "--after", str(start),
            "--grpc", str(coordinator.grpc_address)]  # fmt: skip
    # Ctrl-C as a terminal delivers it: an ignored SIGINT is inherited, and a suite started
    # as a background job of a script has it ignored, so the command gets Python's default.
    with_ctrl_c = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler);"
        f" sys.argv = ['apiary', *{argv!r}];"
        " runpy.run_module('apiary.cli.main', run_name='__main__')"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", with_ctrl_c,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        for agent in ("late-1", "late-2"):
            await coordinator.registry.register({
                "agent_id": agent, "name": agent, "reasoning_connectors": ["builtin://rules"],
            })  # fmt: skip
            await coordinator.events.record("test.noise", "test")  # filtered out
        lines = [await asyncio.wait_for(proc.stdout.readline(), 30) for _ in range(2)]
        followed = [json.loads(line) for line in lines]
        assert [(e["type"], e["agent_id"]) for e in followed] == [
            ("agent.registered", "late-1"), ("agent.registered", "late-2"),
        ]  # fmt: skip
        assert followed[0]["sequence"] < followed[1]["sequence"]
        proc.send_signal(signal.SIGINT)  # Ctrl-C ends it quietly
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
