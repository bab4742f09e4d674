"""Admission rules for one Envelope: the message-types "Validation Rules", RFC 5.4, 11 and 12.

`validate_envelope` checks, in this order, and raises at the first failure:

1. required fields (rule 1): message_id (UUIDv4), producer_id, correlation_id, message_type
   (not MESSAGE_TYPE_UNSPECIFIED); sequence_number and retry_count are proto3 scalars, so 0
   is indistinguishable from "unset" and is accepted, only their unsigned ranges are checked;
   every id (producer_id, correlation_id, idempotency_token, repo_id, worktree_id,
   hlc_timestamp) is printable text within its length limit (`core.limits`, `[limits]`);
2. payload metadata (rule 2): a present payload needs content_type and content_length;
3. content_type syntax (RFC 12 "standard MIME type conventions"): `type/subtype`, no
   wildcards, and a declared charset must be UTF-8 (rule 8); printable, within its limit;
4. size (RFC 5.4): a declared content_length or an actual payload over the per-type limit is
   `oversize_payload`; the declared length is looked at first, because declaring it exists
   so that a receiver can refuse before reading;
5. consistency (rule 4, RFC 5.4): content_length == len(payload);
6. TTL (RFC 11): an expired message is `ttl_expired`; ttl_ms is at most the longest
   duration the limits allow, and the timestamp a time a Timestamp can show (up to the end
   of year 9999: a later one could not be shown to the recipient again);
7. HLC (RFC 11): when HLC is enabled, hlc_timestamp must be present and parse;
8. type safety (rules 5 and 8), last because it is the only check that reads the payload;
   JSON is read by `core.json_reader` within the depth limit.

Every error names the offending field in `details["field"]`.

The timestamp's distance from the coordinator's clock is the service edge's check
(`core.limits.check_timestamp`): an envelope the coordinator forwards or requeues keeps the
timestamp its producer gave it, however old.

`check_modality` is the separate RFC 12 check against the target agent's declared modalities:
it needs the recipient, which envelope validation does not know.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache
from typing import Final, NoReturn

from apiary.core.envelope import Envelope, MessageType
from apiary.core.envelope_ids import UINT32_MAX, UINT64_MAX, EnvelopeIds, validate_ids
from apiary.core.hlc import parse_hlc
from apiary.core.ids import is_uuid4
from apiary.core.json_reader import DEFAULT_DEPTH, JsonError, parse_json, plainly_json
from apiary.core.limits import (
    DEFAULT_LIMITS,
    TIMESTAMP_MAX_S,
    Limits,
    check_id,
    check_timestamp_range,
)
from apiary.errors import (
    OversizePayloadError,
    TtlExpiredError,
    UnsupportedMessageTypeError,
    ValidationError,
)

KIB: Final = 1024
MIB: Final = 1024 * KIB
MAX_PAYLOAD_LIMIT: Final = 2**31 - 1
"""The largest configurable limit: protobuf cannot encode a message of 2 GiB or more."""

IMPLICIT_MODALITIES: Final = ("application/json", "application/protobuf")
"""What an agent that declared no modalities accepts: the two content types RFC 12 makes
every implementation support (MUST), and nothing it leaves optional."""

UTF8_CHARSETS: Final = frozenset({"utf-8", "utf8", "us-ascii", "ascii"})
"""Declared charsets a UTF-8 payload satisfies (ASCII is a subset of UTF-8)."""

# RFC 6838 section 4.2 restricted-name, matched on the lower-cased text.
_NAME: Final = r"[a-z0-9][a-z0-9!#$&^_.+-]{0,126}"
_MEDIA_TYPE: Final = re.compile(rf"({_NAME})/({_NAME})")
_MEDIA_RANGE: Final = re.compile(rf"(\*/\*|{_NAME}/\*|{_NAME}/{_NAME})")
_TEXTUAL_APPLICATION: Final = frozenset(
    {
        "application/xml",
        "application/yaml",
        "application/x-yaml",
        "application/ndjson",
        "application/x-ndjson",
        "application/javascript",
    }
)


@dataclass(frozen=True, slots=True)
class PayloadLimits:
    """Maximum payload size in bytes per message type (RFC 5.4: configurable, enforced).

    The defaults are the message-types size table (KB read as KiB). For the types the table
    does not list, Apiary decides:

    - HEARTBEAT 4 KiB: a heartbeat carries a small health map, like an acknowledgement;
    - WORKTREE_CONTROL 64 KiB: bind/unbind commands, the same class of payload as CONTROL;
    - NEGOTIATION 1 MiB: proposals and critiques carry artifacts, sized like a TOOL_CALL;
    - TOOL_RESULT 16 MiB: results are data and may be as large as DATA;
    - TOOL_ERROR 64 KiB: an error report, sized like CONTROL.

    Each value is in [1, MAX_PAYLOAD_LIMIT]; anything else raises ValidationError.
    """

    control: int = 64 * KIB
    data: int = 16 * MIB
    heartbeat: int = 4 * KIB
    notification: int = 32 * KIB
    acknowledgement: int = 4 * KIB
    hitl_invocation: int = 256 * KIB
    worktree_control: int = 64 * KIB
    negotiation: int = 1 * MIB
    tool_call: int = 1 * MIB
    tool_result: int = 16 * MIB
    tool_error: int = 64 * KIB

    def __post_init__(self) -> None:
        for f in fields(self):
            _check_limit(f.name.upper(), getattr(self, f.name))

    def limit_for(self, message_type: MessageType) -> int:
        """The limit of `message_type`; UNSPECIFIED raises ValueError (it has no payload)."""
        if message_type is MessageType.MESSAGE_TYPE_UNSPECIFIED:
            raise ValueError("MESSAGE_TYPE_UNSPECIFIED has no payload limit")
        limit: int = getattr(self, _LIMIT_FIELD[message_type])
        return limit

    def with_overrides(self, overrides: Mapping[str, int]) -> PayloadLimits:
        """A copy with some limits replaced, from a {message type name: bytes} mapping.

        Names are matched case-insensitively ("data", "DATA"); an unknown name, the
        UNSPECIFIED type, or a value that is not an integer in [1, MAX_PAYLOAD_LIMIT] raises
        ValidationError naming `payload_limits.<NAME>`.
        """
        changes: dict[str, int] = {}
        for raw_name, value in overrides.items():
            name = str(raw_name).strip().upper()
            member = MessageType.__members__.get(name)
            if member is None or member is MessageType.MESSAGE_TYPE_UNSPECIFIED:
                raise ValidationError.for_field(
                    f"payload_limits.{raw_name}", "is not a message type that carries a payload"
                )
            _check_limit(name, value)
            changes[name.lower()] = value
        return replace(self, **changes)

    def as_dict(self) -> dict[str, int]:
        """Every limit keyed by message type name, e.g. {"CONTROL": 65536, ...}."""
        return {name.upper(): value for name, value in asdict(self).items()}


_LIMIT_FIELD: Final = {t: t.name.lower() for t in MessageType}
"""The PayloadLimits field of each message type (Enum.name is a slow property)."""


@lru_cache(maxsize=1024)
def content_type_base(ct: str) -> str:
    """The media type without parameters, lower-cased: "Text/Plain; x=1" -> "text/plain".

    Cached: every envelope asks several times, and a deployment uses a handful of types."""
    return ct.split(";", 1)[0].strip().lower()


def is_json_type(content_type: str) -> bool:
    """Whether `content_type` is JSON: application/json or a `+json` type (parameters and
    case ignored)."""
    return _is_json(content_type_base(content_type))


def media_type_params(ct: str) -> dict[str, str]:
    """The parameters of a content type, names lower-cased, quotes removed; junk is ignored."""
    params: dict[str, str] = {}
    for part in ct.split(";")[1:]:
        name, sep, value = part.partition("=")
        if sep and name.strip():
            params[name.strip().lower()] = value.strip().strip('"')
    return params


def is_media_range(text: str) -> bool:
    """Whether `text` (parameters ignored) is `type/subtype`, `type/*` or `*/*`."""
    return _MEDIA_RANGE.fullmatch(content_type_base(text)) is not None


def ttl_deadline(env: Envelope, *, received_at: float = 0.0) -> float:
    """When the envelope expires: start + ttl_ms / 1000, or 0.0 when it has no deadline.

    The TTL counts from the envelope's own timestamp when the producer set it. Without one
    it counts from `received_at` (the admission time) when the caller gives it; with neither
    there is no start to count from and the result is 0.0 ("no deadline").
    """
    if env.ttl_ms <= 0:
        return 0.0
    start = env.timestamp if env.timestamp > 0 else received_at
    if start <= 0:
        return 0.0
    return start + env.ttl_ms / 1000.0


def validate_envelope(
    env: Envelope,
    *,
    limits: PayloadLimits,
    now: float,
    hlc_required: bool = False,
    strict_correlation: bool = False,
    fields: Limits = DEFAULT_LIMITS,
) -> None:
    """Admit or refuse `env` by the message-types Validation Rules (see the module docstring).

    Raises ValidationError (validation_error), OversizePayloadError (oversize_payload) or
    TtlExpiredError (ttl_expired), each naming the field in `details["field"]`.

    TTL: an envelope whose timestamp is unset cannot have expired at admission; the caller
    keeps `ttl_deadline(env, received_at=now)` to expire it later. HLC: an hlc_timestamp is
    only checked when HLC is enabled (`hlc_required`), because HLC is advisory (RFC 24) and a
    node that does not use it must not refuse messages over it. `now` is UTC seconds.
    correlation_id must be a UUIDv4 only with `strict_correlation` (see `validate_ids`).
    `fields` bounds the envelope's strings, its ttl_ms and the depth of a JSON payload.
    """
    if not math.isfinite(now):
        raise ValueError(f"now must be finite, got {now!r}")
    if not hlc_required and _plainly_valid(env, limits, now, strict_correlation, fields):
        return
    _check_required(env, strict_correlation, fields)
    _check_payload_metadata(env, fields)
    message_type = env.message_type
    _check_size(env, message_type, limits.limit_for(message_type))
    if env.content_length != len(env.payload):
        raise ValidationError.for_field(
            "content_length",
            f"declares {env.content_length} bytes but the payload has {len(env.payload)}",
            declared=str(env.content_length),
            actual=str(len(env.payload)),
        )
    _check_ttl(env, now, fields)
    if hlc_required:
        if not env.hlc_timestamp:
            raise ValidationError.for_field("hlc_timestamp", "is required when HLC is enabled")
        parse_hlc(env.hlc_timestamp)
    if env.payload:
        check_payload_type(env.content_type, env.payload, fields.json_depth)


def _plainly_valid(
    env: Envelope, limits: PayloadLimits, now: float, strict_correlation: bool, fields: Limits
) -> bool:
    """Whether `env` passes every check of `validate_envelope` but HLC's, decided in one
    pass for the envelopes nearly all traffic is (every admitted envelope asks, twice per
    routed message with its ACK). False sends the envelope the long way, which finds the
    first failing check and its error, or passes what this pass was not sure of."""
    payload, content_type = env.payload, env.content_type
    size = len(payload)
    message_type = env.message_type
    ttl_ms, timestamp = env.ttl_ms, env.timestamp
    if not (
        _ids_plainly_valid(env)
        and _strings_plainly_valid(env, fields)
        and (not strict_correlation or is_uuid4(env.correlation_id))
        and type(message_type) is MessageType
        and message_type is not MessageType.MESSAGE_TYPE_UNSPECIFIED
        and env.content_length == size
        and type(ttl_ms) is int
        and 0 <= ttl_ms <= fields.max_duration_ms
        and type(timestamp) is float
        and 0.0 <= timestamp <= TIMESTAMP_MAX_S
        and (ttl_ms == 0 or timestamp == 0.0 or timestamp + ttl_ms / 1000.0 > now)
    ):
        return False
    if not payload:
        return not content_type or _content_type_valid(content_type, fields.content_type_bytes)
    if not content_type or not _content_type_valid(content_type, fields.content_type_bytes):
        return False
    if size > limits.limit_for(message_type):
        return False
    if content_type_base(content_type) != "application/json":
        return False
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return plainly_json(text, fields.json_depth)


def _content_type_valid(content_type: str, limit: int) -> bool:
    """`_check_content_type` as a yes or no (a text over the limit is not looked at)."""
    if len(content_type) > limit:
        return False
    try:
        _check_content_type(content_type, limit)
    except ValidationError:
        return False
    return True


def check_payload_type(content_type: str, payload: bytes, max_depth: int = DEFAULT_DEPTH) -> None:
    """Rules 5 and 8: the payload must be valid for its declared content type.

    JSON types (application/json, */*+json) must be UTF-8 JSON text (RFC 8259), without the
    non-standard NaN/Infinity constants, nesting at most `max_depth` arrays and objects
    (`core.json_reader`); textual types (text/*, XML, YAML, NDJSON, JavaScript) must be
    UTF-8; everything else (application/protobuf, octet-stream, images, audio) is opaque
    bytes. Raises ValidationError naming `payload`.
    """
    base = content_type_base(content_type)
    if _is_json(base):
        text = _utf8(payload, base)
        try:
            parse_json(text, max_depth)
        except JsonError as exc:
            raise ValidationError.for_field(
                "payload", f"is not valid JSON for {base}: {str(exc)[:120]}"
            ) from None
    elif _is_textual(base):
        _utf8(payload, base)


def check_content(
    content_type: str, payload: bytes, fields: Limits = DEFAULT_LIMITS, name: str = "payload"
) -> None:
    """The rules `validate_envelope` holds a payload and its content type to (rules 5 and 8,
    a well-formed media type), for content that becomes an envelope's later: a task's params
    at SubmitTask, whose dispatch the router then admits without validating it again
    (engine/router/admission.py `Outbound.validated`). Raises ValidationError, naming the
    payload `name`."""
    if content_type:
        _check_content_type(content_type, fields.content_type_bytes)
    elif payload:
        raise ValidationError.for_field("content_type", f"is required when {name} is present")
    if payload:
        try:
            check_payload_type(content_type, payload, fields.json_depth)
        except ValidationError as exc:
            problem = exc.message.removeprefix("payload: ")
            raise ValidationError.for_field(name, problem) from None


def check_modality(content_type: str, modalities: Sequence[str]) -> None:
    """RFC 12: refuse a content type the target agent did not declare.

    Modalities are media ranges (`image/png`, `image/*`, `*/*`); parameters are ignored and
    matching is case-insensitive. An agent that declared none accepts IMPLICIT_MODALITIES.
    An empty `content_type` (a message without payload) carries nothing to check and passes.

    Raises UnsupportedMessageTypeError (unsupported_message_type), naming `content_type`: the
    message itself is well formed, so validation_error would tell the sender to fix it, while
    this code is the one RFC 11 lists for "not supported by the target" and maps to HTTP 415
    Unsupported Media Type. A malformed `content_type` is a ValidationError.

    ACKNOWLEDGEMENT envelopes must be exempted by the caller: the coordinator has to be able
    to NACK any agent, whatever it declared.
    """
    if content_type and not _modality_supported(content_type, tuple(modalities)):
        base = content_type_base(content_type)
        declared = tuple(modalities) or IMPLICIT_MODALITIES
        raise UnsupportedMessageTypeError(
            f"content_type: {base} is not among the target agent's modalities",
            {"field": "content_type", "content_type": base, "modalities": ", ".join(declared)},
        )


@lru_cache(maxsize=1024)
def _modality_supported(content_type: str, modalities: tuple[str, ...]) -> bool:
    """Whether the declared modalities cover `content_type` (raises for a malformed one).

    Cached: the answer depends on the two strings only, and every message asks it again for
    the same few pairs."""
    base = content_type_base(content_type)
    if not base:
        return True
    if _MEDIA_TYPE.fullmatch(base) is None:
        _bad_content_type(content_type)
    declared = modalities or IMPLICIT_MODALITIES
    return any(_covers(content_type_base(m), base) for m in declared)


# --- the checks, in order ---------------------------------------------------------------------


def _check_required(env: Envelope, strict_correlation: bool, fields: Limits) -> None:
    _check_ids(env, strict_correlation)
    check_id(env.producer_id, "producer_id", fields.producer_id_bytes)
    check_id(env.correlation_id, "correlation_id", fields.correlation_id_bytes)
    check_id(env.idempotency_token, "idempotency_token", fields.idempotency_token_bytes)
    check_id(env.repo_id, "repo_id", fields.repo_id_bytes)
    check_id(env.worktree_id, "worktree_id", fields.worktree_id_bytes)
    check_id(env.hlc_timestamp, "hlc_timestamp", fields.hlc_bytes)
    if not isinstance(env.message_type, MessageType):
        raise ValidationError.for_field(
            "message_type", f"{env.message_type!r} is not a SW4RM message type"
        )
    if env.message_type is MessageType.MESSAGE_TYPE_UNSPECIFIED:
        raise ValidationError.for_field("message_type", "is required")


def _ids_plainly_valid(env: Envelope) -> bool:
    """The checks of `validate_ids` for an envelope that passes them all, without building
    its EnvelopeIds (every admitted envelope asks); False sends it the long way, which
    finds the first failing field."""
    sequence, retries = env.sequence_number, env.retry_count
    return (
        type(sequence) is int
        and type(retries) is int
        and 0 <= sequence <= UINT64_MAX
        and 0 <= retries <= UINT32_MAX
        and bool(env.producer_id)
        and bool(env.correlation_id)
        and is_uuid4(env.message_id)
    )


def _strings_plainly_valid(env: Envelope, fields: Limits) -> bool:
    """The length and charset checks of the envelope's ids for one that passes them all
    (printable ASCII within its limits), in one pass over them; False sends it the long way.
    (content_type is `_content_type_valid`'s, cached.)"""
    producer, correlation = env.producer_id, env.correlation_id
    token, repo, worktree, hlc = (
        env.idempotency_token,
        env.repo_id,
        env.worktree_id,
        env.hlc_timestamp,
    )
    if not (
        len(producer) <= fields.producer_id_bytes
        and len(correlation) <= fields.correlation_id_bytes
    ):
        return False
    if not (token or repo or worktree or hlc):
        # One string: ASCII is a flag of it, printable one pass (each string alone costs a call).
        joined = producer + correlation
    elif (
        len(token) <= fields.idempotency_token_bytes
        and len(repo) <= fields.repo_id_bytes
        and len(worktree) <= fields.worktree_id_bytes
        and len(hlc) <= fields.hlc_bytes
    ):
        joined = producer + correlation + token + repo + worktree + hlc
    else:
        return False
    return joined.isascii() and joined.isprintable()


def _check_ids(env: Envelope, strict_correlation: bool) -> None:
    validate_ids(
        EnvelopeIds(
            message_id=env.message_id,
            idempotency_token=env.idempotency_token,
            correlation_id=env.correlation_id,
            producer_id=env.producer_id,
            sequence_number=env.sequence_number,
            retry_count=env.retry_count,
        ),
        strict_correlation=strict_correlation,
    )


def _check_payload_metadata(env: Envelope, fields: Limits) -> None:
    if env.payload and not env.content_type:
        raise ValidationError.for_field("content_type", "is required when a payload is present")
    if env.payload and env.content_length == 0:
        raise ValidationError.for_field("content_length", "is required when a payload is present")
    if env.content_type:
        check_id(env.content_type, "content_type", fields.content_type_bytes)
        _check_content_type(env.content_type, fields.content_type_bytes)


@lru_cache(maxsize=1024)
def _check_content_type(content_type: str, limit: int) -> None:
    """A well-formed media type of printable text within `limit` bytes, with a UTF-8
    charset if any. Cached (only successes are: an error raises): it depends on the
    strings alone, and a deployment uses a handful (callers test the length first, so the
    cache holds short strings only)."""
    check_id(content_type, "content_type", limit)
    if _MEDIA_TYPE.fullmatch(content_type_base(content_type)) is None:
        _bad_content_type(content_type)
    charset = media_type_params(content_type).get("charset")
    if charset is not None and charset.lower() not in UTF8_CHARSETS:
        raise ValidationError.for_field(
            "content_type", f"charset {charset[:40]!r} is not UTF-8; text must be UTF-8"
        )


def _check_size(env: Envelope, message_type: MessageType, limit: int) -> None:
    for field, size in (("content_length", env.content_length), ("payload", len(env.payload))):
        if size > limit:
            raise OversizePayloadError(
                f"{field}: {size} bytes exceed the {limit}-byte limit for {message_type.name}",
                {
                    "field": field,
                    "size": str(size),
                    "limit": str(limit),
                    "message_type": message_type.name,
                },
            )


def _check_ttl(env: Envelope, now: float, fields: Limits) -> None:
    if isinstance(env.ttl_ms, bool) or not isinstance(env.ttl_ms, int) or env.ttl_ms < 0:
        raise ValidationError.for_field(
            "ttl_ms", f"must be a non-negative integer, got {env.ttl_ms!r}"
        )
    if env.ttl_ms > fields.max_duration_ms:
        raise ValidationError.for_field(
            "ttl_ms",
            f"must be at most {fields.max_duration_ms} ms ([limits] max_duration_s),"
            f" got {env.ttl_ms}",
        )
    if not math.isfinite(env.timestamp) or env.timestamp < 0:
        raise ValidationError.for_field(
            "timestamp", f"must be finite, non-negative seconds, got {env.timestamp!r}"
        )
    check_timestamp_range(env.timestamp, "timestamp")
    deadline = ttl_deadline(env)
    if deadline and deadline <= now:
        raise TtlExpiredError(
            f"ttl_ms: the message expired {now - deadline:.3f} s before admission",
            {"field": "ttl_ms", "ttl_ms": str(env.ttl_ms), "deadline": repr(deadline)},
        )


# --- helpers ----------------------------------------------------------------------------------


def _is_json(base: str) -> bool:
    return base == "application/json" or base.endswith("+json")


def _is_textual(base: str) -> bool:
    return (
        base.startswith("text/") or base in _TEXTUAL_APPLICATION or base.endswith(("+xml", "+yaml"))
    )


def _utf8(payload: bytes, base: str) -> str:
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError.for_field(
            "payload", f"is not UTF-8 text as {base} requires (byte {exc.start})"
        ) from None


def _covers(modality: str, base: str) -> bool:
    if modality in ("*/*", "*"):
        return True
    kind, _, sub = modality.partition("/")
    return modality == base or (sub == "*" and base.startswith(kind + "/"))


def _check_limit(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError.for_field(
            f"payload_limits.{name}", f"must be an integer, got {type(value).__name__}"
        )
    if not 1 <= value <= MAX_PAYLOAD_LIMIT:
        raise ValidationError.for_field(
            f"payload_limits.{name}", f"must be in [1, {MAX_PAYLOAD_LIMIT}] bytes, got {value}"
        )


def _bad_content_type(ct: str) -> NoReturn:
    raise ValidationError.for_field(
        "content_type", f"must be a MIME type 'type/subtype', got {ct[:80]!r}"
    )
