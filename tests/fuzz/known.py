"""Faults the fuzzer found whose cause lies outside the transports (a handler, the engine
or the store failing on a value), listed until they are fixed: each names the method, the
input and what fails.

A method with a fault on most inputs is in KNOWN_FAULTS: `params` marks it xfail
(strict=False, so that the fix turns it green). A fault of a narrow input is a predicate in
KNOWN_INPUTS: `unexpected` lets exactly those inputs through while every other input of the
method is still checked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest

from apiary.wire.services import RpcMethod
from tests.fuzz.cases import Fault

KNOWN_FAULTS: dict[tuple[str, str], str] = {}
"""(transport, method path) -> the known fault of that method on that transport. A fault
that depends on what earlier examples left behind, not on one request alone, marks the
whole method."""
KNOWN_INPUTS: dict[tuple[str, str], tuple[str, Callable[[Any], bool]]] = {}
"""(transport, method path) -> (the known fault, whether an input runs into it)."""


def params(methods: Iterable[RpcMethod], transport: str) -> list[Any]:
    """pytest parameters for `methods`, known faulty ones marked xfail with their reason."""
    out = []
    for method in methods:
        reason = KNOWN_FAULTS.get((transport, method.path))
        marks = [pytest.mark.xfail(strict=False, reason=reason)] if reason else []
        out.append(pytest.param(method, id=method.path.lstrip("/"), marks=marks))
    return out


def unexpected(method: RpcMethod, transport: str, request: Any, faults: list[Fault]) -> list[Fault]:
    """`faults` without those of a known narrow fault that `request` runs into."""
    known = KNOWN_INPUTS.get((transport, method.path))
    if faults and known is not None and known[1](request):
        return []
    return faults
