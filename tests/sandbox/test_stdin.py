"""An interactive program (SandboxSpec.keep_stdin): its standard input stays open while it
runs, takes what `write_stdin` writes in order, and closes on eof; a program started
without it takes no input."""

from __future__ import annotations

import pytest

from apiary.core.tools.policy import ExecutionPolicy
from apiary.errors import AlreadyCompletedError
from apiary.sandbox import Outcome, SandboxedProcess, SandboxSpec, start
from tests.sandbox.conftest import python, requires_root

pytestmark = requires_root

ECHO = """
import sys
for line in sys.stdin:
    print("got", line.strip(), flush=True)
print("bye", flush=True)
"""


async def _read_until(process: SandboxedProcess, needle: bytes) -> bytes:
    seen = b""
    async for chunk in process.chunks():
        seen += chunk
        if needle in seen:
            break
    return seen


async def test_input_written_while_it_runs_reaches_the_program_until_eof() -> None:
    spec = SandboxSpec(python(ECHO), ExecutionPolicy(budget_wall_ms=20_000), keep_stdin=True)
    async with await start(spec) as process:
        assert process.interactive and process.takes_input
        await process.write_stdin(b"one\n")
        assert b"got one" in await _read_until(process, b"got one")
        await process.write_stdin(b"two\nthr", eof=False)
        await process.write_stdin(b"ee\n", eof=True)
        assert not process.takes_input
        result = await process.wait()
        assert result.outcome is Outcome.OK
        assert result.stdout.decode().splitlines() == ["got one", "got two", "got three", "bye"]
        with pytest.raises(AlreadyCompletedError, match="has ended"):
            await process.write_stdin(b"late\n")


async def test_a_program_started_with_its_input_closed_takes_none() -> None:
    spec = SandboxSpec(python(ECHO), ExecutionPolicy(), stdin=b"only\n")
    async with await start(spec) as process:
        result = await process.wait()
        assert result.stdout.decode().splitlines() == ["got only", "bye"]
        assert not process.interactive
        with pytest.raises(AlreadyCompletedError):
            await process.write_stdin(b"more\n")


async def test_a_program_that_closed_its_input_refuses_more() -> None:
    deaf = "import os, sys, time\nos.close(0)\nprint('closed', flush=True)\ntime.sleep(30)\n"
    spec = SandboxSpec(python(deaf), ExecutionPolicy(budget_wall_ms=20_000), keep_stdin=True)
    async with await start(spec) as process:
        await _read_until(process, b"closed")
        with pytest.raises(AlreadyCompletedError, match="no longer reads"):
            for _ in range(2):  # the first write may still be taken by the pipe
                await process.write_stdin(b"x\n")
        assert not process.takes_input
        await process.cancel(grace_s=0.5)
        assert (await process.wait()).outcome is Outcome.CANCELLED
