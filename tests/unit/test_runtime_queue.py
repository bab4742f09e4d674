"""A thread's queue order (core/runtime/queue.py): promotion moves a turn ahead only,
ranks the queue anew so that later turns (rank 0) queue behind, and refuses turns that are
not queued."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.runtime.queue import head_rank, promoted, queue_of
from apiary.core.runtime.records import TurnRecord, queue_key


def _turn(n: int, state: str = "queued", rank: int = 0) -> TurnRecord:
    return TurnRecord(f"u-{n}", "s", "t", n, state, "null", f"k-{n}", 0.0, 0.0, queue_rank=rank)


def _ids(turns: list[TurnRecord]) -> list[str]:
    return [t.turn_id for t in turns]


def test_the_queue_is_the_queued_turns_by_rank_then_ordinal() -> None:
    turns = [_turn(0, "running"), _turn(1), _turn(2, rank=-1), _turn(3, "completed"), _turn(4)]
    assert _ids(queue_of(turns)) == ["u-2", "u-1", "u-4"]


def test_a_promoted_turn_moves_ahead_and_later_turns_queue_behind_it() -> None:
    queue = queue_of([_turn(1), _turn(2), _turn(3)])
    order = promoted(queue, "u-3")
    assert _ids(order) == ["u-3", "u-1", "u-2"] and [t.queue_rank for t in order] == [-3, -2, -1]
    order = promoted(order, "u-2", before="u-1")
    assert _ids(order) == ["u-3", "u-2", "u-1"]
    assert _ids(queue_of([*order, _turn(4)])) == ["u-3", "u-2", "u-1", "u-4"]
    assert promoted(order, "u-3", before="u-1") == order  # ahead already: it stays
    assert head_rank(order) == -4 and head_rank([]) == -1


@pytest.mark.parametrize(("turn_id", "before"), [("u-9", ""), ("u-1", "u-9"), ("u-1", "u-1")])
def test_promoting_a_turn_that_is_not_queued_or_ahead_of_itself_is_refused(
    turn_id: str, before: str
) -> None:
    with pytest.raises(ValueError):
        promoted(queue_of([_turn(1), _turn(2)]), turn_id, before)


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=8))
def test_promotions_keep_every_turn_and_only_move_the_named_one_ahead(
    moves: list[tuple[int, int]],
) -> None:
    order = queue_of([_turn(n) for n in range(6)])
    for moving, target in moves:
        if moving == target:
            continue
        before = _ids(order)
        after = _ids(promoted(order, f"u-{moving}", f"u-{target}"))
        order = sorted(promoted(order, f"u-{moving}", f"u-{target}"), key=queue_key)
        assert sorted(after) == sorted(before) and _ids(order) == after
        others = [i for i in after if i != f"u-{moving}"]
        assert others == [i for i in before if i != f"u-{moving}"]
        assert after.index(f"u-{moving}") <= before.index(f"u-{moving}")
