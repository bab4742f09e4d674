"""The filesystem a confined tool sees, built in its own mount namespace.

For MINIMAL and DEFAULT (`confine`):

1. every mount is made read-only (recursively, with mount_setattr);
2. /tmp is a fresh private tmpfs (nosuid,nodev,noexec), gone when the namespace is;
3. /proc is a fresh proc for the tool's own PID namespace;
4. the working directory (the worktree for DEFAULT) is re-attached writable with
   nosuid,nodev,noexec, and idmapped so that the unprivileged uid owns what the coordinator owns;
   with no working directory the tool works in an empty directory of its private /tmp;
5. directories the unprivileged uid cannot traverse (e.g. /root, when the Python interpreter lives
   under it) are covered by an empty read-only tmpfs in which only the directories the tool
   needs (its interpreter's, its program's environment: program.py) are re-attached, read-only:
   the tool can run Python without reading the rest.

For EGRESS_RESTRICTED, /etc/hosts is replaced by a file naming the allowlisted hosts (the tool
resolves them to addresses its relay listens on). Every step happens before exec, as root in
the new namespace; the host's mount table is never touched (propagation is made private first).
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from typing import Final

from apiary.sandbox import linux
from apiary.sandbox.plan import NOBODY

TMP_SIZE: Final = "64m"
PRIVATE_WORKDIR: Final = "/tmp/.apiary-work"
"""A tool without a working directory works here, in the private /tmp."""
_ATTR_PROTECT: Final = linux.MOUNT_ATTR_NOSUID | linux.MOUNT_ATTR_NODEV  # mount_setattr(2)
_ATTR_WRITABLE: Final = _ATTR_PROTECT | linux.MOUNT_ATTR_NOEXEC
_MS_PROTECT: Final = linux.MS_NOSUID | linux.MS_NODEV  # the same, for mount(2)


@dataclass
class MountSetup:
    """What to build; `apply` returns the tool's working directory."""

    confine: bool
    cwd: str | None
    for_nobody: bool = False
    """The tool will run as NOBODY: cover what it cannot traverse, idmap its working directory."""
    idmap_userns_fd: int | None = None
    """A user namespace mapping the working directory's owner to NOBODY (None: no idmap)."""
    expose: list[str] = field(default_factory=list)
    hosts: str | None = None
    new_proc: bool = False

    def apply(self) -> str | None:
        linux.unshare(linux.CLONE_NEWNS)
        linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)
        # Take every detached copy (and look at every path) before anything is hidden or made
        # read-only: attachments go on in this order, exposed directories first.
        attachments = [(path, _clone_readonly(path)) for path in self.expose]
        if self.confine and self.cwd is not None:
            attachments.append((self.cwd, self._clone_writable()))
        covers = {
            ancestor
            for path, _ in attachments
            if self.for_nobody and (ancestor := blocking_ancestor(path)) is not None
        }
        hosts = _hosts_tree(self.hosts) if self.hosts is not None else None
        workdir = self.cwd
        if self.confine:
            _confine(attachments, covers, new_proc=self.new_proc)
            workdir = self.cwd or _private_workdir()
        if hosts is not None:
            _attach(hosts, "/etc/hosts")
        return workdir

    def _clone_writable(self) -> int:
        assert self.cwd is not None
        tree = linux.open_tree(self.cwd)
        if self.idmap_userns_fd is None:
            linux.mount_setattr(tree, set_=_ATTR_WRITABLE)
        else:
            linux.mount_setattr(
                tree, set_=_ATTR_WRITABLE | linux.MOUNT_ATTR_IDMAP, userns_fd=self.idmap_userns_fd
            )
        return tree


def _confine(attachments: list[tuple[str, int]], covers: set[str], *, new_proc: bool) -> None:
    """Everything read-only, then the private mounts on top (they keep their own flags)."""
    linux.mount_setattr("/", set_=linux.MOUNT_ATTR_RDONLY, recursive=True)
    linux.mount(
        "tmpfs", "/tmp", "tmpfs", _MS_PROTECT | linux.MS_NOEXEC, f"mode=1777,size={TMP_SIZE}"
    )
    if new_proc:
        linux.mount("proc", "/proc", "proc", _MS_PROTECT | linux.MS_NOEXEC)
    for ancestor in sorted(covers):
        os.makedirs(ancestor, exist_ok=True)
        linux.mount("tmpfs", ancestor, "tmpfs", _MS_PROTECT, "mode=0755,size=1m")
    for path, tree in attachments:
        os.makedirs(path, mode=0o755, exist_ok=True)
        _attach(tree, path)
    for ancestor in covers:
        linux.mount_setattr(ancestor, set_=linux.MOUNT_ATTR_RDONLY)


def _private_workdir() -> str:
    """An empty directory in the private /tmp (which may also hold exposed directories)."""
    os.mkdir(PRIVATE_WORKDIR)
    os.chmod(PRIVATE_WORKDIR, 0o1777)
    return PRIVATE_WORKDIR


def under_private_tmp(paths: list[str]) -> list[str]:
    """The directories among `paths` that the sandbox's private /tmp would hide."""
    out = []
    for path in dict.fromkeys(os.path.realpath(p) for p in paths):
        if os.path.isdir(path) and (path == "/tmp" or path.startswith("/tmp/")):
            out.append(path)
    return out


def outermost(paths: list[str]) -> list[str]:
    """`paths` without those inside another (a recursive copy of it shows them already)."""
    unique = list(dict.fromkeys(paths))
    return [p for p in unique if not any(p.startswith(q.rstrip("/") + "/") for q in unique)]


def blocked_paths(paths: list[str]) -> list[str]:
    """The paths NOBODY needs but cannot reach: some ancestor denies it search permission."""
    out = []
    for path in dict.fromkeys(os.path.realpath(p) for p in paths):
        if os.path.isdir(path) and blocking_ancestor(path) is not None:
            out.append(path)
    return out


def blocking_ancestor(path: str) -> str | None:
    """The topmost strict ancestor of `path` that NOBODY may not traverse, if any."""
    parts = path.strip("/").split("/")
    for depth in range(1, len(parts)):
        ancestor = "/" + "/".join(parts[:depth])
        if not _searchable_by_nobody(os.stat(ancestor)):
            return ancestor
    return None


def _searchable_by_nobody(st: os.stat_result) -> bool:
    if st.st_uid == NOBODY:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == NOBODY:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def _clone_readonly(path: str) -> int:
    tree = linux.open_tree(path, recursive=True)
    linux.mount_setattr(tree, set_=linux.MOUNT_ATTR_RDONLY | _ATTR_PROTECT, recursive=True)
    return tree


def _hosts_tree(content: str) -> int:
    holder = linux.detached_tmpfs({"mode": "0755", "size": "1m"})
    try:
        fd = os.open("hosts", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644, dir_fd=holder)
        with os.fdopen(fd, "w") as file:
            file.write(content)
        tree = linux.open_tree("hosts", dir_fd=holder)
        linux.mount_setattr(tree, set_=linux.MOUNT_ATTR_RDONLY | _ATTR_WRITABLE)
        return tree
    finally:
        os.close(holder)


def _attach(tree: int, target: str) -> None:
    try:
        linux.move_mount(tree, target)
    finally:
        os.close(tree)


def idmap_userns(uid: int, gid: int) -> int:
    """A user namespace whose idmapping shows `uid`/`gid` as NOBODY, for an idmapped mount.

    Call it before entering a new PID namespace: the helper's pid must mean the same in /proc.
    """
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            os.close(done_w)
            linux.unshare(linux.CLONE_NEWUSER)
            os.write(ready_w, b"1")
            os.read(done_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise OSError(errno.EPERM, "cannot create a user namespace for the idmapped mount")
        with open(f"/proc/{pid}/uid_map", "w") as file:
            file.write(f"{uid} {NOBODY} 1\n")
        with open(f"/proc/{pid}/setgroups", "w") as file:
            file.write("deny\n")
        with open(f"/proc/{pid}/gid_map", "w") as file:
            file.write(f"{gid} {NOBODY} 1\n")
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(ready_r)
        os.close(done_w)
        os.waitpid(pid, 0)
