"""The in-memory idempotency keys of the process commands (controlplane/process_keys.py): a
retry that arrives while the first request runs waits for it and answers its answer; a
failed request keeps no key; the keys are bounded per process and forgotten with it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from apiary.controlplane.process_keys import ProcessKeys
from apiary.controlplane.process_requests import TerminateProcess, WriteProcessStdin
from apiary.core.access.principal import Principal, PrincipalKind
from apiary.errors import AlreadyExistsError, UnavailableError

APP = Principal(PrincipalKind.APPLICATION, "app")
COMMAND = "write_process_stdin"


def _write(key: str, data: bytes = b"hi\n", process_id: str = "call-1") -> WriteProcessStdin:
    return WriteProcessStdin(idempotency_key=key, process_id=process_id, data=data)


class Runs:
    """A command body that counts its runs and ends when the test lets it."""

    def __init__(self) -> None:
        self.count = 0
        self.go = asyncio.Event()
        self.fail = False

    async def __call__(self) -> dict[str, Any]:
        self.count += 1
        await self.go.wait()
        if self.fail:
            raise UnavailableError("the process ended")
        return {"written": 3, "run": self.count}


async def test_a_retry_while_the_first_runs_waits_and_answers_its_answer() -> None:
    keys, runs = ProcessKeys(), Runs()
    first = asyncio.create_task(keys.once(APP, COMMAND, "call-1", _write("k"), runs))
    retry = asyncio.create_task(keys.once(APP, COMMAND, "call-1", _write("k"), runs))
    await asyncio.sleep(0)
    runs.go.set()
    assert await first == {"written": 3, "run": 1}
    assert await retry == {"written": 3, "run": 1, "replayed": True}
    assert runs.count == 1


async def test_a_failed_request_keeps_no_key_and_its_retry_runs() -> None:
    keys, runs = ProcessKeys(), Runs()
    runs.fail = True
    runs.go.set()
    with pytest.raises(UnavailableError):
        await keys.once(APP, COMMAND, "call-1", _write("k"), runs)
    assert len(keys) == 0
    runs.fail = False
    assert await keys.once(APP, COMMAND, "call-1", _write("k"), runs) == {"written": 3, "run": 2}


async def test_another_request_under_a_key_is_refused_naming_it() -> None:
    keys, runs = ProcessKeys(), Runs()
    runs.go.set()
    await keys.once(APP, COMMAND, "call-1", _write("k"), runs)
    for other, command in (
        (_write("k", b"other\n"), COMMAND),
        (_write("k", process_id="call-2"), COMMAND),
        (TerminateProcess(idempotency_key="k", process_id="call-1"), "terminate_process"),
    ):
        with pytest.raises(AlreadyExistsError) as refused:
            await keys.once(APP, command, other.process_id, other, runs)
        assert refused.value.details["field"] == "idempotency_key"
    assert runs.count == 1
    # Without a key every request runs.
    await keys.once(APP, COMMAND, "call-1", _write(""), runs)
    await keys.once(APP, COMMAND, "call-1", _write(""), runs)
    assert runs.count == 3 and len(keys) == 1


async def test_keys_are_bounded_per_process_and_forgotten_with_it() -> None:
    keys, runs = ProcessKeys(per_process=2), Runs()
    runs.go.set()
    for key in ("a", "b", "c"):
        await keys.once(APP, COMMAND, "call-1", _write(key), runs)
    await keys.once(APP, COMMAND, "call-2", _write("x", process_id="call-2"), runs)
    assert len(keys) == 3  # call-1's oldest key was forgotten
    answer = await keys.once(APP, COMMAND, "call-1", _write("a"), runs)
    assert "replayed" not in answer and runs.count == 5
    replayed = await keys.once(APP, COMMAND, "call-1", _write("c"), runs)
    assert replayed["replayed"] is True
    keys.forget("call-1")
    assert len(keys) == 1
