"""The NEGOTIATION event fanout JSON of RFC 17.1: building and reading the payloads.

Every event is a JSON object with `kind` and `ts` (ISO-8601 UTC) and the fields of its kind:

    open      topic, corr
    policy    negotiation_id, profile?, policy (the EffectivePolicy's NegotiationPolicy)
    propose   from, ct, payload_b64
    counter   from, ct, payload_b64
    evaluate  from, score, notes
    decide    by, ct, result_b64
    abort     reason

Apiary adds fields receivers may ignore (RFC 17.1: unknown fields MUST be ignored):
negotiation_id on every kind, and round/version/delta/checks, applied, participants,
final_score/stop_reason where they tell a participant something. `decode_event` keeps the
whole object and the raw bytes, reads only what it knows, and decodes base64 on demand.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from apiary.errors import ValidationError

KINDS: Final = ("open", "policy", "propose", "counter", "evaluate", "decide", "abort")


def event(kind: str, ts: str, **fields: Any) -> dict[str, Any]:
    """An event object with `kind` and `ts` first (the order JSON readers see)."""
    if kind not in KINDS:
        raise ValueError(f"unknown negotiation event kind {kind!r}")
    return {"kind": kind, "ts": ts, **fields}


def encode(doc: Mapping[str, Any]) -> bytes:
    """The payload bytes of an event: compact UTF-8 JSON, in the object's own key order."""
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def b64(data: bytes) -> str:
    """Standard base64 with padding, as payload_b64 and result_b64 carry bytes."""
    return base64.b64encode(data).decode("ascii")


@dataclass(frozen=True, slots=True)
class NegotiationEvent:
    """One decoded event: the raw payload bytes, the whole JSON object, typed accessors."""

    raw: bytes
    fields: Mapping[str, Any]

    @property
    def kind(self) -> str:
        return str(self.fields.get("kind", ""))

    @property
    def known(self) -> bool:
        """Whether this version knows the kind (a newer one may add kinds)."""
        return self.kind in KINDS

    @property
    def ts(self) -> str:
        return _text(self.fields, "ts")

    @property
    def negotiation_id(self) -> str:
        """negotiation_id, else corr (open), else ''."""
        return _text(self.fields, "negotiation_id") or _text(self.fields, "corr")

    @property
    def topic(self) -> str:
        return _text(self.fields, "topic")

    @property
    def sender(self) -> str:
        """`from` (propose, counter, evaluate)."""
        return _text(self.fields, "from")

    @property
    def by(self) -> str:
        return _text(self.fields, "by")

    @property
    def content_type(self) -> str:
        return _text(self.fields, "ct")

    @property
    def score(self) -> float | None:
        value: Any = self.fields.get("score")
        return float(value) if _number(value) else None

    @property
    def notes(self) -> str:
        return _text(self.fields, "notes")

    @property
    def reason(self) -> str:
        return _text(self.fields, "reason")

    @property
    def profile(self) -> str:
        return _text(self.fields, "profile")

    @property
    def policy(self) -> Mapping[str, Any]:
        value = self.fields.get("policy")
        return value if isinstance(value, Mapping) else {}

    def payload(self) -> bytes:
        """The proposal bytes of a propose/counter event (payload_b64 decoded)."""
        return _b64_field(self.fields, "payload_b64")

    def result(self) -> bytes:
        """The decided bytes of a decide event (result_b64 decoded)."""
        return _b64_field(self.fields, "result_b64")

    def payload_json(self) -> Any:
        return _json(self.payload(), "payload_b64")

    def result_json(self) -> Any:
        return _json(self.result(), "result_b64")


def decode_event(data: bytes | str) -> NegotiationEvent:
    """Read an event payload; ValidationError when it is not a JSON object with a kind.

    Unknown fields are kept in `fields` and otherwise ignored; unknown kinds are returned
    too (`known` is False), so a newer peer's events do not break an older reader.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValidationError.for_field("payload", "is not a JSON negotiation event") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str):
        raise ValidationError.for_field("kind", "a negotiation event is an object with a kind")
    return NegotiationEvent(raw, doc)


def _b64_field(fields: Mapping[str, Any], name: str) -> bytes:
    value = fields.get(name)
    if not isinstance(value, str):
        raise ValidationError.for_field(name, "is missing")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValidationError.for_field(name, "is not standard base64") from None


def _json(data: bytes, name: str) -> Any:
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValidationError.for_field(name, "does not hold JSON") from None


def _text(fields: Mapping[str, Any], name: str) -> str:
    value = fields.get(name)
    return value if isinstance(value, str) else ""


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
