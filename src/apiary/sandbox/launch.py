"""`python -m apiary.sandbox.launch PLAN -- argv...`: run argv under a LaunchPlan.

This process is the launcher (the supervisor): it stays in the host's namespaces with the
spawner's credentials, forks the confined child (see confine.py), runs the egress relay for
EGRESS_RESTRICTED, forwards termination signals to the tool, reaps everything the tool leaves
behind (it is a child subreaper), and exits as the tool did: same exit code, or killed by the
same signal. So a spawner that knows nothing about the sandbox (the MCP SDK's stdio client)
sees the tool's own exit.

With `report_fd` in the plan it tells `start()` what happened as JSON lines:
{"event": "started"}, {"event": "error", "code", "message"} or {"event": "exit", "cpu_ms"};
without one it writes errors to stderr. Setup failures exit 126, exec failures 127.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import struct
import sys
from dataclasses import dataclass
from typing import Final, NoReturn

from apiary.errors import ValidationError
from apiary.sandbox import linux, mounts, netns, privilege
from apiary.sandbox.confine import (
    EXIT_EXEC_FAILED,
    EXIT_SETUP_FAILED,
    FORWARDED_SIGNALS,
    Child,
    SetupError,
)
from apiary.sandbox.plan import LaunchPlan
from apiary.sandbox.proctree import descendants, send_signal


class Reporter:
    """The launcher's channel to `start()`, or stderr when nobody listens."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._stderr = os.dup(2)
        if fd >= 0:
            os.set_inheritable(fd, False)

    def send(self, event: str, **fields: object) -> None:
        if self._fd >= 0:
            line = json.dumps({"event": event, **fields}) + "\n"
            with contextlib.suppress(OSError):  # start() gone away: the tool still ends well
                os.write(self._fd, line.encode())
        elif event == "error":
            os.write(
                self._stderr, f"apiary.sandbox: {fields['code']}: {fields['message']}\n".encode()
            )

    def release_stderr(self) -> None:
        os.close(self._stderr)


def main(argv: list[str] | None = None) -> NoReturn:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[1] != "--":
        sys.stderr.write("usage: python -m apiary.sandbox.launch PLAN -- ARGV...\n")
        sys.exit(2)
    try:
        plan = LaunchPlan.decode(args[0])
    except ValidationError as exc:
        sys.stderr.write(f"apiary.sandbox: {exc}\n")
        sys.exit(2)
    reporter = Reporter(plan.report_fd)
    # A signal meant for the tool may come as soon as it runs, before the forwarding is in
    # place (the relay imports asyncio first): held until then, not the launcher's death. The
    # child unblocks them before it executes the tool.
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
    try:
        running = _spawn(plan, args[2:], reporter)
    except SetupError as exc:
        reporter.send("error", code=exc.code, message=exc.message)
        os._exit(EXIT_SETUP_FAILED)
    _supervise(running, reporter)


@dataclass
class _Running:
    child: int
    result_fd: int | None
    """PID 1 of the tool's PID namespace reports the tool's wait status here."""
    routes: list[netns.Route]
    listeners: list[socket.socket] | None


def _spawn(plan: LaunchPlan, argv: list[str], reporter: Reporter) -> _Running:
    """Fork the confined child; return once the tool runs (or report why it does not)."""
    env = _tool_env(plan)
    routes, hosts = _egress(plan)
    root = privilege.is_root()
    idmap_fd = _idmap_for(plan, root=root)
    _enter_namespaces_parent(plan, root=root)
    status_r, status_w = os.pipe()
    result_r, result_w = os.pipe() if plan.confine_fs else (None, -1)
    ours, theirs = socket.socketpair() if plan.relay else (None, None)
    pid = os.fork()
    if pid == 0:
        for fd in (status_r, plan.report_fd, *([result_r] if result_r is not None else [])):
            if fd >= 0:
                os.close(fd)
        if ours is not None:
            ours.close()
        Child(plan, argv, routes, hosts, theirs, status_w, result_w, idmap_fd, root, env).run()
    for fd in (status_w, result_w, -1 if idmap_fd is None else idmap_fd):
        if fd >= 0:
            os.close(fd)
    linux.prctl(linux.PR_SET_CHILD_SUBREAPER, 1)
    listeners = None
    if ours is not None:
        assert theirs is not None
        theirs.close()
        # Empty when the child failed before it could listen; it reports why below.
        _, fds, _, _ = socket.recv_fds(ours, 16, max(len(routes), 1))
        ours.close()
        listeners = [socket.socket(fileno=fd) for fd in fds]
    _await_exec(pid, status_r, reporter)
    return _Running(pid, result_r, routes, listeners)


def _await_exec(pid: int, status_r: int, reporter: Reporter) -> None:
    """EOF on the status pipe: the tool was executed. Bytes: why it was not."""
    failure = _read_all(status_r)
    if failure:
        os.waitpid(pid, 0)
        detail = json.loads(failure)
        reporter.send("error", code=detail["code"], message=detail["message"])
        os._exit(EXIT_EXEC_FAILED if detail["code"] == "spawn_failed" else EXIT_SETUP_FAILED)
    reporter.send("started", pid=pid)
    reporter.release_stderr()


def _egress(plan: LaunchPlan) -> tuple[list[netns.Route], str | None]:
    """The relayed routes (resolved here, in the host's namespace) and the /etc/hosts that
    names them inside, when any allowlisted host is a name."""
    routes = netns.resolve(plan.allowlist) if plan.relay else []
    if all(netns.is_ip(route.host) for route in routes):
        return routes, None
    with open("/etc/hosts") as file:
        return routes, netns.hosts_file(routes, file.read())


def _idmap_for(plan: LaunchPlan, *, root: bool) -> int | None:
    """The user namespace that idmaps the working directory to the sandbox user."""
    if not privilege.drops_uid(plan, root=root) or plan.cwd is None:
        return None
    try:
        st = os.stat(plan.cwd)
        return mounts.idmap_userns(st.st_uid, st.st_gid)
    except OSError as exc:
        raise SetupError(
            "permission_denied",
            f"privilege_level={plan.privilege}: cannot map {plan.cwd} to the sandbox user:"
            f" {exc.strerror or exc}",
        ) from exc


def _tool_env(plan: LaunchPlan) -> dict[str, str]:
    if plan.env_fd < 0:
        return dict(os.environ)
    os.lseek(plan.env_fd, 0, os.SEEK_SET)
    env: dict[str, str] = json.loads(_read_all(plan.env_fd))
    return env


def _enter_namespaces_parent(plan: LaunchPlan, *, root: bool) -> None:
    """Namespaces the launcher itself must be in before it forks: the PID namespace (entered
    by its child) and, when not root, a user namespace that lets the launcher create
    the others. Where neither works the launch fails closed: nothing runs unconfined."""
    needs_namespaces = plan.new_netns or plan.new_mountns
    if needs_namespaces and not root:
        what = f"network_policy={plan.network}, privilege_level={plan.privilege}"
        try:
            _enter_own_userns()
        except OSError as exc:
            raise SetupError(
                "permission_denied",
                f"{what}: cannot create the namespaces it needs (no CAP_SYS_ADMIN, and no"
                f" user namespace: {exc.strerror or exc})",
            ) from exc
    if plan.confine_fs:
        try:
            linux.unshare(linux.CLONE_NEWPID)
        except OSError as exc:
            raise SetupError(
                "permission_denied",
                f"privilege_level={plan.privilege}: cannot create a PID namespace: {exc.strerror}",
            ) from exc


def _enter_own_userns() -> None:
    uid, gid = os.geteuid(), os.getegid()
    linux.unshare(linux.CLONE_NEWUSER)
    with open("/proc/self/setgroups", "w") as file:
        file.write("deny\n")
    with open("/proc/self/uid_map", "w") as file:
        file.write(f"{uid} {uid} 1\n")
    with open("/proc/self/gid_map", "w") as file:
        file.write(f"{gid} {gid} 1\n")


def _supervise(running: _Running, reporter: Reporter) -> NoReturn:
    """Forward signals, relay, reap until the tool is gone, report, exit as the tool did."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)  # only the tool holds its pipes: EOF when it and its children exit
    os.close(devnull)
    child = running.child
    if running.listeners is not None:
        from apiary.sandbox import relay  # noqa: PLC0415 - asyncio only for EGRESS_RESTRICTED

        status = relay.relay_until_exit(
            child, running.routes, running.listeners, send_signal, FORWARDED_SIGNALS
        )
    else:
        for signum in FORWARDED_SIGNALS:
            signal.signal(signum, lambda s, _f: send_signal(child, s))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)
        status = _reap_until(child)
    if running.result_fd is not None:
        raw = _read_all(running.result_fd)
        if len(raw) == 4:  # PID 1 reported the tool's own status
            status = struct.unpack("i", raw)[0]
    _reap_rest()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    reporter.send("exit", cpu_ms=round((usage.ru_utime + usage.ru_stime) * 1000))
    _exit_like(status)


def _reap_until(child: int) -> int:
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            return status


def _reap_rest() -> None:
    """Kill and reap what the tool left behind (orphans re-parented to this subreaper)."""
    while True:
        for pid in descendants(os.getpid()):
            send_signal(pid, signal.SIGKILL)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _exit_like(status: int) -> NoReturn:
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        linux.prctl(linux.PR_SET_DUMPABLE, 0)  # mirroring SIGSEGV must not dump our core
        # SIGKILL takes no handler (signal.signal raises): a tool killed by it (a budget's
        # kill that reached the tool before this launcher) made the launcher exit 1 instead.
        if signum not in _UNCATCHABLE:
            signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128)


_UNCATCHABLE: Final = frozenset({signal.SIGKILL, signal.SIGSTOP})


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


if __name__ == "__main__":
    main()
