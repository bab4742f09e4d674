"""Privilege levels and filesystem confinement on real processes (RFC 18.5.3, 18.4, 16)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from apiary.core.tools.policy import ExecutionPolicy, NetworkPolicy, PrivilegeLevel
from apiary.sandbox import Outcome, SandboxSpec, mounts, run
from apiary.sandbox.plan import ELEVATED_CAPABILITIES, NOBODY
from tests.sandbox.conftest import lines, python, requires_root

pytestmark = requires_root

PROBE = """
import os, subprocess, sys, threading

def attempt(name, action):
    try:
        print(name, "ok", action())
    except OSError as exc:
        print(name, "denied", exc.errno)

status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print("uid", os.getuid(), os.getgid())
print("groups", os.getgroups())
print("no_new_privs", status["NoNewPrivs"].strip())
print("cap_eff", status["CapEff"].strip())
print("cwd", os.getcwd())
print("home", os.environ.get("HOME"))
print("listing", sorted(os.listdir(".")))
print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
worker = threading.Thread(target=lambda: None)
worker.start()
worker.join()
print("thread ok")
attempt("fork", lambda: subprocess.run(["true"]).returncode)
attempt("write_cwd", lambda: open("written-inside", "w").write("x"))
for i, path in enumerate(sys.argv[1:]):
    attempt(f"write_outside_{i}", lambda: open(path, "w").write("x"))
attempt("exec_from_cwd", lambda: subprocess.run(["./script.sh"]).returncode)
mounts = [line.split() for line in open("/proc/self/mountinfo")]
print("cwd_mount", next((m[5] for m in mounts if m[4] == os.getcwd()), "-"))
"""


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[list[Path]]:
    """Places a confined tool must not write: world-writable on the host, so only the
    sandbox can stop it. Removed afterwards, should a regression have written them."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    paths = [shared / "escape", Path("/var/tmp") / f"apiary-escape-{os.getpid()}"]
    yield paths
    for path in paths:
        path.unlink(missing_ok=True)


@pytest.mark.conformance("tool.security.deny-by-default", "tool.security.honor-confinement")
async def test_minimal_runs_as_nobody_in_an_empty_private_directory(outside: list[Path]) -> None:
    result = await run(SandboxSpec(python(PROBE, *map(str, outside)), ExecutionPolicy()))

    seen = lines(result.stdout)
    assert result.outcome is Outcome.OK, result.stderr
    assert seen["uid"] == f"{NOBODY} {NOBODY}"
    assert seen["groups"] == "[]"
    assert seen["no_new_privs"] == "1"
    assert int(seen["cap_eff"], 16) == 0
    assert seen["listing"] == "[]"  # a private, empty working directory...
    assert seen["home"] == seen["cwd"]
    assert seen["write_cwd"] == "ok 1"  # ... that the tool can write
    assert seen["pids"] == "[1, 2]"  # its own PID namespace: no other process is visible
    assert seen["thread"] == "ok"  # threads are fine...
    assert seen["fork"] == "denied 1"  # ... processes are not (EPERM)
    # Outside the sandbox nothing is writable: the host's /tmp is not even visible (ENOENT),
    # the rest of the filesystem is mounted read-only (EROFS).
    assert seen["write_outside_0"] == "denied 2"
    assert seen["write_outside_1"] == "denied 30"
    assert not any(path.exists() for path in outside)


def _worktree_with_a_script(tmp_path: Path) -> Path:
    """A worktree holding script.sh, which the host can execute."""
    worktree = tmp_path / "worktree"
    worktree.mkdir()
    script = worktree / "script.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    script.chmod(0o755)
    assert subprocess.run([str(script)], capture_output=True, check=True).stdout == b"ran\n"
    return worktree


@pytest.mark.conformance("worktree.confinement.mount-options", "tool.security.honor-confinement")
async def test_default_writes_the_worktree_mounted_nosuid_nodev_noexec(
    tmp_path: Path, outside: list[Path]
) -> None:
    worktree = _worktree_with_a_script(tmp_path)
    policy = ExecutionPolicy(privilege=PrivilegeLevel.DEFAULT)

    result = await run(SandboxSpec(python(PROBE, *map(str, outside)), policy, cwd=worktree))

    seen = lines(result.stdout)
    assert result.outcome is Outcome.OK, result.stderr
    assert seen["uid"] == f"{NOBODY} {NOBODY}"
    assert seen["no_new_privs"] == "1"
    assert seen["cwd"] == str(worktree)
    assert seen["listing"] == "['script.sh']"
    assert seen["fork"] == "ok 0"  # DEFAULT may spawn processes
    assert set(seen["cwd_mount"].split(",")) >= {"rw", "nosuid", "nodev", "noexec"}
    assert seen["exec_from_cwd"] == "denied 13"  # noexec: EACCES
    assert seen["write_cwd"] == "ok 1"
    written = worktree / "written-inside"
    assert written.read_text() == "x"
    assert written.stat().st_uid == os.getuid()  # idmapped: the coordinator's file, not nobody's
    assert seen["write_outside_1"] == "denied 30"
    assert not any(path.exists() for path in outside)


async def test_elevated_keeps_root_but_only_a_few_capabilities(tmp_path: Path) -> None:
    probe = (
        PROBE
        + """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def join_host_network():
    fd = os.open("/proc/1/ns/net", os.O_RDONLY)
    if libc.setns(fd, 0) != 0:
        raise OSError(ctypes.get_errno(), "setns")
    return "joined"
attempt("join_host_network", join_host_network)
"""
    )
    policy = ExecutionPolicy(privilege=PrivilegeLevel.ELEVATED)

    result = await run(SandboxSpec(python(probe), policy, cwd=tmp_path))

    seen = lines(result.stdout)
    assert seen["uid"] == "0 0"
    assert seen["no_new_privs"] == "0"
    assert int(seen["cap_eff"], 16) == sum(1 << cap for cap in ELEVATED_CAPABILITIES)
    # Without CAP_SYS_PTRACE and CAP_SYS_ADMIN it cannot leave its network namespace, so
    # DENY_ALL (the default) still holds for an ELEVATED tool.
    assert seen["join_host_network"].startswith("denied")


async def test_privileged_runs_with_full_privileges(tmp_path: Path) -> None:
    policy = ExecutionPolicy(privilege=PrivilegeLevel.PRIVILEGED, network=NetworkPolicy.FULL_ACCESS)

    result = await run(SandboxSpec(python(PROBE), policy, cwd=tmp_path))

    seen = lines(result.stdout)
    assert seen["uid"] == "0 0"
    assert seen["cap_eff"] == _our_effective_capabilities()


def _our_effective_capabilities() -> str:
    with open("/proc/self/status") as status:
        return next(line.split()[1] for line in status if line.startswith("CapEff"))


async def test_a_program_that_cannot_be_executed_is_spawn_failed() -> None:
    result = await run(SandboxSpec(["/nonexistent/tool"], ExecutionPolicy()))

    assert result.outcome is Outcome.SPAWN_FAILED
    assert result.exit_code is None
    assert b"/nonexistent/tool" in result.stderr


async def test_a_private_directory_above_the_interpreter_stays_private() -> None:
    # Here the interpreter may live under a directory nobody cannot search (/root/.pyenv):
    # the sandbox covers that directory, showing only the interpreter's own tree.
    ancestor, visible, hidden = _private_directory_above_the_interpreter()
    probe = f"import os; print(sorted(os.listdir({ancestor!r})))"

    result = await run(SandboxSpec(python(probe), ExecutionPolicy()))

    assert result.stdout.decode().strip() == str([visible])
    assert hidden  # the host has more in there, which the tool did not see


def _private_directory_above_the_interpreter() -> tuple[str, str, list[str]]:
    """The directory nobody cannot search above the interpreter, the one entry of it the
    sandbox shows (towards the interpreter), and the host's other entries."""
    prefix = os.path.realpath(sys.base_prefix)
    ancestor = mounts.blocking_ancestor(prefix)
    if ancestor is None:
        pytest.skip(f"{prefix} is reachable by everyone here; nothing to cover")
    visible = prefix[len(ancestor) :].strip("/").split("/")[0]
    return ancestor, visible, [name for name in os.listdir(ancestor) if name != visible]
