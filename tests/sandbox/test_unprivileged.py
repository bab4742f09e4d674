"""Without root: confine through a user namespace, or fail closed when there is none.

A coordinator without CAP_SYS_ADMIN is simulated for real: the test runs it in a user
namespace (uid 0 mapped to 0, so the interpreter stays readable) with CAP_SYS_ADMIN dropped
from its bounding set, and, for the fail-closed case, with user namespaces switched off inside
(max_user_namespaces = 0 applies to that namespace and its children only).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sandbox.conftest import requires_root

pytestmark = requires_root

WITHOUT_CAP_SYS_ADMIN = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def check(result, what):
    if result != 0:
        raise OSError(ctypes.get_errno(), what)
check(libc.unshare(0x10000000), "unshare(CLONE_NEWUSER)")
for name, text in (("uid_map", "0 0 1"), ("setgroups", "deny"), ("gid_map", "0 0 1")):
    with open(f"/proc/self/{name}", "w") as file:
        file.write(text)
if sys.argv[1] == "no-user-namespaces":
    with open("/proc/sys/user/max_user_namespaces", "w") as file:
        file.write("0")
check(libc.prctl(24, 21, 0, 0, 0), "PR_CAPBSET_DROP CAP_SYS_ADMIN")
os.execv(sys.executable, [sys.executable, "-c", *sys.argv[2:]])
"""

COORDINATOR = """
import asyncio, json, subprocess, sys
from apiary.core.tools.policy import ExecutionPolicy, NetworkPolicy, PrivilegeLevel
from apiary.errors import PermissionDeniedError
from apiary.sandbox import SandboxSpec, run, wrap_argv

async def attempt(argv, policy):
    try:
        result = await run(SandboxSpec(argv, policy))
    except PermissionDeniedError as exc:
        return {"denied": exc.message}
    return {"outcome": result.outcome, "stdout": result.stdout.decode()}

probe, cases = sys.argv[1], sys.argv[2:]
report = {}
if "run" in cases:
    report["run"] = asyncio.run(attempt([sys.executable, "-c", probe], ExecutionPolicy()))
if "wrapped" in cases:
    wrapped = subprocess.run(
        wrap_argv([sys.executable, "-c", probe], ExecutionPolicy()), capture_output=True
    )
    report["wrapped"] = {"returncode": wrapped.returncode, "stderr": wrapped.stderr.decode(),
                         "stdout": wrapped.stdout.decode()}
print(json.dumps(report))
"""

ESCAPE = Path("/var/tmp") / f"apiary-rootless-escape-{os.getpid()}"

PROBE = (
    f"ESCAPE = {str(ESCAPE)!r}\n"
    + """
import os, socket, sys
def attempt(action):
    try:
        action()
        return "ok"
    except OSError as exc:
        return f"denied {exc.errno}"
print("ran", os.getuid())
print("cap_eff", [l for l in open("/proc/self/status") if l.startswith("CapEff")][0].split()[1])
print("network", attempt(lambda: socket.create_connection(("127.0.0.1", 9), timeout=1)))
print("write_outside", attempt(lambda: open(ESCAPE, "w")))
print("fork", attempt(lambda: os.waitpid(os.fork(), 0)))
print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
"""
)


def _coordinate(mode: str, *cases: str) -> dict[str, dict[str, object]]:
    try:
        done = subprocess.run(
            [sys.executable, "-c", WITHOUT_CAP_SYS_ADMIN, mode, COORDINATOR, PROBE, *cases],
            capture_output=True,
            timeout=30,
            check=False,
        )
        assert not ESCAPE.exists()  # nothing reached the host's filesystem
    finally:
        ESCAPE.unlink(missing_ok=True)
    assert done.returncode == 0, done.stderr.decode()
    report: dict[str, dict[str, object]] = json.loads(done.stdout)
    return report


@pytest.mark.conformance("tool.security.honor-confinement")
def test_without_any_namespace_the_sandbox_fails_closed() -> None:
    report = _coordinate("no-user-namespaces", "run", "wrapped")

    # start()/run() refuse, naming the policy; nothing ran.
    denied = str(report["run"]["denied"])
    assert "network_policy=DENY_ALL" in denied
    assert "privilege_level=MINIMAL" in denied
    # A wrapped command (what the MCP SDK would spawn) exits 126 without running the tool.
    assert report["wrapped"]["returncode"] == 126
    assert "permission_denied" in str(report["wrapped"]["stderr"])
    assert report["wrapped"]["stdout"] == ""


def test_without_root_a_user_namespace_confines_the_tool() -> None:
    report = _coordinate("user-namespaces", "run")

    seen = dict(line.split(" ", 1) for line in str(report["run"]["stdout"]).splitlines())
    assert report["run"]["outcome"] == "OK"
    assert seen["ran"] == "0"  # the coordinator's own uid: no uid to drop to...
    assert int(seen["cap_eff"], 16) == 0  # ... and no capability left
    assert seen["network"] == "denied 101"  # DENY_ALL: ENETUNREACH
    assert seen["write_outside"] == "denied 30"  # read-only outside its directory
    assert seen["fork"] == "denied 1"  # MINIMAL: no processes
    assert seen["pids"] == "[1, 2]"
