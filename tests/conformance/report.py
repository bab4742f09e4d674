"""Conformance coverage report: how many MUSTs and SHOULDs of the specs have tests.

Run from the repository root:

    python -m tests.conformance.report           # table per area, overall MUST/SHOULD lines
    python -m tests.conformance.report --open    # also list open entries grouped by owner
    python -m tests.conformance.report --json    # machine-readable summary

MUST NOT entries count with the MUSTs, SHOULD NOT entries with the SHOULDs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tests.conformance.manifest import MANIFEST_PATH, Requirement, load_manifest

# The two columns of the report: each level folds into one of them.
STRENGTH = {"MUST": "MUST", "MUST NOT": "MUST", "SHOULD": "SHOULD", "SHOULD NOT": "SHOULD"}


@dataclass
class Tally:
    """Tested / total counts of one group of requirements."""

    tested: int = 0
    total: int = 0

    def add(self, requirement: Requirement) -> None:
        self.total += 1
        self.tested += requirement.status == "tested"

    @property
    def percent(self) -> float:
        return 100.0 * self.tested / self.total if self.total else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"tested": self.tested, "total": self.total, "percent": round(self.percent, 1)}


@dataclass
class Coverage:
    """Coverage of the manifest per area and strength, plus the open entries by owner."""

    areas: dict[str, dict[str, Tally]] = field(default_factory=dict)
    overall: dict[str, Tally] = field(default_factory=lambda: {"MUST": Tally(), "SHOULD": Tally()})
    open_by_owner: dict[str, list[Requirement]] = field(default_factory=dict)


def summarize(requirements: Iterable[Requirement]) -> Coverage:
    """Count tested/total per area (id prefix) and strength, and group open entries by owner."""
    coverage = Coverage()
    for req in requirements:
        strength = STRENGTH[req.level]
        area = coverage.areas.setdefault(req.area, {"MUST": Tally(), "SHOULD": Tally()})
        area[strength].add(req)
        coverage.overall[strength].add(req)
        if req.status == "open":
            coverage.open_by_owner.setdefault(req.owner, []).append(req)
    coverage.areas = dict(sorted(coverage.areas.items()))
    coverage.open_by_owner = dict(sorted(coverage.open_by_owner.items()))
    return coverage


def overall_line(strength: str, tally: Tally) -> str:
    """E.g. `MUST: 12/343 tested (3.5%)`."""
    return f"{strength}: {tally.tested}/{tally.total} tested ({tally.percent:.1f}%)"


def to_json(coverage: Coverage) -> dict[str, Any]:
    """The coverage as plain JSON-ready data."""
    return {
        "overall": {k: t.as_dict() for k, t in coverage.overall.items()},
        "areas": {
            area: {k: t.as_dict() for k, t in tallies.items()}
            for area, tallies in coverage.areas.items()
        },
        "open_by_owner": {
            owner: [{"id": r.id, "level": r.level, "source": r.source} for r in reqs]
            for owner, reqs in coverage.open_by_owner.items()
        },
    }


def _cell(tally: Tally) -> str:
    if not tally.total:
        return "-"
    return f"{tally.tested}/{tally.total}"


def render(coverage: Coverage, console: Console, *, show_open: bool) -> None:
    """Print the coverage table, the overall lines and, if asked, the open entries."""
    table = Table(title="SW4RM conformance coverage")
    table.add_column("area")
    table.add_column("MUST tested/total", justify="right")
    table.add_column("SHOULD tested/total", justify="right")
    for area, tallies in coverage.areas.items():
        table.add_row(area, _cell(tallies["MUST"]), _cell(tallies["SHOULD"]))
    console.print(table)
    for strength, tally in coverage.overall.items():
        console.print(overall_line(strength, tally), markup=False)
    if not show_open:
        return
    for owner, reqs in coverage.open_by_owner.items():
        console.print(f"\n[bold]{escape(owner)}[/bold] ({len(reqs)} open)")
        for req in reqs:
            console.print(
                f"  {req.level:<10} {req.id}  [dim]{escape(req.source)}[/dim]",
                highlight=False,
                soft_wrap=True,
            )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m tests.conformance.report`; always returns 0."""
    parser = argparse.ArgumentParser(prog="python -m tests.conformance.report")
    parser.add_argument("--open", action="store_true", help="list open entries by owner")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument("--manifest", type=Path, default=MANIFEST_PATH, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    coverage = summarize(load_manifest(args.manifest))
    if args.json:
        sys.stdout.write(json.dumps(to_json(coverage), indent=2) + "\n")
    else:
        render(coverage, Console(), show_open=args.open)
    return 0


if __name__ == "__main__":
    sys.exit(main())
