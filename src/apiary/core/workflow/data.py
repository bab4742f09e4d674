"""Data flow through `workflow_data` (RFC 17.7, "Input/Output Mapping").

`workflow_data` is one JSON object shared by the nodes of a workflow. Mappings name places in
JSON documents with paths, in either of two forms:

- dotted keys: `records`, `report.summary`, `items.0.name` (a segment of digits indexes a
  list when the value there is a list, and is a key otherwise);
- JSON paths (a subset): `$` (the whole document), `$.report.summary`, `$.items[0].name`,
  `$['key.with.dots']`, `$["quoted"]` (a bracketed string is always a key, a bracketed
  integer always an index).

`input_mapping` maps a node input parameter (key) to a workflow_data path (value): before a
node runs, `node_input` builds its input object from them (a parameter name may itself be a
dotted path, building nested input). A node with no input_mapping gets all of workflow_data.
A path that is missing fails the node (ValidationError naming the mapping): a node never
starts on silently absent input.

`output_mapping` maps a path in the node's output (key) to a workflow_data path (value):
after the node completes, `apply_output` copies each value there, creating intermediate
objects. A node with no output_mapping writes nothing (its output stays in its NodeState).
A missing output path fails the node the same way.

An agent's output is the note of its FULFILLED acknowledgement: `parse_output` reads it as
JSON when it is JSON, and as a plain string otherwise (docs/workflows.md).
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Mapping
from typing import Any, Final

from apiary.core.json_reader import read_json, read_json_object
from apiary.core.limits import DEFAULT_LIMITS, Limits
from apiary.errors import ValidationError

Segment = str | int
Path = tuple[Segment, ...]

_BRACKET: Final = re.compile(r"\[(?:(\d+)|'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\")\]")
_NAME: Final = re.compile(r"\.([^.\[\]]+)")


class MissingPathError(LookupError):
    """A path names nothing in the document."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def parse_path(text: object, field: str) -> Path:
    """The segments of a dotted or `$` path; ValidationError naming `field` when malformed."""
    if not isinstance(text, str) or not text.strip():
        raise ValidationError.for_field(field, "must be a non-empty path such as 'report.summary'")
    if text.startswith("$"):
        return _json_path(text, field)
    parts = text.split(".")
    if any(not part for part in parts):
        raise ValidationError.for_field(field, f"{text!r} has an empty segment")
    return tuple(parts)


def _json_path(text: str, field: str) -> Path:
    segments: list[Segment] = []
    at = 1
    while at < len(text):
        bracket = _BRACKET.match(text, at)
        name = _NAME.match(text, at)
        if bracket is not None:
            index, single, double = bracket.groups()
            if index is not None:
                segments.append(int(index))
            else:
                quoted = single if single is not None else double
                segments.append(re.sub(r"\\(.)", r"\1", quoted or ""))
            at = bracket.end()
        elif name is not None:
            segments.append(name.group(1))
            at = name.end()
        else:
            raise ValidationError.for_field(
                field, f"{text!r} is not a path: expected .name, [index] or ['key'] at {at}"
            )
    return tuple(segments)


def lookup(document: Any, path: Path, text: str = "") -> Any:
    """The value at `path`; MissingPathError (with `text`, the path as written) when absent."""
    value = document
    for segment in path:
        if isinstance(value, list):
            index = _index(segment)
            if index is None or index >= len(value):
                raise MissingPathError(text or _render(path))
            value = value[index]
        elif isinstance(value, dict) and isinstance(segment, str) and segment in value:
            value = value[segment]
        else:
            raise MissingPathError(text or _render(path))
    return value


def assign(document: Any, path: Path, value: Any, text: str = "") -> Any:
    """`document` with `value` at `path` (changed in place where it is a container; the
    result is the document, or `value` itself for the empty path). Missing objects on the
    way are created; a list index must exist; MissingPathError otherwise."""
    if not path:
        return value
    target = document
    for segment, following in itertools.pairwise(path):
        target = _child(target, segment, following, text or _render(path))
    last = path[-1]
    if isinstance(target, list):
        index = _index(last)
        if index is None or index >= len(target):
            raise MissingPathError(text or _render(path))
        target[index] = value
    elif isinstance(target, dict):
        target[str(last)] = value
    else:
        raise MissingPathError(text or _render(path))
    return document


def _child(target: Any, segment: Segment, following: Segment, text: str) -> Any:
    if isinstance(target, list):
        index = _index(segment)
        if index is None or index >= len(target):
            raise MissingPathError(text)
        return target[index]
    if not isinstance(target, dict):
        raise MissingPathError(text)
    key = str(segment)
    if key not in target:
        if isinstance(following, int):
            raise MissingPathError(text)  # a list index must exist
        target[key] = {}
    elif not isinstance(target[key], dict | list):
        raise MissingPathError(text)  # a scalar is never silently replaced by a container
    return target[key]


def _index(segment: Segment) -> int | None:
    if isinstance(segment, int):
        return segment
    return int(segment) if segment.isdigit() else None


def _render(path: Path) -> str:
    return "$" + "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in path)


def check_mapping(mapping: Mapping[str, str], field: str) -> None:
    """Parse every key and value of a mapping, so that a bad path fails at CreateWorkflow."""
    for key, value in mapping.items():
        parse_path(key, f"{field}[{key!r}]")
        parse_path(value, f"{field}[{key!r}]")


def node_input(workflow_data: Mapping[str, Any], mapping: Mapping[str, str], field: str) -> Any:
    """The input object of a node (module docstring); ValidationError naming the mapping
    entry whose workflow_data path is missing."""
    if not mapping:
        return copy.deepcopy(dict(workflow_data))
    built: dict[str, Any] = {}
    for parameter, source in mapping.items():
        try:
            value = lookup(workflow_data, parse_path(source, field), source)
        except MissingPathError:
            raise ValidationError.for_field(
                f"{field}[{parameter!r}]", f"workflow_data has nothing at {source!r}"
            ) from None
        assign(built, parse_path(parameter, field), copy.deepcopy(value), parameter)
    return built


def apply_output(
    workflow_data: Mapping[str, Any], output: Any, mapping: Mapping[str, str], field: str
) -> dict[str, Any]:
    """workflow_data with the node's output mapped in (a new object; the argument is kept);
    ValidationError naming the entry whose output path is missing or whose target clashes."""
    updated = copy.deepcopy(dict(workflow_data))
    for source, target in mapping.items():
        try:
            value = lookup(output, parse_path(source, field), source)
        except MissingPathError:
            raise ValidationError.for_field(
                f"{field}[{source!r}]", f"the node's output has nothing at {source!r}"
            ) from None
        target_path = parse_path(target, field)
        if not target_path:
            if not isinstance(value, dict):
                raise ValidationError.for_field(
                    f"{field}[{source!r}]", "only an object can replace all of workflow_data"
                )
            updated = copy.deepcopy(value)
            continue
        try:
            assign(updated, target_path, copy.deepcopy(value), target)
        except MissingPathError:
            raise ValidationError.for_field(
                f"{field}[{source!r}]", f"cannot write workflow_data at {target!r}"
            ) from None
    return updated


def parse_output(note: str) -> Any:
    """A node's output from its FULFILLED note: the JSON value when the note is JSON the
    coordinator can keep in workflow_data (`core.json_reader`, within its limits), the note
    as a string otherwise, None when empty."""
    text = note.strip()
    if not text:
        return None
    try:
        return read_json(text, "note")
    except ValidationError:
        return note


def parse_data(
    text: str, field: str = "workflow_data", limits: Limits = DEFAULT_LIMITS
) -> dict[str, Any]:
    """workflow_data from a client's JSON text (empty text: an empty object), read within
    `limits` (`document_bytes`, `json_depth`); ValidationError naming `field` unless it is
    a JSON object the coordinator can keep. (The store's copy, which node outputs may have
    grown past these limits, is read back by the store's codec.)"""
    if not text.strip():
        return {}
    return read_json_object(
        text, field, max_bytes=limits.document_bytes, max_depth=limits.json_depth
    )


def dump_data(value: Any) -> str:
    """Compact JSON text (key order kept) for workflow_data and node outputs."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
