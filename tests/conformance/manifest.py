"""The conformance manifest: load it, validate its shape, and link it to the tests.

`manifest.toml` holds one entry per normative statement of the SW4RM specs. Tests cite
entries with the `conformance(*ids)` pytest marker, written as a decorator on a test
function, method or class, or as `pytestmark = pytest.mark.conformance(...)` in a module or
class body. Citations are read from the test sources with `ast` (nothing is imported), so
the checks run in milliseconds and work on any directory, which is how their own tests feed
them synthetic suites.

Every check returns a list of human-readable problems; an empty list means it passed.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
TESTS_ROOT = REPO_ROOT / "tests"
MANIFEST_PATH = Path(__file__).resolve().with_name("manifest.toml")

ID_PATTERN = re.compile(r"^[a-z0-9]+(\.[a-z0-9-]+)+$")
LEVELS = frozenset({"MUST", "MUST NOT", "SHOULD", "SHOULD NOT"})
STATUSES = frozenset({"open", "tested"})
MARKER = "conformance"

# Keys every entry carries, with the type each must have.
_FIELDS: dict[str, type] = {
    "id": str,
    "level": str,
    "source": str,
    "text": str,
    "status": str,
    "owner": str,
    "tests": list,
}


class ManifestError(Exception):
    """The manifest cannot be read, or it breaks the shape rules."""


@dataclass(frozen=True)
class Requirement:
    """One normative statement of the specs, as recorded in the manifest."""

    id: str
    level: str
    source: str
    text: str
    status: str
    owner: str
    tests: tuple[str, ...]

    @property
    def area(self) -> str:
        """The id's first segment, e.g. `router` for `router.ack.timeout-10s`."""
        return self.id.split(".", 1)[0]


@dataclass
class SuiteScan:
    """What the test sources say: the tests that exist and the ids each one cites."""

    nodes: set[str] = field(default_factory=set)
    citations: dict[str, frozenset[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def citing(self, requirement_id: str) -> list[str]:
        """Node ids of the tests that cite `requirement_id`, sorted."""
        return sorted(node for node, ids in self.citations.items() if requirement_id in ids)


# --------------------------------------------------------------------------- manifest


def read_manifest(path: Path = MANIFEST_PATH) -> list[Any]:
    """Return the raw `[[req]]` tables of the manifest at `path`, unvalidated."""
    try:
        with path.open("rb") as fh:
            document = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ManifestError(f"{path}: {exc}") from exc
    unknown = sorted(set(document) - {"req"})
    if unknown:
        raise ManifestError(f"{path}: unexpected top-level keys {unknown}")
    entries = document.get("req", [])
    if not isinstance(entries, list):
        raise ManifestError(f"{path}: `req` must be an array of tables ([[req]])")
    return entries


def validate_manifest(entries: Sequence[Any]) -> list[str]:
    """Return every shape problem of raw manifest entries (empty when well formed)."""
    problems: list[str] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        where = f"entry #{index + 1}"
        if not isinstance(entry, dict):
            problems.append(f"{where}: not a table")
            continue
        if isinstance(entry.get("id"), str):
            where = f"{where} ({entry['id']})"
        problems.extend(f"{where}: {p}" for p in _entry_problems(entry))
        rid = entry.get("id")
        if isinstance(rid, str):
            if rid in seen:
                problems.append(f"{where}: duplicate id")
            seen.add(rid)
    return problems


def _entry_problems(entry: Mapping[str, Any]) -> Iterator[str]:
    for key, kind in _FIELDS.items():
        if key not in entry:
            yield f"missing key `{key}`"
        elif not isinstance(entry[key], kind):
            yield f"`{key}` must be a {kind.__name__}"
    for key in sorted(set(entry) - set(_FIELDS)):
        yield f"unknown key `{key}`"
    if any(key not in entry or not isinstance(entry[key], _FIELDS[key]) for key in _FIELDS):
        return
    if not ID_PATTERN.match(entry["id"]):
        yield f"id does not match {ID_PATTERN.pattern}"
    if entry["level"] not in LEVELS:
        yield f"level {entry['level']!r} not in {sorted(LEVELS)}"
    if entry["status"] not in STATUSES:
        yield f"status {entry['status']!r} not in {sorted(STATUSES)}"
    for key in ("source", "text"):
        if not entry[key].strip():
            yield f"`{key}` is empty"
    yield from _tests_problems(entry)


def _tests_problems(entry: Mapping[str, Any]) -> Iterator[str]:
    tests = entry["tests"]
    if not all(isinstance(node, str) and "::" in node for node in tests):
        yield "`tests` must hold pytest node ids such as 'tests/unit/test_x.py::test_y'"
    elif len(set(tests)) != len(tests):
        yield "`tests` lists a node id twice"
    if entry["status"] == "tested" and not tests:
        yield "status is tested but `tests` is empty"
    if entry["status"] == "open" and tests:
        yield "status is open but `tests` is not empty (mark it tested)"
    if entry["status"] == "open" and not entry["owner"].strip():
        yield "status is open but `owner` is empty"


def load_manifest(path: Path = MANIFEST_PATH) -> list[Requirement]:
    """Read and validate the manifest; raise `ManifestError` listing every problem."""
    entries = read_manifest(path)
    problems = validate_manifest(entries)
    if problems:
        raise ManifestError(f"{path}:\n  " + "\n  ".join(problems))
    return [
        Requirement(
            id=e["id"],
            level=e["level"],
            source=e["source"],
            text=e["text"],
            status=e["status"],
            owner=e["owner"],
            tests=tuple(e["tests"]),
        )
        for e in entries
    ]


# --------------------------------------------------------------------------- citations


def is_test_file(path: Path) -> bool:
    """Whether pytest collects `path` under its default `python_files` patterns."""
    return path.suffix == ".py" and (path.name.startswith("test_") or path.stem.endswith("_test"))


def scan_tests(tests_root: Path = TESTS_ROOT, repo_root: Path = REPO_ROOT) -> SuiteScan:
    """Parse every `*.py` under `tests_root` and collect test node ids and citations.

    Node ids are relative to `repo_root` (pytest's rootdir), e.g.
    `tests/unit/test_hlc.py::TestClock::test_receive_monotonic`.
    """
    scan = SuiteScan()
    for path in sorted(tests_root.rglob("*.py")):
        rel = path.relative_to(repo_root).as_posix()
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        except SyntaxError as exc:
            scan.problems.append(f"{rel}:{exc.lineno}: cannot parse: {exc.msg}")
            continue
        _scan_module(tree, rel, collect=is_test_file(path), scan=scan)
    return scan


def _scan_module(tree: ast.Module, rel: str, *, collect: bool, scan: SuiteScan) -> None:
    module_ids = _pytestmark_ids(tree.body, rel, scan.problems)
    if not collect:
        # pytest never collects tests here, so a citation would show nothing.
        if module_ids:
            scan.problems.append(f"{rel}: conformance pytestmark in a file pytest does not collect")
        _report_stray_markers(tree, rel, scan.problems)
        return
    _scan_body(tree.body, rel, module_ids, scan)


def _scan_body(
    body: Iterable[ast.stmt], prefix: str, inherited: frozenset[str], scan: SuiteScan
) -> None:
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            own = _decorator_ids(node, prefix, scan.problems)
            if node.name.startswith("test"):
                node_id = f"{prefix}::{node.name}"
                scan.nodes.add(node_id)
                ids = inherited | own
                if ids:
                    scan.citations[node_id] = scan.citations.get(node_id, frozenset()) | ids
            elif own:
                scan.problems.append(
                    f"{_where(prefix, node)}: conformance marker on `{node.name}`, "
                    "which pytest does not collect as a test"
                )
        elif isinstance(node, ast.ClassDef):
            own = _decorator_ids(node, prefix, scan.problems)
            own |= _pytestmark_ids(node.body, prefix, scan.problems)
            if node.name.startswith("Test"):
                _scan_body(node.body, f"{prefix}::{node.name}", inherited | own, scan)
            elif own:
                scan.problems.append(
                    f"{_where(prefix, node)}: conformance marker on class `{node.name}`, "
                    "which pytest does not collect (test classes start with `Test`)"
                )


def _report_stray_markers(tree: ast.Module, rel: str, problems: list[str]) -> None:
    for node in ast.walk(tree):
        if isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
        ) and _decorator_ids(node, rel, problems):
            problems.append(
                f"{rel}:{node.lineno}: conformance marker on `{node.name}` in a file "
                "pytest does not collect"
            )


def _where(prefix: str, node: ast.stmt) -> str:
    return f"{prefix.split('::', 1)[0]}:{node.lineno}"


def _decorator_ids(
    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef, prefix: str, problems: list[str]
) -> frozenset[str]:
    ids: set[str] = set()
    for decorator in node.decorator_list:
        ids |= _marker_ids(decorator, _where(prefix, node), problems)
    return frozenset(ids)


def _pytestmark_ids(body: Iterable[ast.stmt], prefix: str, problems: list[str]) -> frozenset[str]:
    ids: set[str] = set()
    for stmt in body:
        value = _pytestmark_value(stmt)
        if value is None:
            continue
        marks = value.elts if isinstance(value, ast.List | ast.Tuple) else [value]
        for mark in marks:
            ids |= _marker_ids(mark, _where(prefix, stmt), problems)
    return frozenset(ids)


def _pytestmark_value(stmt: ast.stmt) -> ast.expr | None:
    """The value assigned by `pytestmark = ...` (or `pytestmark: T = ...`), else None."""
    if isinstance(stmt, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets
    ):
        return stmt.value
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return stmt.value if stmt.target.id == "pytestmark" else None
    return None


def _marker_ids(expr: ast.expr, where: str, problems: list[str]) -> set[str]:
    """The ids of `expr` if it is a `conformance(...)` marker call, else nothing."""
    if not (isinstance(expr, ast.Call) and _is_conformance_marker(expr.func)):
        if _is_conformance_marker(expr):
            problems.append(f"{where}: conformance marker used without ids")
        return set()
    if expr.keywords:
        problems.append(f"{where}: conformance marker takes ids only, no keyword arguments")
    ids: set[str] = set()
    for arg in expr.args:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            ids.add(arg.value)
        else:
            problems.append(
                f"{where}: conformance marker arguments must be string literals "
                f"(got `{ast.unparse(arg)}`)"
            )
    if not expr.args:
        problems.append(f"{where}: conformance marker used without ids")
    return ids


def _is_conformance_marker(func: ast.expr) -> bool:
    # Accept `pytest.mark.conformance` and `mark.conformance` (from `from pytest import mark`).
    return (
        isinstance(func, ast.Attribute)
        and func.attr == MARKER
        and (
            (isinstance(func.value, ast.Attribute) and func.value.attr == "mark")
            or (isinstance(func.value, ast.Name) and func.value.id == "mark")
        )
    )


# --------------------------------------------------------------------------- cross-checks


def _base_node(node_id: str) -> str:
    """Drop a parametrization suffix: `f.py::test_x[a-b]` -> `f.py::test_x`."""
    return node_id.split("[", 1)[0]


def check_unknown_citations(requirements: Iterable[Requirement], scan: SuiteScan) -> list[str]:
    """Problems for tests that cite ids absent from the manifest."""
    known = {r.id for r in requirements}
    return [
        f"{node} cites unknown requirement id {rid!r}"
        for node, ids in sorted(scan.citations.items())
        for rid in sorted(ids - known)
    ]


def check_tested_entries(requirements: Iterable[Requirement], scan: SuiteScan) -> list[str]:
    """Problems for tested entries whose tests are missing, absent or do not cite them."""
    problems: list[str] = []
    for req in requirements:
        if req.status != "tested":
            continue
        if not req.tests:
            problems.append(f"{req.id} is marked tested but lists no tests")
        for node in req.tests:
            base = _base_node(node)
            if base not in scan.nodes:
                problems.append(f"{req.id} lists {node}, which is not a test in the suite")
            elif req.id not in scan.citations.get(base, frozenset()):
                problems.append(f"{req.id} lists {node}, which does not cite it")
    return problems


def check_open_citations(requirements: Iterable[Requirement], scan: SuiteScan) -> list[str]:
    """Problems for tests that cite entries still marked open (cite => mark tested)."""
    open_ids = {r.id for r in requirements if r.status == "open"}
    return [
        f'{node} cites {rid!r}, which the manifest still marks open: set status = "tested" '
        f"and add {node!r} to its tests"
        for node, ids in sorted(scan.citations.items())
        for rid in sorted(ids & open_ids)
    ]


def check_all(
    manifest_path: Path = MANIFEST_PATH, tests_root: Path = TESTS_ROOT, repo_root: Path = REPO_ROOT
) -> list[str]:
    """Every problem of the manifest and its links to the suite, for a one-shot check."""
    try:
        requirements = load_manifest(manifest_path)
    except ManifestError as exc:
        return [str(exc)]
    scan = scan_tests(tests_root, repo_root)
    return [
        *scan.problems,
        *check_unknown_citations(requirements, scan),
        *check_tested_entries(requirements, scan),
        *check_open_citations(requirements, scan),
    ]
