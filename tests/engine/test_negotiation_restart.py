"""Negotiations survive a coordinator restart from a SQLite file (RFC 17.2: the effective
policy persisted per room): rounds, timers, HITL waits, base policy and profiles."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from apiary.core.negotiation.policy import NegotiationPolicy
from apiary.engine.hitl import HitlSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.testing.clock import FakeClock
from apiary.testing.engine import open_test_engine
from apiary.testing.events import wait_for_event
from apiary.testing.ids import SequentialIds
from tests.engine.test_negotiations import A, B, _kinds, _open, _settings

OLIVIA = OperatorEntry("olivia", token_digest("olivia-token"), ("admin",))
HITL = HitlSettings(operators=(OLIVIA,))


@pytest.mark.conformance(
    "negotiation.policy.persist-per-room", "patterns.policy.persist-per-room",
    "negotiation.timeout.enforce",
)  # fmt: skip
async def test_a_negotiation_resumes_mid_round_after_a_restart(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'apiary.db'}"
    clock, ids = FakeClock(), SequentialIds()
    options = {"store_url": url, "clock": clock, "ids": ids, "hitl": HITL,
               "negotiation": _settings(), "data_dir": tmp_path}  # fmt: skip
    async with open_test_engine(**options) as h:  # type: ignore[arg-type]
        await h.register("frontend")
        await h.register("graphql")
        await h.engine.negotiations.policies.set_base(NegotiationPolicy(max_rounds=4), "ops")
        await h.engine.negotiations.policies.set_profiles(
            [("fast", NegotiationPolicy(max_rounds=1))], "ops"
        )
        opened = await _open(h, preferences={})
        await h.engine.negotiations.propose("neg-1", "frontend", "application/json", A)
        await h.engine.negotiations.propose("neg-1", "graphql", "application/json", B,
                                            counter=True)  # fmt: skip
        deadline = (await h.engine.negotiations.get("neg-1")).round_deadline
    async with open_test_engine(**options) as h:  # type: ignore[arg-type]
        record = await h.engine.negotiations.get("neg-1")
        assert (record.state, record.round, record.policy) == ("DELIBERATING", 2, opened.policy)
        assert [r.payload for r in await h.engine.negotiations.rounds("neg-1")] == [A, B]
        assert h.engine.negotiations.policies.base.max_rounds == 4
        assert [n for n, _ in h.engine.negotiations.policies.profiles()][-1] == "fast"
        assert h.engine.negotiations.next_deadline() == deadline
        await h.engine.negotiations.evaluate("neg-1", "frontend", 0.6)
        assert (await h.engine.negotiations.get("neg-1")).state == "AWAITING_COUNTER"
        clock.advance(61)
        assert await h.engine.negotiations.fire_due() == 1
        record = await h.engine.negotiations.get("neg-1")
        assert (record.state, record.stop_reason) == ("AWAITING_HITL", "timeout")
        invocation = record.invocation_id
    # Restarted while HITL decides: the decision still reaches the negotiation.
    async with open_test_engine(**options) as h:  # type: ignore[arg-type]
        assert (await h.engine.negotiations.get("neg-1")).invocation_id == invocation
        operator = h.engine.hitl.operators.authenticate("Bearer olivia-token")
        await h.engine.hitl.decide(invocation, "approve", operator, "B it is")
        # The decision comes through HITL in the background: its event is recorded after
        # its artifacts (the DECIDED state is stored before them).
        await wait_for_event(
            h.engine.events,
            lambda e: e.event_type == "negotiation.decided" and e.correlation_id == "neg-1",
            timeout_s=5,
        )
        decided = await h.engine.negotiations.get("neg-1")
        assert decided.state == "DECIDED"
        assert (decided.decision["version"], decided.decision["decided_by"]) == ("v2", "hitl")
        names = [a.name for a in await h.engine.negotiations.artifacts.list("neg-1")]
        assert names == ["contract_v1.json", "contract_v2.json", "diff_v1_to_v2.json",
                         "score_v2.frontend.json", "decision_final.json"]  # fmt: skip
        for _ in range(200):  # the decision fans out to each participant in turn
            if (await _kinds(h, "graphql"))[-1] == "decide":
                break
            await asyncio.sleep(0)
        assert (await _kinds(h, "graphql"))[-1] == "decide"
