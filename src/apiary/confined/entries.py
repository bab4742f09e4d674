"""What may be opened beneath a root, how open() modes map to flags, and atomic replacement.

Helpers of `ConfinedRoot` that work on fds a resolver already produced; nothing here takes
a path with more than one component.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from dataclasses import dataclass
from typing import Final

from apiary.confined.paths import DenialReason, RefusalError
from apiary.confined.resolver import Resolver

TEMP_PREFIX: Final = ".apiary-tmp-"
"""Atomic writes stage their data in a hidden file with this prefix beside the target."""


def refuse_special(st: os.stat_result) -> None:
    """Refuse anything but a regular file or a directory: links, devices, FIFOs, sockets."""
    mode = st.st_mode
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    if stat.S_ISLNK(mode):
        raise RefusalError(DenialReason.SYMLINK)
    if stat.S_ISFIFO(mode):
        raise RefusalError(DenialReason.FIFO)
    if stat.S_ISSOCK(mode):
        raise RefusalError(DenialReason.SOCKET)
    # Character and block devices, and any file type a future kernel may add.
    raise RefusalError(DenialReason.DEVICE_NODE)


def check_file(st: os.stat_result, *, writes: bool, name: str) -> None:
    """Refuse what `open` must not use: specials, directories, in-place writes to hard links.

    A regular file with several names may have one outside the root (a hard link made by
    someone who could see both); writing to it in place would change that file too. Reading
    stays allowed (package managers such as pnpm hard-link whole trees), and the atomic
    `write_bytes` replaces the name instead of writing to the inode, so it is allowed too.
    """
    refuse_special(st)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), name)
    if writes and st.st_nlink > 1:
        raise RefusalError(DenialReason.HARD_LINK)


@dataclass(frozen=True, slots=True)
class OpenMode:
    """An open() mode string taken apart."""

    flags: int
    writes: bool
    truncate: bool
    binary: bool


_BASE_FLAGS: Final = {
    "r": 0,
    "w": os.O_CREAT,  # O_TRUNC is applied with ftruncate only after the checks
    "a": os.O_CREAT | os.O_APPEND,
    "x": os.O_CREAT | os.O_EXCL,
}


def parse_mode(mode: str) -> OpenMode:
    """The flags of an open() mode ("r", "wb", "a+", "x", "r+b", ...); ValueError if invalid."""
    chars = set(mode)
    kinds = chars & set(_BASE_FLAGS)
    if len(chars) != len(mode) or not chars <= set("rwaxbt+") or len(kinds) != 1:
        raise ValueError(f"invalid mode: {mode!r}")
    if {"b", "t"} <= chars:
        raise ValueError(f"invalid mode: {mode!r}")
    (kind,) = kinds
    plus = "+" in chars
    access = os.O_RDWR if plus else (os.O_RDONLY if kind == "r" else os.O_WRONLY)
    return OpenMode(
        flags=access | _BASE_FLAGS[kind],
        writes=plus or kind != "r",
        truncate=kind == "w",
        binary="b" in chars,
    )


def open_checked(resolver: Resolver, parent: int, name: str, mode: OpenMode) -> int:
    """Open `name` of the directory fd `parent` for `mode`, refusing what `check_file` does.

    The entry is first looked at through an O_PATH fd, which neither runs a device's open
    routine nor blocks on a FIFO, so a special file is refused without ever being opened.
    The real open adds O_NONBLOCK (a FIFO swapped in meanwhile cannot block it) and its
    result is checked again: that second fstat is the one that counts.
    """
    try:
        probe = resolver.open_entry(parent, name, os.O_PATH)
    except FileNotFoundError:
        if not mode.flags & os.O_CREAT:
            raise
    else:
        try:
            check_file(os.fstat(probe), writes=mode.writes, name=name)
        finally:
            os.close(probe)
    flags = mode.flags | os.O_NONBLOCK | os.O_NOCTTY
    fd = resolver.open_entry(parent, name, flags, 0o666)
    try:
        check_file(os.fstat(fd), writes=mode.writes, name=name)
        os.set_blocking(fd, True)
        if mode.truncate:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def replace_atomically(resolver: Resolver, parent: int, name: str, data: bytes) -> None:
    """Make `name` in `parent` hold exactly `data`, all at once.

    The data goes to a new temporary file in the same directory (created with O_EXCL, so
    never through a planted link), is flushed to disk, and renameat() puts it in place:
    readers see the old content or the new, never a part. An existing file keeps its
    permission bits. The temporary file is removed if anything fails.
    """
    keep_mode: int | None = None
    try:
        probe = resolver.open_entry(parent, name, os.O_PATH)
    except FileNotFoundError:
        pass
    else:
        try:
            st = os.fstat(probe)
        finally:
            os.close(probe)
        refuse_special(st)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), name)
        keep_mode = stat.S_IMODE(st.st_mode)
    temp = f"{TEMP_PREFIX}{secrets.token_hex(8)}"
    fd = resolver.open_entry(parent, temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        try:
            if keep_mode is not None:
                os.fchmod(fd, keep_mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=parent)
        raise
