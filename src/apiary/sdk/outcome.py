"""What became of a sent message, as its producer sees it (`apiary send --wait`).

A producer that is a registered agent hears about its message on its own inbound stream:
the recipient's acknowledgements (RECEIVED, READ, then FULFILLED, REJECTED or FAILED), which
the coordinator forwards; the coordinator's NACKs (TIMED_OUT when no ACK came in time, FAILED
when the message expired or could not be delivered); and the replies the recipient sends back
in the message's correlation. `wait_for_outcome` follows one message through them:

    async with Connection("cli", coordinator=address) as me:
        sent = await me.send("echo", {"hello": "world"})
        outcome = await wait_for_outcome(me, sent, me.deliveries(), wait_s=30)
        outcome.replies, outcome.stage, outcome.note

A producer that is not a registered agent hears nothing: ACKs of its messages end at the
coordinator, and replies to it are refused (docs/decisions.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace

from apiary.core.envelope import AckStage, Envelope, MessageType
from apiary.errors import ApiaryError
from apiary.sdk.connection import Connection, Delivery
from apiary.wire.convert import ack_from_payload

TERMINAL_STAGES = frozenset(
    {AckStage.FULFILLED, AckStage.REJECTED, AckStage.FAILED, AckStage.TIMED_OUT}
)
"""The stages that end a message: nothing more is acknowledged after them."""

OnReply = Callable[[Envelope], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Outcome:
    """Where a sent message got to: the furthest stage acknowledged (by its recipient, or by
    the coordinator for a NACK), with that ACK's error code and note, and the replies that
    came in its correlation."""

    message_id: str
    stage: AckStage = AckStage.ACK_STAGE_UNSPECIFIED
    """ACK_STAGE_UNSPECIFIED: nothing acknowledged yet."""
    by: str = ""
    """Who acknowledged `stage`: the recipient, or `coordinator` (a NACK)."""
    error_code: str = ""
    note: str = ""
    replies: tuple[Envelope, ...] = ()

    @property
    def finished(self) -> bool:
        """Whether the message reached a terminal stage."""
        return self.stage in TERMINAL_STAGES


async def wait_for_outcome(
    connection: Connection,
    sent: Envelope,
    deliveries: AsyncIterator[Delivery],
    *,
    wait_s: float,
    on_reply: OnReply | None = None,
) -> Outcome:
    """Read `deliveries` (the inbound stream of `connection`, the producer of `sent`) until
    `sent` reaches a terminal stage, or for `wait_s` seconds at most; returns the outcome
    either way (`Outcome.finished` tells which).

    The batch with the terminal ACK is read to its end (`Delivery.batch_end`), so a reply
    sent before that ACK is never left behind. Each reply (a message of another producer in
    `sent`'s correlation that is not an ACK) goes to `on_reply`, then is acknowledged
    FULFILLED. Other deliveries are not this call's: they are left unacknowledged (their ACK
    deadline runs out and their producers are told)."""
    outcome = Outcome(sent.message_id)
    try:
        async with asyncio.timeout(wait_s):
            async for delivery in deliveries:
                outcome = await _followed(connection, sent, delivery.envelope, outcome, on_reply)
                if outcome.finished and delivery.batch_end:
                    break
    except TimeoutError:
        pass
    return outcome


async def _followed(
    connection: Connection, sent: Envelope, env: Envelope, outcome: Outcome,
    on_reply: OnReply | None,
) -> Outcome:  # fmt: skip
    """`outcome` after `env`, one delivery of the producer's stream."""
    if env.message_type is MessageType.ACKNOWLEDGEMENT:
        try:
            ack = ack_from_payload(env.content_type, env.payload)
        except (ApiaryError, ValueError, KeyError, TypeError):
            return outcome  # not an ACK of anything this call can read
        if ack.ack_for_message_id != sent.message_id or outcome.finished:
            return outcome
        if ack.ack_stage < outcome.stage and ack.ack_stage not in TERMINAL_STAGES:
            return outcome  # an earlier stage arriving late changes nothing
        return replace(
            outcome, stage=ack.ack_stage, by=env.producer_id, error_code=ack.error_code,
            note=ack.note,
        )  # fmt: skip
    if env.correlation_id != sent.correlation_id or env.producer_id == sent.producer_id:
        return outcome
    if on_reply is not None:
        await on_reply(env)
    await connection.ack(env, AckStage.FULFILLED, note=f"received by {connection.agent_id}")
    return replace(outcome, replies=(*outcome.replies, env))
