"""export_evidence, export_replay and export_review: packs built from one session's facts
(core/runtime/exports.py), for the session's owner (operators with `tasks` too), as the
session's other reads are. They read and change nothing: the log is the record, and the
same facts give the same pack (an evidence pack's digest shows it).

The evidence pack pages through the session's events (`after`, `limit`; `more` and the
range say where the next page starts); the review reads at most MAX_REVIEWED events of the
session and says so when there were more; the replay case lists at most MAX_TURNS turns per
thread, the latest ones.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Final

from apiary.controlplane.facts import FactWriter
from apiary.controlplane.reads import Reads
from apiary.controlplane.requests import Params
from apiary.core.access.principal import Principal
from apiary.core.clock import Clock
from apiary.core.dedup import iso_utc
from apiary.core.runtime.exports import evidence_pack, replay_case, review_template
from apiary.core.runtime.log import runtime_event, session_filter
from apiary.errors import ValidationError

DEFAULT_PAGE: Final = 1000
MAX_PAGE: Final = 5000
"""Events in one evidence page at most."""
MAX_REVIEWED: Final = 50_000
"""Events one review reads at most."""
MAX_TURNS: Final = 1000
"""Turns per thread in one replay case at most (the latest)."""
_READ_BATCH: Final = 1000


@dataclass(frozen=True, slots=True)
class ExportEvidence:
    session_id: str
    after: int
    limit: int

    @classmethod
    def read(cls, p: Params) -> ExportEvidence:
        after = p.integer("after") or 0
        limit = p.integer("limit", minimum=1, maximum=MAX_PAGE)
        return cls(p.id("session_id", required=True), after, limit or DEFAULT_PAGE)


@dataclass(frozen=True, slots=True)
class ExportReplay:
    session_id: str
    thread_id: str

    @classmethod
    def read(cls, p: Params) -> ExportReplay:
        return cls(p.id("session_id", required=True), p.id("thread_id"))


@dataclass(frozen=True, slots=True)
class ExportReview:
    session_id: str

    @classmethod
    def read(cls, p: Params) -> ExportReview:
        return cls(p.id("session_id", required=True))


class Exports:
    """The export commands of one control plane (module docstring)."""

    def __init__(self, facts: FactWriter, reads: Reads, clock: Clock, lock: asyncio.Lock) -> None:
        self._store = facts.store
        self._events = facts.events
        self._reads = reads
        self._clock = clock
        self._lock = lock

    async def evidence(self, caller: Principal, req: ExportEvidence) -> dict[str, Any]:
        async with self._lock:
            session = await self._reads.session(caller, req.session_id)
            top = await self._events.last_sequence()
            if req.after > top:
                raise ValidationError.for_field(
                    "after", f"is past the log's end ({top}): nothing follows it yet"
                )
            found = await self._events.read(
                after=req.after, limit=req.limit + 1, where=session_filter(session.session_id)
            )
            more = len(found) > req.limit
            page = [runtime_event(e).to_json() for e in found[: req.limit]]
            through = int(page[-1]["sequence"]) if more and page else top
            threads = await self._store.threads(session.session_id)
            snapshot = await self._reads.snapshot(session, threads, through)
        pack = evidence_pack(
            session.session_id, snapshot.to_json(), page, after=req.after, through=through,
            more=more, exported_at=iso_utc(self._clock.now()),
        )  # fmt: skip
        return {"evidence": pack}

    async def replay(self, caller: Principal, req: ExportReplay) -> dict[str, Any]:
        async with self._lock:
            session = await self._reads.session(caller, req.session_id)
            if req.thread_id:
                _, thread = await self._reads.thread(caller, req.thread_id, session.session_id)
                threads = [thread]
            else:
                threads = await self._store.threads(session.session_id)
            cursor = await self._events.last_sequence()
            found = [(t, await self._store.turns(t.thread_id, MAX_TURNS)) for t in threads]
        ordered = [(t, sorted(turns, key=lambda turn: turn.ordinal)) for t, turns in found]
        case = replay_case(
            session.session_id, ordered, cursor=cursor, exported_at=iso_utc(self._clock.now())
        )
        return {"replay": case}

    async def review(self, caller: Principal, req: ExportReview) -> dict[str, Any]:
        async with self._lock:
            session = await self._reads.session(caller, req.session_id)
            cursor = await self._events.last_sequence()
            where = session_filter(session.session_id)
            events: list[dict[str, Any]] = []
            after = 0
            while len(events) <= MAX_REVIEWED:
                batch = await self._events.read(after=after, limit=_READ_BATCH, where=where)
                events.extend(runtime_event(e).to_json() for e in batch)
                if len(batch) < _READ_BATCH:
                    break
                after = batch[-1].sequence
        template = review_template(
            session.session_id, events[:MAX_REVIEWED], cursor=cursor,
            exported_at=iso_utc(self._clock.now()),
        )  # fmt: skip
        template["truncated"] = len(events) > MAX_REVIEWED
        return {"review": template}
