"""What the demo's agents share: the repository's id, progress lines, git, and tool runs."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apiary.errors import ApiaryError
from apiary.sdk.tools import ToolClient

REPO_ID = "shop"
"""The repository the demo configures ([[worktrees.repos]])."""
CRITICS = ("critic-ruff", "critic-pytest")
INDEXER = "indexer"


def say(text: str) -> None:
    """One progress line on stdout (the demo shows each agent's latest line)."""
    print(text, flush=True)


def say_result(text: str) -> None:
    """A progress line about a task's result that came back through its handle: the demo
    shows it among the run's notable lines (apiary.demo.timeline, RESULT_LINE)."""
    say(f"result: {text}")


async def git(cwd: Path, *args: str, author: str = "") -> str:
    """Run git in `cwd` and return its output; RuntimeError with git's message on failure."""
    env = dict(os.environ)
    if author:
        env |= {
            "GIT_AUTHOR_NAME": author,
            "GIT_AUTHOR_EMAIL": f"{author}@apiary.invalid",
            "GIT_COMMITTER_NAME": author,
            "GIT_COMMITTER_EMAIL": f"{author}@apiary.invalid",
        }
    proc = await asyncio.create_subprocess_exec(
        "git",
        "-C",
        str(cwd),
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {err.decode().strip() or out.decode().strip()}")
    return out.decode().strip()


@dataclass(frozen=True, slots=True)
class ToolRun:
    """A command tool's exit code and standard output."""

    exit_code: int
    output: str


async def run_tool(tools: ToolClient, name: str, args: Any = None, **options: Any) -> ToolRun:
    """Run a command tool through the coordinator and keep its output whatever its exit code:
    a non-zero exit is TOOL_FAILED after the output frames, which is an answer here (pytest
    exits 1 when a test fails), not an error."""
    chunks: list[bytes] = []
    try:
        async for frame in tools.stream(name, args or {}, **options):
            chunks.append(frame.data)
    except ApiaryError as exc:
        if exc.code != "TOOL_FAILED" or "exit_code" not in exc.details:
            raise
        return ToolRun(int(exc.details["exit_code"]), b"".join(chunks).decode("utf-8", "replace"))
    return ToolRun(0, b"".join(chunks).decode("utf-8", "replace"))
