"""The Inference Engine the Scheduler consults on scope conflicts (RFC 9.3).

`RuleInference`, the default, is the built-in rule-based engine of core/scope_overlap.py.
Any object with `check_parallelism(scope_a, scope_b) -> ParallelismVerdict` can replace it
(see engine/inference_http.py for an OpenAI-compatible endpoint). `consult` bounds a call in
time and turns any failure into None: "unavailable", which the conflict policy answers
conservatively (core/conflicts.py rule 2).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Final, Protocol

from apiary.core.scope_overlap import ParallelismVerdict, check_parallelism
from apiary.errors import ValidationError

INFERENCE_KINDS: Final = ("rules", "openai")


class InferenceEngine(Protocol):
    name: str

    async def check_parallelism(self, scope_a: str, scope_b: str) -> ParallelismVerdict: ...


@dataclass(frozen=True, slots=True)
class InferenceSettings:
    """Which Inference Engine the Scheduler consults (`[scheduler.inference]`).

    `kind` "rules" (the default) is the built-in RuleInference; "openai" is an
    OpenAI-compatible chat-completions endpoint (engine/inference_http.py) at `url` (the API
    base, e.g. "http://127.0.0.1:11434/v1") asking `model`. `api_key_env` names the
    environment variable holding the API key (empty: no Authorization header); the key
    itself never appears in the configuration. `timeout_s` bounds one HTTP request; the
    Scheduler's `inference_timeout_s` bounds the whole consultation, so the smaller wins.
    """

    kind: str = "rules"
    url: str = ""
    model: str = ""
    api_key_env: str = ""
    timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if self.kind not in INFERENCE_KINDS:
            raise ValidationError.for_field(
                "scheduler.inference.kind", f"must be one of {', '.join(INFERENCE_KINDS)}"
            )
        for name in ("url", "model", "api_key_env"):
            if not isinstance(getattr(self, name), str):
                raise ValidationError.for_field(f"scheduler.inference.{name}", "must be a string")
        timeout = self.timeout_s
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 < timeout < math.inf
        ):
            raise ValidationError.for_field(
                "scheduler.inference.timeout_s", "must be a positive number of seconds"
            )
        if self.kind == "openai":
            if not self.url.startswith(("http://", "https://")):
                raise ValidationError.for_field(
                    "scheduler.inference.url", "must be an http:// or https:// URL for kind openai"
                )
            if not self.model:
                raise ValidationError.for_field(
                    "scheduler.inference.model", "is required for kind openai"
                )


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
        async with asyncio.timeout(timeout_s):
            verdict = await engine.check_parallelism(scope_a, scope_b)
    except TimeoutError:
        return None, f"inference engine {engine.name} timed out after {timeout_s:g} s"
    except Exception as exc:  # any failure of a pluggable engine means "unavailable"
        return None, f"inference engine {engine.name} failed: {exc}"
    if not 0.0 <= verdict.confidence_score <= 1.0:
        return None, f"inference engine {engine.name} answered {verdict.confidence_score}"
    return verdict, ""
