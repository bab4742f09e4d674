"""The pure rules of shared queues and concurrency: queue names, declared concurrency, the
window, which held task a higher priority preempts or recalls, and the fair order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.tasks.capacity import (
    MAX_TASK_CONCURRENCY,
    TASK_CONCURRENCY,
    HeldTask,
    Seat,
    Victims,
    any_below,
    check_task_concurrency,
    declared_concurrency,
    fair_order,
    runs_below,
    split,
    victims,
    waits_for_yield,
    window,
)
from apiary.core.tasks.shared import describe, queue_name, queue_parts, queues_served
from apiary.errors import ValidationError


def test_a_submission_names_one_agent_or_one_queue() -> None:
    assert queue_name(agent_id="a") == ""
    assert queue_name(capability="review") == "capability:review"
    assert queue_name(agent_type="coder") == "agent_type:coder"
    assert queue_parts("capability:re:view") == ("capability", "re:view")
    assert describe("agent_type:coder") == "agent type 'coder'"
    for bad in ("review", "capability:", "kind:x", ""):
        with pytest.raises(ValueError):
            queue_parts(bad)
    for given_names, field in (
        ({}, "agent_id"),
        ({"agent_id": "a", "agent_type": "t"}, "agent_type"),
        ({"capability": "c", "agent_type": "t"}, "agent_type"),
        ({"capability": "has space"}, "capability"),
        ({"capability": "nl\n"}, "capability"),
        ({"agent_type": "t" * 257}, "agent_type"),
    ):
        with pytest.raises(ValidationError) as caught:
            queue_name(**given_names)
        assert caught.value.details["field"] == field


def test_an_agent_serves_its_capabilities_and_its_type() -> None:
    assert queues_served(["review", "lint", "review", ""], "coder") == (
        "capability:review", "capability:lint", "agent_type:coder",
    )  # fmt: skip
    assert queues_served([], "") == ()


def test_a_declared_concurrency_is_an_integer_in_range() -> None:
    assert check_task_concurrency(3) == 3
    assert check_task_concurrency("12") == 12
    assert check_task_concurrency(MAX_TASK_CONCURRENCY) == MAX_TASK_CONCURRENCY
    for bad in (0, -1, MAX_TASK_CONCURRENCY + 1, "three", "", " 2", True, 1.5, None):
        with pytest.raises(ValidationError) as caught:
            check_task_concurrency(bad, "apiary-task-concurrency")
        assert caught.value.details["field"] == "apiary-task-concurrency"
    assert declared_concurrency({TASK_CONCURRENCY: 4}) == 4
    assert declared_concurrency({}) is None
    assert declared_concurrency({TASK_CONCURRENCY: "lots"}) is None  # not ours: undeclared


def test_the_prefetch_window_is_only_for_agents_that_declared() -> None:
    assert window(3, 1, declared=True) == 4
    assert window(3, 1, declared=False) == 3
    assert window(1, 0, declared=True) == 1


def _held(*specs: tuple[str, int, bool], busy: frozenset[str] = frozenset()) -> list[HeldTask]:
    return [
        HeldTask(task_id, priority, started, order, task_id not in busy)
        for order, (task_id, priority, started) in enumerate(specs)
    ]


def test_the_read_tasks_then_the_earliest_fill_the_running_slots() -> None:
    held = _held(("a", 0, False), ("b", 0, True), ("c", 0, False))
    running, waiting = split(held, 2)
    assert [t.task_id for t in running] == ["b", "a"]
    assert [t.task_id for t in waiting] == ["c"]


def test_nothing_is_preempted_while_a_running_slot_is_free() -> None:
    assert victims(_held(("a", 9, True)), 2, -19) == Victims()


def test_the_lowest_priority_running_task_is_preempted_the_latest_among_equals() -> None:
    held = _held(("a", 5, True), ("b", 9, True), ("c", 9, True), ("d", 0, True))
    assert victims(held, 4, 3) == Victims(preempt="c")
    assert victims(held, 4, 9) == Victims()  # equal priority never preempts
    busy = _held(("a", 5, True), ("b", 9, True), busy=frozenset({"b"}))
    assert victims(busy, 2, 0) == Victims(preempt="a")  # b is being preempted already
    assert victims(busy, 2, 7) == Victims(busy="b")


def test_lower_priority_waiting_tasks_are_recalled() -> None:
    held = _held(("run", 5, True), ("w9", 9, False), ("w1", 1, False), ("w8", 8, False))
    assert victims(held, 1, 2) == Victims(preempt="run", recall=("w9", "w8"))
    assert victims(held, 1, 7) == Victims(recall=("w9", "w8"))


def test_a_task_waits_for_the_yield_of_what_it_displaces_rather_than_be_prefetched() -> None:
    held = _held(("run", 5, True), ("w9", 9, False))
    assert waits_for_yield(held, 1, 2)  # preempts run
    assert waits_for_yield(held, 1, 7)  # recalls w9
    assert not waits_for_yield(held, 1, 9)  # below or equal to all: prefetched
    assert not waits_for_yield(held, 3, -19)  # a running slot is free: it starts at once
    assert not waits_for_yield([], 1, -19)


def test_only_a_running_task_below_holds_a_shared_task_back() -> None:
    held = _held(("run", 5, True), ("w9", 9, False))
    assert runs_below(held, 1, 2)
    assert not runs_below(held, 1, 7)  # only w9 is below it, and it waits (not running)
    assert not runs_below(held, 1, 5)


@given(
    st.lists(st.tuples(st.integers(-19, 20), st.booleans(), st.booleans()), max_size=8),
    st.integers(1, 4),
    st.integers(-19, 20),
)
def test_a_task_waits_exactly_when_it_would_displace_a_held_one(
    specs: list[tuple[int, bool, bool]], concurrency: int, incoming: int
) -> None:
    held = [HeldTask(f"t{i}", p, s, i, True) for i, (p, s, _) in enumerate(specs)]
    chosen = victims(held, concurrency, incoming)
    displaces = bool(chosen.preempt or chosen.recall or chosen.busy)
    assert waits_for_yield(held, concurrency, incoming) == displaces


@given(
    st.lists(st.tuples(st.integers(-19, 20), st.booleans(), st.booleans()), max_size=8),
    st.integers(1, 4),
    st.integers(-19, 20),
)
def test_victims_are_always_below_the_incoming_priority(
    specs: list[tuple[int, bool, bool]], concurrency: int, incoming: int
) -> None:
    held = [HeldTask(f"t{i}", p, s, i, free) for i, (p, s, free) in enumerate(specs)]
    chosen = victims(held, concurrency, incoming)
    by_id = {t.task_id: t for t in held}
    running, waiting = split(held, concurrency)
    if chosen.preempt:
        assert by_id[chosen.preempt] in running and by_id[chosen.preempt].preemptible
        assert by_id[chosen.preempt].priority > incoming
    for task_id in chosen.recall:
        assert by_id[task_id] in waiting and by_id[task_id].priority > incoming
    if len(held) < concurrency:
        assert chosen == Victims()
    if not any_below(held, incoming):  # (the Scheduler asks this first, and stops there)
        assert chosen == Victims()
        assert not runs_below(held, concurrency, incoming)
        assert not waits_for_yield(held, concurrency, incoming)


def test_the_least_loaded_agent_then_the_one_served_longest_ago_goes_first() -> None:
    seats = [
        Seat("busy", held=1, concurrency=1, last_served=-1),
        Seat("half", held=1, concurrency=2, last_served=-1),
        Seat("recent", held=0, concurrency=1, last_served=5),
        Seat("long-ago", held=0, concurrency=1, last_served=2),
        Seat("never", held=0, concurrency=1, last_served=-1),
    ]
    assert fair_order(seats) == ["never", "long-ago", "recent", "half", "busy"]
