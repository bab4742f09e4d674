"""`apiary serve` and `apiary agent run` as processes of an end-to-end test: a coordinator on
a data directory (its SQLite file) that can be SIGKILLed and started again on the same file
and ports, and SDK agents run by the command line against it."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
START_S = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServeProcess:
    """`apiary serve --data-dir DATA_DIR` (with `config` when given) on ports chosen once, so
    that a restart binds them again. Logs go beside the data directory."""

    def __init__(self, data_dir: Path, config: Path | None = None) -> None:
        self.data_dir = data_dir
        self.config = config
        self.grpc = f"127.0.0.1:{free_port()}"
        self.http = f"127.0.0.1:{free_port()}"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        """Start it and wait until it serves (it prints its two addresses)."""
        # Its log goes to a file, never to an unread pipe (a full pipe would stall it).
        log = (self.data_dir.parent / "coordinator.log").open("ab")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "apiary.cli.main", "serve", "--data-dir", str(self.data_dir),
            "--grpc", self.grpc, "--http", self.http,
            *(("--config", str(self.config)) if self.config is not None else ()),
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=log,
        )  # fmt: skip
        log.close()
        assert self.proc.stdout is not None
        for _ in range(2):
            line = await asyncio.wait_for(self.proc.stdout.readline(), START_S)
            assert line, "apiary serve exited early"

    async def kill(self) -> None:
        """SIGKILL: nothing is flushed or closed, as in a crash."""
        assert self.proc is not None
        await kill(self.proc)


async def start_agent(serve: ServeProcess, target: str) -> asyncio.subprocess.Process:
    """`apiary agent run TARGET` against `serve` (its log beside the data directory)."""
    log = (serve.data_dir.parent / "agent.log").open("ab")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "apiary.cli.main", "agent", "run", target,
        "--coordinator", serve.grpc,
        cwd=ROOT, stdout=asyncio.subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    log.close()
    return proc


async def kill(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL `proc` when it still runs, and reap it."""
    if proc.returncode is None:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
