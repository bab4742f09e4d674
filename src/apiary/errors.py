"""Apiary's one error vocabulary: an exception per protocol error code, one table to statuses.

Every failure that crosses a process boundary is an `ApiaryError` whose `code` is a protocol
error code: the snake_case codes of RFC section 11 and the canonical `sw4rm.common.ErrorCode`
enum, the lifecycle and pattern codes the specs name (init_timeout, workflow_cycle_detected,
...), and the tool codes the RFC writes in upper case (CPU_BUDGET_EXCEEDED, CANCELLED, ...),
kept exactly as written so they reach the wire unchanged.

`ERROR_TABLE` maps each code to its gRPC status, its HTTP status and its canonical proto
number. Transports translate at exactly one boundary each, through `spec_for`; anything that is
not an `ApiaryError` becomes `internal_error` there and its text never reaches a client.

The HTTP column follows the standard gRPC-to-HTTP mapping (google.rpc.Code) except where a
more specific status tells an HTTP client more: 413 and 415 for payload limits and content
types, 409 for state conflicts reported as FAILED_PRECONDITION.

This module must not import grpc: the core imports it, so gRPC status numbers are mirrored
in `GrpcStatus`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from types import MappingProxyType
from typing import ClassVar, Final, Self


class GrpcStatus(IntEnum):
    """The canonical gRPC status codes, by number (grpc/doc/statuscodes.md)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


INTERNAL_ERROR_PROTO: Final = 99
"""`sw4rm.common.ErrorCode.INTERNAL_ERROR`, the number codes without a canonical one encode as."""


class ApiaryError(Exception):
    """Base of every protocol error.

    `code` is the protocol error code (a class attribute of each subclass), `message` a
    human-readable explanation safe to show to the peer, and `details` structured string
    context (field names, ids) that travels with the error on every transport.
    """

    code: ClassVar[str] = "internal_error"

    def __init__(self, message: str = "", details: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.message: str = message
        self.details: dict[str, str] = dict(details or {})

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.message else self.code

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, details={self.details!r})"

    def __reduce__(self) -> tuple[type[ApiaryError], tuple[str, dict[str, str]]]:
        # Exception pickles only `args`; details must survive a trip through a process pool.
        return (type(self), (self.message, self.details))


# --- the canonical sw4rm.common.ErrorCode values (RFC section 11) -----------------------------


class BufferFullError(ApiaryError):
    """The recipient's inbound buffer is at capacity (RFC 13)."""

    code = "buffer_full"


class NoRouteError(ApiaryError):
    """No recipient could be determined or it is not registered (DESIGN.md section 4)."""

    code = "no_route"


class AckTimeoutError(ApiaryError):
    """No RECEIVED acknowledgement arrived within the ack timeout (RFC 11, default 10 s)."""

    code = "ack_timeout"


class AgentUnavailableError(ApiaryError):
    """The target agent is registered but cannot take the message now."""

    code = "agent_unavailable"


class AgentShutdownError(ApiaryError):
    """The target agent is shutting down and accepts no new work (RFC 8.4)."""

    code = "agent_shutdown"


class ValidationError(ApiaryError):
    """A request or envelope breaks a protocol rule.

    `details["field"]` names the offending field when there is one.
    """

    code = "validation_error"

    @classmethod
    def for_field(cls, field: str, problem: str, **details: str) -> Self:
        """Build the error for one bad field: message `"<field>: <problem>"`."""
        return cls(f"{field}: {problem}", {"field": field, **details})


class PermissionDeniedError(ApiaryError):
    """The caller is authenticated but not allowed to do this (ACLs, confinement)."""

    code = "permission_denied"


class UnsupportedMessageTypeError(ApiaryError):
    """The message type or content type is not supported by the target (RFC 12)."""

    code = "unsupported_message_type"


class OversizePayloadError(ApiaryError):
    """The payload exceeds the configured limit for its message type (RFC 5.4)."""

    code = "oversize_payload"


class ToolTimeoutError(ApiaryError):
    """A tool call exceeded its timeout (RFC 18.3)."""

    code = "tool_timeout"


class PartialDeliveryError(ApiaryError):
    """A chunked transfer arrived incomplete or corrupted (RFC 5.4; reserved in the proto)."""

    code = "partial_delivery"


class ForcedPreemptionError(ApiaryError):
    """The task was terminated by forced preemption (RFC 7.2)."""

    code = "forced_preemption"


class TtlExpiredError(ApiaryError):
    """The message's ttl_ms elapsed before it was processed (RFC 11)."""

    code = "ttl_expired"


class InternalError(ApiaryError):
    """An unexpected failure; the cause is logged server-side, never sent to the peer."""

    code = "internal_error"


# --- codes the specs name outside the canonical enum -----------------------------------------


class DuplicateDetectedError(ApiaryError):
    """The idempotency token already has a terminal outcome (RFC 11.2, 21)."""

    code = "duplicate_detected"


class AlreadyInProgressError(ApiaryError):
    """The idempotency token maps to an execution that has not finished (RFC 11.2)."""

    code = "already_in_progress"


class ActivityBufferFullError(ApiaryError):
    """The activity buffer refuses new entries at its size limit (RFC 10.1)."""

    code = "activity_buffer_full"


class WorktreeNotBoundError(ApiaryError):
    """A tool that needs a worktree was invoked by an unbound agent (RFC 16)."""

    code = "worktree_not_bound"


class WorktreeNotFoundError(ApiaryError):
    """A BIND named a worktree that does not exist (RFC 16.3)."""

    code = "worktree_not_found"


class WorktreeLockedError(ApiaryError):
    """A BIND found the worktree locked by someone else (RFC 16.3)."""

    code = "worktree_locked"


class FilesystemError(ApiaryError):
    """A BIND failed on a filesystem operation (RFC 16.3)."""

    code = "filesystem_error"


class WorkflowCycleDetectedError(ApiaryError):
    """A workflow definition's dependencies form a cycle (RFC 17.7)."""

    code = "workflow_cycle_detected"


class HitlUnavailableError(ApiaryError):
    """No HITL component could take an escalation (RFC 15.4, DENY_BY_DEFAULT)."""

    code = "hitl_unavailable"


class ResourceTimeoutError(ApiaryError):
    """An agent stayed in WAITING_RESOURCES past its timeout (RFC 8.2, 8.3)."""

    code = "resource_timeout"


class InitTimeoutError(ApiaryError):
    """An agent stayed in INITIALIZING past its timeout (RFC 8.3)."""

    code = "init_timeout"


class SuspendTimeoutError(ApiaryError):
    """An agent stayed in SUSPENDED past its timeout (RFC 8.3)."""

    code = "suspend_timeout"


class RecoveryTimeoutError(ApiaryError):
    """An agent stayed in RECOVERING past its timeout (RFC 8.3)."""

    code = "recovery_timeout"


class AgentShutdownTimeoutError(ApiaryError):
    """An agent exceeded its shutdown grace period (RFC 8.3, 8.4)."""

    code = "agent_shutdown_timeout"


class CpuBudgetExceededError(ApiaryError):
    """A tool exhausted its budget_cpu_ms (RFC 18.5.1)."""

    code = "CPU_BUDGET_EXCEEDED"


class WallTimeoutError(ApiaryError):
    """A tool exhausted its budget_wall_ms (RFC 18.5.1)."""

    code = "WALL_TIMEOUT"


class CallCancelledError(ApiaryError):
    """A tool call was cancelled on request (RFC 18.6).

    Not named `CancelledError`, so that it is never confused with asyncio's.
    """

    code = "CANCELLED"


class NotFoundError(ApiaryError):
    """The named object (tool call, artifact, workflow, ...) does not exist (RFC 18.6)."""

    code = "NOT_FOUND"


class AlreadyCompletedError(ApiaryError):
    """The operation cannot apply because its target already finished (RFC 18.6)."""

    code = "ALREADY_COMPLETED"


class ToolFailedError(ApiaryError):
    """A tool ran and reported failure (non-zero exit, an MCP error result, a TOOL_ERROR)."""

    code = "TOOL_FAILED"


class ResumeExpiredError(ApiaryError):
    """A stream resume position is outside the retained window (RFC 5.5); the message
    says how to recover."""

    code = "resume_expired"


class AlreadyExistsError(ApiaryError):
    """The object to create already exists (NegotiationRoom: duplicate proposal or vote)."""

    code = "already_exists"


class TaskIdConflictError(AlreadyExistsError):
    """A task_id given again names a task submitted with other content (idempotency key)."""

    code = "task_id_conflict"


class DeadlineExceededError(ApiaryError):
    """A blocking wait ended at its deadline (NegotiationRoom WaitForDecision)."""

    code = "deadline_exceeded"


class UnavailableError(ApiaryError):
    """The runtime cannot reach the target now (control plane: unrecoverable process)."""

    code = "unavailable"


class QuotaExceededError(ApiaryError):
    """A tenant's quota (agents, queued messages, tasks, stored bytes) is used up (RFC 6.5)."""

    code = "quota_exceeded"


class UnauthenticatedError(ApiaryError):
    """The caller presented no valid credentials (operator tokens, secure mode)."""

    code = "unauthenticated"


class UnimplementedError(ApiaryError):
    """The RPC or command is part of the protocol but not built yet.

    The message names the area that owns it, e.g. "WorkflowService.ResumeWorkflow: workflow".
    """

    code = "unimplemented"


# --- the table ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    """How one protocol error code appears on each transport."""

    code: str
    exc_type: type[ApiaryError]
    grpc_status: GrpcStatus
    http_status: int
    proto_error_code: int | None
    """The `sw4rm.common.ErrorCode` number, or None when the enum has none."""
    description: str


_G = GrpcStatus


def _row(
    exc_type: type[ApiaryError],
    grpc_status: GrpcStatus,
    http_status: int,
    proto_error_code: int | None = None,
) -> ErrorSpec:
    description = (exc_type.__doc__ or "").strip().splitlines()[0]
    return ErrorSpec(
        exc_type.code, exc_type, grpc_status, http_status, proto_error_code, description
    )


_ROWS: Final = (
    # Back-pressure: the sender should slow down and retry, hence 429 rather than 503.
    _row(BufferFullError, _G.RESOURCE_EXHAUSTED, 429, 1),
    _row(NoRouteError, _G.NOT_FOUND, 404, 2),
    _row(AckTimeoutError, _G.DEADLINE_EXCEEDED, 504, 3),
    _row(AgentUnavailableError, _G.UNAVAILABLE, 503, 4),
    # Shutting down is transient from the sender's view: a restarted agent takes work again.
    _row(AgentShutdownError, _G.UNAVAILABLE, 503, 5),
    _row(ValidationError, _G.INVALID_ARGUMENT, 400, 6),
    _row(PermissionDeniedError, _G.PERMISSION_DENIED, 403, 7),
    # The request is fine in itself but its type does not fit the target: the request must
    # change, not the server (so not UNIMPLEMENTED); 415 tells HTTP clients exactly that.
    _row(UnsupportedMessageTypeError, _G.INVALID_ARGUMENT, 415, 8),
    # gRPC itself answers RESOURCE_EXHAUSTED for messages over its size limit; payloads over
    # Apiary's per-type limits look the same to a client.
    _row(OversizePayloadError, _G.RESOURCE_EXHAUSTED, 413, 9),
    _row(ToolTimeoutError, _G.DEADLINE_EXCEEDED, 504, 10),
    # Data arrived incomplete or corrupted; google.rpc maps DATA_LOSS to 500.
    _row(PartialDeliveryError, _G.DATA_LOSS, 500, 11),
    # The scheduler aborted the task; a retry at a higher level may succeed.
    _row(ForcedPreemptionError, _G.ABORTED, 409, 12),
    # The message's own deadline passed: the same status as any other deadline.
    _row(TtlExpiredError, _G.DEADLINE_EXCEEDED, 504, 13),
    _row(InternalError, _G.INTERNAL, 500, INTERNAL_ERROR_PROTO),
    _row(DuplicateDetectedError, _G.ALREADY_EXISTS, 409),
    # A concurrency conflict: retrying later returns the cached outcome (google.rpc ABORTED).
    _row(AlreadyInProgressError, _G.ABORTED, 409),
    _row(ActivityBufferFullError, _G.RESOURCE_EXHAUSTED, 429),
    # FAILED_PRECONDITION codes answer 409 (not google.rpc's 400): the request is valid, the
    # state of the target is not, and a 400 would read as "fix your request".
    _row(WorktreeNotBoundError, _G.FAILED_PRECONDITION, 409),
    _row(WorktreeNotFoundError, _G.NOT_FOUND, 404),
    _row(WorktreeLockedError, _G.FAILED_PRECONDITION, 409),
    _row(FilesystemError, _G.INTERNAL, 500),
    _row(WorkflowCycleDetectedError, _G.INVALID_ARGUMENT, 400),
    _row(HitlUnavailableError, _G.UNAVAILABLE, 503),
    _row(ResourceTimeoutError, _G.DEADLINE_EXCEEDED, 504),
    _row(InitTimeoutError, _G.DEADLINE_EXCEEDED, 504),
    _row(SuspendTimeoutError, _G.DEADLINE_EXCEEDED, 504),
    _row(RecoveryTimeoutError, _G.DEADLINE_EXCEEDED, 504),
    _row(AgentShutdownTimeoutError, _G.DEADLINE_EXCEEDED, 504),
    # A budget is a quota on the call; google.rpc maps quota exhaustion to 429.
    _row(CpuBudgetExceededError, _G.RESOURCE_EXHAUSTED, 429),
    _row(WallTimeoutError, _G.DEADLINE_EXCEEDED, 504),
    # 499 "client closed request" is google.rpc's mapping of CANCELLED.
    _row(CallCancelledError, _G.CANCELLED, 499),
    _row(NotFoundError, _G.NOT_FOUND, 404),
    _row(AlreadyCompletedError, _G.FAILED_PRECONDITION, 409),
    # The tool, behind the coordinator, failed: a proxy's 502 ("the upstream failed").
    _row(ToolFailedError, _G.UNKNOWN, 502),
    _row(AlreadyExistsError, _G.ALREADY_EXISTS, 409),
    _row(TaskIdConflictError, _G.ALREADY_EXISTS, 409),
    # 410 Gone: the position existed once and is no longer served.
    _row(ResumeExpiredError, _G.OUT_OF_RANGE, 410),
    _row(DeadlineExceededError, _G.DEADLINE_EXCEEDED, 504),
    _row(UnavailableError, _G.UNAVAILABLE, 503),
    # A quota, like a budget: google.rpc maps quota exhaustion to RESOURCE_EXHAUSTED, 429.
    _row(QuotaExceededError, _G.RESOURCE_EXHAUSTED, 429),
    _row(UnauthenticatedError, _G.UNAUTHENTICATED, 401),
    _row(UnimplementedError, _G.UNIMPLEMENTED, 501),
)

ERROR_TABLE: Final[Mapping[str, ErrorSpec]] = MappingProxyType({r.code: r for r in _ROWS})
"""Every protocol error code Apiary knows, keyed by the code exactly as the specs write it."""

_BY_FOLDED_CODE: Final = {code.casefold(): spec for code, spec in ERROR_TABLE.items()}
_BY_PROTO: Final = {
    spec.proto_error_code: spec.code
    for spec in ERROR_TABLE.values()
    if spec.proto_error_code is not None
}


def lookup_code(code: str) -> ErrorSpec | None:
    """The spec of `code`, matched case-insensitively, or None when the code is unknown.

    Case is ignored because the specs themselves write the same code both ways (the NACK
    examples of RFC 13 and RFC 18.2 send "BUFFER_FULL" and "TOOL_TIMEOUT").
    """
    return ERROR_TABLE.get(code) or _BY_FOLDED_CODE.get(code.casefold())


def canonical_code(code: str) -> str:
    """`code` spelled as in `ERROR_TABLE` ("BUFFER_FULL" -> "buffer_full"); unknown: unchanged."""
    spec = lookup_code(code)
    return code if spec is None else spec.code


def error_for_code(
    code: str, message: str, details: Mapping[str, str] | None = None
) -> ApiaryError:
    """Rebuild the exception for a code received from a peer.

    An unknown code gives an `InternalError` whose details keep the original code under
    `original_code`, so nothing the peer said is lost.
    """
    spec = lookup_code(code)
    if spec is None:
        return InternalError(message, {**(details or {}), "original_code": code})
    return spec.exc_type(message, details)


def spec_for(exc: BaseException) -> ErrorSpec:
    """The table row a transport uses to answer `exc`.

    Anything that is not an `ApiaryError` (and an `ApiaryError` subclass whose code is not in
    the table) answers as internal_error; callers must log such exceptions themselves and send
    only the spec's description, never `str(exc)`.
    """
    if isinstance(exc, ApiaryError):
        spec = ERROR_TABLE.get(exc.code)
        if spec is not None:
            return spec
    return ERROR_TABLE[InternalError.code]


def as_apiary_error(exc: BaseException) -> ApiaryError:
    """`exc` itself when it is an `ApiaryError`, else an opaque `InternalError` without its text."""
    if isinstance(exc, ApiaryError):
        return exc
    return InternalError("internal error")


def to_proto_error_code(code: str) -> int:
    """The `sw4rm.common.ErrorCode` number for a protocol code.

    Codes the canonical enum lacks, and unknown codes, encode as INTERNAL_ERROR (99), never 0:
    receivers read 0 as NO_ERROR, which would turn a failure into a success. The precise code
    travels alongside (Ack.note, the `apiary-error-bin` trailer).
    """
    spec = lookup_code(code)
    if spec is None or spec.proto_error_code is None:
        return INTERNAL_ERROR_PROTO
    return spec.proto_error_code


def from_proto_error_code(number: int) -> str:
    """The protocol code for a `sw4rm.common.ErrorCode` number; "" for 0 (no error).

    "" is how every Apiary record spells "no error code", as proto3 strings do. Numbers this
    version does not know (proto3 enums are open) decode as internal_error.
    """
    if number == 0:
        return ""
    return _BY_PROTO.get(number, InternalError.code)
