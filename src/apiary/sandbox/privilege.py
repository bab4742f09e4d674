"""The last steps before exec: who the tool runs as and what it may still do.

- MINIMAL and DEFAULT, coordinator running as root: no supplementary groups, uid and gid NOBODY
  (which drops every capability), no_new_privs.
- MINIMAL and DEFAULT, coordinator not root: the coordinator's uid (inside the launcher's user
  namespace, with no capability left after exec), no_new_privs.
- ELEVATED as root: the coordinator's uid with only ELEVATED_CAPABILITIES in the bounding set,
  no ambient or inheritable capabilities; without CAP_SYS_ADMIN it cannot leave its namespaces.
- PRIVILEGED: unchanged.

Then the seccomp filter (no_spawn, no_listen) and RLIMIT_CPU, the CPU budget's backstop.
"""

from __future__ import annotations

import os
import resource
import signal

from apiary.sandbox import linux, seccomp
from apiary.sandbox.plan import ELEVATED_CAPABILITIES, NOBODY, LaunchPlan


def is_root() -> bool:
    """Root in the initial user namespace: uid 0 with CAP_SYS_ADMIN (asked before the launcher
    enters any namespace). Anything else keeps its uid and confines itself in a user namespace."""
    return os.geteuid() == 0 and linux.has_capability(linux.CAP_SYS_ADMIN)


def drops_uid(plan: LaunchPlan, *, root: bool) -> bool:
    return plan.confine_fs and root


def apply(plan: LaunchPlan, *, root: bool) -> None:
    """Drop what `plan` says; raises OSError if any step fails (the launcher then fails closed)."""
    if drops_uid(plan, root=root):
        os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)
    elif plan.confine_fs:
        _bound_capabilities(keep=frozenset())  # uid 0 in a user namespace keeps nothing either
    elif plan.bounded_capabilities and root:
        _bound_capabilities(keep=ELEVATED_CAPABILITIES)
    if plan.no_new_privs:
        linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)
    # Changing credentials cleared the parent-death signal; the tool must not outlive its
    # launcher (which holds its relay and reaps it).
    linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
    if plan.cpu_limit_s > 0:
        resource.setrlimit(resource.RLIMIT_CPU, (plan.cpu_limit_s, plan.cpu_limit_s + 1))
    if plan.no_spawn or plan.no_listen:
        if not root:
            linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)  # seccomp needs it without CAP_SYS_ADMIN
        seccomp.install(no_spawn=plan.no_spawn, no_listen=plan.no_listen)


def _bound_capabilities(*, keep: frozenset[int]) -> None:
    for cap in range(linux.last_capability() + 1):
        if cap not in keep:
            linux.prctl(linux.PR_CAPBSET_DROP, cap)
    linux.prctl(linux.PR_CAP_AMBIENT, linux.PR_CAP_AMBIENT_CLEAR_ALL)
    linux.clear_inheritable_capabilities()
