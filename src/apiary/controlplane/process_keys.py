"""Idempotency keys of the process commands write_process_stdin and terminate_process.

Processes live in the coordinator that runs them (controlplane/processes.py: a restart loses
them), and so do their keys: in memory, with the process they name, at most
KEYS_PER_PROCESS per process (its oldest forgotten first), forgotten with the process. A key
is its caller's (per principal, as the stored command keys of controlplane/command_keys.py):
a retry with the same request answers the first answer (`replayed: true`) without writing
or terminating again, also once the process has ended; a retry while the first request
runs waits for it (and runs itself when the first one failed: a failure keeps no key); the
same key with another request (another process, other input) is already_exists naming it.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from apiary.controlplane.task_requests import Keyed
from apiary.core.access.principal import Principal
from apiary.core.runtime.records import owner_of
from apiary.errors import AlreadyExistsError

KEYS_PER_PROCESS: Final = 256
"""The keys kept per process; past them its oldest key is forgotten."""

_Slot = tuple[str, str]
"""A key as its owner and the key."""


@dataclass(slots=True)
class _Kept:
    command: str
    digest: str
    answer: dict[str, Any] | None = None
    """The first request's answer (None while it runs)."""
    done: asyncio.Event = field(default_factory=asyncio.Event)


class ProcessKeys:
    """The keys of one control plane's processes (module docstring)."""

    def __init__(self, per_process: int = KEYS_PER_PROCESS) -> None:
        self._per_process = per_process
        self._kept: dict[_Slot, _Kept] = {}
        self._of: dict[str, OrderedDict[_Slot, None]] = {}
        """Each process's keys, oldest first."""

    async def once(
        self, caller: Principal, command: str, process_id: str, req: Keyed,
        run: Callable[[], Awaitable[dict[str, Any]]],
    ) -> dict[str, Any]:  # fmt: skip
        """`run`'s answer, or the answer of the first request under `req`'s key."""
        if not req.idempotency_key:
            return await run()
        slot, digest = (owner_of(caller), req.idempotency_key), req.digest()
        while (known := self._kept.get(slot)) is not None:
            if known.command != command or known.digest != digest:
                raise AlreadyExistsError(
                    f"idempotency_key {req.idempotency_key!r} was used for another request; "
                    "a retry sends the same one", {"field": "idempotency_key"},
                )  # fmt: skip
            if known.answer is not None:
                return {**known.answer, "replayed": True}
            await known.done.wait()  # the first request runs still: its answer, or its turn
        kept = self._keep(slot, process_id, _Kept(command, digest))
        try:
            kept.answer = await run()
        except BaseException:
            self._drop(slot, process_id, kept)
            raise
        finally:
            kept.done.set()
        return kept.answer

    def forget(self, process_id: str) -> None:
        """Forget the keys of a process the control plane no longer knows."""
        for slot in self._of.pop(process_id, ()):
            self._kept.pop(slot, None)

    def __len__(self) -> int:
        return len(self._kept)

    def _keep(self, slot: _Slot, process_id: str, kept: _Kept) -> _Kept:
        self._kept[slot] = kept
        keys = self._of.setdefault(process_id, OrderedDict())
        keys[slot] = None
        while len(keys) > self._per_process:
            oldest, _ = keys.popitem(last=False)
            self._kept.pop(oldest, None)
        return kept

    def _drop(self, slot: _Slot, process_id: str, kept: _Kept) -> None:
        if self._kept.get(slot) is not kept:  # forgotten meanwhile
            return
        del self._kept[slot]
        keys = self._of.get(process_id)
        if keys is not None:
            keys.pop(slot, None)
            if not keys:
                del self._of[process_id]
