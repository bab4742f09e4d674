"""The error vocabulary: one class per code, one pinned table to gRPC and HTTP statuses."""

from __future__ import annotations

import ast
import inspect
import pickle
import re
from pathlib import Path

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary import errors
from apiary.errors import (
    ERROR_TABLE,
    INTERNAL_ERROR_PROTO,
    ApiaryError,
    GrpcStatus,
    InternalError,
    ValidationError,
    as_apiary_error,
    canonical_code,
    error_for_code,
    from_proto_error_code,
    lookup_code,
    spec_for,
    to_proto_error_code,
)

ROOT = Path(__file__).resolve().parents[2]

# Changing a row here is a wire change: clients retry, alert and display by these statuses.
EXPECTED_TABLE = {
    "buffer_full": ("RESOURCE_EXHAUSTED", 429),
    "no_route": ("NOT_FOUND", 404),
    "ack_timeout": ("DEADLINE_EXCEEDED", 504),
    "agent_unavailable": ("UNAVAILABLE", 503),
    "agent_shutdown": ("UNAVAILABLE", 503),
    "validation_error": ("INVALID_ARGUMENT", 400),
    "permission_denied": ("PERMISSION_DENIED", 403),
    "unsupported_message_type": ("INVALID_ARGUMENT", 415),
    "oversize_payload": ("RESOURCE_EXHAUSTED", 413),
    "tool_timeout": ("DEADLINE_EXCEEDED", 504),
    "partial_delivery": ("DATA_LOSS", 500),
    "forced_preemption": ("ABORTED", 409),
    "ttl_expired": ("DEADLINE_EXCEEDED", 504),
    "internal_error": ("INTERNAL", 500),
    "duplicate_detected": ("ALREADY_EXISTS", 409),
    "already_in_progress": ("ABORTED", 409),
    "activity_buffer_full": ("RESOURCE_EXHAUSTED", 429),
    "worktree_not_bound": ("FAILED_PRECONDITION", 409),
    "worktree_not_found": ("NOT_FOUND", 404),
    "worktree_locked": ("FAILED_PRECONDITION", 409),
    "filesystem_error": ("INTERNAL", 500),
    "workflow_cycle_detected": ("INVALID_ARGUMENT", 400),
    "hitl_unavailable": ("UNAVAILABLE", 503),
    "resource_timeout": ("DEADLINE_EXCEEDED", 504),
    "init_timeout": ("DEADLINE_EXCEEDED", 504),
    "suspend_timeout": ("DEADLINE_EXCEEDED", 504),
    "recovery_timeout": ("DEADLINE_EXCEEDED", 504),
    "agent_shutdown_timeout": ("DEADLINE_EXCEEDED", 504),
    "CPU_BUDGET_EXCEEDED": ("RESOURCE_EXHAUSTED", 429),
    "WALL_TIMEOUT": ("DEADLINE_EXCEEDED", 504),
    "CANCELLED": ("CANCELLED", 499),
    "NOT_FOUND": ("NOT_FOUND", 404),
    "ALREADY_COMPLETED": ("FAILED_PRECONDITION", 409),
    "TOOL_FAILED": ("UNKNOWN", 502),
    "already_exists": ("ALREADY_EXISTS", 409),
    "task_id_conflict": ("ALREADY_EXISTS", 409),
    "deadline_exceeded": ("DEADLINE_EXCEEDED", 504),
    "unavailable": ("UNAVAILABLE", 503),
    "quota_exceeded": ("RESOURCE_EXHAUSTED", 429),
    "unauthenticated": ("UNAUTHENTICATED", 401),
    "unimplemented": ("UNIMPLEMENTED", 501),
    "resume_expired": ("OUT_OF_RANGE", 410),
}


def canonical_error_codes() -> dict[str, int]:
    """ErrorCode names and numbers as proto/common.proto declares them."""
    text = (ROOT / "proto" / "common.proto").read_text()
    body = re.search(r"enum ErrorCode \{(.*?)\}", text, re.DOTALL)
    assert body is not None, "proto/common.proto has no ErrorCode enum"
    pairs = re.findall(r"^\s*([A-Z_]+)\s*=\s*(\d+)\s*;", body.group(1), re.MULTILINE)
    return {name: int(number) for name, number in pairs}


def module_error_classes() -> list[type[ApiaryError]]:
    return [
        obj
        for _, obj in inspect.getmembers(errors, inspect.isclass)
        if issubclass(obj, ApiaryError) and obj is not ApiaryError
    ]


@pytest.mark.conformance("errors.codes.core-set")
def test_table_is_pinned() -> None:
    actual = {code: (s.grpc_status.name, s.http_status) for code, s in ERROR_TABLE.items()}
    assert actual == EXPECTED_TABLE


def test_rows_are_keyed_by_their_class_code() -> None:
    for code, spec in ERROR_TABLE.items():
        assert spec.code == code
        assert spec.exc_type.code == code
        assert spec.exc_type.__name__.endswith("Error")
        assert spec.description, code


def test_one_class_per_code_and_every_class_in_the_table() -> None:
    classes = [spec.exc_type for spec in ERROR_TABLE.values()]
    assert len(set(classes)) == len(classes)
    assert set(module_error_classes()) == set(classes)


def test_codes_are_unique_ignoring_case() -> None:
    folded = [code.casefold() for code in ERROR_TABLE]
    assert len(set(folded)) == len(folded)


@pytest.mark.conformance("errors.codes.core-set")
def test_every_canonical_error_code_is_covered_with_its_number() -> None:
    canonical = canonical_error_codes()
    assert "BUFFER_FULL" in canonical  # the parse found the enum
    for name, number in canonical.items():
        if number == 0:
            continue
        spec = ERROR_TABLE[name.lower()]
        assert spec.proto_error_code == number, name
    numbered = {s.proto_error_code for s in ERROR_TABLE.values()} - {None}
    assert numbered == {n for n in canonical.values() if n != 0}


def test_grpc_status_mirrors_grpc() -> None:
    for status in grpc.StatusCode:
        assert GrpcStatus[status.name] == status.value[0]
    assert len(GrpcStatus) == len(grpc.StatusCode)


def test_errors_module_does_not_import_grpc() -> None:
    tree = ast.parse((ROOT / "src" / "apiary" / "errors.py").read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert "grpc" not in imported
    assert "apiary" not in imported


@pytest.mark.parametrize("code", sorted(ERROR_TABLE))
def test_error_for_code_round_trips(code: str) -> None:
    exc = error_for_code(code, "what happened", {"field": "x"})
    spec = ERROR_TABLE[code]
    assert type(exc) is spec.exc_type
    assert (exc.code, exc.message, exc.details) == (code, "what happened", {"field": "x"})
    assert spec_for(exc) is spec
    assert as_apiary_error(exc) is exc


@pytest.mark.parametrize("code", sorted(ERROR_TABLE))
def test_codes_match_in_either_case(code: str) -> None:
    # The RFC's own NACK examples send "BUFFER_FULL"; other SDKs lower-case everything.
    for spelling in (code.upper(), code.lower()):
        assert type(error_for_code(spelling, "")) is ERROR_TABLE[code].exc_type
        assert canonical_code(spelling) == code
        assert lookup_code(spelling) is ERROR_TABLE[code]


def test_unknown_code_becomes_internal_error_keeping_the_code() -> None:
    exc = error_for_code("flux_capacitor_broken", "boom", {"a": "b"})
    assert type(exc) is InternalError
    assert exc.message == "boom"
    assert exc.details == {"a": "b", "original_code": "flux_capacitor_broken"}
    assert canonical_code("flux_capacitor_broken") == "flux_capacitor_broken"
    assert lookup_code("flux_capacitor_broken") is None


@given(st.text(max_size=40), st.text(max_size=40))
def test_error_for_code_never_fails(code: str, message: str) -> None:
    exc = error_for_code(code, message)
    assert exc.message == message
    spec = spec_for(exc)
    if lookup_code(code) is None:
        assert spec.code == "internal_error"
        assert exc.details["original_code"] == code
    else:
        assert spec.code.casefold() == code.casefold()


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("password=hunter2"),
        KeyError("password=hunter2"),
        ValueError("password=hunter2"),
        KeyboardInterrupt("password=hunter2"),
    ],
)
def test_foreign_exceptions_become_opaque_internal_errors(exc: BaseException) -> None:
    spec = spec_for(exc)
    assert spec.code == "internal_error"
    assert spec.grpc_status is GrpcStatus.INTERNAL
    assert spec.http_status == 500
    wrapped = as_apiary_error(exc)
    assert type(wrapped) is InternalError
    shown = " ".join([str(wrapped), repr(wrapped), wrapped.message, spec.description])
    assert "hunter2" not in shown
    assert wrapped.details == {}


def test_subclass_with_an_unknown_code_answers_as_internal_error() -> None:
    class RogueError(ApiaryError):
        code = "rogue_code"

    assert spec_for(RogueError("x")).code == "internal_error"


def test_proto_numbers_round_trip_for_canonical_codes() -> None:
    for name, number in canonical_error_codes().items():
        if number == 0:
            continue
        assert to_proto_error_code(name.lower()) == number
        assert to_proto_error_code(name) == number
        assert from_proto_error_code(number) == name.lower()


def test_codes_without_a_canonical_number_encode_as_internal_error_never_zero() -> None:
    for code, spec in ERROR_TABLE.items():
        if spec.proto_error_code is None:
            assert to_proto_error_code(code) == INTERNAL_ERROR_PROTO == 99
    assert to_proto_error_code("no_such_code") == 99
    assert all(to_proto_error_code(code) != 0 for code in ERROR_TABLE)


def test_from_proto_zero_is_no_error_and_unknown_numbers_are_internal() -> None:
    assert from_proto_error_code(0) == ""
    assert from_proto_error_code(14) == "internal_error"
    assert from_proto_error_code(12345) == "internal_error"


def test_errors_pickle_with_their_details() -> None:
    exc = error_for_code("buffer_full", "full", {"agent_id": "a-1"})
    copy = pickle.loads(pickle.dumps(exc))
    assert type(copy) is type(exc)
    assert (copy.code, copy.message, copy.details) == ("buffer_full", "full", {"agent_id": "a-1"})


def test_str_names_the_code() -> None:
    assert str(error_for_code("no_route", "no agent 'x'")) == "no_route: no agent 'x'"
    assert str(error_for_code("no_route", "")) == "no_route"


def test_validation_error_for_field() -> None:
    exc = ValidationError.for_field("message_id", "must be a UUIDv4", got="abc")
    assert exc.message == "message_id: must be a UUIDv4"
    assert exc.details == {"field": "message_id", "got": "abc"}


def test_details_are_copied_not_shared() -> None:
    details = {"k": "v"}
    exc = ValidationError("m", details)
    details["k"] = "changed"
    assert exc.details == {"k": "v"}
