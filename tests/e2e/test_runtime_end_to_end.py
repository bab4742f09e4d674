"""The runtime control plane end to end, every part a real process: `apiary serve` on a
SQLite file (with a HITL operator configured, so that questions wait for a person), an SDK
agent run by `apiary agent run` (tests/e2e/runtime_agents.py), and an application that
drives it over HTTP with `apiary.RuntimeClient`.

The application follows its session's channel as server-sent events and acknowledges what
it handled. It submits turns: one is answered; one asks a decision inside the turn, which
the application sees as `action.required` and answers with respond_action; a slow one is
interrupted and stops at the agent's next safe point. With the agent gone and turns
waiting, the coordinator is SIGKILLed and started again on the same file. The application
reconnects its channel with the last sequence it acknowledged and its resume token: the
snapshot comes first, then every event after that sequence, none it acknowledged and none
twice, exactly as the log holds them. It resumes the thread explicitly (the runtime follows
the waiting turn's task), the agent comes back, the waiting turns and a new one complete,
and the application exports the session's evidence (whose digest it recomputes from the
events, as docs/control-plane.md says) and its replay case (each turn's input and outcome,
as the application saw them end). Every event and snapshot the application sees is
validated against the contract's schemas.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from apiary.core.runtime.events import RuntimeEvent
from apiary.core.runtime.snapshot import RuntimeSnapshot
from apiary.errors import NotFoundError
from apiary.sdk.errors import CoordinatorUnreachableError
from apiary.sdk.runtime import ChannelInfo, RuntimeClient, StreamSnapshot
from tests.e2e.coordinator_process import ServeProcess, kill, start_agent
from tests.server.runtime_harness import check_event, check_snapshot

WAIT_S = 30.0
AGENT = "answerer"
TARGET = "tests.e2e.runtime_agents:Answerer"
CONFIG = """\
[hitl]
timeout_s = 600                  # a question waits for a person this long (then: deny)
timeout_action = "DENY"

[[hitl.operators]]
name = "olivia"
token = "t0ken"
roles = ["admin"]
"""
EVIDENCE_PAGE = 25
"""Events per evidence page: small, so that the export takes several pages."""


class Follower:
    """The application's live view of its session: the channel as server-sent events, the
    snapshot first, then each event in order, every one validated against its schema."""

    def __init__(self, app: RuntimeClient, session_id: str, channel: ChannelInfo) -> None:
        self.app = app
        self.session_id = session_id
        self.channel = channel
        self.snapshot: StreamSnapshot | None = None
        self.events: list[RuntimeEvent] = []
        self.ended: Exception | None = None
        """Why the stream ended (the coordinator went away)."""
        self._changed = asyncio.Condition()
        self._job: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._job = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        stream = self.app.events(
            self.session_id, channel_id=self.channel.channel_id,
            resume_token=self.channel.resume_token,
        )  # fmt: skip
        try:
            async for item in stream:
                if isinstance(item, StreamSnapshot):
                    assert self.snapshot is None and not self.events, "a second snapshot"
                    check_snapshot(item.snapshot.to_json())
                    self.snapshot = item
                else:
                    assert self.snapshot is not None, f"{item.type} came before the snapshot"
                    check_event(item.to_json())
                    self.events.append(item)
                async with self._changed:
                    self._changed.notify_all()
        except (CoordinatorUnreachableError, aiohttp.ClientError) as exc:
            self.ended = exc
        async with self._changed:
            self._changed.notify_all()

    async def first(
        self, kind: str, *, payload: Mapping[str, Any] | None = None, **where: Any
    ) -> RuntimeEvent:
        """The first event of type `kind` whose attributes match `where` (and whose payload
        holds `payload`), once it came."""

        def matches(event: RuntimeEvent) -> bool:
            if event.type != kind or any(getattr(event, k) != v for k, v in where.items()):
                return False
            held = event.payload if isinstance(event.payload, Mapping) else {}
            return all(held.get(k) == v for k, v in (payload or {}).items())

        def found() -> RuntimeEvent | None:
            for event in self.events:
                if matches(event):
                    return event
            assert self._job is None or not self._job.done(), f"stream ended before {kind}"
            return None

        async with self._changed:
            return await asyncio.wait_for(self._changed.wait_for(found), WAIT_S)

    async def through(self, sequence: int) -> None:
        """Wait until the events up to `sequence` came."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: self.last >= sequence), WAIT_S)

    @property
    def last(self) -> int:
        return _seq(self.events[-1]) if self.events else -1

    async def ack(self, through: RuntimeEvent) -> int:
        """Acknowledge every event up to `through`, which the application handled."""
        acked = await self.app.ack_events(
            self.channel.channel_id, self.channel.resume_token, _seq(through)
        )
        assert acked.acknowledged_sequence == _seq(through)
        return acked.acknowledged_sequence

    async def ended_by_the_crash(self) -> None:
        assert self._job is not None
        await asyncio.wait_for(self._job, WAIT_S)
        assert self.ended is not None

    async def stop(self) -> None:
        if self._job is not None:
            self._job.cancel()
            await asyncio.gather(self._job, return_exceptions=True)


def _seq(event: RuntimeEvent) -> int:
    assert event.sequence is not None
    return event.sequence


def _ids(events: Sequence[RuntimeEvent | Mapping[str, Any]]) -> list[tuple[int, str, str]]:
    """(sequence, event id, type) of each event, typed or as a contract document."""
    out = []
    for e in events:
        if isinstance(e, RuntimeEvent):
            out.append((_seq(e), e.event_id, e.type))
        else:
            out.append((int(e["sequence"]), str(e["eventId"]), str(e["type"])))
    return out


def _turns(snapshot: RuntimeSnapshot) -> dict[str, str]:
    return {t.turn_id: t.status for thread in snapshot.threads for t in thread.turns or ()}


def _digest(events: Sequence[Mapping[str, Any]]) -> str:
    """docs/control-plane.md: `sha256:` of the events' canonical JSON (sorted keys, no
    spaces, UTF-8), recomputed here on the application's side."""
    text = json.dumps(list(events), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[ServeProcess]:
    config = tmp_path / "apiary.toml"
    config.write_text(CONFIG)
    running = ServeProcess(tmp_path / "state", config)
    await running.start()
    yield running
    if running.proc is not None:
        await kill(running.proc)


async def _first_turn(app: RuntimeClient) -> tuple[str, str]:
    """Submit the first turn once the agent registered: the session and thread ids."""

    async def submit() -> tuple[str, str]:
        while True:
            try:
                turn = await app.submit_turn({"value": 1}, agent_id=AGENT, turn_id="t-1")
            except NotFoundError:  # the agent has not registered yet
                await asyncio.sleep(0.05)
                continue
            assert turn.created
            return turn.session_id, turn.thread_id

    return await asyncio.wait_for(submit(), WAIT_S)


async def _open_channel(app: RuntimeClient, session_id: str) -> ChannelInfo:
    """A channel over the session from its first event: its snapshot, then its events."""
    opened = await app.reconnect_channel(session_id, last_acknowledged_sequence=0)
    check_snapshot(opened.snapshot.to_json())
    for event in opened.events:
        check_event(event.to_json())
    assert opened.channel.acknowledged_sequence == 0 and opened.channel.resume_token
    assert opened.events[0].type == "session.created"
    (connected,) = [e for e in opened.events if e.type == "channel.connected"]
    assert connected.channel_id == opened.channel.channel_id
    return opened.channel


async def _answered_turn(follower: Follower) -> RuntimeEvent:
    done = await follower.first("turn.completed", turn_id="t-1")
    assert done.payload["result"] == {"answer": 1, "turn": "t-1"}
    return done


async def _decided_turn(app: RuntimeClient, follower: Follower, thread_id: str) -> RuntimeEvent:
    """A turn whose agent asks a decision: the application answers the action."""
    await app.submit_turn({"mode": "ask", "ask": "push to main"}, thread_id=thread_id,
                          turn_id="t-2")  # fmt: skip
    required = await follower.first("action.required", turn_id="t-2")
    action = required.payload
    assert action["prompt"] == "May I push to main?"
    assert action["decisions"] == ["approve", "deny"]
    assert action["policy"]["timeoutAction"] == "DENY"
    assert action["scope"]["turnId"] == "t-2" and action["scope"]["threadId"] == thread_id
    read = await app.get_thread_read(thread_id)
    check_snapshot(read.to_json())
    pending = read.to_json()["threads"][0]["pendingRequests"]
    assert required.action_id is not None
    assert [p["actionId"] for p in pending] == [required.action_id]
    answer = await app.respond_action(required.action_id, "approve", rationale="reviewed")
    assert answer["status"] == "resolved" and answer["decision"]["approved"] is True
    resolved = await follower.first("action.resolved", action_id=required.action_id)
    assert resolved.payload["decision"] == "approve" and resolved.payload["approved"] is True
    done = await follower.first("turn.completed", turn_id="t-2")
    assert done.payload["result"] == {"decision": "approve", "turn": "t-2"}
    assert _seq(required) < _seq(resolved) < _seq(done)
    return done


async def _interrupted_turn(app: RuntimeClient, follower: Follower, thread_id: str) -> RuntimeEvent:
    """A slow turn, interrupted while it runs: it stops at the agent's next safe point."""
    await app.submit_turn({"mode": "loop"}, thread_id=thread_id, turn_id="t-3")
    await follower.first("turn.started", turn_id="t-3")
    await app.interrupt_turn(thread_id=thread_id, reason="changed my mind")
    stopped = await follower.first("turn.failed", turn_id="t-3")
    assert stopped.status == "cancelled" and stopped.payload["error"]["code"] == "cancelled"
    intent = await follower.first("task.cancel_requested", turn_id="t-3")
    assert _seq(intent) < _seq(stopped)  # the intent is recorded first
    return stopped


@pytest.mark.conformance(
    "runtime.channel.reconnect-params", "runtime.channel.snapshot-then-replay",
    "runtime.queue.survives-restart",
)  # fmt: skip
async def test_an_application_runs_turns_through_a_crash_and_exports_the_evidence(
    serve: ServeProcess,
) -> None:
    agent = await start_agent(serve, TARGET)
    try:
        async with RuntimeClient(serve.http) as app:
            session_id, thread_id = await _first_turn(app)
            channel = await _open_channel(app, session_id)
            before = Follower(app, session_id, channel)
            before.start()
            await before.ack(await _answered_turn(before))
            await before.ack(await _decided_turn(app, before, thread_id))
            acked = await before.ack(await _interrupted_turn(app, before, thread_id))
            # The agent goes away; a turn starts (its task waits for the agent), another
            # waits in the thread; the application has not acknowledged these events.
            await kill(agent)
            await app.submit_turn({"value": 4}, thread_id=thread_id, turn_id="t-4")
            await app.submit_turn({"value": 5}, thread_id=thread_id, turn_id="t-5")
            await before.first("turn.submitted", turn_id="t-5")
            await serve.kill()
            await before.ended_by_the_crash()
        await serve.start()
        async with RuntimeClient(serve.http) as app:
            after = await _reconnect(app, session_id, channel, acked, before)
            try:
                resumed = await app.resume_thread(thread_id, reason="coordinator restarted")
                assert (resumed["mode"], resumed["turnId"]) == ("following", "t-4")
                shown = await after.first("thread.updated", payload={"resume": "following"})
                assert shown.thread_id == thread_id and shown.payload["turnId"] == "t-4"
                agent = await start_agent(serve, TARGET)
                for n in (4, 5):
                    done = await after.first("turn.completed", turn_id=f"t-{n}")
                    assert done.payload["result"] == {"answer": n, "turn": f"t-{n}"}
                await app.submit_turn({"value": 6}, thread_id=thread_id, turn_id="t-6")
                last = await after.first("turn.completed", turn_id="t-6")
                await after.ack(last)
                pack = await _evidence(app, session_id)
                through = int(pack["range"]["through"])
                await after.through(through)
                # What the application saw, before the crash up to what it acknowledged and
                # after it, is the session's evidence: every event, once, in order.
                seen = [e for e in before.events if _seq(e) <= acked] + [
                    e for e in after.events if _seq(e) <= through
                ]
                assert _ids(seen) == _ids(pack["events"])
                await _replay_case(app, session_id, thread_id, seen)
            finally:
                await after.stop()
    finally:
        await kill(agent)


async def _reconnect(
    app: RuntimeClient, session_id: str, channel: ChannelInfo, acked: int, before: Follower
) -> Follower:
    """After the restart: reconnect_channel from the acknowledged sequence answers the
    snapshot, then every event after it, none acknowledged, none twice, in the log's
    order; the channel's stream, resumed, does the same, its snapshot first."""
    resumed = await app.reconnect_channel(
        session_id, channel_id=channel.channel_id, resume_token=channel.resume_token,
        last_acknowledged_sequence=acked,
    )  # fmt: skip
    check_snapshot(resumed.snapshot.to_json())
    turns = _turns(resumed.snapshot)
    assert {k: turns[k] for k in ("t-1", "t-2", "t-3")} == {
        "t-1": "completed", "t-2": "completed", "t-3": "cancelled"
    }  # fmt: skip
    assert turns["t-5"] == "queued" and turns["t-4"] in {"queued", "preparing"}
    replayed = resumed.events
    for event in replayed:
        check_event(event.to_json())
    sequences = [_seq(e) for e in replayed]
    assert sequences == sorted(set(sequences)) and sequences[0] > acked
    assert len({e.event_id for e in replayed}) == len(replayed)
    (reconnected,) = [e for e in replayed if e.type == "channel.resumed"]
    assert reconnected.channel_id == channel.channel_id and reconnected.payload["after"] == acked
    # Nothing lost: what the stream had shown past the acknowledged sequence before the
    # crash comes again first, as it was.
    unacked = [e for e in before.events if _seq(e) > acked]
    assert unacked and _ids(replayed[: len(unacked)]) == _ids(unacked)
    assert {"turn.submitted", "queue.changed"} <= {e.type for e in replayed}
    assert resumed.channel.acknowledged_sequence == acked
    after = Follower(app, session_id, channel)
    after.start()
    await after.through(_seq(replayed[-1]))
    assert after.snapshot is not None and after.snapshot.after == acked
    assert _ids(after.events[: len(replayed)]) == _ids(replayed)
    return after


async def _evidence(app: RuntimeClient, session_id: str) -> dict[str, Any]:
    """Every page of the session's evidence, each page's digest recomputed from its events;
    the pages joined (their events, the last page's range and snapshot)."""
    pages = [page async for page in app.evidence_pages(session_id, limit=EVIDENCE_PAGE)]
    assert len(pages) > 1 and not pages[-1]["more"]
    events: list[dict[str, Any]] = []
    for page in pages:
        assert page["kind"] == "evidence" and page["sessionId"] == session_id
        assert page["digest"] == _digest(page["events"])
        assert page["range"]["after"] == (int(events[-1]["sequence"]) if events else 0)
        for event in page["events"]:
            check_event(event)
        check_snapshot(page["snapshot"])
        events.extend(page["events"])
    # The same facts give the same pack.
    again = await app.export_evidence(session_id, limit=EVIDENCE_PAGE)
    assert again["digest"] == pages[0]["digest"]
    sequences = [int(e["sequence"]) for e in events]
    assert sequences == sorted(set(sequences))
    last = pages[-1]
    assert _turns(RuntimeSnapshot.from_json(last["snapshot"]))["t-6"] == "completed"
    return {"events": events, "range": last["range"], "snapshot": last["snapshot"]}


async def _replay_case(
    app: RuntimeClient, session_id: str, thread_id: str, seen: Sequence[RuntimeEvent]
) -> None:
    """The replay case: each turn's input, and the outcome the application saw it end with."""
    case = await app.export_replay(session_id)
    assert case["kind"] == "replay" and case["sessionId"] == session_id
    (thread,) = case["threads"]
    assert (thread["threadId"], thread["agentId"]) == (thread_id, AGENT)
    turns = {t["turnId"]: t for t in thread["turns"]}
    assert [t["turnId"] for t in thread["turns"]] == [f"t-{n}" for n in range(1, 7)]
    assert turns["t-2"]["input"] == {"mode": "ask", "ask": "push to main"}
    ends = {e.turn_id: e for e in seen if e.type in ("turn.completed", "turn.failed")}
    assert set(ends) == set(turns)
    for turn_id, end in ends.items():
        expected = turns[turn_id]["expected"]
        assert expected["status"] == end.status
        if end.type == "turn.completed":
            assert expected["result"] == end.payload["result"]
        else:
            assert expected["error"]["code"] == end.payload["error"]["code"]


async def test_a_turn_on_an_agent_that_outlived_a_crash_of_the_coordinator_is_interrupted(
    serve: ServeProcess,
) -> None:
    """The coordinator is SIGKILLed while a turn runs; the agent keeps running and comes
    back to the restarted coordinator. interrupt_turn answers, and the turn stops at the
    agent's next safe point: the Scheduler's stop request after the restart is a new
    message, not taken for one it sent before the crash (docs/decisions.md, Idempotency)."""
    agent = await start_agent(serve, TARGET)
    try:
        async with RuntimeClient(serve.http) as app:
            session_id, thread_id = await _first_turn(app)
            await app.wait_turn(session_id, "t-1", timeout=WAIT_S)
            await app.submit_turn({"mode": "loop"}, thread_id=thread_id, turn_id="t-2")
            await asyncio.wait_for(_running(app, thread_id, "t-2"), WAIT_S)
        await serve.kill()
        await serve.start()
        async with RuntimeClient(serve.http) as app:
            asked = await asyncio.wait_for(
                app.interrupt_turn(thread_id=thread_id, reason="after the crash"), WAIT_S
            )
            assert (asked["turnId"], asked["interrupt"]) == ("t-2", "requested")
            stopped = await app.wait_turn(session_id, "t-2", timeout=WAIT_S)
            assert stopped.status == "cancelled" and stopped.error["code"] == "cancelled"
            # The Scheduler still serves the agent: the next turn is answered.
            await app.submit_turn({"value": 3}, thread_id=thread_id, turn_id="t-3")
            done = await app.wait_turn(session_id, "t-3", timeout=WAIT_S)
            assert done.result == {"answer": 3, "turn": "t-3"}
    finally:
        await kill(agent)


async def _running(app: RuntimeClient, thread_id: str, turn_id: str) -> None:
    # The turn's state is read over HTTP from another process: there is no event to await.
    while _turns(await app.get_thread_read(thread_id)).get(turn_id) != "running":  # noqa: ASYNC110
        await asyncio.sleep(0.05)
