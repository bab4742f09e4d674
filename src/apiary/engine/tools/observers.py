"""Who watches tool calls run: the runtime control plane sees a call made inside a turn or
an agent task as one of its processes (controlplane/processes.py).

The tool service tells each observer when a call starts running, what output its provider
produced (every attempt's, streamed or not) and when it ended. The notices are synchronous
and must be quick: an observer copies what it needs and does its own I/O later, so that a
slow or failing observer never holds up or breaks a call (a failure is logged, the call
goes on).
"""

from __future__ import annotations

import logging
from typing import Protocol

from apiary.engine.tools.calls import PendingCall

log = logging.getLogger("apiary.tools")


class CallObserver(Protocol):
    def call_started(self, call: PendingCall) -> None:
        """The call was approved and its first attempt starts."""
        ...

    def call_output(self, call: PendingCall, data: bytes) -> None:
        """The provider produced `data` (a frame's payload, not empty)."""
        ...

    def call_finished(self, call: PendingCall) -> None:
        """The call has ended (`call.state` is terminal, `call.error_code` says why)."""
        ...


class CallObservers:
    """The observers of one tool service (module docstring)."""

    def __init__(self) -> None:
        self._observers: list[CallObserver] = []

    def add(self, observer: CallObserver) -> None:
        self._observers.append(observer)

    def remove(self, observer: CallObserver) -> None:
        if observer in self._observers:
            self._observers.remove(observer)

    def started(self, call: PendingCall) -> None:
        for observer in list(self._observers):
            _notify(observer.call_started, call)

    def output(self, call: PendingCall, data: bytes) -> None:
        for observer in list(self._observers):
            _notify(observer.call_output, call, data)

    def finished(self, call: PendingCall) -> None:
        for observer in list(self._observers):
            _notify(observer.call_finished, call)


def _notify(notice: object, *args: object) -> None:
    try:
        notice(*args)  # type: ignore[operator]
    except Exception:
        log.exception("a tool call observer failed (the call goes on)")
