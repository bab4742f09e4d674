"""The manifest is well formed and agrees with the suite, and the checker catches each fault.

The first tests run the checks on the real manifest and the real `tests/` tree. The rest run
them on synthetic manifests and test files under `tmp_path`, one failure kind at a time, so a
check that silently stopped working would show here.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conformance import report
from tests.conformance.manifest import (
    ManifestError,
    Requirement,
    SuiteScan,
    check_all,
    check_open_citations,
    check_tested_entries,
    check_unknown_citations,
    load_manifest,
    read_manifest,
    scan_tests,
    validate_manifest,
)

SOURCE_PREFIXES = (
    "rfc-0.5.0 ",
    "message-types",
    "advanced-patterns",
    "interop ",
    "swarm-protocol ",
    "runtime-control-plane ",
)

# --------------------------------------------------------------------------- real suite


def test_manifest_is_well_formed() -> None:
    assert validate_manifest(read_manifest()) == []


def test_manifest_sources_name_the_three_spec_documents() -> None:
    bad = [r.id for r in load_manifest() if not r.source.startswith(SOURCE_PREFIXES)]
    assert bad == []


def test_citations_in_the_suite_are_readable() -> None:
    assert scan_tests().problems == []


def test_every_citation_names_a_manifest_entry() -> None:
    assert check_unknown_citations(load_manifest(), scan_tests()) == []


def test_tested_entries_list_existing_tests_that_cite_them() -> None:
    assert check_tested_entries(load_manifest(), scan_tests()) == []


def test_cited_entries_are_marked_tested() -> None:
    assert check_open_citations(load_manifest(), scan_tests()) == []


# --------------------------------------------------------------------------- helpers


def entry(rid: str = "router.ack.timeout-10s", **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": rid,
        "level": "MUST",
        "source": "rfc-0.5.0 §11",
        "text": "Implementations MUST use a default acknowledgment timeout of 10 seconds.",
        "status": "open",
        "owner": "issue-3 router/registry",
        "tests": [],
    }
    base.update(overrides)
    return base


def marked_tested(rid: str, *nodes: str) -> dict[str, Any]:
    return entry(rid, status="tested", tests=list(nodes))


def write_manifest(path: Path, entries: list[dict[str, Any]]) -> Path:
    # JSON strings and arrays of strings are valid TOML values.
    chunks = [
        "[[req]]\n" + "".join(f"{k} = {json.dumps(v, ensure_ascii=False)}\n" for k, v in e.items())
        for e in entries
    ]
    path.write_text("\n".join(chunks), encoding="utf-8")
    return path


def write_suite(root: Path, files: dict[str, str]) -> SuiteScan:
    for rel, source in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source), encoding="utf-8")
    return scan_tests(root / "tests", root)


def requirements(*entries: dict[str, Any]) -> list[Requirement]:
    return [Requirement(**{**e, "tests": tuple(e["tests"])}) for e in entries]


# --------------------------------------------------------------------------- (a) shape


def test_validate_accepts_open_and_tested_entries() -> None:
    entries = [entry("a.b"), marked_tested("a.c", "tests/unit/test_x.py::test_y")]
    assert validate_manifest(entries) == []


@pytest.mark.parametrize(
    ("entries", "fragment"),
    [
        ([entry("a.b"), entry("a.b")], "duplicate id"),
        ([entry("Router.ack")], "does not match"),
        ([entry("router")], "does not match"),
        ([entry("router.ack_timeout")], "does not match"),
        ([entry("router..ack")], "does not match"),
        ([entry(level="MAY")], "level 'MAY'"),
        ([entry(level="SHALL")], "level 'SHALL'"),
        ([entry(status="done")], "status 'done'"),
        ([entry(status="tested")], "status is tested but `tests` is empty"),
        ([entry(owner=" ")], "`owner` is empty"),
        ([entry(tests=["tests/unit/test_x.py::test_y"])], "status is open but `tests`"),
        ([entry(text="")], "`text` is empty"),
        ([entry(tests="tests/unit/test_x.py::test_y")], "`tests` must be a list"),
        ([entry(status="tested", tests=["test_y"])], "pytest node ids"),
        ([entry(status="tested", tests=["a.py::t", "a.py::t"])], "twice"),
        ([{k: v for k, v in entry().items() if k != "owner"}], "missing key `owner`"),
        ([entry(test=[])], "unknown key `test`"),
        (["not a table"], "not a table"),
    ],
)
def test_validate_reports_each_malformed_shape(entries: list[Any], fragment: str) -> None:
    problems = validate_manifest(entries)
    assert any(fragment in p for p in problems), problems


def test_load_manifest_round_trips_a_good_file(tmp_path: Path) -> None:
    path = write_manifest(tmp_path / "m.toml", [entry("a.b"), marked_tested("a.c", "t.py::test_c")])
    loaded = load_manifest(path)
    assert [r.id for r in loaded] == ["a.b", "a.c"]
    assert loaded[1].tests == ("t.py::test_c",)
    assert loaded[0].area == "a"


def test_load_manifest_raises_with_every_problem(tmp_path: Path) -> None:
    path = write_manifest(tmp_path / "m.toml", [entry("a.b"), entry("a.b", level="MAY")])
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    assert "duplicate id" in str(info.value)
    assert "level 'MAY'" in str(info.value)


@pytest.mark.parametrize("content", ["[[req]\nid = 1\n", "req = 3\n", "[[other]]\nid = 'a.b'\n"])
def test_read_manifest_rejects_unreadable_documents(tmp_path: Path, content: str) -> None:
    path = tmp_path / "m.toml"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ManifestError):
        read_manifest(path)


def test_read_manifest_rejects_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ManifestError):
        read_manifest(tmp_path / "absent.toml")


# --------------------------------------------------------------------------- citation parser

SUITE = """\
import pytest
from pytest import mark

pytestmark = [pytest.mark.asyncio, pytest.mark.conformance("mod.wide")]


def helper():
    pass


@pytest.mark.conformance("fn.one", "fn.two")
def test_plain():
    pass


@mark.conformance("fn.async")
async def test_async():
    pass


def test_uncited():
    pass


@pytest.mark.conformance("cls.deco")
class TestGroup:
    pytestmark = pytest.mark.conformance("cls.body")

    @pytest.mark.parametrize("x", [1, 2])
    @pytest.mark.conformance("meth.own")
    def test_method(self, x):
        pass

    class TestInner:
        def test_nested(self):
            pass
"""


def test_scan_collects_nodes_and_citations(tmp_path: Path) -> None:
    scan = write_suite(tmp_path, {"tests/unit/test_mod.py": SUITE})
    path = "tests/unit/test_mod.py"
    assert scan.problems == []
    assert scan.nodes == {
        f"{path}::test_plain",
        f"{path}::test_async",
        f"{path}::test_uncited",
        f"{path}::TestGroup::test_method",
        f"{path}::TestGroup::TestInner::test_nested",
    }
    assert scan.citations == {
        f"{path}::test_plain": {"mod.wide", "fn.one", "fn.two"},
        f"{path}::test_async": {"mod.wide", "fn.async"},
        f"{path}::test_uncited": {"mod.wide"},
        f"{path}::TestGroup::test_method": {"mod.wide", "cls.deco", "cls.body", "meth.own"},
        f"{path}::TestGroup::TestInner::test_nested": {"mod.wide", "cls.deco", "cls.body"},
    }
    assert scan.citing("cls.body") == [
        f"{path}::TestGroup::TestInner::test_nested",
        f"{path}::TestGroup::test_method",
    ]


def test_scan_reads_single_module_pytestmark_and_suffix_test_files(tmp_path: Path) -> None:
    scan = write_suite(
        tmp_path,
        {
            "tests/store/sqlite_test.py": """\
                import pytest
                pytestmark: pytest.MarkDecorator = pytest.mark.conformance("a.b")
                def test_x():
                    pass
            """,
        },
    )
    assert scan.citations == {"tests/store/sqlite_test.py::test_x": {"a.b"}}


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        (
            '@pytest.mark.conformance("a.b")\ndef check_x():\n    pass\n',
            "not collect as a test",
        ),
        (
            '@pytest.mark.conformance("a.b")\nclass Helper:\n    def test_x(self):\n        pass\n',
            "does not collect",
        ),
        ("IDS = ['a.b']\n@pytest.mark.conformance(*IDS)\ndef test_x():\n    pass\n", "literals"),
        ("X = 'a.b'\n@pytest.mark.conformance(X)\ndef test_x():\n    pass\n", "literals"),
        ("@pytest.mark.conformance\ndef test_x():\n    pass\n", "without ids"),
        ("@pytest.mark.conformance()\ndef test_x():\n    pass\n", "without ids"),
        ('@pytest.mark.conformance("a.b", why=1)\ndef test_x():\n    pass\n', "keyword"),
        ("def test_x(:\n", "cannot parse"),
    ],
)
def test_scan_reports_unreadable_citations(tmp_path: Path, source: str, fragment: str) -> None:
    scan = write_suite(tmp_path, {"tests/unit/test_bad.py": "import pytest\n" + source})
    assert any(fragment in p for p in scan.problems), scan.problems


def test_scan_reports_markers_in_files_pytest_does_not_collect(tmp_path: Path) -> None:
    scan = write_suite(
        tmp_path,
        {
            "tests/conftest.py": """\
                import pytest
                pytestmark = pytest.mark.conformance("a.b")
                @pytest.mark.conformance("a.c")
                def test_looks_like_a_test():
                    pass
            """,
        },
    )
    assert scan.nodes == set()
    assert len(scan.problems) == 2, scan.problems


# --------------------------------------------------------------------------- (b) (c) (d)

CITING_SUITE = {
    "tests/unit/test_router.py": """\
        import pytest

        @pytest.mark.conformance("router.ack.timeout-10s")
        def test_ack_timeout():
            pass

        @pytest.mark.parametrize("n", [1, 2])
        @pytest.mark.conformance("router.ack.timeout-nack")
        def test_nack(n):
            pass

        def test_uncited():
            pass
    """,
}


def test_unknown_citation_is_reported(tmp_path: Path) -> None:
    scan = write_suite(tmp_path, CITING_SUITE)
    reqs = requirements(
        marked_tested("router.ack.timeout-10s", "tests/unit/test_router.py::test_ack_timeout")
    )
    problems = check_unknown_citations(reqs, scan)
    assert problems == [
        "tests/unit/test_router.py::test_nack cites unknown requirement id "
        "'router.ack.timeout-nack'"
    ]


def test_tested_entry_without_tests_is_reported(tmp_path: Path) -> None:
    scan = write_suite(tmp_path, CITING_SUITE)
    problems = check_tested_entries(requirements(marked_tested("router.ack.timeout-10s")), scan)
    assert problems == ["router.ack.timeout-10s is marked tested but lists no tests"]


def test_tested_entry_listing_a_missing_test_is_reported(tmp_path: Path) -> None:
    scan = write_suite(tmp_path, CITING_SUITE)
    reqs = requirements(
        marked_tested("router.ack.timeout-10s", "tests/unit/test_router.py::test_gone")
    )
    (problem,) = check_tested_entries(reqs, scan)
    assert "test_gone, which is not a test in the suite" in problem


def test_tested_entry_listing_a_test_that_does_not_cite_it_is_reported(tmp_path: Path) -> None:
    scan = write_suite(tmp_path, CITING_SUITE)
    reqs = requirements(
        marked_tested("router.ack.timeout-10s", "tests/unit/test_router.py::test_uncited")
    )
    (problem,) = check_tested_entries(reqs, scan)
    assert "test_uncited, which does not cite it" in problem


def test_tested_entry_may_list_a_parametrized_node_id(tmp_path: Path) -> None:
    scan = write_suite(tmp_path, CITING_SUITE)
    reqs = requirements(
        marked_tested("router.ack.timeout-nack", "tests/unit/test_router.py::test_nack[1]"),
        marked_tested("router.ack.timeout-10s", "tests/unit/test_router.py::test_ack_timeout"),
    )
    assert check_tested_entries(reqs, scan) == []


def test_citing_an_open_entry_is_reported(tmp_path: Path) -> None:
    scan = write_suite(tmp_path, CITING_SUITE)
    reqs = requirements(entry("router.ack.timeout-10s"), entry("router.ack.timeout-nack"))
    problems = check_open_citations(reqs, scan)
    assert len(problems) == 2
    assert "test_ack_timeout cites 'router.ack.timeout-10s'" in problems[0]
    assert "still marks open" in problems[0]


def test_check_all_passes_a_consistent_synthetic_suite(tmp_path: Path) -> None:
    write_suite(tmp_path, CITING_SUITE)
    manifest = write_manifest(
        tmp_path / "m.toml",
        [
            marked_tested("router.ack.timeout-10s", "tests/unit/test_router.py::test_ack_timeout"),
            marked_tested("router.ack.timeout-nack", "tests/unit/test_router.py::test_nack"),
            entry("router.ack.timeout-state"),
        ],
    )
    assert check_all(manifest, tmp_path / "tests", tmp_path) == []


def test_check_all_gathers_problems_of_every_kind(tmp_path: Path) -> None:
    write_suite(tmp_path, CITING_SUITE)
    manifest = write_manifest(
        tmp_path / "m.toml",
        [
            entry("router.ack.timeout-10s"),  # cited but open
            marked_tested("router.ack.timeout-state", "tests/unit/test_router.py::test_uncited"),
        ],  # test_nack cites an unknown id
    )
    problems = check_all(manifest, tmp_path / "tests", tmp_path)
    assert len(problems) == 3, problems
    bad = write_manifest(tmp_path / "bad.toml", [entry("BAD")])
    (problem,) = check_all(bad, tmp_path / "tests", tmp_path)
    assert "does not match" in problem


# --------------------------------------------------------------------------- report


def test_report_counts_per_area_and_strength() -> None:
    coverage = report.summarize(
        requirements(
            marked_tested("router.a", "t.py::test_a"),
            entry("router.b", level="MUST NOT"),
            entry("router.c", level="SHOULD"),
            entry("hitl.d", level="SHOULD NOT", owner="issue-4 hitl"),
        )
    )
    assert coverage.areas["router"]["MUST"].as_dict() == {"tested": 1, "total": 2, "percent": 50.0}
    assert coverage.areas["hitl"]["SHOULD"].total == 1
    assert coverage.areas["hitl"]["MUST"].total == 0
    assert report.overall_line("MUST", coverage.overall["MUST"]) == "MUST: 1/2 tested (50.0%)"
    assert report.overall_line("SHOULD", coverage.overall["SHOULD"]) == "SHOULD: 0/2 tested (0.0%)"
    assert list(coverage.open_by_owner) == ["issue-3 router/registry", "issue-4 hitl"]


def test_report_prints_table_open_entries_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = write_manifest(
        tmp_path / "m.toml", [marked_tested("router.a", "t.py::test_a"), entry("router.b")]
    )
    assert report.main(["--manifest", str(manifest), "--open"]) == 0
    out = capsys.readouterr().out
    assert "MUST: 1/2 tested (50.0%)" in out
    assert "issue-3 router/registry" in out
    assert "router.b" in out
    assert report.main(["--manifest", str(manifest), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["overall"]["MUST"] == {"tested": 1, "total": 2, "percent": 50.0}
    assert data["open_by_owner"]["issue-3 router/registry"][0]["id"] == "router.b"


def test_report_runs_on_the_real_manifest(capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main([]) == 0
    assert "MUST: " in capsys.readouterr().out
