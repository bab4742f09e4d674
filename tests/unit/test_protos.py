"""The proto contract: canonical files exactly as the RFC gives them, extensions apart."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from apiary.wire.services import SERVICES

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "proto"
RFC = ROOT.parent / "shared" / "spec" / "sw4rm-rfc-0.5.0.txt"
CANONICAL_FILES = [
    "common",
    "registry",
    "router",
    "scheduler",
    "hitl",
    "worktree",
    "tool",
    "connector",
    "negotiation",
    "reasoning",
    "logging",
    "scheduler_policy",
    "policy",
    "activity",
]
INTEROP_FILES = ("negotiation_room", "handoff", "workflow", "reasoning_proxy")


def _package(path: Path) -> str:
    found = re.search(r"^package ([\w.]+);", path.read_text(), re.MULTILINE)
    assert found, f"{path.name} declares no package"
    return found.group(1)


def _rfc_stubs(text: str) -> dict[str, str]:
    """The Appendix stubs of the RFC, by file name, as the lines the RFC prints."""
    stubs: dict[str, list[str]] = {}
    current = None
    for line in text.split("\n"):
        header = re.match(r"^(\w+)\.proto( \(.*\))?¶$", line)
        if header:
            current = header.group(1)
            stubs[current] = []
        elif line.startswith(("Quick Python SDK", "Additional Protobuf")):
            current = None
        elif current is not None:
            stubs[current].append(line)
    return {name: "\n".join(lines).rstrip() + "\n" for name, lines in stubs.items()}


@pytest.mark.conformance(
    "transport.proto.no-modify-canonical", "transport.proto.canonical-contracts"
)
@pytest.mark.skipif(not RFC.exists(), reason=f"the RFC text is not beside the repo ({RFC})")
def test_canonical_files_are_the_rfc_stubs_verbatim() -> None:
    stubs = _rfc_stubs(RFC.read_text())
    assert sorted(stubs) == sorted(CANONICAL_FILES)
    for name in CANONICAL_FILES:
        assert (PROTO / f"{name}.proto").read_text() == stubs[name], name


@pytest.mark.conformance("transport.proto.package-sw4rm")
def test_canonical_and_interop_files_use_sw4rm_packages() -> None:
    for name in (*CANONICAL_FILES, *INTEROP_FILES):
        assert _package(PROTO / f"{name}.proto").startswith("sw4rm."), name


@pytest.mark.conformance("transport.proto.extensions-separate-namespace")
def test_extensions_live_in_their_own_package() -> None:
    known = {f"{n}.proto" for n in (*CANONICAL_FILES, *INTEROP_FILES)}
    extensions = [p for p in PROTO.glob("*.proto") if p.name not in known]
    assert [p.name for p in extensions] == ["apiary.proto"]
    assert _package(extensions[0]) == "apiary.v1"
    non_sw4rm = {s for s in SERVICES if not s.startswith("sw4rm.")}
    assert non_sw4rm == {
        "apiary.v1.EventLogService",
        "apiary.v1.RouterStreamService",
        "apiary.v1.DiscoveryService",
        "apiary.v1.DlqService",
        "apiary.v1.HitlOperatorService",
        "apiary.v1.ToolProviderService",
        "apiary.v1.ActivityBufferService",
        "apiary.v1.HandoffQueryService",
        "apiary.v1.WorktreeBindingService",
        "apiary.v1.NegotiationRoomQueryService",
        "apiary.v1.NegotiationOperatorService",
        "apiary.v1.AgentControlService",
        "apiary.v1.TaskQueryService",
        "apiary.v1.WorkflowQueryService",
        "apiary.v1.RuntimeControlService",
    }


def test_interop_services_have_the_wire_names_other_sdks_call() -> None:
    expected = {
        "sw4rm.negotiation_room.NegotiationRoomService": [
            "SubmitProposal", "SubmitVote", "GetVotes", "GetDecision", "WaitForDecision",
        ],
        "sw4rm.handoff.HandoffService": [
            "RequestHandoff", "AcceptHandoff", "RejectHandoff", "GetPendingHandoffs",
            "CompleteHandoff",
        ],
        "sw4rm.workflow.WorkflowService": [
            "CreateWorkflow", "StartWorkflow", "GetWorkflowState", "ResumeWorkflow",
        ],
        "sw4rm.reasoning.ReasoningProxy": ["CheckParallelism", "EvaluateDebate", "Summarize"],
        "sw4rm.reasoning.InferenceProxy": ["CheckParallelism", "EvaluateDebate"],
    }  # fmt: skip
    for service, methods in expected.items():
        assert [m.name for m in SERVICES[service]] == methods
