"""Adaptive credit windows (RFC 13.1, the MAY: "adapt credit windows based on observed
latency"; its MUSTs: adaptations avoid oscillation and preserve safety).

One `CreditAdapter` per receiver turns the latencies of its deliveries (hand-out to terminal
acknowledgement) into a window between `min_window` and the advertised window:

- the latency is smoothed (an exponentially weighted average), so one slow delivery does not
  move the window;
- a dead band around the target holds the window while the smoothed latency is within
  `tolerance` of it, so a window that gives about the target latency stays put;
- above the band the window halves, below it the window grows by one (additive increase,
  multiplicative decrease: quick to relieve a struggling receiver, slow to load it again);
- a window found too slow becomes a ceiling: the window grows back to it only when the
  latency now measured, scaled to that window, would be within the band (the receiver got
  faster). Without it, a receiver whose band falls between two windows (one too fast, the
  next too slow) would make the window swing between them for ever;
- after a change the average starts afresh and the adapter waits for as many observations
  as the new window holds (at least `SETTLE_MIN`) before judging again, so that it judges
  the new window's latency, not the old one's.

Together these avoid oscillation: with a receiver whose latency does not change, the window
moves into the band (or as close to it as whole windows allow) and then stays; every
decrease lowers the ceiling and increases stop below it, so it cannot cycle
(tests/unit/test_credit_adaptation.py checks this for any such receiver, and with noise).
Safety is kept by bounds: the window never leaves [min_window, advertised window],
`min_window` is at least 1 so a receiver is never starved, and shrinking revokes nothing:
`CreditLedger.resize` only stops new grants until the credits in flight drop below the new
window.

Pure: no clock (latencies are given), no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from apiary.errors import ValidationError


@dataclass(frozen=True, slots=True)
class AdaptivePolicy:
    """How a receiver's window follows its latency."""

    target_latency_s: float = 1.0
    """The delivery latency (hand-out to terminal ACK) the window aims for."""
    min_window: int = 1
    tolerance: float = 0.25
    """Half the dead band, as a fraction of the target: hold within target * (1 +/- it)."""
    smoothing: float = 0.2
    """Weight of a new latency in the smoothed average (0 < smoothing <= 1)."""

    def __post_init__(self) -> None:
        if not self.target_latency_s > 0:
            raise ValidationError.for_field(
                "credit_target_latency_s", f"must be above 0, got {self.target_latency_s!r}"
            )
        if isinstance(self.min_window, bool) or self.min_window < 1:
            raise ValidationError.for_field(
                "credit_min_window", f"must be an integer >= 1, got {self.min_window!r}"
            )
        if not 0 < self.tolerance < 1:
            raise ValidationError.for_field(
                "tolerance", f"must be between 0 and 1, got {self.tolerance!r}"
            )
        if not 0 < self.smoothing <= 1:
            raise ValidationError.for_field(
                "smoothing", f"must be in (0, 1], got {self.smoothing!r}"
            )


@dataclass(frozen=True, slots=True)
class WindowChange:
    """A change `observe` decided: the window before and after, and why."""

    before: int
    after: int
    smoothed_latency_s: float
    reason: str
    """"latency_high" (halved) or "latency_low" (grown by one)."""


SETTLE_MIN = 4
"""Observations after a change before the next judgement, however small the window."""


class CreditAdapter:
    """The adaptive window of one receiver (see the module's docstring)."""

    def __init__(self, max_window: int, policy: AdaptivePolicy) -> None:
        if isinstance(max_window, bool) or max_window < policy.min_window:
            raise ValidationError.for_field(
                "credit_window",
                f"must be at least credit_min_window ({policy.min_window}), got {max_window!r}",
            )
        self._policy = policy
        self._max = max_window
        self._window = max_window
        self._ceiling = max_window + 1
        """The smallest window found too slow (above max: none yet)."""
        self._smoothed: float | None = None
        self._settling = 0
        """Observations still to come before the window may change again."""

    @property
    def window(self) -> int:
        return self._window

    @property
    def smoothed_latency_s(self) -> float | None:
        return self._smoothed

    def observe(self, latency_s: float) -> WindowChange | None:
        """Account one delivery's latency; the change of window it causes, if any."""
        latency = max(float(latency_s), 0.0)
        policy = self._policy
        smoothed = self._smoothed
        smoothed = (
            latency if smoothed is None else smoothed + policy.smoothing * (latency - smoothed)
        )
        self._smoothed = smoothed
        if self._settling > 0:
            self._settling -= 1
            return None
        before = self._window
        high = policy.target_latency_s * (1 + policy.tolerance)
        if smoothed > high:
            self._ceiling = min(self._ceiling, before)
            after, reason = max(policy.min_window, before // 2), "latency_high"
        elif smoothed < policy.target_latency_s * (1 - policy.tolerance):
            after, reason = min(self._max, before + 1), "latency_low"
            if after >= self._ceiling:
                if smoothed * self._ceiling / before > high:
                    return None  # the ceiling would still be too slow
                self._ceiling = self._max + 1
        else:
            return None
        if after == before:
            return None
        self._window = after
        self._smoothed = None
        self._settling = max(after, SETTLE_MIN)
        return WindowChange(before, after, smoothed, reason)
