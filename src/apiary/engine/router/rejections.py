"""What the router tells producers about their failed messages: every refusal at admission
answered (the call's outcome), logged, counted and NACKed (or answered with the cached
outcome of a duplicate); and the NACKs of messages that failed later (`MessageLifecycle`) or
of transfers that never completed.

A refused envelope is not dead-lettered: it was never admitted, so the router never held it
and its producer has it and the reason in hand. The DLQ (RFC 21.1) takes what was admitted
and then failed (`MessageLifecycle`); docs/decisions.md, "Refusals are not dead letters"."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from apiary.core.envelope import Ack, AckStage, Envelope, MessageType
from apiary.core.ids import is_uuid4
from apiary.engine.eventlog import EventRecorder
from apiary.engine.notices import COORDINATOR, NoticeFactory
from apiary.engine.registry import Registry
from apiary.engine.router.admission import LocalEndpoint, Outbound, SendOutcome
from apiary.engine.router.stats import UNKNOWN_AGENT, RouterStats
from apiary.engine.settings import RouterSettings
from apiary.errors import ApiaryError

log = logging.getLogger("apiary.router")

Deliver = Callable[[str, Envelope], Awaitable[object]]
"""Sends a coordinator notice to one agent (`Router.notify`)."""


class Rejections:
    def __init__(
        self, settings: RouterSettings, registry: Registry, events: EventRecorder,
        notices: NoticeFactory, stats: RouterStats, endpoints: Mapping[str, LocalEndpoint],
        deliver: Deliver,
    ) -> None:  # fmt: skip
        self._settings = settings
        self._registry = registry
        self._events = events
        self._notices = notices
        self._stats = stats
        self._endpoints = endpoints
        self._deliver = deliver
        self._background: set[asyncio.Future[None]] = set()
        """Refusals' answers on their way to coordinator endpoints (`rejected`)."""

    async def rejected(self, item: Outbound, outcome: SendOutcome) -> None:
        """Never silent: count it, log it, NACK the producer (the call answered it already)."""
        env = item.envelope
        error = outcome.error
        assert error is not None
        recipient = item.recipient or error.details.get("recipient", "")
        # A metric label per registered agent only: a name nobody registered (a typo, a
        # probe) would make a series of its own each time.
        labelled = recipient if self._registry.known(recipient) is not None else UNKNOWN_AGENT
        self._stats.enqueue_rejects[(labelled, error.code)] += 1
        self._stats.admission_refused[error.code] += 1
        await self._events.record(
            "message.rejected",
            env.producer_id,
            correlation_id=env.correlation_id,
            agent_id=recipient,
            message_id=env.message_id,
            error_code=error.code,
            reason=error.message,
        )
        if error.code == "duplicate_detected" and outcome.details:
            answer = self._notify_duplicate(env, outcome)
        elif env.message_type is not MessageType.ACKNOWLEDGEMENT:
            answer = self.nack(env.producer_id, env.message_id, env.correlation_id,
                               AckStage.REJECTED, error.code, error.message, "SENT")  # fmt: skip
        else:
            return
        if env.producer_id in self._endpoints:
            # A coordinator component's own send, which this refusal answers: it may hold its
            # lock around the send (the Scheduler does around a dispatch or a preemption), so
            # the answer follows once the send returned instead of calling it back inside it.
            self._later(answer)
        else:
            await answer

    def _later(self, work: Coroutine[Any, Any, None]) -> None:
        job = asyncio.ensure_future(work)
        self._background.add(job)
        job.add_done_callback(self._done)

    def _done(self, job: asyncio.Future[None]) -> None:
        self._background.discard(job)
        if not job.cancelled() and job.exception() is not None:
            log.warning("a refusal's answer to a coordinator endpoint failed: %s", job.exception())

    async def _notify_duplicate(self, env: Envelope, outcome: SendOutcome) -> None:
        stage = AckStage[outcome.details.get("original_status", "FULFILLED")]
        ack = Ack(env.message_id, stage, "duplicate_detected", outcome.reason)
        # The ACK's error_code says DUPLICATE_DETECTED; the cached error travels beside it.
        extra = dict(outcome.details)
        extra["original_error_code"] = extra.pop("error_code", "")
        notice = self._notices.ack(ack, env.correlation_id, extra)
        await self._deliver(env.producer_id, notice)

    async def nack(
        self, producer: str, message_id: str, correlation_id: str, stage: AckStage,
        code: str, note: str, failed_stage: str,
    ) -> None:  # fmt: skip
        """Tell `producer` that its message failed at `failed_stage` (nothing for the
        coordinator's own messages or a producer no longer registered)."""
        endpoint = self._endpoints.get(producer)
        if endpoint is None and (
            producer == COORDINATOR or await self._registry.find(producer) is None
        ):
            return
        self._stats.nacks[(producer, code)] += 1
        if self._settings.strict_correlation_ids and not is_uuid4(correlation_id):
            # The refused envelope's own correlation_id is what was wrong with it: the NACK
            # cannot echo it and carries one of its own (its ack_for_message_id links them).
            correlation_id = ""
        ack = Ack(message_id, stage, code, note)
        notice = self._notices.ack(ack, correlation_id, {"failed_stage": failed_stage})
        if endpoint is not None:
            await endpoint(notice)
        else:
            await self._deliver(producer, notice)

    async def nack_transfer(
        self, producer: str, transfer_id: str, correlation_id: str, error: ApiaryError
    ) -> None:
        """A chunked transfer that failed (`Transfers`): NACKed as a message that did."""
        await self.nack(producer, transfer_id, correlation_id, AckStage.FAILED, error.code,
                        error.message, "RECEIVED")  # fmt: skip
