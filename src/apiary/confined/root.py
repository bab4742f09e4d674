"""`ConfinedRoot`: file operations that cannot leave one directory (RFC 6.4, 16, 23).

The root directory is opened once (O_PATH) and every operation resolves its relative path
beneath that fd with the chosen resolver (openat2.py or walk.py); no path string is ever
joined to the root's name. Refusals raise `PermissionDeniedError` with details
{"path", "reason", "operation"}, are logged as warnings on the "apiary.confined" logger and
are reported to the optional `on_denied(path, reason)` hook. See docs/confinement.md.
"""

from __future__ import annotations

import builtins
import errno
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from stat import S_ISDIR
from types import TracebackType
from typing import IO, Any, BinaryIO, Final, Literal, Self, TextIO, TypeAlias, overload

from apiary.confined import entries
from apiary.confined.paths import DenialReason, RefusalError, given_text, split_relative
from apiary.confined.resolver import ResolverName, select_resolver
from apiary.errors import (
    AlreadyExistsError,
    ApiaryError,
    FilesystemError,
    NotFoundError,
    PermissionDeniedError,
)

_log = logging.getLogger("apiary.confined")

PathArg: TypeAlias = str | os.PathLike[str]
DeniedHook: TypeAlias = Callable[[str, DenialReason], object]
OpenTextMode: TypeAlias = Literal[
    "r", "w", "a", "x", "r+", "w+", "a+", "x+", "rt", "wt", "at", "xt", "r+t", "w+t", "a+t", "x+t"
]
OpenBinaryMode: TypeAlias = Literal[
    "rb", "wb", "ab", "xb", "r+b", "w+b", "a+b", "x+b", "rb+", "wb+", "ab+", "xb+"
]

_DIR_READ: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC

_EXPLANATIONS: Final = {
    DenialReason.PATH_TRAVERSAL: "'..' is not allowed; the path must stay beneath the root",
    DenialReason.ABSOLUTE_PATH: "the path must be relative to the root",
    DenialReason.INVALID_PATH: "not a usable relative path",
    DenialReason.SYMLINK: "symbolic links are never followed",
    DenialReason.DEVICE_NODE: "device nodes are not accessible",
    DenialReason.FIFO: "FIFOs are not accessible",
    DenialReason.SOCKET: "sockets are not accessible",
    DenialReason.HARD_LINK: "a file with several hard links cannot be written in place",
    DenialReason.OS_DENIED: "the operating system denied access",
}


class ConfinedRoot:
    """File operations confined beneath one directory, for agents' worktrees.

    Paths are strings relative to the root ("src/app.py", "./README.md"); "." names the
    root itself where a directory is expected. Absolute paths, "..", NUL bytes, symlinks
    anywhere on a path, device nodes, FIFOs and sockets are refused with
    `PermissionDeniedError`. A missing entry raises `NotFoundError`, an existing one where a
    new one was required `AlreadyExistsError`, any other OS failure `FilesystemError`; each
    carries details "path", "operation", "reason" and (from the OS) "errno".

    `resolver` is "openat2" (kernel-enforced, Linux 5.6+), "walk" (component by component
    with O_NOFOLLOW) or "auto" (openat2 when the kernel has it). The root fd is held until
    `close()`; the object is a context manager. Operations are safe to call from several
    threads; closing while others run is not.
    """

    def __init__(
        self,
        root: PathArg,
        *,
        on_denied: DeniedHook | None = None,
        resolver: ResolverName = "auto",
    ) -> None:
        self._resolver = select_resolver(resolver)
        self._on_denied = on_denied
        self._root = os.path.abspath(os.fspath(root))
        self._fd = -1
        with self._guard(self._root, "open_root"):
            self._fd = os.open(self._root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)

    # --- lifetime ----------------------------------------------------------------------------

    @property
    def root(self) -> str:
        """The root directory's absolute path, as it was when opened (for messages only)."""
        return self._root

    @property
    def resolver(self) -> str:
        """The resolver in use: "openat2" or "walk"."""
        return self._resolver.name

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        """Release the root's fd; further operations raise ValueError. Idempotent."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else self.resolver
        return f"ConfinedRoot({self._root!r}, {state})"

    # --- files -------------------------------------------------------------------------------

    @overload
    def open(
        self,
        path: PathArg,
        mode: OpenTextMode = "r",
        *,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
    ) -> TextIO: ...

    @overload
    def open(
        self,
        path: PathArg,
        mode: OpenBinaryMode,
        *,
        encoding: None = None,
        errors: None = None,
        newline: None = None,
    ) -> BinaryIO: ...

    @overload
    def open(
        self,
        path: PathArg,
        mode: str,
        *,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
    ) -> IO[Any]: ...

    def open(
        self,
        path: PathArg,
        mode: str = "r",
        *,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
    ) -> IO[Any]:
        """Open a regular file beneath the root, like the built-in `open`.

        Modes: r, w, a, x, each with + and b or t. Text defaults to UTF-8. Writing in place
        ("w", "a", "+") to a file with several hard links is refused (reason hard_link);
        "w" truncates only after every check passed.
        """
        parsed = entries.parse_mode(mode)
        with self._guard(path, "open"), ExitStack() as stack:
            parts = _entry(path)
            parent = self._open_dir(stack, parts[:-1])
            fd = entries.open_checked(self._resolver, parent, parts[-1], parsed)
            try:
                text_encoding = None if parsed.binary else (encoding or "utf-8")
                return builtins.open(
                    fd, mode, encoding=text_encoding, errors=errors, newline=newline
                )
            except BaseException:
                os.close(fd)
                raise

    def read_bytes(self, path: PathArg) -> bytes:
        """The whole content of a regular file."""
        with self.open(path, "rb") as file:
            return file.read()

    def read_text(self, path: PathArg, *, encoding: str = "utf-8", errors: str = "strict") -> str:
        """The whole content of a regular file, decoded (universal newlines)."""
        with self.open(path, "r", encoding=encoding, errors=errors) as file:
            return file.read()

    def write_bytes(self, path: PathArg, data: bytes) -> None:
        """Replace (or create) a file with `data`, atomically.

        A temporary file beside the target is written, flushed and renamed over it, all
        relative to the parent directory's fd: readers never see partial content, and a
        hard-linked target gets a new inode instead of changing the other names' content.
        The parent directory must exist.
        """
        with self._guard(path, "write"), ExitStack() as stack:
            parts = _entry(path)
            parent = self._open_dir(stack, parts[:-1])
            entries.replace_atomically(self._resolver, parent, parts[-1], data)

    def write_text(
        self, path: PathArg, text: str, *, encoding: str = "utf-8", errors: str = "strict"
    ) -> None:
        """`write_bytes` of `text` encoded (no newline translation)."""
        self.write_bytes(path, text.encode(encoding, errors))

    # --- directories and entries -----------------------------------------------------------

    def listdir(self, path: PathArg = ".") -> list[str]:
        """The names in a directory, sorted; every kind of entry is listed."""
        with self._guard(path, "listdir"):
            fd = self._open_readable_dir(split_relative(path))
            try:
                return sorted(os.listdir(fd))
            finally:
                os.close(fd)

    def walk(self, path: PathArg = ".") -> Iterator[tuple[str, list[str], list[str]]]:
        """Top-down `(dirpath, dirnames, filenames)` like `os.walk`, never through a symlink.

        `dirpath` is relative to the root ("." for the root). `dirnames` holds real
        directories only (prune it in place to skip some); every other entry, symlinks and
        special files included, is in `filenames`. A directory removed while walking is
        skipped. As with any generator, `path` is checked when the iteration starts.
        """
        with self._guard(path, "walk"):
            parts = split_relative(path)
            fd = self._open_readable_dir(parts)
        try:
            yield from self._walk(fd, "/".join(parts) or ".")
        finally:
            os.close(fd)

    def mkdir(
        self, path: PathArg, *, parents: bool = False, exist_ok: bool = False, mode: int = 0o777
    ) -> None:
        """Create a directory; with `parents`, the missing ones above it too.

        With `exist_ok`, an existing directory is fine (a symlink to one is refused). The
        existing part of the path is resolved before anything is created, so a refused
        path creates nothing.
        """
        with self._guard(path, "mkdir"), ExitStack() as stack:
            parts = _entry(path)
            if parents:
                fd, missing = self._deepest_existing_dir(stack, parts[:-1])
            else:
                fd, missing = self._open_dir(stack, parts[:-1]), ()
            for part in missing:
                with suppress(FileExistsError):  # made meanwhile by someone else
                    os.mkdir(part, mode, dir_fd=fd)
                fd = self._open_dir(stack, (part,), fd)
            try:
                os.mkdir(parts[-1], mode, dir_fd=fd)
            except FileExistsError:
                if not exist_ok:
                    raise
                try:
                    self._open_dir(stack, parts[-1:], fd)
                except NotADirectoryError:
                    raise FileExistsError(errno.EEXIST, "exists, not a directory") from None

    def remove(self, path: PathArg) -> None:
        """Remove a file or an empty directory.

        Acts on the entry itself: a symlink or special file is unlinked, never followed.
        """
        with self._guard(path, "remove"), ExitStack() as stack:
            parts = _entry(path)
            parent = self._open_dir(stack, parts[:-1])
            name = parts[-1]
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if S_ISDIR(st.st_mode):
                os.rmdir(name, dir_fd=parent)
            else:
                os.unlink(name, dir_fd=parent)

    def rename(self, src: PathArg, dst: PathArg) -> None:
        """Move an entry within the root; an existing file at `dst` is replaced (rename(2))."""
        with ExitStack() as stack:
            with self._guard(src, "rename"):
                src_parts = _entry(src)
                src_parent = self._open_dir(stack, src_parts[:-1])
            with self._guard(dst, "rename"):
                dst_parts = _entry(dst)
                dst_parent = self._open_dir(stack, dst_parts[:-1])
            with self._guard(src, "rename"):
                os.rename(
                    src_parts[-1], dst_parts[-1], src_dir_fd=src_parent, dst_dir_fd=dst_parent
                )

    def stat(self, path: PathArg) -> os.stat_result:
        """The status of a regular file or directory (never of a link or a special file)."""
        with self._guard(path, "stat"):
            return self._stat(split_relative(path))

    def exists(self, path: PathArg) -> bool:
        """Whether a regular file or directory is there.

        False only when nothing is there; a refused path still raises.
        """
        with self._guard(path, "exists"):
            try:
                self._stat(split_relative(path))
            except (FileNotFoundError, NotADirectoryError):
                return False
            return True

    # --- internals -------------------------------------------------------------------------

    def _root_fd(self) -> int:
        if self._fd < 0:
            raise ValueError("operation on a closed ConfinedRoot")
        return self._fd

    def _open_dir(self, stack: ExitStack, parts: Sequence[str], base: int | None = None) -> int:
        base_fd = self._root_fd() if base is None else base
        fd = self._resolver.open_dir(base_fd, parts)
        stack.callback(os.close, fd)
        return fd

    def _deepest_existing_dir(
        self, stack: ExitStack, parts: Sequence[str]
    ) -> tuple[int, Sequence[str]]:
        """The fd of the deepest existing directory on `parts`, and the components after it."""
        fd = self._open_dir(stack, ())
        for index, part in enumerate(parts):
            try:
                fd = self._open_dir(stack, (part,), fd)
            except FileNotFoundError:
                return fd, parts[index:]
        return fd, ()

    def _open_readable_dir(self, parts: Sequence[str], base: int | None = None) -> int:
        with ExitStack() as stack:
            fd = self._open_dir(stack, parts, base)
            return os.open(".", _DIR_READ, dir_fd=fd)

    def _stat(self, parts: Sequence[str]) -> os.stat_result:
        if not parts:
            return os.fstat(self._root_fd())
        with ExitStack() as stack:
            parent = self._open_dir(stack, parts[:-1])
            fd = self._resolver.open_entry(parent, parts[-1], os.O_PATH)
            stack.callback(os.close, fd)
            st = os.fstat(fd)
        entries.refuse_special(st)
        return st

    def _walk(self, fd: int, where: str) -> Iterator[tuple[str, list[str], list[str]]]:
        with self._guard(where, "walk"), os.scandir(fd) as scan:
            found = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in scan]
        dirnames = sorted(name for name, is_dir in found if is_dir)
        filenames = sorted(name for name, is_dir in found if not is_dir)
        yield where, dirnames, filenames
        for name in dirnames:
            child_where = name if where == "." else f"{where}/{name}"
            try:
                with self._guard(child_where, "walk"):
                    child = self._open_readable_dir((name,), fd)
            except NotFoundError:
                continue
            try:
                yield from self._walk(child, child_where)
            finally:
                os.close(child)

    @contextmanager
    def _guard(self, path: object, operation: str) -> Iterator[None]:
        """Turn refusals and OS errors inside the block into Apiary errors about `path`."""
        try:
            yield
        except RefusalError as refusal:
            raise self._denied(path, refusal.reason, operation) from None
        except OSError as exc:
            raise self._os_error(path, exc, operation) from exc

    def _denied(
        self, path: object, reason: DenialReason, operation: str, **extra: str
    ) -> PermissionDeniedError:
        given = given_text(path)
        _log.warning(
            "confinement refused %s of %r beneath %s: %s", operation, given, self._root, reason
        )
        if self._on_denied is not None:
            try:
                self._on_denied(given, reason)
            except Exception:
                # The hook must not turn a refusal into some other error.
                _log.exception("on_denied hook failed for %r", given)
        return PermissionDeniedError(
            f"{operation} {given!r}: {_EXPLANATIONS[reason]}",
            {"path": given, "reason": reason.value, "operation": operation, **extra},
        )

    def _os_error(self, path: object, exc: OSError, operation: str) -> ApiaryError:
        code = exc.errno or 0
        name = errno.errorcode.get(code, str(code))
        if code in (errno.EACCES, errno.EPERM):
            return self._denied(path, DenialReason.OS_DENIED, operation, errno=name)
        given = given_text(path)
        details = {"path": given, "operation": operation, "errno": name}
        if code == errno.ENOENT:
            return NotFoundError(
                f"{operation} {given!r}: no such file or directory",
                {**details, "reason": "not_found"},
            )
        if code == errno.EEXIST:
            return AlreadyExistsError(
                f"{operation} {given!r}: already exists", {**details, "reason": "already_exists"}
            )
        return FilesystemError(
            f"{operation} {given!r}: {os.strerror(code)}", {**details, "reason": "os_error"}
        )


def _entry(path: object) -> tuple[str, ...]:
    """The components of a path that must name an entry, not the root itself."""
    parts = split_relative(path)
    if not parts:
        raise RefusalError(DenialReason.INVALID_PATH)
    return parts
