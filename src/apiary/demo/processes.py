"""The demo's agent processes: six `apiary agent run` processes on the example agents.

The agents live in the checkout's `examples/demo_agents/` (written with the SDK only, as any
user's agents would be). Each process's progress lines (stdout) are kept for the live view
and, with its log (stderr), appended to `DIR/logs/<agent>.log`.

Each process is its own principal (demo/principals.py): it is started with its client
configuration (`APIARY_CLIENT_CONFIG`: the run's CA and its client certificate) and its
signing key (`--signing-key`), and checks the signature of every message another agent
sends it (`--verify-signatures`). The client settings of the environment the demo runs in
are not passed on: an agent presents its own credentials and nobody else's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import apiary
from apiary.demo.principals import RunPrincipals
from apiary.sdk.credentials import (
    API_KEY_ENV,
    AUDIENCE_ENV,
    CONFIG_ENV,
    COORDINATOR_ENV,
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
)
from apiary.sdk.keys import SIGNING_KEY_ENV

EXAMPLES_ENV = "APIARY_DEMO_AGENTS"
"""Where the `demo_agents` package is (default: the checkout's examples/ directory)."""
STOP_GRACE_S = 10.0
CLIENT_ENV = frozenset(
    (
        API_KEY_ENV,
        AUDIENCE_ENV,
        CONFIG_ENV,
        COORDINATOR_ENV,
        SIGNING_KEY_ENV,
        TLS_CA_ENV,
        TLS_CERT_ENV,
        TLS_KEY_ENV,
    )
)
"""What would make an agent present other credentials than its own."""


@dataclass(frozen=True, slots=True)
class AgentSpec:
    agent_id: str
    target: str
    """`module:Class` for `apiary agent run`."""
    role: str


AGENTS = (
    AgentSpec("planner", "demo_agents.planner:Planner", "planner"),
    AgentSpec("coder", "demo_agents.coder:Coder", "coder"),
    AgentSpec("critic-ruff", "demo_agents.critics:RuffCritic", "critic: ruff"),
    AgentSpec("critic-pytest", "demo_agents.critics:PytestCritic", "critic: pytest"),
    AgentSpec("merger", "demo_agents.merger:Merger", "merger"),
    AgentSpec("indexer", "demo_agents.indexer:Indexer", "indexer (background)"),
)


def examples_dir() -> Path:
    """The directory holding the `demo_agents` package; FileNotFoundError saying where it
    was looked for."""
    given = os.environ.get(EXAMPLES_ENV)
    root = Path(given) if given else Path(apiary.__file__).resolve().parents[2] / "examples"
    if not (root / "demo_agents" / "__init__.py").is_file():
        raise FileNotFoundError(
            f"the demo's agents are not in {root}/demo_agents: run the demo from a checkout "
            f"of Apiary, or set {EXAMPLES_ENV} to its examples/ directory"
        )
    return root


@dataclass
class AgentProcess:
    spec: AgentSpec
    proc: asyncio.subprocess.Process
    log: Path
    lines: list[str] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.proc.returncode is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


OnLine = Callable[[str, str], None]
"""Called with (agent id, line) for every progress line an agent prints."""


class AgentFleet:
    """The running agent processes; `start` them, watch `exited`, `stop` them gracefully."""

    def __init__(
        self, coordinator: str, logs: Path, on_line: OnLine, principals: RunPrincipals
    ) -> None:
        self._coordinator = coordinator
        self._principals = principals
        self._logs = logs
        self._on_line = on_line
        self.processes: dict[str, AgentProcess] = {}
        self._pumps: list[asyncio.Task[None]] = []
        self.exited = asyncio.Event()
        """Set when any agent process ends on its own."""
        self._stopping = False

    async def start(self, specs: tuple[AgentSpec, ...] = AGENTS) -> None:
        examples = examples_dir()
        env = {
            **{k: v for k, v in os.environ.items() if k not in CLIENT_ENV},
            "PYTHONPATH": os.pathsep.join(
                [str(examples), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
            "PYTHONUNBUFFERED": "1",
        }
        self._logs.mkdir(parents=True, exist_ok=True)
        for spec in specs:
            member = self._principals.agent(spec.agent_id)
            assert member.signing_key is not None  # every agent principal has one
            log = self._logs / f"{spec.agent_id}.log"
            with log.open("ab") as stderr:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "apiary.cli.main",
                    "agent",
                    "run",
                    spec.target,
                    "--id",
                    spec.agent_id,
                    "--coordinator",
                    self._coordinator,
                    "--signing-key",
                    str(member.signing_key),
                    "--verify-signatures",
                    "--log-level",
                    "WARNING",
                    cwd=self._logs.parent,
                    env={**env, CONFIG_ENV: str(member.client_config)},
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=stderr,
                    start_new_session=True,
                )
            running = AgentProcess(spec, proc, log)
            self.processes[spec.agent_id] = running
            self._pumps.append(asyncio.create_task(self._pump(running)))

    async def _pump(self, agent: AgentProcess) -> None:
        assert agent.proc.stdout is not None
        with agent.log.open("a") as log:
            async for raw in agent.proc.stdout:
                line = raw.decode(errors="replace").rstrip()
                agent.lines.append(line)
                log.write(f"[{agent.spec.agent_id}] {line}\n")
                log.flush()
                self._on_line(agent.spec.agent_id, line)
        await agent.proc.wait()
        if not self._stopping:
            self.exited.set()

    def dead(self) -> list[AgentProcess]:
        return [p for p in self.processes.values() if not p.running]

    async def stop(self) -> None:
        """SIGTERM (a graceful shutdown: the agent deregisters), SIGKILL after the grace."""
        self._stopping = True
        for agent in self.processes.values():
            if agent.running:
                with contextlib.suppress(ProcessLookupError):
                    agent.proc.send_signal(signal.SIGTERM)
        waits = [_ended_within(p.proc, STOP_GRACE_S) for p in self.processes.values()]
        for agent, ended in zip(self.processes.values(), await asyncio.gather(*waits), strict=True):
            if not ended and agent.running:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(agent.proc.pid, signal.SIGKILL)
                await agent.proc.wait()
        for pump in self._pumps:
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)


async def _ended_within(proc: asyncio.subprocess.Process, timeout_s: float) -> bool:
    """Whether `proc` ended within `timeout_s`."""
    try:
        async with asyncio.timeout(timeout_s):
            await proc.wait()
    except TimeoutError:
        return False
    return True
