"""The report a coordinator prints when it is slow to stop (server/stall_report.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from apiary.server import stall_report


async def _parked() -> None:
    await asyncio.Event().wait()


async def test_a_stop_slower_than_its_bound_prints_the_threads_and_tasks_once(
    tmp_path: Path,
) -> None:
    parked = asyncio.create_task(_parked(), name="parked-for-the-report")
    with (tmp_path / "stderr").open("w") as out:
        timer = stall_report.report_if_stopping_slowly(0.2, out)
        await asyncio.sleep(0.8)
        stall_report.stopped()
        timer.cancel()
    parked.cancel()
    report = (tmp_path / "stderr").read_text()
    assert report.count("still stopping after 0.2 s") == 1
    assert "Current thread" in report or "Thread 0x" in report  # faulthandler's own thread
    assert "parked-for-the-report" in report and "_parked" in report  # the loop's tasks


async def test_a_stop_within_its_bound_prints_nothing(tmp_path: Path) -> None:
    with (tmp_path / "stderr").open("w") as out:
        timer = stall_report.report_if_stopping_slowly(0.3, out)
        await asyncio.sleep(0.05)
        stall_report.stopped()
        timer.cancel()
        await asyncio.sleep(0.5)
    assert (tmp_path / "stderr").read_text() == ""
