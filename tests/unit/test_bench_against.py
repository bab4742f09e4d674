"""`bench/against.py`'s reading of a benchmark's output: which figures it compares and how
(figures themselves are never asserted: tests assert no timings)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import against  # noqa: E402


def test_leaves_name_every_number_by_its_path_and_key_sized_lists_by_size() -> None:
    doc = {
        "apiary": {"stream": {"msgs_per_s": 900, "p50_ms": 1.5, "ok": True}},
        "sizes": [{"size": 1000, "submit_per_s": 10}, {"size": 10000, "submit_per_s": 8}],
        "plain": [3, 4],
    }
    assert dict(against.leaves(doc)) == {
        "apiary.stream.msgs_per_s": 900.0,
        "apiary.stream.p50_ms": 1.5,
        "sizes[1000].size": 1000.0,
        "sizes[1000].submit_per_s": 10.0,
        "sizes[10000].size": 10000.0,
        "sizes[10000].submit_per_s": 8.0,
        "plain[0]": 3.0,
        "plain[1]": 4.0,
    }


def test_the_document_is_the_last_non_empty_line() -> None:
    assert against.last_json('table\n| a |\n{"x": 1}\n\n') == {"x": 1}
    with pytest.raises(ValueError, match="printed nothing"):
        against.last_json("\n \n")


def test_compare_takes_medians_per_tree_and_the_ratio_this_over_baseline() -> None:
    baseline = [{"a_per_s": 100.0, "size": 1.0}, {"a_per_s": 300.0, "size": 1.0},
                {"a_per_s": 200.0, "size": 1.0}]  # fmt: skip
    ours = [{"a_per_s": 150.0, "size": 1.0}, {"a_per_s": 250.0, "size": 1.0},
            {"a_per_s": 400.0, "size": 1.0}]  # fmt: skip
    assert against.compare(baseline, ours, against.DEFAULT_METRIC) == [
        ("a_per_s", 200.0, 250.0, 1.25)
    ]


def test_a_figure_missing_from_one_round_is_left_out() -> None:
    baseline = [{"x_ms": 1.0, "y_ms": 2.0}]
    ours = [{"x_ms": 2.0}]
    assert against.compare(baseline, ours, "_ms$") == [("x_ms", 1.0, 2.0, 2.0)]


def test_an_unknown_script_is_a_usage_error_naming_it() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH / "against.py"), "no_such_bench.py"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "no bench/no_such_bench.py" in proc.stderr
