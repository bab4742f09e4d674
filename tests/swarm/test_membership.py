"""Membership rules of the Agent Swarm Protocol (pure): who may do what, which notices go to
whom, idempotent re-joins, approval, mutes, and the state file's JSON."""

from __future__ import annotations

import json
from dataclasses import replace

import jsonschema
import pytest

from apiary.swarm import membership as m
from apiary.swarm.errors import SwarmError
from apiary.swarm.ratelimit import JOINS_PER_IP, MESSAGES_PER_SENDER, Limit, SlidingWindow
from apiary.swarm.schemas import validator
from apiary.swarm.settings import NodeSettings
from apiary.swarm.wire import Sender, SwarmMessage

SWARM = "550e8400-e29b-41d4-a716-446655440000"
AT = "2026-02-05T14:30:00.000Z"
KEY = "A6EHv/POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg="


def _member(name: str) -> m.Member:
    return m.Member(name, f"https://{name}.example.com/swarm", KEY, AT)


def _master_with(*names: str, settings: m.Settings | None = None) -> m.MembershipState:
    settings = settings or m.Settings()
    state = m.create(m.MembershipState("a"), SWARM, "builders", _member("a"), settings).state
    for name in names:
        state = m.admit(state, SWARM, _member(name), "token-1").state
    return state


def _message(sender: str, recipient: str = "broadcast", **extra: object) -> SwarmMessage:
    return SwarmMessage(
        message_id="6ba7b810-9dad-11d1-80b4-00c04fd430c8", timestamp=AT,
        sender=Sender(sender, f"https://{sender}.example.com/swarm"), recipient=recipient,
        swarm_id=SWARM, type="system" if extra else "message", content="", signature="x",
        extra=dict(extra),
    )  # fmt: skip


def _signed(sender: str, body: dict[str, object]) -> SwarmMessage:
    """A system message whose operation is its (signed) content, as Apiary and the reference
    implementation send operations."""
    return replace(_message(sender), type="system", content=json.dumps(body))


def test_create_checks_the_name() -> None:
    for bad in ("", "x" * 257):
        with pytest.raises(SwarmError) as caught:
            m.create(m.MembershipState("a"), SWARM, bad, _member("a"))
        assert (caught.value.code, caught.value.field) == ("INVALID_SWARM_NAME", "name")
    state = _master_with()
    assert state.swarm(SWARM).master == "a"


def test_a_join_is_announced_to_existing_members_with_the_new_members_key() -> None:
    state = _master_with("b")
    outcome = m.admit(state, SWARM, _member("c"), "token-1")
    assert outcome.status == "accepted"
    (notice,) = outcome.notices
    assert notice.recipients == ("b",)
    assert notice.body["action"] == "member_joined" and notice.body["agent_id"] == "c"
    assert notice.body["member"]["public_key"] == KEY
    assert [x.agent_id for x in outcome.state.swarm(SWARM).members] == ["a", "b", "c"]
    assert outcome.state.swarm(SWARM).invite_uses == {"token-1": 2}  # b, then c


def test_a_rejoin_is_idempotent_and_announced_to_no_one() -> None:
    state = _master_with("b")
    again = m.admit(state, SWARM, _member("b"), "token-2")
    assert (again.status, again.notices, again.state) == ("already", (), state)


@pytest.mark.conformance("swarm.membership.require-approval")
def test_require_approval_holds_the_join_until_the_master_approves() -> None:
    state = _master_with(settings=m.Settings(require_approval=True))
    pending = m.admit(state, SWARM, _member("b"), "t")
    assert pending.status == "pending"
    assert [x.agent_id for x in pending.state.swarm(SWARM).members] == ["a"]
    approved = m.approve(pending.state, SWARM, "b")
    assert [x.agent_id for x in approved.state.swarm(SWARM).members] == ["a", "b"]
    with pytest.raises(SwarmError) as caught:
        m.approve(approved.state, SWARM, "b")
    assert caught.value.code == "MEMBER_NOT_FOUND"
    member_view = replace(pending.state, agent_id="b")
    with pytest.raises(SwarmError) as caught:
        m.approve(member_view, SWARM, "b")
    assert caught.value.code == "NOT_MASTER"


@pytest.mark.conformance("swarm.security.master-only")
def test_only_the_master_invites_unless_members_may() -> None:
    state = _master_with("b")
    assert m.may_invite(state, SWARM).swarm_id == SWARM
    as_b = replace(state, agent_id="b")
    with pytest.raises(SwarmError) as caught:
        m.may_invite(as_b, SWARM)
    assert (caught.value.status, caught.value.code) == (403, "INVITES_DISABLED")
    open_swarm = replace(state.swarm(SWARM), settings=m.Settings(allow_member_invite=True))
    assert m.may_invite(as_b.with_swarm(open_swarm), SWARM).swarm_id == SWARM
    with pytest.raises(SwarmError) as caught:
        m.may_invite(replace(state, agent_id="z"), SWARM)
    assert caught.value.code == "NOT_MEMBER"
    with pytest.raises(SwarmError) as caught:
        m.may_invite(state, "6ba7b810-9dad-11d1-80b4-00c04fd430c8")
    assert (caught.value.status, caught.value.code) == (404, "SWARM_NOT_FOUND")


def test_kick_tells_the_kicked_and_the_rest() -> None:
    state = _master_with("b", "c")
    outcome = m.kick(state, SWARM, "b", "spam")
    kicked, told = outcome.notices
    assert (kicked.recipients, kicked.body["action"], kicked.body["reason"]) == (
        ("b",), "kicked", "spam",
    )  # fmt: skip
    assert told.recipients == ("c",)
    assert (told.body["action"], told.body["initiated_by"]) == ("member_kicked", "a")
    with pytest.raises(SwarmError) as caught:
        m.kick(replace(state, agent_id="b"), SWARM, "c")
    assert caught.value.code == "NOT_MASTER"
    with pytest.raises(SwarmError) as caught:
        m.kick(state, SWARM, "nobody")
    assert caught.value.code == "MEMBER_NOT_FOUND"


def test_transfer_hands_over_and_broadcasts_master_changed() -> None:
    state = _master_with("b", "c")
    outcome = m.transfer(state, SWARM, "b")
    to_new, changed = outcome.notices
    assert (to_new.recipients, to_new.body["action"]) == (("b",), "master_transfer")
    assert (changed.recipients, changed.body["action"]) == (("b", "c"), "master_changed")
    assert outcome.state.swarm(SWARM).master == "b"
    with pytest.raises(SwarmError) as caught:
        m.leave(state, SWARM)  # a master with members must transfer first
    assert caught.value.code == "NOT_AUTHORIZED"


def test_leave_tells_the_others() -> None:
    state = replace(_master_with("b", "c"), agent_id="b")
    outcome = m.leave(state, SWARM)
    (notice,) = outcome.notices
    assert (notice.recipients, notice.body["action"]) == (("a", "c"), "member_left")
    assert SWARM not in outcome.state.swarms


@pytest.mark.conformance("swarm.security.muted-dropped")
def test_mutes_drop_silently_and_announce_in_a_swarm() -> None:
    state = _master_with("b", "c")
    assert m.screen(state, _message("b"))
    muted = m.mute_agent(state, "b", swarm_id=SWARM, reason="noise")
    (notice,) = muted.notices
    assert (notice.body["action"], notice.recipients) == ("member_muted", ("b", "c"))
    assert not m.screen(muted.state, _message("b"))
    unmuted = m.mute_agent(muted.state, "b", muted=False, swarm_id=SWARM)
    assert unmuted.notices[0].body["action"] == "member_unmuted"
    assert m.screen(unmuted.state, _message("b"))
    quiet = m.mute_swarm(state, SWARM).state
    assert not m.screen(quiet, _message("c"))


@pytest.mark.conformance("swarm.security.members-only")
def test_screening_refuses_strangers_and_misaddressed_messages() -> None:
    state = _master_with("b")
    for message, status, code in (
        (_message("z"), 403, "NOT_MEMBER"),
        (_message("b", recipient="c"), 403, "NOT_AUTHORIZED"),
        (replace(_message("b"), swarm_id="6ba7b810-9dad-11d1-80b4-00c04fd430c8"), 404,
         "SWARM_NOT_FOUND"),
    ):  # fmt: skip
        with pytest.raises(SwarmError) as caught:
            m.screen(state, message)
        assert (caught.value.status, caught.value.code) == (status, code)


def test_system_messages_keep_member_lists_in_sync() -> None:
    master = _master_with("b", "c")
    member_b = replace(master, agent_id="b")
    joined = m.admit(master, SWARM, _member("d"), "t").notices[0].body
    synced = m.apply_system(member_b, _signed("a", dict(joined)))
    assert [x.agent_id for x in synced.swarm(SWARM).members] == ["a", "b", "c", "d"]
    forged = m.apply_system(member_b, _signed("c", dict(joined)))  # not from the master
    assert [x.agent_id for x in forged.swarm(SWARM).members] == ["a", "b", "c"]
    # A member (a key) is taken only from the signed content, never from top-level copies.
    unsigned = m.apply_system(member_b, _message("a", **dict(joined)))
    assert [x.agent_id for x in unsigned.swarm(SWARM).members] == ["a", "b", "c"]
    left = m.apply_system(synced, _message("c", action="member_left", swarm_id=SWARM))
    assert [x.agent_id for x in left.swarm(SWARM).members] == ["a", "b", "d"]
    moved = m.apply_system(left, _message("a", action="master_changed", new_master="d"))
    assert moved.swarm(SWARM).master == "d"
    kicked = m.apply_system(moved, _message("d", action="kicked", swarm_id=SWARM))
    assert SWARM not in kicked.swarms


@pytest.mark.conformance("swarm.state.schema")
def test_the_state_json_is_schema_valid_and_round_trips() -> None:
    state = m.mute_swarm(m.mute_agent(_master_with("b"), "spam-bot").state, SWARM).state
    state = state.with_key("b", m.KeyEntry(KEY, AT, "https://b.example.com/swarm/info"))
    body = m.state_to_json(state)
    validator("membership-state.json").validate(body)
    assert m.state_from_json(body) == state
    with pytest.raises(jsonschema.ValidationError):
        validator("membership-state.json").validate({**body, "schema_version": "2.0.0"})


def test_rate_limits_answer_retry_after_in_seconds() -> None:
    window = SlidingWindow(Limit(2, 60.0))
    assert window.check("a", 0.0) == 0
    assert window.check("a", 10.0) == 0
    assert window.check("a", 20.0) == 40  # the oldest leaves the window at 60 s
    assert window.check("b", 20.0) == 0  # per key
    assert window.check("a", 60.5) == 0
    assert (MESSAGES_PER_SENDER.count, MESSAGES_PER_SENDER.window_s) == (60, 60.0)
    assert (JOINS_PER_IP.count, JOINS_PER_IP.window_s) == (10, 3600.0)
    with pytest.raises(ValueError):
        Limit(0, 60.0)


def test_a_system_operation_is_read_from_the_signed_content_first() -> None:
    master = _master_with("b", "c")
    member_b = replace(master, agent_id="b")
    signed = json.dumps({"action": "member_kicked", "agent_id": "c", "swarm_id": SWARM})
    # Top-level fields are not covered by the signature: when the content carries the
    # operation, an altered copy at the top level changes nothing.
    message = replace(_message("a", action="member_kicked", agent_id="b"), content=signed)
    assert message.system_body()["agent_id"] == "c"
    after = m.apply_system(member_b, message)
    assert [x.agent_id for x in after.swarm(SWARM).members] == ["a", "b"]
    # Without an operation in the content, the top level is read (the existing implementation).
    legacy = replace(_message("a", action="member_kicked", agent_id="c"), content="kicked c")
    assert legacy.system_body()["agent_id"] == "c"


# --- member_joined in both shapes --------------------------------------------------------------

NEW_KEY = "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo="


def _reference_notice(**changes: object) -> dict[str, object]:
    """The content of the reference implementation's member_joined broadcast
    (src/server/broadcast.py): flat fields, no public key."""
    body: dict[str, object] = {
        "type": "system", "action": "member_joined", "swarm_id": SWARM, "agent_id": "d",
        "endpoint": "https://d.example.com/swarm", "joined_at": "2026-02-05T15:00:00.000Z",
    }  # fmt: skip
    body.update(changes)
    return body


def test_a_join_is_announced_flat_and_nested() -> None:
    """What the reference reads (flat endpoint, else the sender's: the master's) and what
    join.json's member_joined_broadcast describes (a nested member with its key)."""
    outcome = m.admit(_master_with("b"), SWARM, _member("c"), "token-1")
    (notice,) = outcome.notices
    body = dict(notice.body)
    assert (body["type"], body["action"], body["swarm_id"]) == ("system", "member_joined", SWARM)
    assert (body["agent_id"], body["endpoint"], body["joined_at"]) == (
        "c", "https://c.example.com/swarm", AT,
    )  # fmt: skip
    assert body["member"] == _member("c").to_json()
    validator("types/member.json").validate(body["member"])


def test_a_flat_notice_from_the_master_names_a_member_whose_key_is_to_be_fetched() -> None:
    member_b = replace(_master_with("b"), agent_id="b")
    notice = _signed("a", _reference_notice())
    wanted = m.announced_member(member_b, notice)
    assert wanted == m.Member("d", "https://d.example.com/swarm", "", "2026-02-05T15:00:00.000Z")
    unchanged = m.apply_system(member_b, notice)  # no key fetched: nothing listed
    assert [x.agent_id for x in unchanged.swarm(SWARM).members] == ["a", "b"]
    listed = m.apply_system(member_b, notice, NEW_KEY)
    assert listed.swarm(SWARM).member("d") == replace(wanted, public_key=NEW_KEY)
    # Without a usable joined_at: the message's own timestamp.
    for joined_at in (None, "", "yesterday", 17):
        bare = _signed("a", _reference_notice(joined_at=joined_at))
        assert m.announced_member(member_b, bare) == replace(wanted, joined_at=AT)


@pytest.mark.parametrize(
    ("why", "sender", "body"),
    [
        ("not from the master", "b", _reference_notice()),
        ("no endpoint to ask for the key", "a", _reference_notice(endpoint=None)),
        ("plain http endpoint", "a", _reference_notice(endpoint="http://d.example.com/swarm")),
        (
            "loopback http, node not insecure",
            "a",
            _reference_notice(endpoint="http://127.0.0.1:9/swarm"),
        ),
        ("already a member", "a", _reference_notice(agent_id="b")),
        ("no agent", "a", _reference_notice(agent_id="")),
        (
            "flat and nested name different agents",
            "a",
            _reference_notice(member={**_member("e").to_json()}),
        ),
        (
            "nested key unusable",
            "a",
            _reference_notice(member={**_member("d").to_json(), "public_key": "bad"}),
        ),
        ("another swarm", "a", _reference_notice()),
    ],
)
def test_a_member_joined_that_may_not_add_a_member_adds_none(
    why: str, sender: str, body: dict[str, object]
) -> None:
    member_c = replace(_master_with("b", "c"), agent_id="c")
    notice = _signed(sender, body)
    if why == "another swarm":
        notice = replace(notice, swarm_id="6ba7b810-9dad-11d1-80b4-00c04fd430c8")
    assert m.announced_member(member_c, notice) is None, why
    after = m.apply_system(member_c, notice, NEW_KEY) if why != "another swarm" else member_c
    assert [x.agent_id for x in after.swarm(SWARM).members] == ["a", "b", "c"], why


def test_a_development_node_takes_a_loopback_http_member() -> None:
    member_b = replace(_master_with("b"), agent_id="b")
    notice = _signed("a", _reference_notice(endpoint="http://127.0.0.1:8443/swarm/"))
    wanted = m.announced_member(member_b, notice, insecure=True)
    assert wanted is not None and wanted.endpoint == "http://127.0.0.1:8443/swarm"
    for outside in ("http://10.0.0.1:8443/swarm", "http://d.example.com/swarm"):
        off = _signed("a", _reference_notice(endpoint=outside))
        assert m.announced_member(member_b, off, insecure=True) is None


@pytest.mark.conformance("swarm.ratelimit.recommended")
def test_the_default_limits_are_the_protocols_recommendations() -> None:
    settings = NodeSettings()
    assert (settings.per_sender.count, settings.per_sender.window_s) == (60, 60.0)
    assert (settings.per_swarm.count, settings.per_swarm.window_s) == (100, 60.0)
    assert (settings.joins_per_ip.count, settings.joins_per_ip.window_s) == (10, 3600.0)
