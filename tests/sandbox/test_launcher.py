"""The launcher as other spawners see it (wrap_argv), its plan, and process_cpu_ms."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import apiary.sandbox
from apiary.core.tools.policy import ExecutionPolicy, HostPort, NetworkPolicy, PrivilegeLevel
from apiary.errors import ValidationError
from apiary.sandbox import SandboxSpec, netns, process_cpu_ms, run, start, wrap_argv
from apiary.sandbox.mounts import PRIVATE_WORKDIR
from apiary.sandbox.plan import LaunchPlan
from apiary.sandbox.seccomp import SeccompUnavailableError, build_filter
from tests.sandbox.conftest import python, requires_root

PUBLIC_API = [
    "Outcome",
    "SandboxResult",
    "SandboxSpec",
    "SandboxedProcess",
    "error_for",
    "process_cpu_ms",
    "run",
    "start",
    "wrap_argv",
]


def test_the_public_api_is_pinned() -> None:
    assert apiary.sandbox.__all__ == PUBLIC_API
    for name in PUBLIC_API:
        assert getattr(apiary.sandbox, name) is not None


def test_wrap_argv_shape_and_plan() -> None:
    policy = ExecutionPolicy(
        network=NetworkPolicy.EGRESS_RESTRICTED,
        privilege=PrivilegeLevel.DEFAULT,
        allowlist=(HostPort("example.com", 443),),
        budget_cpu_ms=100,
    )

    argv = wrap_argv(["server", "--stdio"], policy, cwd=Path("/work/tree"))

    assert argv[:3] == [sys.executable, "-m", "apiary.sandbox.launch"]
    assert argv[4:] == ["--", "server", "--stdio"]
    plan = LaunchPlan.decode(argv[3])
    assert plan.network is NetworkPolicy.EGRESS_RESTRICTED
    assert plan.privilege is PrivilegeLevel.DEFAULT
    assert plan.allowlist == (HostPort("example.com", 443),)
    assert plan.cwd == "/work/tree"
    assert (plan.env_fd, plan.cpu_limit_s, plan.report_fd) == (-1, 0, -1)  # spawner's business


def test_plan_round_trips_and_rejects_garbage() -> None:
    plan = LaunchPlan(
        network=NetworkPolicy.FULL_ACCESS,
        privilege=PrivilegeLevel.ELEVATED,
        allowlist=(HostPort("::1", 80),),
        cwd="/a b",
        env_fd=5,
        cpu_limit_s=3,
        report_fd=7,
    )
    assert LaunchPlan.decode(plan.encode()) == plan
    for bad in ["", "v2.e30", "v1.!!!", "v1." + "e30"]:
        with pytest.raises(ValidationError):
            LaunchPlan.decode(bad)


@pytest.mark.parametrize("network", list(NetworkPolicy))
@pytest.mark.parametrize("privilege", list(PrivilegeLevel))
def test_which_mechanism_each_policy_value_turns_on(
    network: NetworkPolicy, privilege: PrivilegeLevel
) -> None:
    # The table docs/sandbox.md describes, cell by cell.
    plan = LaunchPlan(network=network, privilege=privilege)
    confined = privilege in (PrivilegeLevel.MINIMAL, PrivilegeLevel.DEFAULT)
    own_network = network in (NetworkPolicy.DENY_ALL, NetworkPolicy.EGRESS_RESTRICTED)
    assert plan.new_netns is own_network
    assert plan.relay is (network is NetworkPolicy.EGRESS_RESTRICTED)
    assert plan.no_listen is (network is NetworkPolicy.EGRESS_UNRESTRICTED)
    assert plan.confine_fs is confined
    assert plan.no_new_privs is confined
    assert plan.new_mountns is (confined or network is NetworkPolicy.EGRESS_RESTRICTED)
    assert plan.no_spawn is (privilege is PrivilegeLevel.MINIMAL)
    assert plan.bounded_capabilities is (privilege is PrivilegeLevel.ELEVATED)


def test_seccomp_filters_exist_for_the_supported_architectures() -> None:
    for machine in ("x86_64", "aarch64"):
        assert build_filter(no_spawn=True, no_listen=True, machine=machine)
    with pytest.raises(SeccompUnavailableError):
        build_filter(no_spawn=True, no_listen=False, machine="sparc")


@requires_root
def test_a_wrapped_command_is_confined_and_exits_as_the_tool_did() -> None:
    # What the MCP SDK's stdio client does: spawn the argv, talk over stdin/stdout, wait.
    probe = (
        "import socket, sys\n"
        "print(sys.stdin.readline().strip().upper(), flush=True)\n"
        "print(sorted(n for _, n in socket.if_nameindex()), flush=True)\n"
        "sys.exit(3)\n"
    )
    argv = wrap_argv(python(probe), ExecutionPolicy())

    done = subprocess.run(argv, input=b"hello\n", capture_output=True, timeout=10, check=False)

    assert done.stdout == b"HELLO\n['lo']\n"
    assert done.returncode == 3


@requires_root
def test_a_wrapped_command_forwards_sigterm_and_dies_of_it() -> None:
    argv = wrap_argv(
        python("import sys, time; print('up', flush=True); time.sleep(30)"), ExecutionPolicy()
    )
    with subprocess.Popen(argv, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"up\n"
        proc.terminate()  # the launcher's pid only, as Popen.terminate does
        assert proc.wait(timeout=5) == -signal.SIGTERM


@requires_root
def test_a_wrapped_command_whose_tool_is_killed_dies_of_sigkill_too() -> None:
    # What a budget's kill looks like when the tool dies before the launcher is killed (the
    # launcher reaps it first): the launcher mirrors SIGKILL, which takes no handler.
    argv = wrap_argv(
        python("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"), ExecutionPolicy()
    )

    done = subprocess.run(argv, capture_output=True, timeout=10, check=False)

    assert done.returncode == -signal.SIGKILL, done.stderr


@requires_root
async def test_process_cpu_ms_counts_a_process_and_its_children() -> None:
    # A parent that sleeps while its child spins: the tree's total grows, the parent's own
    # CPU does not.
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
        "print('up', flush=True)\n"
        "time.sleep(30)\n"
    )
    proc = await asyncio.create_subprocess_exec(
        *python(code), stdout=asyncio.subprocess.PIPE, start_new_session=True
    )
    assert proc.stdout is not None
    try:
        await proc.stdout.readline()
        first, parent_first = process_cpu_ms(proc.pid), _own_cpu_ms(proc.pid)
        for _ in range(300):  # a loaded machine gives the child less CPU; wait up to 3 s
            await asyncio.sleep(0.01)
            if process_cpu_ms(proc.pid) - first >= 100:
                break
        assert process_cpu_ms(proc.pid) - first >= 100
        assert _own_cpu_ms(proc.pid) - parent_first < 50
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
    assert process_cpu_ms(proc.pid) == 0  # gone


def _own_cpu_ms(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as file:
        fields = file.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 // os.sysconf("SC_CLK_TCK")


@requires_root
async def test_the_default_environment_is_minimal() -> None:
    probe = "import json, os; print(json.dumps(dict(os.environ)))"

    result = await run(SandboxSpec(python(probe), ExecutionPolicy()))

    env = json.loads(result.stdout)
    assert set(env) == {"PATH", "LANG", "HOME"}
    assert env["HOME"] == PRIVATE_WORKDIR  # MINIMAL's private working directory


@requires_root
async def test_an_explicit_environment_reaches_the_tool_but_not_the_command_line() -> None:
    probe = (
        "import os, sys\n"
        "print(os.environ['API_TOKEN'], sys.stdin.read(), flush=True)\n"
        "sys.stdin.close()\n"
        "import time; time.sleep(5)\n"
    )
    spec = SandboxSpec(
        python(probe), ExecutionPolicy(), env={"API_TOKEN": "s3cret"}, stdin=b"from stdin"
    )

    async with await start(spec) as process:
        first = await anext(aiter(process.chunks()))
        command_line = _command_line(process.pid)

    assert first == b"s3cret from stdin\n"
    assert b"s3cret" not in command_line  # /proc/PID/cmdline is readable by every local user


def _command_line(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as file:
        return base64.urlsafe_b64decode(file.read().split(b"\0")[3][3:])


def test_the_allowlist_resolves_to_routes_and_a_hosts_file() -> None:
    routes = netns.resolve((HostPort("127.0.0.1", 8080), HostPort("localhost", 9090)))

    by_host = {(route.host, route.port): route for route in routes}
    literal = by_host[("127.0.0.1", 8080)]
    assert (literal.address, literal.candidates) == ("127.0.0.1", ("127.0.0.1",))
    named = by_host[("localhost", 9090)]
    assert named.address in named.candidates  # the relay tries every address of the name
    hosts = netns.hosts_file(routes, "127.0.0.1 original\n")
    assert hosts.startswith(f"{named.address} localhost\n")  # allowlisted names come first
    assert hosts.endswith("127.0.0.1 original\n")
    assert "127.0.0.1 127.0.0.1" not in hosts  # literals need no entry
