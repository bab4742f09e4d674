"""The migration runner's decisions, independent of any database."""

from __future__ import annotations

import re

import pytest

from apiary.core.records import MessageState
from apiary.store.errors import SchemaVersionError
from apiary.store.migrations import Dialect, Migration, load_migrations, pending_migrations

SHIPPED = (Migration(1, "initial", "-- 1"), Migration(2, "more", "-- 2"), Migration(3, "x", ""))


def test_every_dialect_ships_the_same_versions() -> None:
    sqlite, postgres = load_migrations("sqlite"), load_migrations("postgres")
    assert sqlite, "no SQLite migrations found in the installed package"
    assert [(m.version, m.name) for m in sqlite] == [(m.version, m.name) for m in postgres]
    assert sqlite[0].version == 1
    assert all("CREATE TABLE events" in m.sql for m in (sqlite[0], postgres[0]))


@pytest.mark.parametrize(
    ("applied", "expected"),
    [([], [1, 2, 3]), ([1], [2, 3]), ([1, 2, 3], []), ([2, 1], [3]), ([1, 3], [2])],
)
def test_pending_are_the_unapplied_in_version_order(
    applied: list[int], expected: list[int]
) -> None:
    assert [m.version for m in pending_migrations(SHIPPED, applied)] == expected


@pytest.mark.parametrize("applied", [[1, 2, 3, 4], [4], [0], [1, 2, 99]])
def test_a_version_the_code_does_not_know_is_refused(applied: list[int]) -> None:
    with pytest.raises(SchemaVersionError, match="upgrade Apiary"):
        pending_migrations(SHIPPED, applied)


def test_an_empty_database_with_no_migrations_needs_nothing() -> None:
    assert pending_migrations((), []) == ()


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_the_schema_knows_the_terminal_states_of_the_core(dialect: Dialect) -> None:
    """The generated due_at and finished_at columns spell the terminal states out in SQL;
    they must be exactly MessageState.terminal, or finished messages would stay due."""
    script = next(m.sql for m in load_migrations(dialect) if m.version == 2)
    lists = re.findall(r"state IN \(([^)]*)\)", script)
    assert len(lists) == 2
    terminal = {s.value for s in MessageState if s.terminal}
    for states in lists:
        assert {name.strip().strip("'") for name in states.split(",")} == terminal


def test_the_sqlite_state_cases_know_the_terminal_states_of_the_core() -> None:
    """Version 35 spells due_at's and finished_at's terminal states as CASE branches."""
    script = next(m.sql for m in load_migrations("sqlite") if m.version == 35)
    cases = re.findall(r"CASE state((?:\s+WHEN '[A-Z_]+' THEN \w+)+)", script)
    assert len(cases) == 2
    terminal = {s.value for s in MessageState if s.terminal}
    for branches in cases:
        assert set(re.findall(r"WHEN '([A-Z_]+)'", branches)) == terminal


def test_a_target_version_stops_the_pending_list() -> None:
    assert [m.version for m in pending_migrations(SHIPPED, [], target=2)] == [1, 2]
    assert [m.version for m in pending_migrations(SHIPPED, [1], target=1)] == []


GAPPED = (Migration(1, "initial", ""), Migration(2, "more", ""), Migration(5, "later", ""))


@pytest.mark.parametrize(
    ("applied", "expected"), [([], [1, 2, 5]), ([1, 2], [5]), ([1, 5], [2]), ([1, 2, 5], [])]
)
def test_versions_may_skip_numbers_reserved_by_features_not_landed_yet(
    applied: list[int], expected: list[int]
) -> None:
    assert [m.version for m in pending_migrations(GAPPED, applied)] == expected


@pytest.mark.parametrize("applied", [[1, 3], [1, 2, 4, 5], [6]])
def test_a_version_inside_a_gap_is_unknown_too(applied: list[int]) -> None:
    """A newer Apiary may have filled the gap: this code must not open that database."""
    with pytest.raises(SchemaVersionError, match="upgrade Apiary"):
        pending_migrations(GAPPED, applied)


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_shipped_versions_start_at_1_and_are_used_once(dialect: Dialect) -> None:
    versions = [m.version for m in load_migrations(dialect)]
    assert versions[0] == 1
    assert versions == sorted(set(versions))
    assert any("CREATE TABLE room_proposals" in m.sql for m in load_migrations(dialect))
