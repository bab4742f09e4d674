"""Builds, loads and closes the engine: every component, wired to its collaborators at
construction, over one store; no transport (server/ adapts it to gRPC and HTTP)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from apiary.core.clock import Clock
from apiary.core.handoff_request import HandoffPolicy
from apiary.core.ids import IdGenerator
from apiary.engine.activity import Activity
from apiary.engine.deadlines import Sleep, run_deadlines
from apiary.engine.eventlog import EventRecorder
from apiary.engine.handoffs import Handoffs
from apiary.engine.hitl import Hitl, HitlBroadcast, HitlSettings, build_hitl
from apiary.engine.inference_http import build_inference
from apiary.engine.negotiation.negotiations import Negotiations
from apiary.engine.negotiation.policies import NegotiationSettings
from apiary.engine.negotiation.rooms import NegotiationRooms, RoomSettings
from apiary.engine.notices import WORKTREES, NoticeFactory
from apiary.engine.presence import Presence, PresenceSettings
from apiary.engine.registry import Registry
from apiary.engine.resources import ResourceTracker
from apiary.engine.retention import run_retention
from apiary.engine.router.delivery import Delivery
from apiary.engine.router.router import Router
from apiary.engine.scheduler.scheduler import Scheduler
from apiary.engine.settings import RouterSettings, SchedulerSettings
from apiary.engine.tools.launch import Launcher
from apiary.engine.tools.providers import WorktreeBindings
from apiary.engine.tools.service import ToolService
from apiary.engine.tools.settings import ToolSettings
from apiary.engine.tracing import Tracing
from apiary.engine.workflows import Workflows
from apiary.engine.worktrees.control import WorktreeControl, WorktreeStatus
from apiary.engine.worktrees.settings import WorktreeSettings
from apiary.engine.worktrees.worktrees import Worktrees, build_worktrees
from apiary.store.protocols import Store
from apiary.system import SystemClock, UuidIds
from apiary.wire.codec import ProtobufEnvelopeCodec

_log = logging.getLogger(__name__)
SUPERVISED_FIRST_S: Final = 0.1
SUPERVISED_MAX_S: Final = 5.0
"""A failed engine loop starts again after a pause doubling from the first to the largest."""


@dataclass(frozen=True, slots=True)
class Runtime:
    """Injected time, ids and waiting: real by default, fakes in tests."""

    clock: Clock = field(default_factory=SystemClock)
    ids: IdGenerator = field(default_factory=UuidIds)
    sleep: Sleep = asyncio.sleep
    presence: PresenceSettings = field(default_factory=PresenceSettings)
    hitl: HitlSettings | None = None
    """Overrides the configuration's [hitl] settings (tests)."""
    handoff: HandoffPolicy | None = None
    """Overrides the configuration's [handoff] policy (tests)."""
    rooms: RoomSettings | None = None
    """Overrides the configuration's [rooms] settings (tests)."""
    tools: ToolSettings | None = None
    """Overrides the configuration's [tools] settings (tests)."""
    worktrees: WorktreeBindings | None = None
    """Where agents' bound worktrees are, for needs_worktree tools (tests; the engine's
    worktree manager once it is wired)."""
    launcher: Launcher | None = None
    """Starts tool processes (default: the sandbox, apiary.sandbox)."""
    negotiation: NegotiationSettings | None = None
    """Overrides the configuration's [negotiation] settings (tests)."""
    tracing: Tracing | None = None
    """Spans and trace context (docs/tracing.md); None: the coordinator does not trace."""


@dataclass(slots=True)
class Engine:
    events: EventRecorder
    registry: Registry
    router: Router
    delivery: Delivery
    presence: Presence
    hitl: Hitl
    activity: Activity
    scheduler: Scheduler
    workflows: Workflows
    handoffs: Handoffs
    worktrees: Worktrees
    rooms: NegotiationRooms
    tools: ToolService
    negotiations: Negotiations


def build_engine(
    store: Store,
    settings: RouterSettings,
    runtime: Runtime,
    hitl_settings: HitlSettings | None = None,
    scheduler_settings: SchedulerSettings | None = None,
    data_dir: Path | None = None,
    handoff_policy: HandoffPolicy | None = None,
    worktree_settings: WorktreeSettings | None = None,
    room_settings: RoomSettings | None = None,
    tool_settings: ToolSettings | None = None,
    negotiation_settings: NegotiationSettings | None = None,
) -> Engine:
    """The engine over `store`, without any transport."""
    clock = runtime.clock
    events = EventRecorder(store.events, clock)
    registry = Registry(store.agents, events, clock, signing_required=settings.signing_required)
    notices = NoticeFactory(clock, runtime.ids)
    codec = ProtobufEnvelopeCodec()
    router = Router(
        store, registry, events, codec, clock, notices, settings, tracing=runtime.tracing
    )
    presence = Presence(registry, router, notices, events, clock, runtime.presence)
    hitl = build_hitl(
        runtime.hitl or hitl_settings or HitlSettings(), store.hitl, events, clock, runtime.ids,
        notify=HitlBroadcast(registry, router, notices), check_flow_id=router.check_flow_id,
    )  # fmt: skip
    worktrees = _worktrees(
        worktree_settings or WorktreeSettings(), store, events, clock, hitl, data_dir, router,
        registry, notices,
    )  # fmt: skip
    negotiations = Negotiations(
        store, router, registry, notices, events, clock, hitl,
        runtime.negotiation or negotiation_settings,
    )  # fmt: skip
    activity = Activity(events, clock)
    resources = ResourceTracker(events, data_dir / "agents" if data_dir else None)
    scheduler = Scheduler(
        store.tasks, router, registry, events, clock, runtime.ids, hitl, activity,
        scheduler_settings, resources=resources,
        inference=build_inference((scheduler_settings or SchedulerSettings()).inference),
        worktrees=worktrees, on_negotiation=negotiations.on_envelope, sleep=runtime.sleep,
        tracing=runtime.tracing,
    )  # fmt: skip
    presence.on_lost(scheduler.agent_lost)
    delivery = Delivery(
        router, registry, store.messages, events, scheduler.agent_ready, presence.connected
    )
    workflows = Workflows(store.workflows, scheduler, router, events, clock, runtime.ids)
    handoffs = Handoffs(
        store.handoffs, registry, router, notices, events, clock, runtime.ids,
        runtime.handoff or handoff_policy,
    )  # fmt: skip
    rooms = NegotiationRooms(
        store.rooms, router, events, clock, runtime.ids, hitl,
        runtime.rooms or room_settings, sleep=runtime.sleep,
    )  # fmt: skip
    tools = ToolService(
        store.tools, router, registry, hitl, events, clock, runtime.ids,
        _tool_settings(runtime.tools or tool_settings or ToolSettings(), data_dir),
        launcher=runtime.launcher, worktrees=runtime.worktrees or worktrees,
    )  # fmt: skip
    return Engine(
        events, registry, router, delivery, presence, hitl, activity, scheduler, workflows,
        handoffs, worktrees, rooms, tools, negotiations,
    )  # fmt: skip


def _worktrees(
    settings: WorktreeSettings,
    store: Store,
    events: EventRecorder,
    clock: Clock,
    hitl: Hitl,
    data_dir: Path | None,
    router: Router,
    registry: Registry,
    notices: NoticeFactory,
) -> Worktrees:
    """The worktree manager, telling agents their status, with its WORKTREE_CONTROL endpoint
    attached to the router."""
    status = WorktreeStatus(router, registry, notices)
    worktrees = build_worktrees(settings, store.worktrees, events, clock, hitl, data_dir, status)
    control = WorktreeControl(worktrees, status)
    router.attach(WORKTREES, control.on_envelope, control.check)
    return worktrees


def _tool_settings(settings: ToolSettings, data_dir: Path | None) -> ToolSettings:
    """`settings`, with tool logs under `<data_dir>/logs` unless they name a directory."""
    if settings.log_dir is None and data_dir is not None:
        return replace(settings, log_dir=data_dir / "logs")
    return settings


def start_engine_tasks(
    store: Store, engine: Engine, runtime: Runtime, *, message_deadlines: bool = True,
    leader: bool = True,
) -> list[asyncio.Task[None]]:  # fmt: skip
    """The engine's timers and loops as tasks, each kept running through failures (a store
    outage, say: `supervised`); the caller cancels them at shutdown. Without
    `message_deadlines` (cluster mode) the router's deadline loop is left out: the
    partitions' owners run message deadlines from the store (engine/cluster/timers.py);
    without `leader` (cluster mode) the loops of LEADER_PARTS are too: they run on the
    cluster's leader only (engine/cluster/leader_role.py)."""
    router, clock, sleep = engine.router, runtime.clock, runtime.sleep
    loops: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
        "apiary-deadlines": lambda: run_deadlines(router.deadlines, clock, router.fire_due, sleep),
        "apiary-heartbeats": lambda: engine.presence.run(sleep),
        "apiary-retention": lambda: run_retention(
            store, clock, router.settings, engine.events, sleep
        ),
    }
    if not message_deadlines:
        del loops["apiary-deadlines"]
    if leader:
        loops.update(
            {f"apiary-{part}": loop for part, loop in leader_loops(engine, clock, sleep).items()}
        )
    return [asyncio.create_task(supervised(name, loop), name=name) for name, loop in loops.items()]


async def supervised(name: str, loop: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run `loop()` forever: when it fails (its work is retried by its next pass: a store
    error, say), log why and start it again after a pause that doubles up to
    SUPERVISED_MAX_S (real time, whatever clock the loop runs on), so that a store outage
    does not end the coordinator's timers."""
    pause = SUPERVISED_FIRST_S
    while True:
        started = asyncio.get_running_loop().time()
        try:
            await loop()
            return
        except Exception as exc:
            if asyncio.get_running_loop().time() - started > SUPERVISED_MAX_S:
                pause = SUPERVISED_FIRST_S  # (it ran well for a while: a new failure)
            _log.warning("%s failed, starting again in %.1f s: %s", name, pause, exc)
            await asyncio.sleep(pause)
            pause = min(pause * 2, SUPERVISED_MAX_S)


LEADER_PARTS: Final = (
    "hitl", "scheduler", "handoffs", "worktrees", "tools", "workflows", "rooms", "negotiations",
)  # fmt: skip
"""The components that run on the cluster's leader only, in cluster mode: loaded, and their
loops started, when a replica's term as leader begins (engine/cluster/leader_role.py)."""


async def load_leader_parts(engine: Engine) -> None:
    """The durable state of LEADER_PARTS, in dependency order (see `load_engine`)."""
    await engine.hitl.load()
    await engine.scheduler.load()
    await engine.handoffs.load()
    await engine.worktrees.load()  # may await HITL decisions
    await engine.tools.load()
    await engine.workflows.load()  # may submit tasks
    await engine.rooms.load()
    await engine.negotiations.load()  # may escalate


def leader_loops(
    engine: Engine, clock: Clock, sleep: Sleep
) -> dict[str, Callable[[], Coroutine[Any, Any, None]]]:
    """The loops of LEADER_PARTS, by part."""
    return {
        "hitl": lambda: engine.hitl.run(sleep),
        "scheduler": lambda: engine.scheduler.run(sleep),
        "handoffs": lambda: engine.handoffs.run(sleep),
        "worktrees": lambda: engine.worktrees.run(sleep),
        "workflows": lambda: engine.workflows.run(sleep),
        "rooms": lambda: run_deadlines(engine.rooms.timers, clock, engine.rooms.fire_due, sleep),
        "negotiations": lambda: engine.negotiations.run(sleep),
    }


async def load_engine(engine: Engine, *, recover_messages: bool = True, leader: bool = True) -> int:
    """Every component's durable state, in dependency order; returns recovered messages.
    Without `recover_messages` (cluster mode) no message is made live at start: a replica
    reads an agent's messages from the store when the agent's stream opens on it
    (engine/cluster/follower.py); without `leader` (cluster mode) LEADER_PARTS are loaded
    when this replica's term as the cluster's leader begins (engine/cluster/leader_role.py).
    """
    await engine.registry.load()
    if leader:
        await engine.hitl.load()
        await engine.scheduler.load()
        await engine.handoffs.load()
        await engine.worktrees.load()
        await engine.tools.load()
    recovered = await engine.router.recover() if recover_messages else 0
    if leader:
        await engine.workflows.load()  # may submit tasks: after the router's inboxes are back
        await engine.rooms.load()
        # After the router's recovery: resuming may escalate, which delivers notices.
        await engine.negotiations.load()
    return recovered


async def close_engine(engine: Engine) -> None:
    await engine.scheduler.close()
    await engine.worktrees.close()
    await engine.rooms.close()
    await engine.negotiations.close()
    await engine.router.flush_deliveries()  # after the others: they may still hand out
    await engine.events.close()  # last: every step above may have logged
