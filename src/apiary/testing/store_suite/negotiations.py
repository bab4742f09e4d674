"""Checks of the negotiation store (`NegotiationStore`) and the artifact store
(`ArtifactStore`): what the negotiation engine relies on to resume rooms after a restart
(RFC 17.2: the effective policy persisted per room; 17.4: artifacts)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from apiary.core.negotiation.records import ArtifactRecord, NegotiationRecord, RoundRecord
from apiary.testing.store_suite.base import (
    T0,
    UNICODE,
    Check,
    CheckNotApplicable,
    StoreFactory,
    registry,
)

CHECKS: list[Check] = []
_check = registry(CHECKS)

BINARY = b"\x00" + bytes(range(256)) + b"\x00 trailing\x00"
POLICY = {"max_rounds": 4, "score_threshold": 0.85, "hitl": {"mode": "PauseOnFinalAccept"}}


def negotiation(negotiation_id: str, created: float = 0.0, **fields: Any) -> NegotiationRecord:
    values: dict[str, Any] = {
        "negotiation_id": negotiation_id,
        "correlation_id": negotiation_id,
        "topic": "/api/v3/orders",
        "participants": ("frontend", "graphql"),
        "intensity": "HIGH",
        "state": "OPEN",
        "created_at": T0 + created,
        "updated_at": T0 + created,
        "deadline": T0 + created + 600,
    }
    values.update(fields)
    return NegotiationRecord(**values)


def round_record(negotiation_id: str, n: int, **fields: Any) -> RoundRecord:
    values: dict[str, Any] = {
        "negotiation_id": negotiation_id,
        "round": n,
        "kind": "propose" if n == 1 else "counter",
        "from_agent": "frontend" if n % 2 else "graphql",
        "content_type": "application/json",
        "payload": f'{{"v": {n}}}'.encode(),
        "submitted_at": T0 + n,
    }
    values.update(fields)
    return RoundRecord(**values)


def artifact(negotiation_id: str, kind: str, version: str, **fields: Any) -> ArtifactRecord:
    values: dict[str, Any] = {
        "negotiation_id": negotiation_id,
        "kind": kind,
        "version": version,
        "content_type": "application/json",
        "content": f'{{"{kind}": "{version}"}}'.encode(),
        "created_at": T0,
    }
    values.update(fields)
    return ArtifactRecord(**values)


@_check
async def negotiations_are_saved_and_read_with_every_field(factory: StoreFactory) -> None:
    full = negotiation(
        "neg-1", opened_by="scheduler", profile="HIGH",
        policy={"policy": POLICY, "applied": {"frontend": {"max_rounds": 3}}},
        validation={"schema": {"type": "object"}, "examples": [{"name": "e", "instance": 1}]},
        round=3, round_deadline=T0 + 90.5, tokens_spent=1234, oscillations=1,
        invocation_id="inv-7", stop_reason="timeout", state="AWAITING_HITL",
        decision={"decided_by": "hitl", "final_score": 0.71, "nested": [1, None, True]},
    )  # fmt: skip
    minimal = negotiation("neg-2", 1)
    async with factory.open() as store:
        assert await store.negotiations.get("neg-1") is None
        assert await store.negotiations.list() == []
        await store.negotiations.save(full)
        await store.negotiations.save(minimal)
        assert await store.negotiations.get("neg-1") == full
        assert await store.negotiations.get("neg-2") == minimal
        assert await store.negotiations.get("NEG-1") is None
        assert await store.negotiations.list() == [full, minimal]
        stored = await store.negotiations.get("neg-1")
        assert stored is not None
        assert type(stored.participants) is tuple
        assert dict(stored.policy)["policy"] == POLICY


@_check
async def negotiations_are_listed_by_state_and_creation(factory: StoreFactory) -> None:
    async with factory.open() as store:
        for i, state in enumerate(("OPEN", "DECIDED", "DELIBERATING", "ABORTED", "OPEN")):
            await store.negotiations.save(negotiation(f"neg-{i}", i, state=state))
        # Same creation time: ties broken by id.
        await store.negotiations.save(negotiation("neg-a", 4, state="PAUSED"))

        async def ids(
            states: set[str] | None = None, after: float = 0.0, limit: int = 100
        ) -> list[str]:
            found = await store.negotiations.list(
                None if states is None else frozenset(states), after, limit
            )
            return [r.negotiation_id for r in found]

        assert await ids() == ["neg-0", "neg-1", "neg-2", "neg-3", "neg-4", "neg-a"]
        assert await ids({"OPEN", "PAUSED"}) == ["neg-0", "neg-4", "neg-a"]
        assert await ids(set()) == []
        assert await ids(after=T0 + 2) == ["neg-3", "neg-4", "neg-a"]
        assert await ids(limit=2) == ["neg-0", "neg-1"]


@_check
async def a_round_is_saved_with_its_negotiation(factory: StoreFactory) -> None:
    evaluations = {"graphql": {"score": 0.71, "notes": UNICODE, "llm_confidence": None}}
    first = round_record(
        "neg-1", 1, payload=BINARY, content_type="application/octet-stream", tokens=70,
        checks={"check_score": 1.0, "errors": []}, delta={}, evaluations=evaluations,
        llm_confidence=0.71, score=0.71,
    )  # fmt: skip
    async with factory.open() as store:
        record = negotiation("neg-1", state="DELIBERATING", round=1)
        await store.negotiations.save(record, first)
        second = round_record("neg-1", 2, delta={"magnitude": 0.5, "changed_paths": ["/v"]})
        await store.negotiations.save(replace(record, round=2), second)
        await store.negotiations.save(negotiation("neg-2"), round_record("neg-2", 1))
        rounds = await store.negotiations.rounds("neg-1")
        assert rounds == [first, second]
        assert type(rounds[0].payload) is bytes
        assert (rounds[1].llm_confidence, rounds[1].score) == (None, None)
        stored = await store.negotiations.get("neg-1")
        assert stored is not None
        assert stored.round == 2
        # Saving a round again replaces it (an evaluation arrived).
        voted = replace(second, evaluations=evaluations, score=0.25)
        await store.negotiations.save(replace(record, round=2), voted)
        assert await store.negotiations.rounds("neg-1") == [first, voted]
        assert await store.negotiations.rounds("neg-3") == []


@_check
async def policies_and_profiles_are_kept_by_name(factory: StoreFactory) -> None:
    async with factory.open() as store:
        assert await store.negotiations.policies() == {}
        await store.negotiations.put_policy("", POLICY, T0)
        await store.negotiations.replace_profiles({"fast": {"max_rounds": 1}, UNICODE: {}}, T0)
        assert await store.negotiations.policies() == {
            "": POLICY, "fast": {"max_rounds": 1}, UNICODE: {},
        }  # fmt: skip
        # Replacing profiles keeps the base policy and drops profiles not given again.
        await store.negotiations.replace_profiles({"slow": {"max_rounds": 9}}, T0 + 1)
        assert await store.negotiations.policies() == {"": POLICY, "slow": {"max_rounds": 9}}
        await store.negotiations.put_policy("", {"max_rounds": 2}, T0 + 2)
        assert (await store.negotiations.policies())[""] == {"max_rounds": 2}
        try:
            await store.negotiations.replace_profiles({"": {}}, T0)
        except ValueError:
            pass
        else:
            raise AssertionError("a profile named '' was accepted")


@_check
async def artifacts_append_once_per_version_in_order(factory: StoreFactory) -> None:
    async with factory.open() as store:
        contract = artifact("neg-1", "contract", "v1", content=BINARY)
        assert await store.artifacts.append(contract)
        assert await store.artifacts.append(artifact("neg-1", "diff", "v1_to_v2"))
        assert await store.artifacts.append(artifact("neg-1", "contract", "v2"))
        assert await store.artifacts.append(artifact("neg-2", "contract", "v1"))
        # The same key again changes nothing, even with other content.
        assert not await store.artifacts.append(replace(contract, content=b"other"))
        listed = await store.artifacts.list("neg-1")
        assert [a.name for a in listed] == ["contract_v1.json", "diff_v1_to_v2.json",
                                            "contract_v2.json"]  # fmt: skip
        assert listed[0] == contract
        assert type(listed[0].content) is bytes
        assert [a.version for a in await store.artifacts.list("neg-1", "contract")] == [
            "v1", "v2",
        ]  # fmt: skip
        assert await store.artifacts.list("neg-1", "note") == []
        assert await store.artifacts.get("neg-1", "contract", "v1") == contract
        assert await store.artifacts.get("neg-1", "contract", "v9") is None


@_check
async def a_state_is_saved_with_its_artifacts(factory: StoreFactory) -> None:
    async with factory.open() as store:
        contract = artifact("neg-1", "contract", "v1", content=BINARY)
        assert await store.artifacts.append(contract)
        record = negotiation("neg-1", state="DECIDED", round=1)
        decision = artifact("neg-1", "decision", "final", content=b'{"accepted": true}')
        other = replace(contract, content=b"other")
        added = await store.negotiations.save(record, round_record("neg-1", 1), [other, decision])
        # As ArtifactStore.append: a held key stays as it was, a new one is added.
        assert added == [False, True]
        stored = await store.negotiations.get("neg-1")
        assert stored is not None and stored.state == "DECIDED"
        assert await store.artifacts.list("neg-1") == [contract, decision]
        assert [r.round for r in await store.negotiations.rounds("neg-1")] == [1]
        assert await store.negotiations.save(replace(record, state="ABORTED")) == []
        assert len(await store.artifacts.list("neg-1")) == 2


@_check
async def negotiations_and_artifacts_survive_reopening(factory: StoreFactory) -> None:
    if not factory.durable:
        raise CheckNotApplicable(f"the {factory.backend} backend is not durable")
    record = negotiation("neg-1", state="AWAITING_COUNTER", round=1, policy={"policy": POLICY})
    first = round_record("neg-1", 1, score=0.5)
    async with factory.open() as store:
        await store.negotiations.save(record, first)
        await store.negotiations.put_policy("", POLICY, T0)
        await store.artifacts.append(artifact("neg-1", "contract", "v1"))
    async with factory.open() as store:
        assert await store.negotiations.get("neg-1") == record
        assert await store.negotiations.rounds("neg-1") == [first]
        assert await store.negotiations.policies() == {"": POLICY}
        assert [a.name for a in await store.artifacts.list("neg-1")] == ["contract_v1.json"]
