"""Every refusal of a peer, over real HTTPS, as any implementation would meet it: the status,
the protocol's error code and the field it names; and that nothing refused is recorded."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from apiary.swarm.errors import SwarmError
from apiary.swarm.invite import InviteClaims, encode_invite
from apiary.swarm.keys import Identity, sign_message
from apiary.swarm.ratelimit import Limit
from apiary.swarm.settings import NodeSettings
from apiary.swarm.transport import MAX_BODY, add_swarm_routes, bind, open_swarm_server
from apiary.swarm.wire import Sender, SwarmMessage, format_timestamp
from tests.swarm.peers import FAST, Answer, Peer, http, open_peer
from tests.swarm.pki import Pki


@dataclass(slots=True)
class Pair:
    alpha: Peer
    beta: Peer
    swarm_id: str
    pki: Pki

    def signed(self, by: Peer | None = None, **changes: Any) -> SwarmMessage:
        """A message from beta (or `by`) to alpha, signed after `changes`."""
        peer = by or self.beta
        draft = peer.node.courier.compose(self.swarm_id, "alpha", "message", "hi").unsigned()
        return sign_message(peer.node.identity, replace(draft, **changes))

    async def post(self, body: object, **kwargs: Any) -> Answer:
        return await http(self.pki, "POST", f"{self.alpha.endpoint}/message", body, **kwargs)

    async def join(self, token: str, agent_id: str = "newcomer", key: str = "") -> Answer:
        body = {
            "type": "system", "action": "join_request", "invite_token": token,
            "sender": {"agent_id": agent_id, "endpoint": f"https://{agent_id}.example/swarm",
                       "public_key": key or Identity.generate().public_key},
        }  # fmt: skip
        return await http(self.pki, "POST", f"{self.alpha.endpoint}/join", body)

    async def inbox_ids(self) -> list[str]:
        """alpha's inbox, but for its own member_joined notices."""
        found = await self.alpha.store.swarm.list_recent(limit=100)
        return [e.mail.message_id for e in found if e.mail.sender_id != "alpha"]


async def _pair(tmp: Path, pki: Pki, settings: NodeSettings = FAST) -> AsyncIterator[Pair]:
    async with (
        open_peer(tmp, "alpha", pki, settings=settings) as alpha,
        open_peer(tmp, "beta", pki) as beta,
    ):
        swarm_id = alpha.node.create("builders").swarm_id
        await beta.node.join(alpha.node.invite(swarm_id).url)
        yield Pair(alpha, beta, swarm_id, pki)


@pytest.fixture
async def pair(tmp_path: Path, pki: Pki) -> AsyncIterator[Pair]:
    async for made in _pair(tmp_path, pki):
        yield made


def _refused(answer: Answer, status: int, code: str, field: str = "") -> None:
    assert (answer.status, answer.code, answer.field) == (status, code, field), answer.body
    assert answer.body["error"]["message"]


async def test_a_good_message_is_queued(pair: Pair) -> None:
    message = pair.signed()
    answer = await pair.post(message.to_json(), headers={"X-Agent-ID": "beta"})
    assert (answer.status, answer.body) == (
        200, {"status": "queued", "message_id": message.message_id},
    )  # fmt: skip
    assert message.message_id in await pair.inbox_ids()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda b: b.pop("swarm_id"), "swarm_id"),
        (lambda b: b.update(message_id="not-a-uuid"), "message_id"),
        (lambda b: b.update(sender={"agent_id": "beta", "endpoint": "http://x"}),
         "sender.endpoint"),
        (lambda b: b.update(type="chat"), "type"),
        (lambda b: b.update(timestamp="yesterday"), "timestamp"),
        (lambda b: b.update(references=[{"type": "github_issue", "repo": "o/r"}]),
         "references[0].number"),
        (lambda b: b.update(priority="urgent"), "priority"),
    ],
)  # fmt: skip
async def test_a_malformed_body_is_400_naming_the_field(
    pair: Pair, change: Any, field: str
) -> None:
    body = pair.signed().to_json()
    change(body)
    _refused(await pair.post(body), 400, "INVALID_FORMAT", field)
    assert await pair.inbox_ids() == []


async def test_bodies_that_are_not_messages_and_contradicting_headers_are_400(pair: Pair) -> None:
    _refused(await pair.post(None, raw=b"{not json"), 400, "INVALID_FORMAT", "body")
    _refused(await pair.post([1, 2]), 400, "INVALID_FORMAT", "body")
    good = pair.signed().to_json()
    _refused(await pair.post(good, headers={"X-Agent-ID": "alpha"}), 400, "INVALID_FORMAT",
             "X-Agent-ID")  # fmt: skip
    _refused(await pair.post(good, headers={"X-Swarm-Protocol": "1.0.0"}), 400,
             "UNSUPPORTED_VERSION", "X-Swarm-Protocol")  # fmt: skip


async def test_deep_huge_or_nul_bodies_are_400_not_500(pair: Pair) -> None:
    """Bodies the one JSON reader refuses (deep nesting, numbers past a float, NUL) are the
    protocol's 400, naming the body; they used to answer 500."""
    for raw in (b"[" * 100_000, b'{"n": 1e999}', b'{"content": "a\\u0000b"}'):
        _refused(await pair.post(None, raw=raw), 400, "INVALID_FORMAT", "body")
    body = pair.signed().to_json()
    body["content"] = "a\x00b"  # a NUL in a field of an otherwise valid message
    _refused(await pair.post(body), 400, "INVALID_FORMAT", "body")
    assert await pair.inbox_ids() == []


def _too_large(answer: Answer) -> None:
    _refused(answer, 413, "PAYLOAD_TOO_LARGE", "body")
    assert answer.body["error"]["details"]["limit"] == MAX_BODY
    assert answer.body["error"]["message"].startswith(
        f"body: larger than this peer's limit of {MAX_BODY}"
    )


async def test_a_body_over_the_limit_is_413_in_the_error_object(pair: Pair) -> None:
    """aiohttp's own refusal (the peer's app reads at most MAX_BODY) answers the protocol's
    error object, not aiohttp's plain text; a body at the limit is read (and refused for
    what it holds)."""
    _too_large(await pair.post(None, raw=b" " * (MAX_BODY + 1)))
    _refused(await pair.post(None, raw=b" " * MAX_BODY), 400, "INVALID_FORMAT", "body")
    assert await pair.inbox_ids() == []


async def test_a_body_over_the_limit_is_413_where_the_app_takes_larger_ones(pair: Pair) -> None:
    """Mounted on an app that reads larger bodies (the coordinator's HTTP port takes 20 MiB),
    the swarm routes still hold theirs to MAX_BODY, with the same answer."""
    app = web.Application(client_max_size=4 * MAX_BODY)
    add_swarm_routes(app, pair.alpha.node)
    async with open_swarm_server(app, bind("127.0.0.1", 0), None) as (host, port):
        url = f"http://{host}:{port}/swarm/message"
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=b" " * (MAX_BODY + 1)) as response,
        ):
            answer = Answer(response.status, await response.json(), dict(response.headers))
    _too_large(answer)
    assert await pair.inbox_ids() == []


@pytest.mark.conformance("swarm.version.compatible")
async def test_another_major_version_is_refused_and_a_newer_minor_accepted(pair: Pair) -> None:
    _refused(await pair.post(pair.signed(protocol_version="1.0.0").to_json()), 400,
             "UNSUPPORTED_VERSION", "protocol_version")  # fmt: skip
    newer = pair.signed(protocol_version="0.2.7")
    assert (await pair.post(newer.to_json())).status == 200


@pytest.mark.conformance("swarm.security.all-signed", "swarm.security.verify")
async def test_forged_and_altered_signatures_are_401(pair: Pair) -> None:
    stranger = Identity.generate()
    forged = sign_message(stranger, pair.signed().unsigned())  # claims to be beta
    _refused(await pair.post(forged.to_json()), 401, "INVALID_SIGNATURE")
    altered = replace(pair.signed(), content="give mallory the keys")
    _refused(await pair.post(altered.to_json()), 401, "INVALID_SIGNATURE")
    unsigned = {**pair.signed().to_json(), "signature": "bm90IGEgc2lnbmF0dXJl"}
    _refused(await pair.post(unsigned), 401, "INVALID_SIGNATURE")
    assert await pair.inbox_ids() == []


@pytest.mark.conformance("swarm.security.members-only")
async def test_strangers_and_misaddressed_messages_are_403(pair: Pair) -> None:
    mallory = Identity.generate()
    draft = replace(pair.signed().unsigned(), sender=Sender("mallory", "https://m.example/swarm"))
    _refused(await pair.post(sign_message(mallory, draft).to_json()), 403, "NOT_MEMBER")
    _refused(await pair.post(pair.signed(recipient="gamma").to_json()), 403, "NOT_AUTHORIZED")
    assert await pair.inbox_ids() == []


async def test_an_unknown_swarm_is_404(pair: Pair) -> None:
    answer = await pair.post(pair.signed(swarm_id=str(uuid.uuid4())).to_json())
    _refused(answer, 404, "SWARM_NOT_FOUND")


@pytest.mark.conformance("swarm.security.muted-dropped")
async def test_muted_senders_and_swarms_are_answered_200_and_dropped(pair: Pair) -> None:
    await pair.alpha.node.mute_agent("beta")
    muted = pair.signed()
    answer = await pair.post(muted.to_json())
    assert (answer.status, answer.body["status"]) == (200, "queued")
    await pair.alpha.node.mute_agent("beta", muted=False)
    pair.alpha.node.mute_swarm(pair.swarm_id)
    assert (await pair.post(pair.signed().to_json())).status == 200
    pair.alpha.node.mute_swarm(pair.swarm_id, muted=False)
    assert await pair.inbox_ids() == []
    heard = pair.signed()
    assert (await pair.post(heard.to_json())).status == 200
    assert await pair.inbox_ids() == [heard.message_id]


async def test_a_replay_is_never_processed_twice(pair: Pair) -> None:
    seen: list[str] = []

    async def hook(message: SwarmMessage) -> None:
        seen.append(message.message_id)

    pair.alpha.node.add_hook(hook)
    message = pair.signed()
    for _ in range(3):
        answer = await pair.post(message.to_json())
        assert (answer.status, answer.body["message_id"]) == (200, message.message_id)
    assert seen == [message.message_id]
    assert await pair.inbox_ids() == [message.message_id]
    # The same id on another (validly signed) message is not a replay but a clash.
    clash = pair.signed(message_id=message.message_id, content="something else")
    _refused(await pair.post(clash.to_json()), 400, "DUPLICATE_MESSAGE_ID", "message_id")


async def test_expired_and_stale_messages_are_refused(pair: Pair) -> None:
    now = pair.alpha.node.clock.now()
    expired = pair.signed(expires_at=format_timestamp(now - 1))
    _refused(await pair.post(expired.to_json()), 400, "MESSAGE_EXPIRED", "expires_at")
    old = pair.signed(timestamp=format_timestamp(now - 3600))
    _refused(await pair.post(old.to_json()), 400, "STALE_MESSAGE", "timestamp")
    early = pair.signed(timestamp=format_timestamp(now + 3600))
    _refused(await pair.post(early.to_json()), 400, "STALE_MESSAGE", "timestamp")
    assert await pair.inbox_ids() == []
    later = pair.signed(expires_at=format_timestamp(now + 60))
    assert (await pair.post(later.to_json())).status == 200


@pytest.mark.conformance("swarm.ratelimit.recommended")
async def test_rate_limits_answer_429_with_retry_after_in_seconds(tmp_path: Path, pki: Pki) -> None:
    tight = NodeSettings(retry_delays=(), per_sender=Limit(2, 60.0),
                         joins_per_ip=Limit(2, 3600.0))  # fmt: skip
    async for pair in _pair(tmp_path, pki, tight):  # the join above used one of two
        for _ in range(2):
            assert (await pair.post(pair.signed().to_json())).status == 200
        limited = await pair.post(pair.signed().to_json())
        _refused(limited, 429, "RATE_LIMITED")
        assert limited.headers["Retry-After"].isdigit()
        assert 55 <= int(limited.headers["Retry-After"]) <= 60
        assert limited.body["error"]["details"]["retry_after_s"] == int(
            limited.headers["Retry-After"]
        )
        token = pair.alpha.node.invite(pair.swarm_id).token
        assert (await pair.join(token, "one")).status == 200
        joins = await pair.join(token, "two")
        _refused(joins, 429, "RATE_LIMITED")
        assert 3590 <= int(joins.headers["Retry-After"]) <= 3600


async def test_invites_are_enforced(pair: Pair) -> None:
    alpha = pair.alpha.node
    single = alpha.invite(pair.swarm_id, max_uses=1).token
    assert (await pair.join(single, "first")).status == 200
    _refused(await pair.join(single, "second"), 400, "TOKEN_EXHAUSTED", "invite_token")
    # A member joining again is answered with the member list and spends nothing.
    beta_key = pair.beta.node.identity.public_key
    again = await pair.join(single, "beta", beta_key)
    assert again.status == 200
    assert {m["agent_id"] for m in again.body["members"]} == {"alpha", "beta", "first"}
    _refused(await pair.join(single, "beta"), 403, "NOT_AUTHORIZED")  # beta's id, another key

    now = alpha.clock.now()

    def token(**changes: Any) -> str:
        claims = InviteClaims(pair.swarm_id, "alpha", pair.alpha.endpoint, int(now))
        return encode_invite(changes.pop("by", alpha.identity), replace(claims, **changes))

    expired = token(expires_at=format_timestamp(now - 5))
    _refused(await pair.join(expired), 400, "TOKEN_EXPIRED", "invite_token")
    elsewhere = token(endpoint="https://elsewhere.example/swarm")
    _refused(await pair.join(elsewhere), 400, "INVALID_TOKEN", "invite_token")
    forged = token(by=Identity.generate())
    _refused(await pair.join(forged), 400, "INVALID_TOKEN", "invite_token")
    _refused(await pair.join("not.a-jwt"), 400, "INVALID_TOKEN", "invite_token")
    unknown = token(swarm_id=str(uuid.uuid4()))
    _refused(await pair.join(unknown), 404, "SWARM_NOT_FOUND")
    members = pair.alpha.members(pair.swarm_id)
    assert members == ["alpha", "beta", "first"]


@pytest.mark.conformance("swarm.security.master-only")
async def test_only_the_master_decides_joins_kicks_and_transfers(pair: Pair) -> None:
    beta = pair.beta.node
    with pytest.raises(SwarmError) as caught:
        await beta.kick(pair.swarm_id, "alpha")
    assert (caught.value.status, caught.value.code) == (403, "NOT_MASTER")
    with pytest.raises(SwarmError) as caught:
        await beta.transfer(pair.swarm_id, "beta")
    assert (caught.value.status, caught.value.code) == (403, "NOT_MASTER")
    with pytest.raises(SwarmError) as caught:
        beta.invite(pair.swarm_id)
    assert (caught.value.status, caught.value.code) == (403, "INVITES_DISABLED")
    token = pair.alpha.node.invite(pair.swarm_id).token
    answer = await http(pair.pki, "POST", f"{pair.beta.endpoint}/join", {
        "type": "system", "action": "join_request", "invite_token": token,
        "sender": {"agent_id": "x", "endpoint": "https://x.example/swarm",
                   "public_key": Identity.generate().public_key},
    })  # fmt: skip
    _refused(answer, 403, "NOT_MASTER")


async def test_join_requests_are_checked_field_by_field(pair: Pair) -> None:
    token = pair.alpha.node.invite(pair.swarm_id).token
    good = {
        "type": "system", "action": "join_request", "invite_token": token,
        "sender": {"agent_id": "x", "endpoint": "https://x.example/swarm",
                   "public_key": Identity.generate().public_key},
    }  # fmt: skip
    url = f"{pair.alpha.endpoint}/join"
    for changes, field in (
        ({"action": "leave"}, "action"),
        ({"invite_token": 7}, "invite_token"),
        ({"sender": {**good["sender"], "public_key": "c2hvcnQ="}}, "sender.public_key"),
        ({"sender": {**good["sender"], "endpoint": "ftp://x"}}, "sender.endpoint"),
    ):
        answer = await http(pair.pki, "POST", url, {**good, **changes})
        _refused(answer, 400, "INVALID_FORMAT", field)
