"""The Activity Buffer (RFC 10, 10.1): entries, limits that reject and never drop,
re-registration, completion, reconciliation, purges, filtered reads, history eviction and the
80 % warning threshold.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.activity import (
    ActivityBuffer,
    ActivityEntry,
    ActivityLimits,
    ActivityOutcome,
)
from apiary.errors import ActivityBufferFullError, ValidationError

T0 = 1_754_000_000.0


def entry(agent: str = "a", task: str = "t1", **fields: Any) -> ActivityEntry:
    return ActivityEntry(agent_id=agent, task_id=task, **fields)


def keys(entries: list[ActivityEntry]) -> list[tuple[str, str]]:
    return [e.key for e in entries]


def snapshot(buffer: ActivityBuffer, now: float) -> tuple[Any, ...]:
    return (len(buffer), buffer.active(now=now), buffer.history(now=now))


# --- entries and limits -----------------------------------------------------------------------


def test_defaults_follow_rfc_10_1() -> None:
    limits = ActivityLimits()
    assert (limits.max_entries, limits.per_agent, limits.warn_ratio) == (10_000, 100, 0.8)
    assert (limits.history, limits.history_ttl_s) == (1_000, 3600.0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"agent_id": ""}, "agent_id"),
        ({"task_id": ""}, "task_id"),
        ({"agent_id": 3}, "agent_id"),
        ({"repo_id": "r\x00"}, "repo_id"),
        ({"branch": "main\x00"}, "branch"),
        ({"worktree_id": None}, "worktree_id"),
        ({"description": "x\x00y"}, "description"),
        ({"started_at": math.nan}, "started_at"),
        ({"started_at": -1.0}, "started_at"),
        ({"started_at": True}, "started_at"),
        ({"finished_at": math.inf}, "finished_at"),
        ({"finished_at": T0}, "finished_at"),  # an active entry has no finish time
        ({"outcome": "DONE"}, "outcome"),
    ],
)
def test_bad_entries_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    base: dict[str, Any] = {"agent_id": "a", "task_id": "t"}
    with pytest.raises(ValidationError) as info:
        ActivityEntry(**{**base, **kwargs})
    assert info.value.details["field"] == field


def test_description_is_limited_to_200_words() -> None:
    assert entry(description=" ".join(["w"] * 200)).description.count("w") == 200
    with pytest.raises(ValidationError) as info:
        entry(description=" ".join(["w"] * 201))
    assert info.value.details == {"field": "description", "words": "201"}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_entries": 0}, "max_entries"),
        ({"per_agent": 0}, "per_agent"),
        ({"per_agent": True}, "per_agent"),
        ({"history": -1}, "history"),
        ({"warn_ratio": 0}, "warn_ratio"),
        ({"warn_ratio": 1.5}, "warn_ratio"),
        ({"history_ttl_s": 0}, "history_ttl_s"),
        ({"history_ttl_s": math.inf}, "history_ttl_s"),
    ],
)
def test_bad_limits_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        ActivityLimits(**kwargs)
    assert info.value.details["field"] == field


# --- registration and its limits --------------------------------------------------------------


def test_register_stamps_now_when_no_start_is_given() -> None:
    buffer = ActivityBuffer()
    assert buffer.register(entry(), T0).started_at == T0
    assert buffer.register(entry(task="t2", started_at=T0 - 5), T0).started_at == T0 - 5
    assert len(buffer) == 2


def test_the_total_limit_rejects_with_activity_buffer_full_and_drops_nothing() -> None:
    buffer = ActivityBuffer(ActivityLimits(max_entries=3, per_agent=3))
    for i, agent in enumerate("abc"):
        buffer.register(entry(agent, f"t{i}"), T0 + i)
    before = snapshot(buffer, T0 + 5)
    with pytest.raises(ActivityBufferFullError) as info:
        buffer.register(entry("d", "t9"), T0 + 5)
    assert info.value.code == "activity_buffer_full"
    assert info.value.details == {"limit": "total", "max": "3", "agent_id": "d", "task_id": "t9"}
    assert snapshot(buffer, T0 + 5) == before
    assert keys(buffer.active()) == [("a", "t0"), ("b", "t1"), ("c", "t2")]


def test_the_per_agent_limit_rejects_that_agent_only() -> None:
    buffer = ActivityBuffer(ActivityLimits(max_entries=10, per_agent=2))
    buffer.register(entry("a", "t1"), T0)
    buffer.register(entry("a", "t2"), T0)
    before = snapshot(buffer, T0)
    with pytest.raises(ActivityBufferFullError) as info:
        buffer.register(entry("a", "t3"), T0)
    assert info.value.details["limit"] == "per_agent"
    assert snapshot(buffer, T0) == before
    buffer.register(entry("b", "t3"), T0)  # other agents still have room
    assert len(buffer) == 3


def test_a_rejected_registration_does_not_evict_history() -> None:
    limits = ActivityLimits(max_entries=1, history_ttl_s=10.0)
    buffer = ActivityBuffer(limits)
    buffer.register(entry("a", "t1"), T0)
    buffer.complete("a", "t1", "COMPLETED", T0)
    buffer.register(entry("a", "t2"), T0)
    with pytest.raises(ActivityBufferFullError):
        buffer.register(entry("b", "t3"), T0 + 60)
    assert keys(buffer.history(now=T0)) == [("a", "t1")]


def test_completion_frees_room() -> None:
    buffer = ActivityBuffer(ActivityLimits(max_entries=1))
    buffer.register(entry("a", "t1"), T0)
    buffer.complete("a", "t1", "COMPLETED", T0 + 1)
    buffer.register(entry("a", "t2"), T0 + 2)
    assert keys(buffer.active()) == [("a", "t2")]


def test_re_registration_replaces_fields_without_counting_twice() -> None:
    buffer = ActivityBuffer(ActivityLimits(max_entries=1, per_agent=1))
    buffer.register(entry(repo_id="r1", branch="main", description="first"), T0)
    stored = buffer.register(entry(repo_id="r2", branch="dev", description="second"), T0 + 9)
    assert len(buffer) == 1
    assert (stored.repo_id, stored.branch, stored.description) == ("r2", "dev", "second")
    assert stored.started_at == T0  # no start given: the original one stays
    assert buffer.get("a", "t1") == stored
    assert buffer.register(entry(started_at=T0 + 3), T0 + 9).started_at == T0 + 3


def test_a_finished_entry_cannot_be_registered() -> None:
    done = entry(started_at=T0, finished_at=T0 + 1, outcome="COMPLETED")
    with pytest.raises(ValidationError) as info:
        ActivityBuffer().register(done, T0 + 2)
    assert info.value.details["field"] == "outcome"


def test_the_same_task_under_two_agents_is_two_entries() -> None:
    buffer = ActivityBuffer()
    buffer.register(entry("a", "t1"), T0)
    buffer.register(entry("b", "t1"), T0 + 1)
    assert keys(buffer.active(task_id="t1")) == [("a", "t1"), ("b", "t1")]


# --- complete, reconcile, purge ---------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["COMPLETED", "FAILED"])
def test_complete_moves_the_entry_to_history(outcome: str) -> None:
    buffer = ActivityBuffer()
    buffer.register(entry(repo_id="r"), T0)
    done = buffer.complete("a", "t1", outcome, T0 + 4)
    assert done is not None
    assert (done.outcome, done.finished_at, done.started_at, done.active) == (
        outcome, T0 + 4, T0, False,
    )  # fmt: skip
    assert len(buffer) == 0
    assert buffer.active() == []
    assert buffer.history() == [done]


def test_complete_of_an_unknown_entry_is_none() -> None:
    buffer = ActivityBuffer()
    buffer.register(entry("a", "t1"), T0)
    assert buffer.complete("a", "t2", "COMPLETED", T0) is None
    assert buffer.complete("b", "t1", "COMPLETED", T0) is None
    assert len(buffer) == 1


@pytest.mark.parametrize("outcome", ["", "PURGED", "completed", "DONE"])
def test_complete_accepts_only_completed_or_failed(outcome: str) -> None:
    buffer = ActivityBuffer()
    buffer.register(entry(), T0)
    with pytest.raises(ValidationError) as info:
        buffer.complete("a", "t1", outcome, T0)
    assert info.value.details["field"] == "outcome"
    assert len(buffer) == 1


def test_reconcile_purges_completed_failed_and_unknown_tasks() -> None:
    buffer = ActivityBuffer()
    for i, task in enumerate(["done", "failed", "running", "ghost", "queued"]):
        buffer.register(entry("a", task), T0 + i)
    buffer.register(entry("b", "ghost"), T0 + 10)
    known = {"done": "COMPLETED", "failed": "FAILED", "running": "RUNNING", "queued": "PENDING"}
    purged = buffer.reconcile(known, T0 + 20)
    assert keys(purged) == [("a", "done"), ("a", "failed"), ("a", "ghost"), ("b", "ghost")]
    assert {e.outcome for e in purged} == {ActivityOutcome.PURGED}
    assert {e.finished_at for e in purged} == {T0 + 20}
    assert keys(buffer.active()) == [("a", "running"), ("a", "queued")]
    assert keys(buffer.history()) == keys(purged)
    assert buffer.reconcile(known, T0 + 21) == []


def test_purge_removes_the_given_tasks_of_one_agent() -> None:
    buffer = ActivityBuffer()
    for task in ("t1", "t2", "t3"):
        buffer.register(entry("a", task), T0)
    buffer.register(entry("b", "t1"), T0)
    assert buffer.purge("a", ["t1", "t3", "missing"], T0 + 1) == 2
    assert keys(buffer.active()) == [("a", "t2"), ("b", "t1")]
    assert [e.outcome for e in buffer.history()] == ["PURGED", "PURGED"]


def test_purge_with_none_removes_all_of_the_agents_entries() -> None:
    buffer = ActivityBuffer()
    for task in ("t1", "t2"):
        buffer.register(entry("a", task), T0)
    buffer.register(entry("b", "t1"), T0)
    assert buffer.purge("a", None, T0) == 2
    assert buffer.purge("a", None, T0) == 0
    assert buffer.purge("nobody", None, T0) == 0
    assert keys(buffer.active()) == [("b", "t1")]


def test_purge_entries_returns_what_it_removed() -> None:
    buffer = ActivityBuffer()
    buffer.register(entry("a", "t2"), T0 + 1)
    buffer.register(entry("a", "t1"), T0)
    purged = buffer.purge_entries("a", None, T0 + 2)
    assert keys(purged) == [("a", "t1"), ("a", "t2")]
    assert buffer.purge_entries("a", [], T0 + 2) == []


# --- reads ------------------------------------------------------------------------------------


def test_filters_combine_and_results_are_sorted_by_start() -> None:
    buffer = ActivityBuffer()
    buffer.register(entry("a", "t1", repo_id="r1", worktree_id="w1", started_at=T0 + 3), T0)
    buffer.register(entry("a", "t2", repo_id="r2", worktree_id="w2", started_at=T0 + 1), T0)
    buffer.register(entry("b", "t3", repo_id="r1", worktree_id="w2", started_at=T0 + 2), T0)
    assert keys(buffer.active()) == [("a", "t2"), ("b", "t3"), ("a", "t1")]
    assert keys(buffer.active(agent_id="a")) == [("a", "t2"), ("a", "t1")]
    assert keys(buffer.active(repo_id="r1")) == [("b", "t3"), ("a", "t1")]
    assert keys(buffer.active(worktree_id="w2")) == [("a", "t2"), ("b", "t3")]
    assert keys(buffer.active(task_id="t3")) == [("b", "t3")]
    assert keys(buffer.active(agent_id="a", repo_id="r1")) == [("a", "t1")]
    assert buffer.active(agent_id="nobody") == []


def test_history_takes_the_same_filters() -> None:
    buffer = ActivityBuffer()
    buffer.register(entry("a", "t1", repo_id="r1"), T0)
    buffer.register(entry("b", "t2", repo_id="r2", worktree_id="w"), T0)
    buffer.complete("b", "t2", "FAILED", T0 + 1)
    buffer.complete("a", "t1", "COMPLETED", T0 + 2)
    assert keys(buffer.history()) == [("b", "t2"), ("a", "t1")]
    assert keys(buffer.history(agent_id="a")) == [("a", "t1")]
    assert keys(buffer.history(repo_id="r2", worktree_id="w")) == [("b", "t2")]
    assert keys(buffer.history(task_id="t1")) == [("a", "t1")]


@pytest.mark.conformance("activity.history.eviction")
def test_history_evicts_by_count() -> None:
    buffer = ActivityBuffer(ActivityLimits(history=2))
    for i in range(4):
        buffer.register(entry("a", f"t{i}"), T0 + i)
        buffer.complete("a", f"t{i}", "COMPLETED", T0 + i)
    assert keys(buffer.history()) == [("a", "t2"), ("a", "t3")]


def test_a_zero_history_keeps_nothing() -> None:
    buffer = ActivityBuffer(ActivityLimits(history=0))
    buffer.register(entry(), T0)
    assert buffer.complete("a", "t1", "COMPLETED", T0) is not None
    assert buffer.history() == []


@pytest.mark.conformance("activity.history.eviction")
def test_history_evicts_by_age_on_reads_and_mutations() -> None:
    buffer = ActivityBuffer(ActivityLimits(history_ttl_s=60.0))
    buffer.register(entry("a", "t1"), T0)
    buffer.complete("a", "t1", "COMPLETED", T0)
    buffer.register(entry("a", "t2"), T0)
    buffer.complete("a", "t2", "COMPLETED", T0 + 30)
    assert keys(buffer.history(now=T0 + 59.9)) == [("a", "t1"), ("a", "t2")]
    assert keys(buffer.history(now=T0 + 60)) == [("a", "t2")]
    buffer.register(entry("a", "t3"), T0 + 90)  # a mutation evicts too
    assert buffer.history() == []


def test_history_reads_skip_entries_expired_behind_newer_ones() -> None:
    buffer = ActivityBuffer(ActivityLimits(history_ttl_s=60.0))
    buffer.register(entry("a", "t1"), T0)
    buffer.register(entry("a", "t2"), T0)
    buffer.complete("a", "t1", "COMPLETED", T0 + 50)
    buffer.complete("a", "t2", "COMPLETED", T0)  # a caller clock that stepped back
    assert keys(buffer.history(now=T0 + 70)) == [("a", "t1")]


def test_warning_threshold_is_exceeding_80_percent() -> None:
    buffer = ActivityBuffer(ActivityLimits(max_entries=10, per_agent=10))
    for i in range(8):
        buffer.register(entry("a", f"t{i}"), T0)
    assert buffer.utilization == pytest.approx(0.8)
    assert not buffer.over_warning
    buffer.register(entry("a", "t8"), T0)
    assert buffer.over_warning
    assert buffer.utilization == pytest.approx(0.9)


def test_utilization_of_an_empty_buffer_is_zero() -> None:
    buffer = ActivityBuffer()
    assert (len(buffer), buffer.utilization, buffer.over_warning) == (0, 0.0, False)


@pytest.mark.parametrize("now", [math.nan, -1.0, math.inf])
def test_bad_times_are_rejected(now: float) -> None:
    buffer = ActivityBuffer()
    with pytest.raises(ValidationError) as info:
        buffer.register(entry(), now)
    assert info.value.details["field"] == "now"
    assert len(buffer) == 0


# --- properties -------------------------------------------------------------------------------

_AGENTS = st.sampled_from(["a", "b", "c"])
_TASKS = st.sampled_from([f"t{i}" for i in range(8)])
_OPS = st.one_of(
    st.tuples(st.just("register"), _AGENTS, _TASKS),
    st.tuples(st.just("complete"), _AGENTS, _TASKS),
    st.tuples(st.just("purge"), _AGENTS, _TASKS),
    st.tuples(st.just("reconcile"), _AGENTS, _TASKS),
)


@given(st.lists(_OPS, max_size=60), st.integers(1, 6), st.integers(1, 4))
def test_len_never_exceeds_the_limits_and_rejections_change_nothing(
    ops: list[tuple[str, str, str]], max_entries: int, per_agent: int
) -> None:
    limits = ActivityLimits(max_entries=max_entries, per_agent=per_agent, history=5)
    buffer = ActivityBuffer(limits)
    for step, (op, agent, task) in enumerate(ops):
        now = T0 + step
        if op == "register":
            before = snapshot(buffer, now)
            try:
                buffer.register(entry(agent, task, description=f"step {step}"), now)
            except ActivityBufferFullError:
                assert snapshot(buffer, now) == before
                assert buffer.get(agent, task) is None
        elif op == "complete":
            buffer.complete(agent, task, "COMPLETED", now)
        elif op == "purge":
            buffer.purge(agent, [task], now)
        else:
            buffer.reconcile({task: "RUNNING"}, now)
        active = buffer.active()
        assert len(buffer) == len(active) <= max_entries
        for name in "abc":
            assert len(buffer.active(agent_id=name)) <= per_agent
        assert len(buffer.history()) <= 5


@pytest.mark.conformance("activity.limits.unbounded-documented", "activity.limits.unbounded-warn")
def test_the_buffer_cannot_be_made_unbounded() -> None:
    # The RFC's rules for unbounded buffers do not arise: every limit must be a positive
    # bound, and docs/decisions.md says so.
    for field in ("max_entries", "per_agent"):
        with pytest.raises(ValidationError) as info:
            ActivityLimits(**{field: 0})
        assert info.value.details["field"] == field
    docs = (Path(__file__).resolve().parents[2] / "docs" / "decisions.md").read_text()
    assert "always bounded" in docs
