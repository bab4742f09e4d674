"""Concurrent state changes of one message on two replicas (docs/cluster.md, "State changes
decided by the store"): two coordinators serving one PostgreSQL schema. A state change is
stored only while the message is still in the state it was decided from; one refused is
decided again from the message as stored. So two terminal ACKs of one message sent at
once to the two replicas record one dead letter and forward one ACK to its producer, and
an ACK racing the ACK deadline's firing on the other replica leaves the message as the
two in either order would (READ, acknowledged)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from apiary.core.envelope import AckStage, MessageType
from apiary.core.message_machine import MessageInput
from apiary.core.records import MessageState
from apiary.engine.router.admission import is_notice
from apiary.server.coordinator import Coordinator
from tests.server.test_cluster_replicas import (
    _ack,
    _read,
    _register,
    _send,
    _stop,
    _two,
    _until,
)

pytestmark = pytest.mark.postgres

ROUNDS = 5


async def _acks_for(replica: Coordinator, producer: str, message_id: str) -> list[AckStage]:
    """The stages of the ACKs and NACKs of `message_id` stored for `producer` (who has no
    stream), in order."""
    codec = replica.router.codec
    stages = []
    for stored in await replica.store.messages.inbox(producer, 0, 1000):
        if stored.message_type != int(MessageType.ACKNOWLEDGEMENT) or not is_notice(stored):
            continue
        ack = codec.decode_ack(codec.decode(stored.envelope))
        if ack.ack_for_message_id == message_id:
            stages.append(ack.ack_stage)
    return stages


async def test_two_failed_acks_of_one_message_at_once_record_one_dead_letter(
    tmp_path: Path, url: str
) -> None:
    async with _two(tmp_path, url) as (a, b):
        await _register(a, "bob")
        await _register(a, "alice")
        await _until(lambda: b.registry.known("bob") is not None, "B knows bob")
        bob = _read(a, "bob")
        for n in range(ROUNDS):
            sent = await _send(b, "alice", "bob", {"n": n})
            await _until(lambda n=n: len(bob.messages) == n + 1, "bob's stream receives it")
            await asyncio.gather(
                _ack(a, "bob", sent, AckStage.FAILED), _ack(b, "bob", sent, AckStage.FAILED)
            )
            stored = await a.store.messages.get(sent)
            assert stored is not None and stored.state is MessageState.FAILED
            entries = [e for e in await b.store.dlq.list() if e.message_id == sent]
            assert len(entries) == 1, f"round {n}: {len(entries)} dead letters"
            assert await _acks_for(a, "alice", sent) == [AckStage.FAILED]
        await _stop(bob)


async def test_an_ack_racing_its_deadline_on_the_other_replica_is_not_lost(
    tmp_path: Path, url: str
) -> None:
    async with _two(tmp_path, url) as (a, b):
        await _register(a, "bob")
        await _register(a, "alice")
        await _until(lambda: b.registry.known("bob") is not None, "B knows bob")
        bob = _read(a, "bob")
        for n in range(ROUNDS):
            sent = await _send(b, "alice", "bob", {"n": n})
            await _until(lambda n=n: len(bob.messages) == n + 1, "bob's stream receives it")
            # The ACK on A, the deadline's input applied on B at the same moment (as the
            # partition's owner applies it: `OwnerTimers`, through `MessageLifecycle.fire`).
            now = b.router.clock_now()
            await asyncio.gather(
                _ack(a, "bob", sent, AckStage.READ),
                b.router.lifecycle.fire(sent, MessageInput.ACK_TIMEOUT, now, "ack_timeout"),
            )
            # Either the ACK came first (READ; the deadline then found no ACK due) or the
            # deadline did (TIMED_OUT, its NACK; the ACK then late, forwarded as it came):
            # never a mix of the two, which the later write made when it won whatever the
            # earlier had stored.
            stored = await a.store.messages.get(sent)
            assert stored is not None
            stages = await _acks_for(a, "alice", sent)
            if stored.state is MessageState.READ:
                assert (stored.acked_stage, stages) == ("READ", [AckStage.READ]), n
            else:
                assert (stored.state, stored.acked_stage) == (MessageState.TIMED_OUT, ""), n
                assert sorted(stages) == sorted([AckStage.READ, AckStage.TIMED_OUT]), n
        await _stop(bob)
