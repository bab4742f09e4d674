"""Thin ctypes bindings for the Linux calls Python 3.11 does not expose.

unshare, mount and the new mount API (open_tree, move_mount, mount_setattr, fsopen, fsconfig,
fsmount), prctl, capget/capset. Each wrapper raises `OSError` with the errno and the call's
name; nothing here decides policy. The new-mount-API syscall numbers (424 and up) are the same
on every architecture.
"""

from __future__ import annotations

import ctypes
import os
from typing import Final

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

CLONE_NEWNS: Final = 0x00020000
CLONE_NEWUSER: Final = 0x10000000
CLONE_NEWPID: Final = 0x20000000
CLONE_NEWNET: Final = 0x40000000
CLONE_THREAD: Final = 0x00010000

MS_NOSUID: Final = 0x2
MS_NODEV: Final = 0x4
MS_NOEXEC: Final = 0x8
MS_REC: Final = 0x4000
MS_PRIVATE: Final = 1 << 18

AT_FDCWD: Final = -100
AT_EMPTY_PATH: Final = 0x1000
AT_RECURSIVE: Final = 0x8000
OPEN_TREE_CLONE: Final = 1
MOVE_MOUNT_F_EMPTY_PATH: Final = 0x4

MOUNT_ATTR_RDONLY: Final = 0x1
MOUNT_ATTR_NOSUID: Final = 0x2
MOUNT_ATTR_NODEV: Final = 0x4
MOUNT_ATTR_NOEXEC: Final = 0x8
MOUNT_ATTR_IDMAP: Final = 0x00100000

FSCONFIG_SET_STRING: Final = 1
FSCONFIG_CMD_CREATE: Final = 6

PR_SET_PDEATHSIG: Final = 1
PR_SET_DUMPABLE: Final = 4
PR_SET_SECCOMP: Final = 22
PR_CAPBSET_DROP: Final = 24
PR_SET_CHILD_SUBREAPER: Final = 36
PR_SET_NO_NEW_PRIVS: Final = 38
PR_CAP_AMBIENT: Final = 47
PR_CAP_AMBIENT_CLEAR_ALL: Final = 4

_SYS_OPEN_TREE: Final = 428
_SYS_MOVE_MOUNT: Final = 429
_SYS_FSOPEN: Final = 430
_SYS_FSCONFIG: Final = 431
_SYS_FSMOUNT: Final = 432
_SYS_MOUNT_SETATTR: Final = 442


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(result: int, call: str) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{call}: {os.strerror(errno)}")
    return result


def _path(path: str) -> bytes:
    return os.fsencode(path)


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        _libc.mount(
            _path(source) if source else None,
            _path(target),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def open_tree(path: str, *, recursive: bool = False, dir_fd: int = AT_FDCWD) -> int:
    """A detached copy of the mount at `path` (OPEN_TREE_CLONE), as a close-on-exec fd."""
    flags = OPEN_TREE_CLONE | os.O_CLOEXEC | (AT_RECURSIVE if recursive else 0)
    if not path:
        flags |= AT_EMPTY_PATH
    return _check(
        _libc.syscall(_SYS_OPEN_TREE, ctypes.c_int(dir_fd), _path(path), ctypes.c_uint(flags)),
        f"open_tree {path}",
    )


def move_mount(tree_fd: int, target: str) -> None:
    """Attach the detached tree `tree_fd` at `target`."""
    _check(
        _libc.syscall(
            _SYS_MOVE_MOUNT,
            ctypes.c_int(tree_fd),
            b"",
            ctypes.c_int(AT_FDCWD),
            _path(target),
            ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH),
        ),
        f"move_mount {target}",
    )


def mount_setattr(
    target: str | int,
    *,
    set_: int = 0,
    clear: int = 0,
    recursive: bool = False,
    userns_fd: int = 0,
) -> None:
    """Change mount attributes of a path, or of a detached tree given as an fd."""
    attr = _MountAttr(set_, clear, 0, userns_fd)
    flags = AT_RECURSIVE if recursive else 0
    if isinstance(target, int):
        dir_fd, path, flags = target, b"", flags | AT_EMPTY_PATH
    else:
        dir_fd, path = AT_FDCWD, _path(target)
    _check(
        _libc.syscall(
            _SYS_MOUNT_SETATTR,
            ctypes.c_int(dir_fd),
            path,
            ctypes.c_uint(flags),
            ctypes.byref(attr),
            ctypes.c_size_t(ctypes.sizeof(attr)),
        ),
        f"mount_setattr {target}",
    )


def detached_tmpfs(options: dict[str, str]) -> int:
    """A new tmpfs that is not attached anywhere yet, as a close-on-exec mount fd."""
    fs_fd = _check(_libc.syscall(_SYS_FSOPEN, b"tmpfs", ctypes.c_uint(1)), "fsopen tmpfs")
    try:
        for key, value in options.items():
            _check(
                _libc.syscall(
                    _SYS_FSCONFIG,
                    ctypes.c_int(fs_fd),
                    ctypes.c_uint(FSCONFIG_SET_STRING),
                    key.encode(),
                    value.encode(),
                    ctypes.c_int(0),
                ),
                f"fsconfig {key}",
            )
        _check(
            _libc.syscall(
                _SYS_FSCONFIG,
                ctypes.c_int(fs_fd),
                ctypes.c_uint(FSCONFIG_CMD_CREATE),
                None,
                None,
                ctypes.c_int(0),
            ),
            "fsconfig create",
        )
        return _check(
            _libc.syscall(_SYS_FSMOUNT, ctypes.c_int(fs_fd), ctypes.c_uint(1), ctypes.c_uint(0)),
            "fsmount",
        )
    finally:
        os.close(fs_fd)


def prctl(option: int, arg2: int = 0, arg3: int = 0) -> None:
    """prctl(2); pass a pointer argument as an address (`ctypes.addressof`)."""
    _check(
        _libc.prctl(
            ctypes.c_int(option),
            ctypes.c_ulong(arg2),
            ctypes.c_ulong(arg3),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
        ),
        f"prctl {option}",
    )


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


_LINUX_CAPABILITY_VERSION_3: Final = 0x20080522


def clear_inheritable_capabilities() -> None:
    """Empty the inheritable set, keeping the effective and permitted sets."""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capget(ctypes.byref(header), data), "capget")
    for word in data:
        word.inheritable = 0
    _check(_libc.capset(ctypes.byref(header), data), "capset")


CAP_SYS_ADMIN: Final = 21


def has_capability(cap: int) -> bool:
    """Whether `cap` is in this process's effective set (in its own user namespace)."""
    with open("/proc/self/status") as file:
        for line in file:
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> cap & 1)
    return False


def last_capability() -> int:
    with open("/proc/sys/kernel/cap_last_cap") as file:
        return int(file.read())
