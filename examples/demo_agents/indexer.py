"""The indexer: a code-search index (symbol -> file:line) built in the background, and urgent
lookups that preempt it.

    apiary agent run demo_agents.indexer:Indexer --coordinator HOST:PORT

Two kinds of Scheduler task (docs/scheduler.md):

full (low priority, e.g. 10)
    Index every `def` and `class` of the repository (read through the confined file API of
    the indexer's own worktree) and of the Python standard library the repository runs on.
    There is a safe point before each file: when a higher-priority task arrives, the
    Scheduler asks this one to yield, the next safe point raises `Preempted`, the SDK
    acknowledges the task `yielded` and the Scheduler puts it back in the queue. The next
    attempt resumes where the last one stopped (the files already indexed are kept). A
    background job should not compete with interactive work: it indexes at most `rate`
    files per second.
lookup (urgent, e.g. -5)
    Where a symbol is defined and used, from the index: `on_task` returns it, and the
    submitter's task handle gives it back (`await handle.result()`).
a turn of the runtime control plane (docs/control-plane.md)
    An application's question on a thread bound to the indexer: its task's params are the
    turn (`{"sessionId", "threadId", "turnId", "input"}`) and its input `{"symbol": S}` asks
    the same lookup, whose answer is the turn's result.

Each returns its result as a JSON value from `on_task`: the SDK reports it with the task's
end, and the coordinator keeps it with the task for its submitter.
"""

from __future__ import annotations

import asyncio
import re
import sysconfig
import time
from pathlib import Path
from typing import Any

import apiary
from apiary.confined import ConfinedRoot
from apiary.errors import ValidationError
from demo_agents.common import REPO_ID, say

SYMBOLS = re.compile(r"^[ \t]*(?:async[ \t]+)?(def|class)[ \t]+(\w+)", re.MULTILINE)
PROGRESS_EVERY = 50
SKIPPED = frozenset({"site-packages", "test", "tests", "idlelib"})
"""Parts of the standard library's tree left out (installed packages, its own tests)."""


class Indexer(apiary.Agent):
    agent_id = "indexer"
    capabilities = ("index", "search")
    description = "Indexes code in the background; answers symbol lookups at once."

    def __init__(self, agent_id: str | None = None, **options: Any) -> None:
        super().__init__(agent_id, **options)
        self.symbols: dict[str, list[dict[str, Any]]] = {}
        self.indexed: set[str] = set()
        self.files: list[tuple[str, Path | None]] = []

    async def setup(self) -> None:
        """Bind the home worktree (main as it is now) and list what a full index covers,
        so that a task starts indexing at once."""
        await self.bind_worktree(REPO_ID, "indexer")
        self.files = self.sources()
        say(f"ready: {len(self.files)} files to index")

    async def on_task(self, task: apiary.TaskContext) -> object:
        params = task.json()
        if "turnId" in params:  # a turn: its input asks a lookup
            return self.lookup(str(params["input"]["symbol"]))
        if params["kind"] == "full":
            return await self.full(task, float(params.get("rate", 100)))
        if params["kind"] == "lookup":
            return self.lookup(params["symbol"])
        raise ValidationError.for_field("kind", f"unknown task kind {params['kind']!r}")

    # ------------------------------------------------------------------ full index

    def sources(self) -> list[tuple[str, Path | None]]:
        """(key, path): repository files first (path None: read through the worktree's
        confined API), then the standard library's modules."""
        assert self.workspace is not None
        repo: list[tuple[str, Path | None]] = [
            (f"{REPO_ID}:{directory}/{name}".replace(":./", ":"), None)
            for directory, _, names in self.workspace.files.walk()
            for name in names
            if name.endswith(".py")
        ]
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        library: list[tuple[str, Path | None]] = [
            (f"stdlib:{p.relative_to(stdlib)}", p)
            for p in sorted(stdlib.rglob("*.py"))
            if not SKIPPED & set(p.relative_to(stdlib).parts)
        ]
        return sorted(repo) + library

    async def full(self, task: apiary.TaskContext, rate: float) -> dict[str, Any]:
        sources = self.files
        resumed_at = sum(1 for key, _ in sources if key in self.indexed)
        say(
            f"full index, attempt {task.attempt}: {len(sources)} files"
            + (f", resuming after {resumed_at}" if resumed_at else "")
        )
        started, done_here = time.monotonic(), 0
        for number, (key, path) in enumerate(sources, 1):
            if key in self.indexed:
                continue
            try:
                await self.safe_point()
            except apiary.Preempted:
                say(f"yielding at a safe point: {len(self.indexed)}/{len(sources)} files indexed")
                raise
            self.index(key, path)
            done_here += 1
            if number % PROGRESS_EVERY == 0:
                await self.progress(number / len(sources), f"{number}/{len(sources)} files")
            # Throttle: a background job leaves the CPU to interactive work.
            ahead = started + done_here / rate - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
        count = sum(len(v) for v in self.symbols.values())
        say(f"index complete: {len(sources)} files, {count} symbols (attempt {task.attempt})")
        return {
            "files": len(sources),
            "symbols": count,
            "attempt": task.attempt,
            "resumed_after": resumed_at,
        }

    def index(self, key: str, path: Path | None) -> None:
        if path is None:
            assert self.workspace is not None
            text = self.workspace.files.read_text(key.partition(":")[2])
        else:
            text = path.read_text(errors="replace")
        for match in SYMBOLS.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            self.symbols.setdefault(match.group(2), []).append(
                {"file": key, "line": line, "kind": match.group(1)}
            )
        self.indexed.add(key)

    # ------------------------------------------------------------------ lookups

    def lookup(self, symbol: str) -> dict[str, Any]:
        assert self.workspace is not None
        files = self.workspace.files
        repo_files = [key for key, path in self.files if path is None]
        for key in repo_files:  # the repository is indexed first; make sure of it
            if key not in self.indexed:
                self.index(key, None)
        definitions = [
            {**d, "file": d["file"].partition(":")[2]}
            for d in self.symbols.get(symbol, [])
            if d["file"].startswith(f"{REPO_ID}:")
        ]
        pattern = re.compile(rf"\b{re.escape(symbol)}\b")
        references = [
            {"file": key.partition(":")[2], "line": n}
            for key in repo_files
            for n, text in enumerate(_lines(files, key.partition(":")[2]), 1)
            if pattern.search(text) and not text.lstrip().startswith(("def ", "class "))
        ]
        answer = {
            "symbol": symbol,
            "definitions": definitions,
            "references": references,
            "indexed_files": len(self.indexed),
        }
        where = ", ".join(f"{d['file']}:{d['line']}" for d in definitions) or "nowhere"
        say(f"lookup of {symbol}: defined at {where}; returned to the submitter")
        return answer


def _lines(files: ConfinedRoot, path: str) -> list[str]:
    return files.read_text(path).splitlines()
