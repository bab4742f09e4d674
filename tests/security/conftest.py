"""A worktree beside an outside directory, and a `ConfinedRoot` over it per resolver.

Every test that takes `tree` runs once with the openat2 resolver and once with the
component walk, so each hostile case is shown against both.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest

from apiary.confined import ConfinedRoot, DenialReason, ResolverName, openat2_available
from apiary.errors import PermissionDeniedError

INSIDE = "inside content\n"
OUTSIDE = "OUTSIDE SECRET\n"


@dataclass
class Tree:
    """base/root (the worktree, opened as `confined`) and base/outside (must stay untouched).

    root: inside.txt, dir/nested.txt. outside: secret.txt, sub/deep.txt.
    """

    base: Path
    root: Path
    outside: Path
    confined: ConfinedRoot
    denied: list[tuple[str, str]] = field(default_factory=list)

    def refused(self, call: Callable[[], object], path: str, reason: str) -> PermissionDeniedError:
        """Run `call`, expect permission_denied for `path` with `reason`, reported to the hook."""
        before = len(self.denied)
        with pytest.raises(PermissionDeniedError) as caught:
            call()
        error = caught.value
        assert error.code == "permission_denied"
        assert error.details["reason"] == reason, error
        assert error.details["path"] == path
        assert self.denied[before:] == [(path, reason)]
        return error


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest) -> ResolverName:
    name = cast(ResolverName, request.param)
    if name == "openat2" and not openat2_available():
        pytest.skip("this kernel has no usable openat2")
    return name


@pytest.fixture
def tree(tmp_path: Path, resolver: ResolverName) -> Iterator[Tree]:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "dir").mkdir(parents=True)
    (root / "inside.txt").write_text(INSIDE)
    (root / "dir" / "nested.txt").write_text(INSIDE)
    (outside / "sub").mkdir(parents=True)
    (outside / "secret.txt").write_text(OUTSIDE)
    (outside / "sub" / "deep.txt").write_text(OUTSIDE)
    denied: list[tuple[str, str]] = []

    def on_denied(path: str, reason: DenialReason) -> None:
        denied.append((path, str(reason)))

    with ConfinedRoot(root, on_denied=on_denied, resolver=resolver) as confined:
        assert confined.resolver == resolver
        yield Tree(tmp_path, root, outside, confined, denied)


def snapshot(top: Path) -> dict[str, tuple[int, int, int, bytes | None]]:
    """Every entry under `top` (itself included): mode, size, mtime and regular content."""
    entries: dict[str, tuple[int, int, int, bytes | None]] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in [".", *dirnames, *filenames]:
            path = Path(dirpath, name)
            st = path.lstat()
            content = path.read_bytes() if path.is_file() and not path.is_symlink() else None
            entries[str(path.relative_to(top))] = (st.st_mode, st.st_size, st.st_mtime_ns, content)
    return entries
