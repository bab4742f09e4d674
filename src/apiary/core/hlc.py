"""Hybrid Logical Clocks (Kulkarni et al., 2014) for the Envelope's hlc_timestamp.

A timestamp is (wall_us, logical, node): the largest physical time seen, in microseconds; a
counter that orders events within one microsecond; and the issuing node. Timestamps order by
those three fields in that order, so every event of a causal chain sorts after its causes
even when the hosts' wall clocks disagree.

HLC is advisory (RFC 24: never the sole basis of correctness-critical ordering). Physical
time is an argument everywhere: nothing here reads a clock.

Two string forms are parsed (spec/INTEROP.md):

- `HLC:<wall_us>:<logical>:<node>`, what other SDKs put on the wire and what Apiary emits;
- `<unix_seconds>.<micro>.<node>`, the RFC's example form (section 4), read as wall time with
  microsecond precision and no logical counter, so only timestamps whose counter is 0 can be
  written in it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from apiary.errors import ValidationError

MAX_WALL_US: Final = (1 << 63) - 1
MAX_LOGICAL: Final = (1 << 32) - 1
MAX_NODE_LENGTH: Final = 255
DEFAULT_MAX_SKEW_US: Final = 5_000_000
"""How far a remote wall time may run ahead of ours. Generous because HLC is advisory: the
bound only stops one fast clock from dragging every node's timestamps into the future."""

_FIELD: Final = "hlc_timestamp"
_HLC_PREFIX: Final = "HLC:"
_US_PER_S: Final = 1_000_000
_MAX_TEXT_LENGTH: Final = 4 + 19 + 1 + 10 + 1 + MAX_NODE_LENGTH


class ClockSkewError(ValidationError):
    """A remote HLC is further ahead of local physical time than the skew bound allows.

    A ValidationError (code validation_error) so that transports answer it like any other
    bad field; its own class lets the engine tell skew from malformed input.
    """


@dataclass(frozen=True, order=True, slots=True)
class HlcTimestamp:
    """One HLC reading, ordered by (wall_us, logical, node).

    Out-of-range fields and an empty or non-printable node raise ValidationError.
    """

    wall_us: int
    logical: int
    node: str

    def __post_init__(self) -> None:
        _check_range("wall_us", self.wall_us, MAX_WALL_US)
        _check_range("logical", self.logical, MAX_LOGICAL)
        _check_node(self.node)

    def __str__(self) -> str:
        return format_hlc(self)


def zero(node: str) -> HlcTimestamp:
    """The state of a clock that has issued nothing yet."""
    return HlcTimestamp(0, 0, node)


def physical_us(seconds: float) -> int:
    """Wall seconds (e.g. `Clock.now()`) as whole microseconds, the HLC's physical unit."""
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"physical time must be finite and non-negative, got {seconds!r}")
    return math.floor(seconds * _US_PER_S)


def send(last: HlcTimestamp, physical_now_us: int) -> HlcTimestamp:
    """The timestamp of a local or send event after `last`, at physical time `physical_now_us`.

    Standard rule: wall = max(last.wall, pt); the counter resets when wall moved, else counts
    on. The result is strictly greater than `last` and belongs to `last.node`.
    """
    _check_range("physical_now_us", physical_now_us, MAX_WALL_US)
    wall = max(last.wall_us, physical_now_us)
    logical = last.logical + 1 if wall == last.wall_us else 0
    return _next(wall, logical, last.node)


def receive(
    last: HlcTimestamp,
    remote: HlcTimestamp,
    physical_now_us: int,
    max_skew_us: int = DEFAULT_MAX_SKEW_US,
) -> HlcTimestamp:
    """The timestamp of receiving `remote` after `last`, at physical time `physical_now_us`.

    Standard rule: wall = max(last.wall, remote.wall, pt); the counter continues from
    whichever of `last` and `remote` holds that wall (the larger when both), else resets.
    The result is strictly greater than both `last` and `remote`.

    Raises ClockSkewError, leaving the caller's state as it was, when `remote.wall_us` is
    more than `max_skew_us` ahead of `physical_now_us`: adopting it would push this node's
    clock, and everyone it talks to, that far into the future.
    """
    _check_range("physical_now_us", physical_now_us, MAX_WALL_US)
    _check_range("max_skew_us", max_skew_us, MAX_WALL_US)
    ahead = remote.wall_us - physical_now_us
    if ahead > max_skew_us:
        raise ClockSkewError(
            f"{_FIELD}: remote wall time is {ahead} us ahead of local physical time, "
            f"over the {max_skew_us} us skew bound",
            {"field": _FIELD, "ahead_us": str(ahead), "max_skew_us": str(max_skew_us)},
        )
    wall = max(last.wall_us, remote.wall_us, physical_now_us)
    if wall == last.wall_us == remote.wall_us:
        logical = max(last.logical, remote.logical) + 1
    elif wall == last.wall_us:
        logical = last.logical + 1
    elif wall == remote.wall_us:
        logical = remote.logical + 1
    else:
        logical = 0
    return _next(wall, logical, last.node)


class HybridLogicalClock:
    """The HLC state of one node: `send` and `receive` over the last timestamp issued.

    Holds no clock; the caller passes physical time in microseconds (see `physical_us`).
    """

    def __init__(
        self, node: str, max_skew_us: int = DEFAULT_MAX_SKEW_US, last: HlcTimestamp | None = None
    ) -> None:
        if last is not None and last.node != node:
            raise ValueError(f"last timestamp belongs to node {last.node!r}, not {node!r}")
        _check_range("max_skew_us", max_skew_us, MAX_WALL_US)
        self._last = last if last is not None else zero(node)
        self._max_skew_us = max_skew_us

    @property
    def last(self) -> HlcTimestamp:
        """The last timestamp issued (the zero timestamp before the first event)."""
        return self._last

    def send(self, physical_now_us: int) -> HlcTimestamp:
        """Timestamp a local or send event."""
        self._last = send(self._last, physical_now_us)
        return self._last

    def receive(self, remote: HlcTimestamp, physical_now_us: int) -> HlcTimestamp:
        """Timestamp the receipt of `remote`; on ClockSkewError the state is unchanged."""
        self._last = receive(self._last, remote, physical_now_us, self._max_skew_us)
        return self._last


def format_hlc(ts: HlcTimestamp) -> str:
    """The wire form `HLC:<wall_us>:<logical>:<node>`."""
    return f"{_HLC_PREFIX}{ts.wall_us}:{ts.logical}:{ts.node}"


def format_rfc(ts: HlcTimestamp) -> str:
    """The RFC example form `<unix_seconds>.<micro>.<node>` (micro zero-padded to 6 digits).

    Raises ValidationError when the logical counter is not 0: that form has no place for it,
    and dropping it would reorder events.
    """
    if ts.logical != 0:
        raise ValidationError.for_field(
            _FIELD, f"the <unix_seconds>.<micro>.<node> form cannot hold logical={ts.logical}"
        )
    seconds, micro = divmod(ts.wall_us, _US_PER_S)
    return f"{seconds}.{micro:06d}.{ts.node}"


def parse_hlc(text: str) -> HlcTimestamp:
    """Read either string form; raises ValidationError naming what is wrong.

    In both forms the node is everything after the last numeric field, so a node may itself
    contain ':' or '.'.
    """
    if len(text) > _MAX_TEXT_LENGTH:
        raise _malformed(f"longer than {_MAX_TEXT_LENGTH} characters")
    if text.startswith(_HLC_PREFIX):
        parts = text[len(_HLC_PREFIX) :].split(":", 2)
        if len(parts) != 3:
            raise _malformed("expected HLC:<wall_us>:<logical>:<node>")
        wall_us = _digits("wall_us", parts[0])
        logical = _digits("logical", parts[1])
    else:
        parts = text.split(".", 2)
        if len(parts) != 3:
            raise _malformed(
                "expected HLC:<wall_us>:<logical>:<node> or <unix_seconds>.<micro>.<node>"
            )
        if len(parts[1]) != 6:
            raise _malformed(f"micro must be exactly 6 digits, got {parts[1][:16]!r}")
        wall_us = _digits("unix_seconds", parts[0]) * _US_PER_S + _digits("micro", parts[1])
        logical = 0
    return HlcTimestamp(wall_us, logical, parts[2])


def _next(wall_us: int, logical: int, node: str) -> HlcTimestamp:
    # A counter past its bound spills into the next microsecond: still greater than every
    # input, at the cost of running 1 us ahead of physical time.
    if logical > MAX_LOGICAL:
        wall_us, logical = wall_us + 1, 0
    if wall_us > MAX_WALL_US:
        raise ValidationError.for_field(_FIELD, "wall time overflow")
    return HlcTimestamp(wall_us, logical, node)


def _digits(name: str, value: str) -> int:
    # str.isdigit alone would accept non-ASCII digits such as "٣".
    if not (value and value.isascii() and value.isdigit()):
        raise _malformed(f"{name} must be decimal digits, got {value[:24]!r}")
    return int(value)


def _check_range(name: str, value: int, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError.for_field(
            _FIELD, f"{name} must be an integer, got {type(value).__name__}"
        )
    if not 0 <= value <= maximum:
        raise ValidationError.for_field(_FIELD, f"{name} must be in [0, {maximum}], got {value}")


def _check_node(node: str) -> None:
    if not node:
        raise _malformed("node is empty")
    if len(node) > MAX_NODE_LENGTH:
        raise _malformed(f"node is longer than {MAX_NODE_LENGTH} characters")
    if not node.isprintable() or any(ch.isspace() for ch in node):
        raise _malformed(f"node must be printable without whitespace, got {node[:32]!r}")


def _malformed(problem: str) -> ValidationError:
    return ValidationError.for_field(_FIELD, problem)
