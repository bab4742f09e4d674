"""Idempotency keys of the commands that answer from their own state (thread, permission
commands): a retry under a key stored with the same request answers what was stored
(`replayed`); the same key with another request is already_exists naming it. Keys live in
the runtime store's command keys (per principal), written with the command's first write."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from apiary.controlplane.task_requests import Keyed
from apiary.core.access.principal import Principal
from apiary.core.clock import Clock
from apiary.core.runtime.records import owner_of
from apiary.core.runtime.task_records import CommandKeyRecord
from apiary.errors import AlreadyExistsError
from apiary.store.protocols import RuntimeStore


class CommandKeys:
    """`known` before a command runs, `keep` with its write (module docstring)."""

    def __init__(self, store: RuntimeStore, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    async def known(
        self, caller: Principal, command: str, req: Keyed
    ) -> tuple[dict[str, Any] | None, CommandKeyRecord | None]:
        """The stored answer of a retry under `req`'s key, else the key to store with the
        command's write (None without a key)."""
        if not req.idempotency_key:
            return None, None
        owner, digest = owner_of(caller), req.digest()
        known = await self._store.command_key(owner, req.idempotency_key)
        if known is None:
            key = CommandKeyRecord(owner, req.idempotency_key, command, digest, "{}", 0.0)
            return None, key
        if known.command != command or known.digest != digest:
            raise AlreadyExistsError(
                f"idempotency_key {req.idempotency_key!r} was used for another request; a "
                "retry sends the same one", {"field": "idempotency_key"},
            )  # fmt: skip
        answer: dict[str, Any] = json.loads(known.answer_json)
        return answer, None

    def keep(self, key: CommandKeyRecord | None, answer: dict[str, Any]) -> tuple[Any, ...]:
        """The key to write with the command's records (none without a key)."""
        if key is None:
            return ()
        text = json.dumps(answer, separators=(",", ":"), ensure_ascii=False)
        return (replace(key, answer_json=text, created_at=self._clock.now()),)
