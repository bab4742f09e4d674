"""How a sandboxed run ended, and the protocol error each ending maps to (RFC 18.5.1, 18.6)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from apiary.errors import (
    ApiaryError,
    CallCancelledError,
    CpuBudgetExceededError,
    UnavailableError,
    WallTimeoutError,
)


class Outcome(StrEnum):
    OK = "OK"
    """Exited with status 0."""
    EXIT_NONZERO = "EXIT_NONZERO"
    """Exited with another status, or was killed by a signal the sandbox did not send."""
    WALL_TIMEOUT = "WALL_TIMEOUT"
    """budget_wall_ms (or timeout_ms) ran out; the whole tree was killed."""
    CPU_BUDGET_EXCEEDED = "CPU_BUDGET_EXCEEDED"
    """budget_cpu_ms ran out; the whole tree was killed."""
    CANCELLED = "CANCELLED"
    """cancel() stopped it; stdout holds what it wrote until then (a partial result)."""
    SPAWN_FAILED = "SPAWN_FAILED"
    """The program could not be executed (not found, not executable); stderr says why."""


@dataclass(frozen=True)
class SandboxResult:
    outcome: Outcome
    exit_code: int | None
    """The exit status, or None when the process was killed by a signal or never ran."""
    signal: int | None
    """The signal that killed the process, if one did."""
    stdout: bytes
    stderr: bytes
    cpu_ms: int
    """User + system CPU time of the tool and everything it started (10 ms resolution)."""
    wall_ms: int
    """From spawn to exit, sandbox set-up included."""

    @property
    def partial(self) -> bool:
        """Stopped before it finished (cancelled or out of budget): stdout may be incomplete."""
        return self.outcome in (
            Outcome.CANCELLED,
            Outcome.WALL_TIMEOUT,
            Outcome.CPU_BUDGET_EXCEEDED,
        )


def error_for(result: SandboxResult) -> ApiaryError | None:
    """The TOOL_ERROR a run maps to, or None when the tool ran to its own end (OK or not:
    a non-zero exit is the tool's answer, for the tool service to interpret)."""
    match result.outcome:
        case Outcome.WALL_TIMEOUT:
            return WallTimeoutError(
                f"wall-clock budget exhausted after {result.wall_ms} ms; execution terminated",
                {"wall_ms": str(result.wall_ms)},
            )
        case Outcome.CPU_BUDGET_EXCEEDED:
            return CpuBudgetExceededError(
                f"CPU budget exhausted after {result.cpu_ms} ms of CPU; execution terminated",
                {"cpu_ms": str(result.cpu_ms)},
            )
        case Outcome.CANCELLED:
            return CallCancelledError("cancelled; partial output kept", {"partial_result": "true"})
        case Outcome.SPAWN_FAILED:
            reason = result.stderr.decode(errors="replace").strip() or "could not execute"
            return UnavailableError(f"tool could not be started: {reason}")
        case _:
            return None
