"""The critics: review a proposed commit by running a real tool on it, and vote.

    apiary agent run demo_agents.critics:RuffCritic --id critic-ruff --coordinator HOST:PORT
    apiary agent run demo_agents.critics:PytestCritic --id critic-pytest --coordinator HOST:PORT

The negotiation room announces each proposal with a `room.proposal` NOTIFICATION
(docs/negotiation-rooms.md). A critic binds a fresh worktree of its own at the proposed
commit (BIND with commit_sha: a real `git worktree` on a new branch there), runs its command
tool in it through the coordinator (the tool runs in the caller's worktree, in the sandbox),
votes what the tool found, and unbinds. Its vote carries the findings as weaknesses and, when
it knows one, a recommendation the producer can act on.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apiary
from apiary.wire import pb
from demo_agents.common import run_tool, say

nr = pb.negotiation_room_pb2


@dataclass
class Verdict:
    score: float
    passed: bool
    confidence: float = 0.9
    strengths: list[str] = field(default_factory=list)
    weaknesses: list[str] = field(default_factory=list)
    recommendations: list[str] = field(default_factory=list)


class Critic(apiary.Agent):
    capabilities = ("review",)

    def __init__(self, agent_id: str | None = None, **options: Any) -> None:
        super().__init__(agent_id, **options)
        self.reviews = 0

    async def on_notification(self, msg: apiary.Message) -> str:
        body = msg.json()
        if body.get("event") != "room.proposal":
            return "ignored"
        change = json.loads(base64.b64decode(body["artifact_b64"]))
        self.reviews += 1
        if self.workspace is not None:
            await self.unbind_worktree()
        workspace = await self.bind_worktree(
            change["repo_id"], f"{self.agent_id}-{self.reviews}", commit_sha=change["commit"]
        )
        say(f"checked out {change['commit'][:12]} in worktree {workspace.worktree_id}")
        verdict = await self.judge(workspace.path)
        vote = nr.NegotiationVote(
            artifact_id=body["artifact_id"],
            negotiation_room_id=body["negotiation_room_id"],
            score=verdict.score,
            confidence=verdict.confidence,
            passed=verdict.passed,
            strengths=verdict.strengths,
            weaknesses=verdict.weaknesses[:20],
            recommendations=verdict.recommendations,
        )
        await self.client.negotiation_room.SubmitVote(nr.SubmitVoteRequest(vote=vote))
        found = "; ".join(verdict.weaknesses[:2]) or "; ".join(verdict.strengths)
        say(f"voted {verdict.score:g} ({'pass' if verdict.passed else 'fail'}): {found}")
        await self.unbind_worktree()
        return "voted"

    async def judge(self, root: Path) -> Verdict:
        raise NotImplementedError


class RuffCritic(Critic):
    """Lints the change with ruff (the repository's own configuration)."""

    agent_id = "critic-ruff"
    description = "Votes on code changes by running ruff on them."

    async def judge(self, root: Path) -> Verdict:
        run = await run_tool(self.tools, "ruff_check")
        findings: list[dict[str, Any]] = json.loads(run.output or "[]")
        if not findings:
            return Verdict(9.5, True, strengths=["ruff: no findings"])
        fixable = sum(1 for f in findings if f.get("fix"))
        weaknesses = [
            f"{_relative(f['filename'], root)}:{f['location']['row']}: {f['code']} {f['message']}"
            for f in findings
        ]
        asks = [f"run `ruff check --fix`: {fixable} of {len(findings)} finding(s) are fixable"]
        return Verdict(4.0, False, weaknesses=weaknesses, recommendations=asks if fixable else [])


class PytestCritic(Critic):
    """Runs the repository's test suite on the change."""

    agent_id = "critic-pytest"
    description = "Votes on code changes by running their tests."

    async def judge(self, root: Path) -> Verdict:
        run = await run_tool(self.tools, "pytest")
        counts = {
            kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|error)", run.output)
        }
        summary = ", ".join(f"{n} {kind}" for kind, n in counts.items()) or "no summary"
        if run.exit_code == 0:
            return Verdict(9.0, True, strengths=[f"pytest: {summary}"])
        failing = re.findall(r"^FAILED (\S+)", run.output, re.MULTILINE)
        return Verdict(2.0, False, weaknesses=[f"pytest: {summary}", *failing])


def _relative(filename: str, root: Path) -> str:
    path = Path(filename)
    return str(path.relative_to(root)) if path.is_relative_to(root) else filename
