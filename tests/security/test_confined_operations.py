"""The ordinary file operations of `ConfinedRoot` work, under both resolvers."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import apiary.confined
from apiary.confined import ConfinedRoot, openat2_available
from apiary.errors import AlreadyExistsError, FilesystemError, NotFoundError
from tests.security.conftest import INSIDE, Tree


def test_the_public_surface() -> None:
    assert sorted(apiary.confined.__all__) == [
        "ConfinedRoot",
        "DenialReason",
        "DeniedHook",
        "ResolverName",
        "openat2_available",
    ]


def test_write_then_read(tree: Tree) -> None:
    c = tree.confined
    c.write_bytes("data.bin", b"\x00\x01binary")
    c.write_text("dir/notes.txt", "héllo\nwörld\n")
    assert c.read_bytes("data.bin") == b"\x00\x01binary"
    assert c.read_text("dir/notes.txt") == "héllo\nwörld\n"
    assert (tree.root / "dir" / "notes.txt").read_bytes() == "héllo\nwörld\n".encode()
    assert c.read_text("inside.txt") == INSIDE


def test_an_atomic_write_replaces_the_file_whole_and_leaves_no_temporary(tree: Tree) -> None:
    c = tree.confined
    os.chmod(tree.root / "inside.txt", 0o640)
    with c.open("inside.txt", "rb") as reader:
        c.write_text("inside.txt", "replaced\n")
        # A reader that opened the old file keeps reading the old content, whole.
        assert reader.read() == INSIDE.encode()
    assert c.read_text("inside.txt") == "replaced\n"
    assert stat.S_IMODE(c.stat("inside.txt").st_mode) == 0o640
    c.write_bytes("dir/new.bin", b"x" * 100_000)
    assert c.listdir(".") == ["dir", "inside.txt"]
    assert c.listdir("dir") == ["nested.txt", "new.bin"]


def test_a_write_needs_its_directory(tree: Tree) -> None:
    with pytest.raises(NotFoundError) as caught:
        tree.confined.write_text("missing/file.txt", "x")
    assert caught.value.details == {
        "path": "missing/file.txt",
        "operation": "write",
        "errno": "ENOENT",
        "reason": "not_found",
    }
    with pytest.raises(FilesystemError) as not_dir:
        tree.confined.write_text("dir", "x")
    assert not_dir.value.details["errno"] == "EISDIR"
    assert tree.confined.listdir(".") == ["dir", "inside.txt"]


def test_open_modes(tree: Tree) -> None:
    c = tree.confined
    with c.open("log.txt", "x") as log:
        log.write("one\n")
    with pytest.raises(AlreadyExistsError) as caught:
        c.open("log.txt", "x")
    assert caught.value.details["reason"] == "already_exists"
    with c.open("log.txt", "a") as log:
        log.write("two\n")
    assert c.read_text("log.txt") == "one\ntwo\n"
    with c.open("log.txt", "r+b") as log:
        log.write(b"ONE")
    assert c.read_text("log.txt") == "ONE\ntwo\n"
    with c.open("log.txt", "w+") as log:
        log.write("fresh")
        log.seek(0)
        assert log.read() == "fresh"
    with c.open("log.txt") as log:
        assert log.read() == "fresh"
    with pytest.raises(NotFoundError):
        c.open("nope.txt")
    with pytest.raises(FilesystemError) as is_dir:
        c.open("dir")
    assert is_dir.value.details["errno"] == "EISDIR"
    with pytest.raises(ValueError, match="invalid mode"):
        c.open("log.txt", "rw")  # type: ignore[call-overload]


def test_listing_and_walking(tree: Tree) -> None:
    c = tree.confined
    c.mkdir("dir/sub/deeper", parents=True)
    c.write_text("dir/sub/deeper/leaf.txt", "leaf")
    c.mkdir("skipped")
    c.write_text("skipped/hidden.txt", "x")
    (tree.root / "dir" / "link").symlink_to("sub", target_is_directory=True)
    assert c.listdir(".") == ["dir", "inside.txt", "skipped"]
    assert c.listdir("./dir/") == ["link", "nested.txt", "sub"]
    seen = []
    for dirpath, dirnames, filenames in c.walk():
        seen.append((dirpath, list(dirnames), filenames))
        if "skipped" in dirnames:
            dirnames.remove("skipped")
    assert seen == [
        (".", ["dir", "skipped"], ["inside.txt"]),
        ("dir", ["sub"], ["link", "nested.txt"]),
        ("dir/sub", ["deeper"], []),
        ("dir/sub/deeper", [], ["leaf.txt"]),
    ]
    assert [d for d, _, _ in c.walk("dir/sub")] == ["dir/sub", "dir/sub/deeper"]


def test_mkdir(tree: Tree) -> None:
    c = tree.confined
    c.mkdir("a/b/c", parents=True)
    assert (tree.root / "a" / "b" / "c").is_dir()
    c.mkdir("a/b/c", parents=True, exist_ok=True)
    c.mkdir("a/b/d")
    with pytest.raises(AlreadyExistsError):
        c.mkdir("a/b/d")
    with pytest.raises(AlreadyExistsError):
        c.mkdir("inside.txt", exist_ok=True)
    with pytest.raises(NotFoundError):
        c.mkdir("x/y")
    with pytest.raises(FilesystemError) as caught:
        c.mkdir("inside.txt/y", parents=True)
    assert caught.value.details["errno"] == "ENOTDIR"


def test_rename(tree: Tree) -> None:
    c = tree.confined
    c.rename("inside.txt", "dir/moved.txt")
    assert c.listdir(".") == ["dir"]
    assert c.read_text("dir/moved.txt") == INSIDE
    c.write_text("other.txt", "other")
    c.rename("other.txt", "dir/moved.txt")  # replaces, as rename(2) does
    assert c.read_text("dir/moved.txt") == "other"
    c.rename("dir", "renamed")
    assert c.listdir("renamed") == ["moved.txt", "nested.txt"]
    with pytest.raises(NotFoundError) as caught:
        c.rename("gone.txt", "x")
    assert caught.value.details["path"] == "gone.txt"


def test_remove(tree: Tree) -> None:
    c = tree.confined
    with pytest.raises(FilesystemError) as caught:
        c.remove("dir")
    assert caught.value.details["errno"] == "ENOTEMPTY"
    c.remove("dir/nested.txt")
    c.remove("dir")
    c.remove("inside.txt")
    assert c.listdir(".") == []
    with pytest.raises(NotFoundError):
        c.remove("inside.txt")


def test_stat_and_exists(tree: Tree) -> None:
    c = tree.confined
    assert stat.S_ISREG(c.stat("inside.txt").st_mode)
    assert c.stat("inside.txt").st_size == len(INSIDE)
    assert stat.S_ISDIR(c.stat("dir").st_mode)
    assert c.stat(".").st_ino == os.stat(tree.root).st_ino
    assert c.exists("dir/nested.txt") and c.exists("dir") and c.exists(".")
    assert not c.exists("missing") and not c.exists("inside.txt/below")
    with pytest.raises(NotFoundError):
        c.stat("missing")


@pytest.mark.conformance("worktree.confinement.path-canonicalization")
def test_equivalent_spellings_name_the_same_entry(tree: Tree) -> None:
    c = tree.confined
    for path in ("dir/nested.txt", "./dir/nested.txt", "dir//nested.txt", "./dir/./nested.txt"):
        assert c.read_text(path) == INSIDE
    assert c.listdir(".") == c.listdir("./") == c.listdir(".//.") == ["dir", "inside.txt"]
    assert c.read_text(Path("dir") / "nested.txt") == INSIDE


def test_the_root_is_held_by_its_fd_not_its_name(tree: Tree) -> None:
    # Moving the directory away (or a symlink taking its name) does not move the root.
    tree.root.rename(tree.base / "moved")
    (tree.base / "root").symlink_to(tree.outside, target_is_directory=True)
    assert tree.confined.read_text("inside.txt") == INSIDE
    assert tree.confined.listdir(".") == ["dir", "inside.txt"]


def test_the_root_lifecycle(tmp_path: Path) -> None:
    with ConfinedRoot(tmp_path) as c:
        assert c.resolver == ("openat2" if openat2_available() else "walk")
        assert c.root == str(tmp_path)
    assert c.closed
    with pytest.raises(ValueError, match="closed"):
        c.listdir(".")
    c.close()
    with pytest.raises(NotFoundError):
        ConfinedRoot(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(FilesystemError) as caught:
        ConfinedRoot(tmp_path / "file", resolver="walk")
    assert caught.value.details["errno"] == "ENOTDIR"
    with pytest.raises(ValueError, match="resolver"):
        ConfinedRoot(tmp_path, resolver="chroot")  # type: ignore[arg-type]
