"""The in-memory negotiation and artifact stores (tests, embedding)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from apiary.core.events import EventDraft
from apiary.core.negotiation.records import ArtifactRecord, NegotiationRecord, RoundRecord
from apiary.store.json_codec import dump_json, load_json_object
from apiary.store.memory.events import MemoryEventLog
from apiary.store.sql.checks import check_limit
from apiary.store.sql.negotiations import (
    added_only,
    artifact_from_row,
    artifact_row,
    check_artifact_events,
    negotiation_from_row,
    negotiation_row,
    round_from_row,
    round_row,
)


class MemoryNegotiationStore:
    """`NegotiationStore` over dicts. Records go through the SQL row and back: refused and
    coerced as the SQL backends do, and detached from the caller's mappings. Events that
    commit with a change go to `log`."""

    def __init__(self, artifacts: MemoryArtifactStore, log: MemoryEventLog) -> None:
        self._artifacts = artifacts
        self._log = log
        self._records: dict[str, NegotiationRecord] = {}
        self._rounds: dict[tuple[str, int], RoundRecord] = {}
        self._policies: dict[str, str] = {}

    async def save(
        self,
        record: NegotiationRecord,
        round_: RoundRecord | None = None,
        artifacts: Sequence[ArtifactRecord] = (),
        events: Sequence[EventDraft] = (),
        artifact_events: Sequence[EventDraft] = (),
    ) -> list[bool]:
        """Insert or replace the record and, when given, the round, and append the
        artifacts, together with `events` and the `artifact_events` of the artifacts added
        (nothing here awaits, so nobody sees a part of it)."""
        stored = negotiation_from_row(negotiation_row(record))
        stored_round = None if round_ is None else round_from_row(round_row(round_))
        stored_artifacts = [artifact_from_row(artifact_row(a)) for a in artifacts]
        check_artifact_events(artifacts, artifact_events)
        drafts, artifact_drafts = self._log.checked(events), self._log.checked(artifact_events)
        self._records[stored.negotiation_id] = stored
        if stored_round is not None:
            self._rounds[(stored_round.negotiation_id, stored_round.round)] = stored_round
        added = [self._artifacts.add(a) for a in stored_artifacts]
        self._log.append_now([*drafts, *added_only(artifact_drafts, added)])
        return added

    async def get(self, negotiation_id: str) -> NegotiationRecord | None:
        record = self._records.get(negotiation_id)
        return None if record is None else _copy(record)

    async def rounds(self, negotiation_id: str) -> list[RoundRecord]:
        found = sorted((n, r) for (nid, n), r in self._rounds.items() if nid == negotiation_id)
        return [round_from_row(round_row(r)) for _, r in found]

    async def list(
        self, states: frozenset[str] | None = None, after_created: float = 0.0, limit: int = 100
    ) -> list[NegotiationRecord]:
        """Records in `states` (all when None) created after `after_created`, oldest first
        (by created_at, then negotiation_id), at most `limit`."""
        check_limit(limit)
        found = sorted(
            (r.created_at, r.negotiation_id, r)
            for r in self._records.values()
            if r.created_at > after_created and (states is None or r.state in states)
        )
        return [_copy(r) for _, _, r in found[:limit]]

    async def put_policy(
        self, name: str, policy: Mapping[str, Any], at: float, events: Sequence[EventDraft] = ()
    ) -> None:
        text = dump_json(policy)
        drafts = self._log.checked(events)
        self._policies[name] = text
        self._log.append_now(drafts)

    async def replace_profiles(
        self,
        profiles: Mapping[str, Mapping[str, Any]],
        at: float,
        events: Sequence[EventDraft] = (),
    ) -> None:
        if "" in profiles:
            raise ValueError("a profile needs a name ('' is the base policy)")
        texts = {name: dump_json(p) for name, p in profiles.items()}
        drafts = self._log.checked(events)
        base = self._policies.get("")
        self._policies = texts if base is None else {"": base, **texts}
        self._log.append_now(drafts)

    async def policies(self) -> dict[str, dict[str, Any]]:
        return {name: load_json_object(text) for name, text in sorted(self._policies.items())}


def _copy(record: NegotiationRecord) -> NegotiationRecord:
    return negotiation_from_row(negotiation_row(record))


class MemoryArtifactStore:
    """`ArtifactStore` over a list in append order and a key index; events that commit with
    an artifact go to `log`."""

    def __init__(self, log: MemoryEventLog) -> None:
        self._items: list[ArtifactRecord] = []
        self._keys: set[tuple[str, str, str]] = set()
        self._log = log

    async def append(self, artifact: ArtifactRecord, events: Sequence[EventDraft] = ()) -> bool:
        stored = artifact_from_row(artifact_row(artifact))
        drafts = self._log.checked(events)
        if not self.add(stored):
            return False
        self._log.append_now(drafts)
        return True

    def add(self, stored: ArtifactRecord) -> bool:
        """Append an artifact already through its row (False when its key is held)."""
        key = (stored.negotiation_id, stored.kind, stored.version)
        if key in self._keys:
            return False
        self._keys.add(key)
        self._items.append(stored)
        return True

    async def get(self, negotiation_id: str, kind: str, version: str) -> ArtifactRecord | None:
        return next(
            (a for a in self._items
             if (a.negotiation_id, a.kind, a.version) == (negotiation_id, kind, version)),
            None,
        )  # fmt: skip

    async def list(self, negotiation_id: str, kind: str | None = None) -> list[ArtifactRecord]:
        return [
            a for a in self._items
            if a.negotiation_id == negotiation_id and (kind is None or a.kind == kind)
        ]  # fmt: skip
