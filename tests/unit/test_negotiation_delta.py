"""The structural JSON DeltaSummary (RFC 17.3): minimal changed paths, bounded magnitude."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from apiary.core.negotiation.delta import MAX_CHANGED_PATHS, diff, diff_document, json_diff

JSON = "application/json"


def _paths(old: Any, new: Any) -> list[str]:
    return list(json_diff(old, new).summary.changed_paths)


def test_changed_paths_are_minimal_json_pointers() -> None:
    old = {"path": "/orders", "fields": ["id", "total"], "auth": {"scheme": "bearer"}}
    new = {"path": "/orders", "fields": ["id", "sum", "currency"], "paging": {"size": 50}}
    assert _paths(old, new) == ["/auth", "/fields/1", "/fields/2", "/paging"]
    assert _paths({"a/b": {"~x": 1}}, {"a/b": {"~x": 2}}) == ["/a~1b/~0x"]
    assert _paths([1], {"0": 1}) == [""]
    assert _paths({"n": 1}, {"n": 1.0}) == []
    assert _paths({"n": 1}, {"n": True}) == ["/n"]
    assert _paths({"n": None}, {"n": 0}) == ["/n"]


def test_magnitude_counts_the_changed_leaves_of_both_drafts() -> None:
    assert json_diff({"a": 1, "b": 2}, {"a": 1, "b": 2}).summary.magnitude == 0.0
    assert json_diff({"a": 1}, {"b": 1}).summary.magnitude == 1.0
    # one leaf of two replaced: 2 of 4 leaves
    assert json_diff({"a": 1, "b": 2}, {"a": 1, "b": 3}).summary.magnitude == 0.5
    # a subtree of three leaves added: 3 of the 1 + 4 leaves of both drafts
    assert json_diff({"a": 1}, {"a": 1, "b": [1, 2, {"c": 3}]}).summary.magnitude == 0.6


def test_drafts_that_are_not_json_compare_as_bytes() -> None:
    same = diff("text/plain", b"hello", "text/plain", b"hello").summary
    other = diff("text/plain", b"hello", "text/plain", b"world").summary
    assert (same.magnitude, same.changed_paths) == (0.0, ())
    assert (other.magnitude, other.changed_paths) == (1.0, ("",))
    assert diff(JSON, b"{", JSON, b"{}").summary.magnitude == 1.0


def test_changed_paths_are_bounded_and_say_so() -> None:
    old = {f"k{i}": i for i in range(MAX_CHANGED_PATHS + 50)}
    new = {k: v + 1 for k, v in old.items()}
    delta = json_diff(old, new)
    assert len(delta.summary.changed_paths) == MAX_CHANGED_PATHS
    assert delta.summary.truncated
    assert delta.summary.magnitude == 1.0
    document = diff_document(delta, "v1", "v2")
    assert document["truncated"] and len(document["changes"]) == MAX_CHANGED_PATHS
    json.dumps(document)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=2), inner,
                                                                max_size=4),
    max_leaves=20,
)  # fmt: skip


@given(JSON_VALUES, JSON_VALUES)
def test_magnitude_is_bounded_and_zero_only_for_equal_drafts(old: Any, new: Any) -> None:
    summary = json_diff(old, new).summary
    assert 0.0 <= summary.magnitude <= 1.0
    same = json.dumps(old, sort_keys=True) == json.dumps(new, sort_keys=True)
    assert (summary.magnitude == 0.0) == same == (summary.changed_paths == ())
    assert json_diff(new, old).summary.changed_paths == summary.changed_paths
