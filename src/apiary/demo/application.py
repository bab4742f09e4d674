"""The run's application (`application:demo-app`, demo/principals.py): once the fix is
merged it asks the indexer where things are, through the runtime control plane over the
HTTP port (docs/control-plane.md), as any application would, with `apiary.RuntimeClient`
and its client certificate.

    session = await ask_the_indexer(http, principals.application, data_dir)
    session.evidence      # DATA_DIR/evidence.jsonl: the session's evidence export

Its session has one thread bound to the indexer and a turn per symbol of LOOKUPS, each run
as the indexer's task (the indexer answers a turn's `{"symbol": S}` with its lookup); the
turns queue in the thread and run one at a time. Then the session's evidence is exported,
every page a line (as `apiary runtime export evidence --out`): the session's events, the
snapshot they lead to and their digest, which anyone can recompute against the log.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from apiary.demo.principals import Member
from apiary.demo.sample_repo import SYMBOL
from apiary.sdk.runtime import RuntimeClient, TurnOutcome

INDEXER: Final = "indexer"
LOOKUPS: Final = (SYMBOL, "total")
"""The symbols the application asks about, a turn each (both defined in the repository)."""
EVIDENCE_FILE: Final = "evidence.jsonl"
TURN_TIMEOUT_S: Final = 60.0


@dataclass(frozen=True, slots=True)
class ApplicationSession:
    """What the application did: its session, how each turn ended, and the evidence file."""

    session_id: str
    thread_id: str
    outcomes: tuple[TurnOutcome, ...]
    evidence: Path
    events: int
    """Events in the evidence export."""
    digests: tuple[str, ...]
    """Each evidence page's digest."""

    @property
    def completed(self) -> bool:
        return all(o.status == "completed" for o in self.outcomes)


async def ask_the_indexer(http: str, member: Member, data_dir: Path) -> ApplicationSession:
    """Run the application's session against the coordinator's HTTP port `http` as
    `member`, and write its evidence to `data_dir`/EVIDENCE_FILE."""
    async with RuntimeClient(http, credentials=member.credentials) as app:
        first, *others = LOOKUPS
        turn = await app.submit_turn({"symbol": first}, agent_id=INDEXER, title="where is it?")
        session_id, thread_id = turn.session_id, turn.thread_id
        turn_ids = [turn.turn_id]
        for symbol in others:
            more = await app.submit_turn({"symbol": symbol}, thread_id=thread_id)
            turn_ids.append(more.turn_id)
        outcomes = tuple(
            [await app.wait_turn(session_id, t, timeout=TURN_TIMEOUT_S) for t in turn_ids]
        )
        path = data_dir / EVIDENCE_FILE
        events, digests = await _export(app, session_id, path)
    return ApplicationSession(session_id, thread_id, outcomes, path, events, digests)


async def _export(app: RuntimeClient, session_id: str, path: Path) -> tuple[int, tuple[str, ...]]:
    """Every evidence page of the session, a JSON line each, to `path`; the events written
    and each page's digest."""
    events, digests = 0, []
    with path.open("w", encoding="utf-8") as out:
        async for page in app.evidence_pages(session_id):
            out.write(json.dumps(page, ensure_ascii=False) + "\n")
            events += len(page["events"])
            digests.append(str(page["digest"]))
    return events, tuple(digests)


def answer_line(outcome: TurnOutcome) -> str:
    """What a turn answered, in a line: where its symbol is defined."""
    result: Any = outcome.result
    if outcome.status != "completed" or not isinstance(result, dict):
        return f"{outcome.status} ({outcome.error.get('code', '-')})"
    where = ", ".join(f"{d['file']}:{d['line']}" for d in result.get("definitions", ()))
    return f"{result.get('symbol')}: defined at {where or 'nowhere'}"
