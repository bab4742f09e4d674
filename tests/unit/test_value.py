"""`apiary.core.value`: records frozen to the type checker, plain slotted dataclasses at run
time (cheap to build), hashing and comparing by their fields."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

from mypy import api as mypy_api

from apiary.core.records import MessageState, StoredMessage


def _message(**changes: object) -> StoredMessage:
    message = StoredMessage("m-1", "bob", "alice", "c-1", 2, b"{}", MessageState.RECEIVED, 1.0, 1.0)
    return dataclasses.replace(message, **changes)  # type: ignore[arg-type]


def test_values_compare_and_hash_by_their_fields() -> None:
    assert _message() == _message()
    assert _message() != _message(offset=3)
    assert len({_message(), _message(), _message(offset=3)}) == 2
    assert not hasattr(_message(), "__dict__")  # slotted: no per-instance dict
    assert dataclasses.replace(_message(), offset=7).offset == 7


def test_assigning_to_a_field_is_a_type_error(tmp_path: Path) -> None:
    source = tmp_path / "mutates.py"
    source.write_text(
        textwrap.dedent(
            """
            from apiary.core.records import MessageState, StoredMessage

            m = StoredMessage("m", "b", "a", "c", 2, b"", MessageState.RECEIVED, 1.0, 1.0)
            m.offset = 3
            """
        )
    )
    out, _, status = mypy_api.run(
        ["--strict", "--no-incremental", "--follow-imports=silent", str(source)]
    )
    assert status == 1
    assert 'Property "offset" defined in "StoredMessage" is read-only' in out
