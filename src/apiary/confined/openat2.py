"""openat2(2) through ctypes, and the resolver that lets the kernel confine every lookup.

With RESOLVE_BENEATH the kernel refuses any resolution that would leave the directory fd
(EXDEV), with RESOLVE_NO_SYMLINKS any symbolic link on the way, the last component included
(ELOOP), and with RESOLVE_NO_MAGICLINKS the /proc-style links. The check happens inside the
one system call that opens the file, so there is no window between check and use.

The system call exists since Linux 5.6; older kernels answer ENOSYS and some container
seccomp profiles EPERM. `available()` probes once per process; `ConfinedRoot` falls back to
the component walk (walk.py) when it answers False.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import platform
import sys
from collections.abc import Callable, Sequence
from typing import Final

from apiary.confined.paths import DenialReason, RefusalError

_log = logging.getLogger("apiary.confined")

# openat2 has the same number on every architecture that uses the generic syscall table.
_SYSCALL_NUMBERS: Final = {"x86_64": 437, "aarch64": 437, "arm64": 437}

RESOLVE_NO_XDEV: Final = 0x01
RESOLVE_NO_MAGICLINKS: Final = 0x02
RESOLVE_NO_SYMLINKS: Final = 0x04
RESOLVE_BENEATH: Final = 0x08
CONFINED: Final = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
"""The resolve flags every confined open uses."""

_RETRIES: Final = 8
"""EAGAIN (a rename race the kernel could not rule out) and EINTR are retried this often."""


class _OpenHow(ctypes.Structure):
    """`struct open_how` of linux/openat2.h."""

    _fields_ = (
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    )


@functools.cache
def _syscall() -> tuple[Callable[..., int], int] | None:
    number = _SYSCALL_NUMBERS.get(platform.machine())
    if not sys.platform.startswith("linux") or number is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.syscall
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_long
    return function, number


def openat2(dirfd: int, path: str, flags: int, mode: int = 0, resolve: int = CONFINED) -> int:
    """Open `path` relative to `dirfd` with openat2(2); return the new fd or raise OSError.

    `mode` is passed only with O_CREAT (the kernel rejects a mode otherwise).
    """
    call = _syscall()
    if call is None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS), path)
    function, number = call
    how = _OpenHow(flags, mode if flags & os.O_CREAT else 0, resolve)
    encoded = os.fsencode(path)
    for _ in range(_RETRIES):
        result = int(
            function(
                ctypes.c_long(number),
                ctypes.c_int(dirfd),
                ctypes.c_char_p(encoded),
                ctypes.byref(how),
                ctypes.c_size_t(ctypes.sizeof(how)),
            )
        )
        if result >= 0:
            return result
        code = ctypes.get_errno()
        if code not in (errno.EAGAIN, errno.EINTR):
            break
    raise OSError(code, os.strerror(code), path)


@functools.cache
def available() -> bool:
    """Whether openat2 with the confinement flags works in this process (probed once)."""
    if _syscall() is None:
        _log.info("openat2 is not available on %s/%s", sys.platform, platform.machine())
        return False
    probe_root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.close(openat2(probe_root, ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
    except OSError as exc:
        # ENOSYS: kernel before 5.6; EPERM: a seccomp filter; E2BIG/EINVAL: unknown flags.
        _log.info("openat2 is not usable (%s)", errno.errorcode.get(exc.errno or 0, exc))
        return False
    finally:
        os.close(probe_root)
    return True


class Openat2Resolver:
    """Every open is one openat2 call confined beneath the given directory fd."""

    name: Final = "openat2"

    def open_dir(self, dirfd: int, parts: Sequence[str]) -> int:
        """An O_PATH fd of the directory `parts` names beneath `dirfd` (`()`: `dirfd` itself)."""
        return self._open(dirfd, "/".join(parts) or ".", os.O_PATH | os.O_DIRECTORY)

    def open_entry(self, dirfd: int, name: str, flags: int, mode: int = 0) -> int:
        """Open the single component `name` of `dirfd` without following a symlink.

        With O_PATH a symlink is opened as itself (the caller's fstat sees S_IFLNK);
        otherwise a symlink raises `RefusalError`.
        """
        return self._open(dirfd, name, flags | os.O_NOFOLLOW, mode)

    @staticmethod
    def _open(dirfd: int, path: str, flags: int, mode: int = 0) -> int:
        try:
            return openat2(dirfd, path, flags | os.O_CLOEXEC, mode)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise RefusalError(DenialReason.SYMLINK) from None
            if exc.errno == errno.EXDEV:
                raise RefusalError(DenialReason.PATH_TRAVERSAL) from None
            raise
