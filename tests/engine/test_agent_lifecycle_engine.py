"""Agent lifecycles through the engine on a fake clock (RFC 8, 8.1-8.4): timers at their
boundaries, effects through the Scheduler's hooks, every transition in the event log."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from apiary.core.agent_lifecycle import LifecycleTimeouts
from apiary.core.machine import IllegalTransitionError
from apiary.engine.lifecycle import LifecycleSettings
from apiary.errors import ValidationError
from tests.engine.lifecycle_harness import Harness, I, S, make, moves


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    yield make()


# --- start-up and recovery ------------------------------------------------------------------


@pytest.mark.conformance(
    "lifecycle.timeouts.initializing-60s", "lifecycle.timeouts.recovering-120s",
    "lifecycle.timeouts.log-transitions",
)  # fmt: skip
async def test_init_timeout_at_60s_then_automatic_recovery_times_out_at_120s(h: Harness) -> None:
    lc = h.lifecycles
    assert await lc.registered("a", "worker") is S.INITIALIZING
    assert lc.next_deadline() == h.start + 60
    assert await h.at(59.9) == 0
    assert lc.state("a") is S.INITIALIZING
    assert await h.at(60) == 1
    assert lc.state("a") is S.RECOVERING
    assert lc.entered_at("a") == h.start + 60
    assert h.hooks.take() == [
        ("release_resources", "a", "init_timeout"),
        ("notify_agent", "a", "failed", {"error_code": "init_timeout"}),
        ("notify_agent", "a", "recover", {}),
    ]
    first = await h.transitions()
    assert moves(first) == [
        ("", "", "INITIALIZING"),
        ("INITIALIZING", "INIT_TIMEOUT", "FAILED"),
        ("FAILED", "RECOVER", "RECOVERING"),
    ]
    assert [t["timeout"] for t in first] == [False, True, False]
    assert first[1]["error_code"] == "init_timeout"
    assert first[2]["note"] == "auto-recovery 1 of 3 after init_timeout"
    assert await h.at(60 + 119.9) == 0
    assert await h.at(60 + 120) == 1
    assert lc.state("a") is S.RECOVERING  # the second automatic attempt
    (failed, _) = (await h.transitions())[3:]
    assert (failed["input"], failed["to"], failed["error_code"], failed["timeout"]) == (
        "RECOVERY_TIMEOUT", "FAILED", "recovery_timeout", True
    )  # fmt: skip


async def test_automatic_recovery_stops_after_the_configured_attempts() -> None:
    h = make(LifecycleSettings(max_auto_recoveries=2))
    lc = h.lifecycles
    await lc.registered("a", "worker")
    await h.at(60)  # init_timeout, attempt 1
    await h.at(180)  # recovery_timeout, attempt 2
    assert lc.state("a") is S.RECOVERING
    await h.at(300)  # recovery_timeout: no attempt left
    assert lc.state("a") is S.FAILED and lc.error_code("a") == "recovery_timeout"
    assert lc.next_deadline() is None
    (exhausted,) = await h.events_of("agent.auto_recovery_exhausted")
    assert exhausted["attempts"] == 2
    # An operator recovers it; once RUNNABLE again, a new failure gets its attempts anew.
    await lc.apply("a", I.RECOVER)
    await lc.ready("a")
    await lc.apply("a", I.SCHEDULE)
    await lc.apply("a", I.START)
    await lc.report("a", S.FAILED, error_code="oom")
    assert lc.state("a") is S.RECOVERING
    assert (await h.transitions())[-1]["note"] == "auto-recovery 1 of 2 after oom"


async def test_no_automatic_recovery_when_disabled() -> None:
    h = make(LifecycleSettings(auto_recover=False))
    await h.lifecycles.registered("a", "worker")
    await h.at(60)
    assert h.lifecycles.state("a") is S.FAILED
    assert h.lifecycles.error_code("a") == "init_timeout"
    assert not [c for c in h.hooks.calls if c[2:3] == ("recover",)]


@pytest.mark.conformance(
    "lifecycle.runnable.indicate-readiness", "lifecycle.initializing.no-tasks",
    "lifecycle.runnable.accept-assignments",
)  # fmt: skip
async def test_readiness_makes_an_initializing_agent_runnable(h: Harness) -> None:
    lc = h.lifecycles
    await lc.registered("a", "worker")
    assert not lc.accepts_tasks("a")
    await h.at(30)
    step = await lc.ready("a")
    assert step is not None and step.state is S.RUNNABLE
    assert lc.state("a") is S.RUNNABLE and lc.entered_at("a") == h.start + 30
    assert lc.accepts_tasks("a")
    assert await lc.ready("a") is None  # readiness of a runnable agent changes nothing
    assert await h.at(60) == 0  # the init timer went with the state
    assert lc.state("a") is S.RUNNABLE and lc.next_deadline() is None
    assert moves(await h.transitions())[1:] == [("INITIALIZING", "INITIALIZED", "RUNNABLE")]


async def test_a_deadline_already_passed_applies_before_a_late_input() -> None:
    h = make(LifecycleSettings(auto_recover=False))
    lc = h.lifecycles
    await lc.registered("a", "worker")
    h.clock.advance(61)  # nobody fired the timer yet
    assert await lc.ready("a") is None
    assert lc.state("a") is S.FAILED and lc.error_code("a") == "init_timeout"


@pytest.mark.conformance("lifecycle.recovering.outcome")
async def test_recovery_ends_runnable_on_success_or_failed_on_failure(h: Harness) -> None:
    lc = h.lifecycles
    for agent_id in ("ok", "bad"):
        await lc.registered(agent_id, "worker")
    await h.at(60)
    assert lc.snapshot() == {"ok": S.RECOVERING, "bad": S.RECOVERING}
    await lc.ready("ok")
    await lc.report("bad", S.FAILED, error_code="disk_corrupt")
    assert lc.state("ok") is S.RUNNABLE
    assert lc.state("bad") is S.RECOVERING  # failed, then the second automatic attempt
    failed = [t for t in await h.transitions("bad") if t["to"] == "FAILED"]
    assert (failed[-1]["input"], failed[-1]["error_code"]) == ("RECOVERY_FAILED", "disk_corrupt")


async def test_a_known_agent_re_registering_keeps_its_state_and_takes_its_new_type() -> None:
    fast = LifecycleTimeouts(initializing=10.0, waiting_resources=10.0)
    h = make(LifecycleSettings(per_type={"fast": fast}))
    lc = h.lifecycles
    await lc.registered("a", "worker")
    await h.at(5)
    assert await lc.registered("a", "fast") is S.INITIALIZING
    assert lc.entered_at("a") == h.start  # not restarted
    assert lc.next_deadline() == h.start + 10
    assert await h.at(10) == 1
    assert (await h.transitions())[1]["agent_type"] == "fast"


# --- the task path --------------------------------------------------------------------------


@pytest.mark.conformance("lifecycle.completed.cleanup-report")
async def test_schedule_start_complete_report_returns_to_runnable(h: Harness) -> None:
    lc = h.lifecycles
    await lc.registered("a", "worker")
    await lc.ready("a")
    await lc.apply("a", I.SCHEDULE)
    assert lc.state("a") is S.SCHEDULED and not lc.accepts_tasks("a")
    await lc.apply("a", I.START)
    await lc.apply("a", I.COMPLETE)
    assert lc.state("a") is S.COMPLETED and not lc.accepts_tasks("a")
    with pytest.raises(IllegalTransitionError):  # no new task before cleanup and reporting
        await lc.apply("a", I.SCHEDULE)
    await lc.report("a", S.RUNNABLE)
    assert lc.state("a") is S.RUNNABLE and lc.accepts_tasks("a")
    assert moves(await h.transitions())[2:] == [
        ("RUNNABLE", "SCHEDULE", "SCHEDULED"),
        ("SCHEDULED", "START", "RUNNING"),
        ("RUNNING", "COMPLETE", "COMPLETED"),
        ("COMPLETED", "REPORTED", "RUNNABLE"),
    ]
    assert h.hooks.calls == []  # none of these involve the Scheduler's side effects


@pytest.mark.conformance(
    "lifecycle.waiting-resources.timeout-failed",
    "lifecycle.waiting-resources.default-timeout-300s",
    "lifecycle.timeouts.waiting-resources-300s",
)  # fmt: skip
async def test_waiting_for_resources_fails_after_300s(h: Harness) -> None:
    lc = h.lifecycles
    await h.running()
    await lc.report("a", S.WAITING_RESOURCES)
    assert await h.at(299.9) == 0
    assert lc.state("a") is S.WAITING_RESOURCES
    assert await h.at(300) == 1
    assert h.hooks.take() == [
        ("abandon_task", "a", "resource_timeout"),
        ("release_resources", "a", "resource_timeout"),
        ("notify_agent", "a", "failed", {"error_code": "resource_timeout"}),
        ("notify_agent", "a", "recover", {}),
    ]
    failed = [t for t in await h.transitions() if t["to"] == "FAILED"]
    assert [(t["error_code"], t["timeout"]) for t in failed] == [("resource_timeout", True)]


@pytest.mark.conformance("lifecycle.waiting-resources.timeout-configurable")
async def test_the_resource_timeout_is_set_per_agent_type() -> None:
    fast = LifecycleTimeouts(waiting_resources=10.0)
    h = make(LifecycleSettings(per_type={"fast": fast}, auto_recover=False))
    lc = h.lifecycles
    await h.running("quick", "fast")
    await h.running("slow", "worker")
    for agent_id in ("quick", "slow"):
        await lc.apply(agent_id, I.RESOURCES_NEEDED)
    assert await h.at(9.9) == 0
    assert await h.at(10) == 1
    assert lc.snapshot() == {"quick": S.FAILED, "slow": S.WAITING_RESOURCES}
    assert lc.error_code("quick") == "resource_timeout"
    assert await h.at(300) == 1
    assert lc.state("slow") is S.FAILED


@pytest.mark.conformance("lifecycle.waiting-resources.resume-running")
async def test_resources_becoming_available_resume_running_and_disarm_the_timer(
    h: Harness,
) -> None:
    lc = h.lifecycles
    await h.running()
    await lc.apply("a", I.RESOURCES_NEEDED)
    await h.at(299)
    await lc.report("a", S.RUNNING)
    assert lc.state("a") is S.RUNNING
    assert await h.at(300) == 0
    # Re-entering arms a new deadline from the new entry, not the old one.
    await lc.apply("a", I.RESOURCES_NEEDED)
    assert await h.at(598.9) == 0
    assert await h.at(600) == 1
    (failed,) = [t for t in await h.transitions() if t["to"] == "FAILED"]
    assert failed["error_code"] == "resource_timeout"


async def test_a_configured_waiting_timeout_escalates_once_and_keeps_waiting() -> None:
    h = make(LifecycleSettings(timeouts=LifecycleTimeouts(waiting=50.0)))
    lc = h.lifecycles
    await h.running()
    await lc.report("a", S.WAITING)
    assert await h.at(49.9) == 0
    assert await h.at(50) == 1
    assert lc.state("a") is S.WAITING and lc.next_deadline() is None
    assert h.hooks.take() == [("escalate", "a", S.WAITING, "waiting_timeout")]
    (escalated,) = [t for t in await h.transitions() if t["input"] == "WAITING_TIMEOUT"]
    assert (escalated["from"], escalated["to"], escalated["timeout"]) == (
        "WAITING", "WAITING", True
    )  # fmt: skip
    assert await h.at(500) == 0
    await lc.report("a", S.RUNNING)
    assert lc.state("a") is S.RUNNING


# --- suspension -----------------------------------------------------------------------------


@pytest.mark.conformance(
    "lifecycle.suspended.pause-on-request", "lifecycle.timeouts.suspended-3600s"
)
async def test_suspension_notifies_the_agent_and_fails_after_3600s(h: Harness) -> None:
    lc = h.lifecycles
    await h.running()
    await lc.apply("a", I.SUSPEND)
    assert h.hooks.take() == [("notify_agent", "a", "suspend", {})]
    assert await h.at(3599.9) == 0
    assert await h.at(3600) == 1
    assert h.hooks.take()[:3] == [
        ("abandon_task", "a", "suspend_timeout"),
        ("release_resources", "a", "suspend_timeout"),
        ("notify_agent", "a", "failed", {"error_code": "suspend_timeout"}),
    ]
    (failed,) = [t for t in await h.transitions() if t["to"] == "FAILED"]
    assert (failed["from"], failed["error_code"], failed["timeout"]) == (
        "SUSPENDED", "suspend_timeout", True
    )  # fmt: skip


@pytest.mark.conformance("lifecycle.suspended.resumable", "lifecycle.resumed.return-to-running")
async def test_a_suspended_agent_resumes_then_returns_to_running(h: Harness) -> None:
    lc = h.lifecycles
    await h.running()
    await lc.apply("a", I.SUSPEND)
    await h.at(1000)
    await lc.apply("a", I.RESUME)
    assert lc.state("a") is S.RESUMED
    assert h.hooks.take() == [
        ("notify_agent", "a", "suspend", {}),
        ("notify_agent", "a", "resume", {}),
    ]
    await lc.report("a", S.RUNNING)
    assert lc.state("a") is S.RUNNING
    assert await h.at(3600) == 0  # the suspend timer went with SUSPENDED


# --- shutdown (RFC 8.4) ---------------------------------------------------------------------


@pytest.mark.conformance(
    "lifecycle.shutdown.grace-period-configurable", "lifecycle.shutdown.no-new-tasks",
    "lifecycle.shutting-down.no-dispatch", "lifecycle.cleanup.complete",
)  # fmt: skip
async def test_a_shutdown_within_its_grace_cleans_up_and_deregisters(h: Harness) -> None:
    lc = h.lifecycles
    await h.running()
    step = await lc.shutdown("a", 5.0)
    assert step.state is S.SHUTTING_DOWN and step.deadline == h.start + 5
    assert h.hooks.take() == [
        ("stop_dispatch", "a"),
        ("notify_agent", "a", "shutdown", {"grace_period_ms": 5000}),
    ]
    assert not lc.accepts_tasks("a")
    await lc.apply("a", I.COMPLETE)  # the current task may finish within the grace
    assert lc.state("a") is S.SHUTTING_DOWN
    await h.at(4.9)
    ended = await lc.deregistered("a")
    assert ended is not None and ended.input is I.SHUTDOWN_COMPLETE
    assert h.hooks.take() == [
        ("abandon_task", "a", "agent_shutdown"),  # a task still held is ended, not timed out
        ("release_resources", "a", "shutdown_complete"),
        ("deregister", "a", "shutdown_complete"),
    ]
    assert lc.state("a") is None and lc.snapshot() == {}
    assert await h.at(5) == 0
    transitions = await h.transitions()
    assert "FAILED" not in {t["to"] for t in transitions}
    assert moves(transitions)[-1] == ("SHUTTING_DOWN", "SHUTDOWN_COMPLETE", "SHUTTING_DOWN")
    (last,) = await h.events_of("agent.lifecycle_ended")
    assert last == {"state": "SHUTTING_DOWN", "reason": "shutdown_complete"}
    assert await lc.deregistered("a") is None  # a second deregistration is a no-op


@pytest.mark.conformance(
    "lifecycle.shutdown.monitor-grace", "lifecycle.shutdown.grace-timeout-failed",
    "lifecycle.shutdown.terminate-incomplete", "lifecycle.shutdown.distinct-error-code",
    "lifecycle.cleanup.complete", "lifecycle.timeouts.log-transitions",
)  # fmt: skip
async def test_no_deregistration_within_the_grace_fails_the_agent_without_recovery(
    h: Harness,
) -> None:
    lc = h.lifecycles
    await h.running()
    await lc.shutdown("a", 5.0)
    h.hooks.take()
    assert await h.at(4.9) == 0
    assert await h.at(5) == 1
    assert lc.state("a") is S.FAILED
    assert lc.error_code("a") == "agent_shutdown_timeout"
    assert h.hooks.take() == [
        ("abandon_task", "a", "agent_shutdown_timeout"),
        ("release_resources", "a", "agent_shutdown_timeout"),
        ("notify_agent", "a", "failed", {"error_code": "agent_shutdown_timeout"}),
    ]  # and no "recover": the agent was asked to go away
    assert lc.next_deadline() is None
    (failed,) = [t for t in await h.transitions() if t["to"] == "FAILED"]
    assert (failed["input"], failed["timeout"]) == ("SHUTDOWN_TIMEOUT", True)
    # Only an operator's recovery brings it back; the shutdown's grace no longer applies.
    await lc.apply("a", I.RECOVER)
    await lc.ready("a")
    await lc.shutdown("a", None)
    assert lc.next_deadline() == h.start + 5 + 30


@pytest.mark.conformance("lifecycle.timeouts.shutting-down-30s")
async def test_the_default_grace_is_30s(h: Harness) -> None:
    lc = h.lifecycles
    await h.running()
    await lc.shutdown("a", None)
    assert h.hooks.take()[1] == ("notify_agent", "a", "shutdown", {"grace_period_ms": 30000})
    assert await h.at(29.9) == 0
    assert await h.at(30) == 1
    assert lc.error_code("a") == "agent_shutdown_timeout"


@pytest.mark.conformance(
    "lifecycle.recovering.shutdown-request", "lifecycle.recovering.abandon-on-shutdown"
)
async def test_a_shutdown_during_recovery_aborts_it_and_cancels_the_recovery_timer(
    h: Harness,
) -> None:
    lc = h.lifecycles
    await lc.registered("a", "worker")
    await h.at(60)
    assert lc.state("a") is S.RECOVERING
    h.hooks.take()
    await lc.shutdown("a", 200.0)
    assert lc.state("a") is S.SHUTTING_DOWN
    assert h.hooks.take() == [
        ("stop_dispatch", "a"),
        ("notify_agent", "a", "shutdown", {"grace_period_ms": 200000}),
    ]
    assert await h.at(60 + 120) == 0  # no recovery_timeout any more
    assert lc.state("a") is S.SHUTTING_DOWN
    assert await h.at(60 + 200) == 1
    assert lc.error_code("a") == "agent_shutdown_timeout"
    assert ("RECOVERING", "SHUTDOWN", "SHUTTING_DOWN") in moves(await h.transitions())


async def test_a_repeated_shutdown_is_illegal_and_changes_nothing(h: Harness) -> None:
    lc = h.lifecycles
    await h.running()
    await lc.shutdown("a", 5.0)
    with pytest.raises(IllegalTransitionError):
        await lc.shutdown("a", 60.0)
    assert lc.next_deadline() == h.start + 5
    assert len(await h.transitions()) == 1 + 4  # registration, ready, schedule, start, shutdown
    assert await h.at(5) == 1


@pytest.mark.parametrize("grace", [0.0, -1.0, float("inf"), float("nan")])
async def test_a_shutdown_grace_must_be_a_positive_duration(h: Harness, grace: float) -> None:
    await h.running()
    with pytest.raises(ValidationError) as raised:
        await h.lifecycles.shutdown("a", grace)
    assert raised.value.details["field"] == "grace_period"
    assert h.lifecycles.state("a") is S.RUNNING and h.hooks.calls == []


async def test_deregistering_in_any_other_state_releases_and_forgets(h: Harness) -> None:
    await h.running()
    assert await h.lifecycles.deregistered("a") is None
    assert h.hooks.take() == [("release_resources", "a", "deregistered")]
    assert h.lifecycles.state("a") is None
    (ended,) = await h.events_of("agent.lifecycle_ended")
    assert ended == {"state": "RUNNING", "reason": "deregistered"}
