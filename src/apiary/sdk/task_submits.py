"""The submissions of one client's `submit_task` calls, many to a call (docs/sdk.md, "How
submitting works").

Each `submit_task` queues its request here. The first goes at once in a SubmitTasks call
(apiary.v1 TaskQueryService); those queued while calls are in flight go together in the
next one, in the order they were queued, at most `MOST` to a call, and at most `IN_FLIGHT`
calls at once: concurrent submitters share calls, and the coordinator decides each call's
items together (one group commit for those it stores). A second call in flight keeps the
coordinator busy while the first one's answer travels back: with one, each call's
submitters would wait a whole round trip before the next call could leave.

Each item is answered as its own SubmitTask call would be, so each caller gets its own task,
or its own typed error; a failure of the call itself (the coordinator unreachable, the
tenant's quota) is every item's, as it would have been each call's. Calls are grouped by the
submitter they name (`apiary-submitter`, dev mode).

A submission made within a span goes alone on SubmitTask, which carries its trace context
(sdk/tracing.py): the coordinator's span of its admission is then its own. A coordinator
that answers SubmitTasks unimplemented (an older one) gets every submission on SubmitTask
from then on, the client remembering it (`fallback`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from apiary.core.limits import DEFAULT_LIMITS
from apiary.errors import ApiaryError, UnimplementedError, ValidationError, error_for_code
from apiary.sdk.task_handle import SUBMITTER_METADATA
from apiary.sdk.tracing import current
from apiary.wire import pb

if TYPE_CHECKING:
    from apiary.sdk.client import Client

MOST: Final = DEFAULT_LIMITS.submit_tasks
"""Submissions one call carries at most: the coordinator's default `[limits] submit_tasks`
(a coordinator configured with fewer says so, and its limit is kept from then on)."""

Request = pb.apiary_pb2.SubmitTaskRequest
Reply = pb.apiary_pb2.SubmitTaskReply
CALL_BYTES: Final = 3 * 1024 * 1024
"""A call's submissions, serialized, at most (one larger goes alone): well within the
coordinator's 20 MiB per message, and each answer, which repeats a task's scope but not its
params, within gRPC's default 4 MiB for what a client receives."""
IN_FLIGHT: Final = 2
"""SubmitTasks calls of one submitter in flight at most."""
_Item = tuple[Request, "asyncio.Future[Reply]"]


@dataclass(eq=False)
class _Queue:
    """The submissions of one submitter waiting for a call, and the tasks sending them."""

    items: list[_Item] = field(default_factory=list)
    senders: set[asyncio.Task[None]] = field(default_factory=set)
    sending: int = 0
    """Senders not stopped. Counted down as a sender stops, not when its task's done
    callbacks run (later): a submission queued in between would count a sender that takes
    nothing more, start none, and wait for good."""
    idle: int = 0
    """Senders not in a call: each takes what is queued before it ends."""


class TaskSubmissions:
    """One client's submissions (module docstring). `Client.task_submissions` holds it."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._queues: dict[str, _Queue] = {}
        self._most = MOST
        self.fallback: Exception | None = None
        """Why SubmitTasks is not used: every submission is SubmitTask's from then on."""
        self.calls = 0
        """SubmitTasks calls answered so far."""
        self._closed = False

    async def submit(self, request: Request, submitter: str) -> Reply:
        """The coordinator's answer to `request`, submitted as `submitter` ('' for none): its
        task, or the ApiaryError its SubmitTask call would raise."""
        if self.fallback is not None or self._closed or current() is not None:
            return await self._alone(request, submitter)
        done: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        queue = self._queues.get(submitter)
        if queue is None:
            queue = self._queues[submitter] = _Queue()
        queue.items.append((request, done))
        if not queue.idle and queue.sending < IN_FLIGHT:
            queue.idle += 1
            queue.sending += 1
            sender = asyncio.create_task(self._send(queue, submitter))
            queue.senders.add(sender)
            sender.add_done_callback(queue.senders.discard)
        return await done  # (a caller cancelled before its call leaves is not sent)

    async def close(self) -> None:
        """Stop sending; submissions not sent yet fail (later ones go alone, to meet the
        closed channel)."""
        self._closed = True
        for queue in self._queues.values():
            for sender in list(queue.senders):
                sender.cancel()
                with contextlib.suppress(BaseException):
                    await sender
            _fail([done for _, done in queue.items], ApiaryError("the client closed"))
            queue.items = []

    async def _send(self, queue: _Queue, submitter: str) -> None:
        """Send what is queued, a call at a time, until nothing is (one of `queue.senders`,
        counted idle while not in a call)."""
        try:
            while queue.items:
                batch = self._next_batch(queue)
                if not batch:
                    continue
                queue.idle -= 1
                try:
                    if self.fallback is not None:
                        await self._each_alone(batch, submitter)
                    else:
                        await self._together(batch, queue, submitter)
                except asyncio.CancelledError:  # (closing)
                    _fail([done for _, done in batch], ApiaryError("not submitted: closing"))
                    raise
                except Exception as exc:  # not an answer (the channel closed): the callers'
                    _fail([done for _, done in batch], exc)
                finally:
                    queue.idle += 1
        finally:
            queue.idle -= 1
            queue.sending -= 1

    def _next_batch(self, queue: _Queue) -> list[_Item]:
        """The queue's first submissions, taken out: at most `self._most`, CALL_BYTES
        together (one at least); those whose callers were cancelled dropped."""
        taken = size = 0
        for request, _ in queue.items[: self._most]:
            size += request.ByteSize()
            if taken and size > CALL_BYTES:
                break
            taken += 1
        batch, queue.items = queue.items[:taken], queue.items[taken:]
        return [item for item in batch if not item[1].done()]

    async def _together(self, batch: list[_Item], queue: _Queue, submitter: str) -> None:
        request = pb.apiary_pb2.SubmitTasksRequest(items=[r for r, _ in batch])
        try:
            reply = await self._client.task_query.SubmitTasks(
                request, metadata=_metadata(submitter)
            )
        except UnimplementedError as exc:
            self.fallback = exc
            await self._each_alone(batch, submitter)
            return
        except ValidationError as exc:
            fewer = _limit(exc)
            if fewer is not None and fewer < len(batch):  # a coordinator allowing fewer
                self._most = fewer
                queue.items[:0] = batch
            else:
                _fail([done for _, done in batch], exc)
            return
        except ApiaryError as exc:
            _fail([done for _, done in batch], exc)
            return
        self.calls += 1
        outcomes = reply.outcomes
        if len(outcomes) != len(batch):
            wrong = ApiaryError(f"{len(outcomes)} outcomes answered {len(batch)} submissions")
            _fail([done for _, done in batch], wrong)
            return
        for (_, done), outcome in zip(batch, outcomes, strict=True):
            if done.done():
                continue
            if outcome.HasField("submitted"):
                done.set_result(outcome.submitted)
            else:
                refused = outcome.refused
                error = error_for_code(refused.error_code, refused.message, refused.details)
                done.set_exception(error)

    async def _each_alone(self, batch: Sequence[_Item], submitter: str) -> None:
        async def one(request: Request, done: asyncio.Future[Reply]) -> None:
            try:
                reply = await self._alone(request, submitter)
            except ApiaryError as exc:
                _fail([done], exc)
            else:
                if not done.done():
                    done.set_result(reply)

        await asyncio.gather(*(one(request, done) for request, done in batch))

    async def _alone(self, request: Request, submitter: str) -> Reply:
        reply: Reply = await self._client.task_query.SubmitTask(
            request, metadata=_metadata(submitter)
        )
        return reply


def _metadata(submitter: str) -> tuple[tuple[str, str], ...] | None:
    return ((SUBMITTER_METADATA, submitter),) if submitter else None


def _limit(exc: ValidationError) -> int | None:
    """The item limit a refusal of the whole call names (field `items`), if it does."""
    limit = exc.details.get("limit", "")
    if exc.details.get("field") == "items" and limit.isdigit() and int(limit) > 0:
        return int(limit)
    return None


def _fail(waiting: Sequence[asyncio.Future[Reply]], error: BaseException) -> None:
    for done in waiting:
        if not done.done():
            done.set_exception(error)
