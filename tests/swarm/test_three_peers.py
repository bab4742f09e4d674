"""Three Apiary peers on 127.0.0.1 over real TLS (the tests' private CA): create, invite,
join, broadcast, direct message, kick, transfer and leave, with every peer's member list
checked after each step."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from apiary.swarm import membership as ms
from apiary.swarm.courier import RetryPolicy
from apiary.swarm.errors import SwarmError
from apiary.swarm.mail import message_of
from apiary.swarm.settings import NodeSettings
from tests.swarm.peers import Peer, open_peer, until
from tests.swarm.pki import Pki


@pytest.fixture
async def trio(tmp_path: Path, pki: Pki) -> AsyncIterator[tuple[Peer, Peer, Peer]]:
    async with AsyncExitStack() as stack:
        peers = [
            await stack.enter_async_context(open_peer(tmp_path, name, pki))
            for name in ("alpha", "beta", "gamma")
        ]
        yield peers[0], peers[1], peers[2]


async def _lists(peers: tuple[Peer, ...], swarm_id: str) -> list[list[str]]:
    return [p.members(swarm_id) for p in peers]


async def _contents(peer: Peer, swarm_id: str, kind: str = "message") -> list[str]:
    return [
        e.mail.content
        for e in await peer.store.swarm.list_recent(swarm_id)
        if e.mail.message_type == kind
    ]


async def test_a_swarm_lives_and_every_member_list_follows(trio: tuple[Peer, Peer, Peer]) -> None:
    alpha, beta, gamma = trio
    swarm = alpha.node.create("builders")
    sid = swarm.swarm_id
    invite = alpha.node.invite(sid, max_uses=2)
    assert invite.url.startswith(f"swarm://{sid}@127.0.0.1:")

    joined = await beta.node.join(invite.url)
    assert joined.status == "accepted"
    assert beta.members(sid) == ["alpha", "beta"]
    assert beta.node.state.swarm(sid).master == "alpha"
    assert beta.node.state.swarm(sid).name == "builders"
    assert (await gamma.node.join(invite.url)).status == "accepted"
    everyone = ["alpha", "beta", "gamma"]
    await until(lambda: beta.members(sid) == everyone)  # member_joined, sent in the background
    assert await _lists(trio, sid) == [everyone] * 3
    # The master keeps the lifecycle notices in its own inbox.
    joins = [message_of(e.mail).system_body() for e in await alpha.store.swarm.list_recent(sid)]
    assert [(b["action"], b["agent_id"]) for b in joins] == [
        ("member_joined", "gamma"), ("member_joined", "beta"),
    ]  # fmt: skip

    message, rows = await alpha.node.broadcast(sid, "hello, builders", priority="high")
    assert sorted((r.destination, r.status, r.attempts) for r in rows) == [
        ("beta", "delivered", 1), ("gamma", "delivered", 1),
    ]  # fmt: skip
    for peer in (beta, gamma):
        (got,) = [
            e for e in await peer.store.swarm.list_recent(sid, statuses=frozenset({"unread"}))
            if e.mail.message_type == "message"
        ]  # fmt: skip
        assert got.mail.message_id == message.message_id
        assert (got.mail.content, got.mail.priority, got.mail.sender_id) == (
            "hello, builders", "high", "alpha",
        )  # fmt: skip
    assert await _contents(alpha, sid) == []  # a broadcast is not sent to oneself

    direct, _ = await beta.node.send(sid, "gamma", "just you", thread_id=message.message_id)
    assert await _contents(gamma, sid) == ["just you", "hello, builders"]
    assert await _contents(alpha, sid) == []
    thread = await gamma.store.swarm.thread_latest(message.message_id)
    assert thread is not None
    assert thread.mail.message_id == direct.message_id

    await alpha.node.kick(sid, "gamma", "idle")
    await until(lambda: gamma.members(sid) == [])
    assert await _lists(trio, sid) == [["alpha", "beta"], ["alpha", "beta"], []]
    kicked = [
        message_of(e.mail).system_body() for e in await gamma.store.swarm.list_recent(sid)
        if e.mail.message_type == "system"
    ]  # fmt: skip
    assert kicked[0]["action"] == "kicked" and kicked[0]["reason"] == "idle"
    # gamma is out: its own node refuses to send to the swarm, and beta's refuses what gamma
    # signs and posts anyway.
    with pytest.raises(SwarmError, match="SWARM_NOT_FOUND"):
        await gamma.node.send(sid, "beta", "still here?")
    forced = gamma.node.courier.compose(sid, "beta", "message", "still here?")
    (row,) = await gamma.node.courier.deliver(forced, {"beta": beta.endpoint})
    assert (row.status, row.attempts) == ("failed", 1)
    assert "403 NOT_MEMBER" in row.error

    await alpha.node.transfer(sid, "beta")
    assert [p.node.state.swarm(sid).master for p in (alpha, beta)] == ["beta", "beta"]
    await alpha.node.leave(sid)
    assert await _lists(trio, sid) == [[], ["beta"], []]
    left = [message_of(e.mail).system_body() for e in await beta.store.swarm.list_recent(sid)]
    assert [b["action"] for b in left[:3]] == ["member_left", "master_changed", "master_transfer"]


@pytest.mark.conformance("swarm.membership.require-approval")
async def test_a_join_waits_for_the_masters_approval(tmp_path: Path, pki: Pki) -> None:
    async with open_peer(tmp_path, "alpha", pki) as alpha, open_peer(tmp_path, "beta", pki) as beta:
        sid = alpha.node.create("vetted", ms.Settings(require_approval=True)).swarm_id
        url = alpha.node.invite(sid, max_uses=1).url
        assert (await beta.node.join(url)).status == "pending"
        assert (await beta.node.join(url)).status == "pending"  # asking again spends nothing
        assert [m.agent_id for m in alpha.node.state.swarm(sid).pending] == ["beta"]
        assert beta.members(sid) == []
        await alpha.node.approve(sid, "beta")
        assert alpha.members(sid) == ["alpha", "beta"]
        result = await beta.node.join(url)  # single-use, but beta is a member now
        assert result.status == "accepted"
        assert beta.members(sid) == ["alpha", "beta"]
        assert beta.node.state.swarm(sid).settings.require_approval


async def test_inbox_statuses_only_move_forward(tmp_path: Path, pki: Pki) -> None:
    async with open_peer(tmp_path, "alpha", pki) as alpha, open_peer(tmp_path, "beta", pki) as beta:
        sid = alpha.node.create("builders").swarm_id
        await beta.node.join(alpha.node.invite(sid).url)
        message, _ = await beta.node.send(sid, "alpha", "file me")
        read = await alpha.node.mark(message.message_id, "read")
        assert read.read_at is not None
        assert (await alpha.node.mark(message.message_id, "archived")).status == "archived"
        with pytest.raises(SwarmError) as caught:
            await alpha.node.mark(message.message_id, "unread")
        assert (caught.value.status, caught.value.field) == (400, "status")
        with pytest.raises(SwarmError) as caught:
            await alpha.node.mark("6ba7b810-9dad-41d1-80b4-00c04fd430c8", "read")
        assert caught.value.status == 404


async def test_a_peer_that_is_gone_gets_the_message_once_it_is_back(
    tmp_path: Path, pki: Pki
) -> None:
    # Nothing lost: a destination that does not answer is retrying, tried again in the
    # background (here one round at a time, due at once), and delivered when it is back.
    patient = NodeSettings(retry_delays=(0.0, 0.0), retry=RetryPolicy(first_backoff_s=0.0))
    async with open_peer(tmp_path, "alpha", pki, settings=patient) as alpha:
        sid = alpha.node.create("builders").swarm_id
        async with open_peer(tmp_path, "beta", pki) as beta:
            await beta.node.join(alpha.node.invite(sid).url)
            port = int(beta.endpoint.split(":")[2].split("/")[0])
        message, (row,) = await alpha.node.send(sid, "beta", "are you there?")
        assert (row.destination, row.status, row.attempts) == ("beta", "retrying", 3)
        assert "POST https://127.0.0.1:" in row.error
        assert row.next_attempt_at >= row.updated_at
        assert await alpha.store.swarm.outbox_get(message.message_id) == [row]
        courier, endpoint_of = alpha.node.courier, alpha.node.endpoint_of
        (again,) = await courier.retry_due(endpoint_of)
        assert (again.status, again.attempts) == ("retrying", 4)
        async with open_peer(tmp_path, "beta", pki, port=port) as beta:
            (delivered,) = await courier.retry_due(endpoint_of)
            assert (delivered.status, delivered.attempts, delivered.error) == ("delivered", 5, "")
            assert await _contents(beta, sid) == ["are you there?"]
        assert await alpha.store.swarm.outbox_pending() == []
        assert await courier.retry_due(endpoint_of) == []


async def test_retries_end_when_the_member_leaves_or_after_give_up_after_s(
    tmp_path: Path, pki: Pki
) -> None:
    patient = NodeSettings(retry_delays=(), retry=RetryPolicy(first_backoff_s=0.0))
    async with open_peer(tmp_path, "alpha", pki, settings=patient) as alpha:
        sid = alpha.node.create("builders").swarm_id
        for agent in ("beta", "gamma"):
            async with open_peer(tmp_path, agent, pki) as peer:
                await peer.node.join(alpha.node.invite(sid).url)
        _, rows = await alpha.node.send(sid, "broadcast", "anyone?")
        assert [(r.destination, r.status) for r in rows] == [
            ("beta", "retrying"), ("gamma", "retrying"),
        ]  # fmt: skip
        await alpha.node.kick(sid, "gamma", "gone for good")
        courier = alpha.node.courier
        courier.retry = RetryPolicy(first_backoff_s=0.0, give_up_after_s=0.0)
        ended = {r.destination: r for r in await courier.retry_due(alpha.node.endpoint_of)}
        assert ended["gamma"].status == "failed"
        assert ended["gamma"].error == f"gamma is no longer a member of {sid}"
        assert ended["beta"].status == "failed"
        assert ended["beta"].error.startswith("gave up after 2 attempts: POST https://")
        assert await alpha.store.swarm.outbox_pending() == []


async def test_an_operator_retries_a_message_that_failed(tmp_path: Path, pki: Pki) -> None:
    gives_up = NodeSettings(retry_delays=(), retry=RetryPolicy(give_up_after_s=0.0))
    async with open_peer(tmp_path, "alpha", pki, settings=gives_up) as alpha:
        sid = alpha.node.create("builders").swarm_id
        async with open_peer(tmp_path, "beta", pki) as beta:
            await beta.node.join(alpha.node.invite(sid).url)
            port = int(beta.endpoint.split(":")[2].split("/")[0])
        message, (row,) = await alpha.node.send(sid, "beta", "still there?")
        assert row.status == "failed" and row.error.startswith("gave up after 1 attempts")
        with pytest.raises(SwarmError) as caught:
            await alpha.node.retry(message.message_id, "gamma")
        assert (caught.value.status, caught.value.field) == (404, "destination")
        async with open_peer(tmp_path, "beta", pki, port=port) as beta:
            (again,) = await alpha.node.retry(message.message_id)
            assert (again.status, again.attempts) == ("delivered", 2)
            assert await _contents(beta, sid) == ["still there?"]
        # Delivered rows are left as they are.
        assert await alpha.node.retry(message.message_id) == [again]


def test_the_background_waits_double_up_to_a_ceiling() -> None:
    policy = RetryPolicy(first_backoff_s=5.0, max_backoff_s=300.0)
    assert [policy.backoff(n) for n in range(8)] == [5, 10, 20, 40, 80, 160, 300, 300]
    assert policy.backoff(10_000) == 300


async def test_background_retries_run_only_in_the_rounds_they_are_active(
    tmp_path: Path, pki: Pki
) -> None:
    # The replicas of a cluster share one outbox: the leader's rounds retry it, the others'
    # pass (docs/cluster.md, "The swarm peer").
    patient = NodeSettings(
        retry_delays=(), retry=RetryPolicy(interval_s=0.005, first_backoff_s=0.0)
    )
    async with open_peer(tmp_path, "alpha", pki, settings=patient) as alpha:
        sid = alpha.node.create("builders").swarm_id
        async with open_peer(tmp_path, "beta", pki) as beta:
            await beta.node.join(alpha.node.invite(sid).url)
            port = int(beta.endpoint.split(":")[2].split("/")[0])
        message, (row,) = await alpha.node.send(sid, "beta", "are you there?")
        assert row.status == "retrying"
        rounds: list[bool] = []
        leads = False

        def active() -> bool:
            rounds.append(leads)
            return leads

        retries = asyncio.create_task(alpha.node.courier.run(alpha.node.endpoint_of, active))
        try:
            async with open_peer(tmp_path, "beta", pki, port=port) as beta:
                await until(lambda: len(rounds) >= 5)
                (waiting,) = await alpha.store.swarm.outbox_get(message.message_id)
                assert (waiting.status, waiting.attempts) == ("retrying", row.attempts)
                leads = True
                await until(lambda: _contents(beta, sid))
                assert await _contents(beta, sid) == ["are you there?"]
            (delivered,) = await alpha.store.swarm.outbox_get(message.message_id)
            assert delivered.status == "delivered"
        finally:
            retries.cancel()
