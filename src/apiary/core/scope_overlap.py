"""The built-in rule-based inference engine: may two tasks run in parallel? (RFC 9.2, 9.3)

A task's scope names what it will read or change. Two forms are accepted by `parse_scope`:

Text: tokens separated by whitespace, each `kind:value`::

    repo:app path:src/api/** path:docs/*.md resource:db.orders

JSON: an object with optional arrays of strings::

    {"repos": ["app"], "paths": ["src/api/**"], "resources": ["db.orders"]}

- `repo:<id>`: a repository. Paths are relative to the scope's repositories; a scope without
  one may be in any repository.
- `path:<glob>`: files, '/'-separated. `**` as a whole segment matches zero or more segments,
  `*` any run of characters within a segment, `?` one character; anything else is literal.
  A glob also covers everything beneath what it matches (a directory names its contents):
  `src/api` means `src/api/**`. Empty and `.` segments are dropped (`./src//a` is `src/a`);
  absolute paths, `..`, backslashes and the unsupported glob syntax `[ ] { }` are refused
  rather than misread.
- `resource:<name>`: a shared resource (a database table, a queue, a service). Resources are
  global, not per repository, and dotted names nest: `db` covers `db.orders`.
- `op:<type>` (JSON `"operation": "<type>"`): the task's operation type, at most one. It does
  not enter the verdict; the Scheduler's policy overrides are keyed by it (RFC 9.3).
- `worktree:required` (JSON `"worktree": "required"`): the task needs its agent bound to a
  worktree; the Scheduler holds it while the agent is UNBOUND or BIND_FAILED (RFC 16.3). It
  does not enter the verdict either.

`check_parallelism` returns a `ParallelismVerdict` whose `confidence_score` (0..1) is the
confidence that running both in parallel is safe, from the first rule that applies:

1. a shared resource (equal or nested names): 0.0, even across repositories;
2. both name repositories and none is shared: 1.0;
3. either declares no path and no resource: 0.5 (unknown);
4. identical or nested globs (one matches everything the other does): 0.1;
5. overlapping globs (some path matches both): 0.3;
6. otherwise (disjoint paths, different resources): 0.95.

The glob tests are exact for overlap (no disjoint pair is ever called overlapping or the
reverse) and sound for nesting: "nested" is only reported when true, and the rare nestings
the structural test cannot prove (such as segment `?*` within `*?`) count as overlap (0.3).
The verdict is symmetric: its notes and overlaps list each pair in sorted order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from apiary.core.json_reader import read_json
from apiary.errors import ValidationError

SHARED_RESOURCE: Final = 0.0
NESTED_PATHS: Final = 0.1
OVERLAPPING_PATHS: Final = 0.3
UNKNOWN: Final = 0.5
DISJOINT: Final = 0.95
DIFFERENT_REPOS: Final = 1.0
MAX_SCOPE_CHARS: Final = 65_536
MAX_ITEMS: Final = 64
"""Most repos, paths or resources one scope may name: paths are compared pairwise."""
MAX_SEGMENTS: Final = 64
"""Most segments in one glob: the glob tests are quadratic in pattern length."""
MAX_SEGMENT_CHARS: Final = 255
"""Longest segment (the usual file name limit)."""
SCOPES_CACHED: Final = 4096
"""Parsed scopes kept (`parse_scope`), of texts up to CACHED_SCOPE_CHARS: at most 4 MiB."""
CACHED_SCOPE_CHARS: Final = 1024
_KINDS: Final = ("repo", "path", "resource", "op", "worktree")
_JSON_KEYS: Final = {"repos": "repo", "paths": "path", "resources": "resource"}
_UNSUPPORTED: Final = frozenset("[]{}\\")
_FIELD: Final = "scope"
_Pair = Callable[[str, str], bool]


@dataclass(frozen=True, slots=True)
class Scope:
    """A parsed scope: sorted, de-duplicated repos, normalized path globs and resources."""

    repos: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    operation: str = ""
    needs_worktree: bool = False
    """`worktree:required`: the task runs only on an agent with a bound worktree (RFC 16.3)."""

    @property
    def declared(self) -> bool:
        """Whether the scope names any path or resource (else parallelism is unknown)."""
        return bool(self.paths or self.resources)

    def text(self) -> str:
        """The canonical text form (parses back to an equal Scope)."""
        return " ".join(
            [f"repo:{r}" for r in self.repos]
            + [f"path:{p}" for p in self.paths]
            + [f"resource:{r}" for r in self.resources]
            + ([f"op:{self.operation}"] if self.operation else [])
            + (["worktree:required"] if self.needs_worktree else [])
        )


@dataclass(frozen=True, slots=True)
class ParallelismVerdict:
    """The engine's answer (RFC 9.3): confidence in [0, 1] that parallel execution is safe.

    `overlaps` names what the two scopes share ("resource:db.orders", "path:a/** ~ a/b/**");
    `notes` explains the score for humans (HITL reviewers, logs).
    """

    confidence_score: float
    notes: str
    overlaps: tuple[str, ...] = ()


# --- parsing ----------------------------------------------------------------------------------


def parse_scope(text: str) -> Scope:
    """Parse the text or JSON form (see the module docstring); ValidationError field "scope".

    An empty or blank scope is valid and declares nothing. A scope parsed before is found
    again (`_parsed`: tasks of one repository share their scope text, and a task's scope is
    read at its admission, its job identity and its dispatch).
    """
    if not isinstance(text, str):
        raise ValidationError.for_field(_FIELD, "must be a string")
    if len(text) > MAX_SCOPE_CHARS:
        raise ValidationError.for_field(_FIELD, f"must be at most {MAX_SCOPE_CHARS} characters")
    if len(text) > CACHED_SCOPE_CHARS:
        return _parse(text)
    return _parsed(text)


def _parse(text: str) -> Scope:
    stripped = text.strip()
    if stripped.startswith("{"):
        return _build(_json_items(stripped))
    items: list[tuple[str, str]] = []
    for token in stripped.split():
        kind, sep, value = token.partition(":")
        if not sep or kind not in _KINDS:
            raise ValidationError.for_field(
                _FIELD,
                f"{token!r} is not repo:, path:, resource:, op: or worktree:",
                token=token,
            )
        items.append((kind, value))
    return _build(items)


_parsed: Final = functools.lru_cache(maxsize=SCOPES_CACHED)(_parse)
"""`_parse` of the scopes met last (a Scope is immutable; a refused text raises each time)."""


def _json_items(text: str) -> list[tuple[str, str]]:
    # Its strings become paths and ids that are compared, hashed and shown again: kept
    # values (no NUL, no lone surrogate), like any JSON the coordinator keeps.
    data = read_json(text, _FIELD)
    if not isinstance(data, dict):
        raise ValidationError.for_field(_FIELD, "JSON form must be an object")
    items: list[tuple[str, str]] = []
    for key, values in data.items():
        if key in ("operation", "worktree"):
            if not isinstance(values, str):
                raise ValidationError.for_field(_FIELD, f"{key} must be a string")
            items.append(("op" if key == "operation" else "worktree", values))
            continue
        kind = _JSON_KEYS.get(key)
        if kind is None:
            raise ValidationError.for_field(
                _FIELD,
                f"unknown key {key!r} (repos, paths, resources, operation, worktree)",
                token=str(key),
            )
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ValidationError.for_field(_FIELD, f"{key} must be an array of strings")
        items.extend((kind, v) for v in values)
    return items


def _build(items: Iterable[tuple[str, str]]) -> Scope:
    found: dict[str, set[str]] = {kind: set() for kind in _KINDS}
    for kind, value in items:
        if not value or value != value.strip() or any(c.isspace() for c in value):
            raise ValidationError.for_field(
                _FIELD, f"{kind}: needs a value without spaces", token=f"{kind}:{value}"
            )
        found[kind].add(_normalize_glob(value) if kind == "path" else _name(kind, value))
    for kind, values in found.items():
        if len(values) > MAX_ITEMS:
            raise ValidationError.for_field(_FIELD, f"at most {MAX_ITEMS} {kind}: entries")
    if len(found["op"]) > 1:
        raise ValidationError.for_field(_FIELD, "at most one op: (the task's operation type)")
    if found["worktree"] - {"required"}:
        raise ValidationError.for_field(_FIELD, "worktree: takes one value, required")
    return Scope(
        repos=tuple(sorted(found["repo"])),
        paths=tuple(sorted(found["path"])),
        resources=tuple(sorted(found["resource"])),
        operation=next(iter(found["op"]), ""),
        needs_worktree=bool(found["worktree"]),
    )


def _name(kind: str, value: str) -> str:
    if kind == "resource" and any(not part for part in value.split(".")):
        raise ValidationError.for_field(
            _FIELD, "resource: names are dot-separated non-empty parts", token=f"{kind}:{value}"
        )
    return value


def _normalize_glob(glob: str) -> str:
    """`glob` as '/'-joined segments ending in `**` (it covers what lies beneath)."""
    token = f"path:{glob}"
    if _UNSUPPORTED & set(glob):
        raise ValidationError.for_field(
            _FIELD, "path: globs support only *, ** and ? (no [ ] { } or backslash)", token=token
        )
    if glob.startswith("/"):
        raise ValidationError.for_field(_FIELD, "path: must be relative", token=token)
    segments = [s for s in glob.split("/") if s not in ("", ".")]
    if ".." in segments:
        raise ValidationError.for_field(_FIELD, "path: must not use ..", token=token)
    if any("**" in s and s != "**" for s in segments):
        raise ValidationError.for_field(_FIELD, "path: ** must be a whole segment", token=token)
    if len(segments) > MAX_SEGMENTS or any(len(s) > MAX_SEGMENT_CHARS for s in segments):
        raise ValidationError.for_field(
            _FIELD,
            f"path: at most {MAX_SEGMENTS} segments of {MAX_SEGMENT_CHARS} characters",
            token=token[:100],
        )
    collapsed: list[str] = []
    for s in [*segments, "**"]:
        if not (s == "**" and collapsed and collapsed[-1] == "**"):
            collapsed.append(s)
    return "/".join(collapsed)


# --- the verdict ------------------------------------------------------------------------------


def check_parallelism(a: Scope | str, b: Scope | str) -> ParallelismVerdict:
    """How safe it is to run tasks with scopes `a` and `b` in parallel (rules 1-6 above).

    Strings are parsed with `parse_scope`. Symmetric: swapping `a` and `b` gives an equal
    verdict.
    """
    sa = a if isinstance(a, Scope) else parse_scope(a)
    sb = b if isinstance(b, Scope) else parse_scope(b)
    shared = _shared_resources(sa.resources, sb.resources)
    if shared:
        return ParallelismVerdict(
            SHARED_RESOURCE,
            "both use " + ", ".join(shared) + ": serialize them",
            tuple(f"resource:{r}" for r in shared),
        )
    if sa.repos and sb.repos and not set(sa.repos) & set(sb.repos):
        return ParallelismVerdict(DIFFERENT_REPOS, "different repositories")
    if not (sa.declared and sb.declared):
        return ParallelismVerdict(UNKNOWN, "a scope names no path or resource: unknown")
    nested, overlapping = _path_conflicts(sa.paths, sb.paths)
    if nested:
        return ParallelismVerdict(
            NESTED_PATHS,
            "identical or nested paths: " + "; ".join(nested),
            tuple(f"path:{n}" for n in nested),
        )
    if overlapping:
        return ParallelismVerdict(
            OVERLAPPING_PATHS,
            "overlapping paths: " + "; ".join(overlapping),
            tuple(f"path:{o}" for o in overlapping),
        )
    return ParallelismVerdict(DISJOINT, "disjoint paths and resources")


def _shared_resources(a: Iterable[str], b: Iterable[str]) -> tuple[str, ...]:
    shared: set[str] = set()
    bs = tuple(b)
    for x in a:
        for y in bs:
            if x == y:
                shared.add(x)
            elif _covers(x, y) or _covers(y, x):
                low, high = sorted((x, y))
                shared.add(f"{low} ~ {high}")
    return tuple(sorted(shared))


def _covers(outer: str, inner: str) -> bool:
    return inner.startswith(outer + ".")


def _path_conflicts(a: Iterable[str], b: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    nested: set[str] = set()
    overlapping: set[str] = set()
    bs = tuple(b)
    for x in a:
        for y in bs:
            pair = " ~ ".join(sorted((x, y))) if x != y else x
            if globs_nest(x, y):
                nested.add(pair)
            elif globs_overlap(x, y):
                overlapping.add(pair)
    return tuple(sorted(nested)), tuple(sorted(overlapping))


# --- globs ------------------------------------------------------------------------------------


def globs_overlap(a: str, b: str) -> bool:
    """Whether some path matches both globs (exact for `**`, `*`, `?` and literals)."""
    return _sequences_meet(a.split("/"), b.split("/"), "**", _segments_meet)


def globs_nest(a: str, b: str) -> bool:
    """Whether one glob matches every path the other does (sound: True only when so)."""
    sa, sb = a.split("/"), b.split("/")
    return _sequence_within(sa, sb, "**", _segment_within) or _sequence_within(
        sb, sa, "**", _segment_within
    )


def _segments_meet(a: str, b: str) -> bool:
    return _sequences_meet(list(a), list(b), "*", _chars_meet)


def _segment_within(inner: str, outer: str) -> bool:
    return _sequence_within(list(inner), list(outer), "*", _char_within)


def _chars_meet(a: str, b: str) -> bool:
    return "?" in (a, b) or a == b


def _char_within(inner: str, outer: str) -> bool:
    return outer in ("?", inner)


def _sequences_meet(a: list[str], b: list[str], star: str, meet: _Pair) -> bool:
    """Whether the languages of two patterns intersect; `star` matches any run of items.

    meets[i][j]: a[i:] and b[j:] share a word. Bottom-up, so long patterns cannot overflow
    the stack. A star may consume one item of the other side (any item it can produce) or
    nothing; two non-stars must be able to produce a common item.
    """
    n, m = len(a), len(b)
    meets = [[False] * (m + 1) for _ in range(n + 1)]
    meets[n][m] = True
    for i in range(n, -1, -1):
        for j in range(m, -1, -1):
            if i == n and j == m:
                continue
            if i < n and a[i] == star:
                meets[i][j] = meets[i + 1][j] or (j < m and meets[i][j + 1])
            elif j < m and b[j] == star:
                meets[i][j] = meets[i][j + 1] or (i < n and meets[i + 1][j])
            else:
                meets[i][j] = i < n and j < m and meet(a[i], b[j]) and meets[i + 1][j + 1]
    return meets[0][0]


def _sequence_within(inner: list[str], outer: list[str], star: str, within: _Pair) -> bool:
    """A sufficient test that every word of `inner` is a word of `outer`.

    An outer star absorbs any run of inner items, inner stars included; an inner star is
    only absorbed by an outer star; other items must be contained item by item.
    """
    n, m = len(inner), len(outer)
    ok = [[False] * (m + 1) for _ in range(n + 1)]
    ok[n][m] = True
    for j in range(m - 1, -1, -1):
        ok[n][j] = outer[j] == star and ok[n][j + 1]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            if outer[j] == star:
                ok[i][j] = ok[i][j + 1] or ok[i + 1][j]
            elif inner[i] == star:
                ok[i][j] = False
            else:
                ok[i][j] = within(inner[i], outer[j]) and ok[i + 1][j + 1]
    return ok[0][0]
