"""`apiary serve` as a real process: printed ports, health over gRPC, /healthz, SIGTERM; the
summary it prints, the log it writes, and the address it records for client commands."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from apiary.cli.serve_run import _store_text
from apiary.server.config.server import ServerConfig
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


# --- what `apiary serve` tells people, where it logs, and how clients find it -----------------

ROOT = Path(__file__).resolve().parents[2]
CLIENT_VARIABLES = (
    "APIARY_API_KEY", "APIARY_TLS_CA", "APIARY_TLS_CERT", "APIARY_TLS_KEY", "APIARY_COORDINATOR",
    "APIARY_PROFILE", "APIARY_CLIENT_CONFIG", "APIARY_DATA_DIR", "APIARY_TOKEN", "APIARY_TENANT",
    "XDG_CONFIG_HOME", "APIARY_GRPC", "APIARY_HTTP", "APIARY_CONFIG", "APIARY_STORE",
)  # fmt: skip
SUMMARY_END = "Ctrl-C stops it."


def _clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment without client or server settings, with a home of its own."""
    base = {k: v for k, v in os.environ.items() if k not in CLIENT_VARIABLES}
    return {**base, "HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT), **extra}


async def _client(cwd: Path, env: dict[str, str], *args: str) -> dict[str, object]:
    proc = await asyncio.create_subprocess_exec(
        *APIARY, *args, cwd=cwd, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    doc: dict[str, object] = json.loads(out)
    return doc


async def _first_line(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
    assert line, "the process ended before printing a line"
    return line.rstrip("\n")


async def _said(proc: asyncio.subprocess.Process, start: str, *, anywhere: bool = False) -> str:
    """The first line on `proc`'s stderr that starts with `start` (`anywhere`: holds it); the
    process ending first fails the test."""
    assert proc.stderr is not None
    while True:
        line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
        assert line, f"the process ended before saying {start!r}"
        if start in line if anywhere else line.startswith(start):
            return line.rstrip("\n")


async def test_status_in_the_same_data_directory_finds_the_coordinator_serve_chose(
    tmp_path: Path,
) -> None:
    env = _clean_env(tmp_path)
    proc = await asyncio.create_subprocess_exec(
        *APIARY, "serve", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", cwd=tmp_path,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        lines = [await _first_line(proc)]
        while not lines[-1].endswith(SUMMARY_END):
            lines.append(await _first_line(proc))
        grpc_at, http_at = lines[0].removeprefix("grpc="), lines[1].removeprefix("http=")
        assert lines[:2] == [f"grpc={grpc_at}", f"http={http_at}"]
        assert not grpc_at.endswith(":0") and not http_at.endswith(":0")
        summary = "\n".join(lines[2:])
        for shown in (
            f"gRPC      {grpc_at}", f"HTTP      http://{http_at}",
            f"console   http://{http_at}/console", "store     SQLite .apiary/apiary.db",
            "mode      development: no TLS", "data dir  .apiary (address recorded in "
            ".apiary/serving.json)", "log       .apiary/apiary.log",
        ):  # fmt: skip
            assert shown in summary, summary
        record = json.loads((tmp_path / ".apiary" / "serving.json").read_text())
        assert (record["grpc"], record["http"], record["pid"]) == (grpc_at, http_at, proc.pid)

        # No address anywhere: the record in ./.apiary (and in APIARY_DATA_DIR elsewhere).
        doc = await _client(tmp_path, env, "status", "--json")
        called: Any = doc["coordinator"]
        assert called["address"] == grpc_at
        assert called["source"] == "the address `apiary serve` recorded in .apiary/serving.json"
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        moved = {**env, "APIARY_DATA_DIR": str(tmp_path / ".apiary")}
        called = (await _client(elsewhere, moved, "status", "--json"))["coordinator"]
        assert called["address"] == grpc_at

        # `agent run` says where it connected and as whom (on stderr, beside its log).
        agent = await asyncio.create_subprocess_exec(
            *APIARY, "agent", "run", "tests.e2e.sdk_agents:Echo", cwd=tmp_path, env=env,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert await _said(agent, "apiary agent run: ") == (
                f"apiary agent run: echo connected to the coordinator at {grpc_at} (from the "
                "address `apiary serve` recorded in .apiary/serving.json) as agent echo of "
                "tenant default; credentials: none (anonymous; dev mode only)"
            )
        finally:
            agent.send_signal(signal.SIGTERM)
            await asyncio.wait_for(agent.communicate(), 60)
        assert agent.returncode == 0

        async with aiohttp.ClientSession() as http, http.get(f"http://{http_at}/healthz") as r:
            assert r.status == 200
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0
    assert not (tmp_path / ".apiary" / "serving.json").exists()
    # The terminal got the summary; the event log's JSON and the access lines went to the file.
    assert err.decode() == "apiary: shutting down\n"
    log = (tmp_path / ".apiary" / "apiary.log").read_text()
    assert '"type":"coordinator.started"' in log and '"type":"coordinator.stopped"' in log
    assert "aiohttp.access" in log and "/healthz" in log


async def test_log_format_json_writes_every_log_line_on_stderr(tmp_path: Path) -> None:
    data = tmp_path / "state"
    proc = await asyncio.create_subprocess_exec(
        *APIARY, "serve", "--data-dir", str(data), "--grpc", "127.0.0.1:0",
        "--http", "127.0.0.1:0", "--log-format", "json", env=_clean_env(tmp_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert (await _first_line(proc)).startswith("grpc=")
        # A client started on the address line finds the record: it is written before.
        assert json.loads((data / "serving.json").read_text())["pid"] == proc.pid
        assert (await _first_line(proc)).startswith("http=")
        await _said(proc, '"type":"coordinator.started"', anywhere=True)
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0
    assert out == b""  # no summary: the two address lines only
    assert not (data / "apiary.log").exists() and not (data / "serving.json").exists()


def test_the_summary_names_a_postgresql_store_by_its_hosts_never_its_password() -> None:
    def shown(url: str) -> str:
        return _store_text(ServerConfig(store=url), "postgresql")

    # Several hosts (libpq tries them in turn): no port of its own to parse.
    assert shown("postgresql://u:s3cret@h1:5432,h2:5433/db") == "PostgreSQL h1:5432,h2:5433/db"
    assert shown("postgresql://u:s3cret@db.example/app?sslmode=require") == (
        "PostgreSQL db.example/app"
    )
    assert shown("postgresql://[::1]:5433/test") == "PostgreSQL [::1]:5433/test"
    assert shown("postgresql:///test") == "PostgreSQL localhost/test"


async def test_sigusr1_prints_every_thread_and_task_and_the_coordinator_goes_on(
    tmp_path: Path,
) -> None:
    err = tmp_path / "stderr"
    with err.open("wb") as sink:
        proc = await asyncio.create_subprocess_exec(
            *APIARY, "serve", "--data-dir", str(tmp_path / "state"),
            "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", env=_clean_env(tmp_path),
            stdout=asyncio.subprocess.PIPE, stderr=sink,
        )  # fmt: skip
    try:
        assert (await _first_line(proc)).startswith("grpc=")
        http = (await _first_line(proc)).removeprefix("http=")
        proc.send_signal(signal.SIGUSR1)
        for _ in range(300):
            if "asyncio tasks" in err.read_text(errors="replace"):
                break
            await asyncio.sleep(0.1)
        report = err.read_text(errors="replace")
        assert "report asked for by SIGUSR1" in report
        assert "Current thread" in report or "Thread 0x" in report  # faulthandler's stacks
        assert "apiary-store-health" in report  # an asyncio task, by name
        async with aiohttp.ClientSession() as session, session.get(f"http://{http}/healthz") as r:
            assert r.status == 200  # still serving
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert "still stopping" not in err.read_text(errors="replace")
