"""The structural JSON DeltaSummary between two drafts (RFC 17.3) and the diff artifact.

Changed paths are RFC 6901 JSON Pointers ("" is the whole document), minimal: where a
subtree appears, disappears or changes type, its root is the changed path, not each leaf
below it. Objects are compared key by key, arrays index by index, scalars by JSON value and
type (true is not 1, 1 is 1.0).

The magnitude is bounded in [0, 1]: the leaves (scalars and empty containers) under the
changed paths, counted in both drafts, over all leaves of both drafts. Identical drafts give
0, drafts sharing nothing give 1. Drafts that are not JSON compare as opaque bytes: 0 when
equal, else 1 with the root as the only changed path. At most `MAX_CHANGED_PATHS` paths are
listed; `truncated` says when there were more (the magnitude still counts them all).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from apiary.core.envelope_rules import PayloadLimits
from apiary.core.json_reader import JsonError, read_document

MAX_CHANGED_PATHS: Final = 200
MAX_DRAFT_BYTES: Final = PayloadLimits().negotiation
"""A JSON draft is read as JSON up to the size of a NEGOTIATION payload (1 MiB); a larger
one compares, and is validated, as opaque bytes."""
_MISSING: Final = object()


@dataclass(frozen=True, slots=True)
class Change:
    """One RFC 6902-style operation turning the old draft into the new one."""

    op: str
    """add | remove | replace"""
    path: str
    old: Any = None
    new: Any = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"op": self.op, "path": self.path}
        if self.op != "add":
            doc["from_value"] = self.old
        if self.op != "remove":
            doc["value"] = self.new
        return doc


@dataclass(frozen=True, slots=True)
class DeltaSummary:
    """`sw4rm.policy.DeltaSummary` plus whether changed_paths was cut short."""

    magnitude: float
    changed_paths: tuple[str, ...]
    truncated: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "magnitude": self.magnitude,
            "changed_paths": list(self.changed_paths),
            "truncated": self.truncated,
        }


NO_CHANGE: Final = DeltaSummary(0.0, ())


@dataclass(frozen=True, slots=True)
class Delta:
    summary: DeltaSummary
    changes: tuple[Change, ...]


def parse_json(content_type: str, payload: bytes) -> tuple[bool, Any]:
    """(True, value) when the payload is JSON (by content type, or by parsing when the type
    says nothing) within the JSON reader's limits, else (False, None)."""
    base = content_type.split(";", 1)[0].strip().lower()
    jsonish = base == "application/json" or base.endswith("+json")
    if base and not jsonish:
        return False, None
    try:
        return True, read_document(payload, max_bytes=MAX_DRAFT_BYTES, kept=False)
    except JsonError:
        return False, None


def pointer(parts: tuple[str | int, ...]) -> str:
    """RFC 6901: "" for the root, else "/" + each token with ~ and / escaped."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def diff(old_type: str, old_payload: bytes, new_type: str, new_payload: bytes) -> Delta:
    """The delta from the old draft to the new one (see the module docstring)."""
    old_json, old = parse_json(old_type, old_payload)
    new_json, new = parse_json(new_type, new_payload)
    if not (old_json and new_json):
        if old_payload == new_payload and old_type == new_type:
            return Delta(NO_CHANGE, ())
        return Delta(DeltaSummary(1.0, ("",)), (Change("replace", "", None, None),))
    return json_diff(old, new)


def json_diff(old: Any, new: Any) -> Delta:
    """The delta between two JSON values."""
    changes = list(_changes(old, new, ()))
    changed = sum(_leaves(c.old) * (c.op != "add") + _leaves(c.new) * (c.op != "remove")
                  for c in changes)  # fmt: skip
    total = _leaves(old) + _leaves(new)
    magnitude = round(min(1.0, changed / total), 6) if total else 0.0
    paths = tuple(c.path for c in changes)
    summary = DeltaSummary(
        magnitude, paths[:MAX_CHANGED_PATHS], truncated=len(paths) > MAX_CHANGED_PATHS
    )
    return Delta(summary, tuple(changes[:MAX_CHANGED_PATHS]))


def diff_document(delta: Delta, from_version: str, to_version: str) -> dict[str, Any]:
    """The content of diff_v{N-1}_to_vN.json (RFC 17.4)."""
    return {
        "from": from_version,
        "to": to_version,
        **delta.summary.to_json(),
        "changes": [c.to_json() for c in delta.changes],
    }


def _changes(old: Any, new: Any, at: tuple[str | int, ...]) -> Iterator[Change]:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(old.keys() | new.keys()):
            yield from _member(old.get(key, _MISSING), new.get(key, _MISSING), (*at, key))
    elif isinstance(old, list) and isinstance(new, list):
        for index in range(max(len(old), len(new))):
            a = old[index] if index < len(old) else _MISSING
            b = new[index] if index < len(new) else _MISSING
            yield from _member(a, b, (*at, index))
    elif not _same(old, new):
        yield Change("replace", pointer(at), old, new)


def _member(old: Any, new: Any, at: tuple[str | int, ...]) -> Iterator[Change]:
    if old is _MISSING:
        yield Change("add", pointer(at), None, new)
    elif new is _MISSING:
        yield Change("remove", pointer(at), old, None)
    else:
        yield from _changes(old, new, at)


def _same(a: Any, b: Any) -> bool:
    """JSON equality with types: true is not 1; 1 equals 1.0 (one JSON number)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) or isinstance(b, dict) or isinstance(a, list) or isinstance(b, list):
        return False  # containers are compared member by member, never here
    return type(a) is type(b) and a == b


def _leaves(value: Any) -> int:
    """Scalars and empty containers in `value` (1 for a scalar)."""
    if isinstance(value, dict):
        return sum(_leaves(v) for v in value.values()) or 1
    if isinstance(value, list):
        return sum(_leaves(v) for v in value) or 1
    return 1
