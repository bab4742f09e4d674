"""The coder: an agent that binds a worktree, edits files through the confined file API, calls
command tools and an MCP tool, and iterates on a change in a negotiation room.

    apiary agent run demo_agents.coder:Coder --coordinator HOST:PORT

It runs two workflow nodes as Scheduler tasks (docs/workflows.md):

fix
    Bind the home worktree (a real `git worktree` on branch fix/apply-discount), reproduce the
    failure with the `pytest` command tool, ask the indexer where the failing function is
    defined (an urgent task, which preempts the indexer's background index; its handle gives
    back the indexer's answer), fix it and add a
    regression test through `workspace.files` (apiary.confined: every path resolved beneath
    the worktree), stamp the CHANGELOG with the time from the MCP time server (through the
    coordinator's MCP bridge), run the tests again and commit. Output: the branch and commit.
review
    Propose the commit to the critics in a negotiation room and wait for the decision. A
    REVISION_REQUESTED decision carries the critics' votes; the coder acts on their
    recommendations (`ruff check --fix` when the ruff critic says its findings are fixable),
    re-runs the tests, commits and proposes again, until the room approves.

The fix itself is written here (this demo has no language model): the first attempt fixes
the function and its tests pass, but it appends `import pytest` below the first-party import,
which ruff's isort rule refuses. The critics' real tool runs decide whether a revision is
needed; the coder only reacts to what they said.
"""

from __future__ import annotations

import json
import re
from typing import Any

import apiary
from apiary.confined import ConfinedRoot
from apiary.errors import ValidationError
from apiary.wire import pb
from demo_agents.common import CRITICS, INDEXER, REPO_ID, git, run_tool, say, say_result

nr = pb.negotiation_room_pb2
BRANCH = "fix/apply-discount"
MAX_REVISIONS = 3
LOOKUP_TIMEOUT_S = 60.0
BUGGY = "return price - percent"
FIXED = (
    "if not 0 <= percent <= 100:\n"
    '        raise ValueError(f"a discount is a percentage from 0 to 100, not {percent}")\n'
    "    return price * (100 - percent) / 100"
)
REGRESSION_TEST = """

def test_a_discount_is_a_percentage() -> None:
    with pytest.raises(ValueError):
        apply_discount(80.0, 120)
"""


def pytest_counts(output: str) -> dict[str, int]:
    """{"passed": 3, "failed": 1} from pytest's summary line."""
    return {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|error)", output)}


class Coder(apiary.Agent):
    agent_id = "coder"
    capabilities = ("code", "python")
    description = "Fixes bugs in its worktree and revises them until the critics approve."

    async def on_notification(self, msg: apiary.Message) -> str:
        """The room's notices to its producer (room.decided, room.escalated); the review
        itself waits on WaitForDecision, so these are only taken note of."""
        body = msg.json() or {}
        return f"noted {body.get('event', 'notice')}"

    async def on_task(self, task: apiary.TaskContext) -> object:
        params = task.json()
        node, given = params["node_id"], params["input"]
        if node == "fix":
            return await self.fix(task, given)
        if node == "review":
            return await self.review(task, given)
        raise ValidationError.for_field("node_id", f"the coder runs no node {node!r}")

    # ------------------------------------------------------------------ fix

    async def fix(self, task: apiary.TaskContext, brief: dict[str, Any]) -> dict[str, Any]:
        workspace = self.workspace or await self.bind_worktree(
            brief.get("repo_id", REPO_ID), "coder", branch=BRANCH
        )
        say(f"bound worktree {workspace.repo_id}/{workspace.worktree_id} on {workspace.branch}")
        before = await run_tool(self.tools, "pytest")
        say(f"reproduced the bug: pytest says {pytest_counts(before.output)}")
        symbol = brief["symbol"]
        found = await self.lookup(task, symbol)
        definition = next((d for d in found["definitions"] if d["kind"] == "def"), None)
        if definition is None:
            raise ValidationError.for_field("symbol", f"the index knows no def {symbol}")

        self.edit(workspace.files, definition["file"], brief["test_file"])
        stamp = await self.stamp_changelog(workspace.files, symbol)

        after = await run_tool(self.tools, "pytest")
        counts = pytest_counts(after.output)
        if after.exit_code != 0:
            raise ValidationError.for_field("fix", f"the tests still fail: {counts}")
        say(f"tests pass in the worktree: {counts}")
        commit = await self.commit(
            f"Fix {symbol}: a discount is a percentage\n\nStamped {stamp} (MCP get_current_time)."
        )
        say(f"committed {commit[:12]} on {BRANCH}")
        return {"repo_id": workspace.repo_id, "branch": BRANCH, "commit": commit}

    def edit(self, files: ConfinedRoot, source_file: str, test_file: str) -> None:
        """The fix and a regression test, written through the confined file API (every path
        is resolved beneath the worktree; `..`, absolute paths and symlinks are refused)."""
        source = files.read_text(source_file)
        if BUGGY not in source:
            raise ValidationError.for_field("symbol", f"{source_file} has no {BUGGY!r}")
        files.write_text(source_file, source.replace(BUGGY, FIXED, 1))
        tests = files.read_text(test_file)
        first_import, _, rest = tests.partition("\n")
        # The imperfect part: the new import goes below the existing one.
        files.write_text(test_file, f"{first_import}\nimport pytest\n{rest}{REGRESSION_TEST}")
        say(f"edited {source_file} and {test_file} through the confined file API")

    async def stamp_changelog(self, files: ConfinedRoot, symbol: str) -> str:
        """A CHANGELOG line stamped with the time from the MCP time server (an MCP stdio
        server the coordinator runs; the call goes through its MCP bridge)."""
        now = await self.tools.call("get_current_time", {"timezone": "UTC"}, provider_id="time")
        stamp = str(now.json()["datetime"])
        line = (
            f"- {stamp[:16].replace('T', ' ')} UTC: `{symbol}` takes a percentage, "
            f"as its callers expect ({BRANCH})."
        )
        changelog = files.read_text("CHANGELOG.md")
        entry = changelog.replace("## Unreleased\n", f"## Unreleased\n\n{line}\n", 1)
        files.write_text("CHANGELOG.md", entry)
        say(f"stamped the CHANGELOG with {stamp} from the MCP time server")
        return stamp

    async def lookup(self, task: apiary.TaskContext, symbol: str) -> Any:
        """Ask the indexer where `symbol` is, as an urgent task (priority -5), and wait for its
        result through the task's handle: what the indexer's `on_task` returned. A refusal
        raises, a failed lookup raises TaskFailedError with the indexer's code and message."""
        params = {"kind": "lookup", "symbol": symbol, "description": f"where is {symbol}?"}
        handle = await self.client.submit_task(
            INDEXER, params, priority=-5, scope=f"resource:index.{REPO_ID}"
        )
        say(f"asked the indexer where {symbol} is: task {handle.task_id} (priority -5)")
        async with task.waiting():  # RFC 8.1 WAITING: the coder waits for another agent
            found = await handle.result(timeout=LOOKUP_TIMEOUT_S)
        where = ", ".join(f"{d['file']}:{d['line']}" for d in found["definitions"]) or "nowhere"
        say_result(f"lookup {handle.task_id}: {symbol} is defined at {where}")
        return found

    async def commit(self, message: str) -> str:
        assert self.workspace is not None
        path = self.workspace.path
        await git(path, "add", "-A")
        await git(path, "commit", "--quiet", "-m", message, author=self.agent_id)
        return await git(path, "rev-parse", "HEAD")

    # ------------------------------------------------------------------ review

    async def review(self, task: apiary.TaskContext, change: dict[str, Any]) -> dict[str, Any]:
        commit, revisions = change["commit"], 0
        room = f"review-{task.json()['workflow_id']}"
        while True:
            decision = await self.propose(room, change["branch"], commit, revisions)
            outcome = nr.DecisionOutcome.Name(decision.outcome)
            say(f"room decided {outcome}: {decision.reason}")
            if outcome == "APPROVED":
                return {
                    "commit": commit,
                    "branch": change["branch"],
                    "revisions": revisions,
                    "artifact_id": decision.artifact_id,
                }
            if revisions >= MAX_REVISIONS:
                raise ValidationError.for_field(
                    "review", f"not approved after {revisions} revisions"
                )
            commit = await self.revise(decision)
            revisions += 1

    async def propose(
        self, room: str, branch: str, commit: str, revision: int
    ) -> nr.NegotiationDecision:
        assert self.workspace is not None
        diff = await git(self.workspace.path, "show", "--format=%B", "--stat", "-p", commit)
        artifact = {
            "repo_id": self.workspace.repo_id,
            "branch": branch,
            "commit": commit,
            "revision": revision,
            "diff": diff[:8000],
        }
        proposal = nr.NegotiationProposal(
            artifact_type=nr.CODE,
            artifact_id=f"{branch}@{commit[:12]}",
            artifact=json.dumps(artifact).encode(),
            artifact_content_type="application/json",
            requested_critics=list(CRITICS),
            negotiation_room_id=room,
        )
        rooms = self.client.negotiation_room
        reply = await rooms.SubmitProposal(nr.SubmitProposalRequest(proposal=proposal))
        say(f"proposed {reply.artifact_id} to {', '.join(CRITICS)} in room {room}")
        waited: nr.WaitForDecisionResponse = await rooms.WaitForDecision(
            nr.WaitForDecisionRequest(artifact_id=reply.artifact_id, timeout_seconds=300)
        )
        return waited.decision

    async def revise(self, decision: nr.NegotiationDecision) -> str:
        """Act on the critics' recommendations; a recommendation the coder cannot act on
        ends the review (the workflow's review node fails with it)."""
        asks = [r for v in decision.votes if not v.passed for r in v.recommendations]
        if not asks:
            failed = [
                f"{v.critic_id}: {'; '.join(v.weaknesses)}" for v in decision.votes if not v.passed
            ]
            raise ValidationError.for_field("review", f"no recommendation to act on: {failed}")
        for ask in asks:
            if "ruff check --fix" not in ask:
                raise ValidationError.for_field("review", f"cannot act on {ask!r}")
            fixed = await run_tool(self.tools, "ruff_fix")
            left = json.loads(fixed.output or "[]")
            say(f"ran ruff --fix as the critic asked: {len(left)} finding(s) left")
        tests = await run_tool(self.tools, "pytest")
        if tests.exit_code != 0:
            raise ValidationError.for_field(
                "review", f"the revision broke the tests: {tests.output[-500:]}"
            )
        commit = await self.commit("Sort the test module's imports (ruff --fix)")
        say(f"committed revision {commit[:12]}")
        return commit
