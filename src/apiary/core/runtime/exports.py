"""The packs the runtime exports from one session's facts (export_evidence, export_replay,
export_review), built from what the log and the runtime store hold and nothing else: the
same facts give the same pack. Pure: the caller reads the facts and the clock.

- The evidence pack: the session's contract events in the log's order (a range of
  sequences, paged), the snapshot they lead to, and a digest over the events (SHA-256 of
  their canonical JSON), so that a pack can be checked against the log later.
- The replay case: each thread's turns in order with the input to submit again and the
  outcome to compare with (status, result or error).
- The review template: what ended how (turns, tasks, actions), an item per outcome to be
  judged, each with the audit ref (sequence, event id, type) of the fact it rests on.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Final

from apiary.core.runtime.records import ThreadRecord, TurnRecord

PACK_VERSION: Final = 1
REVIEWED: Final = frozenset(
    {
        "turn.completed", "turn.failed", "task.completed", "task.failed", "task.cancelled",
        "task.lost", "action.resolved", "permission.resolved",
    }
)  # fmt: skip
"""The facts a review judges: how each turn, task, action and permission ended."""


def digest(events: Sequence[Mapping[str, Any]]) -> str:
    """`sha256:<hex>` of the events' canonical JSON (sorted keys, no spaces, UTF-8)."""
    text = json.dumps(list(events), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def evidence_pack(
    session_id: str,
    snapshot: Mapping[str, Any],
    events: Sequence[Mapping[str, Any]],
    *,
    after: int,
    through: int,
    more: bool,
    exported_at: str,
) -> dict[str, Any]:
    """The evidence pack of `events` (those after `after`, through `through`)."""
    return {
        "kind": "evidence", "version": PACK_VERSION, "sessionId": session_id,
        "exportedAt": exported_at, "range": {"after": after, "through": through},
        "more": more, "events": list(events), "digest": digest(events),
        "snapshot": dict(snapshot),
    }  # fmt: skip


def replay_case(
    session_id: str,
    threads: Sequence[tuple[ThreadRecord, Sequence[TurnRecord]]],
    *,
    cursor: int,
    exported_at: str,
) -> dict[str, Any]:
    """The replay case of the threads' turns (each list in the thread's order)."""
    return {
        "kind": "replay", "version": PACK_VERSION, "sessionId": session_id,
        "exportedAt": exported_at, "cursor": cursor,
        "threads": [
            {"threadId": thread.thread_id, "scope": thread.scope,
             **({"capability": thread.capability} if thread.capability else
                {"agentId": thread.agent_id}),
             "turns": [_replayed(turn) for turn in turns]}
            for thread, turns in threads
        ],
    }  # fmt: skip


def _replayed(turn: TurnRecord) -> dict[str, Any]:
    expected: dict[str, Any] = {"status": turn.state.lower()}
    if turn.result_json:
        expected["result"] = json.loads(turn.result_json)
    if turn.error_code:
        expected["error"] = {"code": turn.error_code, "message": turn.message}
    return {
        "turnId": turn.turn_id, "ordinal": turn.ordinal, "priority": turn.priority,
        "input": json.loads(turn.input_json) if turn.input_json else None,
        "expected": expected,
    }  # fmt: skip


def review_template(
    session_id: str,
    events: Sequence[Mapping[str, Any]],
    *,
    cursor: int,
    exported_at: str,
) -> dict[str, Any]:
    """The review template over `events` (the session's, in order)."""
    judged = [e for e in events if e.get("type") in REVIEWED]
    return {
        "kind": "review", "version": PACK_VERSION, "sessionId": session_id,
        "exportedAt": exported_at, "cursor": cursor,
        "summary": dict(sorted(Counter(str(e["type"]) for e in judged).items())),
        "items": [_item(e) for e in judged],
        "verdict": None, "reviewer": None, "notes": "",
    }  # fmt: skip


def _item(event: Mapping[str, Any]) -> dict[str, Any]:
    subject = {
        key: event[key] for key in ("threadId", "turnId", "taskId", "actionId") if event.get(key)
    }
    return {
        "ref": {"sequence": event.get("sequence"), "eventId": event.get("eventId"),
                "type": event.get("type")},
        "subject": subject, "outcome": event.get("status", ""), "at": event.get("timestamp"),
        "verdict": None, "notes": "",
    }  # fmt: skip
