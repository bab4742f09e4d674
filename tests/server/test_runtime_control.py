"""The runtime control plane against a real coordinator (HTTP sockets, an SDK agent over
gRPC): turns run as tasks of their thread's agent and carry its result back, the contract's
rules (idempotent turn ids, per-thread queues, interrupts, reconnect by acknowledged
sequence), clear errors for unknown ids, and JSON-RPC over the same commands. Every event
and snapshot the tests see is validated against the contract's schemas."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest

from apiary.controlplane.commands import COMMANDS, CONTRACT_COMMANDS
from apiary.sdk.runtime import RuntimeClient, StreamSnapshot
from apiary.server.coordinator import Coordinator
from apiary.wire import pb
from tests.server.runtime_harness import (
    WAIT_S,
    Answerer,
    RuntimeHttp,
    check_snapshot,
    session_events,
    types,
)
from tests.server.wire_client import error_detail

AGENT = "answerer"


async def _register_offline(coordinator: Coordinator, agent_id: str) -> None:
    """An agent that is registered but has no inbound stream: its tasks wait QUEUED."""
    await coordinator.registry.register(
        {"agent_id": agent_id, "name": agent_id, "reasoning_connectors": ["builtin://rules"]}
    )


def _turns(read: dict[str, Any]) -> dict[str, str]:
    return {t["turnId"]: t["status"] for t in read["threads"][0]["turns"]}


def _queued(read: dict[str, Any]) -> list[str]:
    return [q["turnId"] for q in read["threads"][0]["queuedTurns"]]


async def test_a_turn_runs_as_a_task_of_its_threads_agent_and_its_result_comes_back(
    coordinator: Coordinator, runtime: RuntimeHttp, answerer: Answerer
) -> None:
    submitted = await runtime.ok(
        "submit_turn", agent_id=AGENT, turn_id="turn-1", input={"value": 42}, title="first"
    )
    assert submitted["created"] and submitted["turnId"] == "turn-1"
    thread_id, session_id = submitted["threadId"], submitted["sessionId"]
    read = await runtime.thread_status(thread_id, "completed")
    thread = read["threads"][0]
    assert thread["lastOutcome"] == {"turnId": "turn-1", "status": "completed",
                                     "result": {"answer": 42}}  # fmt: skip
    assert thread["agentId"] == AGENT and thread["queuedTurns"] == []
    (task,) = read["tasks"]
    assert task["taskId"] == submitted["taskId"] and task["turnId"] == "turn-1"
    assert (task["status"], task["nativeStatus"]) == ("completed", "COMPLETED")
    # The turn is an Apiary task: get_task carries its result, list_tasks lists it.
    got = (await runtime.ok("get_task", task_id=submitted["taskId"]))["task"]
    assert got["result"] == {"answer": 42} and got["assignee"] == {"agentId": AGENT}
    listed = await runtime.ok("list_tasks", session_id=session_id)
    assert [t["taskId"] for t in listed["tasks"]] == [submitted["taskId"]]
    assert coordinator.scheduler is not None
    stored = await coordinator.scheduler.find(submitted["taskId"])
    assert (stored.agent_id, stored.state) == (AGENT, "COMPLETED")
    # The session's facts, in order, each valid against the event schema.
    events = await session_events(coordinator, session_id)
    assert types(events) == [
        "session.created", "thread.started", "turn.submitted", "task.created",
        "thread.updated", "task.started", "turn.started", "thread.updated",
        "task.completed", "turn.completed", "thread.updated",
    ]  # fmt: skip
    completed = next(e for e in events if e["type"] == "turn.completed")
    assert completed["payload"] == {"result": {"answer": 42}}
    assert completed["taskId"] == submitted["taskId"] and completed["status"] == "completed"
    sequences = [e["sequence"] for e in events]
    assert sequences == sorted(sequences) and len(set(e["eventId"] for e in events)) == 11
    session = await runtime.ok("get_session", session_id=session_id)
    assert session["session"]["title"] == "first"
    assert session["cursor"]["sequence"] >= sequences[-1]
    # The SDK's wait for a turn that has ended answers from the snapshot, with its result.
    async with RuntimeClient(f"http://{coordinator.http_address}") as client:
        ended = await client.wait_turn(session_id, "turn-1", timeout=WAIT_S)
    assert (ended.status, ended.result) == ("completed", {"answer": 42})


async def test_a_failed_task_fails_its_turn_with_the_agents_error(
    coordinator: Coordinator, runtime: RuntimeHttp, answerer: Answerer
) -> None:
    submitted = await runtime.ok("submit_turn", agent_id=AGENT, input={"mode": "fail"})
    read = await runtime.thread_status(submitted["threadId"], "failed")
    (turn,) = read["threads"][0]["turns"]
    assert turn["error"]["code"] == "no_answer" and turn["status"] == "failed"
    assert read["threads"][0]["incidents"][0]["error"]["code"] == "no_answer"
    events = await session_events(coordinator, submitted["sessionId"])
    failed = next(e for e in events if e["type"] == "turn.failed")
    assert failed["payload"]["error"] == {"code": "no_answer", "message": "no answer to that"}


@pytest.mark.conformance("runtime.idempotency.submit-turn-turn-id")
async def test_retrying_submit_turn_with_the_same_turn_id_creates_no_second_turn(
    coordinator: Coordinator, runtime: RuntimeHttp, answerer: Answerer
) -> None:
    first = await runtime.ok("submit_turn", agent_id=AGENT, turn_id="t-once", input="hello")
    # The retry of a request whose answer was lost names no session: it is still the turn.
    again = await runtime.ok("submit_turn", agent_id=AGENT, turn_id="t-once", input="hello")
    named = await runtime.ok(
        "submit_turn", session_id=first["sessionId"], thread_id=first["threadId"],
        turn_id="t-once", input="hello",
    )  # fmt: skip
    assert not again["created"] and not named["created"]
    for answer in (again, named):
        for key in ("sessionId", "threadId", "turnId", "taskId"):
            assert answer[key] == first[key], key
    read = await runtime.thread_status(first["threadId"], "completed")
    assert list(_turns(read)) == ["t-once"] and read["threads"][0]["turnCount"] == 1
    assert len((await runtime.ok("list_tasks", thread_id=first["threadId"]))["tasks"]) == 1
    assert answerer.seen == ["t-once"]
    events = await session_events(coordinator, first["sessionId"])
    assert types(events).count("turn.submitted") == 1
    # Other content under the same turn id is refused, naming what differs.
    error = await runtime.error(409, "submit_turn", agent_id=AGENT, turn_id="t-once", input="bye")
    assert error["code"] == "already_exists" and error["details"]["field"] == "turn_id"
    assert error["details"]["differs"] == "input"


@pytest.mark.conformance("runtime.queue.policy")
async def test_turns_queue_per_thread_and_an_interrupt_of_a_queued_turn_cancels_it(
    coordinator: Coordinator, runtime: RuntimeHttp, answerer: Answerer
) -> None:
    first = await runtime.ok("submit_turn", agent_id=AGENT, turn_id="q-1", input={"mode": "hold"})
    thread_id = first["threadId"]
    await runtime.thread_status(thread_id, "running")
    for turn_id in ("q-2", "q-3", "q-4"):
        queued = await runtime.ok(
            "submit_turn", thread_id=thread_id, turn_id=turn_id, input=turn_id
        )
        assert queued["status"] == "queued"
    read = await runtime.ok("get_thread_read", thread_id=thread_id)
    assert _queued(read) == ["q-2", "q-3", "q-4"] and read["threads"][0]["status"] == "running"
    assert [q["position"] for q in read["threads"][0]["queuedTurns"]] == [1, 2, 3]
    # An interrupt of a queued turn cancels it at once; it never becomes a task.
    interrupted = await runtime.ok("interrupt_turn", turn_id="q-2", reason="not needed")
    assert (interrupted["status"], interrupted["interrupt"]) == ("cancelled", "cancelled")
    removed = await runtime.ok("remove_queued_turn", turn_id="q-3")
    assert removed == {"turnId": "q-3", "status": "cancelled", "removed": True}
    read = await runtime.ok("get_thread_read", thread_id=thread_id)
    assert _queued(read) == ["q-4"]
    answerer.release("q-1")
    read = await runtime.thread_status(thread_id, "completed")
    assert _turns(read) == {"q-1": "completed", "q-2": "cancelled", "q-3": "cancelled",
                            "q-4": "completed"}  # fmt: skip
    assert answerer.seen == ["q-1", "q-4"]
    assert [t["turnId"] for t in read["tasks"]] == ["q-1", "q-4"]
    events = await session_events(coordinator, first["sessionId"])
    assert types(events, "q-2") == ["turn.submitted", "turn.failed"]
    cancelled = next(e for e in events if e["type"] == "turn.failed" and e["turnId"] == "q-2")
    assert cancelled["status"] == "cancelled" and cancelled["statusReason"] == "interrupted"
    queues = [e["payload"]["queuedTurns"] for e in events if e["type"] == "queue.changed"]
    assert queues == [["q-2"], ["q-2", "q-3"], ["q-2", "q-3", "q-4"], ["q-3", "q-4"], ["q-4"], []]
    # A thread whose queue_policy is reject refuses work while it is busy.
    strict = await runtime.ok(
        "submit_turn", agent_id=AGENT, input={"mode": "hold"}, turn_id="r-1",
        queue_policy="reject",
    )  # fmt: skip
    await answerer.running("r-1")
    error = await runtime.error(409, "submit_turn", thread_id=strict["threadId"], input="more")
    assert error["code"] == "already_in_progress" and error["details"]["field"] == "thread_id"
    answerer.release("r-1")


async def test_an_interrupt_of_a_turn_whose_task_waits_cancels_the_task(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    await _register_offline(coordinator, "offline")
    first = await runtime.ok("submit_turn", agent_id="offline", turn_id="w-1", input="a")
    await runtime.ok("submit_turn", thread_id=first["threadId"], turn_id="w-2", input="b")
    read = await runtime.ok("get_thread_read", thread_id=first["threadId"])
    assert _turns(read) == {"w-1": "preparing", "w-2": "queued"}
    assert read["threads"][0]["diagnostics"]["activeTaskState"] == "QUEUED"
    answer = await runtime.ok("interrupt_turn", thread_id=first["threadId"])
    assert (answer["turnId"], answer["status"]) == ("w-1", "cancelled")
    assert coordinator.scheduler is not None
    task = await coordinator.scheduler.find(first["taskId"])
    assert (task.state, task.error_code) == ("FAILED", "cancelled")
    # The thread went on with its next turn, whose task now waits in its turn.
    read = await runtime.ok("get_thread_read", thread_id=first["threadId"])
    assert _turns(read) == {"w-1": "cancelled", "w-2": "preparing"}
    events = await session_events(coordinator, first["sessionId"])
    assert types(events, "w-1") == [
        "turn.submitted",
        "task.created",
        "task.cancel_requested",
        "task.cancelled",
        "turn.failed",
    ]
    # Clearing the queue with the interrupt cancels what waits behind.
    await runtime.ok("submit_turn", thread_id=first["threadId"], turn_id="w-3", input="c")
    cleared = await runtime.ok("interrupt_turn", thread_id=first["threadId"], queued="clear")
    assert cleared["clearedTurns"] == ["w-3"]
    read = await runtime.thread_status(first["threadId"], "cancelled")
    assert _turns(read) == {"w-1": "cancelled", "w-2": "cancelled", "w-3": "cancelled"}


async def test_an_interrupt_of_a_running_turn_stops_it_at_the_agents_next_safe_point(
    coordinator: Coordinator, runtime: RuntimeHttp, answerer: Answerer
) -> None:
    first = await runtime.ok("submit_turn", agent_id=AGENT, turn_id="l-1", input={"mode": "loop"})
    await runtime.ok("submit_turn", thread_id=first["threadId"], turn_id="l-2", input=7)
    await runtime.until(
        "get_thread_read", lambda d: _turns(d)["l-1"] == "running", thread_id=first["threadId"]
    )
    answer = await runtime.ok("interrupt_turn", thread_id=first["threadId"], reason="enough")
    assert answer["turnId"] == "l-1" and answer["interrupt"] in ("requested", "cancelled")
    read = await runtime.thread_status(first["threadId"], "completed")
    assert _turns(read) == {"l-1": "cancelled", "l-2": "completed"}
    assert answerer.seen == ["l-1", "l-2"]  # the interrupted turn did not run again
    events = await session_events(coordinator, first["sessionId"])
    assert types(events, "l-1") == [
        "turn.submitted", "task.created", "task.started", "turn.started",
        "task.cancel_requested", "task.cancelled", "turn.failed",
    ]  # fmt: skip
    stopped = next(e for e in events if e["type"] == "turn.failed")
    assert stopped["payload"]["error"]["code"] == "cancelled"
    requested = next(e for e in events if e["type"] == "task.cancel_requested")
    assert requested["payload"] == {"reason": "enough"}


@pytest.mark.conformance("runtime.channel.reconnect-params", "runtime.channel.snapshot-then-replay")
async def test_reconnect_answers_the_snapshot_then_replays_from_the_acknowledged_sequence(
    coordinator: Coordinator, runtime: RuntimeHttp, answerer: Answerer
) -> None:
    first = await runtime.ok("submit_turn", agent_id=AGENT, turn_id="c-1", input=1)
    session_id = first["sessionId"]
    opened = await runtime.ok("reconnect_channel", session_id=session_id)
    channel = opened["channel"]
    token, channel_id = channel["resumeToken"], channel["channelId"]
    start = channel["acknowledgedSequence"]
    assert opened["snapshot"]["cursor"]["sequence"] >= start
    assert types(opened["events"]) == ["channel.connected"]
    await runtime.ok("submit_turn", session_id=session_id, thread_id=first["threadId"],
                     turn_id="c-2", input=2)  # fmt: skip
    await runtime.thread_status(first["threadId"], "completed")
    everything = [e for e in await session_events(coordinator, session_id)
                  if e["sequence"] > start]  # fmt: skip
    middle = next(e["sequence"] for e in everything if e["type"] == "turn.submitted")
    acked = await runtime.ok(
        "ack_events", channel_id=channel_id, resume_token=token, sequence=middle
    )
    assert acked["acknowledgedSequence"] == middle
    # Resumed from the acknowledged sequence: the snapshot first, then every later event.
    resumed = await runtime.ok(
        "reconnect_channel", session_id=session_id, channel_id=channel_id,
        resume_token=token, last_acknowledged_sequence=middle,
    )  # fmt: skip
    assert "resumeToken" not in resumed["channel"]
    check_snapshot(resumed["snapshot"])
    assert {t["turnId"]: t["status"] for t in resumed["snapshot"]["threads"][0]["turns"]} == {
        "c-1": "completed",
        "c-2": "completed",
    }
    later = [e for e in everything if e["sequence"] > middle]
    replayed = resumed["events"]
    assert [e["eventId"] for e in replayed[: len(later)]] == [e["eventId"] for e in later]
    assert types(replayed[len(later) :]) == ["channel.resumed"]
    assert not resumed["more"] and resumed["cursor"]["sequence"] >= replayed[-1]["sequence"]
    # Without a position it resumes from the acknowledged one; a page is bounded by limit.
    paged = await runtime.ok(
        "reconnect_channel", session_id=session_id, channel_id=channel_id, resume_token=token,
        limit=2,
    )  # fmt: skip
    assert [e["eventId"] for e in paged["events"]] == [e["eventId"] for e in later[:2]]
    assert paged["more"] and paged["cursor"]["sequence"] == later[1]["sequence"]
    # Acknowledgements never go back.
    back = await runtime.ok("ack_events", channel_id=channel_id, resume_token=token, sequence=1)
    assert back["acknowledgedSequence"] == middle


@pytest.mark.conformance("runtime.channel.reconnect-params")
async def test_an_expired_position_or_a_wrong_token_is_refused_with_the_way_to_recover(
    coordinator: Coordinator, runtime: RuntimeHttp, answerer: Answerer
) -> None:
    first = await runtime.ok("submit_turn", agent_id=AGENT, input=1)
    session_id = first["sessionId"]
    channel = (await runtime.ok("reconnect_channel", session_id=session_id))["channel"]
    channel_id, token = channel["channelId"], channel["resumeToken"]
    await runtime.thread_status(first["threadId"], "completed")
    last = (await runtime.ok("get_session", session_id=session_id))["cursor"]["sequence"]
    await runtime.ok("ack_events", channel_id=channel_id, resume_token=token, sequence=last)
    released = await runtime.error(
        410, "reconnect_channel", session_id=session_id, channel_id=channel_id,
        resume_token=token, last_acknowledged_sequence=last - 1,
    )  # fmt: skip
    assert released["code"] == "resume_expired"
    assert released["details"]["reason"] == "position_released"
    assert "open a new channel" in released["message"]
    wrong = await runtime.error(
        403, "reconnect_channel", session_id=session_id, channel_id=channel_id,
        resume_token="not-the-token",
    )  # fmt: skip
    assert wrong["code"] == "permission_denied" and wrong["details"]["field"] == "resume_token"
    ahead = await runtime.error(
        400, "reconnect_channel", session_id=session_id, channel_id=channel_id,
        resume_token=token, last_acknowledged_sequence=last + 10**6,
    )  # fmt: skip
    assert ahead["details"]["field"] == "last_acknowledged_sequence"
    missing = await runtime.error(
        404, "reconnect_channel", session_id=session_id, channel_id="nope", resume_token=token
    )
    assert missing["details"]["field"] == "channel_id"
    assert "open a new channel" in missing["message"]
    # The recovery: a new channel, whose snapshot is the whole state.
    fresh = await runtime.ok("reconnect_channel", session_id=session_id)
    assert fresh["snapshot"]["threads"][0]["status"] == "completed"


async def test_the_event_stream_sends_the_snapshot_then_replays_then_follows_live(
    coordinator: Coordinator, runtime: RuntimeHttp, answerer: Answerer
) -> None:
    await _register_offline(coordinator, "idle")
    made = await runtime.ok("submit_turn", agent_id="idle", input="a session for the stream")
    session_id = made["sessionId"]
    opened = await runtime.ok("reconnect_channel", session_id=session_id)
    channel = opened["channel"]
    first = await runtime.ok(
        "submit_turn", session_id=session_id, agent_id=AGENT, turn_id="s-1", input="one"
    )
    await runtime.thread_status(first["threadId"], "completed")
    submitted = next(
        e["sequence"] for e in await session_events(coordinator, session_id)
        if e["type"] == "turn.submitted" and e["turnId"] == "s-1"
    )  # fmt: skip
    async with RuntimeClient(f"http://{coordinator.http_address}") as client:
        stream = client.events(
            session_id, channel_id=channel["channelId"], resume_token=channel["resumeToken"],
            after=submitted,
        )  # fmt: skip
        items: list[Any] = []

        async def read_until_second_turn_ends() -> None:
            async for item in stream:
                items.append(item)
                if not isinstance(item, StreamSnapshot) and item.type == "turn.completed":
                    if item.turn_id == "s-2":
                        return
                    await runtime.ok("submit_turn", thread_id=first["threadId"],
                                     turn_id="s-2", input="two")  # fmt: skip

        await asyncio.wait_for(read_until_second_turn_ends(), WAIT_S)
        await stream.aclose()
    assert isinstance(items[0], StreamSnapshot) and items[0].after == submitted
    assert items[0].snapshot.session_id == session_id
    events = [i for i in items[1:]]
    sequences = [e.sequence for e in events]
    assert sequences == sorted(sequences) and sequences[0] > submitted
    assert [e.turn_id for e in events if e.type == "turn.completed"] == ["s-1", "s-2"]
    assert "channel.resumed" in [e.type for e in events]
    # A stream without a channel (a browser reconnecting with Last-Event-ID) starts a new
    # channel at the position it holds: nothing in between is lost.
    async with RuntimeClient(f"http://{coordinator.http_address}") as client:
        fresh = client.events(session_id, after=submitted)
        first_items = [await anext(fresh) for _ in range(3)]
        await fresh.aclose()
    assert isinstance(first_items[0], StreamSnapshot) and first_items[0].after == submitted
    assert [e.event_id for e in first_items[1:]] == [e.event_id for e in events[:2]]


async def test_unknown_ids_and_bad_parameters_answer_clear_errors(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    await _register_offline(coordinator, "offline")
    for command, params, status, field in [
        ("get_session", {"session_id": "nope"}, 404, "session_id"),
        ("get_thread_read", {"thread_id": "nope"}, 404, "thread_id"),
        ("interrupt_turn", {"turn_id": "nope"}, 404, "turn_id"),
        ("remove_queued_turn", {"turn_id": "nope"}, 404, "turn_id"),
        ("get_task", {"task_id": "nope"}, 404, "task_id"),
        ("list_tasks", {"session_id": "nope"}, 404, "session_id"),
        ("ack_events", {"channel_id": "nope", "resume_token": "t", "sequence": 1}, 404,
         "channel_id"),
        ("reconnect_channel", {"session_id": "nope"}, 404, "session_id"),
        ("submit_turn", {"agent_id": "nobody", "input": 1}, 404, "agent_id"),
        ("submit_turn", {"input": 1}, 400, "agent_id"),
        ("submit_turn", {"agent_id": "offline"}, 400, "input"),
        ("submit_turn", {"agent_id": "offline", "input": 1, "agnet": "x"}, 400, "agnet"),
        ("submit_turn", {"agent_id": "offline", "input": 1, "priority": 99}, 400, "priority"),
        ("submit_turn", {"agent_id": "offline", "input": 1, "scope": "nonsense"}, 400, "scope"),
        ("get_session", {}, 400, "session_id"),
        ("ack_events", {"channel_id": "c", "resume_token": "t"}, 400, "sequence"),
    ]:  # fmt: skip
        error = await runtime.error(status, command, **params)
        assert error["details"].get("field") == field, (command, error)
    # camelCase parameters are the same parameters.
    made = await runtime.ok("submit_turn", agentId="offline", turnId="camel", input=1)
    assert made["turnId"] == "camel"
    error = await runtime.error(
        409, "remove_queued_turn", turnId="camel"
    )  # it started: its task waits for the agent
    assert error["code"] == "already_in_progress"
    unknown = await runtime.error(404, "no_such_command")
    assert unknown["code"] == "not_found"
    for name in [c for c in CONTRACT_COMMANDS if c not in COMMANDS][:1]:  # one designed
        designed = await runtime.error(501, name)
        assert (
            designed["code"] == "unimplemented" and "docs/control-plane.md" in designed["message"]
        )
    async with runtime.http.post("/runtime/v1/get_session", data=b"[1, 2]") as response:
        assert response.status == 400
        assert (await response.json())["error"]["details"]["field"] == "body"
    async with runtime.http.get("/runtime/v1") as response:
        listed = (await response.json())["commands"]
    assert len(listed) == 41
    assert {c["command"] for c in listed if c["served"]} == set(COMMANDS)
    assert {"submit_turn", "get_session", "create_task", "retry_task"} <= set(COMMANDS)


async def test_json_rpc_runs_the_same_commands(
    coordinator: Coordinator, runtime: RuntimeHttp, answerer: Answerer
) -> None:
    made = await runtime.call("submit_turn", agent_id=AGENT, turn_id="j-1", input={"value": "x"})
    result = made["result"]
    assert result["created"] and result["turnId"] == "j-1"
    read = await runtime.thread_status(result["threadId"], "completed")
    assert read["threads"][0]["lastOutcome"]["result"] == {"answer": "x"}
    by_rpc = await runtime.call("get_thread_read", thread_id=result["threadId"])
    assert by_rpc["result"]["threads"][0]["status"] == "completed"
    # Errors: a refusal carries its protocol error; bad params -32602; no method -32601.
    missing = await runtime.call("get_session", session_id="nope")
    assert missing["error"]["code"] == -32000
    assert missing["error"]["data"] == {
        "code": "not_found",
        "httpStatus": 404,
        "details": {"field": "session_id", "session_id": "nope"},
    }
    assert (await runtime.call("get_session"))["error"]["code"] == -32602
    assert (await runtime.call("no_such"))["error"]["code"] == -32601
    for name in [c for c in CONTRACT_COMMANDS if c not in COMMANDS][:1]:  # one designed
        assert (await runtime.call(name))["error"]["code"] == -32601
    status, parse = await runtime.rpc("{not json")  # sent as a JSON string: not a call
    assert status == 200 and parse["error"]["code"] == -32600
    async with runtime.http.post("/runtime/v1/rpc", data=b"{not json") as response:
        assert (await response.json())["error"]["code"] == -32700
    # A batch answers each call that has an id; notifications get nothing back.
    task, session = {"task_id": result["taskId"]}, {"session_id": result["sessionId"]}
    status, batch = await runtime.rpc([
        {"jsonrpc": "2.0", "id": "a", "method": "get_task", "params": task},
        {"jsonrpc": "2.0", "method": "get_session", "params": session},
        {"jsonrpc": "1.0", "id": "c", "method": "get_task"},
    ])  # fmt: skip
    assert status == 200 and [a["id"] for a in batch] == ["a", "c"]
    assert batch[0]["result"]["task"]["result"] == {"answer": "x"}
    assert batch[1]["error"]["code"] == -32600
    status, nothing = await runtime.rpc(
        {"jsonrpc": "2.0", "method": "get_session", "params": {"session_id": "nope"}}
    )
    assert (status, nothing) == (204, None)


async def test_the_commands_are_served_over_grpc_as_over_http(
    coordinator: Coordinator, channel: grpc.aio.Channel, answerer: Answerer
) -> None:
    """RuntimeControlService.Call: a command's parameters and result as JSON text, its
    refusal the call's status with the protocol error."""
    stub = pb.apiary_pb2_grpc.RuntimeControlServiceStub(channel)

    async def call(command: str, params: str) -> Any:
        request = pb.apiary_pb2.RuntimeCommandRequest(command=command, params_json=params.encode())
        return json.loads((await stub.Call(request)).result_json)

    submitted = await call(
        "submit_turn", json.dumps({"agent_id": AGENT, "turn_id": "g-1", "input": {"value": 7}})
    )
    assert submitted["created"] and submitted["turnId"] == "g-1"
    await answerer.running("g-1")
    async with RuntimeClient(f"http://{coordinator.http_address}") as client:
        ended = await client.wait_turn(submitted["sessionId"], "g-1", timeout=WAIT_S)
    assert (ended.status, ended.result) == ("completed", {"answer": 7})
    got = await call("get_task", json.dumps({"task_id": submitted["taskId"]}))
    assert got["task"]["result"] == {"answer": 7}
    for command, params, code, field in (
        ("no_such_command", "", grpc.StatusCode.NOT_FOUND, ""),
        ("get_task", "[1]", grpc.StatusCode.INVALID_ARGUMENT, "params_json"),
        ("get_task", "{", grpc.StatusCode.INVALID_ARGUMENT, "params_json"),
        ("get_task", '{"task_id": "none-such"}', grpc.StatusCode.NOT_FOUND, ""),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call(command, params)
        assert refused.value.code() is code, (command, params, refused.value.details())
        if field:
            assert error_detail(refused.value).details["field"] == field
