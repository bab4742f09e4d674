"""The portable resolver: one openat(2) per component, never following a symlink.

Each directory on the path is opened relative to the fd of the one before it with
O_PATH|O_NOFOLLOW and must fstat as a directory, starting at the root's fd; the last
component is opened with O_NOFOLLOW. No string path is ever handed to the kernel whole,
".." never reaches it (the path checks refuse it first), and a symlink anywhere fails the
open instead of being followed, so swapping a directory for a symlink between two calls
gains nothing: the walk holds fds, not names. This is RFC 16's "directory file descriptor
relative opens with O_NOFOLLOW", used where openat2 is missing.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from typing import Final

from apiary.confined.paths import DenialReason, RefusalError

_COMPONENT_FLAGS: Final = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class WalkResolver:
    """Resolves component by component with fd-relative, non-following opens."""

    name: Final = "walk"

    def open_dir(self, dirfd: int, parts: Sequence[str]) -> int:
        """An O_PATH fd of the directory `parts` names beneath `dirfd` (`()`: `dirfd` itself)."""
        fd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dirfd)
        try:
            for part in parts:
                next_fd = _open_dir_component(fd, part)
                os.close(fd)
                fd = next_fd
        except BaseException:
            os.close(fd)
            raise
        return fd

    def open_entry(self, dirfd: int, name: str, flags: int, mode: int = 0) -> int:
        """Open the single component `name` of `dirfd` without following a symlink.

        With O_PATH a symlink is opened as itself (the caller's fstat sees S_IFLNK);
        otherwise a symlink raises `RefusalError`.
        """
        try:
            return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dirfd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise RefusalError(DenialReason.SYMLINK) from None
            raise


def _open_dir_component(dirfd: int, name: str) -> int:
    # O_PATH|O_NOFOLLOW opens a symlink as itself, so the fstat below classifies exactly the
    # object the walk would continue from. (With O_DIRECTORY a symlink fails as ENOTDIR like
    # a file does, and telling them apart afterwards would look at the name again, which may
    # by then be something else.)
    fd = os.open(name, _COMPONENT_FLAGS, dir_fd=dirfd)
    try:
        mode = os.fstat(fd).st_mode
    except BaseException:
        os.close(fd)
        raise
    if stat.S_ISDIR(mode):
        return fd
    os.close(fd)
    if stat.S_ISLNK(mode):
        raise RefusalError(DenialReason.SYMLINK)
    raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), name)
