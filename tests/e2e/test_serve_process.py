"""`apiary serve` as a real process: printed ports, health over gRPC, /healthz, SIGTERM."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from apiary.store.open import open_store

APIARY = [sys.executable, "-m", "apiary.cli.main"]


@pytest.fixture
async def served(
    tmp_path: Path,
) -> AsyncIterator[tuple[asyncio.subprocess.Process, dict[str, str]]]:
    proc = await asyncio.create_subprocess_exec(
        *APIARY, "serve", "--data-dir", str(tmp_path / "state"),
        "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None
    ports: dict[str, str] = {}
    while len(ports) < 2:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()
        assert line, "apiary serve exited before printing its ports"
        key, _, value = line.partition("=")
        ports[key] = value
    try:
        yield proc, ports
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
async def test_serve_answers_health_and_stops_gracefully_on_signal(
    served: tuple[asyncio.subprocess.Process, dict[str, str]], tmp_path: Path, stop_signal: int
) -> None:
    proc, ports = served
    async with grpc.aio.insecure_channel(ports["grpc"]) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    async with aiohttp.ClientSession() as http, http.get(f"http://{ports['http']}/healthz") as r:
        assert r.status == 200
    proc.send_signal(stop_signal)
    assert await asyncio.wait_for(proc.wait(), 30) == 0
    async with open_store(None, tmp_path / "state") as store:
        types = [e.event_type for e in await store.events.read()]
    assert types[0] == "coordinator.started"
    assert types[-1] == "coordinator.stopped"


@pytest.mark.conformance("observability.log.record-fields")
async def test_events_command_reads_the_log(
    served: tuple[asyncio.subprocess.Process, dict[str, str]],
) -> None:
    _, ports = served
    proc = await asyncio.create_subprocess_exec(
        *APIARY, "events", "--grpc", ports["grpc"], "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err
    first = json.loads(out.decode().splitlines()[0])
    assert first["type"] == "coordinator.started"
    assert first["actor"] == "coordinator"
    assert {"sequence", "correlation_id", "details"} <= set(first)
    assert first["ts"].endswith("Z")  # UTC, ISO-8601
    assert dt.datetime.fromisoformat(first["ts"]).tzinfo is not None


async def test_bad_flag_exits_2_naming_it(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        *APIARY, "serve", "--data-dir", str(tmp_path), "--grpc", "localhost",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ},
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert b"grpc must be HOST:PORT" in err
