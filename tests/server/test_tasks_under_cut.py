"""Tasks while the database cuts the coordinator's connections (honest answers under store
faults): PostgreSQL terminates the backends of the coordinator's store pool again and again
(tests/server/pg_cutter.py) while a submitter submits tasks under task ids of its own and
two SDK agents run them. A submission is answered accepted, or `unavailable` (then it is
submitted again with the same content: the same task, never a second one). The event log
tells each task's life as stored: every task state change commits its `task.*` event in the
same transaction, so each stored state has its event and no event names a state the task
was never stored in (its events step through the task machine's table from
`task.submitted` to the stored state).

Once the cutting stops every task must complete, and nobody may have been answered
internal_error: the Scheduler recovers from every transition whose write the cut failed (a
dispatch goes out again, an ACK is applied again, a submission that committed unheard is
taken in when it is submitted again), and an agent's end ACK whose write the router had
committed unheard reaches the Scheduler when the agent sends it again
(tests/engine/test_task_write_faults.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from apiary.core.events import Event, EventFilter
from apiary.core.records import TaskRecord, TaskState
from apiary.core.tasks.machine import TaskMachine
from apiary.errors import UnavailableError
from apiary.sdk.agent import Agent
from apiary.sdk.client import Client
from apiary.sdk.tasks import TaskContext, TaskRunner
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from tests.server.pg_cutter import cut_until, cut_url

TASKS = 120
"""Tasks submitted at least; more while no cut has reached a submission yet (`MAX_TASKS`)."""
MAX_TASKS = 2_000
"""Bound on the tasks submitted: submissions are quick enough that the first 120 may all
fall between two cuts of the pool (every 0.2 s), and the test is about the ones a cut
reaches."""
IN_FLIGHT = 8
WORKERS = ("worker-1", "worker-2")
SETTLE_S = 120.0
"""Bound on one submission's retries while the cutting goes on."""
SUBMIT_S = 300.0
"""Bound on all the submissions (a call never answered fails the test naming its task)."""
DONE_S = 45.0
"""Bound on every task's completion once the cutting stopped: four times the router's ACK
deadline (10 s), which hands out again a task whose READ was lost (a task stuck past it is
stuck for good)."""
STEPS = frozenset(
    (before, step.state) for before, row in TaskMachine.TABLE.items() for step in row.values()
)
"""(state, next state) of every row of the task machine."""


async def work(task: TaskContext) -> Any:
    return {"n": task.json()["n"]}


@asynccontextmanager
async def running_agents(coordinator: Coordinator) -> AsyncIterator[list[asyncio.Task[None]]]:
    """The WORKERS as SDK agents running `work`, reconnecting as a deployed agent does; their
    runners' tasks (each runs until cancelled: one that ended gave up on the coordinator)."""
    address = str(coordinator.grpc_address)
    async with contextlib.AsyncExitStack() as stack:
        jobs = []
        for agent_id in WORKERS:
            agent = await stack.enter_async_context(Agent(agent_id, coordinator=address))
            jobs.append(asyncio.create_task(TaskRunner(agent, work, reconnect=True).run()))
        try:
            yield jobs
        finally:
            for job in jobs:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)


def _gave_up(jobs: list[asyncio.Task[None]]) -> list[str]:
    return [
        f"{agent_id}: {job.exception() if not job.cancelled() else 'cancelled'}"
        for agent_id, job in zip(WORKERS, jobs, strict=True)
        if job.done()
    ]


async def _submit(
    client: Client, n: int, answers: Counter[str], created: Counter[str], asking: set[str]
) -> None:
    """Submit task `n` until it is settled: created, or found existing by a resubmission
    (its first attempt committed although its caller heard `unavailable`). `asking` holds
    the task while a call for it is unanswered."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + SETTLE_S
    task_id = f"cut-{n:03d}"
    while True:
        asking.add(task_id)
        try:
            handle = await client.submit_task(
                WORKERS[n % len(WORKERS)], {"n": n}, scope=f"repo:cut-{n}", task_id=task_id
            )
        except UnavailableError:
            asking.discard(task_id)
            answers["unavailable"] += 1
        else:
            asking.discard(task_id)
            assert handle.task_id == task_id
            answers["created" if handle.created else "existing"] += 1
            if handle.created:
                created[task_id] += 1
            return
        assert loop.time() < give_up, f"{task_id} never settled: {answers}"
        await asyncio.sleep(0.01)


async def _until_all_ended(coordinator: Coordinator, ids: set[str]) -> list[TaskRecord]:
    """The stored tasks once every one of `ids` has ended (or DONE_S passed)."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + DONE_S
    while True:
        tasks = await coordinator.store.tasks.list(limit=2 * len(ids) + 100)
        ended = {t.task_id for t in tasks if TaskState(t.state).terminal}
        if ids <= ended or loop.time() > give_up:
            return tasks
        await asyncio.sleep(0.1)


async def _task_events(coordinator: Coordinator) -> list[Event]:
    found: list[Event] = []
    after = 0
    where = EventFilter(event_types=frozenset({"task."}))
    while batch := await coordinator.events.read(after, 5000, where):
        found += batch
        after = batch[-1].sequence
    return found


def _audit(tasks: list[TaskRecord], events: list[Event]) -> None:
    """Each task's events, in the log's order, start with its one `task.submitted` (QUEUED),
    step through rows of the task machine and end at its stored state."""
    lives: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for event in events:
        if "state" in event.details:  # (task.duplicate_rejected names no state)
            lives[str(event.details["task_id"])].append(
                (event.event_type, str(event.details["state"]))
            )
    silent = [t.task_id for t in tasks if t.task_id not in lives]
    assert not silent, f"{len(silent)} stored tasks have no event at all: {silent[:3]}"
    for task in tasks:
        life = lives.pop(task.task_id)
        assert life[0] == ("task.submitted", "QUEUED"), (task.task_id, life)
        assert [kind for kind, _ in life].count("task.submitted") == 1, (task.task_id, life)
        states = [TaskState(state) for _, state in life]
        strays = [(a, b) for a, b in pairwise(states) if (a, b) not in STEPS]
        assert not strays, f"{task.task_id}: events of no step of the machine {strays}: {life}"
        assert states[-1] == task.state, (
            f"{task.task_id} is stored {task.state}, its last event says {states[-1]}: {life}"
        )
    assert not lives, f"events of tasks never stored: {sorted(lives)[:3]}"


async def test_a_cut_connection_leaves_every_committed_task_state_with_its_event(
    tmp_path: Path, postgres_dsn: str, postgres_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="apiary.server")
    application = f"apiary-cut-{uuid.uuid4().hex[:8]}"
    url = cut_url(postgres_dsn, postgres_schema, application)
    answers: Counter[str] = Counter()
    created: Counter[str] = Counter()
    asking: set[str] = set()
    async with (
        open_test_coordinator(tmp_path, url) as coordinator,
        running_agents(coordinator) as runners,
        Client(str(coordinator.grpc_address), agent_id="app") as client,
    ):
        stop = asyncio.Event()
        cutter = asyncio.create_task(cut_until(stop, postgres_dsn, application))
        issued: list[int] = []

        def next_numbers() -> Iterator[int]:
            n = 0
            while n < TASKS or (not answers["unavailable"] and n < MAX_TASKS):
                issued.append(n)
                yield n
                n += 1

        numbers = next_numbers()

        async def submitter() -> None:
            for n in numbers:
                await _submit(client, n, answers, created, asking)

        try:
            await asyncio.wait_for(
                asyncio.gather(*(submitter() for _ in range(IN_FLIGHT))), SUBMIT_S
            )
        except TimeoutError:
            pytest.fail(f"submissions never answered: {sorted(asking)} ({answers})")
        finally:
            stop.set()
            cuts = await cutter
        assert cuts > 0, "no connection was ever cut"
        assert answers["unavailable"] > 0, f"the cuts never reached a submission: {answers}"
        twice = [task_id for task_id, times in created.items() if times > 1]
        assert not twice, f"tasks created twice: {twice[:5]}"
        assert answers["created"] + answers["existing"] == len(issued), answers
        ids = {f"cut-{n:03d}" for n in issued}

        assert not _gave_up(runners), f"agents gave up during the cutting: {_gave_up(runners)}"
        tasks = await _until_all_ended(coordinator, ids)
        assert {t.task_id for t in tasks} == ids, "a task missing, or one never submitted"
        _audit(tasks, await _task_events(coordinator))
        internal = [r.getMessage() for r in caplog.records if r.name == "apiary.server"]
        assert not internal, f"answered internal_error: {internal[:3]}"
        stuck = [t for t in tasks if not TaskState(t.state).terminal]
        shown = [(t.task_id, str(t.state)) for t in stuck]
        assert not stuck, f"{len(stuck)} tasks stuck after the cutting, e.g. {shown[:3]}"
        assert {t.task_id: json.loads(t.result) for t in tasks} == {
            f"cut-{n:03d}": {"n": n} for n in issued
        }, "a task ended otherwise than COMPLETED with its result"
