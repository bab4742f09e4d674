"""The error trailer: how a protocol error code crosses gRPC (apiary.v1.ErrorDetail)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from google.protobuf.message import DecodeError

from apiary.errors import ApiaryError, error_for_code
from apiary.wire import pb

ERROR_TRAILER = "apiary-error-bin"
"""Binary trailer carrying apiary.v1.ErrorDetail on every non-OK status Apiary sends."""


def encode_error_detail(code: str, message: str, details: Mapping[str, str]) -> bytes:
    return pb.apiary_pb2.ErrorDetail(
        error_code=code, message=message, details=dict(details)
    ).SerializeToString()


def error_from_trailers(trailers: Iterable[tuple[str, str | bytes]]) -> ApiaryError | None:
    """The Apiary exception a status carried in its trailer, or None when it carried none."""
    for key, value in trailers:
        if key == ERROR_TRAILER and isinstance(value, bytes):
            detail = pb.apiary_pb2.ErrorDetail()
            try:
                detail.ParseFromString(value)
            except DecodeError:
                return None
            return error_for_code(detail.error_code, detail.message, dict(detail.details))
    return None
