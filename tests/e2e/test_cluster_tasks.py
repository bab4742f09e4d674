"""Scheduler tasks in a three-replica cluster, with the leader SIGKILLed mid-load
(docs/cluster.md, "The leader"; issue 27): three `apiary serve --cluster` processes on one
PostgreSQL schema (tests/e2e/cluster_load.py), a task agent `w<i>` streaming on replica `i`
and a submitter on replica `i + 1`, each given all three addresses (its own first).

Every submitter submits tasks to every agent, each task with its own task_id; a submission
that fails without an answer (its replica, or the leader it was forwarded to, went away) is
submitted again with the same task_id until the cluster answers (the same submission again
is the same task). A third of the way through, the leader is SIGKILLed. Then:

- every accepted task ends COMPLETED, with the result its agent returned, and its submitter
  gets that result from WaitTask through a replica that is not the one it submitted on;
- no task runs twice at once (a dispatch handed out again after a reconnect may run again,
  after the first run ended: delivery is at-least-once);
- the time until another replica led is printed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import apiary
from apiary.errors import ApiaryError
from apiary.sdk.errors import CoordinatorUnreachableError
from tests.e2e.cluster_load import LEASE_S, UNANSWERED, WAIT_S, Replica, settle

pytestmark = pytest.mark.postgres

REPLICAS = 3
PER_PAIR = 25
"""Tasks per submitter and agent: 3 x 3 x 25 = 225."""


def _scope(task_id: str) -> str:
    """A repository of the task's own: no two tasks' scopes conflict (they would be run one
    after the other, docs/scheduler.md)."""
    return "repo:" + task_id.replace(">", "-").replace("#", "-")


LEADER_BOUND_S = LEASE_S + 10.0


@dataclass
class Runs:
    """Every run of every task, by the agents: (task_id, agent, start, end)."""

    runs: list[tuple[str, str, float, float]] = field(default_factory=list)
    running: dict[str, int] = field(default_factory=dict)
    overlaps: list[str] = field(default_factory=list)


class Worker(apiary.Agent):
    def __init__(self, agent_id: str, runs: Runs, **kwargs: Any) -> None:
        super().__init__(agent_id, **kwargs)
        self.runs = runs

    async def on_task(self, task: apiary.TaskContext) -> object:
        loop = asyncio.get_running_loop()
        runs = self.runs
        if runs.running.get(task.task_id):
            runs.overlaps.append(task.task_id)
        runs.running[task.task_id] = runs.running.get(task.task_id, 0) + 1
        start = loop.time()
        try:
            await asyncio.sleep(0.005)
            return {"task": task.task_id, "by": self.agent_id}
        finally:
            runs.running[task.task_id] -= 1
            runs.runs.append((task.task_id, self.agent_id, start, loop.time()))


async def _leader(dsn: str, schema: str) -> str | None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute(
            sql.SQL(
                "SELECT owner FROM {}.cluster_leader WHERE expires_at >"
                " extract(epoch FROM clock_timestamp())"
            ).format(sql.Identifier(schema))
        )
        row = await cursor.fetchone()
    return None if row is None else str(row[0])


async def _states(dsn: str, schema: str) -> dict[str, str]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute(
            sql.SQL("SELECT task_id, state, error_code, note FROM {}.tasks").format(
                sql.Identifier(schema)
            )
        )
        return {
            str(t): str(s) if s == "COMPLETED" else f"{s} {code} {note}"
            for t, s, code, note in await cursor.fetchall()
        }


@asynccontextmanager
async def _cluster(tmp_path: Path, dsn: str, schema: str) -> AsyncIterator[list[Replica]]:
    url = f"{dsn}?apiary_schema={schema}"
    replicas = [Replica(tmp_path, url, f"r{i}") for i in range(REPLICAS)]
    try:
        await replicas[0].start()  # the first migrates the schema
        await asyncio.gather(*(replica.start() for replica in replicas[1:]))

        async def led() -> bool:
            return await _leader(dsn, schema) is not None

        await settle(led, "a leader")
        yield replicas
    except BaseException:
        for replica in replicas:
            print(f"--- {replica.replica_id}'s log:\n{replica.log_tail()}")
        raise
    finally:
        for replica in replicas:
            await replica.close()


def _addresses(replicas: list[Replica], first: int) -> str:
    order = replicas[first:] + replicas[:first]
    return ",".join(r.address for r in order)


@dataclass
class Submissions:
    accepted: dict[str, str] = field(default_factory=dict)
    """task_id -> the agent it was submitted for."""
    resubmitted: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    """Set: each submitter ends after its current task."""

    async def submit(self, client: apiary.Client, agent: str, task_id: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while True:
            try:
                await client.submit_task(
                    agent, {"id": task_id}, scope=_scope(task_id), task_id=task_id
                )
                self.accepted[task_id] = agent
                return
            except ApiaryError as exc:
                unanswered = isinstance(exc, CoordinatorUnreachableError)
                if not unanswered and exc.code not in UNANSWERED:
                    raise
                if loop.time() > deadline:
                    raise AssertionError(f"{task_id}: no answer within {WAIT_S} s") from exc
            self.resubmitted += 1
            await asyncio.sleep(0.05)

    async def produce(
        self, client: apiary.Client, name: str, agents: list[str], per_pair: int = PER_PAIR
    ) -> None:
        for n in range(per_pair):
            for agent in agents:
                if self.stop.is_set():
                    return
                await self.submit(client, agent, f"{name}>{agent}#{n}")


async def test_the_leader_killed_mid_load_loses_no_task_and_runs_none_twice_at_once(
    tmp_path: Path, postgres_dsn: str, postgres_schema: str
) -> None:
    total = REPLICAS * REPLICAS * PER_PAIR
    runs, submissions = Runs(), Submissions()
    agents = [f"w{i}" for i in range(REPLICAS)]
    async with (
        _cluster(tmp_path, postgres_dsn, postgres_schema) as replicas,
        AsyncExitStack() as stack,
    ):
        jobs: list[asyncio.Task[None]] = []
        for i, agent_id in enumerate(agents):
            worker = Worker(agent_id, runs, coordinator=_addresses(replicas, i))
            jobs.append(asyncio.create_task(worker.run()))
        clients = [
            await stack.enter_async_context(
                apiary.Client(_addresses(replicas, (i + 1) % REPLICAS), agent_id=f"s{i}")
            )
            for i in range(REPLICAS)
        ]
        try:
            states = await _states(postgres_dsn, postgres_schema)
            await settle(_registered(postgres_dsn, postgres_schema, agents), "agents registered")
            producing = asyncio.gather(
                *(submissions.produce(c, f"s{i}", agents) for i, c in enumerate(clients))
            )
            await settle(_at_least(submissions, total // 3), "a third submitted")
            leader = await _leader(postgres_dsn, postgres_schema)
            victim = next(r for r in replicas if r.replica_id == leader)
            victim.kill()
            assert victim.proc is not None
            await victim.proc.wait()

            async def replaced() -> bool:
                found = await _leader(postgres_dsn, postgres_schema)
                return found is not None and found != leader

            took = await settle(replaced, "a new leader")
            print(
                f"SIGKILL of the leader {leader}: a new leader after {took:.2f} s "
                f"(lease_s {LEASE_S})"
            )
            await asyncio.wait_for(producing, WAIT_S * 2)

            async def all_ended() -> bool:
                nonlocal states
                states = await _states(postgres_dsn, postgres_schema)
                return all(states.get(t) == "COMPLETED" for t in submissions.accepted)

            with contextlib.suppress(AssertionError):
                await settle(all_ended, "every task COMPLETED")
            unfinished = {
                t: states.get(t) for t in submissions.accepted if states.get(t) != "COMPLETED"
            }
            assert not unfinished, (
                f"{len(unfinished)} not COMPLETED: {list(unfinished.items())[:5]}"
            )
            # Each submitter's results, through a surviving replica other than its own.
            survivors = [r for r in replicas if r is not victim]
            async with apiary.Client(survivors[-1].address, agent_id="s0") as reader:
                for task_id, agent in list(submissions.accepted.items())[:: REPLICAS * 5]:
                    if not task_id.startswith("s0>"):
                        continue
                    value = await reader.task(task_id).result(timeout=WAIT_S)
                    assert value == {"task": task_id, "by": agent}
        finally:
            for job in jobs:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
    assert len(submissions.accepted) == total
    assert not runs.overlaps, f"tasks run twice at once: {runs.overlaps[:5]}"
    ran = {task_id for task_id, *_ in runs.runs}
    assert ran >= set(submissions.accepted)
    again = len(runs.runs) - len(ran)
    print(f"{total} tasks, {submissions.resubmitted} submissions sent again, {again} runs again")


def _registered(dsn: str, schema: str, agents: list[str]) -> Any:
    async def check() -> bool:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            cursor = await conn.execute(
                sql.SQL("SELECT count(*) FROM {}.agents WHERE agent_id = ANY(%s)").format(
                    sql.Identifier(schema)
                ),
                [agents],
            )
            row = await cursor.fetchone()
        return row is not None and int(row[0]) == len(agents)

    return check


def _at_least(submissions: Submissions, count: int) -> Any:
    async def check() -> bool:
        return len(submissions.accepted) >= count

    return check


async def test_a_rolling_restart_under_a_load_of_tasks_loses_none(
    tmp_path: Path, postgres_dsn: str, postgres_schema: str
) -> None:
    """Each replica in turn stopped (SIGTERM: the leader releases its lease) and started
    again under load: every accepted task ends COMPLETED, none runs twice at once."""
    runs, submissions = Runs(), Submissions()
    agents = [f"w{i}" for i in range(REPLICAS)]
    async with (
        _cluster(tmp_path, postgres_dsn, postgres_schema) as replicas,
        AsyncExitStack() as stack,
    ):
        jobs = [
            asyncio.create_task(Worker(agent_id, runs, coordinator=_addresses(replicas, i)).run())
            for i, agent_id in enumerate(agents)
        ]
        clients = [
            await stack.enter_async_context(
                apiary.Client(_addresses(replicas, (i + 1) % REPLICAS), agent_id=f"s{i}")
            )
            for i in range(REPLICAS)
        ]
        try:
            await settle(_registered(postgres_dsn, postgres_schema, agents), "agents registered")
            producing = asyncio.gather(
                *(submissions.produce(c, f"s{i}", agents, 10_000) for i, c in enumerate(clients))
            )
            await settle(_at_least(submissions, 30), "the load under way")
            for replica in replicas:
                assert await replica.stop() == 0, replica.log_tail()
                await replica.start()
                count = len(submissions.accepted)
                await settle(_at_least(submissions, count + 30), "the load goes on")
            submissions.stop.set()
            await asyncio.wait_for(producing, WAIT_S)
            states: dict[str, str] = {}

            async def all_ended() -> bool:
                nonlocal states
                states = await _states(postgres_dsn, postgres_schema)
                return all(states.get(t) == "COMPLETED" for t in submissions.accepted)

            with contextlib.suppress(AssertionError):
                await settle(all_ended, "every task COMPLETED")
            unfinished = {
                t: states.get(t) for t in submissions.accepted if states.get(t) != "COMPLETED"
            }
            assert not unfinished, (
                f"{len(unfinished)} not COMPLETED: {list(unfinished.items())[:5]}"
            )
        finally:
            for job in jobs:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
    assert not runs.overlaps, f"tasks run twice at once: {runs.overlaps[:5]}"
    print(f"{len(submissions.accepted)} tasks, {submissions.resubmitted} submissions sent again")
