"""The two ways to resolve a path beneath a directory fd, and the choice between them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, TypeAlias

from apiary.confined import openat2
from apiary.confined.walk import WalkResolver
from apiary.errors import FilesystemError

ResolverName: TypeAlias = Literal["auto", "openat2", "walk"]


class Resolver(Protocol):
    """Opens paths beneath a directory fd; raises `RefusalError` or `OSError`.

    Both methods return a new fd (close-on-exec) that the caller owns.
    """

    @property
    def name(self) -> str:
        """ "openat2" or "walk"."""

    def open_dir(self, dirfd: int, parts: Sequence[str]) -> int:
        """An O_PATH fd of the directory `parts` names beneath `dirfd` (`()`: `dirfd` itself).

        A symlink anywhere on the way, the last component included, is refused.
        """

    def open_entry(self, dirfd: int, name: str, flags: int, mode: int = 0) -> int:
        """Open the single component `name` of `dirfd` with `flags`, never following it."""


def select_resolver(name: ResolverName) -> Resolver:
    """The resolver `name` asks for; "auto" is openat2 when the kernel has it, else walk."""
    if name == "walk":
        return WalkResolver()
    if name not in ("auto", "openat2"):
        raise ValueError(f"resolver must be 'auto', 'openat2' or 'walk', not {name!r}")
    if openat2.available():
        return openat2.Openat2Resolver()
    if name == "openat2":
        raise FilesystemError(
            "openat2 is not available in this process",
            {"reason": "openat2_unavailable", "errno": "ENOSYS"},
        )
    return WalkResolver()
