"""The coordinator's own producers (the Scheduler first) number their messages on from where
they left off across a restart, so that the router's (producer_id, sequence_number)
deduplication (RFC 11.2) never takes a new message for one sent before the restart; and a
refusal of such a message, should one come, answers the Scheduler without deadlocking it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

from apiary.core.envelope import AckStage, MessageType
from apiary.engine.notices import SCHEDULER, TOOLS
from apiary.testing.engine import EngineHarness, open_test_engine
from tests.engine.scheduler_harness import _finish, _inbox, _ready, _sched, _submit

T = TypeVar("T")

HANG_S = 20.0
"""How long a Scheduler call may take before the test calls it hung (a guard, not a
measurement: the calls below answer at once unless they deadlock)."""


async def _answered(call: Awaitable[T]) -> T:
    try:
        return await asyncio.wait_for(call, HANG_S)
    except TimeoutError:
        raise AssertionError(f"no answer within {HANG_S} s: the Scheduler is stuck") from None


def _controls(payloads: list[dict[str, object]]) -> list[object]:
    return [p["command"] for p in payloads if p["type"] == "CONTROL"]


async def _numbers(h: EngineHarness) -> list[int]:
    """The sequence numbers of the Scheduler's messages stored for the worker, oldest first."""
    stored = await h.store.messages.inbox("worker", 0, 10_000)
    return [m.sequence_number for m in stored if m.producer_id == SCHEDULER]


async def _refused(h: EngineHarness) -> list[dict[str, object]]:
    """The router's refusals of the Scheduler's messages (`message.rejected`)."""
    return [e.details for e in await h.events("message.rejected") if e.actor == SCHEDULER]


async def test_the_schedulers_messages_after_a_restart_are_not_taken_for_earlier_ones(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    async with open_test_engine(store_url=url, data_dir=tmp_path) as first:
        await _ready(first, "worker")
        await _submit(first, "t1")
        await _finish(first, "t1")  # its DATA envelope FULFILLED
        await _submit(first, "t2")  # still running at the restart
        clock, ids = first.clock, first.ids
        before = await _numbers(first)
    assert len(before) == 2
    async with open_test_engine(store_url=url, data_dir=tmp_path, clock=clock, ids=ids) as again:
        assert await _answered(_sched(again).request_preemption("worker", "t2", "maintenance"))
        # The stop request reached the agent: not refused as a repeat of a message sent
        # before the restart under the same number.
        assert _controls(await _inbox(again, "worker")) == ["preempt_request"]
        await _answered(_finish(again, "t2", note="yielded"))
        assert (await _sched(again).find("t2")).state == "QUEUED"  # it stopped, and waits
        assert await _refused(again) == []
        numbers = await _numbers(again)
        assert numbers[:2] == before and len(numbers) == 3
        assert numbers == sorted(set(numbers))  # monotonic across the restart


async def test_a_duplicate_refusal_of_a_scheduler_message_does_not_stall_the_scheduler() -> None:
    """The Scheduler holds its lock while it sends; the router's answer to a message refused
    as a duplicate goes to the Scheduler, which takes that lock to read it: the answer must
    come after the send returned, as every other refusal's NACK does."""
    async with open_test_engine() as h:
        await _ready(h, "worker")
        await _ready(h, "other")
        await _submit(h, "t1")  # (scheduler, 1): the task's DATA envelope
        # A finished message under the number the Scheduler gives its next one, as the
        # store held one after a restart when the Scheduler numbered from 1 again.
        earlier = h.envelope(
            SCHEDULER, {"command": "note"}, message_type=MessageType.CONTROL, sequence_number=2
        )
        await h.send_env(earlier, "worker")
        await h.ack("worker", earlier.message_id, AckStage.FULFILLED)
        assert await _answered(_sched(h).request_preemption("worker", "t1", "maintenance"))
        (refusal,) = await _refused(h)
        assert refusal["error_code"] == "duplicate_detected"
        assert earlier.message_id in str(refusal["reason"])
        assert _controls(await _inbox(h, "worker")) == ["note"]
        # The Scheduler is free: it answers the next call and sends its next message.
        await _answered(_submit(h, "t2", agent_id="other", scope="repo:app path:src/b.py"))
        assert (await _sched(h).find("t2")).state == "DISPATCHED"


async def test_tool_calls_after_a_restart_are_not_taken_for_earlier_ones(tmp_path: Path) -> None:
    """The tool service's TOOL_CALL envelopes carry no idempotency token: deduplicated by
    (producer_id, sequence_number), they number on across a restart too."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    call = {"call_id": "c-1", "tool_name": "echo", "args": {}}
    async with open_test_engine(store_url=url, data_dir=tmp_path) as first:
        await first.register("provider")
        sent = await first.engine.tools.link.send("provider", call, "c-1")
        await first.ack("provider", sent, AckStage.FULFILLED)
        clock, ids = first.clock, first.ids
    async with open_test_engine(store_url=url, data_dir=tmp_path, clock=clock, ids=ids) as again:
        again_sent = await again.engine.tools.link.send(
            "provider", {**call, "call_id": "c-2"}, "c-2"
        )
        stored = [
            (m.message_id, m.sequence_number)
            for m in await again.store.messages.inbox("provider", 0, 100)
            if m.producer_id == TOOLS
        ]
        assert [m for m, _ in stored] == [sent, again_sent]
        assert stored[0][1] < stored[1][1]
