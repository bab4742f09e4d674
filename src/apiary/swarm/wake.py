"""The wake hook: any command, run for every message stored in the inbox with the message's
JSON (as it travelled) on stdin, so that something can wake up and handle it.

The command is split like a shell would (`shlex`) but run without a shell; write
`sh -c '...'` to get one. The request that stored the message never waits for it: the command
runs in the background, owned by the node, at most `parallel` at once (more wait their turn),
and is killed after `timeout_s`. Its exit status and the end of its stderr are logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shlex
from collections.abc import Sequence

from apiary.swarm.node import SwarmNode
from apiary.swarm.wire import SwarmMessage

log = logging.getLogger("apiary.swarm.wake")


class WakeHook:
    def __init__(
        self, node: SwarmNode, command: str | Sequence[str], *, timeout_s: float = 60.0,
        parallel: int = 4,
    ) -> None:  # fmt: skip
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not argv:
            raise ValueError("the wake command is empty")
        self.argv = argv
        self._node = node
        self._timeout = timeout_s
        self._slots = asyncio.Semaphore(parallel)

    async def __call__(self, message: SwarmMessage) -> None:
        """Start the command for `message` in the background and return at once."""
        data = json.dumps(message.to_json(), ensure_ascii=False).encode("utf-8")
        self._node.spawn(self._run(data, message.message_id), f"wake-{message.message_id}")

    async def _run(self, data: bytes, message_id: str) -> None:
        async with self._slots:
            try:
                process = await asyncio.create_subprocess_exec(
                    *self.argv,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.PIPE,
                )
            except OSError as exc:
                log.error("wake command %s cannot start: %s", self.argv[0], exc)
                return
            try:
                async with asyncio.timeout(self._timeout):
                    _, errors = await process.communicate(data)
            except TimeoutError:
                _kill(process)
                await process.wait()
                log.error("wake command for %s killed after %g s", message_id, self._timeout)
                return
            except asyncio.CancelledError:
                _kill(process)
                await process.wait()
                raise
            if process.returncode:
                log.warning("wake command for %s exited %s: %s", message_id, process.returncode,
                            errors[-500:].decode("utf-8", "replace"))  # fmt: skip


def _kill(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        process.kill()
