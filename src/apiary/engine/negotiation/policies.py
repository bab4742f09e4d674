"""The Scheduler's negotiation policy book (RFC 17.2): the base policy, the policy profiles,
the guardrails, and which policy an Open gets. It is the source of truth; both survive a
restart (the `negotiations` store keeps them, each change with its event).

Profiles: one per debate intensity (LOWEST..HIGHEST, the base policy scaled by
core/negotiation/policy.py INTENSITY_SCALES) unless SetPolicyProfiles gave one of that
name, plus every profile SetPolicyProfiles gave. An Open takes the profile named by its
hint, else the one named by its intensity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

from apiary.core.clock import Clock
from apiary.core.negotiation.policy import (
    Guardrails,
    Intensity,
    NegotiationPolicy,
    intensity_policy,
)
from apiary.core.negotiation.vocabulary import DeadlockRule
from apiary.engine.eventlog import EventRecorder
from apiary.errors import NotFoundError, ValidationError
from apiary.store.protocols import NegotiationStore


@dataclass(frozen=True, slots=True)
class NegotiationSettings:
    """`[negotiation]`: guardrails, the default base policy and deadlock handling."""

    guardrails: Guardrails = field(default_factory=Guardrails)
    base_policy: NegotiationPolicy = field(default_factory=NegotiationPolicy)
    """The base policy until SetNegotiationPolicy replaces it."""
    deadlock: DeadlockRule = DeadlockRule.ESCALATE
    hitl_timeout_s: float = 0.0
    """Decision window of the negotiation's HITL invocations; 0 = the HITL default."""
    inference_timeout_s: float = 5.0
    """Bound on one Inference Engine consultation (llm confidence)."""
    shorten_without_inference: bool = True
    """RFC 20: when the Inference Engine is unreachable, shorten the debate to the next
    round (a negotiation whose policy blends llm confidence)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "deadlock", _deadlock(self.deadlock))
        why = self.guardrails.violation(self.base_policy, "negotiation.base_policy")
        if why:
            raise ValidationError(why, {"field": "negotiation.base_policy"})
        for name in ("hitl_timeout_s", "inference_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValidationError.for_field(f"negotiation.{name}", "must be >= 0 seconds")


def _deadlock(value: object) -> DeadlockRule:
    try:
        return DeadlockRule(str(value).lower())
    except ValueError:
        names = ", ".join(r.value for r in DeadlockRule)
        raise ValidationError.for_field(
            "negotiation.deadlock", f"must be one of {names}, got {value!r}"
        ) from None


class PolicyBook:
    def __init__(
        self, store: NegotiationStore, events: EventRecorder, clock: Clock,
        settings: NegotiationSettings,
    ) -> None:  # fmt: skip
        self.settings = settings
        self._store = store
        self._events = events
        self._clock = clock
        self._base = settings.base_policy
        self._profiles: dict[str, NegotiationPolicy] = {}

    @property
    def guardrails(self) -> Guardrails:
        return self.settings.guardrails

    @property
    def base(self) -> NegotiationPolicy:
        return self._base

    async def load(self) -> None:
        """Read the base policy and profiles a previous run set."""
        stored = await self._store.policies()
        base = stored.pop("", None)
        if base is not None:
            self._base = NegotiationPolicy.from_json(base)
        self._profiles = {
            n: NegotiationPolicy.from_json(p, f"profiles.{n}") for n, p in stored.items()
        }

    async def set_base(self, policy: NegotiationPolicy, by: str) -> str:
        """SetNegotiationPolicy: '' when set, else why it was refused (naming the field)."""
        why = self.guardrails.violation(policy)
        if why:
            return why
        event = self._events.draft("negotiation.policy_set", by, policy=policy.to_json())
        await self._events.commit(
            [event], partial(self._store.put_policy, "", policy.to_json(), self._clock.now())
        )
        self._base = policy
        return ""

    async def set_profiles(self, profiles: Sequence[tuple[str, NegotiationPolicy]], by: str) -> str:
        """SetPolicyProfiles: the given profiles become the whole set of named profiles."""
        found: dict[str, NegotiationPolicy] = {}
        for index, (name, policy) in enumerate(profiles):
            if not name.strip():
                return f"profiles[{index}].name: is required"
            if name in found:
                return f"profiles[{index}].name: {name!r} is given twice"
            why = self.guardrails.violation(policy, f"profiles[{index}].policy")
            if why:
                return why
            found[name] = policy
        event = self._events.draft("negotiation.profiles_set", by, profiles=sorted(found))
        stored = {n: p.to_json() for n, p in found.items()}
        await self._events.commit(
            [event], partial(self._store.replace_profiles, stored, self._clock.now())
        )
        self._profiles = found
        return ""

    def profiles(self) -> list[tuple[str, NegotiationPolicy]]:
        """Every profile: the intensities first (in order), then the others by name."""
        listed = [(i.value, self.for_intensity(i)) for i in Intensity]
        others = sorted((n, p) for n, p in self._profiles.items() if n not in Intensity.__members__)
        return listed + others

    def for_intensity(self, intensity: Intensity) -> NegotiationPolicy:
        return self._profiles.get(intensity.value) or intensity_policy(
            self._base, intensity, self.guardrails
        )

    def resolve(self, hint: str, intensity: Intensity) -> tuple[str, NegotiationPolicy]:
        """The profile an Open gets: the hint's (NotFoundError naming it when unknown), else
        the intensity's."""
        if not hint:
            return intensity.value, self.for_intensity(intensity)
        if hint in Intensity.__members__:
            return hint, self.for_intensity(Intensity(hint))
        found = self._profiles.get(hint)
        if found is None:
            known = ", ".join(n for n, _ in self.profiles())
            raise NotFoundError(
                f"profile: no policy profile {hint!r} (known: {known})",
                {"field": "profile", "profile": hint},
            )
        return hint, found
