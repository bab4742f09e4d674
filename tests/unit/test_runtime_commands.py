"""The control plane's command table: every command of the contract is known, the served
ones have their rule, and docs/control-plane.md maps each command, marking what is served."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from apiary.controlplane.commands import COMMANDS, CONTRACT_COMMANDS, lookup
from apiary.core.access.table import RUNTIME_RULES
from apiary.errors import NotFoundError, UnimplementedError

DOC = Path(__file__).resolve().parents[2] / "docs" / "control-plane.md"


def test_the_contract_has_41_commands_and_the_served_ones_are_among_them() -> None:
    assert len(CONTRACT_COMMANDS) == len(set(CONTRACT_COMMANDS)) == 41
    assert set(COMMANDS) <= set(CONTRACT_COMMANDS)
    assert set(RUNTIME_RULES) == set(COMMANDS)


def _mapping() -> dict[str, str]:
    """Each command of the doc's mapping table -> its state (served or designed)."""
    found: dict[str, str] = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[3] not in ("served", "designed"):
            continue
        for name in re.findall(r"`([a-z_]+)`", cells[0]):
            found[name] = cells[3]
    return found


def test_the_doc_maps_every_command_and_marks_the_served_ones() -> None:
    mapping = _mapping()
    assert set(mapping) == set(CONTRACT_COMMANDS)
    assert {name for name, state in mapping.items() if state == "served"} == set(COMMANDS)


def test_a_designed_command_is_unimplemented_and_another_name_unknown() -> None:
    assert lookup("submit_turn").name == "submit_turn"
    for name in sorted(set(CONTRACT_COMMANDS) - set(COMMANDS)):
        with pytest.raises(UnimplementedError, match=r"control-plane\.md"):
            lookup(name)
    with pytest.raises(NotFoundError):
        lookup("launch_rockets")
