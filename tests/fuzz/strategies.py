"""Hypothesis strategies built from the protobuf descriptors: every request message of every
served method, as a protobuf message (gRPC), as proto3 JSON (the gateway), and as raw bytes.

Values lean on the boundaries that broke servers before: empty, huge, unicode and NUL
strings; integers at 0, -1, 2^31, 2^63-1 and 2^64-1; enum numbers the proto does not define;
timestamps with huge seconds; bytes that are JSON bombs; and ids the coordinator knows (the
fuzz agents registered by the fixture), so that calls get past "no such agent" as well.
"""

from __future__ import annotations

import base64
import uuid
from typing import Any, cast

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

from apiary.wire.services import RpcMethod

KNOWN_AGENTS = ("fuzz-agent", "fuzz-peer")
"""Agents the fixture registers before fuzzing (tests/fuzz/conftest.py)."""
HUGE = 70_000
"""The length of the "huge" strings and bytes: far past any id limit, cheap to send."""
MAX_DEPTH = 3
"""Nesting of generated messages; deeper fields stay empty."""
NO_SUCH_COMMAND = "/nonexistent/apiary-fuzz-no-such-command"
FIXED_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    # The coordinator starts this command as an MCP server: a fuzzer must never pick one
    # that exists on the machine running it.
    "apiary.v1.RegisterMcpServerRequest.command": st.sampled_from(["", NO_SUCH_COMMAND]),
}
"""Fields whose values do not come from their type's strategy (full name -> strategy)."""

_F = FieldDescriptor
INT_RANGES: dict[int, tuple[int, int]] = {
    _F.TYPE_INT32: (-(2**31), 2**31 - 1),
    _F.TYPE_SINT32: (-(2**31), 2**31 - 1),
    _F.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    _F.TYPE_INT64: (-(2**63), 2**63 - 1),
    _F.TYPE_SINT64: (-(2**63), 2**63 - 1),
    _F.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    _F.TYPE_UINT32: (0, 2**32 - 1),
    _F.TYPE_FIXED32: (0, 2**32 - 1),
    _F.TYPE_UINT64: (0, 2**64 - 1),
    _F.TYPE_FIXED64: (0, 2**64 - 1),
}
BOUNDARY_INTS = (0, 1, -1, 2**31 - 1, 2**31, 2**32 - 1, 2**53 + 1, 2**63 - 1, 2**64 - 1, -(2**63))
TIMESTAMP_SECONDS = (
    0, -1, 1, 1_700_000_000, 2**31, 2**40, 2**62, 2**63 - 1, -(2**63),
    -62_135_596_800, 253_402_300_799, 253_402_300_800,
)  # fmt: skip
"""Inside and outside RFC 3339's 0001..9999 range, and int64's own ends."""
NANOS = (0, 1, 999_999_999, 1_000_000_000, -1, 2**31 - 1)

SPECIAL_STRINGS = (
    "", " ", "\x00", "a\x00b", "é", "😀", "\u202e", "\ufeff", "..", "../../etc/passwd", "/",
    "%00", "'; DROP TABLE messages; --", "null", "{}", "[]", "application/json", "text/plain",
    "builtin://rules", "repo:app", "DATA", "CONTROL", "*", "\r\n", "x" * 300, "é" * 200,
    "x" * HUGE, str(uuid.UUID(int=0)), "00000000-0000-4000-8000-000000000000",
    "9" * 30, "-1", "18446744073709551616",
    *KNOWN_AGENTS,
)  # fmt: skip
SPECIAL_BYTES = (
    b"", b"{}", b"null", b'{"to": "fuzz-peer"}', b'{"text": "hi"}', b"\x00" * 8, b"\xff\xfe\xfd",
    b"[" * 5000 + b"]" * 5000, b'{"a": ' + b"9" * 5000 + b"}", b'{"a": 1e999}', b"x" * HUGE,
    b'{"a": "\\ud800"}', b'{"a": NaN}',
)  # fmt: skip


def strings() -> st.SearchStrategy[str]:
    """Text a client might send: boundaries, known ids, and anything Hypothesis likes."""
    return st.one_of(
        st.sampled_from(SPECIAL_STRINGS),
        st.text(max_size=24),
        st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=8).map(
            lambda s: s * 40
        ),
    )


def binaries() -> st.SearchStrategy[bytes]:
    return st.one_of(st.sampled_from(SPECIAL_BYTES), st.binary(max_size=64))


def integers(field_type: int) -> st.SearchStrategy[int]:
    low, high = INT_RANGES[field_type]
    edges = [v for v in BOUNDARY_INTS if low <= v <= high] + [low, high]
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


def enum_numbers(field: FieldDescriptor) -> st.SearchStrategy[int]:
    """Every number the enum defines, and numbers it does not (proto3 enums are open)."""
    assert field.enum_type is not None
    known = [v.number for v in field.enum_type.values]
    return st.sampled_from([*known, *known, max(known) + 1, -1, 999, 2**31 - 1, -(2**31)])


# ------------------------------------------------------------------------------ protobuf


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind == _F.TYPE_STRING:
        return strings()
    if kind == _F.TYPE_BYTES:
        return binaries()
    if kind == _F.TYPE_BOOL:
        return st.booleans()
    if kind == _F.TYPE_ENUM:
        return enum_numbers(field)
    if kind in (_F.TYPE_DOUBLE, _F.TYPE_FLOAT):
        return st.one_of(
            st.sampled_from([0.0, -1.0, 1e308, float("inf"), float("nan")]),
            st.floats(width=32 if kind == _F.TYPE_FLOAT else 64),
        )
    return integers(kind)


def _timestamp(descriptor: Descriptor) -> st.SearchStrategy[Message]:
    cls = _message_class(descriptor)
    return st.builds(
        lambda s, n: cls(seconds=s, nanos=n),
        st.sampled_from(TIMESTAMP_SECONDS),
        st.sampled_from(NANOS),
    )


def _descriptor(method: RpcMethod) -> Descriptor:
    return cast(Descriptor, method.request_type.DESCRIPTOR)


def _message_class(descriptor: Descriptor) -> type[Message]:
    return message_factory.GetMessageClass(descriptor)


def _field_values(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    fixed = FIXED_FIELDS.get(field.full_name)
    if fixed is not None:
        return fixed
    if field.message_type is not None:
        if field.message_type.GetOptions().map_entry:
            key = _field_values(field.message_type.fields_by_name["key"], depth)
            value = _field_values(field.message_type.fields_by_name["value"], depth)
            return st.dictionaries(key, value, max_size=3)
        item = messages(field.message_type, depth + 1)
    else:
        item = _scalar(field)
    if field.is_repeated:
        return st.lists(item, max_size=3)
    return item


_MESSAGES: dict[tuple[str, int], st.SearchStrategy[Message]] = {}


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of `descriptor`: any subset of its fields set, each from its type's values."""
    key = (descriptor.full_name, depth)
    cached = _MESSAGES.get(key)
    if cached is not None:
        return cached
    cls = _message_class(descriptor)
    if descriptor.full_name in ("google.protobuf.Timestamp", "google.protobuf.Duration"):
        strategy = _timestamp(descriptor)
    elif depth >= MAX_DEPTH:
        strategy = st.just(cls())
    else:
        fields = {f.name: _field_values(f, depth) for f in descriptor.fields}
        strategy = st.fixed_dictionaries({}, optional=fields).map(lambda v: _build(cls, v))
    _MESSAGES[key] = strategy
    return strategy


def _build(cls: type[Message], values: dict[str, Any]) -> Message:
    message = cls()
    for name, value in values.items():
        field = message.DESCRIPTOR.fields_by_name[name]
        target = getattr(message, name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            if field.message_type.fields_by_name["value"].message_type is not None:
                for key, item in value.items():
                    target[key].CopyFrom(item)
            else:
                target.update(value)
        elif field.is_repeated:
            target.extend(value)
        elif field.message_type is not None:
            target.CopyFrom(value)
        else:
            setattr(message, name, value)
    return message


def request_messages(method: RpcMethod) -> st.SearchStrategy[Message]:
    return messages(_descriptor(method))


def encodings(method: RpcMethod) -> st.SearchStrategy[bytes]:
    """What a client sends on the wire: valid encodings, valid ones cut or with a byte
    changed, and random bytes."""
    valid = request_messages(method).map(lambda m: m.SerializeToString())
    return st.one_of(
        valid,
        st.tuples(valid, st.integers(0, 64)).map(lambda v: v[0][: max(0, len(v[0]) - v[1])]),
        st.tuples(valid, st.integers(0, 2**16), st.integers(0, 255)).map(_flip),
        st.binary(max_size=256),
    )


def _flip(value: tuple[bytes, int, int]) -> bytes:
    data, where, byte = value
    if not data:
        return bytes([byte])
    i = where % len(data)
    return data[:i] + bytes([byte]) + data[i + 1 :]


# -------------------------------------------------------------------------- proto3 JSON

JUNK: tuple[Any, ...] = (None, [], {}, True, "", "x", 1.5, -1, 2**64, "1e999", [None], {"a": 1})
TIMESTAMP_TEXT = (
    "1970-01-01T00:00:00Z", "0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999999999Z",
    "2262-04-11T23:47:16.854775807Z", "2262-04-11T23:47:17Z", "10000-01-01T00:00:00Z",
    "0000-01-01T00:00:00Z", "2024-02-30T00:00:00Z", "2024-01-01T00:00:00+14:00",
    "2024-01-01T00:00:00-99:99", "2024-01-01", "now", "",
)  # fmt: skip
DURATION_TEXT = (
    "0s", "1s", "-1s", "1.5s", "0.000000001s", "315576000000s", "315576000001s",
    "-315576000001s", "9223372036854775807s", "1e9s", "s", "1", "",
)  # fmt: skip


def _json_scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind == _F.TYPE_STRING:
        return strings()
    if kind == _F.TYPE_BYTES:
        encoded = binaries().flatmap(
            lambda b: st.sampled_from(
                [
                    base64.b64encode(b).decode(),
                    base64.urlsafe_b64encode(b).decode().rstrip("="),
                ]
            )
        )
        return st.one_of(encoded, st.sampled_from(["!!!!", "aGk=aGk=", "é", "a", "aG k=", "===="]))
    if kind == _F.TYPE_BOOL:
        return st.one_of(st.booleans(), st.sampled_from(["true", 1, "yes"]))
    if kind == _F.TYPE_ENUM:
        assert field.enum_type is not None
        names = [v.name for v in field.enum_type.values]
        return st.one_of(
            enum_numbers(field), st.sampled_from([*names, "NOPE", "", "1"]), st.just(1e999)
        )
    if kind in (_F.TYPE_DOUBLE, _F.TYPE_FLOAT):
        return st.one_of(
            st.floats(allow_nan=False, allow_infinity=False),
            st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", 1e308, "x"]),
        )
    return integers(kind).flatmap(lambda n: st.sampled_from([n, str(n), float(n)]))


def _json_field(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    fixed = FIXED_FIELDS.get(field.full_name)
    if fixed is not None:
        return fixed
    if field.message_type is not None:
        if field.message_type.GetOptions().map_entry:
            value = _json_field(field.message_type.fields_by_name["value"], depth)
            return st.dictionaries(strings(), value, max_size=3)
        item = json_documents(field.message_type, depth + 1)
    else:
        item = _json_scalar(field)
    if field.is_repeated:
        item = st.lists(item, max_size=3)
    return st.one_of(item, item, item, st.sampled_from(JUNK))


_DOCUMENTS: dict[tuple[str, int], st.SearchStrategy[Any]] = {}


def json_documents(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Any]:
    """proto3 JSON objects of `descriptor`, mostly well typed, sometimes not; keys by field
    name or JSON name, now and then one the message lacks."""
    key = (descriptor.full_name, depth)
    cached = _DOCUMENTS.get(key)
    if cached is not None:
        return cached
    if descriptor.full_name == "google.protobuf.Timestamp":
        strategy: st.SearchStrategy[Any] = st.sampled_from(TIMESTAMP_TEXT)
    elif descriptor.full_name == "google.protobuf.Duration":
        strategy = st.sampled_from(DURATION_TEXT)
    elif depth >= MAX_DEPTH:
        strategy = st.just({})
    else:
        optional: dict[str, st.SearchStrategy[Any]] = {}
        for f in descriptor.fields:
            optional[f.name] = _json_field(f, depth)
            if f.json_name != f.name:
                optional[f.json_name] = _json_field(f, depth)
        optional["no_such_field"] = st.just(1)
        strategy = st.fixed_dictionaries({}, optional=optional)
    _DOCUMENTS[key] = strategy
    return strategy


def request_documents(method: RpcMethod) -> st.SearchStrategy[Any]:
    """Gateway bodies of `method` (SendMessage's with the gateway's `recipient` field)."""
    document = json_documents(_descriptor(method))
    if method.name == "SendMessage":
        recipient = st.one_of(st.sampled_from(KNOWN_AGENTS), strings(), st.sampled_from(JUNK))
        return st.tuples(document, st.none() | recipient).map(
            lambda v: v[0] if v[1] is None else {**v[0], "recipient": v[1]}
        )
    return document
