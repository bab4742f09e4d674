"""The export commands of `RuntimeClient` (sdk/runtime.py): packs built from one session's
facts (docs/control-plane.md, export_evidence / export_replay / export_review).

    async for page in runtime.evidence_pages(session_id):   # every page, in order
        archive(page["events"], page["digest"])
    case = await runtime.export_replay(session_id)           # each turn's input and outcome
    review = await runtime.export_review(session_id)         # an item per outcome, with refs

Answers are the packs as the commands give them (JSON objects).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any


class RuntimeExportCommands:
    """The export commands, over `call` (RuntimeClient's)."""

    async def call(self, command: str, **params: Any) -> dict[str, Any]:
        raise NotImplementedError

    async def export_evidence(
        self, session_id: str, *, after: int = 0, limit: int = 0
    ) -> dict[str, Any]:
        """One page of the session's evidence: its events after `after` (at most `limit`,
        the coordinator's default when 0), their digest and the snapshot they lead to."""
        answer = await self.call(
            "export_evidence", session_id=session_id, after=after, limit=limit or None
        )
        pack: dict[str, Any] = answer["evidence"]
        return pack

    async def evidence_pages(
        self, session_id: str, *, after: int = 0, limit: int = 0
    ) -> AsyncIterator[dict[str, Any]]:
        """Every page of the session's evidence from `after`, in order."""
        while True:
            page = await self.export_evidence(session_id, after=after, limit=limit)
            yield page
            if not page["more"]:
                return
            after = int(page["range"]["through"])

    async def export_replay(self, session_id: str, *, thread_id: str = "") -> dict[str, Any]:
        """The replay case: each thread's turns (or `thread_id`'s) with their input and
        expected outcome."""
        case: dict[str, Any] = (
            await self.call("export_replay", session_id=session_id, thread_id=thread_id or None)
        )["replay"]
        return case

    async def export_review(self, session_id: str) -> dict[str, Any]:
        """The review template: an item per outcome with the audit ref of its fact."""
        review: dict[str, Any] = (await self.call("export_review", session_id=session_id))["review"]
        return review
