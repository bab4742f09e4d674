"""A dispatch the router refuses: the router NACKs every refused envelope to its producer, and
the Scheduler, the producer of its DATA envelopes, dispatches under its own lock. The NACK
follows once the send returned (it used to call the Scheduler back inside the send, which
waited for the lock its own caller held: the Scheduler froze, every later call with it). A
full buffer, or a store that cannot take the envelope now, leaves the task queued and tried
again after `retry_after_s`."""

from __future__ import annotations

import asyncio
import json

from apiary.core.envelope import AckStage
from apiary.engine.scheduler.scheduler import Submission
from apiary.engine.settings import RouterSettings, SchedulerSettings
from apiary.testing.engine import open_test_engine

WAIT_S = 10.0


async def test_a_dispatch_that_meets_a_full_buffer_waits_and_goes_out_later() -> None:
    settings = SchedulerSettings(retry_after_s=1.0)
    async with open_test_engine(RouterSettings(buffer_capacity=1), scheduler=settings) as h:
        await h.register("worker")
        await h.register("alice")
        scheduler = h.engine.scheduler
        filler = await h.send("alice", "worker", {"fill": 1})
        assert filler.accepted
        await scheduler.agent_ready("worker")
        params = json.dumps({"n": 1}).encode()
        submitting = asyncio.ensure_future(
            scheduler.submit(Submission("worker", "t1", 0, params, scope="repo:a"))
        )
        done, _ = await asyncio.wait({submitting}, timeout=WAIT_S)
        assert done, "the Scheduler froze: its dispatch waits for the NACK of its own send"
        submitted = submitting.result()
        assert submitted.accepted and submitted.task is not None
        assert submitted.task.state == "QUEUED"
        (refused,) = await h.events("message.rejected")
        assert (refused.actor, refused.details["error_code"]) == ("scheduler", "buffer_full")
        # The Scheduler takes calls again (its lock is free), and the NACK changed nothing.
        await asyncio.wait_for(scheduler.agent_ready("worker"), WAIT_S)
        assert (await scheduler.find("t1")).state == "QUEUED"

        assert (await h.ack("worker", filler.message_id, AckStage.FULFILLED)).accepted
        h.clock.advance(settings.retry_after_s)
        await asyncio.wait_for(scheduler.fire_due(), WAIT_S)
        dispatched = await scheduler.find("t1")
        assert (dispatched.state, dispatched.attempts) == ("DISPATCHED", 1)
