"""Refusals of the Agent Swarm Protocol: an HTTP status, a machine-readable code, a message.

The codes are the protocol's (schemas/types/error.json) plus INVALID_FORMAT for a malformed
body (the OpenAPI examples use it), PAYLOAD_TOO_LARGE for a body over the transport's limit
(413, which the protocol's status table leaves out) and RATE_LIMITED; `field` names the
offending field of a malformed body. The JSON form is the protocol's error object.
"""

from __future__ import annotations

from typing import Any


class SwarmError(Exception):
    """One refusal: `status` is the HTTP status the transport answers with."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field: str = "",
        retry_after_s: int = 0,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.retry_after_s = retry_after_s
        self.details = dict(details or {})

    def to_json(self) -> dict[str, Any]:
        details = dict(self.details)
        if self.field:
            details["field"] = self.field
        if self.retry_after_s:
            details["retry_after_s"] = self.retry_after_s
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if details:
            error["details"] = details
        return {"error": error}


def invalid(field: str, problem: str) -> SwarmError:
    """400 for a malformed body, naming the field."""
    return SwarmError(400, "INVALID_FORMAT", f"{field}: {problem}", field=field)


def too_large(field: str, limit: int) -> SwarmError:
    """413 for a body over `limit` bytes, naming the field and the limit."""
    return SwarmError(
        413, "PAYLOAD_TOO_LARGE", f"{field}: larger than this peer's limit of {limit} bytes",
        field=field, details={"limit": limit},
    )  # fmt: skip


def unauthorized(problem: str, code: str = "NOT_AUTHORIZED") -> SwarmError:
    return SwarmError(403, code, problem)


def bad_signature(problem: str = "signature verification failed") -> SwarmError:
    return SwarmError(401, "INVALID_SIGNATURE", problem)


def not_found(swarm_id: str) -> SwarmError:
    return SwarmError(404, "SWARM_NOT_FOUND", f"unknown swarm {swarm_id}")


def rate_limited(scope: str, retry_after_s: int) -> SwarmError:
    return SwarmError(
        429, "RATE_LIMITED", f"too many requests ({scope}); retry in {retry_after_s} s",
        retry_after_s=retry_after_s,
    )  # fmt: skip


class SwarmFileError(Exception):
    """A local file (identity key, state file, node configuration) that cannot be used: the
    message names the file and, where there is one, the offending field."""

    def __init__(self, path: object, problem: str, field: str = "") -> None:
        where = f"{path}: {field}: " if field else f"{path}: "
        super().__init__(where + problem)
        self.path = str(path)
        self.problem = problem
        self.field = field
