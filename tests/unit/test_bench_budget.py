"""The benchmarks' own arithmetic and command lines: the CPU budget `bench/route.py` prints
and `bench/store_rows.py` run small (figures are never asserted: tests assert no timings)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import route  # noqa: E402


def _run(msgs_per_s: int, producer: float, consumer: float, server: float) -> dict[str, Any]:
    return {
        "msgs_per_s": msgs_per_s,
        "cpu_us": {"producer": producer, "consumer": consumer, "server": server},
    }


def test_the_budget_leaves_the_coordinator_what_the_cores_give_less_the_clients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(route.os, "cpu_count", lambda: 2)
    text = route._budget("stream", _run(40_000, 17.5, 13.5, 19.0), _run(8_000, 22.0, 18.0, 144.0))
    lines = text.splitlines()
    assert lines[0] == "stream: CPU per message (us) on 2 cores:"
    assert "bare   producer 17.5, consumer 13.5, server 19" in lines[1]
    assert "apiary producer 22, consumer 18, server 144" in lines[2]
    # Two cores at 25,000 msgs/s: 80 us per message; the clients' smaller share (31, from
    # the bare run) leaves 49.
    assert (
        "at 25,000 msgs/s (25000): 80 us per message in all, the clients' 31 leave 49" in (lines[3])
    )
    assert lines[3].endswith("which spent 144")
    # Half the ceiling's 40,000: 20,000 msgs/s, 100 us per message, 69 left.
    assert "at 0.5x this run's ceiling (20000): 100 us per message in all" in lines[4]
    assert "the clients' 31 leave 69" in lines[4]


def test_the_unary_budget_has_no_absolute_target(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(route.os, "cpu_count", lambda: 2)
    text = route._budget("unary", _run(1_500, 300, 250, 560), _run(1_400, 220, 55, 800))
    assert "25,000" not in text
    assert "at 0.5x this run's ceiling (750)" in text


def test_process_cpu_reads_a_live_process() -> None:
    # Our own process has run this far: some CPU, and never less on a second read.
    first = route._process_cpu(os.getpid())
    assert first > 0
    assert route._process_cpu(os.getpid()) >= first


def test_store_rows_prints_each_row_pattern() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH / "store_rows.py"), "--messages", "400", "--frame", "100",
         "--rounds", "1"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    lines = out.stdout.splitlines()
    assert lines[0] == "400 messages, 100 per transaction, median of 1 runs each"
    names = [line[:22].strip() for line in lines[2:]]
    assert names == ["routed (4 rows)", "routed, ordered ids", "one row", "one row per frame"]
    floor = lines[4].split()
    assert floor[-1] == "1.00"  # one row is the baseline of the ratios


def test_store_rows_refuses_an_empty_run() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH / "store_rows.py"), "--messages", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2
    assert "--messages, --frame and --rounds must be at least 1" in out.stderr
