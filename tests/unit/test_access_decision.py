"""The one access decision (core/access/decision.py), over every principal kind and every
kind of rule, in both modes; and the pieces around it that are pure: the subjects a rule
finds in a request, per-call proofs, the replay window."""

from __future__ import annotations

import itertools

import pytest

from apiary.core.access.decision import PERMISSION_DENIED, UNAUTHENTICATED, decide, unconditional
from apiary.core.access.principal import ANONYMOUS, Principal, PrincipalKind
from apiary.core.access.proof import CallProof, encode_proof, parse_proof, proof_payload
from apiary.core.access.rules import Role, Rule, Who, subject_values
from apiary.server.auth.replay import ReplayWindow
from apiary.wire import pb

K = PrincipalKind
AGENT = Principal(K.AGENT, "bob")
APP = Principal(K.APPLICATION, "ci")
OPERATOR = Principal(K.OPERATOR, "olivia", roles=frozenset({"dlq"}))
ADMIN = Principal(K.OPERATOR, "root", roles=frozenset({"admin"}))
RULES = {
    "public": Rule(Who.PUBLIC),
    "principal": Rule(Who.PRINCIPAL),
    "operator": Rule(Who.OPERATOR),
    "role dlq": Rule(Who.ROLE, Role.DLQ),
    "role events": Rule(Who.ROLE, Role.EVENTS),
    "self": Rule(Who.SELF, Role.AGENTS, ("agent_id",)),
    "self, no role": Rule(Who.SELF, None, ("agent_id",)),
    "producer": Rule(Who.SELF, None, ("agent_id",), applications=True, operators=True),
    "owner": Rule(Who.OWNER, Role.TOOLS, ("call_id",), "tool_call"),
}
WHO = {"anonymous": ANONYMOUS, "agent": AGENT, "app": APP, "operator": OPERATOR, "admin": ADMIN}

# (who, rule) -> allowed in secure mode, the request naming bob and the object owned by bob.
EXPECTED_SECURE = {
    ("anonymous", "public"): True,
    **{("anonymous", r): False for r in RULES if r != "public"},
    **{(w, "public"): True for w in WHO},
    **{(w, "principal"): True for w in WHO if w != "anonymous"},
    ("agent", "operator"): False, ("app", "operator"): False,
    ("operator", "operator"): True, ("admin", "operator"): True,
    ("agent", "role dlq"): False, ("app", "role dlq"): False,
    ("operator", "role dlq"): True, ("admin", "role dlq"): True,
    ("agent", "role events"): False, ("app", "role events"): False,
    ("operator", "role events"): False, ("admin", "role events"): True,
    ("agent", "self"): True, ("app", "self"): False,
    ("operator", "self"): False, ("admin", "self"): True,
    ("agent", "self, no role"): True, ("app", "self, no role"): False,
    ("operator", "self, no role"): False, ("admin", "self, no role"): False,
    ("agent", "producer"): True, ("app", "producer"): False,
    ("operator", "producer"): True, ("admin", "producer"): True,
    ("agent", "owner"): True, ("app", "owner"): False,
    ("operator", "owner"): False, ("admin", "owner"): True,
}  # fmt: skip


@pytest.mark.parametrize(("who", "rule"), list(itertools.product(WHO, RULES)))
def test_every_principal_kind_under_every_rule_in_secure_mode(who: str, rule: str) -> None:
    principal, chosen = WHO[who], RULES[rule]
    subjects = ["bob"] if chosen.subjects else []
    decision = decide(principal, chosen, subjects, owner="bob", secure=True)
    assert decision.allowed is EXPECTED_SECURE[(who, rule)], decision.reason
    if not decision.allowed:
        expected = UNAUTHENTICATED if who == "anonymous" else PERMISSION_DENIED
        assert decision.refusal == expected
        assert decision.reason


@pytest.mark.parametrize("rule", list(RULES))
def test_in_dev_mode_anonymous_callers_are_trusted_but_for_others_calls(rule: str) -> None:
    chosen = RULES[rule]
    assert decide(ANONYMOUS, chosen, ["bob"], owner="bob", secure=False).allowed
    # Claiming to be mallory, an anonymous caller may not cancel bob's call.
    claimed = decide(ANONYMOUS, chosen, ["bob"], owner="bob", secure=False, claimed="mallory")
    assert claimed.allowed is (rule != "owner")
    assert unconditional(ANONYMOUS, chosen, secure=False) is (rule != "owner")
    assert unconditional(ANONYMOUS, chosen, secure=True) is (rule == "public")


def test_an_agent_acts_as_itself_only() -> None:
    rule = RULES["self"]
    refused = decide(AGENT, rule, ["bob", "alice"], secure=True)
    assert not refused.allowed and "not as alice" in refused.reason
    assert decide(AGENT, rule, [], secure=True).allowed  # nothing named: the handler answers
    lying = decide(AGENT, RULES["principal"], [], secure=True, claimed="alice")
    assert not lying.allowed and "claims to be agent 'alice'" in lying.reason


def test_an_owner_rule_lets_the_owner_and_answers_missing_objects_as_missing() -> None:
    rule = RULES["owner"]
    assert not decide(Principal(K.AGENT, "mallory"), rule, ["c1"], owner="bob", secure=True).allowed
    assert decide(Principal(K.AGENT, "mallory"), rule, ["c1"], owner=None, secure=True).allowed


def test_an_operator_owns_what_it_submitted_itself_without_the_role() -> None:
    """A task an operator submitted is its own to wait for and cancel, role or not; another
    principal's is not."""
    rule = Rule(Who.OWNER, Role.TASKS, ("task_id",), "task")
    assert decide(OPERATOR, rule, ["t1"], owner="olivia", secure=True).allowed
    refused = decide(OPERATOR, rule, ["t1"], owner="bob", secure=True)
    assert not refused.allowed and "tasks" in refused.reason
    assert decide(ADMIN, rule, ["t1"], owner="bob", secure=True).allowed


def test_subjects_are_found_at_their_paths_in_requests() -> None:
    frame = pb.apiary_pb2.SendFrame()
    for producer in ("alice", "", "bob"):
        frame.items.add().msg.producer_id = producer
    assert list(subject_values(frame, "items[].msg.producer_id")) == ["alice", "bob"]
    request = pb.registry_pb2.RegisterAgentRequest()
    request.agent.agent_id = "carol"
    assert list(subject_values(request, "agent.agent_id")) == ["carol"]
    assert list(subject_values(request, "agent.nothing.here")) == []


def test_a_proof_round_trips_and_malformed_ones_say_why() -> None:
    proof = CallProof("bob", 1_700_000_000_123, b"n" * 16, b"s" * 64)
    assert parse_proof(encode_proof(proof)) == proof
    for text in ("", "v2;bob;1;bm9uY2Vub25jZQ;c2ln", "v1;;1;bm9uY2Vub25jZQ;c2ln",
                 "v1;bob;soon;bm9uY2Vub25jZQ;c2ln", "v1;bob;1;c2hvcnQ;c2ln",
                 "v1;bob;1;bm9uY2Vub25jZQ;***"):  # fmt: skip
        assert isinstance(parse_proof(text), str), text
    payload = proof_payload("apiary", "/a.B/C", "bob", 5, b"n" * 16)
    assert payload.split(b"\n")[:6] == [
        b"apiary-call-proof/v1",
        b"apiary",
        b"/a.B/C",
        b"bob",
        b"default",
        b"5",
    ]
    # The tenant is signed: a proof for acme is not one for globex.
    assert proof_payload("apiary", "/a.B/C", "bob", 5, b"n" * 16, "acme") != payload


def test_the_replay_window_takes_a_nonce_once_and_only_within_the_window() -> None:
    window = ReplayWindow(60.0)
    assert window.accept(b"n1", at=1000.0, now=1000.0) is None
    assert window.accept(b"n1", at=1000.0, now=1001.0) == "already used (replay)"
    assert "accepted within" in (window.accept(b"n2", at=900.0, now=1000.0) or "")
    assert "accepted within" in (window.accept(b"n3", at=1061.0, now=1000.0) or "")
    assert window.accept(b"n4", at=940.0, now=1000.0) is None  # at the edge: still in
    # Once its time is past the window, a nonce is forgotten; its proof is out of time anyway.
    assert window.accept(b"n1", at=1000.0, now=1061.0) is not None
