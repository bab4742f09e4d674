"""The running-task index of the conflict gate (core/scope_index.py): it may leave out only the
tasks the rule-based engine calls safe with full confidence."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from apiary.core.scope_index import RunningScopes
from apiary.core.scope_overlap import DIFFERENT_REPOS, Scope, check_parallelism

SCOPES = st.builds(
    Scope,
    repos=st.lists(st.sampled_from(["app", "lib", "docs", "web"]), max_size=2, unique=True).map(
        lambda r: tuple(sorted(r))
    ),
    paths=st.lists(st.sampled_from(["src", "src/api", "docs/*.md", "**"]), max_size=2).map(
        lambda p: tuple(sorted(set(p)))
    ),
    resources=st.lists(
        st.sampled_from(["db", "db.orders", "db.users", "dbx", "queue.jobs", "queue"]), max_size=2
    ).map(lambda r: tuple(sorted(set(r)))),
)


@settings(max_examples=300)
@given(running=st.lists(SCOPES, max_size=12), candidate=SCOPES, ended=st.sets(st.integers(0, 11)))
def test_every_task_left_out_is_safe_with_full_confidence(
    running: list[Scope], candidate: Scope, ended: set[int]
) -> None:
    index = RunningScopes()
    for n, scope in enumerate(running):
        index.add(f"t{n}", scope)
    for n in ended:
        index.remove(f"t{n}")  # unknown ids are fine
    live = {f"t{n}": s for n, s in enumerate(running) if n not in ended}
    assert len(index) == len(live)
    found = index.candidates(candidate)
    if found is None:
        assert not candidate.repos  # only a scope naming no repository meets every task
        return
    assert found <= set(live)
    for task_id, scope in live.items():
        if task_id not in found:
            assert check_parallelism(candidate, scope).confidence_score == DIFFERENT_REPOS


def test_the_index_keeps_only_what_may_meet() -> None:
    index = RunningScopes()
    index.add("app-1", Scope(repos=("app",), paths=("src",)))
    index.add("lib-1", Scope(repos=("lib",)))
    index.add("lib-db", Scope(repos=("lib",), resources=("db.orders",)))
    index.add("nowhere", Scope(paths=("src",)))
    index.add("deploy", Scope(repos=("web",)), always=True)
    assert index.candidates(Scope(repos=("app",))) == {"app-1", "nowhere", "deploy"}
    # A shared resource meets across repositories, nested names included.
    assert index.candidates(Scope(repos=("app",), resources=("db",))) == {
        "app-1", "nowhere", "deploy", "lib-db",
    }  # fmt: skip
    assert index.candidates(Scope(paths=("src",))) is None
    index.add("app-1", Scope(repos=("docs",)))  # indexed again: replaces
    assert "app-1" not in (index.candidates(Scope(repos=("app",))) or set())
    for task_id in ("app-1", "lib-1", "lib-db", "nowhere", "deploy"):
        index.remove(task_id)
    assert len(index) == 0
    assert index.candidates(Scope(repos=("app",), resources=("db",))) == set()
