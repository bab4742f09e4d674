"""The contract's third kind of document, a benchmark trial pack (a trial of a runtime under
a benchmark: its dataset and configuration, the runtime ids it ran as, references to its
trajectory, reward and evidence, its metrics), and `read_runtime_document`, which tells the
three kinds apart.

A trial pack is not an event (no `type`) nor a snapshot (no `threads`); its objects carry
profile-specific keys, kept as they came, so that a pack round-trips unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from apiary.core.runtime.document import Fields, JsonObject, merged, put
from apiary.core.runtime.events import RuntimeEvent
from apiary.core.runtime.snapshot import RuntimeSnapshot
from apiary.errors import ValidationError

ROLES: Final = frozenset({"baseline", "candidate", "control"})
"""`benchmark.role` (the event schema's `benchmark` object)."""
_OBJECTS: Final = (
    ("runtimeCorrelation", "runtime_correlation"),
    ("refs", "refs"),
    ("metrics", "metrics"),
    ("decisionInputs", "decision_inputs"),
    ("trajectory", "trajectory"),
    ("reward", "reward"),
)


@dataclass(frozen=True, slots=True)
class BenchmarkTrialPack:
    """One benchmark trial of a runtime (see the module docstring)."""

    schema_version: str
    benchmark: JsonObject
    runtime_correlation: JsonObject | None = None
    refs: JsonObject | None = None
    metrics: JsonObject | None = None
    decision_inputs: JsonObject | None = None
    trajectory: JsonObject | None = None
    reward: JsonObject | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, doc: object, where: str = "") -> BenchmarkTrialPack:
        f = Fields(doc, where)
        benchmark = f.obj("benchmark")
        if benchmark is None:
            raise ValidationError.for_field(f.path("benchmark"), "is required")
        role = benchmark.get("role")
        if role is not None and role not in ROLES:
            raise ValidationError.for_field(
                f.path("benchmark.role"), f"must be one of {', '.join(sorted(ROLES))}"
            )
        known: dict[str, Any] = {name: f.obj(key) for key, name in _OBJECTS}
        return cls(
            schema_version=f.required_text("schemaVersion"), benchmark=benchmark, **known,
            extra=f.rest(),
        )  # fmt: skip

    @property
    def session_id(self) -> str | None:
        """The runtime session the trial ran as, when the pack names it."""
        found = (self.runtime_correlation or {}).get("sessionId")
        return found if isinstance(found, str) else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schemaVersion": self.schema_version, "benchmark": self.benchmark}
        for key, name in _OBJECTS:
            put(out, key, getattr(self, name))
        return merged(out, self.extra)


RuntimeDocument = RuntimeEvent | RuntimeSnapshot | BenchmarkTrialPack


def read_runtime_document(doc: object) -> RuntimeDocument:
    """An event (it has `type`), a snapshot (`threads`) or a trial pack (`benchmark`)."""
    if isinstance(doc, Mapping):
        if "type" in doc:
            return RuntimeEvent.from_json(doc)
        if "threads" in doc:
            return RuntimeSnapshot.from_json(doc)
        if "benchmark" in doc:
            return BenchmarkTrialPack.from_json(doc)
    raise ValidationError.for_field(
        "document", "is neither a runtime event (type), a snapshot (threads) nor a trial pack"
    )
