"""The limits on what a client may send, and the pure checks that apply them.

Every id and string field of every request has a maximum length in UTF-8 bytes and a
charset; every timestamp a client sends lies within a window around the coordinator's clock;
every duration is non-negative and bounded; every integer fits the signed 64 bits the stores
keep; every float is finite; every enum value is one the proto defines. A value that breaks a
limit is refused where it enters (validation_error naming the field), so that nothing stored
can make a later read fail (docs/decisions.md, "Limits", lists every limit and its default).

`Limits` holds every limit, configured by the `[limits]` table; the `check_*` functions are
the rules, each raising `ValidationError.for_field` whose message quotes at most a short
prefix of the offending value (`quote`), so that an error about a 10 MB id is a short error.
`limit_for_field` says which limit a field of a given name has, for the request walk of the
service layer.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import Field, dataclass, field, fields
from enum import StrEnum
from typing import Final

from apiary.errors import ValidationError

KIB: Final = 1024
MIB: Final = 1024 * KIB
INT64_MAX: Final = (1 << 63) - 1
"""The largest integer the stores keep (SQLite's INTEGER and PostgreSQL's BIGINT)."""
TIMESTAMP_MAX_S: Final = 253_402_300_799
"""9999-12-31T23:59:59Z: the last second a protobuf Timestamp (and RFC 3339 text) can show."""
MAX_STRING_LIMIT: Final = 64 * MIB
"""The largest configurable length: beyond it no request fits a transport's message limit."""
QUOTE_CHARS: Final = 64
"""Characters of an offending value an error message quotes by default."""
DAY_S: Final = 86_400.0

ID: Final = "id"
"""The charset of ids and names: printable text (`str.isprintable`: no control, format,
private-use, surrogate or unassigned characters, no separator but the ASCII space)."""
TEXT: Final = "text"
"""The charset of free text and documents: anything but NUL, the C0 controls other than
tab, line feed and carriage return, DEL, and lone surrogates (none of which PostgreSQL's
TEXT and JSONB can hold or a terminal shows harmlessly)."""

_TEXT_REFUSED: Final = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


def _check_setting_int(name: str, value: object, lowest: int, highest: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError.for_field(
            f"limits.{name}", f"must be an integer, got {type(value).__name__}"
        )
    if not lowest <= value <= highest:
        raise ValidationError.for_field(
            f"limits.{name}", f"must be in [{lowest}, {highest}], got {value}"
        )


def _check_setting_seconds(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError.for_field(
            f"limits.{name}", f"must be a number of seconds, got {type(value).__name__}"
        )
    if not (math.isfinite(value) and 0 <= value <= TIMESTAMP_MAX_S):
        raise ValidationError.for_field(
            f"limits.{name}", f"must be finite seconds in [0, {TIMESTAMP_MAX_S}], got {value!r}"
        )


@dataclass(frozen=True, slots=True)
class Limits:
    """Every limit on client input, with its default (the `[limits]` table overrides any).

    String lengths are UTF-8 bytes. Ids and names are printable text (`ID`); free text and
    documents may hold line breaks and tabs (`TEXT`). Which limit a request field has is
    `limit_for_field`'s table: ids named for their kind take that kind's limit, every other
    `*_id` the generic `id_bytes`, names and enumerations `name_bytes`, JSON text and other
    structured documents `document_bytes`, and any other string `text_bytes`.
    """

    agent_id_bytes: int = 256
    """Agent ids wherever a field names an agent (agent_id, from_agent, to_agent, recipient,
    participants, critic_id, requested_by, decided_by, ...)."""
    producer_id_bytes: int = 256
    correlation_id_bytes: int = 256
    idempotency_token_bytes: int = 512
    """Longer than an id: the SHOULD format is `{producer_id}:{operation}:{hash}`."""
    task_id_bytes: int = 256
    repo_id_bytes: int = 256
    worktree_id_bytes: int = 256
    hlc_bytes: int = 128
    """HLC strings (`physical.logical.node`, RFC 11.1)."""
    id_bytes: int = 256
    """Every other id: negotiation, room, artifact, invocation, request, call, provider,
    workflow, node and session ids, message ids, commit hashes."""
    name_bytes: int = 256
    """Names, kinds, branches, states, actions, levels, event types, capabilities, roles,
    versions, and the keys of string maps."""
    content_type_bytes: int = 256
    """Media types with their parameters (RFC 6838 gives type and subtype 127 each)."""
    text_bytes: int = 16 * KIB
    """Free text: reasons, notes, rationales, descriptions, topics, commands, map values,
    and any string field no other limit names."""
    document_bytes: int = 1 * MIB
    """JSON text fields (`*_json`, workflow_data, tool schemas) and other structured text
    (task scopes, debate proposals)."""
    task_result_bytes: int = 1 * MIB
    """A task's result (`result_json`): the JSON value an agent returns for its submitter
    (a larger one fails the task with oversize_payload)."""
    watch_task_ids: int = 1000
    """Task ids one WatchTasks call may name (`task_ids`), and one FollowTasks frame
    (`task_ids`, `unfollow`): each is read and followed, so a call's work stays bounded well
    below what the message size limit lets through."""
    submit_tasks: int = 256
    """Submissions one TaskQueryService.SubmitTasks call may carry (`items`), counted before
    any is read: each is decided, and its reply sent, within the one call."""
    json_depth: int = 64
    """Nesting of arrays and objects in any JSON a client sends (payloads included)."""
    clock_skew_s: float = 3600.0
    """How far past the coordinator's clock a client's timestamp may lie (producer clocks
    run ahead; a timestamp from the future would also stretch a TTL)."""
    timestamp_age_s: float = 0.0
    """How far before the coordinator's clock a client's timestamp may lie; 0: any time
    since the epoch (an old timestamp only expires a TTL sooner)."""
    max_duration_s: float = 366 * DAY_S
    """The longest duration a client may ask for: TTLs, timeouts, budgets, grace periods."""
    quote_chars: int = QUOTE_CHARS
    """How much of an offending value an error message quotes."""
    max_duration_ms: int = field(init=False, repr=False, compare=False, default=0)
    """`max_duration_s` in whole milliseconds (every envelope's ttl_ms is compared with it)."""

    def __post_init__(self) -> None:
        for f in settings():
            value = getattr(self, f.name)
            if f.name.endswith("_s"):
                _check_setting_seconds(f.name, value)
            else:
                upper = 1024 if f.name in ("json_depth", "quote_chars") else MAX_STRING_LIMIT
                _check_setting_int(f.name, value, 8 if f.name == "quote_chars" else 1, upper)
        object.__setattr__(self, "max_duration_ms", int(self.max_duration_s * 1000))

    def as_dict(self) -> dict[str, int | float]:
        """Every limit by its `[limits]` key."""
        return {f.name: getattr(self, f.name) for f in settings()}

    def envelope_ids_bytes(self) -> int:
        """The most the strings of one envelope but its payload may take: what an envelope
        within every limit can carry besides its payload (a bound cheap to test first)."""
        return (
            self.producer_id_bytes + self.correlation_id_bytes + self.idempotency_token_bytes
            + self.repo_id_bytes + self.worktree_id_bytes + self.hlc_bytes
            + self.content_type_bytes + self.id_bytes
        )  # fmt: skip


def settings() -> tuple[Field[object], ...]:
    """The fields of `Limits` that are settings (the `[limits]` keys)."""
    return tuple(f for f in fields(Limits) if f.init)


DEFAULT_LIMITS: Final = Limits()


# --- which limit a field has --------------------------------------------------------------------

_BY_NAME: Final[Mapping[str, str]] = {
    **dict.fromkeys(
        (
            "agent_id",
            "from_agent",
            "to_agent",
            "accepting_agent",
            "critic_id",
            "requested_by",
            "decided_by",
            "recipient",
            "participants",
            "requested_critics",
        ),
        "agent_id_bytes",
    ),
    "producer_id": "producer_id_bytes",
    "correlation_id": "correlation_id_bytes",
    "idempotency_token": "idempotency_token_bytes",
    "task_id": "task_id_bytes",
    "task_ids": "task_id_bytes",
    "repo_id": "repo_id_bytes",
    "target_repo_id": "repo_id_bytes",
    "worktree_id": "worktree_id_bytes",
    "target_worktree_id": "worktree_id_bytes",
    "hlc_timestamp": "hlc_bytes",
    "hlc": "hlc_bytes",
    "content_type": "content_type_bytes",
    "artifact_content_type": "content_type_bytes",
    "commit_sha": "id_bytes",
    **dict.fromkeys(
        (
            "name",
            "kind",
            "branch",
            "state",
            "states",
            "action",
            "level",
            "event_type",
            "event_types",
            "capability",
            "capabilities",
            "capabilities_required",
            "profile",
            "tool_name",
            "version",
            "outcome",
            "reason_type",
            "suggested_action",
            "proposed_actions",
            "approver_roles",
            "error_code",
            "mode",
            "intensity",
            "backoff",
            "network_policy",
            "privilege_level",
            "side_effects",
            "modalities_supported",
            "created_at",
            "at",
            "lane",
        ),
        "name_bytes",
    ),
    **dict.fromkeys(
        (
            "workflow_data",
            "input_schema",
            "output_schema",
            "scope",
            "scope_a",
            "scope_b",
            "proposal_a",
            "proposal_b",
        ),
        "document_bytes",
    ),
    "result_json": "task_result_bytes",
}
_CHARSET: Final[Mapping[str, str]] = {
    "text_bytes": TEXT,
    "document_bytes": TEXT,
    "task_result_bytes": TEXT,
}


def limit_for_field(name: str) -> str:
    """The `Limits` attribute that bounds a string field called `name` (the last part of
    its path): the table above, else `id_bytes` for `id`, `*_id` and `*_ids`,
    `document_bytes` for `*_json`, `text_bytes` for anything else."""
    found = _BY_NAME.get(name)
    if found is not None:
        return found
    if name == "id" or name.endswith(("_id", "_ids")):
        return "id_bytes"
    if name.endswith("_json"):
        return "document_bytes"
    return "text_bytes"


def charset_of(limit: str) -> str:
    """The charset (`ID` or `TEXT`) of the strings a limit bounds."""
    return _CHARSET.get(limit, ID)


# --- the checks ---------------------------------------------------------------------------------


def quote(value: str | bytes, chars: int = QUOTE_CHARS) -> str:
    """A short, printable rendering of client input for an error message: the repr of its
    first `chars` characters, and its full size when it is longer."""
    head = value[:chars]
    if len(value) <= chars:
        return repr(head)
    unit = "bytes" if isinstance(value, bytes) else "characters"
    return f"{head!r}... ({len(value)} {unit})"


def utf8_size(value: str) -> int:
    """The UTF-8 length of `value` (its length when it is ASCII, without encoding it)."""
    if value.isascii():
        return len(value)
    return len(value.encode("utf-8", "surrogatepass"))


def check_string(value: str, field: str, limit: int, charset: str = ID) -> str:
    """`value` when it is at most `limit` UTF-8 bytes of the charset (`ID` or `TEXT`);
    ValidationError naming `field` otherwise. Returns `value`."""
    if not value:
        return value
    if len(value) > limit or utf8_size(value) > limit:
        raise ValidationError.for_field(
            field,
            f"is {utf8_size(value)} bytes, more than the {limit}-byte limit"
            f" ([limits]); it starts {quote(value)}",
            limit=str(limit),
        )
    if charset == ID:
        if not value.isprintable():
            bad = next(ch for ch in value if not ch.isprintable())
            raise ValidationError.for_field(
                field,
                f"must be printable text, but has the character U+{ord(bad):04X}: {quote(value)}",
            )
    else:
        found = _TEXT_REFUSED.search(value)
        if found is not None:
            raise ValidationError.for_field(
                field,
                f"must not contain the character U+{ord(found.group()):04X} (NUL, control "
                f"characters and lone surrogates cannot be stored): {quote(value)}",
            )
    return value


def check_id(value: str, field: str, limit: int) -> str:
    """`value`, an id of printable text of at most `limit` UTF-8 bytes; empty passes (the
    caller decides whether the id is required)."""
    return check_string(value, field, limit, ID)


def check_text(value: str, field: str, limit: int) -> str:
    """`value`, free text of at most `limit` UTF-8 bytes without NUL or control characters
    other than tab, line feed and carriage return."""
    return check_string(value, field, limit, TEXT)


def check_timestamp(
    seconds: float, field: str, *, now: float, limits: Limits = DEFAULT_LIMITS
) -> float:
    """`seconds` (UTC seconds since the epoch) when it is finite and within the window
    around `now` the limits allow: at most `clock_skew_s` ahead, at most `timestamp_age_s`
    behind (0: back to the epoch). Returns `seconds`."""
    check_timestamp_range(seconds, field)
    if seconds > now + limits.clock_skew_s:
        raise ValidationError.for_field(
            field,
            f"lies {seconds - now:.0f} s ahead of the coordinator's clock; at most"
            f" {limits.clock_skew_s:g} s of clock skew is accepted ([limits] clock_skew_s)",
        )
    if limits.timestamp_age_s and seconds < now - limits.timestamp_age_s:
        raise ValidationError.for_field(
            field,
            f"lies {now - seconds:.0f} s before the coordinator's clock; at most"
            f" {limits.timestamp_age_s:g} s is accepted ([limits] timestamp_age_s)",
        )
    return seconds


def check_timestamp_range(seconds: float, field: str) -> float:
    """`seconds` when it is a time a Timestamp can show, from the epoch to the end of year
    9999 (query bounds, which may lie anywhere in it). Returns `seconds`."""
    if not (isinstance(seconds, int | float) and 0 <= seconds <= TIMESTAMP_MAX_S):
        raise ValidationError.for_field(
            field,
            f"must be a time from 1970-01-01 to 9999-12-31 (0 to {TIMESTAMP_MAX_S} s),"
            f" got {seconds!r}",
        )
    return seconds


def check_timestamp_parts(seconds: int, nanos: int, field: str) -> None:
    """A protobuf Timestamp's parts: nanos in [0, 1e9) and seconds in the range
    `check_timestamp_range` allows."""
    if not 0 <= nanos < 1_000_000_000:
        raise ValidationError.for_field(field, f"nanos must be in [0, 999999999], got {nanos}")
    check_timestamp_range(seconds, field)


def check_duration(seconds: float, field: str, limits: Limits = DEFAULT_LIMITS) -> float:
    """`seconds` when it is a finite, non-negative duration of at most `max_duration_s`."""
    if not (isinstance(seconds, int | float) and 0 <= seconds <= limits.max_duration_s):
        raise ValidationError.for_field(
            field,
            f"must be a duration from 0 to {limits.max_duration_s:g} s"
            f" ([limits] max_duration_s), got {seconds!r}",
        )
    return seconds


def check_duration_parts(seconds: int, nanos: int, field: str, limits: Limits) -> None:
    """A protobuf Duration's parts: nanos in [0, 1e9) for a non-negative duration, and the
    whole within `check_duration`."""
    if not 0 <= nanos < 1_000_000_000:
        raise ValidationError.for_field(
            field, f"must be non-negative: nanos must be in [0, 999999999], got {nanos}"
        )
    check_duration(seconds + nanos / 1e9, field, limits)


def check_int(value: int, field: str, minimum: int = 0, maximum: int = INT64_MAX) -> int:
    """`value` when it is an integer in [minimum, maximum] (by default what the stores keep:
    an unsigned 64-bit field at or above 2**63 cannot be stored or compared in SQL)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError.for_field(field, f"must be an integer, got {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise ValidationError.for_field(field, f"must be in [{minimum}, {maximum}], got {value}")
    return value


def check_finite(value: float, field: str) -> float:
    """`value` when it is a finite number (NaN is stored as NULL by SQLite, and neither NaN
    nor infinity is JSON)."""
    if not math.isfinite(value):
        raise ValidationError.for_field(field, f"must be a finite number, got {value!r}")
    return value


def check_member(value: int, field: str, known: Mapping[int, str] | Collection[int]) -> int:
    """`value` when it is one of the enum numbers `known` (a proto3 enum decodes any number;
    only those the proto defines mean anything)."""
    if value not in known:
        if isinstance(known, Mapping):
            names = ", ".join(f"{known[n]}={n}" for n in sorted(known))
        else:
            names = ", ".join(str(n) for n in sorted(known))
        raise ValidationError.for_field(
            field, f"{value} is not one of the values the proto defines ({names})"
        )
    return value


def check_members(values: Iterable[str], kind: type[StrEnum], field: str) -> frozenset[str]:
    """`values` as a set when each names a member of `kind` (a filter's states); else a
    ValidationError naming `field`, the names there are and the first unknown one."""
    wanted = frozenset(values)
    for value in sorted(wanted):
        if value not in kind.__members__:
            names = ", ".join(kind.__members__)
            raise ValidationError.for_field(field, f"must be among {names}, not {quote(value)}")
    return wanted
