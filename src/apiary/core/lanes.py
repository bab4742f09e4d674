"""Communication-class lanes (RFC 7.3): which lane an agent's inbound queue serves next.

The scheduler is pure and deterministic: the engine tells it how many messages wait in each
lane and what time it is, and it answers which lane to take one message from.

How it decides:

- The fair share is a *wheel*: one cycle of sum(weights) slots in which each lane owns
  `weight` slots, spread out by smooth weighted round robin (for 4/2/1: P S P B P S P). The
  pointer walks the wheel; a slot whose lane has nothing ready is skipped, so no capacity is
  wasted. With one message per pick this is weighted deficit round robin with unit costs.
- PRIVILEGED is the urgent lane. It is served *next*, ahead of the wheel, when it has work, a
  token in its bucket (`privileged_rate` per second up to `privileged_burst`) and urgent
  credit. Credit starts at the burst and is earned back, one per PRIVILEGED wheel slot that
  PRIVILEGED did not use, up to the burst; a slot PRIVILEGED reaches with work and a token
  serves it urgently in place. So the urgent lane jumps the queue right away after being
  idle, but never takes more than its weight's share of picks in the long run. The two
  limits are deliberate: the token bucket bounds privileged traffic in time (the RFC's rate
  limit), the credit bounds it in picks, which is what protects STANDARD and BULK when the
  consumer is slower than the privileged rate and the bucket never runs dry. A PRIVILEGED
  message with a token but no credit waits for the lane's next wheel slot (still urgent).
- A PRIVILEGED message that cannot go urgent (no token: over the configured threshold) is
  overflow redirected to STANDARD treatment: it is served in the privileged lane's own wheel
  slots, but at most `weights["STANDARD"]` times per cycle, i.e. with exactly STANDARD's
  weight, and flagged `overflowed`. It does not take STANDARD's or BULK's slots: sharing
  STANDARD's slots would let a privileged flood halve STANDARD's throughput, which the rate
  limit exists to prevent.

Guarantee (tested, and tight): with every lane busy, each lane is served at least once in
every window of sum(weights) + privileged_burst consecutive picks, whatever the times passed
in. Why: STANDARD's and BULK's slots come round within sum(weights) slots; between them each
pick uses a wheel slot except urgent jumps, and those spend credit that only unused wheel
slots earn, from a balance of at most the burst.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from apiary.errors import ValidationError

PRIVILEGED: Final = "PRIVILEGED"
STANDARD: Final = "STANDARD"
BULK: Final = "BULK"
LANES: Final = (PRIVILEGED, STANDARD, BULK)
MAX_WEIGHT: Final = 1000
_TOKEN_EPSILON: Final = 1e-9
"""Rounding slack when comparing refilled tokens to 1: 0.05 s + 0.05 s at 10/s must make one
token, though (5.1 - 5.05) * 10 + 0.5 is 0.99999... in floating point."""
DEFAULT_WEIGHTS: Final[Mapping[str, int]] = MappingProxyType({PRIVILEGED: 4, STANDARD: 2, BULK: 1})


@dataclass(frozen=True)
class LanePolicy:
    """Lane weights and the PRIVILEGED rate limit; configurable by administrators (RFC 7.3).

    Defaults: weights 4/2/1, 100 urgent PRIVILEGED messages per second with bursts of 10.
    Weights must name exactly the three lanes with integers in [1, MAX_WEIGHT];
    `privileged_rate` must be finite and positive; `privileged_burst` an integer >= 1.
    Violations raise ValidationError naming `lanes.<field>`.
    """

    weights: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    privileged_rate: float = 100.0
    """Tokens per second refilled into the PRIVILEGED bucket."""
    privileged_burst: int = 10
    """Bucket capacity: how many urgent picks may happen back to back."""

    def __post_init__(self) -> None:
        weights = dict(self.weights)
        if set(weights) != set(LANES):
            raise ValidationError.for_field(
                "lanes.weights", f"must name exactly {', '.join(LANES)}, got {sorted(weights)}"
            )
        for lane, weight in weights.items():
            if isinstance(weight, bool) or not isinstance(weight, int):
                raise ValidationError.for_field("lanes.weights", f"{lane} must be an integer")
            if not 1 <= weight <= MAX_WEIGHT:
                raise ValidationError.for_field(
                    "lanes.weights", f"{lane} must be in [1, {MAX_WEIGHT}], got {weight}"
                )
        rate = self.privileged_rate
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate):
            raise ValidationError.for_field("lanes.privileged_rate", "must be a finite number")
        if rate <= 0:
            raise ValidationError.for_field("lanes.privileged_rate", f"must be > 0, got {rate}")
        burst = self.privileged_burst
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise ValidationError.for_field(
                "lanes.privileged_burst", f"must be an integer >= 1, got {burst!r}"
            )
        object.__setattr__(self, "weights", MappingProxyType(weights))

    @property
    def cycle(self) -> int:
        """Slots in one wheel cycle: sum(weights)."""
        return sum(self.weights.values())


@dataclass(frozen=True, slots=True)
class LaneChoice:
    """The lane to take one message from.

    `urgent`: served by the PRIVILEGED urgent lane. `overflowed`: a PRIVILEGED message over
    the rate limit, served with STANDARD's weight instead (never both).
    """

    lane: str
    urgent: bool = False
    overflowed: bool = False


_PLAIN: Final = {lane: LaneChoice(lane) for lane in LANES}
"""The choice of a lane's own slot (choices are immutable: one each will do)."""


def smooth_wheel(weights: Mapping[str, int]) -> tuple[str, ...]:
    """One cycle of smooth weighted round robin over LANES (ties go to the earlier lane).

    Each lane appears `weights[lane]` times, spread as evenly as the weights allow.
    """
    total = sum(weights[lane] for lane in LANES)
    current = dict.fromkeys(LANES, 0)
    wheel: list[str] = []
    for _ in range(total):
        for lane in LANES:
            current[lane] += weights[lane]
        best = max(LANES, key=lambda lane: current[lane])
        current[best] -= total
        wheel.append(best)
    return tuple(wheel)


class LaneScheduler:
    """Chooses the next lane to serve for one inbound queue; time is always an argument.

    Mutable, but pure: no clock, no randomness, no I/O, so the same calls give the same
    answers. The bucket starts full, and the first `pick` sets its reference time; a `now`
    earlier than the last one adds no tokens (a clock stepping back mints nothing).
    """

    def __init__(self, policy: LanePolicy | None = None) -> None:
        self._policy = policy if policy is not None else LanePolicy()
        self._wheel = smooth_wheel(self._policy.weights)
        self._position = 0
        self._overflow_used = 0
        self._overflow_quota = self._policy.weights[STANDARD]
        self._credit_cap = self._policy.privileged_burst
        self._credit = self._credit_cap
        self._tokens = float(self._policy.privileged_burst)
        self._last_refill: float | None = None

    @property
    def policy(self) -> LanePolicy:
        """The policy this scheduler was built with."""
        return self._policy

    @property
    def wheel(self) -> tuple[str, ...]:
        """The fair-share cycle the scheduler walks."""
        return self._wheel

    @property
    def tokens(self) -> float:
        """PRIVILEGED tokens left as of the last `pick` (a float: refills are continuous)."""
        return self._tokens

    @property
    def urgent_credit(self) -> int:
        """Urgent picks PRIVILEGED may still take ahead of the wheel."""
        return self._credit

    def pick(self, ready: Mapping[str, int], now: float) -> LaneChoice | None:
        """The lane to serve next, or None when no lane has anything queued.

        `ready` maps lane names to queued message counts; a missing lane counts 0. Unknown
        lanes, negative or non-integer counts and a non-finite `now` raise ValueError.
        """
        return self.pick_counted(_check_ready(ready), now)

    def pick_counted(self, queued: Mapping[str, int], now: float) -> LaneChoice | None:
        """`pick` without checking its input, for a caller that counts its own queues: every
        lane of LANES present, each count an integer >= 0 (an inbox, once per message)."""
        self._refill(now)
        if not any(queued.values()):
            return None
        privileged_ready = queued[PRIVILEGED] > 0
        if privileged_ready and self._credit >= 1 and self._has_token():
            self._credit -= 1
            return self._urgent()
        for _ in range(2 * len(self._wheel)):
            lane = self._advance()
            if lane == PRIVILEGED:
                choice = self._privileged_slot() if privileged_ready else None
                if choice is not None:
                    return choice
                # A slot PRIVILEGED could not use is owed to it as urgent credit. A slot it
                # used earns nothing: credit for it too would serve one slot twice.
                self._credit = min(self._credit + 1, self._credit_cap)
            elif queued[lane] > 0:
                return _PLAIN[lane]
        # Two cycles always reach a ready lane's slot or a fresh overflow quota.
        raise AssertionError("unreachable: the wheel has a slot for every lane")

    def pick_plain(self, lane: str, count: int, now: float) -> None:
        """`count` picks while `lane`, not PRIVILEGED, is the only lane with anything
        queued: the state that many `pick_counted` calls leave, each of which would choose
        `lane`'s own slot (an inbox takes a batch of one lane at once)."""
        if lane == PRIVILEGED or lane not in self._policy.weights:
            raise ValueError(f"pick_plain takes STANDARD or BULK, not {lane!r}")
        self._refill(now)
        wheel, size = self._wheel, len(self._wheel)
        position, credit, cap = self._position, self._credit, self._credit_cap
        while count > 0:
            if position == 0:
                self._overflow_used = 0  # a new cycle: a fresh overflow quota
            slot = wheel[position]
            position = position + 1 if position + 1 < size else 0
            if slot == lane:
                count -= 1
            elif slot == PRIVILEGED:
                credit = min(credit + 1, cap)  # an unused PRIVILEGED slot, as in pick
        self._position, self._credit = position, credit

    def _has_token(self) -> bool:
        return self._tokens >= 1 - _TOKEN_EPSILON

    def _privileged_slot(self) -> LaneChoice | None:
        if self._has_token():
            return self._urgent()
        if self._overflow_used < self._overflow_quota:
            self._overflow_used += 1
            return LaneChoice(PRIVILEGED, urgent=False, overflowed=True)
        return None

    def _urgent(self) -> LaneChoice:
        self._tokens = max(0.0, self._tokens - 1)
        return LaneChoice(PRIVILEGED, urgent=True, overflowed=False)

    def _advance(self) -> str:
        if self._position == 0:
            self._overflow_used = 0  # a new cycle: a fresh overflow quota
        lane = self._wheel[self._position]
        self._position = (self._position + 1) % len(self._wheel)
        return lane

    def _refill(self, now: float) -> None:
        if not math.isfinite(now):
            raise ValueError(f"now must be finite, got {now!r}")
        if self._last_refill is None:
            self._last_refill = now
        elif now > self._last_refill:
            elapsed = now - self._last_refill
            self._tokens = min(
                float(self._policy.privileged_burst),
                self._tokens + elapsed * self._policy.privileged_rate,
            )
            self._last_refill = now


def _check_ready(ready: Mapping[str, int]) -> dict[str, int]:
    queued = dict.fromkeys(LANES, 0)
    for lane, count in ready.items():
        if lane not in queued:
            raise ValueError(f"unknown lane {lane!r}; lanes are {', '.join(LANES)}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"queued count of {lane} must be an integer >= 0, got {count!r}")
        queued[lane] = count
    return queued
