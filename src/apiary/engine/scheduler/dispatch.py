"""The Scheduler's dispatch (RFC 7.3, 8.1, 9.1, 9.2, 16.3): while an agent has room (fewer
tasks in hand than its window, core/tasks/capacity.py) and may take tasks, pick the lane (its
LaneScheduler, core/lanes.py) and the best head task of that lane among its own queue and
the shared queues it serves (core/tasks/shared.py), and send it unless it must wait: for a
bound worktree (`worktree:required`), for a free instance of the agent's type
(max_parallel_instances) or behind a running task whose scope conflicts
(engine/conflict_gate.py). A head that must wait lets the next queue's head go. The task goes
out as a DATA envelope from `scheduler`, stored DISPATCHED (with its event) in the
transaction that admits the envelope (`Outbound.stored_with`); a full buffer retries it
later on the Scheduler's timer heap, and so does a store that fails on the way: the task
stays as the Scheduler holds it, back in its queue, the envelope that may have gone out
(with the record naming it, when a write in doubt committed after all) stale and its
attempt counted, so that the next one goes out under a token of its own.

A shared queue's task is offered to its agents fairly (`offer`): one task at a time to the
least-loaded agent with room, the one served longest ago among equals.

The dispatches of one pass over the woken agents (`drain`, `try_dispatch`) commit together:
each task picked is held by its agent in memory at once (`_reserve`: what the next pick
looks at, the agent's room, its type's instances, the running scopes, sees it; its record
stays as stored), and the pass's envelopes go out in one admission when it ends
(`_send_batch`), one commit for every dispatch of the pass instead of one each. Each
outcome is then taken as a lone dispatch's is. A new submission's first dispatch (`first`)
and a traced one go out alone.

Called with the Scheduler's lock held.
"""

from __future__ import annotations

import logging
from collections import ChainMap, Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from apiary.core.clock import Clock
from apiary.core.envelope import Envelope, MessageType
from apiary.core.events import EventDraft
from apiary.core.lanes import LANES, LaneChoice, LaneScheduler
from apiary.core.records import AdmissionWrites, TaskRecord, TaskState
from apiary.core.tasks.capacity import (
    Seat,
    any_below,
    fair_order,
    runs_below,
    waits_for_yield,
)
from apiary.core.tasks.machine import TaskInput
from apiary.core.tasks.queue import QueuedTask
from apiary.core.tasks.shared import describe
from apiary.engine.conflict_gate import Blocker, ConflictGate
from apiary.engine.notices import NoticeFactory
from apiary.engine.router.admission import Outbound, SendOutcome
from apiary.engine.router.router import Router
from apiary.engine.scheduler.live import LiveTasks, queue_key, target_of
from apiary.engine.scheduler.pools import AgentPools
from apiary.engine.scheduler.traces import TaskTraces
from apiary.engine.scheduler.transitions import Prepared, TaskTransitions, logs_messages
from apiary.engine.scheduler.wakeups import Wakeups, retry_key, shared_queue, shared_target
from apiary.engine.scheduler.windows import AgentWindows
from apiary.engine.settings import SchedulerSettings
from apiary.errors import UnavailableError
from apiary.store.errors import StoreError

log = logging.getLogger(__name__)


class WorktreeView(Protocol):
    """What the Scheduler needs of the worktree manager (engine/worktrees, RFC 16.3)."""

    def bound_root(self, agent_id: str) -> Path | None:
        """The agent's bound worktree; None while it has none (UNBOUND, BIND_FAILED)."""
        ...

    def subscribe(self, listener: Callable[[str], None]) -> None:
        """Call `listener` with the agent id whenever a binding changes."""
        ...


class SchedulerDispatch:
    """Hands the Scheduler's queued tasks to their agents."""

    def __init__(
        self,
        live: LiveTasks,
        pools: AgentPools,
        wakeups: Wakeups,
        transitions: TaskTransitions,
        windows: AgentWindows,
        gate: ConflictGate,
        router: Router,
        envelopes: NoticeFactory,
        notices: NoticeFactory,
        settings: SchedulerSettings,
        clock: Clock,
        worktrees: WorktreeView | None,
        *,
        traces: TaskTraces | None = None,
    ) -> None:
        self._live = live
        self._pools = pools
        self._wakeups = wakeups
        self._transitions = transitions
        self._windows = windows
        self._gate = gate
        self._router = router
        self._envelopes = envelopes
        self._notices = notices
        self._settings = settings
        self._clock = clock
        self._worktrees = worktrees
        self._traces = traces
        """With tracing on: each dispatch is a span of the task's trace (docs/tracing.md)."""
        self._lanes: dict[str, LaneScheduler] = {}
        self._doubts: dict[str, Prepared] = {}
        """By task: its last dispatch, whose write the store failed and may have committed
        all the same (an unknown outcome); the store is asked before the task goes on."""
        self._unstored: dict[str, EventDraft] = {}
        """By task: the submission event of a new task not stored yet, dispatched in the
        transaction that creates it (`first`)."""
        self._batch: list[_Picked] | None = None
        """The dispatches picked in this pass, reserved and not sent yet (`_batching`)."""
        self._reserved_by: Counter[str] = Counter()
        """By agent: how many tasks the batch reserved for it."""
        self._free: set[str] = set()
        """Agents the pass left with a free running slot (`on_free` at its end)."""
        self.on_free: Callable[[str], Awaitable[int]] = _nobody_free
        """Called at the end of `drain` for each agent of a shared queue it left with a free
        running slot and nothing ready in its queues (engine/scheduler/steals.py)."""
        self.withheld: Callable[[str, str], bool] = _never_withheld
        """Whether a shared queue's task must not go to an agent now (recalled from it for
        another, engine/scheduler/steals.py)."""
        self._reserved: dict[str, TaskRecord] = {}
        """By task: the batch's dispatches as they will be stored, for the conflict gate to
        compare with (the live records stay as stored until the batch's commit)."""

    async def drain(self) -> None:
        """Dispatch to every agent (and offer every shared queue) woken so far, each pass's
        dispatches in one commit, then end the turn of the agents' windows
        (`AgentWindows.settle`; lock held)."""
        targets = self._wakeups.agents
        try:
            while targets:
                async with self._batching():
                    while targets:
                        await self._serve(targets.pop())
            await self._freed()
        finally:
            await self._windows.settle()

    async def _freed(self) -> None:
        """`on_free` for each agent the pass left with a free running slot and nothing
        ready in its queues."""
        free, self._free = self._free, set()
        for agent_id in sorted(free):
            if self.has_room(agent_id) and not self._ready_for(agent_id):
                await self.on_free(agent_id)

    @asynccontextmanager
    async def _batching(self) -> AsyncIterator[None]:
        """The dispatches picked in the block sent together as it ends (module docstring);
        inside a batch already, the block's join it."""
        if self._batch is not None:
            yield
            return
        self._batch = []
        try:
            yield
        finally:
            batch, self._batch = self._batch, None
            await self._send_batch(batch)

    async def place(self, task: TaskRecord) -> None:
        """Dispatch a task just queued, if an agent may take it now."""
        await self._serve(target_of(task))

    async def first(self, task: TaskRecord, submitted: EventDraft) -> TaskRecord | None:
        """Dispatch a new submission's task, not stored yet, in the transaction that stores
        it: its record is created with `submitted` (its event) in the commit that admits the
        envelope carrying it, one commit on its way instead of two. Returns it DISPATCHED.

        It is its agent's (or shared queue's) queued task for this one try only. When it does
        not go out at once (it is not the head the agent takes, must wait for a worktree, a
        conflict, an instance or a yield, or the agent's buffer is full), nothing of it was
        stored and it is taken out again: None, and it is submitted as any task (stored
        QUEUED, then placed). A store that fails its dispatch raises (StoreUnavailableError:
        its outcome is not known; a retry of the submission under its task_id finds what
        was stored); one that fails another task's write on the way is `_serve`'s to retry."""
        if not task.queue and not self.has_room(task.agent_id):
            return None  # (a burst: its agent is full, nothing to try)
        live = self._live
        live.stored(task)
        live.push(task)
        self._unstored[task.task_id] = submitted
        try:
            await self._serve(target_of(task))
        except _NotFirstError as unsent:
            live.withdraw(task.task_id)
            if unsent.error is not None:
                raise unsent.error from None
            return None
        except BaseException:
            live.withdraw(task.task_id)
            raise
        finally:
            del self._unstored[task.task_id]
        sent = live.tasks.get(task.task_id)
        if sent is not None and sent.state == TaskState.DISPATCHED:
            return sent
        live.withdraw(task.task_id)
        return None

    async def _serve(self, target: str) -> None:
        """Offer the shared queue `target` names, or dispatch to the agent it is; when the
        store fails on the way (a head's DEFER or WAIT_WORKTREE not stored: nothing changed),
        the target is tried again after `retry_after_s`."""
        try:
            async with self._batching():
                queue = shared_queue(target)
                if queue:
                    await self.offer(queue)
                else:
                    await self.try_dispatch(target)
        except (StoreError, UnavailableError) as exc:
            log.warning("dispatch to %s waits for the store: %s", target, exc)
            self._wakeups.arm(retry_key(target), self._clock.now() + self._settings.retry_after_s)

    # ------------------------------------------------------------------ one agent

    def has_room(self, agent_id: str) -> bool:
        """Whether the agent holds fewer tasks than its window and its lifecycle lets it take
        one (core/agent_window.py `takes_tasks`)."""
        if self._live.count(agent_id) >= self._pools.window(agent_id):
            return False
        # A task reserved for it in this pass makes it busy (SCHEDULED or RUNNING) once
        # stored, and a busy agent takes tasks up to its window.
        return agent_id in self._reserved_by or self._windows.takes_tasks(agent_id)

    async def try_dispatch(self, agent_id: str, *, at_most: int | None = None) -> int:
        """Dispatch the agent's next tasks while everything allows it, `at_most` of them
        (None: as many as its window takes), in one commit; returns how many were picked
        (inside a batch: reserved, their outcome known when it is sent; lock held)."""
        async with self._batching():
            return await self._dispatch_while(agent_id, at_most)

    async def _dispatch_while(self, agent_id: str, at_most: int | None) -> int:
        sent = 0
        while (at_most is None or sent < at_most) and self.has_room(agent_id):
            if not self._instance_free(agent_id) or not await self._dispatch_next(agent_id):
                break
            sent += 1
        if self.has_room(agent_id):
            pools = self._pools
            pools.unsaturate(agent_id)
            slots = pools.concurrency(agent_id)
            if pools.queues_of(agent_id) and self._live.count(agent_id) < slots:
                self._free.add(agent_id)  # (a running slot free: `on_free` at the pass's end)
        return sent

    def _ready_for(self, agent_id: str) -> bool:
        """Whether a task waits in one of the agent's queues, ready to go."""
        return any(self._live.ready(self._pools.targets_of(agent_id)).values())

    def _instance_free(self, agent_id: str) -> bool:
        """RFC 9.1: an agent that holds no task starts an instance of its type, which the
        type's max_parallel_instances must allow (it waits for one otherwise)."""
        if self._live.count(agent_id):
            return True
        member = self._pools.member(agent_id)
        agent_type = member.agent_type if member is not None else ""
        if self._live.active[agent_type] < self._settings.instance_limit(agent_type):
            return True
        self._live.wait_for_type(agent_type, agent_id)
        return False

    async def _dispatch_next(self, agent_id: str) -> bool:
        """Dispatch the first head the agent may start now; False when none may."""
        picked = self._heads(agent_id)
        if picked is None:
            return False
        heads, choice = picked
        live = self._live
        concurrency = self._pools.concurrency(agent_id)
        for head in heads:
            task = live.tasks[head.task_id]
            if task.task_id in self._doubts and await self._dispatched_after_all(task):
                return True
            if task.queue and (
                not self._pools.takes(agent_id, task.content_type)
                or self.withheld(task.task_id, agent_id)
            ):
                continue
            if self._waits_for_yield(task, agent_id, concurrency):
                return False  # nothing goes past it into the agent's prefetch
            unstored = task.task_id in self._unstored
            if live.needs_worktree(task) and not self.bound(agent_id):
                if unstored:
                    raise _NotFirstError()
                await self._held_for_worktree(task)
                continue
            records = ChainMap(self._reserved, live.tasks) if self._reserved else live.tasks
            blockers = await self._gate.blockers(
                task, live.holders, records, agent_id=agent_id, alone=concurrency == 1
            )
            if blockers:
                if unstored:
                    raise _NotFirstError()
                await self._deferred(task, blockers)
                continue
            live.queue.remove(head.task_id)
            return await self._dispatch(task, choice, agent_id)
        return False

    def _waits_for_yield(self, task: TaskRecord, agent_id: str, concurrency: int) -> bool:
        """Whether the task, which would be prefetched to `agent_id`, waits in its queue for
        a yield instead (core/tasks/capacity.py): of a task it displaces there, or for a
        shared one, of a task below it running at another of its agents. Nothing is looked
        at while the agent has a free running slot (the task starts at once)."""
        live, pools = self._live, self._pools
        if live.count(agent_id) < concurrency:
            return False
        if waits_for_yield(live.holding(agent_id), concurrency, task.priority):
            return True
        if not task.queue:
            return False
        return any(
            runs_below(live.held_view(a), pools.concurrency(a), task.priority)
            for a in pools.agents_for(task.queue)
            if any_below(live.holding(a), task.priority)
        )

    def bound(self, agent_id: str) -> bool:
        """Whether the agent has a bound worktree (RFC 16.3)."""
        return self._worktrees is not None and self._worktrees.bound_root(agent_id) is not None

    async def _held_for_worktree(self, task: TaskRecord) -> None:
        """RFC 16.3: no worktree task for an agent without a bound worktree (BIND_FAILED is
        treated like UNBOUND); the task waits until a BIND succeeds (`wake`)."""
        if task.queue:
            note = f"waiting for an agent of {describe(task.queue)} with a bound worktree"
        else:
            note = "waiting for the agent to bind a worktree (worktree:required)"
        if task.note == note:
            return
        changes = {"note": note, "updated_at": self._clock.now()}
        await self._transitions.apply(task, TaskInput.WAIT_WORKTREE, changes, reason=note)

    def _heads(self, agent_id: str) -> tuple[list[QueuedTask], LaneChoice] | None:
        """The chosen lane and its head tasks, best first, among the agent's own queue and
        its shared queues."""
        queue = self._live.queue
        targets = self._pools.targets_of(agent_id)
        ready = self._live.ready(targets)
        if not any(ready.values()):
            return None
        lanes = self._lanes.get(agent_id)
        if lanes is None:
            lanes = self._lanes[agent_id] = LaneScheduler(self._settings.lanes)
        choice = lanes.pick(ready, self._clock.now())
        assert choice is not None
        heads = [h for t in targets if (h := queue.peek(queue_key(t, choice.lane))) is not None]
        heads.sort(key=lambda h: h.sort_key)
        return heads, choice

    async def _deferred(self, task: TaskRecord, blockers: list[Blocker]) -> None:
        for blocker in blockers:
            self._live.wait_behind(blocker.task_id, target_of(task))
        note = "; ".join(f"{b.outcome} behind {b.task_id}: {b.reason}" for b in blockers)
        if task.note == note:
            return
        blocked_by = [b.task_id for b in blockers]
        task = await self._transitions.apply(
            task, TaskInput.DEFER, {"note": note, "updated_at": self._clock.now()},
            blocked_by=blocked_by, reason=note,
        )  # fmt: skip
        if task.queue:
            return  # no agent of its own to tell yet
        await self._router.notify(
            task.agent_id,
            self._notices.notification(
                {"event": "task_deferred", "task_id": task.task_id,
                 "blocked_by": [b.task_id for b in blockers], "reason": note},
                task.flow_id,
            ),
        )  # fmt: skip

    async def _dispatched_after_all(self, task: TaskRecord) -> bool:
        """Whether the task's last dispatch, whose write the store failed, committed all
        the same (the store is asked; its StoreError propagates, the task staying as it is):
        then it is taken as dispatched (its envelope live again), and the task goes no
        further here. False: it did not, and the task goes on as queued."""
        doubt = self._doubts[task.task_id]
        stored = await self._transitions.stored_record(task.task_id)
        del self._doubts[task.task_id]
        if stored != doubt.after:
            return False
        log.warning("dispatch of task %s as %s committed after all", task.task_id,
                    doubt.after.message_id)  # fmt: skip
        self._live.queue.remove(task.task_id)
        self._live.stale.pop(doubt.after.message_id, None)
        await self._transitions.stored(replace(doubt, before=task))
        if task.queue:
            self._pools.served(doubt.after.agent_id)
        return True

    async def _dispatch(self, task: TaskRecord, choice: LaneChoice, agent_id: str) -> bool:
        """Send the task to the agent; False when it has to wait (the task is back in its
        queue, and the agent tried again after `retry_after_s`): the agent's inbound buffer
        is full, or the store failed on the way."""
        attempt = task.attempts + 1
        env = self._envelopes.envelope(
            MessageType.DATA, task.params, task.content_type, correlation_id=task.flow_id,
            idempotency_token=f"task:{task.task_id}:{attempt}",
        )  # fmt: skip
        dispatched = self._prepare(task, choice, agent_id, env, attempt)
        try:
            return await self._send(task, agent_id, env, attempt, dispatched)
        except (StoreError, UnavailableError) as exc:
            self._failed(task, agent_id, env, dispatched, exc)
            return False

    def _failed(
        self, task: TaskRecord, agent_id: str, env: Envelope, dispatched: Prepared,
        error: Exception,
    ) -> None:  # fmt: skip
        """The store failed the dispatch's write. It may have committed unheard (the
        envelope with the task DISPATCHED): the store is asked before the task goes on
        (`_doubts`); until then that envelope is stale and its attempt spent."""
        log.warning("dispatch of task %s to %s failed: %s", task.task_id, agent_id, error)
        self._in_doubt(task, env, dispatched, error)

    def _prepare(
        self, task: TaskRecord, choice: LaneChoice, agent_id: str, env: Envelope, attempt: int
    ) -> Prepared:
        """The task's DISPATCH as `env`, for the envelope's admission to commit."""
        changes: dict[str, object] = {
            "message_id": env.message_id, "attempts": attempt, "updated_at": self._clock.now(),
            "note": "",
        }  # fmt: skip
        if task.queue:
            member = self._pools.member(agent_id)
            changes["agent_id"] = agent_id
            changes["agent_type"] = member.agent_type if member is not None else ""
        # The event names the token, which has no record of its own, and may record the
        # envelope's admission (`Outbound.admission_logged`, docs/scheduler.md, "Events of a
        # task's messages").
        admitted = {"message_state": "RECEIVED", "message_type": "DATA"}
        return self._transitions.prepare(
            task, TaskInput.DISPATCH, changes, message_id=env.message_id, attempt=attempt,
            lane=task.lane, urgent=choice.urgent, overflowed=choice.overflowed,
            token=env.idempotency_token, **(admitted if logs_messages(task) else {}),
        )  # fmt: skip

    async def _send(
        self, task: TaskRecord, agent_id: str, env: Envelope, attempt: int, dispatched: Prepared
    ) -> bool:
        # The task is stored DISPATCHED with the envelope that carries it, or neither is. The
        # token names this attempt, counted in the task record even when its send failed: it
        # is new, and the task record keeps it unique, so the router neither looks for nor
        # starts a record of it. The envelope is built from params checked at submission, and
        # DISPATCHED's event records its admission.
        submitted = self._unstored.get(task.task_id)
        if submitted is None:
            writes = AdmissionWrites((dispatched.event,), task=dispatched.after)
        else:  # a new task, created with its dispatch (`first`)
            if not self._router.inbox(agent_id).has_room():
                raise _NotFirstError()  # (a refusal NACKs: the task's dispatch is refused once)
            events = (submitted, dispatched.event)
            writes = AdmissionWrites(events, task=dispatched.after, task_new=True)
        item = Outbound(
            env, agent_id, lane=task.lane, new_token=True, stored_with=writes,
            admission_logged=logs_messages(task), validated=True,
        )  # fmt: skip
        if self._batch is not None and submitted is None and self._traces is None:
            self._reserve(dispatched.after)
            if task.queue:
                self._pools.served(agent_id)
            self._batch.append(_Picked(task, agent_id, env, dispatched, item))
            return True
        if self._traces is None:
            (outcome,) = await self._router.send_many([item])
        else:
            outcome = await self._traces.send(self._router, task, item, attempt)
        return await self._sent(task, agent_id, env, dispatched, outcome, first=bool(submitted))

    async def _sent(
        self, task: TaskRecord, agent_id: str, env: Envelope, dispatched: Prepared,
        outcome: SendOutcome, *, first: bool = False, batched: bool = False,
    ) -> bool:  # fmt: skip
        """What follows the admission of a dispatch's envelope, as `_send` returns it
        (`batched`: the agent was counted served when the task was picked)."""
        if not outcome.accepted:
            code = outcome.error_code
            if code == "unavailable":  # a store fault: the envelope's fate is unknown
                assert outcome.error is not None
                self._in_doubt(task, env, dispatched, outcome.error)
                return False
            if first:  # nothing of it stored: submitted as any task
                raise _NotFirstError()
            if code == "buffer_full":
                self._later(task, agent_id)
                return False
            await self._transitions.end(
                task, TaskInput.REFUSE, code or "internal_error", outcome.reason
            )
            return True
        await self._transitions.stored(dispatched)
        if task.queue and not batched:
            self._pools.served(agent_id)
        return True

    def _reserve(self, after: TaskRecord) -> None:
        """The picked task held by its agent in memory until its batch is sent, for the
        pass's next picks to see: the agent's room, its type's instances, the running
        scopes the conflict gate compares with."""
        self._reserved[after.task_id] = after
        self._reserved_by[after.agent_id] += 1
        self._live.occupy(after)
        self._gate.started(after)

    def _unreserve(self, picked: _Picked) -> None:
        """`_reserve` undone (the batch's outcome decides what the task is). Nobody is woken:
        a pick that waits for what it held looks again once the task, stored, ends (or,
        not stored, is dispatched again after `retry_after_s`)."""
        after = picked.dispatched.after
        self._live.unoccupy(after)
        self._gate.withdrawn(after.task_id)
        del self._reserved[after.task_id]
        self._reserved_by[after.agent_id] -= 1
        if not self._reserved_by[after.agent_id]:
            del self._reserved_by[after.agent_id]

    async def _send_batch(self, batch: list[_Picked]) -> None:
        """Send the pass's dispatches in one admission and take each outcome as `_dispatch`
        takes a lone one's (a store that fails them all leaves each in doubt)."""
        if not batch:
            return
        for picked in batch:
            self._unreserve(picked)
        left = iter(batch)
        try:
            try:
                outcomes = await self._router.send_many([picked.item for picked in batch])
            except (StoreError, UnavailableError) as exc:
                for picked in left:
                    self._failed(picked.task, picked.agent_id, picked.env, picked.dispatched, exc)
                return
            for picked, outcome in zip(left, outcomes, strict=True):
                try:
                    await self._sent(
                        picked.task, picked.agent_id, picked.env, picked.dispatched, outcome,
                        batched=True,
                    )  # fmt: skip
                except (StoreError, UnavailableError) as exc:
                    self._failed(picked.task, picked.agent_id, picked.env, picked.dispatched, exc)
        except BaseException:
            # (cancelled while sending, or a bug): the picks not taken yet go back to their
            # queues as dispatches in doubt, asked of the store before they go on.
            cut = UnavailableError("the dispatch was cut short")
            for picked in left:
                self._in_doubt(picked.task, picked.env, picked.dispatched, cut)
            raise

    def _in_doubt(
        self, task: TaskRecord, env: Envelope, dispatched: Prepared, error: Exception
    ) -> None:
        """The dispatch's write failed and may have committed all the same: the store is
        asked before the task goes on (`_dispatched_after_all`). A queued task goes back to
        its queue, the envelope stale and its attempt spent, tried again after
        `retry_after_s`; a new one (`first`) is taken out again, and its submission
        answered with `error` (given again, it finds the dispatch if it committed)."""
        self._doubts[task.task_id] = dispatched
        if task.task_id in self._unstored:
            raise _NotFirstError(error)
        attempt = dispatched.after.attempts
        self._later(self._live.unsent(task, env.message_id, attempt), dispatched.after.agent_id)

    def _later(self, task: TaskRecord, agent_id: str) -> None:
        """The task back in its queue (keeping its place) and the agent tried again after
        `retry_after_s`."""
        self._live.push(task)
        self._wakeups.arm(retry_key(agent_id), self._clock.now() + self._settings.retry_after_s)

    # ------------------------------------------------------------------ shared queues

    def waiting_in(self, queue: str) -> int:
        """How many tasks wait in the shared queue (every lane)."""
        target = shared_target(queue)
        return sum(self._live.queue.count(queue_key(target, lane)) for lane in LANES)

    async def offer(self, queue: str) -> None:
        """Hand the shared queue's waiting tasks to its agents, one at a time to the
        least-loaded agent with room (`fair_order`), while any takes one."""
        pools = self._pools
        while queue not in pools.saturated and self.waiting_in(queue):
            seats = [
                Seat(a, self._live.count(a), pools.concurrency(a), pools.last_served(a))
                for a in pools.agents_for(queue)
                if self.has_room(a)
            ]
            if not seats:
                pools.saturated.add(queue)
                return
            for agent_id in fair_order(seats):
                if await self.try_dispatch(agent_id, at_most=1):
                    break
            else:
                return  # every agent with room has to wait (conflicts, instances, ...)


async def _nobody_free(agent_id: str) -> int:
    """`on_free` until one is given: nothing to do."""
    return 0


def _never_withheld(task_id: str, agent_id: str) -> bool:
    """`withheld` until one is given: no task is."""
    return False


@dataclass(frozen=True, slots=True)
class _Picked:
    """A dispatch picked in a pass, reserved, its envelope sent when the pass ends."""

    task: TaskRecord
    """The task as it was before (QUEUED)."""
    agent_id: str
    env: Envelope
    dispatched: Prepared
    item: Outbound


class _NotFirstError(Exception):
    """A new task's first dispatch did not go out in the transaction that was to store it
    (`SchedulerDispatch.first`): nothing of it is stored; `error` when the store failed
    (its outcome unknown), else the task is submitted as any task."""

    def __init__(self, error: Exception | None = None) -> None:
        super().__init__("not dispatched at once")
        self.error = error
