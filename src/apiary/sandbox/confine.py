"""The launcher's child: enter the namespaces, build the filesystem, drop privileges, exec.

Runs in a forked copy of the launcher, as the spawner's uid. With a PID namespace (MINIMAL and
DEFAULT) this process is PID 1 of it: it sets up the network and mount namespaces, forks the tool
(PID 2), forwards signals to it and reaps whatever else the tool leaves behind; when the tool
exits, so does PID 1, and the kernel kills everything left in the namespace. Without a PID
namespace the child becomes the tool itself.

Any failure before exec is written to the status pipe as one JSON object and the process exits:
the launcher reports it and nothing runs unconfined.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn, ParamSpec, TypeVar

from apiary.sandbox import linux, mounts, netns, privilege, program
from apiary.sandbox.plan import LaunchPlan
from apiary.sandbox.proctree import send_signal

P = ParamSpec("P")
R = TypeVar("R")

FORWARDED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
EXIT_SETUP_FAILED = 126
EXIT_EXEC_FAILED = 127


class SetupError(Exception):
    """A confinement step failed; `code` is the protocol error code to report."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Child:
    plan: LaunchPlan
    argv: Sequence[str]
    routes: list[netns.Route]
    hosts: str | None
    channel: socket.socket | None
    """Where the listening sockets of EGRESS_RESTRICTED go (the launcher's relay)."""
    status_fd: int
    """Close-on-exec: EOF tells the launcher the tool was executed; bytes are a SetupError."""
    result_fd: int
    """PID 1 writes the tool's wait status here before it exits."""
    idmap_fd: int | None
    """A user namespace for the idmapped working directory (see mounts.idmap_userns)."""
    root: bool
    """The launcher started as root (privilege.is_root)."""
    env: dict[str, str]
    """The tool's environment."""

    def run(self) -> NoReturn:
        try:
            # If the launcher dies, so does this child (and, as PID 1, its whole namespace).
            linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
            self._run()
        except SetupError as exc:
            _fail(self.status_fd, exc.code, exc.message, EXIT_SETUP_FAILED)
        except BaseException as exc:  # nothing may run unconfined after an unexpected error
            import traceback  # noqa: PLC0415 - only on this path; the launcher starts lighter

            where = traceback.extract_tb(exc.__traceback__)[-1]
            detail = f"{exc!r} at {os.path.basename(where.filename)}:{where.lineno}"
            _fail(self.status_fd, "internal_error", detail, EXIT_SETUP_FAILED)

    def _run(self) -> NoReturn:
        policy = f"network_policy={self.plan.network}"
        if self.plan.new_netns:
            _step(policy, "create a network namespace", linux.unshare, linux.CLONE_NEWNET)
        if self.plan.relay:
            _step(policy, "set up the egress listeners", self._hand_over_listeners)
        env = dict(self.env)
        workdir = self.plan.cwd
        if self.plan.new_mountns:
            setup = self._mount_setup(env)
            what = f"privilege_level={self.plan.privilege}"
            workdir = _step(what, "confine the filesystem", setup.apply)
        if self.plan.confine_fs:
            self._init(env, workdir)
        self._exec(env, workdir)

    def _hand_over_listeners(self) -> None:
        assert self.channel is not None
        sockets = netns.listeners(self.routes)
        socket.send_fds(self.channel, [b"L"], [s.fileno() for s in sockets])
        for sock in sockets:
            sock.close()
        self.channel.close()

    def _mount_setup(self, env: dict[str, str]) -> mounts.MountSetup:
        for path in self.plan.expose:
            if not os.path.isdir(path):
                raise SetupError("spawn_failed", f"expose: {path}: no such directory")
            if (problem := program.broad_reason(os.path.realpath(path))) is not None:
                raise SetupError("permission_denied", f"expose: {path}: {problem}")
        needed = [sys.base_prefix, sys.prefix, *self.plan.expose]
        search_path = env.get("PATH", os.defpath)
        program_path = shutil.which(self.argv[0], path=search_path)
        if program_path:
            # What the program needs to run: its interpreter, virtual environment, node_modules.
            needed += program.needed_dirs(program_path, search_path)
        expose: list[str] = []
        if privilege.drops_uid(self.plan, root=self.root):
            expose = mounts.blocked_paths(needed)
        if self.plan.confine_fs:
            # The private /tmp hides whatever lives under the host's /tmp (a checkout, a
            # virtual environment): bring the interpreter and the program back, read-only.
            expose += mounts.under_private_tmp(needed)
        return mounts.MountSetup(
            confine=self.plan.confine_fs,
            cwd=self.plan.cwd,
            for_nobody=privilege.drops_uid(self.plan, root=self.root),
            idmap_userns_fd=self.idmap_fd,
            expose=mounts.outermost(expose),
            hosts=self.hosts,
            new_proc=self.plan.confine_fs,
        )

    def _init(self, env: dict[str, str], workdir: str | None) -> NoReturn:
        """PID 1: run the tool as PID 2, forward signals, reap, report its status, exit."""
        # PID 1 only receives signals it handles: hold them until the handlers are in place.
        signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
        tool = os.fork()
        if tool == 0:
            self._exec(env, workdir)
        for signum in FORWARDED_SIGNALS:
            signal.signal(signum, lambda s, _f: send_signal(tool, s))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)
        os.close(self.status_fd)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)  # the tool's pipes close when the tool's side closes them
        os.close(devnull)
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == tool:
                os.write(self.result_fd, struct.pack("i", status))
                os._exit(0)

    def _exec(self, env: dict[str, str], workdir: str | None) -> NoReturn:
        what = f"privilege_level={self.plan.privilege}"
        os.setpgid(0, 0)  # signals reach the tool once, through the launcher's forwarding
        if self.plan.confine_fs and workdir is not None:
            env.setdefault("HOME", workdir)
        _step(what, "drop privileges", privilege.apply, self.plan, root=self.root)
        if workdir is not None:
            _step(what, f"enter the working directory {workdir}", os.chdir, workdir)
        os.closerange(3, self.status_fd)
        os.closerange(self.status_fd + 1, 1 << 16)
        for signum in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these; tools expect not
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        try:
            os.execvpe(self.argv[0], list(self.argv), env)
        except OSError as exc:
            _fail(
                self.status_fd, "spawn_failed", f"{self.argv[0]}: {exc.strerror}", EXIT_EXEC_FAILED
            )


def _step(what: str, action: str, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """Run one confinement step; an OSError fails closed, naming the policy it serves."""
    try:
        return fn(*args, **kwargs)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise SetupError("permission_denied", f"{what}: cannot {action}: {reason}") from exc


def _fail(status_fd: int, code: str, message: str, exit_code: int) -> NoReturn:
    try:
        os.write(status_fd, json.dumps({"code": code, "message": message}).encode())
    finally:
        os._exit(exit_code)
