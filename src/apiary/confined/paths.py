"""Relative paths as the confined API takes them, and the reasons a path is refused.

A path is checked and split here, before anything touches the filesystem: it must be a
non-empty string relative to the root, without NUL bytes and without a ".." component.
Empty and "." components are dropped ("./src//app.py" is "src/app.py"); ".." is refused
rather than interpreted, so that what a path names never depends on what is on disk.
"""

from __future__ import annotations

import os
from enum import StrEnum


class DenialReason(StrEnum):
    """Why confinement refused an operation (the `reason` detail of permission_denied)."""

    PATH_TRAVERSAL = "path_traversal"
    """A ".." component, or the kernel saw the resolution leave the root."""
    ABSOLUTE_PATH = "absolute_path"
    INVALID_PATH = "invalid_path"
    """Empty, not a string, contains a NUL byte, or names the root where an entry is needed."""
    SYMLINK = "symlink"
    """A symbolic link anywhere on the path, pointing inside the root or not."""
    DEVICE_NODE = "device_node"
    FIFO = "fifo"
    SOCKET = "socket"
    HARD_LINK = "hard_link"
    """An in-place write to a regular file with more than one name (st_nlink > 1)."""
    OS_DENIED = "os_denied"
    """The kernel answered EACCES or EPERM (file modes, read-only mounts, LSMs)."""


class RefusalError(Exception):
    """Raised by path checks and resolvers; `ConfinedRoot` turns it into permission_denied.

    Internal: it never leaves the package.
    """

    def __init__(self, reason: DenialReason) -> None:
        super().__init__(reason.value)
        self.reason = reason


def given_text(path: object) -> str:
    """The path as the caller gave it, as text for errors and logs."""
    if isinstance(path, str):
        return path
    if isinstance(path, os.PathLike):
        text = os.fspath(path)
        if isinstance(text, str):
            return text
    return repr(path)


def split_relative(path: object) -> tuple[str, ...]:
    """The components of a relative path; `()` names the root itself ("." or "./").

    Raises `RefusalError` for anything that is not a plain relative path.
    """
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path or "\x00" in path:
        raise RefusalError(DenialReason.INVALID_PATH)
    if path.startswith("/"):
        raise RefusalError(DenialReason.ABSOLUTE_PATH)
    parts = tuple(part for part in path.split("/") if part not in ("", "."))
    if ".." in parts:
        raise RefusalError(DenialReason.PATH_TRAVERSAL)
    return parts
