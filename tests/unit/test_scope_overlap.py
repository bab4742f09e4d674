"""The rule-based inference engine (RFC 9.2, 9.3): the scope grammar, each verdict rule, the
glob tests against a brute-force matcher, and the verdict's properties.

Requirements shown here (tests/conformance/manifest.toml): concurrency.scope.overlap-analysis,
concurrency.inference.confidence-range.
"""

from __future__ import annotations

import fnmatch
import itertools
from functools import cache
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.scope_overlap import (
    CACHED_SCOPE_CHARS,
    DIFFERENT_REPOS,
    DISJOINT,
    MAX_ITEMS,
    MAX_SEGMENTS,
    NESTED_PATHS,
    OVERLAPPING_PATHS,
    SHARED_RESOURCE,
    UNKNOWN,
    ParallelismVerdict,
    Scope,
    check_parallelism,
    globs_nest,
    globs_overlap,
    parse_scope,
)
from apiary.errors import ValidationError

SCORES = (SHARED_RESOURCE, NESTED_PATHS, OVERLAPPING_PATHS, UNKNOWN, DISJOINT, DIFFERENT_REPOS)


def score(a: str, b: str) -> float:
    return check_parallelism(a, b).confidence_score


# --- grammar ----------------------------------------------------------------------------------


def test_the_text_form() -> None:
    scope = parse_scope("repo:app path:src/api/** resource:db.orders path:docs/*.md")
    assert scope == Scope(
        repos=("app",), paths=("docs/*.md/**", "src/api/**"), resources=("db.orders",)
    )
    assert scope.declared


def test_a_scope_parsed_again_is_found_and_a_refused_one_is_refused_again() -> None:
    text = "repo:app path:src/cache/** resource:db.cache"
    assert parse_scope(text) is parse_scope(text)
    long = "repo:app " + " ".join(f"path:src/module_{i:02}/**" for i in range(MAX_ITEMS))
    assert len(long) > CACHED_SCOPE_CHARS
    assert parse_scope(long) == parse_scope(long) and parse_scope(long) is not parse_scope(long)
    for _ in range(2):
        with pytest.raises(ValidationError, match="not repo:"):
            parse_scope("repo:app nonsense")


def test_the_json_form_equals_the_text_form() -> None:
    text = parse_scope("repo:app path:src/api/** resource:db.orders")
    json_form = parse_scope(
        '{"repos": ["app"], "paths": ["src/api/**"], "resources": ["db.orders"]}'
    )
    assert json_form == text


@pytest.mark.parametrize(
    ("glob", "normalized"),
    [
        ("src/api", "src/api/**"),
        ("src/api/", "src/api/**"),
        ("./src//api", "src/api/**"),
        ("src/**", "src/**"),
        ("src/**/**/x", "src/**/x/**"),
        ("**", "**"),
        ("*.py", "*.py/**"),
    ],
)
def test_globs_cover_what_lies_beneath(glob: str, normalized: str) -> None:
    assert parse_scope(f"path:{glob}").paths == (normalized,)


def test_blank_scopes_declare_nothing_and_duplicates_collapse() -> None:
    assert parse_scope("") == parse_scope("  \n ") == Scope()
    assert not parse_scope("repo:app").declared
    assert parse_scope("path:a path:a/ resource:r resource:r") == Scope(
        paths=("a/**",), resources=("r",)
    )


@pytest.mark.parametrize(
    "text",
    [
        "src/api/**",
        "file:x",
        "path:",
        "resource:",
        "repo:",
        "path:/etc/passwd",
        "path:../outside",
        "path:src/[ab].py",
        "path:src/*.{js,ts}",
        "path:src\\api",
        "path:src/a**b",
        "resource:db..orders",
        "resource:.db",
        "{",
        "[1, 2]",
        '{"paths": "src"}',
        '{"paths": [1]}',
        '{"files": ["x"]}',
        '{"paths": ["a b"]}',
        "x" * 70_000,
    ],
)
def test_bad_scopes_name_the_field(text: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_scope(text)
    assert info.value.details["field"] == "scope"


def test_a_scope_must_be_a_string() -> None:
    bad: Any = ["path:x"]
    with pytest.raises(ValidationError):
        parse_scope(bad)


# --- the rules --------------------------------------------------------------------------------


def test_a_shared_resource_is_never_safe_even_across_repos() -> None:
    verdict = check_parallelism("repo:a resource:db.orders", "repo:b resource:db.orders")
    assert verdict == ParallelismVerdict(
        0.0, "both use db.orders: serialize them", ("resource:db.orders",)
    )


def test_dotted_resources_nest() -> None:
    verdict = check_parallelism("resource:db", "resource:db.orders path:x")
    assert verdict.confidence_score == 0.0
    assert verdict.overlaps == ("resource:db ~ db.orders",)
    assert score("resource:db.orders", "resource:db.ordersx") == DISJOINT


def test_different_repositories_are_safe() -> None:
    assert score("repo:a path:src/**", "repo:b path:src/**") == DIFFERENT_REPOS
    # A shared repository, or one that may be shared, compares paths.
    assert score("repo:a repo:b path:src", "repo:b path:src") == NESTED_PATHS
    assert score("repo:a path:src", "path:src") == NESTED_PATHS


@pytest.mark.parametrize(
    ("a", "b"), [("", ""), ("repo:app", "repo:app"), ("path:src", ""), ("resource:db", "repo:x")]
)
def test_nothing_declared_is_unknown(a: str, b: str) -> None:
    verdict = check_parallelism(a, b)
    assert verdict.confidence_score == UNKNOWN and verdict.overlaps == ()


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("path:src/api/**", "path:src/api/**", NESTED_PATHS),
        ("path:src/**", "path:src/api/**", NESTED_PATHS),
        ("path:src", "path:src/api/handlers.py", NESTED_PATHS),
        ("path:src/*.py", "path:src/app.py", NESTED_PATHS),
        ("path:**", "path:anything/at/all", NESTED_PATHS),
        ("path:src/*/models.py", "path:src/api/*", OVERLAPPING_PATHS),
        ("path:**/test_*.py", "path:tests/**", OVERLAPPING_PATHS),
        ("path:a?c", "path:ab?", OVERLAPPING_PATHS),
        ("path:src/api/**", "path:src/web/**", DISJOINT),
        ("path:src/*.py", "path:src/api/x.py", DISJOINT),
        ("path:docs/*.md", "path:src/**", DISJOINT),
        # A glob covers what lies beneath: docs/a.md/b.py matches both.
        ("path:**/*.py", "path:docs/*.md", OVERLAPPING_PATHS),
        ("path:src/a.py", "path:src/a.pyc", DISJOINT),
        ("path:x", "resource:db", DISJOINT),
        ("resource:db.orders", "resource:db.users", DISJOINT),
    ],
)
def test_path_rules(a: str, b: str, expected: float) -> None:
    assert score(a, b) == expected


def test_the_worst_pair_decides_and_every_conflict_is_listed() -> None:
    verdict = check_parallelism("path:src/api path:docs", "path:src/** path:docs/*/x path:z")
    assert verdict.confidence_score == NESTED_PATHS
    assert verdict.overlaps == ("path:docs/** ~ docs/*/x/**", "path:src/** ~ src/api/**")
    assert "src/** ~ src/api/**" in verdict.notes


def test_scopes_may_be_given_parsed() -> None:
    a = parse_scope("path:src/api")
    assert check_parallelism(a, "path:src") == check_parallelism("path:src/api", "path:src")


# --- globs against a brute-force matcher ------------------------------------------------------

SEGMENTS = ("a", "b", "*", "?", "a*", "*a", "?b", "ab", "**")
WORDS = ("a", "b", "aa", "ab", "ba", "bb")  # enough to witness any overlap of SEGMENTS
# Every path of up to four segments: two-segment globs need at most four to meet.
PATHS = [p for n in range(5) for p in itertools.product(WORDS, repeat=n)]
GLOBS = st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=2).map("/".join)


@cache
def matches(glob: tuple[str, ...], path: tuple[str, ...]) -> bool:
    if not glob:
        return not path
    if glob[0] == "**":
        return matches(glob[1:], path) or (bool(path) and matches(glob, path[1:]))
    return bool(path) and fnmatch.fnmatchcase(path[0], glob[0]) and matches(glob[1:], path[1:])


def language(glob: str) -> frozenset[tuple[str, ...]]:
    (normalized,) = parse_scope(f"path:{glob}").paths
    segments = tuple(normalized.split("/"))
    return frozenset(p for p in PATHS if matches(segments, p))


@given(GLOBS, GLOBS)
def test_overlap_is_exact(a: str, b: str) -> None:
    (na,), (nb,) = parse_scope(f"path:{a}").paths, parse_scope(f"path:{b}").paths
    assert globs_overlap(na, nb) is bool(language(a) & language(b))


@given(GLOBS, GLOBS)
def test_nesting_is_only_claimed_when_true(a: str, b: str) -> None:
    (na,), (nb,) = parse_scope(f"path:{a}").paths, parse_scope(f"path:{b}").paths
    if globs_nest(na, nb):
        la, lb = language(a), language(b)
        assert la <= lb or lb <= la


def test_nesting_found_for_common_shapes() -> None:
    assert globs_nest("src/**", "src/api/**")
    assert globs_nest("src/*/**", "src/a*/**")
    assert globs_nest("**", "a/**/b/**")
    assert not globs_nest("src/a*/**", "src/*b/**")
    assert globs_overlap("src/a*/**", "src/*b/**")


def test_sizes_are_bounded() -> None:
    longest = "/".join(["*"] * MAX_SEGMENTS)
    assert score(f"path:{longest}", f"path:{'/'.join(['a'] * MAX_SEGMENTS)}") == NESTED_PATHS
    too_long = [
        f"path:{'/'.join(['a'] * (MAX_SEGMENTS + 1))}",
        "path:" + "a" * 256,
        " ".join(f"resource:r{i}" for i in range(MAX_ITEMS + 1)),
    ]
    for text in too_long:
        with pytest.raises(ValidationError):
            parse_scope(text)


# --- properties -------------------------------------------------------------------------------

TOKENS = st.one_of(
    st.sampled_from(["app", "lib"]).map("repo:{}".format),
    GLOBS.map("path:{}".format),
    st.sampled_from(["db", "db.orders", "db.users", "queue"]).map("resource:{}".format),
)
SCOPES = st.lists(TOKENS, max_size=4).map(" ".join)


@pytest.mark.conformance("concurrency.inference.confidence-range")
@given(SCOPES, SCOPES)
def test_the_verdict_is_symmetric_and_in_range(a: str, b: str) -> None:
    verdict = check_parallelism(a, b)
    assert verdict == check_parallelism(b, a)
    assert 0.0 <= verdict.confidence_score <= 1.0
    assert verdict.confidence_score in SCORES
    assert bool(verdict.overlaps) is (verdict.confidence_score < OVERLAPPING_PATHS + 0.01)


@given(SCOPES)
def test_a_scope_conflicts_with_itself_when_it_declares_anything(text: str) -> None:
    scope = parse_scope(text)
    expected_unsafe = bool(scope.paths or scope.resources)
    assert (check_parallelism(scope, scope).confidence_score <= NESTED_PATHS) is expected_unsafe


@given(SCOPES)
def test_the_canonical_text_parses_back(text: str) -> None:
    scope = parse_scope(text)
    assert parse_scope(scope.text()) == scope
