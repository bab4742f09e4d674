"""The repository the demo's agents work on: made for each run, with a failing test.

`shop` is a tiny order-pricing library whose `apply_discount(price, percent)` subtracts the
percentage as if it were an amount, so two of its three tests fail. After the run, `check`
looks at the repository itself: the approved commit is on main, and the test suite and
ruff pass there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ID = "shop"
SYMBOL = "apply_discount"
TEST_FILE = "tests/test_pricing.py"
ISSUE = (
    "apply_discount(80.0, 10) returns 70.0: it subtracts the percentage as an amount. "
    "A discount is a percentage: it should return 72.0."
)
FILES = {
    "README.md": "# shop\n\nOrder pricing. Made by `apiary demo` for its agents to fix.\n",
    "CHANGELOG.md": "# Changelog\n\n## Unreleased\n",
    "pyproject.toml": """\
[project]
name = "shop"
version = "0.1.0"
requires-python = ">=3.11"

[tool.ruff]
line-length = 100

[tool.ruff.lint]
select = ["E", "F", "I", "B", "UP"]

[tool.pytest.ini_options]
pythonpath = ["."]
testpaths = ["tests"]
""",
    "shop/__init__.py": '"""Order pricing."""\n',
    "shop/pricing.py": '''\
"""Prices of the shop's orders."""

from __future__ import annotations


def apply_discount(price: float, percent: float) -> float:
    """The price after a discount of `percent` per cent."""
    return price - percent


def total(prices: list[float], percent: float = 0) -> float:
    """What an order costs after the discount, rounded to cents."""
    return round(sum(apply_discount(p, percent) for p in prices), 2)
''',
    "tests/__init__.py": "",
    TEST_FILE: """\
from shop.pricing import apply_discount, total


def test_no_discount_keeps_the_price() -> None:
    assert apply_discount(80.0, 0) == 80.0


def test_a_ten_percent_discount() -> None:
    assert apply_discount(80.0, 10) == 72.0


def test_the_total_of_an_order_with_a_discount() -> None:
    assert total([10.0, 20.0], 25) == 22.5
""",
}
GIT_ENV = {
    "GIT_AUTHOR_NAME": "apiary demo",
    "GIT_AUTHOR_EMAIL": "demo@apiary.invalid",
    "GIT_COMMITTER_NAME": "apiary demo",
    "GIT_COMMITTER_EMAIL": "demo@apiary.invalid",
}
TOOL_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
"""The test runs' environment: nothing written into the tree, only pytest's own plugins."""
PYTEST_ARGS = ("-m", "pytest", "-q", "-p", "no:cacheprovider", "--color=no")
RUFF_ARGS = ("-m", "ruff", "check", "--no-cache", "--exit-zero", "--output-format", "json", ".")


def git(repo: Path, *args: str) -> str:
    """git's output; RuntimeError with its message when it fails."""
    done = subprocess.run(
        ["git", "-C", str(repo), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={**os.environ, **GIT_ENV},
    )
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def create(path: Path) -> str:
    """The repository at `path`, on branch main with one commit; returns its sha."""
    path.mkdir(parents=True)
    git(path, "init", "--quiet", "-b", "main")
    for name, text in FILES.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "--quiet", "-m", "shop: order pricing (with a bug)")
    return git(path, "rev-parse", "HEAD")


@dataclass(frozen=True, slots=True)
class RepoState:
    """What the repository says at the end of the run."""

    head: str
    merged: bool
    """The approved commit is on main."""
    tests_ok: bool
    tests: str
    """pytest's summary line on main."""
    lint_ok: bool
    lint: str
    clean: bool
    """No uncommitted change in the main checkout."""
    log: tuple[str, ...]
    """main's history, one line per commit, newest first."""

    @property
    def ok(self) -> bool:
        return self.merged and self.tests_ok and self.lint_ok and self.clean


def _run(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, **TOOL_ENV},
    )


def check(path: Path, commit: str) -> RepoState:
    """Run the tests and ruff on main, and see whether `commit` was merged into it."""
    head = git(path, "rev-parse", "HEAD")
    merged = bool(commit) and (
        subprocess.run(
            ["git", "-C", str(path), "merge-base", "--is-ancestor", commit, "main"],
            capture_output=True,
            check=False,
            timeout=60,
        ).returncode
        == 0
    )
    tests = _run(path, *PYTEST_ARGS)
    lint = _run(path, *RUFF_ARGS)
    summary = (tests.stdout.strip().splitlines() or [tests.stderr.strip()[-200:]])[-1]
    findings = lint.stdout.strip()
    return RepoState(
        head=head,
        merged=merged,
        tests_ok=tests.returncode == 0,
        tests=summary,
        lint_ok=lint.returncode == 0 and findings in ("", "[]"),
        lint=findings[:2000] if findings not in ("", "[]") else "no findings",
        clean=git(path, "status", "--porcelain") == "",
        log=tuple(git(path, "log", "--format=%h %an: %s", "main").splitlines()),
    )
