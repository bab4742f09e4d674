"""Per-agent task queues (RFC 7.1): priority range and default, -19 first, FIFO within a
priority, removal by id, listings, and the O(log n) bound (counted, never timed).

Requirements shown here (tests/conformance/manifest.toml): scheduler.priority.range,
scheduler.priority.default-zero, scheduler.priority.order-numeric,
scheduler.priority.order-fifo.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.tasks.queue import (
    DEFAULT_PRIORITY,
    PRIORITY_HIGHEST,
    PRIORITY_LOWEST,
    QueuedTask,
    TaskQueue,
    validate_priority,
)
from apiary.errors import ValidationError

T0 = 1_754_000_000.0


def drain(queue: TaskQueue, agent: str) -> list[str]:
    out = []
    while (task := queue.pop(agent)) is not None:
        out.append(task.task_id)
    return out


# --- priorities -------------------------------------------------------------------------------


def test_the_range_is_minus_19_to_20_and_the_default_is_0() -> None:
    assert (PRIORITY_HIGHEST, PRIORITY_LOWEST, DEFAULT_PRIORITY) == (-19, 20, 0)
    assert validate_priority() == 0
    assert validate_priority(None) == 0
    assert [validate_priority(p) for p in (-19, 0, 20)] == [-19, 0, 20]


@pytest.mark.parametrize("bad", [-20, 21, 100, True, False, 1.0, "3", [1]])
def test_bad_priorities_name_the_field(bad: Any) -> None:
    with pytest.raises(ValidationError) as info:
        validate_priority(bad)
    assert info.value.details["field"] == "priority"


def test_submit_without_priority_queues_at_0() -> None:
    queue = TaskQueue()
    assert queue.submit("t1", "a", T0).priority == 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"task_id": ""}, "task_id"),
        ({"agent_id": ""}, "agent_id"),
        ({"agent_id": 3}, "agent_id"),
        ({"priority": 21}, "priority"),
        ({"submitted_at": math.nan}, "submitted_at"),
        ({"submitted_at": math.inf}, "submitted_at"),
        ({"submitted_at": "now"}, "submitted_at"),
        ({"seq": -1}, "seq"),
        ({"seq": True}, "seq"),
        ({"scope": None}, "scope"),
        ({"job_key": 1}, "job_key"),
    ],
)
def test_bad_tasks_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    base: dict[str, Any] = {
        "task_id": "t", "agent_id": "a", "priority": 0, "submitted_at": T0, "seq": 0,
    }  # fmt: skip
    with pytest.raises(ValidationError) as info:
        QueuedTask(**(base | kwargs))
    assert info.value.details["field"] == field


# --- order ------------------------------------------------------------------------------------


def test_minus_19_is_served_before_minus_18_before_0_before_20() -> None:
    queue = TaskQueue()
    for i, priority in enumerate([20, 0, -18, -19, 5, -1]):
        queue.submit(f"p{priority}", "a", T0 + i, priority)
    assert drain(queue, "a") == ["p-19", "p-18", "p-1", "p0", "p5", "p20"]


def test_fifo_by_submission_time_within_a_priority() -> None:
    queue = TaskQueue()
    queue.submit("late", "a", T0 + 2)
    queue.submit("early", "a", T0)
    queue.submit("middle", "a", T0 + 1)
    assert drain(queue, "a") == ["early", "middle", "late"]


def test_same_instant_falls_back_to_submission_sequence() -> None:
    queue = TaskQueue()
    for name in ("first", "second", "third"):
        queue.submit(name, "a", T0)
    assert [t.seq for t in queue.listing("a")] == [0, 1, 2]
    assert drain(queue, "a") == ["first", "second", "third"]


def test_agents_have_separate_queues() -> None:
    queue = TaskQueue()
    queue.submit("a1", "a", T0, 5)
    queue.submit("b1", "b", T0, -19)
    queue.submit("a2", "a", T0 + 1, -3)
    assert queue.counts() == {"a": 2, "b": 1}
    assert queue.agents() == ("a", "b")
    assert drain(queue, "a") == ["a2", "a1"]
    assert queue.count("a") == 0 and queue.count("b") == 1
    assert queue.pop("nobody") is None and queue.peek("nobody") is None


def test_peek_shows_what_pop_returns_and_takes_nothing() -> None:
    queue = TaskQueue()
    queue.submit("x", "a", T0, 1)
    queue.submit("y", "a", T0, -1)
    peeked = queue.peek("a")
    assert peeked is not None and peeked.task_id == "y"
    assert len(queue) == 2
    assert queue.pop("a") == peeked


def test_a_requeued_task_keeps_its_place() -> None:
    queue = TaskQueue()
    first = queue.submit("first", "a", T0)
    queue.submit("second", "a", T0 + 1)
    assert queue.pop("a") == first
    queue.submit("third", "a", T0 + 2)
    queue.push(first)  # preempted: back in with its original submission time and seq
    assert drain(queue, "a") == ["first", "second", "third"]


def test_push_keeps_seq_above_every_pushed_task() -> None:
    queue = TaskQueue()
    queue.push(QueuedTask("old", "a", 0, T0, 41))
    assert queue.next_seq == 42
    assert queue.submit("new", "a", T0).seq == 42


def test_duplicate_task_ids_are_refused() -> None:
    queue = TaskQueue()
    queue.submit("t", "a", T0)
    with pytest.raises(ValidationError) as info:
        queue.submit("t", "b", T0)
    assert info.value.details == {"field": "task_id", "task_id": "t"}
    assert len(queue) == 1


# --- removal ----------------------------------------------------------------------------------


def test_remove_by_id_from_the_middle() -> None:
    queue = TaskQueue()
    for i in range(5):
        queue.submit(f"t{i}", "a", T0 + i)
    removed = queue.remove("t2")
    assert removed is not None and removed.task_id == "t2"
    assert "t2" not in queue and queue.get("t2") is None
    assert queue.remove("t2") is None
    assert queue.count("a") == 4
    assert drain(queue, "a") == ["t0", "t1", "t3", "t4"]


def test_a_removed_then_resubmitted_id_is_served_once_in_its_new_place() -> None:
    queue = TaskQueue()
    queue.submit("t", "a", T0)
    queue.submit("u", "a", T0 + 1)
    queue.remove("t")
    queue.submit("t", "a", T0 + 2)
    assert drain(queue, "a") == ["u", "t"]


def test_removing_the_last_task_forgets_the_agent() -> None:
    queue = TaskQueue()
    queue.submit("t", "a", T0)
    queue.remove("t")
    assert queue.agents() == () and queue.counts() == {} and queue.heap_size("a") == 0


def test_stale_entries_never_outgrow_live_ones() -> None:
    queue = TaskQueue()
    for i in range(10_000):
        queue.submit(f"t{i}", "a", T0 + i)
    for i in range(9_900):
        queue.remove(f"t{i}")
        assert queue.heap_size("a") <= 2 * queue.count("a") + 64
    assert drain(queue, "a") == [f"t{i}" for i in range(9_900, 10_000)]


# --- listings ---------------------------------------------------------------------------------


def test_listings_are_in_service_order() -> None:
    queue = TaskQueue()
    queue.submit("a-low", "a", T0, 10)
    queue.submit("b-high", "b", T0 + 1, -10)
    queue.submit("a-high", "a", T0 + 2, -10)
    queue.submit("a-mid", "a", T0 + 3, 0)
    queue.remove("a-mid")
    assert [t.task_id for t in queue] == ["b-high", "a-high", "a-low"]
    assert [t.task_id for t in queue.listing("a")] == ["a-high", "a-low"]
    assert queue.listing("nobody") == []
    assert len(queue) == 3  # listing takes nothing


# --- properties -------------------------------------------------------------------------------

AGENTS = ("a", "b", "c")
OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("push"),
            st.sampled_from(AGENTS),
            st.integers(PRIORITY_HIGHEST, PRIORITY_LOWEST),
            st.integers(0, 5),  # few distinct times: many ties for seq to break
        ),
        st.tuples(st.just("pop"), st.sampled_from(AGENTS)),
        st.tuples(st.just("remove"), st.integers(0, 200)),
    ),
    max_size=200,
)


@given(OPS)
def test_any_interleaving_pops_in_priority_then_fifo_order(ops: list[tuple[Any, ...]]) -> None:
    queue = TaskQueue()
    model: dict[str, list[tuple[int, float, int, str]]] = {a: [] for a in AGENTS}
    for n, op in enumerate(ops):
        if op[0] == "push":
            _, agent, priority, at = op
            task = queue.submit(f"t{n}", agent, T0 + at, priority)
            model[agent].append((priority, T0 + at, task.seq, task.task_id))
        elif op[0] == "pop":
            expected = min(model[op[1]], default=None)
            got = queue.pop(op[1])
            if expected is None:
                assert got is None
            else:
                model[op[1]].remove(expected)
                assert got is not None and got.task_id == expected[3]
        else:
            victim = f"t{op[1]}"
            removed = queue.remove(victim)
            owners = [a for a in AGENTS if any(e[3] == victim for e in model[a])]
            assert (removed is not None) == bool(owners)
            for agent in owners:
                model[agent] = [e for e in model[agent] if e[3] != victim]
        assert len(queue) == sum(len(v) for v in model.values())
        assert {a: queue.count(a) for a in AGENTS} == {a: len(v) for a, v in model.items()}
    for agent in AGENTS:
        assert [t.task_id for t in queue.listing(agent)] == [e[3] for e in sorted(model[agent])]
        assert drain(queue, agent) == [e[3] for e in sorted(model[agent])]


# --- scale ------------------------------------------------------------------------------------


def test_100k_pushes_and_pops_complete_in_order_with_log_heap_work() -> None:
    n = 100_000
    rng = random.Random(7)
    queue = TaskQueue()
    for i in range(n):
        queue.submit(f"t{i}", "a", T0 + rng.randrange(1000), rng.randint(-19, 20))
    removed = {f"t{i}" for i in rng.sample(range(n), n // 10)}
    for task_id in removed:
        queue.remove(task_id)
    assert queue.heap_size("a") <= 2 * len(queue) + 64
    last: tuple[int, float, int] | None = None
    popped = 0
    while (task := queue.pop("a")) is not None:
        assert last is None or task.sort_key > last
        assert task.task_id not in removed
        last, popped = task.sort_key, popped + 1
    assert popped == n - len(removed)
    # Every push is one heappush, every pop one heappop plus at most one per stale entry:
    # a constant number of O(log n) heap operations per queue operation.
    assert queue.heap_ops <= 2 * n + len(removed)


class CountingTime(float):
    """A timestamp that counts comparisons: a heap entry compares its time on every sift."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        CountingTime.compared += 1
        return float(self) == other

    def __lt__(self, other: float) -> bool:
        CountingTime.compared += 1
        return float(self) < other

    __hash__ = float.__hash__


@pytest.mark.parametrize("n", [1024, 16_384])
def test_comparisons_grow_as_n_log_n(n: int) -> None:
    queue = TaskQueue()
    rng = random.Random(n)
    CountingTime.compared = 0
    for i in range(n):
        queue.submit(f"t{i}", "a", CountingTime(rng.random()))  # one priority: times decide
    for i in range(0, n, 4):
        queue.remove(f"t{i}")
    while queue.pop("a") is not None:
        pass
    # A sorted list with linear inserts or a scan per pop would need ~n^2/4 comparisons.
    assert CountingTime.compared <= 6 * n * math.log2(n)
