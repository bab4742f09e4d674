"""The trace context each task continues (engine/scheduler/traces.py), over a recording fake of
the engine's Tracing: kept from submission to the task's end, the parent of every dispatch,
a new trace (naming the task) for a task without one, and not kept for tasks that never
became live."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from apiary.core.envelope import Envelope, MessageType
from apiary.core.records import TaskRecord
from apiary.core.trace_context import TraceContext
from apiary.engine.router.admission import Outbound, SendOutcome
from apiary.engine.scheduler.traces import PRUNE_AT, TaskTraces
from apiary.engine.tracing import Attributes
from apiary.errors import BufferFullError

SUBMISSION = TraceContext("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")


@dataclass
class Started:
    name: str
    parent: TraceContext | None
    attributes: dict[str, Any]
    context: TraceContext
    ended: tuple[str, str] | None = None

    def end(self, error_code: str = "", note: str = "") -> None:
        self.ended = (error_code, note)


@dataclass
class FakeTracing:
    now: TraceContext | None = SUBMISSION
    annotated: list[dict[str, Any]] = field(default_factory=list)
    started: list[Started] = field(default_factory=list)

    def current(self) -> TraceContext | None:
        return self.now

    def annotate(self, attributes: Attributes) -> None:
        self.annotated.append(dict(attributes))

    def start(
        self, name: str, parent: TraceContext | None, attributes: Attributes, *, kind: str = ""
    ) -> Started:
        span_id = f"{len(self.started) + 1:016x}"
        context = TraceContext(f"00-{'1' * 32}-{span_id}-01")
        span = Started(name, parent, dict(attributes), context)
        self.started.append(span)
        return span


class FakeRouter:
    """Answers each send with `answer` and keeps what was sent."""

    def __init__(self, answer: SendOutcome) -> None:
        self.answer = answer
        self.sent: list[Outbound] = []

    async def send_many(self, items: list[Outbound]) -> list[SendOutcome]:
        self.sent.extend(items)
        return [self.answer]


ACCEPTED = SendOutcome("m1", True, reason="offset 1")


def _task(task_id: str) -> TaskRecord:
    return TaskRecord(
        task_id=task_id, agent_id="worker", priority=0, submitted_at=0.0, seq=1,
        state="QUEUED", updated_at=0.0, scope="path:a/**", job_key=task_id, lane="STANDARD",
    )  # fmt: skip


def _item() -> Outbound:
    env = Envelope(
        message_id="m1", producer_id="scheduler", correlation_id="t1",
        message_type=MessageType.DATA, content_type="application/json", payload=b"{}",
    )  # fmt: skip
    return Outbound(env, "worker", lane="STANDARD")


async def _dispatch(traces: TaskTraces, task_id: str, router: FakeRouter) -> None:
    await traces.send(router, _task(task_id), _item(), 1)  # type: ignore[arg-type]


async def test_every_dispatch_continues_the_submission_until_the_task_ends() -> None:
    tracing = FakeTracing()
    live = {"t1"}
    traces = TaskTraces(tracing, live.__contains__)
    traces.submitted("t1")
    assert tracing.annotated == [{"apiary.task_id": "t1"}]
    # Given again (a retry of the submission in another trace), it keeps its first trace.
    tracing.now = TraceContext("00-5bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    traces.submitted("t1")
    router = FakeRouter(ACCEPTED)
    await _dispatch(traces, "t1", router)
    await _dispatch(traces, "t1", router)  # a retry
    first, second = tracing.started
    assert (first.name, first.parent, second.parent) == ("dispatch task", SUBMISSION, SUBMISSION)
    assert first.attributes["apiary.task_id"] == "t1"
    assert first.attributes["apiary.agent_id"] == "worker"
    # The DATA envelope carries the dispatch span's context; the span ends with the outcome.
    assert [item.trace for item in router.sent] == [first.context, second.context]
    assert first.ended == ("", "offset 1")
    traces.ended(_task("t1"))
    await _dispatch(traces, "t1", router)
    assert tracing.started[-1].parent is None


async def test_a_refused_dispatch_ends_its_span_failed() -> None:
    tracing = FakeTracing()
    traces = TaskTraces(tracing, lambda task_id: True)
    traces.submitted("t1")
    refused = SendOutcome.refusal("m1", BufferFullError("inbox full"))
    await _dispatch(traces, "t1", FakeRouter(refused))
    assert tracing.started[0].ended == ("buffer_full", "buffer_full: inbox full")


async def test_without_a_submission_context_a_dispatch_starts_a_trace_naming_the_task() -> None:
    tracing = FakeTracing(now=None)
    traces = TaskTraces(tracing, lambda task_id: True)
    traces.submitted("t2")  # outside any span (or never: dispatched after a restart)
    assert tracing.annotated == []
    await _dispatch(traces, "t2", FakeRouter(ACCEPTED))
    (span,) = tracing.started
    assert span.parent is None
    assert span.attributes["apiary.task_id"] == "t2"


async def test_contexts_of_tasks_that_never_became_live_are_dropped() -> None:
    tracing = FakeTracing()
    live: set[str] = set()
    traces = TaskTraces(tracing, live.__contains__)
    for n in range(PRUNE_AT - 1):
        traces.submitted(f"refused-{n}")  # refused: never live, so never ending either
    live.add("open")
    traces.submitted("open")  # the PRUNE_AT-th: the refused ones' contexts go
    router = FakeRouter(ACCEPTED)
    await _dispatch(traces, "refused-0", router)
    await _dispatch(traces, "open", router)
    assert [span.parent for span in tracing.started] == [None, SUBMISSION]
