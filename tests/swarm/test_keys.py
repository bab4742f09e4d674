"""The public-key cache: seeded from the member list, refreshed from GET /info after the TTL
and once when a signature fails (a rotated key), never more than once per cooldown, and
always from the member's recorded endpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apiary.swarm import membership as ms
from apiary.swarm.errors import SwarmError
from apiary.swarm.keycache import KeyCache
from apiary.swarm.keys import Identity, sign_message
from apiary.swarm.statefile import StateFile, save_state
from apiary.swarm.wire import Sender, SwarmMessage, format_timestamp
from apiary.testing.clock import FakeClock
from tests.swarm.peers import open_peer
from tests.swarm.pki import Pki

SWARM = "550e8400-e29b-41d4-a716-446655440000"
ENDPOINT = "https://beta.example/swarm"


class InfoServer:
    """What GET /info answers, and who asked: a fake peer for the cache's fetch function."""

    def __init__(self, identity: Identity, agent_id: str = "beta") -> None:
        self.identity = identity
        self.agent_id = agent_id
        self.asked: list[str] = []
        self.down = False

    async def __call__(self, url: str) -> dict[str, Any] | None:
        self.asked.append(url)
        if self.down:
            return None
        return {"agent_id": self.agent_id, "public_key": self.identity.public_key}


def _message(identity: Identity, clock: FakeClock, content: str = "hi") -> SwarmMessage:
    draft = SwarmMessage(
        "6ba7b810-9dad-41d1-80b4-00c04fd430c8", format_timestamp(clock.now()),
        Sender("beta", "https://claimed-by-the-message.example/swarm"), "alpha", SWARM,
        "message", content,
    )  # fmt: skip
    return sign_message(identity, draft)


def _setup(tmp_path: Path, beta: Identity) -> tuple[StateFile, ms.Member]:
    member = ms.Member("beta", ENDPOINT, beta.public_key, "2023-11-14T22:13:20.000Z")
    state = ms.MembershipState("alpha")
    path = tmp_path / "state.json"
    save_state(path, state)
    return StateFile(path), member


@pytest.mark.conformance("swarm.keys.refresh-after-ttl")
async def test_a_member_key_is_cached_then_refreshed_after_the_ttl(tmp_path: Path) -> None:
    beta, clock = Identity.generate(), FakeClock()
    states, member = _setup(tmp_path, beta)
    info = InfoServer(beta)
    cache = KeyCache(states, info, clock, ttl_s=86_400.0)
    await cache.verify(_message(beta, clock), member)
    entry = states.load().public_keys["beta"]
    assert (entry.public_key, entry.endpoint) == (beta.public_key, f"{ENDPOINT}/info")
    assert entry.fetched_at == format_timestamp(clock.now())
    assert info.asked == []  # the member list's key needed no fetch
    clock.advance(86_401.0)
    await cache.verify(_message(beta, clock), member)
    assert info.asked == [f"{ENDPOINT}/info"]  # the recorded endpoint, not the message's
    assert states.load().public_keys["beta"].fetched_at == format_timestamp(clock.now())


@pytest.mark.conformance("swarm.keys.refresh-on-failure")
async def test_a_rotated_key_is_fetched_once_and_forgeries_stay_refused(tmp_path: Path) -> None:
    old, new, clock = Identity.generate(), Identity.generate(), FakeClock()
    states, member = _setup(tmp_path, old)
    info = InfoServer(new)
    cache = KeyCache(states, info, clock, cooldown_s=60.0)
    await cache.verify(_message(new, clock), member)  # the cached key fails, /info has it
    assert states.load().public_keys["beta"].public_key == new.public_key
    assert len(info.asked) == 1
    forger = Identity.generate()
    for _ in range(3):
        with pytest.raises(SwarmError) as caught:
            await cache.verify(_message(forger, clock), member)
        assert (caught.value.status, caught.value.code) == (401, "INVALID_SIGNATURE")
    assert len(info.asked) == 1  # within the cooldown: forgeries cause no fetch
    clock.advance(61.0)
    for _ in range(3):
        with pytest.raises(SwarmError):
            await cache.verify(_message(forger, clock), member)
    assert len(info.asked) == 2  # one refresh per cooldown
    assert states.load().public_keys["beta"].public_key == new.public_key


async def test_an_unreachable_or_lying_peer_keeps_the_known_key(tmp_path: Path) -> None:
    beta, clock = Identity.generate(), FakeClock()
    states, member = _setup(tmp_path, beta)
    info = InfoServer(Identity.generate(), agent_id="someone-else")
    cache = KeyCache(states, info, clock, ttl_s=10.0, cooldown_s=0.0)
    await cache.verify(_message(beta, clock), member)
    clock.advance(11.0)
    await cache.verify(_message(beta, clock), member)  # /info answers for another agent
    info.down = True
    clock.advance(11.0)
    await cache.verify(_message(beta, clock), member)  # /info does not answer
    assert states.load().public_keys["beta"].public_key == beta.public_key
    assert len(info.asked) == 2


async def test_peers_learn_a_rotated_key_over_https(tmp_path: Path, pki: Pki) -> None:
    async with open_peer(tmp_path, "alpha", pki) as alpha, open_peer(tmp_path, "beta", pki) as beta:
        sid = alpha.node.create("builders").swarm_id
        await beta.node.join(alpha.node.invite(sid).url)
        _, (row,) = await beta.node.send(sid, "alpha", "before")
        assert row.status == "delivered"
        beta.node.rotate(Identity.generate())
        _, (row,) = await beta.node.send(sid, "alpha", "after")
        assert row.status == "delivered"
        assert alpha.node.state.public_keys["beta"].public_key == beta.node.identity.public_key
        contents = [e.mail.content for e in await alpha.store.swarm.list_recent(sid)]
        assert contents[:2] == ["after", "before"]
