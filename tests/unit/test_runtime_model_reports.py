"""The model and reasoning reports' rules (core/runtime/model_reports.py): fields checked
and bounded, naming the field; deltas split between characters within their bound."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.runtime.model_reports import DELTA_BYTES, chunks, read_report
from apiary.errors import ValidationError


@given(st.text(max_size=3000), st.integers(min_value=4, max_value=64))
def test_chunks_keep_the_text_and_their_bound(text: str, limit: int) -> None:
    pieces = chunks(text, limit)
    assert "".join(pieces) == text
    assert all(len(p.encode("utf-8", "surrogatepass")) <= limit for p in pieces)
    assert all(pieces) or pieces == [""]


def test_a_report_becomes_its_events_payload() -> None:
    report = read_report({"event": "model.completed", "modelRequestId": "r-1", "model": "m",
                          "usage": {"inputTokens": 3}})  # fmt: skip
    assert (report.kind, report.model_request_id) == ("model.completed", "r-1")
    assert report.payload == {"model": "m", "usage": {"inputTokens": 3}}
    summary = read_report({"event": "reasoning.summary", "summary": "why"})
    assert summary.model_request_id == "" and summary.payload == {"summary": "why"}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"event": "model.started"}, "event"),
        ({"event": "model.requested", "model": "m"}, "modelRequestId"),
        ({"event": "model.requested", "modelRequestId": 7, "model": "m"}, "modelRequestId"),
        ({"event": "model.requested", "modelRequestId": "r"}, "model"),
        ({"event": "model.requested", "modelRequestId": "r", "model": "m", "inputTokens": -1},
         "inputTokens"),
        ({"event": "model.delta", "modelRequestId": "r", "text": "t"}, "index"),
        ({"event": "model.delta", "modelRequestId": "r", "index": 0,
          "text": "x" * (DELTA_BYTES + 1)}, "text"),
        ({"event": "model.delta", "modelRequestId": "r", "index": 0, "text": "\x00"}, "text"),
        ({"event": "model.completed", "modelRequestId": "r", "usage": {"cost": 1}}, "usage"),
        ({"event": "model.failed", "modelRequestId": "r"}, "errorCode"),
        ({"event": "reasoning.summary", "summary": ["no"]}, "summary"),
    ],
)  # fmt: skip
def test_a_bad_report_names_its_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        read_report(body)
    assert refused.value.details["field"] == field
