"""The agent lifecycle in the engine: its event log, the hooks into the Scheduler and its loop."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import pytest

from apiary.errors import NotFoundError
from tests.engine.lifecycle_harness import Harness, I, S, make, moves


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    yield make()


# --- the log, the hooks and the loop --------------------------------------------------------


@pytest.mark.conformance("lifecycle.timeouts.log-transitions")
async def test_every_transition_is_logged_and_timeouts_say_so(h: Harness) -> None:
    lc = h.lifecycles
    await lc.registered("a", "worker")
    await h.at(60)  # INIT_TIMEOUT, RECOVER
    await lc.ready("a")
    await lc.apply("a", I.SCHEDULE)
    await lc.apply("a", I.START)
    await lc.apply("a", I.RESOURCES_NEEDED)
    await h.at(360)  # RESOURCE_TIMEOUT, RECOVER
    await lc.shutdown("a", 1.0)
    await h.at(361)  # SHUTDOWN_TIMEOUT
    transitions = await h.transitions()
    assert [t["input"] for t in transitions] == [
        "", "INIT_TIMEOUT", "RECOVER", "RECOVERED", "SCHEDULE", "START", "RESOURCES_NEEDED",
        "RESOURCE_TIMEOUT", "RECOVER", "SHUTDOWN", "SHUTDOWN_TIMEOUT",
    ]  # fmt: skip
    for previous, current in itertools.pairwise(transitions):
        assert current["from"] == previous["to"]  # a chain: no transition unlogged
    timed = [t["input"] for t in transitions if t["timeout"]]
    assert timed == ["INIT_TIMEOUT", "RESOURCE_TIMEOUT", "SHUTDOWN_TIMEOUT"]
    assert all(t["error_code"] for t in transitions if t["to"] == "FAILED")


async def test_a_failing_hook_does_not_stop_the_others(h: Harness) -> None:
    h.hooks.failing = {"abandon_task", "notify_agent"}
    lc = h.lifecycles
    await h.running()
    await lc.report("a", S.FAILED, error_code="oom")
    calls = [c[0] for c in h.hooks.take()]
    assert calls == ["abandon_task", "release_resources", "notify_agent"]
    assert lc.state("a") is S.RECOVERING
    failures = await h.events_of("agent.lifecycle_effect_failed")
    assert [f["effect"] for f in failures] == ["ABANDON_TASK", "NOTIFY_AGENT"]
    assert "abandon_task is down" in failures[0]["error"]


async def test_reports_map_to_the_agents_own_inputs_and_ignore_the_rest(h: Harness) -> None:
    lc = h.lifecycles
    await lc.registered("a", "worker")
    assert await lc.report("a", S.SCHEDULED) is None  # Scheduler-driven: ignored
    assert await lc.report("a", S.INITIALIZING) is None  # a plain heartbeat
    assert lc.state("a") is S.INITIALIZING
    await lc.report("a", S.RUNNABLE)
    await lc.apply("a", I.SCHEDULE)
    await lc.apply("a", I.START)
    assert await lc.report("a", S.SHUTTING_DOWN) is None
    assert await lc.report("a", S.COMPLETED) is None
    step = await lc.report("a", S.WAITING)
    assert step is not None and step.input is I.WAIT
    await lc.report("a", S.RUNNING)
    await lc.report("a", S.FAILED, error_code="oom")
    transitions = await h.transitions()
    assert moves(transitions)[1:] == [
        ("INITIALIZING", "INITIALIZED", "RUNNABLE"),
        ("RUNNABLE", "SCHEDULE", "SCHEDULED"),
        ("SCHEDULED", "START", "RUNNING"),
        ("RUNNING", "WAIT", "WAITING"),
        ("WAITING", "INPUT_RECEIVED", "RUNNING"),
        ("RUNNING", "FAIL", "FAILED"),
        ("FAILED", "RECOVER", "RECOVERING"),
    ]
    assert transitions[6]["error_code"] == "oom"
    assert ("abandon_task", "a", "oom") in h.hooks.calls


async def test_an_unknown_agent_is_not_found(h: Harness) -> None:
    lc = h.lifecycles
    for call in (
        lc.apply("ghost", I.SCHEDULE), lc.ready("ghost"), lc.report("ghost", S.RUNNABLE),
        lc.shutdown("ghost", 5.0),
    ):  # fmt: skip
        with pytest.raises(NotFoundError):
            await call
    assert lc.state("ghost") is None and lc.entered_at("ghost") is None
    assert not lc.accepts_tasks("ghost")
    assert await lc.deregistered("ghost") is None


async def test_a_forgotten_agents_timer_never_fires(h: Harness) -> None:
    await h.lifecycles.registered("a", "worker")
    h.lifecycles.forget("a")
    assert h.lifecycles.next_deadline() is None
    assert await h.at(3600) == 0
    assert h.hooks.calls == []


async def test_the_loop_fires_deadlines_as_the_clock_reaches_them(h: Harness) -> None:
    lc = h.lifecycles
    runner = asyncio.create_task(lc.run(h.clock.sleep))
    try:
        await lc.registered("a", "worker")
        while h.clock.next_deadline is None:  # noqa: ASYNC110 - the loop waits on the fake clock
            await asyncio.sleep(0)
        h.clock.advance(60)

        async def recovering() -> None:
            while lc.state("a") is not S.RECOVERING:  # noqa: ASYNC110
                await asyncio.sleep(0)

        await asyncio.wait_for(recovering(), 5)
        assert lc.next_deadline() == h.start + 180
    finally:
        runner.cancel()
