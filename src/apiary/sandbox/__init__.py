"""Run tools under their ExecutionPolicy (RFC 18.5) on real, confined subprocesses.

A leaf package: the standard library, apiary.core and apiary.errors only. See docs/sandbox.md
for what each policy value does here and what needs root.

The exports load on first use: `python -m apiary.sandbox.launch` starts with this package,
and every tool start pays for what it imports (asyncio alone would double the launcher's start).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from apiary.sandbox.process import SandboxedProcess as SandboxedProcess
    from apiary.sandbox.process import SandboxSpec as SandboxSpec
    from apiary.sandbox.process import run as run
    from apiary.sandbox.process import start as start
    from apiary.sandbox.process import wrap_argv as wrap_argv
    from apiary.sandbox.proctree import process_cpu_ms as process_cpu_ms
    from apiary.sandbox.result import Outcome as Outcome
    from apiary.sandbox.result import SandboxResult as SandboxResult
    from apiary.sandbox.result import error_for as error_for

_EXPORTS = {
    "Outcome": "apiary.sandbox.result",
    "SandboxResult": "apiary.sandbox.result",
    "error_for": "apiary.sandbox.result",
    "SandboxSpec": "apiary.sandbox.process",
    "SandboxedProcess": "apiary.sandbox.process",
    "run": "apiary.sandbox.process",
    "start": "apiary.sandbox.process",
    "wrap_argv": "apiary.sandbox.process",
    "process_cpu_ms": "apiary.sandbox.proctree",
}

__all__ = [
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


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'apiary.sandbox' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
