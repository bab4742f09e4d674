"""The Inference Engine's confidence in a draft (RFC 17.3: optional, blended per llm_weight;
Appendix D C.9: "S->>RE: evaluate(A,B) ... {confidence_score: 0.71}").

`DebateInference` is what the negotiation engine consults with the previous and the new
draft. `RuleDebateInference`, the default, is deterministic: its confidence that the debate
converges is the structural agreement of the two drafts (1 - the delta magnitude). An
OpenAI-compatible engine, or any object with the same method, can replace it. `consult`
bounds the call in time and turns every failure into None ("unavailable").
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from apiary.core.negotiation.delta import diff


@dataclass(frozen=True, slots=True)
class DebateVerdict:
    confidence_score: float
    notes: str = ""


class DebateInference(Protocol):
    name: str

    async def evaluate_debate(
        self, negotiation_id: str, proposal_a: str, proposal_b: str, intensity: str
    ) -> DebateVerdict: ...


class RuleDebateInference:
    """Confidence from structural agreement; no model involved."""

    name = "rules"

    async def evaluate_debate(
        self, negotiation_id: str, proposal_a: str, proposal_b: str, intensity: str
    ) -> DebateVerdict:
        delta = diff("", proposal_a.encode(), "", proposal_b.encode()).summary
        confidence = round(1.0 - delta.magnitude, 6)
        changed = ", ".join(delta.changed_paths[:5]) or "nothing"
        return DebateVerdict(confidence, f"structural agreement {confidence:g}; changed: {changed}")


async def consult(
    engine: DebateInference, negotiation_id: str, a: bytes, b: bytes, intensity: str,
    timeout_s: float,
) -> tuple[DebateVerdict | None, str]:  # fmt: skip
    """The engine's verdict, or (None, why) when it failed, timed out or answered out of
    range."""
    text_a, text_b = a.decode("utf-8", "replace"), b.decode("utf-8", "replace")
    try:
        async with asyncio.timeout(timeout_s):
            verdict = await engine.evaluate_debate(negotiation_id, text_a, text_b, intensity)
    except TimeoutError:
        return None, f"inference engine {engine.name} timed out after {timeout_s:g} s"
    except Exception as exc:  # any failure of a pluggable engine means "unavailable"
        return None, f"inference engine {engine.name} failed: {exc}"
    if not 0.0 <= verdict.confidence_score <= 1.0:
        return None, f"inference engine {engine.name} answered {verdict.confidence_score}"
    return verdict, ""
