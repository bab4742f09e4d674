"""write_process_stdin and terminate_process against a real coordinator (HTTP sockets, the
tool service, real sandboxed subprocesses): an SDK agent in a turn starts an interactive
command tool (`stdin = "stream"`), which is a process of the turn's thread; the application
writes to it through the control plane and sees its output as process.output events, then
terminates it (process.terminated). An interrupted turn terminates its process; an unknown
or ended process answers unavailable with a runtime.warning; bad input is refused naming
the field. Every event and answer is validated against the contract's schemas."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from apiary.controlplane.commands import COMMANDS
from apiary.core.access.principal import Principal, PrincipalKind
from apiary.core.access.rules import Role
from apiary.core.tools.descriptor import ToolDescriptor
from apiary.core.tools.policy import ExecutionPolicy
from apiary.engine.assembly import Runtime
from apiary.engine.tools.command_tools import CommandToolSpec
from apiary.engine.tools.settings import ToolSettings
from apiary.errors import ApiaryError, UnavailableError
from apiary.sdk.agent import Agent
from apiary.sdk.runtime import RuntimeClient
from apiary.sdk.tasks import TaskContext, TaskRunner
from apiary.server.config.address import Address
from apiary.server.config.loader import load_config
from apiary.server.coordinator import Coordinator, open_coordinator
from apiary.server.inprocess import open_test_coordinator
from tests.server.runtime_harness import WAIT_S, RuntimeHttp, runtime_http, session_events

AGENT = "shell"
CHAT = (
    "import sys\n"
    "print('ready', flush=True)\n"
    "for line in sys.stdin:\n"
    "    print('got', line.strip(), flush=True)\n"
    "print('bye', flush=True)\n"
)
TOOLS = ToolSettings(
    commands=(
        CommandToolSpec("sh", ToolDescriptor("chat"), (sys.executable, "-c", CHAT),
                        policy=ExecutionPolicy(budget_wall_ms=60_000), stdin="stream"),
        CommandToolSpec("sh", ToolDescriptor("once"), (sys.executable, "-c", CHAT)),
    ),
    cancel_grace_s=2.0,
)  # fmt: skip


class Shell:
    """The thread's agent: a turn's input names the tool it runs (streamed) and returns
    what the tool printed and how its call ended."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    async def handle(self, task: TaskContext) -> object:
        tool = task.json()["input"]["tool"]
        printed, summary = b"", {}
        try:
            async for frame in self.agent.tools.stream(tool, {}):
                printed += frame.data
                summary = dict(frame.summary)
        except ApiaryError as exc:
            return {"error": exc.code, "printed": printed.decode()}
        return {"printed": printed.decode(), "status": summary.get("status")}


@asynccontextmanager
async def running_shell(coordinator: Coordinator) -> AsyncIterator[Shell]:
    async with Agent(AGENT, coordinator=str(coordinator.grpc_address)) as agent:
        shell = Shell(agent)
        job = asyncio.create_task(TaskRunner(agent, shell.handle).run())
        try:
            yield shell
        finally:
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job


@pytest.fixture(params=["memory", "sqlite"])
async def coordinator(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Coordinator]:
    """A coordinator with TOOLS, its state in memory or in a SQLite file."""
    store = f"sqlite:///{tmp_path / 'apiary.db'}" if request.param == "sqlite" else "memory://"
    async with open_test_coordinator(tmp_path, store, runtime=Runtime(tools=TOOLS)) as running:
        yield running


@pytest.fixture
async def shell(coordinator: Coordinator) -> AsyncIterator[Shell]:
    async with running_shell(coordinator) as running:
        yield running


async def _events(coordinator: Coordinator, session_id: str, ready: Any) -> list[dict[str, Any]]:
    """The session's events once `ready(events)` holds (bounded)."""

    async def poll() -> list[dict[str, Any]]:
        while True:
            found = await session_events(coordinator, session_id)
            if ready(found):
                return found
            await asyncio.sleep(0.02)

    return await asyncio.wait_for(poll(), WAIT_S)


def _of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


def _ended(events: list[dict[str, Any]]) -> bool:
    """The turn and its process have ended (their events come in either order: the agent
    may have its final frame before the tool service closes the call)."""
    done = ("process.completed", "process.failed", "process.terminated")
    return bool(_of(events, "turn.completed")) and any(_of(events, kind) for kind in done)


def _printed(events: list[dict[str, Any]]) -> str:
    return "".join(e["payload"]["text"] for e in _of(events, "process.output"))


async def _started(
    coordinator: Coordinator, runtime: RuntimeHttp, tool: str = "chat", turn_id: str = "t-1"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A turn whose agent runs `tool`, and its process.started event (once it printed)."""
    turn = await runtime.ok("submit_turn", agent_id=AGENT, turn_id=turn_id, input={"tool": tool})
    events = await _events(
        coordinator, turn["sessionId"],
        lambda found: "ready" in _printed(found) or _of(found, "process.completed"),
    )  # fmt: skip
    (started,) = _of(events, "process.started")
    return turn, started


@pytest.mark.conformance("runtime.process.known-process-id", "runtime.process.unavailable-warning")
async def test_the_application_writes_to_a_turns_process_and_terminates_it(
    coordinator: Coordinator, runtime: RuntimeHttp, shell: Shell
) -> None:
    turn, started = await _started(coordinator, runtime)
    session_id, process_id = turn["sessionId"], started["payload"]["processId"]
    assert started["toolCallId"] == process_id and started["threadId"] == turn["threadId"]
    assert started["turnId"] == "t-1" and started["status"] == "running"
    assert started["payload"]["toolId"] == "sh/chat" and started["payload"]["interactive"]
    written = await runtime.ok("write_process_stdin", process_id=process_id, text="hello\n")
    assert written["written"] == 6 and written["process"]["stdinOpen"] is True
    assert written["process"]["turnId"] == "t-1"
    raw = base64.b64encode("wörld\n".encode()).decode()
    await runtime.ok("write_process_stdin", process_id=process_id, data=raw)
    events = await _events(coordinator, session_id, lambda f: "got wörld" in _printed(f))
    assert _printed(events) == "ready\ngot hello\ngot wörld\n"
    inputs = _of(events, "process.input")
    assert [e["payload"]["text"] for e in inputs] == ["hello\n", "wörld\n"]
    assert [e["payload"]["bytes"] for e in inputs] == [6, 7]
    offsets = [e["payload"]["offset"] for e in _of(events, "process.output")]
    assert offsets == sorted(offsets) and offsets[0] == 0
    # Stopped on request: SIGTERM, the call ends CANCELLED, the process terminated.
    stopped = await runtime.ok("terminate_process", process_id=process_id, reason="enough")
    assert stopped["process"]["status"] == "terminated" and stopped["reason"] == "enough"
    events = await _events(coordinator, session_id, _ended)
    (terminated,) = _of(events, "process.terminated")
    assert terminated["toolCallId"] == process_id and terminated["status"] == "terminated"
    assert terminated["payload"]["reason"] == "enough"
    assert terminated["payload"]["inputBytes"] == 13
    assert terminated["payload"]["outputBytes"] == len(_printed(events).encode())
    order = [e["type"] for e in events if e["type"].startswith("process.")]
    assert order[0] == "process.started" and order[-1] == "process.terminated"
    task = await runtime.ok("get_task", task_id=turn["taskId"])
    assert task["task"]["result"]["status"] == "CANCELLED"
    # It has ended: unavailable, with a warning on its thread.
    late = await runtime.error(503, "write_process_stdin", process_id=process_id, text="x\n")
    assert late["code"] == "unavailable" and late["details"]["process_id"] == process_id
    again = await runtime.error(503, "terminate_process", process_id=process_id)
    assert again["details"]["field"] == "process_id"
    events = await session_events(coordinator, session_id)
    warnings = _of(events, "runtime.warning")
    assert [w["payload"]["command"] for w in warnings] == [
        "write_process_stdin", "terminate_process",
    ]  # fmt: skip
    assert all(w["threadId"] == turn["threadId"] for w in warnings)
    assert warnings[0]["payload"]["processId"] == process_id


@pytest.mark.conformance("runtime.idempotency.mutating-keys")
async def test_a_retried_write_or_terminate_answers_its_first_answer_and_does_nothing_again(
    coordinator: Coordinator, runtime: RuntimeHttp, shell: Shell
) -> None:
    turn, started = await _started(coordinator, runtime)
    session_id, process_id = turn["sessionId"], started["payload"]["processId"]
    first = await runtime.ok("write_process_stdin", process_id=process_id, text="hello\n",
                             idempotency_key="w-1")  # fmt: skip
    assert first["written"] == 6 and "replayed" not in first
    # The answer was lost: the retry answers the first answer and writes nothing again.
    again = await runtime.ok("write_process_stdin", process_id=process_id, text="hello\n",
                             idempotency_key="w-1")  # fmt: skip
    assert again == {**first, "replayed": True}
    for other in ({"text": "other\n"}, {"text": "hello\n", "eof": True}):
        error = await runtime.error(409, "write_process_stdin", process_id=process_id,
                                    idempotency_key="w-1", **other)  # fmt: skip
        assert error["code"] == "already_exists"
        assert error["details"]["field"] == "idempotency_key"
    # Keys are per principal: under the same key an operator's write is its own.
    assert coordinator.control_planes is not None
    control = await coordinator.control_planes.of("default")
    operator = Principal(PrincipalKind.OPERATOR, "ops", roles=frozenset({Role.TASKS}))
    params = {"process_id": process_id, "text": "ops\n", "idempotency_key": "w-1"}
    by_operator = await COMMANDS["write_process_stdin"](control, operator, params)
    assert by_operator["written"] == 4 and "replayed" not in by_operator
    # The command line passes its key through: its retry writes nothing either.
    for _ in range(2):
        out, _ = await _cli(coordinator, "write", process_id, "cli", "--line",
                            "--idempotency-key", "w-cli")  # fmt: skip
    assert json.loads(out)["replayed"] is True
    events = await _events(coordinator, session_id, lambda f: "got cli" in _printed(f))
    assert _printed(events) == "ready\ngot hello\ngot ops\ngot cli\n"  # each input once
    assert [e["payload"]["text"] for e in _of(events, "process.input")] == [
        "hello\n", "ops\n", "cli\n",
    ]  # fmt: skip
    stopped = await runtime.ok("terminate_process", process_id=process_id, reason="enough",
                               idempotency_key="t-1")  # fmt: skip
    assert stopped["process"]["status"] == "terminated"
    # The retry answers the first terminate's answer, not unavailable for the ended process.
    again = await runtime.ok("terminate_process", process_id=process_id, reason="enough",
                             idempotency_key="t-1")  # fmt: skip
    assert again == {**stopped, "replayed": True}
    error = await runtime.error(409, "terminate_process", process_id=process_id,
                                reason="later", idempotency_key="t-1")  # fmt: skip
    assert error["code"] == "already_exists" and error["details"]["field"] == "idempotency_key"
    late = await runtime.error(503, "terminate_process", process_id=process_id,
                               idempotency_key="t-2")  # fmt: skip
    assert late["code"] == "unavailable"  # a new request: the process has ended
    replayed = await runtime.ok("write_process_stdin", process_id=process_id, text="hello\n",
                                idempotency_key="w-1")  # fmt: skip
    assert replayed == {**first, "replayed": True}  # once ended too
    events = await _events(coordinator, session_id, _ended)
    assert len(_of(events, "process.terminated")) == 1
    assert len(_of(events, "process.input")) == 3


async def test_eof_closes_the_input_and_the_process_completes(
    coordinator: Coordinator, runtime: RuntimeHttp, shell: Shell
) -> None:
    turn, started = await _started(coordinator, runtime)
    process_id = started["payload"]["processId"]
    done = await runtime.ok("write_process_stdin", process_id=process_id, text="last\n", eof=True)
    assert done["eof"] is True and done["process"]["stdinOpen"] is False
    events = await _events(coordinator, turn["sessionId"], _ended)
    (completed,) = _of(events, "process.completed")
    assert completed["payload"]["processId"] == process_id
    assert _printed(events) == "ready\ngot last\nbye\n"
    task = await runtime.ok("get_task", task_id=turn["taskId"])
    assert task["task"]["result"]["printed"] == "ready\ngot last\nbye\n"


async def test_interrupting_the_turn_terminates_its_process(
    coordinator: Coordinator, runtime: RuntimeHttp, shell: Shell
) -> None:
    turn, started = await _started(coordinator, runtime)
    await runtime.ok("interrupt_turn", thread_id=turn["threadId"], reason="stop it all")
    events = await _events(coordinator, turn["sessionId"], lambda f: _of(f, "process.terminated"))
    (terminated,) = _of(events, "process.terminated")
    assert terminated["payload"]["processId"] == started["payload"]["processId"]
    assert terminated["payload"]["reason"] == "its owner was cancelled or ended"
    assert terminated["payload"]["terminatedBy"] == "runtime"


@pytest.mark.conformance("runtime.process.known-process-id", "runtime.process.unavailable-warning")
async def test_unknown_processes_and_bad_input_are_refused_naming_the_field(
    coordinator: Coordinator, runtime: RuntimeHttp, shell: Shell
) -> None:
    turn, started = await _started(coordinator, runtime)
    process_id = started["payload"]["processId"]
    # A process id the runtime never saw: unavailable; the session the request names is
    # warned.
    unknown = await runtime.error(
        503, "write_process_stdin", process_id="call-nope", text="x", thread_id=turn["threadId"]
    )
    assert unknown["code"] == "unavailable" and unknown["details"]["field"] == "process_id"
    assert "call-nope" in unknown["message"]
    events = await session_events(coordinator, turn["sessionId"])
    (warning,) = _of(events, "runtime.warning")
    assert warning["payload"]["processId"] == "call-nope"
    assert warning["payload"]["code"] == "process_unavailable"
    await runtime.error(503, "terminate_process", process_id="call-nope")
    # Bad input, each naming its field.
    big = await runtime.error(400, "write_process_stdin", process_id=process_id,
                              text="x" * (64 * 1024 + 1))  # fmt: skip
    assert big["details"]["field"] == "text" and "max_stdin_bytes" in big["message"]
    for params, field in (
        ({"text": "x"}, "process_id"),
        ({"process_id": process_id}, "data"),
        ({"process_id": process_id, "data": "no base64!"}, "data"),
        ({"process_id": process_id, "data": "eA==", "text": "x"}, "text"),
        ({"process_id": process_id, "text": 5}, "text"),
        ({"process_id": process_id, "text": "x", "eof": "yes"}, "eof"),
        ({"process_id": process_id, "text": "x", "signal": 9}, "signal"),
    ):
        error = await runtime.error(400, "write_process_stdin", **params)
        assert error["details"]["field"] == field, (params, error)
    # The refusals wrote nothing to the process.
    await runtime.ok("write_process_stdin", process_id=process_id, text="still here\n")
    events = await _events(coordinator, turn["sessionId"],
                           lambda f: "got still here" in _printed(f))  # fmt: skip
    assert _printed(events) == "ready\ngot still here\n"
    await runtime.ok("terminate_process", process_id=process_id)


async def test_a_process_that_takes_no_input_refuses_it(
    coordinator: Coordinator, runtime: RuntimeHttp, shell: Shell
) -> None:
    turn = await runtime.ok("submit_turn", agent_id=AGENT, turn_id="t-1", input={"tool": "once"})
    events = await _events(coordinator, turn["sessionId"], _ended)
    (started,) = _of(events, "process.started")
    assert started["payload"]["interactive"] is False
    assert _of(events, "process.completed") and _printed(events) == "ready\ngot {}\nbye\n"
    # It has ended by now: unavailable.
    ended = await runtime.error(
        503, "write_process_stdin", process_id=started["payload"]["processId"], text="x"
    )
    assert ended["code"] == "unavailable"


def test_the_runtime_table_sets_the_process_limits(tmp_path: Path) -> None:
    file = tmp_path / "apiary.toml"
    file.write_text(
        "[runtime]\nmax_stdin_bytes = 10\nprocess_output_chunk_bytes = 64\n"
        "process_output_bytes = 0\n"
    )
    settings = load_config(file, {}, {}).runtime
    assert (settings.max_stdin_bytes, settings.process_output_chunk_bytes,
            settings.process_output_bytes) == (10, 64, 0)  # fmt: skip
    file.write_text("[runtime]\nmax_stdin_bytes = 0\n")
    with pytest.raises(ApiaryError) as caught:
        load_config(file, {}, {})
    assert caught.value.details["field"] == "runtime.max_stdin_bytes"


async def _cli(
    coordinator: Coordinator, *args: str, code: int = 0, stdin: bytes = b""
) -> tuple[str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "apiary.cli.main", "runtime", "process", *args,
        "--http", str(coordinator.http_address), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(stdin), 60)
    assert proc.returncode == code, (proc.returncode, out.decode(), err.decode())
    return out.decode(), err.decode()


async def test_the_sdk_and_the_command_line_write_and_terminate(
    coordinator: Coordinator, runtime: RuntimeHttp, shell: Shell
) -> None:
    turn, started = await _started(coordinator, runtime)
    process_id = started["payload"]["processId"]
    async with RuntimeClient(f"http://{coordinator.http_address}") as client:
        written = await client.write_process_stdin(process_id, b"sdk\n")
        assert written["written"] == 4
        with pytest.raises(UnavailableError):
            await client.terminate_process("call-nope", thread_id=turn["threadId"])
    out, _ = await _cli(coordinator, "write", process_id, "cli", "--line")
    assert json.loads(out)["written"] == 4
    await _cli(coordinator, "write", process_id, stdin=b"piped\n")
    events = await _events(coordinator, turn["sessionId"], lambda f: "got piped" in _printed(f))
    assert _printed(events) == "ready\ngot sdk\ngot cli\ngot piped\n"
    out, _ = await _cli(coordinator, "terminate", process_id, "--reason", "from the shell")
    assert json.loads(out)["process"]["status"] == "terminated"
    _, err = await _cli(coordinator, "terminate", process_id, code=1)
    assert "unavailable" in err and process_id in err


@pytest.mark.conformance("runtime.task.cancel-intent-first")
async def test_an_agent_tasks_run_owns_its_process_and_cancelling_the_task_ends_it(
    coordinator: Coordinator, runtime: RuntimeHttp, shell: Shell
) -> None:
    created = await runtime.ok(
        "create_task", task_id="chat-1", agent_id=AGENT, title="Chat", input={"tool": "chat"},
        start=True,
    )  # fmt: skip
    session_id = created["sessionId"]
    events = await _events(coordinator, session_id, lambda f: "ready" in _printed(f))
    (started,) = _of(events, "process.started")
    assert started["taskId"] == "chat-1" and started["runId"]
    process_id = started["payload"]["processId"]
    written = await runtime.ok("write_process_stdin", process_id=process_id, text="hi\n")
    assert written["process"]["taskId"] == "chat-1"
    await _events(coordinator, session_id, lambda f: "got hi" in _printed(f))
    await runtime.ok("cancel_task", task_id="chat-1", reason="not needed")
    events = await _events(coordinator, session_id, lambda f: _of(f, "process.terminated"))
    (terminated,) = _of(events, "process.terminated")
    assert terminated["taskId"] == "chat-1" and terminated["runId"] == started["runId"]
    assert terminated["payload"]["terminatedBy"] == "runtime"


async def test_a_configured_interactive_command_and_its_bounded_output(tmp_path: Path) -> None:
    """From the configuration file: `stdin = "stream"` and the [runtime] output bounds."""
    file = tmp_path / "apiary.toml"
    file.write_text(
        f"[runtime]\nprocess_output_bytes = 10\nprocess_output_chunk_bytes = 64\n"
        f'[[tools.commands]]\nprovider = "sh"\nname = "chat"\nstdin = "stream"\n'
        f"argv = ['{sys.executable}', '-c', '''{CHAT}''']\n"
        f"[tools.commands.policy]\nbudget_wall_ms = 60000\n"
    )
    config = replace(
        load_config(file, {}, {}), data_dir=tmp_path / "data", store="memory://",
        grpc=Address("127.0.0.1", 0), http=Address("127.0.0.1", 0),
    )  # fmt: skip
    async with (
        open_coordinator(config) as coordinator,
        runtime_http(coordinator) as runtime,
        running_shell(coordinator),
    ):
        turn, started = await _started(coordinator, runtime)
        process_id = started["payload"]["processId"]
        await runtime.ok("write_process_stdin", process_id=process_id, text="hello\n", eof=True)
        events = await _events(coordinator, turn["sessionId"], _ended)
        assert _printed(events) == "ready\ngot "  # the first 10 bytes of 20
        (completed,) = _of(events, "process.completed")
        assert completed["payload"]["outputBytes"] == 10
        assert completed["payload"]["droppedBytes"] == 10
        task = await runtime.ok("get_task", task_id=turn["taskId"])
        assert task["task"]["result"]["printed"] == "ready\ngot hello\nbye\n"  # the call's own
