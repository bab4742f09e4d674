"""`apiary negotiation ...` against a running coordinator (real sockets, real CLI process)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from apiary.engine.assembly import Runtime
from apiary.engine.hitl import HitlSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator

TOKEN = "cli-operator-token"
HITL = HitlSettings(operators=(OperatorEntry("olivia", token_digest(TOKEN), ("admin",)),))


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path, runtime=Runtime(hitl=HITL)) as running:
        for agent in ("frontend", "graphql"):
            await running.registry.register({
                "agent_id": agent, "name": agent, "modalities_supported": ["application/json"],
                "reasoning_connectors": ["builtin://rules"],
            })  # fmt: skip
        yield running


async def _cli(coordinator: Coordinator, *args: str, ok: bool = True) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "apiary.cli.main", "negotiation", *args,
        "--grpc", str(coordinator.grpc_address),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "APIARY_TOKEN": TOKEN, "COLUMNS": "200"},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert (proc.returncode == 0) == ok, err.decode()
    return (out if ok else err).decode()


async def test_an_operator_runs_a_negotiation_from_the_cli(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "required": ["path"]}))
    nid = (await _cli(coordinator, "open", "--topic", "/api/v3/orders", "-p", "frontend",
                      "-p", "graphql", "--intensity", "high", "--schema", str(schema),
                      "--prefer", "frontend:max_rounds=2")).strip()  # fmt: skip
    refused = await _cli(coordinator, "propose", nid, "--from", "frontend", "--data", "{}",
                         ok=False)  # fmt: skip
    assert "validation_error: payload:" in refused and "'path' is a required property" in refused
    await _cli(coordinator, "propose", nid, "--from", "frontend", "--data", '{"path": "/o"}')
    await _cli(coordinator, "propose", nid, "--from", "graphql", "--counter",
               "--data", '{"path": "/orders"}')  # fmt: skip
    await _cli(coordinator, "evaluate", nid, "--from", "frontend", "--score", "0.5",
               "--llm-confidence", "0.4", "--notes", "close")  # fmt: skip
    (shown,) = json.loads(await _cli(coordinator, "list", "--json", "--state", "AWAITING_HITL"))
    assert (shown["negotiation_id"], shown["stop_reason"]) == (nid, "max_rounds")
    decided = await _cli(coordinator, "decide", nid, "--action", "decide=v2", "-r", "B wins")
    assert "DECIDED" in decided
    details = json.loads(await _cli(coordinator, "show", nid, "--json"))
    assert details["artifacts"][:3] == ["contract_v1.json", "contract_v2.json",
                                        "diff_v1_to_v2.json"]  # fmt: skip
    assert [r["from_agent"] for r in details["rounds"]] == ["frontend", "graphql"]
    table = await _cli(coordinator, "policy", "profiles")
    assert "HIGHEST" in table
    effective = json.loads(await _cli(coordinator, "policy", "effective", nid, "--json"))
    assert effective["policy"]["max_rounds"] == 2
    assert effective["applied"]["frontend"]["max_rounds"] == 2
