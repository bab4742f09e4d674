"""Model and reasoning progress an agent reports from inside a task it holds (a turn's task
or an agent task's run): `model.requested` when it asks a model, `model.delta` for each piece
of the answer as it streams, `model.completed` (or `model.failed`) at its end, and
`reasoning.summary` for a summary of its reasoning. Pure: the report's fields checked and
bounded (a ValidationError naming the field), and the contract event's payload; the agent
sends it through the Scheduler's command channel (sdk/model_reports.py) and the control
plane writes it to the thread's events (controlplane/model_progress.py).

A delta carries at most DELTA_BYTES of text: the SDK splits a longer piece into several, in
order (`index` counts a request's deltas from 0)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from apiary.core.limits import DEFAULT_LIMITS, check_id, check_text, utf8_size
from apiary.core.runtime.events import RuntimeEventType
from apiary.errors import ValidationError

_T = RuntimeEventType
KINDS: Final = (
    _T.MODEL_REQUESTED, _T.MODEL_DELTA, _T.MODEL_COMPLETED, _T.MODEL_FAILED,
    _T.REASONING_SUMMARY,
)  # fmt: skip
DELTA_BYTES: Final = 4096
"""The most text one model.delta carries (UTF-8 bytes)."""
SUMMARY_BYTES: Final = 16384
"""The most text one reasoning.summary carries."""
NAME_BYTES: Final = 256
"""A model's, provider's or finish reason's name."""
MAX_TOKENS: Final = 1 << 40
ID_BYTES: Final = DEFAULT_LIMITS.id_bytes
_USAGE: Final = ("inputTokens", "outputTokens", "reasoningTokens")


@dataclass(frozen=True, slots=True)
class ModelReport:
    """One report, checked: its event type, model request id ('' for a summary of no one
    request) and the event's payload."""

    kind: str
    model_request_id: str
    payload: Mapping[str, Any]


def _text(body: Mapping[str, Any], name: str, limit: int, *, required: bool = False) -> str:
    value = body.get(name)
    if value is None or value == "":
        if required:
            raise ValidationError.for_field(name, "is required")
        return ""
    if not isinstance(value, str):
        raise ValidationError.for_field(name, "must be a string")
    return check_text(value, name, limit)  # (its size in bytes checked there)


def _count(body: Mapping[str, Any], name: str, *, required: bool = False) -> int | None:
    value = body.get(name)
    if value is None:
        if required:
            raise ValidationError.for_field(name, "is required")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKENS:
        raise ValidationError.for_field(name, f"must be an integer within 0..{MAX_TOKENS}")
    return value


def _usage(body: Mapping[str, Any]) -> dict[str, int] | None:
    value = body.get("usage")
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValidationError.for_field("usage", "must be an object of token counts")
    unknown = sorted(set(value) - set(_USAGE))
    if unknown:
        raise ValidationError.for_field(
            "usage", f"{unknown[0]!r} is not one of {', '.join(_USAGE)}"
        )
    counts = {name: _count(value, name) for name in _USAGE}
    return {name: count for name, count in counts.items() if count is not None}


def read_report(body: Mapping[str, Any]) -> ModelReport:
    """The report in a command's body (`event`, `modelRequestId` and the event's fields);
    a ValidationError naming the field that is missing, of the wrong type or too large."""
    kind = body.get("event")
    if kind not in KINDS:
        raise ValidationError.for_field("event", f"must be one of: {', '.join(KINDS)}")
    request_id = body.get("modelRequestId")
    if request_id is not None and not isinstance(request_id, str):
        raise ValidationError.for_field("modelRequestId", "must be a string")
    request_id = check_id(request_id or "", "modelRequestId", ID_BYTES)
    if not request_id and kind != _T.REASONING_SUMMARY:
        raise ValidationError.for_field("modelRequestId", f"is required for {kind}")
    payload: dict[str, Any] = {}
    if kind == _T.MODEL_REQUESTED:
        payload = {
            "model": _text(body, "model", NAME_BYTES, required=True),
            "provider": _text(body, "provider", NAME_BYTES),
            "purpose": _text(body, "purpose", DEFAULT_LIMITS.text_bytes),
            "inputTokens": _count(body, "inputTokens"),
        }
    elif kind == _T.MODEL_DELTA:
        payload = {
            "index": _count(body, "index", required=True),
            "text": _text(body, "text", DELTA_BYTES, required=True),
        }
    elif kind == _T.MODEL_COMPLETED:
        payload = {
            "model": _text(body, "model", NAME_BYTES),
            "finishReason": _text(body, "finishReason", NAME_BYTES),
            "usage": _usage(body),
            "outputBytes": _count(body, "outputBytes"),
        }
    elif kind == _T.MODEL_FAILED:
        payload = {
            "error": {
                "code": _text(body, "errorCode", NAME_BYTES, required=True),
                "message": _text(body, "message", DEFAULT_LIMITS.text_bytes),
            }
        }
    else:
        payload = {"summary": _text(body, "summary", SUMMARY_BYTES, required=True)}
    shown = {name: value for name, value in payload.items() if value not in (None, "")}
    return ModelReport(str(kind), request_id, shown)


def chunks(text: str, limit: int = DELTA_BYTES) -> list[str]:
    """`text` in pieces of at most `limit` UTF-8 bytes, split between characters."""
    pieces: list[str] = []
    start, size = 0, 0
    for i, ch in enumerate(text):
        width = utf8_size(ch)
        if size + width > limit:
            pieces.append(text[start:i])
            start, size = i, 0
        size += width
    if start < len(text) or not pieces:
        pieces.append(text[start:])
    return pieces
