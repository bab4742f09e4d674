"""CPU and wall-clock budgets on real processes (RFC 18.5.1)."""

from __future__ import annotations

import signal

import pytest

from apiary.core.tools.policy import ExecutionPolicy, PrivilegeLevel
from apiary.errors import CpuBudgetExceededError, WallTimeoutError
from apiary.sandbox import Outcome, SandboxSpec, error_for, run, start
from apiary.sandbox.proctree import descendants
from tests.sandbox.conftest import alive, python, requires_root

pytestmark = requires_root

BUSY = "while True: pass"
SLEEP = "import time; time.sleep(5)"


@pytest.mark.conformance("tool.budget.cpu-terminate", "tool.budget.cpu-error")
async def test_busy_loop_is_killed_when_its_cpu_budget_runs_out() -> None:
    # The wall budget only bounds the test: on a loaded machine the loop may get a small
    # share of a core, and 150 ms of CPU must still come first.
    policy = ExecutionPolicy(budget_cpu_ms=150, budget_wall_ms=60_000)

    result = await run(SandboxSpec(python(BUSY), policy))

    assert result.outcome is Outcome.CPU_BUDGET_EXCEEDED
    assert result.signal == signal.SIGKILL
    assert 150 <= result.cpu_ms < 1000  # overshoot: one monitor tick and the kill
    error = error_for(result)
    assert isinstance(error, CpuBudgetExceededError)
    assert error.code == "CPU_BUDGET_EXCEEDED"


@pytest.mark.conformance("tool.budget.wall-terminate", "tool.budget.wall-error")
async def test_sleeping_past_the_cpu_budget_is_not_a_cpu_overrun() -> None:
    # 400 ms of wall time is far more than the 100 ms CPU budget, but sleeping is not CPU.
    policy = ExecutionPolicy(budget_cpu_ms=100, budget_wall_ms=400)

    result = await run(SandboxSpec(["sleep", "5"], policy))

    assert result.outcome is Outcome.WALL_TIMEOUT
    assert result.cpu_ms < 100
    assert 400 <= result.wall_ms < 2000
    error = error_for(result)
    assert isinstance(error, WallTimeoutError)
    assert error.code == "WALL_TIMEOUT"


async def test_a_process_that_sleeps_past_its_cpu_budget_finishes_ok() -> None:
    policy = ExecutionPolicy(budget_cpu_ms=100)

    result = await run(SandboxSpec(["sleep", "0.3"], policy))

    assert result.outcome is Outcome.OK
    assert result.wall_ms >= 300 > result.cpu_ms
    assert error_for(result) is None


@pytest.mark.conformance("tool.budget.first-limit-wins")
@pytest.mark.parametrize(
    ("cpu_ms", "wall_ms", "program", "expected"),
    [
        (150, 3000, BUSY, Outcome.CPU_BUDGET_EXCEEDED),  # CPU runs out first
        (3000, 300, BUSY, Outcome.WALL_TIMEOUT),  # same program, wall runs out first
        (150, 300, SLEEP, Outcome.WALL_TIMEOUT),  # never uses its CPU budget
    ],
)
async def test_the_first_limit_reached_wins(
    cpu_ms: int, wall_ms: int, program: str, expected: Outcome
) -> None:
    policy = ExecutionPolicy(budget_cpu_ms=cpu_ms, budget_wall_ms=wall_ms)

    result = await run(SandboxSpec(python(program), policy))

    assert result.outcome is expected


async def test_timeout_ms_is_a_wall_limit_too() -> None:
    result = await run(SandboxSpec(["sleep", "5"], ExecutionPolicy(timeout_ms=300)))

    assert result.outcome is Outcome.WALL_TIMEOUT
    assert 300 <= result.wall_ms < 2000


async def test_cpu_of_child_processes_counts_and_the_whole_tree_is_killed() -> None:
    # DEFAULT may spawn: the parent only waits, its child burns the CPU.
    code = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'while True: pass'])"
    policy = ExecutionPolicy(privilege=PrivilegeLevel.DEFAULT, budget_cpu_ms=300)

    process = await start(SandboxSpec(python(code), policy))
    async for _ in process.chunks():  # nothing is printed; this just waits for the end
        pass
    result = await process.wait()

    assert result.outcome is Outcome.CPU_BUDGET_EXCEEDED
    assert result.cpu_ms >= 300
    assert not alive(process.pid)
    assert descendants(process.pid) == []


async def test_rlimit_cpu_backstops_the_monitor() -> None:
    # The kernel's RLIMIT_CPU stops the tool even if the coordinator's monitor stalls: one
    # second above the budget, rounded up (the kernel counts whole seconds).
    probe = python(
        "print([l for l in open('/proc/self/limits') if l.startswith('Max cpu time')][0])"
    )

    result = await run(SandboxSpec(probe, ExecutionPolicy(budget_cpu_ms=1500)))

    assert result.stdout.split()[3:5] == [b"3", b"4"]  # soft 3 s (SIGXCPU), hard 4 s (SIGKILL)


async def test_death_by_the_backstop_reads_as_cpu_budget_exceeded() -> None:
    probe = python("import os, signal; os.kill(os.getpid(), signal.SIGXCPU)")

    result = await run(SandboxSpec(probe, ExecutionPolicy(budget_cpu_ms=5000)))

    assert result.outcome is Outcome.CPU_BUDGET_EXCEEDED
    assert result.signal == signal.SIGXCPU


async def test_nothing_is_left_running_after_a_budget_kill() -> None:
    probe = python("import os; print(os.getpid(), flush=True)\nwhile True: pass")
    policy = ExecutionPolicy(privilege=PrivilegeLevel.ELEVATED, budget_cpu_ms=100)

    result = await run(SandboxSpec(probe, policy))

    assert result.outcome is Outcome.CPU_BUDGET_EXCEEDED
    tool_pid = int(result.stdout.split()[0])  # no PID namespace for ELEVATED: a host pid
    assert not alive(tool_pid)
