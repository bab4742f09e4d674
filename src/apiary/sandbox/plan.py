"""What the launcher enforces, decided from an ExecutionPolicy, and its one-argument encoding.

The launcher (`python -m apiary.sandbox.launch PLAN -- argv...`) receives a `LaunchPlan` as one
argv element: versioned JSON in URL-safe base64, so it survives any spawner (the MCP SDK's
stdio client included) without quoting. Every decision of the form "which policy value turns on
which mechanism" lives in the properties below, so the table in docs/sandbox.md has one source.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Final

from apiary.core.tools.policy import ExecutionPolicy, HostPort, NetworkPolicy, PrivilegeLevel
from apiary.errors import PermissionDeniedError, ValidationError
from apiary.sandbox.program import expose_problem

_PREFIX: Final = "v1."

NOBODY: Final = 65534
"""The uid and gid MINIMAL and DEFAULT tools run as when the coordinator is root."""

ELEVATED_CAPABILITIES: Final = frozenset({0, 1, 2, 3, 10})
"""What ELEVATED keeps as root: CHOWN, DAC_OVERRIDE, DAC_READ_SEARCH, FOWNER,
NET_BIND_SERVICE (privileged ports, protected files); never SYS_ADMIN, so no namespace escape."""


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """The restrictions for one sandboxed process, as the launcher applies them."""

    network: NetworkPolicy = NetworkPolicy.DENY_ALL
    privilege: PrivilegeLevel = PrivilegeLevel.MINIMAL
    allowlist: tuple[HostPort, ...] = ()
    cwd: str | None = None
    """The working directory; None gives MINIMAL and DEFAULT a private empty tmpfs and leaves
    ELEVATED and PRIVILEGED in the spawner's directory."""
    env_fd: int = -1
    """A file holding the tool's environment as JSON (never argv: /proc/PID/cmdline is
    readable by every local user); -1 passes the launcher's own environment through."""
    cpu_limit_s: int = 0
    """RLIMIT_CPU for the tool process, the backstop behind the CPU monitor (0 = none)."""
    report_fd: int = -1
    """Where the launcher reports to `start()` (JSON lines); -1 reports errors on stderr."""
    expose: tuple[str, ...] = ()
    """Directories a confined tool needs beyond what the launcher infers from its program
    (program.py): shown read-only where the sandbox would hide them."""

    @classmethod
    def from_policy(
        cls,
        policy: ExecutionPolicy,
        *,
        cwd: str | None = None,
        env_fd: int = -1,
        cpu_limit_s: int = 0,
        report_fd: int = -1,
        expose: tuple[str, ...] = (),
    ) -> LaunchPlan:
        """The plan for `policy`; fails closed on an allowlist this sandbox cannot enforce.
        Raises ValidationError for an `expose` entry that is relative or too broad."""
        for path in expose:
            if (problem := expose_problem(path)) is not None:
                raise ValidationError(
                    f"expose: {path}: {problem}", {"field": "expose", "path": path}
                )
        if policy.network is NetworkPolicy.EGRESS_RESTRICTED:
            for entry in policy.allowlist:
                if entry.port == 0:
                    raise PermissionDeniedError(
                        f"network_policy=EGRESS_RESTRICTED: allowlist entry {entry} has no port;"
                        " the sandbox can only enforce host:port pairs",
                        {"field": "allowlist", "entry": str(entry)},
                    )
        return cls(
            network=policy.network,
            privilege=policy.privilege,
            allowlist=policy.allowlist if policy.network is NetworkPolicy.EGRESS_RESTRICTED else (),
            cwd=cwd,
            env_fd=env_fd,
            cpu_limit_s=cpu_limit_s,
            report_fd=report_fd,
            expose=expose,
        )

    # ---- which mechanism each policy value turns on -------------------------------------------

    @property
    def new_netns(self) -> bool:
        """DENY_ALL and EGRESS_RESTRICTED run in a network namespace of their own."""
        return self.network in (NetworkPolicy.DENY_ALL, NetworkPolicy.EGRESS_RESTRICTED)

    @property
    def relay(self) -> bool:
        """EGRESS_RESTRICTED reaches its allowlist only through the launcher's relay."""
        return self.network is NetworkPolicy.EGRESS_RESTRICTED

    @property
    def confine_fs(self) -> bool:
        """MINIMAL and DEFAULT: read-only filesystem but the working directory, private /tmp,
        their own PID namespace and /proc."""
        return self.privilege in (PrivilegeLevel.MINIMAL, PrivilegeLevel.DEFAULT)

    @property
    def new_mountns(self) -> bool:
        """Confined tools, and relayed ones (their allowlisted names go into /etc/hosts)."""
        return self.confine_fs or self.relay

    @property
    def no_spawn(self) -> bool:
        """MINIMAL may not create processes (threads are fine)."""
        return self.privilege is PrivilegeLevel.MINIMAL

    @property
    def no_listen(self) -> bool:
        """EGRESS_UNRESTRICTED shares the host's network, so inbound is blocked by refusing
        listen(2); the other values either have no reachable network or allow inbound."""
        return self.network is NetworkPolicy.EGRESS_UNRESTRICTED

    @property
    def no_new_privs(self) -> bool:
        """MINIMAL and DEFAULT never gain privileges (setuid binaries, file capabilities)."""
        return self.confine_fs

    @property
    def bounded_capabilities(self) -> bool:
        """ELEVATED keeps the coordinator's uid but only ELEVATED_CAPABILITIES."""
        return self.privilege is PrivilegeLevel.ELEVATED

    # ---- encoding -------------------------------------------------------------------------------

    def encode(self) -> str:
        doc = {
            "network": str(self.network),
            "privilege": str(self.privilege),
            "allowlist": [[entry.host, entry.port] for entry in self.allowlist],
            "cwd": self.cwd,
            "env_fd": self.env_fd,
            "cpu_limit_s": self.cpu_limit_s,
            "report_fd": self.report_fd,
            "expose": list(self.expose),
        }
        raw = json.dumps(doc, separators=(",", ":")).encode()
        return _PREFIX + base64.urlsafe_b64encode(raw).decode()

    @classmethod
    def decode(cls, text: str) -> LaunchPlan:
        if not text.startswith(_PREFIX):
            raise ValidationError.for_field("plan", "not an apiary sandbox plan (v1)")
        try:
            doc = json.loads(base64.urlsafe_b64decode(text[len(_PREFIX) :]))
            return cls(
                network=NetworkPolicy(doc["network"]),
                privilege=PrivilegeLevel(doc["privilege"]),
                allowlist=tuple(HostPort(str(h), int(p)) for h, p in doc["allowlist"]),
                cwd=None if doc["cwd"] is None else str(doc["cwd"]),
                env_fd=int(doc["env_fd"]),
                cpu_limit_s=int(doc["cpu_limit_s"]),
                report_fd=int(doc["report_fd"]),
                expose=tuple(str(path) for path in doc.get("expose", [])),
            )
        except (ValueError, KeyError, TypeError, binascii.Error) as exc:
            raise ValidationError.for_field("plan", f"malformed: {exc}") from None
