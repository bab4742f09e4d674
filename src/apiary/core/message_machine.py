"""The message lifecycle of RFC 11 and Appendix C as a pure, table-driven machine.

States: SENT -> RECEIVED (durably admitted) -> READ (dequeued by the agent) -> FULFILLED,
with REJECTED, FAILED, TIMED_OUT and RETRYING (redelivery of an unacknowledged message).
`MessageMachine.step(state, event)` returns the next state and the effects the engine must
perform; an input the table has no row for raises `IllegalTransitionError` and changes nothing.

The acknowledgement deadline (RFC 11: 10 s to RECEIVED) runs from a hand-out to the
recipient's stream, not from admission: DELIVER and REDELIVER start it, and STREAM_LOST stops
it when the stream that held the message ends before any ACK. A message that no stream holds
waits for its recipient, bounded by its TTL (TTL_EXPIRE) and the router's maximum age
(AGE_EXPIRE); both fail it into the DLQ and NACK the producer. So an outage of the recipient
or of the coordinator times nothing out; a connected recipient that does not acknowledge
still does (ACK_TIMEOUT).

Late acknowledgements (RFC 11.1):
1. TIMED_OUT + ACK: recorded and logged with both timestamps; the state stays TIMED_OUT.
2. RETRYING + ACK: the redelivery is cancelled and the message takes the ACK'd state.
3. FULFILLED/REJECTED/FAILED + ACK: ignored for state, logged for audit.
4. Any ACK of a message with an idempotency token updates the token's cache entry (the
   engine applies `UpdateIdempotency`, whose rules keep the earliest successful completion).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from apiary.core.envelope import AckStage
from apiary.core.machine import TransitionTable
from apiary.core.machine import mermaid as mermaid_of
from apiary.core.records import MessageState

S = MessageState


class MessageInput(StrEnum):
    ADMIT = "ADMIT"
    """Durably recorded for the recipient."""
    DELIVER = "DELIVER"
    """Handed to the recipient's stream for the first time: the ACK deadline starts."""
    REDELIVER = "REDELIVER"
    """Handed again after the stream that carried it was lost before any ACK (or after a
    restart): the ACK deadline starts afresh."""
    STREAM_LOST = "STREAM_LOST"
    """The recipient's last stream ended while holding the message, unacknowledged: the ACK
    deadline stops and the message waits for the next stream."""
    ACK_RECEIVED = "ACK_RECEIVED"
    ACK_READ = "ACK_READ"
    ACK_FULFILLED = "ACK_FULFILLED"
    ACK_REJECTED = "ACK_REJECTED"
    ACK_FAILED = "ACK_FAILED"
    ACK_TIMED_OUT = "ACK_TIMED_OUT"
    ACK_TIMEOUT = "ACK_TIMEOUT"
    """The acknowledgement deadline (10 s by default) passed with no ACK."""
    TTL_EXPIRE = "TTL_EXPIRE"
    AGE_EXPIRE = "AGE_EXPIRE"
    """Waited for its recipient longer than the router's maximum age (`max_age_s`) with no
    stream holding it and no acknowledgement."""
    DELIVERIES_EXHAUSTED = "DELIVERIES_EXHAUSTED"
    """Handed out the maximum number of times without any acknowledgement (retry budget)."""


ACK_INPUTS = {
    AckStage.RECEIVED: MessageInput.ACK_RECEIVED,
    AckStage.READ: MessageInput.ACK_READ,
    AckStage.FULFILLED: MessageInput.ACK_FULFILLED,
    AckStage.REJECTED: MessageInput.ACK_REJECTED,
    AckStage.FAILED: MessageInput.ACK_FAILED,
    AckStage.TIMED_OUT: MessageInput.ACK_TIMED_OUT,
}


class Effect(StrEnum):
    PERSIST = "PERSIST"
    """Record the new state (with the error code and acknowledged stage)."""
    START_ACK_TIMER = "START_ACK_TIMER"
    """Arm the ACK deadline (`ack_timeout_s` from now): a stream holds the message."""
    CANCEL_ACK_TIMER = "CANCEL_ACK_TIMER"
    """No ACK is due any more: acknowledged, finished, or no stream holds the message."""
    FORWARD_ACK = "FORWARD_ACK"
    """Deliver the agent's ACK to the message's producer."""
    NACK = "NACK"
    """Send the producer a negative ACK naming the message, the stage and the error code."""
    DEAD_LETTER = "DEAD_LETTER"
    """Move the message to the DLQ with its diagnostic context (RFC 21.1)."""
    UPDATE_IDEMPOTENCY = "UPDATE_IDEMPOTENCY"
    RELEASE_CREDIT = "RELEASE_CREDIT"
    """A terminal state frees the producer's credit at the receiver (RFC 13.1)."""
    LOG_LATE_ACK = "LOG_LATE_ACK"
    """Record a late or redundant ACK in the event log (RFC 11.1)."""


@dataclass(frozen=True, slots=True)
class Step:
    state: MessageState
    effects: tuple[Effect, ...]
    late: bool = False
    """True when the input was an ACK that arrived after the message's fate was decided."""


E = Effect
_TERMINAL_ACK = (
    E.PERSIST,
    E.CANCEL_ACK_TIMER,
    E.FORWARD_ACK,
    E.UPDATE_IDEMPOTENCY,
    E.RELEASE_CREDIT,
)
_FAILED_ACK = (*_TERMINAL_ACK, E.DEAD_LETTER)
_LATE = (E.LOG_LATE_ACK,)
_LATE_WITH_CACHE = (E.LOG_LATE_ACK, E.UPDATE_IDEMPOTENCY, E.FORWARD_ACK)


def _acks(received: MessageState, read_from: MessageState) -> dict[MessageInput, Step]:
    """The ACK rows of a live state; `received` is where an ACK RECEIVED leads."""
    return {
        MessageInput.ACK_RECEIVED: Step(
            received, (E.PERSIST, E.CANCEL_ACK_TIMER, E.FORWARD_ACK, E.UPDATE_IDEMPOTENCY)
        ),
        MessageInput.ACK_READ: Step(
            read_from, (E.PERSIST, E.CANCEL_ACK_TIMER, E.FORWARD_ACK, E.UPDATE_IDEMPOTENCY)
        ),
        MessageInput.ACK_FULFILLED: Step(S.FULFILLED, _TERMINAL_ACK),
        MessageInput.ACK_REJECTED: Step(S.REJECTED, _FAILED_ACK),
        MessageInput.ACK_FAILED: Step(S.FAILED, _FAILED_ACK),
        MessageInput.ACK_TIMED_OUT: Step(S.TIMED_OUT, (*_TERMINAL_ACK, E.NACK)),
    }


def _expiry() -> dict[MessageInput, Step]:
    return {
        MessageInput.ACK_TIMEOUT: Step(
            S.TIMED_OUT, (E.PERSIST, E.NACK, E.UPDATE_IDEMPOTENCY, E.RELEASE_CREDIT)
        ),
        MessageInput.TTL_EXPIRE: Step(
            S.FAILED,
            (
                E.PERSIST,
                E.CANCEL_ACK_TIMER,
                E.NACK,
                E.DEAD_LETTER,
                E.UPDATE_IDEMPOTENCY,
                E.RELEASE_CREDIT,
            ),
        ),
    }


_EXHAUSTED = Step(
    S.FAILED,
    (E.PERSIST, E.CANCEL_ACK_TIMER, E.NACK, E.DEAD_LETTER, E.UPDATE_IDEMPOTENCY,
     E.RELEASE_CREDIT),
)  # fmt: skip
"""Given up on as undeliverable: the retry budget spent, or the maximum age passed."""


def _waiting(state: MessageState) -> dict[MessageInput, Step]:
    """The rows of a message that no ACK has reached yet (RECEIVED or RETRYING, in `state`):
    a stream losing it stops its deadline; waiting too long, or too many hand-outs, fail it."""
    return {
        MessageInput.STREAM_LOST: Step(state, (E.CANCEL_ACK_TIMER,)),
        MessageInput.AGE_EXPIRE: _EXHAUSTED,
        MessageInput.DELIVERIES_EXHAUSTED: _EXHAUSTED,
    }


def _late(state: MessageState, *, cache: bool) -> dict[MessageInput, Step]:
    effects = _LATE_WITH_CACHE if cache else _LATE
    return {i: Step(state, effects, late=True) for i in ACK_INPUTS.values()}


def _table() -> dict[MessageState, dict[MessageInput, Step]]:
    return {
        # Admitted, the message waits for a stream: no ACK is due before a hand-out.
        S.SENT: {MessageInput.ADMIT: Step(S.RECEIVED, (E.PERSIST,))},
        S.RECEIVED: {
            MessageInput.DELIVER: Step(S.RECEIVED, (E.START_ACK_TIMER,)),
            MessageInput.REDELIVER: Step(S.RETRYING, (E.PERSIST, E.START_ACK_TIMER)),
            **_waiting(S.RECEIVED),
            **_acks(S.RECEIVED, S.READ),
            **_expiry(),
        },
        S.RETRYING: {
            MessageInput.REDELIVER: Step(S.RETRYING, (E.START_ACK_TIMER,)),
            **_waiting(S.RETRYING),
            **_acks(S.RECEIVED, S.READ),
            **_expiry(),
        },
        S.READ: {
            MessageInput.REDELIVER: Step(S.READ, ()),
            # An ACK RECEIVED after READ never moves the message backwards.
            **_acks(S.READ, S.READ),
            MessageInput.TTL_EXPIRE: _expiry()[MessageInput.TTL_EXPIRE],
        },
        # RFC 11.1 rule 1: a timed-out message keeps its state; the ACK still counts for
        # the idempotency cache (rule 4) and reaches the producer.
        S.TIMED_OUT: _late(S.TIMED_OUT, cache=True),
        # Rule 3: terminal states ignore ACKs for state purposes and log them.
        S.FULFILLED: _late(S.FULFILLED, cache=False),
        S.REJECTED: _late(S.REJECTED, cache=False),
        S.FAILED: _late(S.FAILED, cache=False),
    }


class MessageMachine:
    """The transition table, with `step` as its operation (`allows` and `step_if_allowed`
    ask it without raising)."""

    TABLE: dict[MessageState, dict[MessageInput, Step]] = _table()
    TRANSITIONS: TransitionTable[MessageState, MessageInput, Step] = TransitionTable(TABLE)

    @classmethod
    def step(cls, state: MessageState, event: MessageInput) -> Step:
        """The row for (state, event); IllegalTransitionError when there is none."""
        return cls.TRANSITIONS.step(state, event)

    @classmethod
    def allows(cls, state: MessageState, event: MessageInput) -> bool:
        return cls.TRANSITIONS.allows(state, event)

    @classmethod
    def step_if_allowed(cls, state: MessageState, event: MessageInput) -> Step | None:
        """`step` where `allows`, else None: one lookup for both (every ACK asks).

        The Router calls this once per ACK and per timer: it reads the rows directly, since
        going through `TRANSITIONS.get` costs a second call (about 200 ns, measured).
        """
        return cls.TABLE[state].get(event)


_DEADLINE_INPUTS = (MessageInput.DELIVER, MessageInput.REDELIVER, MessageInput.STREAM_LOST)
"""The inputs that start or stop the ACK deadline: drawn even where they keep the state."""


def _deadline_note(state: MessageState, event: MessageInput, step: Step) -> str:
    if event not in _DEADLINE_INPUTS:
        return ""
    if Effect.START_ACK_TIMER in step.effects:
        return " (ACK deadline starts)"
    return " (ACK deadline stops)" if Effect.CANCEL_ACK_TIMER in step.effects else ""


def mermaid() -> str:
    """The state diagram of the table (docs/message-lifecycle.md is generated from it): every
    row that changes the state, and the hand-out and stream rows that start or stop the ACK
    deadline (self-loops that only log or repeat an ACK are left out)."""
    rows = {
        state: {
            event: step
            for event, step in inputs.items()
            if step.state is not state or _deadline_note(state, event, step)
        }
        for state, inputs in MessageMachine.TABLE.items()
    }
    terminal = (s for s in S if s.terminal)
    return mermaid_of(
        rows, (S.SENT,), terminal, lambda step: step.state, loops=True, mark=_deadline_note
    )
