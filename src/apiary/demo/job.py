"""The demo job: an embedded coordinator (SQLite in a temporary data directory) and two
real agent processes that exchange a message, acknowledge it and report it.

Success is judged from the coordinator's event log and the agents' reports, never assumed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apiary.core.events import Event
from apiary.server.config import Address, ServerConfig
from apiary.server.coordinator import open_coordinator

PROCESS_TIMEOUT_S = 60.0


@dataclass
class DemoResult:
    ok: bool
    reason: str
    data_dir: Path
    seconds: float
    reports: list[dict[str, Any]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    def count(self, event_type: str) -> int:
        return sum(1 for e in self.events if e.event_type == event_type)

    def ack_stages(self) -> Counter[str]:
        """Acknowledged stages that moved a message, e.g. {'READ': 1, 'FULFILLED': 2}."""
        return Counter(
            str(e.details.get("input")).removeprefix("ACK_")
            for e in self.events
            if e.event_type == "message.state" and str(e.details.get("input")).startswith("ACK_")
        )


async def _spawn(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "apiary.demo.pingpong", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def _finish(proc: asyncio.subprocess.Process, name: str) -> dict[str, Any]:
    out, err = await asyncio.wait_for(proc.communicate(), PROCESS_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} exited {proc.returncode}: {err.decode().strip()[-2000:]}")
    lines = [ln for ln in out.decode().splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"{name} printed no report")
    report: dict[str, Any] = json.loads(lines[-1])
    return report


async def _exchange(grpc_address: str) -> list[dict[str, Any]]:
    bob = await _spawn("responder", "bob", "alice", grpc_address)
    assert bob.stdout is not None
    line = await asyncio.wait_for(bob.stdout.readline(), PROCESS_TIMEOUT_S)
    if line.strip() != b"ready":
        bob.kill()
        _, err = await bob.communicate()
        raise RuntimeError(f"bob did not start: {err.decode().strip()[-2000:]}")
    alice = await _spawn("initiator", "alice", "bob", grpc_address)
    return list(await asyncio.gather(_finish(alice, "alice"), _finish(bob, "bob")))


def _judge(reports: list[dict[str, Any]], events: list[Event]) -> str:
    """'' when the log shows the full exchange, else what is missing."""
    received = sum(1 for e in events if e.event_type == "message.received")
    fulfilled = sum(
        1 for e in events if e.event_type == "message.state" and e.details.get("to") == "FULFILLED"
    )
    alice = next((r for r in reports if r.get("agent") == "alice"), {})
    if alice.get("reply") != "hello back":
        return f"alice did not get the reply (report: {alice})"
    if received < 2 or fulfilled < 2:
        return f"event log shows {received} messages received, {fulfilled} fulfilled; expected 2+"
    return ""


async def run_demo(data_dir: Path | None = None) -> DemoResult:
    """Run the whole job; never raises for a failed exchange (the result says why)."""
    base = data_dir or Path(tempfile.mkdtemp(prefix="apiary-demo-"))
    config = ServerConfig(data_dir=base, grpc=Address("127.0.0.1", 0), http=Address("127.0.0.1", 0))
    started = time.monotonic()
    async with open_coordinator(config) as coordinator:
        try:
            reports = await _exchange(str(coordinator.grpc_address))
            reason = ""
        except (RuntimeError, TimeoutError) as exc:
            reports, reason = [], str(exc) or type(exc).__name__
        events = await coordinator.events.read(limit=5000)
    reason = reason or _judge(reports, events)
    return DemoResult(not reason, reason, base, time.monotonic() - started, reports, events)
