"""The [negotiation] table of the configuration file."""

from __future__ import annotations

from pathlib import Path

import pytest

from apiary.core.negotiation.policy import Bounds, HitlGate
from apiary.core.negotiation.vocabulary import DeadlockRule
from apiary.errors import ValidationError
from apiary.server.config.loader import load_config


def _load(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "apiary.toml"
    path.write_text(text)
    return load_config(path, {}, {})


def test_the_negotiation_table_sets_policy_guardrails_and_deadlock_handling(
    tmp_path: Path,
) -> None:
    config = _load(tmp_path, """
[negotiation]
deadlock = "tie_break"
hitl_timeout_s = 600
[negotiation.base_policy]
max_rounds = 3
hitl = { mode = "PauseOnFinalAccept" }
scoring = { llm_weight = 0.25 }
[negotiation.guardrails]
max_rounds = [1, 10]
max_debate_timeout_s = 900
""")  # fmt: skip
    settings = config.negotiation
    assert settings.deadlock is DeadlockRule.TIE_BREAK
    assert settings.hitl_timeout_s == 600.0
    assert (settings.base_policy.max_rounds, settings.base_policy.hitl) == (
        3, HitlGate.PAUSE_ON_FINAL_ACCEPT,
    )  # fmt: skip
    assert settings.base_policy.llm_weight == 0.25
    assert settings.guardrails.max_rounds == Bounds(1, 10)
    assert settings.guardrails.max_debate_timeout_s == 900.0


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('[negotiation]\ndeadlock = "coin_flip"', "negotiation.deadlock"),
        ("[negotiation]\nrounds = 3", "negotiation.rounds"),
        ("[negotiation.base_policy]\nmax_rounds = 0", "negotiation.base_policy"),
        ("[negotiation.guardrails]\nmax_rounds = [5, 1]", "negotiation.guardrails.max_rounds"),
        ("[negotiation.base_policy]\nmax_rounds = 80", "negotiation.base_policy"),
    ],
)
def test_a_bad_negotiation_setting_is_named(tmp_path: Path, text: str, field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        _load(tmp_path, text)
    assert caught.value.details["field"] == field
    assert "apiary.toml [negotiation]" in caught.value.message
