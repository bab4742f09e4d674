"""Hostile paths and files against `ConfinedRoot`, each case under both resolvers.

Every refusal is checked for its code (permission_denied), its reason, the path it names
and the call to the on_denied hook; the writes are checked to have changed nothing outside.
"""

from __future__ import annotations

import array
import ctypes
import errno
import fcntl
import logging
import os
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from apiary.confined import ConfinedRoot, openat2_available
from apiary.confined.openat2 import openat2
from apiary.errors import NotFoundError, PermissionDeniedError
from tests.security.conftest import INSIDE, OUTSIDE, Tree, snapshot

# --------------------------------------------------------------------------- path checks

TRAVERSALS = [
    "../../etc/passwd",
    "../outside/secret.txt",
    "a/../../x",
    "a/b/../../../x",
    "dir/../inside.txt",  # stays inside, still refused: ".." is never interpreted
    "dir/..",
    "..",
]


def every_operation(t: Tree, path: str) -> list[Callable[[], object]]:
    """One call per public operation, each taking `path` where a path goes."""
    c = t.confined
    return [
        lambda: c.read_bytes(path),
        lambda: c.read_text(path),
        lambda: c.open(path, "rb"),
        lambda: c.open(path, "w"),
        lambda: c.open(path, "a"),
        lambda: c.open(path, "x"),
        lambda: c.write_bytes(path, b"pwned"),
        lambda: c.write_text(path, "pwned"),
        lambda: c.stat(path),
        lambda: c.exists(path),
        lambda: c.listdir(path),
        lambda: list(c.walk(path)),
        lambda: c.mkdir(path),
        lambda: c.mkdir(path, parents=True, exist_ok=True),
        lambda: c.remove(path),
        lambda: c.rename(path, "renamed"),
        lambda: c.rename("inside.txt", path),
    ]


@pytest.mark.conformance(
    "worktree.confinement.path-traversal",
    "worktree.confinement.path-canonicalization",
    "worktree.confinement.no-path-escape",
)
@pytest.mark.parametrize("path", TRAVERSALS)
def test_dot_dot_is_refused_by_every_operation_before_any_lookup(tree: Tree, path: str) -> None:
    # "a" does not exist: the answer is path_traversal, not not_found, because the path is
    # refused before the filesystem is asked anything.
    before = snapshot(tree.base)
    for call in every_operation(tree, path):
        tree.refused(call, path, "path_traversal")
    assert snapshot(tree.base) == before


@pytest.mark.conformance(
    "worktree.confinement.path-canonicalization", "worktree.confinement.no-path-escape"
)
def test_absolute_paths_are_refused_even_when_they_point_inside(tree: Tree) -> None:
    before = snapshot(tree.base)
    for path in ("/etc/passwd", str(tree.outside / "secret.txt"), str(tree.root / "inside.txt")):
        for call in every_operation(tree, path):
            tree.refused(call, path, "absolute_path")
    assert snapshot(tree.base) == before


@pytest.mark.parametrize("path", ["", "a\x00b", "inside.txt\x00", "\x00"])
def test_empty_paths_and_nul_bytes_are_invalid(tree: Tree, path: str) -> None:
    for call in every_operation(tree, path):
        tree.refused(call, path, "invalid_path")


def test_only_text_paths_are_accepted_and_the_root_is_not_an_entry(tree: Tree) -> None:
    c = tree.confined
    tree.refused(lambda: c.read_bytes(b"inside.txt"), "b'inside.txt'", "invalid_path")  # type: ignore[arg-type]
    tree.refused(lambda: c.read_bytes(42), "42", "invalid_path")  # type: ignore[arg-type]
    for path in (".", "./", ".//."):
        tree.refused(lambda path=path: c.remove(path), path, "invalid_path")
        tree.refused(lambda path=path: c.write_text(path, "x"), path, "invalid_path")
    assert tree.root.is_dir()


# --------------------------------------------------------------------------- symlinks


@pytest.mark.conformance(
    "security.worktree.no-symlink-traversal",
    "worktree.confinement.no-path-escape",
    "worktree.confinement.vfs-fallback",
)
def test_a_symlink_to_a_file_outside_is_neither_read_nor_written(tree: Tree) -> None:
    (tree.root / "link").symlink_to(tree.outside / "secret.txt")
    before = snapshot(tree.outside)
    for call in every_operation(tree, "link")[:12]:  # reads, writes, stat, listings
        tree.refused(call, "link", "symlink")
    for mode in ("r", "r+", "w", "a", "x", "rb", "w+b"):
        tree.refused(lambda mode=mode: tree.confined.open("link", mode), "link", "symlink")
    assert snapshot(tree.outside) == before
    assert (tree.root / "link").is_symlink()


@pytest.mark.conformance(
    "security.worktree.no-symlink-traversal",
    "worktree.confinement.no-path-escape",
    "worktree.confinement.vfs-fallback",
)
def test_a_symlink_to_a_directory_outside_is_never_an_intermediate(tree: Tree) -> None:
    (tree.root / "ldir").symlink_to(tree.outside, target_is_directory=True)
    (tree.root / "dir" / "deeper").symlink_to("../../outside/sub", target_is_directory=True)
    before = snapshot(tree.base)
    for path in ("ldir/secret.txt", "ldir/new.txt", "ldir/sub/deep.txt", "dir/deeper/deep.txt"):
        for call in every_operation(tree, path):
            tree.refused(call, path, "symlink")
    for path in ("ldir", "dir/deeper", "ldir/sub"):
        tree.refused(lambda path=path: tree.confined.listdir(path), path, "symlink")
        tree.refused(lambda path=path: list(tree.confined.walk(path)), path, "symlink")
    tree.refused(lambda: tree.confined.mkdir("ldir/a/b", parents=True), "ldir/a/b", "symlink")
    tree.refused(
        lambda: tree.confined.mkdir("dir/deeper/x/y", parents=True), "dir/deeper/x/y", "symlink"
    )
    # A refusal creates nothing, inside or outside.
    assert snapshot(tree.base) == before


@pytest.mark.conformance("security.worktree.no-symlink-traversal")
def test_a_symlink_pointing_inside_is_refused_too(tree: Tree) -> None:
    # Following a link would mean resolving its target beneath the root as well; refusing
    # every link keeps one rule the kernel can enforce in the same call (RFC 23: "MUST
    # prohibit symlink traversal", not only escaping ones). See docs/confinement.md.
    (tree.root / "alias.txt").symlink_to("inside.txt")
    (tree.root / "dalias").symlink_to("dir", target_is_directory=True)
    c = tree.confined
    tree.refused(lambda: c.read_text("alias.txt"), "alias.txt", "symlink")
    tree.refused(lambda: c.exists("alias.txt"), "alias.txt", "symlink")
    tree.refused(lambda: c.write_text("alias.txt", "x"), "alias.txt", "symlink")
    tree.refused(lambda: c.read_text("dalias/nested.txt"), "dalias/nested.txt", "symlink")
    tree.refused(lambda: c.listdir("dalias"), "dalias", "symlink")
    assert c.read_text("inside.txt") == INSIDE
    # The links are still entries of the tree: listed, not descended, removable.
    assert "dalias" in c.listdir(".")
    assert [(d, f) for d, _, f in c.walk()] == [
        (".", ["alias.txt", "dalias", "inside.txt"]),
        ("dir", ["nested.txt"]),
    ]
    c.remove("dalias")
    assert (tree.root / "dir" / "nested.txt").exists()


RENAME_EXCHANGE = 2
AT_FDCWD = -100


LIBC = ctypes.CDLL(None, use_errno=True)


def exchange(a: Path, b: Path) -> None:
    """Swap two names atomically (renameat2 RENAME_EXCHANGE)."""
    result = LIBC.renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE)
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(a))


@contextmanager
def swapping(root: Path, outside: Path) -> Iterator[None]:
    """root/swap flips between a real directory and a symlink to `outside`, continuously."""
    (root / "swap").mkdir()
    (root / "swap" / "secret.txt").write_text(INSIDE)
    (root / "swap.other").symlink_to(outside, target_is_directory=True)
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            exchange(root / "swap", root / "swap.other")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    swapper = threading.Thread(target=run, name="symlink-swapper", daemon=True)
    swapper.start()
    try:
        yield
    finally:
        stop.set()
        swapper.join(5)
        sys.setswitchinterval(interval)
    assert not swapper.is_alive()


def race(
    read: Callable[[], str],
    *,
    rounds: int,
    budget_s: float,
    until: Callable[[dict[str, int]], bool] = lambda seen: False,
) -> dict[str, int]:
    """Call `read` while the swap runs, up to `rounds` times, `budget_s` seconds or `until`;
    count what the calls saw."""
    seen = {"inside": 0, "outside": 0, "symlink": 0, "os_error": 0}
    deadline = time.monotonic() + budget_s
    for n in range(rounds):
        try:
            content = read()
        except PermissionDeniedError as exc:
            assert exc.details["reason"] == "symlink"
            seen["symlink"] += 1
        except (NotFoundError, OSError):  # the naive reader's own check races too
            seen["os_error"] += 1
        else:
            seen["inside" if content == INSIDE else "outside"] += 1
            assert content in (INSIDE, OUTSIDE)
        if until(seen) or (n % 50 == 0 and time.monotonic() > deadline):
            break
    return seen


@pytest.mark.conformance(
    "security.worktree.no-symlink-traversal",
    "worktree.confinement.no-path-escape",
    "worktree.confinement.vfs-fallback",
)
def test_a_directory_swapped_for_a_symlink_mid_use_never_leads_outside(tree: Tree) -> None:
    c = tree.confined

    def read_and_append() -> str:
        with c.open("swap/appended.txt", "a") as log:
            log.write("x")
        return c.read_text("swap/secret.txt")

    with swapping(tree.root, tree.outside):
        seen = race(read_and_append, rounds=1500, budget_s=0.5)
    assert seen["outside"] == 0, seen
    # The race really ran: both states of "swap" were met.
    assert seen["inside"] > 0 and seen["symlink"] > 0, seen
    assert (tree.outside / "secret.txt").read_text() == OUTSIDE
    assert not (tree.outside / "appended.txt").exists()


def test_the_swap_race_defeats_a_check_then_open_confinement(tmp_path: Path) -> None:
    # The control for the test above: the same race against the usual realpath check and a
    # string join does read outside, so a resolver that followed links would fail there.
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text(OUTSIDE)

    def naive_read() -> str:
        full = os.path.join(root, "swap/secret.txt")
        if not os.path.realpath(full).startswith(f"{root}{os.sep}"):
            raise PermissionDeniedError("outside", {"reason": "symlink"})
        with open(full) as file:
            return file.read()

    with swapping(root, outside):
        seen = race(naive_read, rounds=20000, budget_s=1.5, until=lambda s: s["outside"] > 0)
    assert seen["outside"] > 0, seen


# --------------------------------------------------------------------------- special files


def make_device(path: Path, kind: int, major: int, minor: int) -> None:
    try:
        os.mknod(path, kind | 0o666, os.makedev(major, minor))
    except PermissionError:
        pytest.skip("creating device nodes needs CAP_MKNOD")


def special_file_operations(t: Tree, path: str) -> list[Callable[[], object]]:
    c = t.confined
    return [
        lambda: c.read_bytes(path),
        lambda: c.read_text(path),
        lambda: c.open(path, "rb"),
        lambda: c.open(path, "r+b"),
        lambda: c.open(path, "w"),
        lambda: c.open(path, "a"),
        lambda: c.write_bytes(path, b"x"),
        lambda: c.stat(path),
        lambda: c.exists(path),
    ]


@pytest.mark.conformance(
    "worktree.confinement.no-device-nodes", "security.worktree.no-device-nodes"
)
@pytest.mark.parametrize(
    ("kind", "major", "minor"),
    [(stat.S_IFCHR, 1, 3), (stat.S_IFCHR, 1, 5), (stat.S_IFBLK, 7, 0)],
    ids=["char-null", "char-zero", "block-loop0"],
)
def test_device_nodes_are_refused(tree: Tree, kind: int, major: int, minor: int) -> None:
    make_device(tree.root / "dev", kind, major, minor)
    make_device(tree.root / "dir" / "dev", kind, major, minor)
    for path in ("dev", "dir/dev", "./dir//dev"):
        for call in special_file_operations(tree, path):
            tree.refused(call, path, "device_node")
    # Refused writes did not replace the node with a file.
    assert stat.S_ISCHR(os.lstat(tree.root / "dev").st_mode) == (kind == stat.S_IFCHR)
    assert not stat.S_ISREG(os.lstat(tree.root / "dev").st_mode)
    # Listing names it; removing unlinks the entry without opening the device.
    assert "dev" in tree.confined.listdir(".")
    tree.confined.remove("dev")
    assert not os.path.lexists(tree.root / "dev")


def finishes(call: Callable[[], object], seconds: float = 5.0) -> BaseException | None:
    """Run `call` in a thread; fail if it blocks. Returns what it raised."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), "the call blocked"
    return outcome[0]


def test_a_fifo_is_refused_without_blocking(tree: Tree) -> None:
    os.mkfifo(tree.root / "fifo")
    for call in special_file_operations(tree, "fifo"):
        error = finishes(call)
        assert isinstance(error, PermissionDeniedError)
        assert error.details["reason"] == "fifo"
    assert tree.denied == [("fifo", "fifo")] * len(special_file_operations(tree, "fifo"))
    assert stat.S_ISFIFO(os.lstat(tree.root / "fifo").st_mode)


def test_a_unix_socket_is_refused(tree: Tree) -> None:
    path = tree.root / "sock"
    if len(os.fsencode(path)) >= 100:
        pytest.skip("the temporary directory is too deep for a unix socket path")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        for call in special_file_operations(tree, "sock"):
            tree.refused(call, "sock", "socket")
    assert stat.S_ISSOCK(os.lstat(path).st_mode)


# --------------------------------------------------------------------------- hard links


def test_a_hard_link_to_a_file_outside_is_never_written_in_place(tree: Tree) -> None:
    os.link(tree.outside / "secret.txt", tree.root / "hard.txt")
    c = tree.confined
    for mode in ("w", "a", "r+", "wb", "ab", "r+b", "w+"):
        tree.refused(lambda mode=mode: c.open("hard.txt", mode), "hard.txt", "hard_link")
    assert (tree.outside / "secret.txt").read_text() == OUTSIDE
    # Reading is allowed (documented): the file is already reachable from the worktree.
    assert c.read_text("hard.txt") == OUTSIDE
    # The atomic write replaces the worktree's name and leaves the other name alone.
    c.write_text("hard.txt", "mine\n")
    assert c.read_text("hard.txt") == "mine\n"
    assert (tree.outside / "secret.txt").read_text() == OUTSIDE
    assert os.stat(tree.outside / "secret.txt").st_nlink == 1


# --------------------------------------------------------------------------- the whole picture


@pytest.mark.conformance("worktree.confinement.restrict-fs", "worktree.confinement.no-path-escape")
def test_another_agents_worktree_and_system_files_stay_out_of_reach(tree: Tree) -> None:
    # base/outside plays the other agent's worktree; links to it were planted in ours.
    (tree.root / "to_b").symlink_to(tree.outside, target_is_directory=True)
    (tree.root / "b_secret").symlink_to(tree.outside / "secret.txt")
    (tree.root / "passwd").symlink_to("/etc/passwd")
    c, b = tree.confined, str(tree.outside)
    attempts: list[tuple[str, Callable[[], object]]] = [
        ("../outside/secret.txt", lambda: c.read_text("../outside/secret.txt")),
        ("/etc/passwd", lambda: c.read_text("/etc/passwd")),
        ("passwd", lambda: c.read_text("passwd")),
        ("to_b/secret.txt", lambda: c.read_text("to_b/secret.txt")),
        ("b_secret", lambda: c.read_bytes("b_secret")),
        ("to_b", lambda: c.listdir("to_b")),
        ("../outside", lambda: c.listdir("../outside")),
        ("to_b/sub/deep.txt", lambda: c.stat("to_b/sub/deep.txt")),
        ("../outside/new.txt", lambda: c.write_text("../outside/new.txt", "x")),
        (f"{b}/secret.txt", lambda: c.write_text(f"{b}/secret.txt", "x")),
        (f"{b}/new.txt", lambda: c.open(f"{b}/new.txt", "x")),
        ("to_b/secret.txt", lambda: c.write_text("to_b/secret.txt", "x")),
        ("to_b/new.txt", lambda: c.write_bytes("to_b/new.txt", b"x")),
        ("b_secret", lambda: c.write_text("b_secret", "x")),
        ("b_secret", lambda: c.open("b_secret", "a")),
        ("to_b/secret.txt", lambda: c.open("to_b/secret.txt", "r+")),
        ("to_b/new.txt", lambda: c.open("to_b/new.txt", "x")),
        ("passwd", lambda: c.open("passwd", "a")),
        ("to_b/newdir", lambda: c.mkdir("to_b/newdir")),
        ("to_b/x/y", lambda: c.mkdir("to_b/x/y", parents=True)),
        ("../outside/newdir", lambda: c.mkdir("../outside/newdir")),
        ("to_b/moved.txt", lambda: c.rename("inside.txt", "to_b/moved.txt")),
        ("to_b/secret.txt", lambda: c.rename("to_b/secret.txt", "stolen.txt")),
        ("../outside/secret.txt", lambda: c.rename("../outside/secret.txt", "stolen.txt")),
        ("to_b/secret.txt", lambda: c.remove("to_b/secret.txt")),
        ("to_b/sub", lambda: c.remove("to_b/sub")),
        ("../outside/secret.txt", lambda: c.remove("../outside/secret.txt")),
    ]
    before, passwd = snapshot(tree.base), os.stat("/etc/passwd")
    for path, call in attempts:
        with pytest.raises(PermissionDeniedError) as caught:
            call()
        assert caught.value.details["path"] == path
    assert [path for path, _ in tree.denied] == [path for path, _ in attempts]
    assert snapshot(tree.base) == before
    assert os.stat("/etc/passwd").st_mtime_ns == passwd.st_mtime_ns


# --------------------------------------------------------------------------- reporting


def test_refusals_are_logged_and_reported_even_when_the_hook_fails(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[tuple[str, str]] = []

    def hook(path: str, reason: str) -> None:
        calls.append((path, reason))
        raise RuntimeError("audit sink down")

    with (
        ConfinedRoot(tmp_path, on_denied=hook) as c,
        caplog.at_level(logging.WARNING),
        pytest.raises(PermissionDeniedError) as caught,
    ):
        c.read_text("../etc/passwd")
    assert calls == [("../etc/passwd", "path_traversal")]
    assert caught.value.details == {
        "path": "../etc/passwd",
        "reason": "path_traversal",
        "operation": "open",
    }
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.name for r in warnings] == ["apiary.confined"]
    assert "'../etc/passwd'" in warnings[0].getMessage()
    assert "path_traversal" in warnings[0].getMessage()
    assert any("on_denied hook failed" in r.getMessage() for r in caplog.records)


# --------------------------------------------------------------------------- the kernel's part


@pytest.mark.conformance("security.worktree.syscall-boundaries")
@pytest.mark.skipif(not openat2_available(), reason="this kernel has no usable openat2")
def test_openat2_itself_refuses_escapes_and_links(tmp_path: Path) -> None:
    # Beneath the path checks, the kernel enforces the same boundary in the open call.
    (tmp_path / "root").mkdir()
    (tmp_path / "secret").write_text(OUTSIDE)
    (tmp_path / "root" / "up").symlink_to("..", target_is_directory=True)
    (tmp_path / "root" / "same").symlink_to(".", target_is_directory=True)
    fd = os.open(tmp_path / "root", os.O_PATH | os.O_DIRECTORY)
    try:
        for path, code in [
            ("../secret", errno.EXDEV),
            ("/etc/passwd", errno.EXDEV),
            ("up/secret", errno.ELOOP),
            ("same", errno.ELOOP),
            ("/proc/self/root/etc/passwd", errno.EXDEV),
        ]:
            with pytest.raises(OSError) as caught:
                os.close(openat2(fd, path, os.O_RDONLY))
            assert caught.value.errno == code, path
    finally:
        os.close(fd)


FS_IOC_GETFLAGS = 0x80086601
FS_IOC_SETFLAGS = 0x40086602
FS_IMMUTABLE_FL = 0x10


@contextmanager
def immutable(path: Path) -> Iterator[None]:
    """`path` with the immutable attribute (chattr +i): even root gets EPERM writing it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        flags = array.array("l", [0])
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags, True)
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, array.array("l", [flags[0] | FS_IMMUTABLE_FL]))
    except OSError as exc:
        os.close(fd)
        pytest.skip(f"cannot set the immutable attribute here: {exc}")
    try:
        yield
    finally:
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, flags)
        os.close(fd)


def test_the_kernel_denying_access_is_reported_as_a_refusal(tree: Tree) -> None:
    c = tree.confined
    with immutable(tree.root / "inside.txt"):
        for mode in ("a", "r+", "w"):
            error = tree.refused(
                lambda mode=mode: c.open("inside.txt", mode), "inside.txt", "os_denied"
            )
            assert error.details["errno"] == "EPERM"
        # The atomic write fails at the rename; its temporary file is gone too.
        tree.refused(lambda: c.write_text("inside.txt", "x"), "inside.txt", "os_denied")
        assert c.listdir(".") == ["dir", "inside.txt"]
        assert c.read_text("inside.txt") == INSIDE
