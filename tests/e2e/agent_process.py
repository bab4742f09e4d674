"""One agent process of an end-to-end test and the JSON lines it printed on stdout."""

from __future__ import annotations

import asyncio
import json
from typing import Any


class AgentProcess:
    """A started agent process whose stdout carries one JSON object per line with an
    "event" key. `failure`: an event that ends any wait at once (the agent reported an error)."""

    def __init__(
        self, proc: asyncio.subprocess.Process, *, wait_s: float = 30.0, failure: str = ""
    ) -> None:
        self.proc = proc
        self.lines: list[dict[str, Any]] = []
        self._wait_s = wait_s
        self._failure = failure

    async def expect(self, event: str, **fields: Any) -> dict[str, Any]:
        """The first line (printed so far or next) of `event` with these fields."""

        def matches(line: dict[str, Any]) -> bool:
            return line["event"] == event and all(line.get(k) == v for k, v in fields.items())

        for line in self.lines:
            if matches(line):
                return line

        async def read() -> dict[str, Any]:
            assert self.proc.stdout is not None
            while True:
                raw = await self.proc.stdout.readline()
                assert raw, f"the agent exited before printing {event} {fields}"
                line = json.loads(raw)
                self.lines.append(line)
                if self._failure:
                    assert line["event"] != self._failure, line
                if matches(line):
                    return line

        return await asyncio.wait_for(read(), self._wait_s)

    def printed(self, event: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line["event"] == event]

    def events(self) -> list[str]:
        return [line["event"] for line in self.lines]
