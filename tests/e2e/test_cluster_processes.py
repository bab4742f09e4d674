"""Cluster mode as real processes (docs/cluster.md): two `apiary serve --cluster` on one
PostgreSQL schema share the partitions (`apiary cluster status`); an agent connected to one
answers `apiary send --wait` run against the other (the message, the reply and the ACK
each cross between the replicas through the store); both stop cleanly on SIGTERM, leaving
no replica in the lease table."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from asyncio.subprocess import Process
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

import apiary

pytestmark = pytest.mark.postgres

APIARY = [sys.executable, "-m", "apiary.cli.main"]
ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 60.0
CLIENT_VARIABLES = (
    "APIARY_COORDINATOR", "APIARY_PROFILE", "APIARY_API_KEY", "APIARY_TLS_CA", "APIARY_TLS_CERT",
    "APIARY_TLS_KEY", "APIARY_SIGNING_KEY", "APIARY_TOKEN", "APIARY_CLIENT_CONFIG",
    "APIARY_DATA_DIR", "APIARY_TENANT", "XDG_CONFIG_HOME", "APIARY_GRPC", "APIARY_HTTP",
    "APIARY_CONFIG", "APIARY_STORE",
)  # fmt: skip


class Echo(apiary.Agent):
    agent_id = "echo"

    async def on_data(self, msg: apiary.Message) -> str:
        await msg.reply(msg.json())
        return "echoed"


def _env(tmp_path: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in CLIENT_VARIABLES}
    src = str(ROOT / "src")
    path = os.pathsep.join(p for p in (src, base.get("PYTHONPATH", "")) if p)
    return {**base, "HOME": str(tmp_path / "home"), "PYTHONPATH": path}


@asynccontextmanager
async def _serve(
    tmp_path: Path, url: str, name: str, *extra: str
) -> AsyncIterator[tuple[str, Process]]:
    """`apiary serve --cluster` on `url`; its gRPC address once it serves."""
    proc = await asyncio.create_subprocess_exec(
        *APIARY, "serve", "--cluster", "--store", url, "--data-dir", str(tmp_path / name), *extra,
        "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", env=_env(tmp_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        grpc = ""
        while not grpc:
            line = (await asyncio.wait_for(proc.stdout.readline(), WAIT_S)).decode()
            assert line, f"apiary serve --cluster ({name}) exited before serving"
            if line.startswith("grpc="):
                grpc = line.strip().partition("=")[2]
        yield grpc, proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _run(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *APIARY, *args, env=_env(tmp_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), WAIT_S)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _status(tmp_path: Path, url: str) -> dict[str, object]:
    code, out, err = await _run(tmp_path, "cluster", "status", "--store", url, "--json")
    assert code == 0, err
    doc: dict[str, object] = json.loads(out)
    return doc


async def _shared(tmp_path: Path, url: str, shares: list[int]) -> dict[str, object]:
    """`apiary cluster status` once the live replicas hold `shares` partitions."""
    for _ in range(int(WAIT_S / 0.1)):
        doc = await _status(tmp_path, url)
        replicas = doc["replicas"]
        assert isinstance(replicas, list)
        if sorted(r["partitions"] for r in replicas if r["live"]) == shares:
            return doc
        await asyncio.sleep(0.1)
    raise AssertionError(f"the live replicas never held {shares} partitions")


@asynccontextmanager
async def _running(agent: apiary.Agent) -> AsyncIterator[None]:
    registered = asyncio.Event()
    job = asyncio.create_task(agent.run(on_registered=registered.set))
    try:
        await asyncio.wait_for(registered.wait(), WAIT_S)
        yield
    finally:
        await agent.shutdown()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(job, WAIT_S)


async def test_an_agent_on_one_replica_answers_a_send_through_the_other(
    tmp_path: Path, postgres_dsn: str, postgres_schema: str
) -> None:
    url = f"{postgres_dsn}?apiary_schema={postgres_schema}"
    async with _serve(tmp_path, url, "a") as (a, a_proc), _serve(tmp_path, url, "b") as (b, b_proc):
        await _shared(tmp_path, url, [32, 32])
        async with _running(Echo(coordinator=a)):
            code, out, err = await _run(
                tmp_path, "send", "echo", "--json", '{"hello": "world"}', "--wait",
                "--coordinator", b,
            )  # fmt: skip
            assert (code, out) == (0, '{"hello": "world"}\n'), err
            assert err.strip().endswith("FULFILLED by echo: echoed")

        for proc in (a_proc, b_proc):
            proc.send_signal(signal.SIGTERM)
        for proc in (a_proc, b_proc):
            assert await asyncio.wait_for(proc.wait(), WAIT_S) == 0
    assert (await _status(tmp_path, url))["replicas"] == []  # both left cleanly


async def test_a_killed_replicas_partitions_are_taken_over_and_the_other_serves_on(
    tmp_path: Path, postgres_dsn: str, postgres_schema: str
) -> None:
    url = f"{postgres_dsn}?apiary_schema={postgres_schema}"
    config = tmp_path / "apiary.toml"
    config.write_text("[cluster]\nlease_s = 1.0\n")
    async with (
        _serve(tmp_path, url, "a", "--config", str(config)) as (_, a_proc),
        _serve(tmp_path, url, "b", "--config", str(config)) as (b, b_proc),
    ):
        await _shared(tmp_path, url, [32, 32])
        async with _running(Echo(coordinator=b)):
            a_proc.kill()  # SIGKILL: A releases nothing
            await a_proc.wait()
            doc = await _shared(tmp_path, url, [64])
            partitions = doc["partitions"]
            assert isinstance(partitions, list)
            # B's half came from A when B joined (epoch 2), A's half was taken over when its
            # leases lapsed (epoch 2 as well: A's term was 1): all B's now, none of A's term.
            (live,) = [r["replica_id"] for r in doc["replicas"] if r["live"]]  # type: ignore[attr-defined]
            assert {(p["owner"], p["epoch"]) for p in partitions} == {(live, 2)}
            code, out, err = await _run(
                tmp_path, "send", "echo", "--json", '{"after": "kill"}', "--wait",
                "--coordinator", b,
            )  # fmt: skip
            assert (code, out) == (0, '{"after": "kill"}\n'), err
        b_proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(b_proc.wait(), WAIT_S) == 0
    replicas = (await _status(tmp_path, url))["replicas"]
    assert isinstance(replicas, list)
    assert [r["live"] for r in replicas] == [False]  # A's row stays, expired; B left
