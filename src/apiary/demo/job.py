"""The demo job: an embedded coordinator (SQLite in the run's directory), a real git
repository with a failing test, and six real agent processes that fix it.

    result = await run_demo(DemoOptions())       # never raises for a failed run
    result.ok, result.reason, result.state, result.repo

1. The run's directory gets the repository (`repo/`, one commit, two failing tests), the
   run's principals (`certs/`: its own CA, the coordinator's certificate and a client
   certificate per principal; `keys/`: the agents' signing keys; demo/principals.py), its
   configuration (`apiary.toml`, `operator-token`) and the coordinator's state
   (`apiary.db`, `worktrees/`, `logs/`).
2. The coordinator starts in this process in secure mode (TLS and mTLS on both ports,
   default-deny authorization, message signing: `secured`, as `apiary serve --secure`);
   once it serves, `DemoOptions.started` is told (the view prints the operator console's
   address, to watch the run live), then the agents start as `apiary agent run` processes
   (examples/demo_agents), each with its own certificate and signing key. The job follows
   the event log for the live view.
3. Once every agent is RUNNABLE, the job, as the agent `user`, sends the planner the brief.
   The planner submits the indexer's background index (keeping its task handle) and starts
   the workflow fix -> review -> merge, and answers once the workflow ended and the index's
   result came back through its handle. The merge waits for a HITL decision, which the
   job's operator gives through HitlOperatorService (a prompt or the demo operator),
   authenticated by its operator certificate.
4. Once the planner answered (the workflow and the background index have ended), the run's
   application asks the indexer where the fixed function is through the runtime control
   plane (a session, a turn per question, demo/application.py) and exports the session's
   evidence to the run's directory; then the agents shut down gracefully, the job's driver
   (`demo-driver`, roles `events` and `dlq`) checks the operator console and its data over
   HTTPS, and the job judges the run from the event log and from the repository itself
   (demo/verdict.py): it succeeds only when the fix is merged into main, main's tests and
   lint pass, the application's turns completed, and no call of the run was refused.
5. With `DemoOptions.linger` (--keep) the coordinator then keeps serving, judged result in
   hand, until `linger` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from apiary.core.envelope import AckStage, MessageType
from apiary.core.events import Event
from apiary.demo.application import ApplicationSession, answer_line, ask_the_indexer
from apiary.demo.configuration import (
    DEMO_OPERATOR,
    OPERATOR_ROLES,
    ServerTls,
    missing_tools,
    write_config,
)
from apiary.demo.operator import Decide, Invocation, Operator, Verdict, auto_approve
from apiary.demo.principals import USER, Member, RunPrincipals, issue_principals
from apiary.demo.processes import AGENTS, AgentFleet
from apiary.demo.sample_repo import ISSUE, REPO_ID, SYMBOL, TEST_FILE, RepoState, check, create
from apiary.demo.timeline import RunState
from apiary.demo.verdict import EXCERPT_MAX, judge
from apiary.errors import ApiaryError
from apiary.sdk.connection import Connection
from apiary.sdk.keys import load_signing_key
from apiary.server.config.loader import load_config
from apiary.server.config.server import ServerConfig, secured
from apiary.server.coordinator import Coordinator, open_coordinator


class DemoError(Exception):
    """The run cannot go on; the message says why."""


@dataclass(frozen=True, slots=True)
class DemoOptions:
    data_dir: Path | None = None
    """The run's directory (empty or absent); default: a new temporary directory."""
    operator: str = DEMO_OPERATOR
    """The configured HITL operator who decides the merge."""
    decide: Decide = auto_approve
    index_rate: float = 150.0
    """Files per second the background index allows itself."""
    observe: Callable[[RunState], None] | None = None
    """Called whenever the run's state changed (the live view)."""
    started: Callable[[Coordinator, RunPrincipals], None] | None = None
    """Called once the coordinator serves, before any agent starts (the view prints where
    the operator console is, to watch the run live)."""
    linger: Callable[[Coordinator, DemoResult], Awaitable[None]] | None = None
    """Called with the coordinator and the judged result once the run is over, before the
    coordinator stops: it keeps serving until this returns (--keep)."""
    ready_timeout_s: float = 90.0
    work_timeout_s: float = 300.0
    """For the work after the brief, not counting the time the operator takes to decide."""


@dataclass
class DemoResult:
    ok: bool
    reason: str
    data_dir: Path
    config_file: Path
    seconds: float
    state: RunState
    events: list[Event] = field(default_factory=list)
    repo: RepoState | None = None
    report: dict[str, Any] = field(default_factory=dict)
    excerpt: list[Event] = field(default_factory=list)
    """The events that explain a failure."""
    logs: dict[str, str] = field(default_factory=dict)
    """The end of each agent's log, for a failure."""
    http: str = ""
    console: str = ""
    """The operator console's path ('' when the HTTP port served no console, or not its
    data to the driver)."""
    principals: RunPrincipals | None = None
    """Who took part, with their certificates and keys (None before they were issued)."""
    application: ApplicationSession | None = None
    """The application's runtime control plane session and its evidence export (None when
    the run did not get that far)."""


def _directory(given: Path | None) -> Path:
    if given is None:
        return Path(tempfile.mkdtemp(prefix="apiary-demo-"))
    given.mkdir(parents=True, exist_ok=True)
    if any(given.iterdir()):  # never mix two runs' state
        raise DemoError(f"{given} is not empty: the demo needs a directory of its own")
    return given


class _Run:
    """One run against a started coordinator."""

    def __init__(
        self,
        coordinator: Coordinator,
        options: DemoOptions,
        state: RunState,
        principals: RunPrincipals,
    ) -> None:
        self.coordinator = coordinator
        self.options = options
        self.state = state
        self.principals = principals
        self.changed = asyncio.Event()
        self.fleet = AgentFleet(
            str(coordinator.grpc_address),
            coordinator.config.data_dir / "logs",
            self._line,
            principals,
        )
        self.operator_busy_s = 0.0
        self.helpers: list[asyncio.Task[None]] = []

    def _line(self, agent_id: str, line: str) -> None:
        self.state.agent_line(agent_id, line)
        self._notify()

    def _notify(self) -> None:
        if self.options.observe is not None:
            self.options.observe(self.state)
        self.changed.set()

    async def follow(self) -> None:
        """Fold every event into the state as it is recorded."""
        events, seen = self.coordinator.events, 0
        while True:
            batch = await events.read(after=seen, limit=1000)
            for event in batch:
                self.state.apply(event)
            if batch:
                seen = batch[-1].sequence
                self.state.queues = _queues(self.coordinator, self.state)
                self._notify()
            else:
                await events.wait_after(seen)

    async def until(self, what: str, done: Callable[[], bool], timeout_s: float) -> None:
        """Wait for `done()`; DemoError when an agent process ends, a helper fails, or the
        time is up (the time the operator takes to decide does not count)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.changed.clear()
            if done():
                return
            dead = self.fleet.dead()
            if dead:
                names = ", ".join(f"{p.spec.agent_id} (exit {p.proc.returncode})" for p in dead)
                raise DemoError(f"agent process {names} ended while waiting for {what}")
            for helper in self.helpers:
                if helper.done() and not helper.cancelled() and helper.exception() is not None:
                    error = helper.exception()
                    raise DemoError(f"{helper.get_name()} failed: {error}") from error
            left = deadline + self.operator_busy_s - time.monotonic()
            if left <= 0:
                raise DemoError(f"timed out after {timeout_s:.0f} s waiting for {what}")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left, 1.0)):
                    await self.changed.wait()

    async def decide(self, invocation: Invocation) -> Verdict:
        started = time.monotonic()
        try:
            return await self.options.decide(invocation)
        finally:
            self.operator_busy_s += time.monotonic() - started

    async def work(self) -> dict[str, Any]:
        """Start the agents, hand the planner the brief, wait for the end of the work."""
        address = str(self.coordinator.grpc_address)
        await self.fleet.start()
        await self.until(
            "the agents to register",
            lambda: self.state.all_runnable(self.fleet.processes),
            self.options.ready_timeout_s,
        )
        decider = self.principals.operator(self.options.operator)
        operator = Operator(address, decider.credentials, self.decide)
        report: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        me = self.principals.agent(USER)
        assert me.signing_key is not None  # every agent principal has one
        async with Connection(
            USER,
            coordinator=address,
            signing_key=load_signing_key(me.signing_key),
            credentials=me.credentials,
            verify_signatures=True,
        ) as user:
            self.helpers = [
                asyncio.create_task(operator.run(), name="the HITL operator"),
                asyncio.create_task(self._await_report(user, report), name="the user's inbox"),
            ]
            try:
                brief = {
                    "repo_id": REPO_ID,
                    "issue": ISSUE,
                    "symbol": SYMBOL,
                    "test_file": TEST_FILE,
                    "index_rate": self.options.index_rate,
                }
                sent = await user.send("planner", brief)
                self.state.note("user", "sent the planner the brief")
                failed = self.state.failed_messages
                await self.until(
                    "the planner's report",
                    lambda: report.done() or sent.message_id in failed,
                    self.options.work_timeout_s,
                )
                if not report.done():
                    raise DemoError(f"the planner failed the brief: {failed[sent.message_id]}")
                answer = report.result()
            finally:
                for helper in self.helpers:
                    helper.cancel()
                await asyncio.gather(*self.helpers, return_exceptions=True)
        return answer

    async def _await_report(self, user: Connection, report: asyncio.Future[dict[str, Any]]) -> None:
        async for env in user.messages():
            if env.message_type is MessageType.DATA and env.producer_id == "planner":
                await user.ack(env, AckStage.FULFILLED, note="report read")
                if not report.done():
                    report.set_result(json.loads(env.payload))
            elif env.message_type is not MessageType.ACKNOWLEDGEMENT:
                await user.ack(env, AckStage.FULFILLED)


def _queues(coordinator: Coordinator, state: RunState) -> dict[str, tuple[int, int]]:
    """Per agent: (tasks queued at the Scheduler, messages in its inbound buffer)."""
    scheduler = coordinator.scheduler
    out = {}
    for agent_id in state.agents:
        tasks = len(scheduler.queued(agent_id)) if scheduler is not None else 0
        inbox = coordinator.router.inboxes().get(agent_id)
        out[agent_id] = (tasks, inbox.depth if inbox is not None else 0)
    return out


CONSOLE_PATH = "/console"
CONSOLE_DATA = "/console/api/workflows"
"""The console's data (the event log's workflows): served to operators holding `events`."""


async def _console_path(http: str, reader: Member) -> str:
    """The operator console's path on the HTTP port, when it serves the page and, to
    `reader` (over mTLS with its certificate), the page's data; '' otherwise."""
    connector = aiohttp.TCPConnector(ssl=reader.ssl_context())
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=5)
    ) as session:
        for path, kind in ((CONSOLE_PATH, "text/html"), (CONSOLE_DATA, "application/json")):
            try:
                async with session.get(f"https://{http}{path}") as reply:
                    if reply.status != 200 or reply.content_type != kind:
                        return ""
            except (aiohttp.ClientError, TimeoutError):
                return ""
    return CONSOLE_PATH


def _check_application(session: ApplicationSession) -> None:
    """DemoError when a turn of the application's session did not complete."""
    if not session.completed:
        ended = "; ".join(answer_line(o) for o in session.outcomes)
        raise DemoError(f"the application's turns did not complete: {ended}")


async def _read_all(coordinator: Coordinator) -> list[Event]:
    events: list[Event] = []
    while True:
        batch = await coordinator.events.read(
            after=events[-1].sequence if events else 0, limit=5000
        )
        if not batch:
            return events
        events.extend(batch)


async def _run_coordinated(
    config: ServerConfig,
    options: DemoOptions,
    principals: RunPrincipals,
    result: DemoResult,
    began: float,
) -> None:
    """Run the work against a coordinator of `config`, judge it, and linger (--keep);
    `began` is when the run began (time.monotonic)."""
    reason = ""
    state = result.state
    async with open_coordinator(config) as coordinator:
        result.http = str(coordinator.http_address)
        state.coordinator = str(coordinator.grpc_address)
        if options.started is not None:
            options.started(coordinator, principals)
        run = _Run(coordinator, options, state, principals)
        follower = asyncio.ensure_future(run.follow())
        try:
            result.report = await run.work()
            application = principals.application
            result.application = await ask_the_indexer(result.http, application, result.data_dir)
            _check_application(result.application)
        except (DemoError, ApiaryError, OSError) as exc:
            reason = str(exc) or type(exc).__name__
        finally:
            await run.fleet.stop()
            result.console = await _console_path(result.http, principals.driver)
            result.logs = {k: p.log_tail() for k, p in run.fleet.processes.items()}
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
            # The run is judged by what happened until now, not by what a person does with
            # the coordinator while it lingers (a refused call of theirs is no failure).
            result.events = await _read_all(coordinator)
        await _judge(result, reason, options.operator)
        result.seconds = time.monotonic() - began
        if options.linger is not None:
            await options.linger(coordinator, result)


async def _judge(result: DemoResult, reason: str, operator: str) -> None:
    """The run's verdict from its events and its repository (`reason`: why the work
    stopped, '' when it ran to its end)."""
    for event in result.events:
        result.state.apply(event)
    approved = str(result.report.get("data", {}).get("approved", {}).get("commit", ""))
    # pytest and ruff run on main meanwhile: the coordinator keeps answering.
    result.repo = await asyncio.to_thread(check, result.data_dir / "repo", approved)
    verdict = judge(result.events, result.repo, operator)
    result.reason = reason or verdict.reason
    result.ok = not result.reason
    result.excerpt = verdict.excerpt
    if not result.ok and not result.excerpt:
        result.excerpt = (verdict.errors or result.events)[-EXCERPT_MAX:]


@contextlib.contextmanager
def _log_to(path: Path) -> Iterator[None]:
    """The coordinator's log lines go to the run's log file, not over the live view."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()


async def run_demo(options: DemoOptions | None = None) -> DemoResult:
    """Run the whole job; never raises for a failed run (the result says why). DemoError
    when the run cannot be set up (a directory that is not empty, git missing)."""
    options = options or DemoOptions()
    started = time.monotonic()
    missing = missing_tools()
    if missing:
        raise DemoError(
            f"the demo's tools need {', '.join(missing)} in {sys.executable}'s environment: "
            "`make demo` installs them (pip install -e '.[dev]')"
        )
    base = _directory(options.data_dir)
    repo = base / "repo"
    try:
        create(repo)
        principals = issue_principals(
            base,
            [(a.agent_id, a.role) for a in AGENTS],
            options.operator,
            OPERATOR_ROLES,
            now=dt.datetime.now(dt.UTC),
        )
        tls = ServerTls(principals.server_cert, principals.server_key, principals.ca)
        config_file = write_config(base, repo, options.operator, tls)
        config = secured(
            load_config(config_file, {}, {"grpc": "127.0.0.1:0", "http": "127.0.0.1:0"})
        )
    except (OSError, RuntimeError, ApiaryError) as exc:
        raise DemoError(f"cannot set up the run in {base}: {exc}") from exc
    state = RunState(options.operator, principals=len(principals.members))
    result = DemoResult(False, "", base, config_file, 0.0, state, principals=principals)
    with _log_to(base / "logs" / "coordinator.log"):
        await _run_coordinated(config, options, principals, result, started)
    return result
