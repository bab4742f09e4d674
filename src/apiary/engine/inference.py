"""The Inference Engine the Scheduler consults on scope conflicts (RFC 9.3).

`RuleInference`, the default, is the built-in rule-based engine of core/scope_overlap.py.
Any object with `check_parallelism(scope_a, scope_b) -> ParallelismVerdict` can replace it
(see engine/inference_http.py for an OpenAI-compatible endpoint). `consult` bounds a call in
time and turns any failure into None: "unavailable", which the conflict policy answers
conservatively (core/conflicts.py rule 2).
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from apiary.core.scope_overlap import ParallelismVerdict, check_parallelism


class InferenceEngine(Protocol):
    name: str

    async def check_parallelism(self, scope_a: str, scope_b: str) -> ParallelismVerdict: ...


class RuleInference:
    """The built-in engine: path/glob/resource overlap with a confidence score."""

    name = "rules"

    async def check_parallelism(self, scope_a: str, scope_b: str) -> ParallelismVerdict:
        return check_parallelism(scope_a, scope_b)


async def consult(
    engine: InferenceEngine, scope_a: str, scope_b: str, timeout_s: float
) -> tuple[ParallelismVerdict | None, str]:
    """The engine's verdict, or (None, why) when it failed or took longer than `timeout_s`."""
    try:
        verdict = await asyncio.wait_for(engine.check_parallelism(scope_a, scope_b), timeout_s)
    except TimeoutError:
        return None, f"inference engine {engine.name} timed out after {timeout_s:g} s"
    except Exception as exc:  # any failure of a pluggable engine means "unavailable"
        return None, f"inference engine {engine.name} failed: {exc}"
    if not 0.0 <= verdict.confidence_score <= 1.0:
        return None, f"inference engine {engine.name} answered {verdict.confidence_score}"
    return verdict, ""
