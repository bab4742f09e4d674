"""`apiary`'s public exports are pinned: agent authors import these names from the top level,
so adding, removing or moving one is a decision, made here on purpose."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import apiary

PINNED = {
    "Ack": "apiary.core.envelope",
    "AckStage": "apiary.core.envelope",
    "Agent": "apiary.sdk.agent",
    "ApiaryError": "apiary.errors",
    "Client": "apiary.sdk.client",
    "Connection": "apiary.sdk.connection",
    "Delivery": "apiary.sdk.connection",
    "Envelope": "apiary.core.envelope",
    "Handoff": "apiary.sdk.handoff",
    "HandoffTicket": "apiary.sdk.handoff",
    "Message": "apiary.sdk.agent",
    "MessageType": "apiary.core.envelope",
    "Preempted": "apiary.sdk.tasks",
    "Rejected": "apiary.sdk.agent",
    "RuntimeClient": "apiary.sdk.runtime",
    "SchedulerClient": "apiary.sdk.scheduler",
    "TaskContext": "apiary.sdk.tasks",
    "TaskFailedError": "apiary.sdk.errors",
    "TaskHandle": "apiary.sdk.task_handle",
    "TaskHeldError": "apiary.sdk.errors",
    "TaskStatus": "apiary.sdk.task_handle",
    "TaskTimeoutError": "apiary.sdk.errors",
    "Workspace": "apiary.sdk.workspace",
    "current_task": "apiary.sdk.tasks",
}


def test_all_lists_exactly_the_pinned_names_and_the_version() -> None:
    assert sorted(apiary.__all__) == sorted([*PINNED, "__version__"])


@pytest.mark.parametrize("name", sorted(PINNED))
def test_each_export_is_the_object_of_its_defining_module(name: str) -> None:
    defining = importlib.import_module(PINNED[name])
    assert getattr(apiary, name) is getattr(defining, name)


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="'NotExported'"):
        _ = apiary.NotExported  # type: ignore[attr-defined]


def test_version_is_a_release_string() -> None:
    major, minor, patch = apiary.__version__.split(".")
    assert all(part.isdigit() for part in (major, minor, patch))


def test_importing_apiary_loads_neither_the_sdk_nor_grpc() -> None:
    """The exports are lazy: `import apiary.core...` in a coordinator or a tool must not pay
    for the SDK and gRPC."""
    code = "import sys, apiary; print('grpc' in sys.modules, 'apiary.sdk.agent' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
