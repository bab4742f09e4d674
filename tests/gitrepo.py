"""Real git repositories for worktree tests: made in a test's tmp_path, never mocked."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "Apiary Tests",
    "GIT_AUTHOR_EMAIL": "tests@apiary.invalid",
    "GIT_COMMITTER_NAME": "Apiary Tests",
    "GIT_COMMITTER_EMAIL": "tests@apiary.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
    "LC_ALL": "C",
}
README = "# api\n\nThe repository the agents bind worktrees of.\n"


def git(repo: Path, *args: str) -> str:
    """Run git in `repo`; its stdout (stripped). Raises on failure, with git's message."""
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env=_ENV, check=False,
        timeout=60,
    )  # fmt: skip
    if done.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def make_repo(path: Path) -> Path:
    """A repository at `path` on branch main with two commits: README.md and src/app.py
    first, then a CHANGELOG.md."""
    path.mkdir(parents=True)
    git(path, "init", "--quiet", "-b", "main")
    (path / "README.md").write_text(README)
    (path / "src").mkdir()
    (path / "src" / "app.py").write_text("print('hello')\n")
    git(path, "add", "-A")
    git(path, "commit", "--quiet", "-m", "first")
    (path / "CHANGELOG.md").write_text("## 0.1\n")
    git(path, "add", "-A")
    git(path, "commit", "--quiet", "-m", "second")
    return path
