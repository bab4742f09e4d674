"""A seccomp filter for the two rules a namespace cannot express: no new processes, no listen.

- no_spawn (MINIMAL): fork, vfork and clone without CLONE_THREAD fail with EPERM; clone3 fails
  with ENOSYS (its flags live in memory a filter cannot read), which makes glibc fall back to
  clone, so threads still work and processes still do not.
- no_listen (EGRESS_UNRESTRICTED): listen(2) fails with EPERM, so nothing can accept inbound
  TCP connections on the host's network.

Any filter also refuses io_uring_setup (io_uring can listen without the listen syscall) and kills
the process on a foreign syscall ABI (i386 or x32 calls from an x86_64 process), which could
otherwise bypass the numbers below. Installing needs no_new_privs or CAP_SYS_ADMIN.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct
from dataclasses import dataclass
from typing import Final

from apiary.sandbox.linux import CLONE_THREAD, PR_SET_SECCOMP, prctl

_SECCOMP_MODE_FILTER: Final = 2
_RET_ALLOW: Final = 0x7FFF0000
_RET_KILL_PROCESS: Final = 0x80000000
_RET_ERRNO: Final = 0x00050000
_LD_W_ABS: Final = 0x20
_JEQ: Final = 0x15
_JGE: Final = 0x35
_JSET: Final = 0x45
_RET: Final = 0x06
_X32_BIT: Final = 0x40000000
_OFFSET_NR: Final = 0
_OFFSET_ARCH: Final = 4
_OFFSET_ARG0: Final = 16  # low 32 bits of args[0] on little-endian


@dataclass(frozen=True, slots=True)
class _Abi:
    audit_arch: int
    clone: int
    clone3: int
    listen: int
    io_uring_setup: int
    forks: tuple[int, ...]  # fork, vfork where they exist
    x32: bool


_ABIS: Final = {
    "x86_64": _Abi(0xC000003E, 56, 435, 50, 425, (57, 58), x32=True),
    "aarch64": _Abi(0xC00000B7, 220, 435, 201, 425, (), x32=False),
}


class SeccompUnavailableError(OSError):
    """No filter for this machine's architecture."""


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def _stmt(code: int, k: int) -> tuple[int, int, int, int]:
    return (code, 0, 0, k)


def _deny(number: int, err: int) -> list[tuple[int, int, int, int]]:
    # if nr == number: return ERRNO(err)
    return [(_JEQ, 0, 1, number), _stmt(_RET, _RET_ERRNO | err)]


def build_filter(*, no_spawn: bool, no_listen: bool, machine: str = "") -> bytes:
    """The BPF program as raw `struct sock_filter` bytes (exposed for inspection in tests)."""
    abi = _ABIS.get(machine or platform.machine())
    if abi is None:
        raise SeccompUnavailableError(errno.ENOSYS, f"no seccomp filter for {platform.machine()}")
    prog: list[tuple[int, int, int, int]] = [
        _stmt(_LD_W_ABS, _OFFSET_ARCH),
        (_JEQ, 1, 0, abi.audit_arch),
        _stmt(_RET, _RET_KILL_PROCESS),
        _stmt(_LD_W_ABS, _OFFSET_NR),
    ]
    if abi.x32:
        prog += [(_JGE, 0, 1, _X32_BIT), _stmt(_RET, _RET_KILL_PROCESS)]
    prog += _deny(abi.io_uring_setup, errno.EPERM)
    if no_listen:
        prog += _deny(abi.listen, errno.EPERM)
    if no_spawn:
        for number in abi.forks:
            prog += _deny(number, errno.EPERM)
        prog += _deny(abi.clone3, errno.ENOSYS)
        prog += [
            (_JEQ, 0, 3, abi.clone),
            _stmt(_LD_W_ABS, _OFFSET_ARG0),
            (_JSET, 1, 0, CLONE_THREAD),
            _stmt(_RET, _RET_ERRNO | errno.EPERM),
        ]
    prog.append(_stmt(_RET, _RET_ALLOW))
    return b"".join(struct.pack("=HBBI", *insn) for insn in prog)


def install(*, no_spawn: bool, no_listen: bool) -> None:
    """Install the filter on the calling thread (and what it executes); irrevocable."""
    raw = build_filter(no_spawn=no_spawn, no_listen=no_listen)
    count = len(raw) // ctypes.sizeof(_SockFilter)
    insns = (_SockFilter * count).from_buffer_copy(raw)
    fprog = _SockFprog(count, ctypes.cast(insns, ctypes.POINTER(_SockFilter)))
    prctl(PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(fprog))
