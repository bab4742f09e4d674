"""The limits every request meets before its handler runs (`core.limits`, docs/decisions.md
"Limits"), whichever transport carried it.

`RequestChecks.check` walks a request message once, by its proto descriptor, and refuses the
first field that breaks a limit with validation_error naming its path (`entry.started_at`,
`entry_ids[3]`, `metadata['k']`):

- strings: the length limit and charset `core.limits.limit_for_field` gives the field's name
  (map keys: `name_bytes`, or `agent_id_bytes` / `id_bytes` for maps keyed by agents / nodes);
- uint64 fields: at most 2**63 - 1 (the stores keep signed 64-bit integers);
- enum fields: a value the proto defines (proto3 decodes any number);
- float and double fields: finite;
- Timestamp fields: a time a Timestamp can show, within the clock-skew window around the
  coordinator's clock (query bounds, `since` and `until`, only within the range);
- Duration fields, and integer fields named `*_ms`, `*_s` or `*_seconds`: non-negative and at
  most `max_duration_s`.

Envelopes are not walked: admission validates them with the same limits
(`core.envelope_rules`), and the router handler checks their timestamps' skew itself; a
SendStream frame is checked item by item by the router handler, which reads each item anyway.

`checked` applies the walk to every RPC method of a handler class (the call metadata the
handlers read as ids too: `sw4rm-recipient`, `sw4rm-agent-id`, `apiary-submitter`); a method marked
`checks_inside` runs the walk itself, where it answers refusals in its reply.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, TypeVar, cast

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from apiary.core.limits import (
    DEFAULT_LIMITS,
    INT64_MAX,
    TEXT,
    Limits,
    charset_of,
    check_duration,
    check_duration_parts,
    check_finite,
    check_id,
    check_int,
    check_member,
    check_string,
    check_timestamp,
    check_timestamp_parts,
    limit_for_field,
)
from apiary.errors import ValidationError
from apiary.server.context import AGENT_KEY, RECIPIENT_KEY, CallContext
from apiary.system import SystemClock

SKIPPED: Final = frozenset({"sw4rm.common.Envelope", "apiary.v1.SendFrame"})
"""Messages the walk leaves to their own checks (see the module docstring)."""
QUERY_BOUNDS: Final = frozenset({"since", "until"})
"""Timestamp fields that bound a query rather than say when something happened."""
_MAP_KEYS: Final = {"preferences": "agent_id_bytes", "nodes": "id_bytes"}
_METADATA_IDS: Final = (
    (RECIPIENT_KEY, "agent_id_bytes"),
    (AGENT_KEY, "agent_id_bytes"),
    ("apiary-submitter", "agent_id_bytes"),  # services.scheduler.SUBMITTER_METADATA
)

F = FieldDescriptor


class _Kind(Enum):
    STRING = "string"
    UINT64 = "uint64"
    ENUM = "enum"
    FLOAT = "float"
    TIMESTAMP = "timestamp"
    BOUND = "bound"
    DURATION = "duration"
    SECONDS = "seconds"
    MILLIS = "millis"
    MESSAGE = "message"
    MAP = "map"
    ANY = "any"
    """Nothing to check (bool, bytes, int32, int64, uint32 that are not durations)."""


Checker = Callable[["RequestChecks", "_Rule", Any, str], None]


@dataclass(frozen=True, slots=True)
class _Rule:
    kind: _Kind
    name: str
    repeated: bool = False
    limit: str = ""
    charset: str = ""
    enum: Mapping[int, str] | None = None
    key_limit: str = ""
    value: _Rule | None = None

    @property
    def checker(self) -> Checker:
        return _CHECKERS[self.kind]


_PLANS: dict[Descriptor, dict[FieldDescriptor, tuple[_Rule, Checker]] | None] = {}


def _rule(field: FieldDescriptor) -> _Rule:
    name, repeated = field.name, field.is_repeated
    if field.type == F.TYPE_MESSAGE:
        message = field.message_type
        assert message is not None
        if message.GetOptions().map_entry:
            key = message.fields_by_name["key"]
            key_limit = _MAP_KEYS.get(name, "name_bytes") if key.type == F.TYPE_STRING else ""
            value = _rule(message.fields_by_name["value"])
            if value.kind is _Kind.STRING:  # map values are free text
                value = _Rule(_Kind.STRING, name, limit="text_bytes", charset=TEXT)
            return _Rule(_Kind.MAP, name, key_limit=key_limit, value=value)
        kind = {
            "google.protobuf.Timestamp": _Kind.BOUND if name in QUERY_BOUNDS else _Kind.TIMESTAMP,
            "google.protobuf.Duration": _Kind.DURATION,
        }.get(message.full_name, _Kind.MESSAGE)
        return _Rule(kind, name, repeated)
    if field.type == F.TYPE_STRING:
        limit = limit_for_field(name)
        return _Rule(_Kind.STRING, name, repeated, limit, charset_of(limit))
    if field.type == F.TYPE_ENUM:
        enum = field.enum_type
        assert enum is not None
        numbers = {v.number: v.name for v in enum.values}
        return _Rule(_Kind.ENUM, name, repeated, enum=numbers)
    if field.type in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
        return _Rule(_Kind.FLOAT, name, repeated)
    if field.type in (F.TYPE_BOOL, F.TYPE_BYTES):
        return _Rule(_Kind.ANY, name, repeated)
    if name.endswith("_ms"):
        return _Rule(_Kind.MILLIS, name, repeated)
    if name.endswith(("_s", "_seconds")):
        return _Rule(_Kind.SECONDS, name, repeated)
    if field.type in (F.TYPE_UINT64, F.TYPE_FIXED64):
        return _Rule(_Kind.UINT64, name, repeated)
    return _Rule(_Kind.ANY, name, repeated)


def _plan(descriptor: Descriptor) -> dict[FieldDescriptor, tuple[_Rule, Checker]] | None:
    """The rule and checker of each field of `descriptor`'s messages that has something to
    check, None for a message the walk skips (made once per message type)."""
    try:
        return _PLANS[descriptor]
    except KeyError:
        pass
    plan: dict[FieldDescriptor, tuple[_Rule, Checker]] | None = None
    if descriptor.full_name not in SKIPPED:
        # Keyed by the descriptor objects ListFields returns (one object per field).
        rules = ((field, _rule(field)) for field in descriptor.fields)
        plan = {f: (r, r.checker) for f, r in rules if r.kind is not _Kind.ANY}
    _PLANS[descriptor] = plan
    return plan


def _fits(value: str, limit: int) -> bool:
    """Whether `value` plainly passes `check_string` (printable ASCII within `limit`): the
    common case, decided without building the field's path for an error."""
    return len(value) <= limit and value.isascii() and value.isprintable()


class RequestChecks:
    """The limits of a coordinator and the clock its timestamps are compared with."""

    def __init__(
        self, limits: Limits = DEFAULT_LIMITS, now: Callable[[], float] | None = None
    ) -> None:
        self.limits = limits
        self._now = now or SystemClock().now

    def now(self) -> float:
        return self._now()

    def check(self, message: Message, prefix: str = "") -> None:
        """Refuse the first field of `message` that breaks a limit (ValidationError naming
        its path, `prefix` first)."""
        plan = _plan(cast(Descriptor, message.DESCRIPTOR))
        if not plan:
            return
        for field, value in message.ListFields():
            found = plan.get(field)
            if found is None:
                continue
            rule, checker = found
            if rule.repeated:
                self._items(rule, checker, value, prefix + rule.name)
            else:
                checker(self, rule, value, prefix + rule.name)

    def check_metadata(self, ctx: CallContext) -> None:
        """The call metadata that handlers read as ids: each printable, within its limit."""
        for key, limit in _METADATA_IDS:
            value = ctx.metadata.get(key)
            if value:
                check_id(value, key, getattr(self.limits, limit))

    def timestamp(self, seconds: float, field: str) -> float:
        """`seconds`, a time a client says something happened: within the window around the
        coordinator's clock (`core.limits.check_timestamp`)."""
        return check_timestamp(seconds, field, now=self._now(), limits=self.limits)

    def _items(self, rule: _Rule, checker: Checker, items: Any, path: str) -> None:
        """Each item of a repeated field; an error names the field (`details["field"]`, as
        for a single value) and the item (`details["index"]`, and the message)."""
        for index, item in enumerate(items):
            try:
                checker(self, rule, item, f"{path}[{index}]")
            except ValidationError as exc:
                if exc.details.get("field") == f"{path}[{index}]":
                    exc.details.update(field=path, index=str(index))
                raise

    # --- one checker per kind -----------------------------------------------------------------

    def _string(self, rule: _Rule, value: str, path: str) -> None:
        limit = getattr(self.limits, rule.limit)
        if not _fits(value, limit):
            check_string(value, path, limit, rule.charset)

    def _message(self, rule: _Rule, value: Message, path: str) -> None:
        self.check(value, path + ".")

    def _uint64(self, rule: _Rule, value: int, path: str) -> None:
        if value > INT64_MAX:
            check_int(value, path, 0, INT64_MAX)

    def _enum(self, rule: _Rule, value: int, path: str) -> None:
        assert rule.enum is not None
        if value not in rule.enum:
            check_member(value, path, rule.enum)

    def _float(self, rule: _Rule, value: float, path: str) -> None:
        check_finite(value, path)

    def _bound(self, rule: _Rule, value: Any, path: str) -> None:
        check_timestamp_parts(value.seconds, value.nanos, path)

    def _timestamp(self, rule: _Rule, value: Any, path: str) -> None:
        check_timestamp_parts(value.seconds, value.nanos, path)
        self.timestamp(value.seconds + value.nanos / 1e9, path)

    def _duration(self, rule: _Rule, value: Any, path: str) -> None:
        check_duration_parts(value.seconds, value.nanos, path, self.limits)

    def _seconds(self, rule: _Rule, value: int, path: str) -> None:
        check_duration(value, path, self.limits)

    def _millis(self, rule: _Rule, value: int, path: str) -> None:
        check_duration(value / 1000, path, self.limits)

    def _map(self, rule: _Rule, entries: Any, path: str) -> None:
        inner = rule.value
        assert inner is not None
        limits = self.limits
        key_limit = getattr(limits, rule.key_limit) if rule.key_limit else 0
        text = inner.kind is _Kind.STRING
        value_limit = getattr(limits, inner.limit) if text else 0
        checker = None if text or inner.kind is _Kind.ANY else inner.checker
        for key, item in entries.items():
            if key_limit and not _fits(key, key_limit):
                check_string(key, f"{path}[{key!r:.40}]", key_limit)
            if text:
                if not _fits(item, value_limit):
                    check_string(item, f"{path}[{key!r:.40}]", value_limit, inner.charset)
            elif checker is not None:
                checker(self, inner, item, f"{path}[{key!r:.40}]")


_CHECKERS: Final[Mapping[_Kind, Checker]] = {
    _Kind.STRING: RequestChecks._string,
    _Kind.MESSAGE: RequestChecks._message,
    _Kind.UINT64: RequestChecks._uint64,
    _Kind.ENUM: RequestChecks._enum,
    _Kind.FLOAT: RequestChecks._float,
    _Kind.TIMESTAMP: RequestChecks._timestamp,
    _Kind.BOUND: RequestChecks._bound,
    _Kind.DURATION: RequestChecks._duration,
    _Kind.SECONDS: RequestChecks._seconds,
    _Kind.MILLIS: RequestChecks._millis,
    _Kind.MAP: RequestChecks._map,
}


_H = TypeVar("_H")
_INSIDE: Final = "__checks_inside__"


def checks_inside(method: _H) -> _H:
    """Mark an RPC method of a `checked` class that runs `RequestChecks.check` itself (it
    answers refusals in its reply instead of failing the call)."""
    setattr(method, _INSIDE, True)
    return method


def checked(cls: type[_H]) -> type[_H]:
    """`cls` with every public coroutine and async-generator method (its RPC methods)
    preceded by its `_checks` (`RequestChecks`) on the request and the call metadata; a
    client-streaming method's frames are checked one by one as they come."""
    for name, method in list(vars(cls).items()):
        if name.startswith("_") or getattr(method, _INSIDE, False):
            continue
        if inspect.isasyncgenfunction(method):
            setattr(cls, name, _checked_stream(method))
        elif inspect.iscoroutinefunction(method):
            setattr(cls, name, _checked_unary(method))
    return cls


DEFAULT_CHECKS: Final = RequestChecks()
"""The default limits against the system clock: what a handler built without its
coordinator's checks applies."""


def checks_of(handler: object) -> RequestChecks:
    """The handler's RequestChecks (`_checks`; the defaults when it was built without)."""
    found = getattr(handler, "_checks", None)
    return found if isinstance(found, RequestChecks) else DEFAULT_CHECKS


def _checked_unary(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def call(self: object, request: Message, ctx: CallContext) -> Any:
        checks = checks_of(self)
        checks.check_metadata(ctx)
        checks.check(request)
        return await method(self, request, ctx)

    return call


def _checked_stream(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def stream(self: object, request: Any, ctx: CallContext) -> AsyncIterator[Any]:
        checks = checks_of(self)
        checks.check_metadata(ctx)
        if isinstance(request, Message):
            checks.check(request)
        else:
            request = _each_checked(checks, request)
        async with contextlib.aclosing(method(self, request, ctx)) as items:
            async for item in items:
                yield item

    return stream


async def _each_checked(
    checks: RequestChecks, frames: AsyncIterator[Message]
) -> AsyncIterator[Message]:
    async for frame in frames:
        checks.check(frame)
        yield frame
