"""`apiary demo` end to end: the command a new user runs first, run here as CI runs it (no
terminal, so the demo operator decides the merge). A real coordinator, six real agent
processes, a real git repository, real tools in the sandbox and a real MCP server.

The run happens once (module fixture); each test asserts one part of the outcome from what
the run left behind: the event log (read back from the run's SQLite database, as
`apiary serve --data-dir` would) and the repository itself. A second, in-process run shows
that a denied merge fails the demo with the reason and the events that explain it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from apiary.core.events import Event
from apiary.demo.job import DemoOptions, run_demo
from apiary.demo.operator import Invocation, Verdict
from apiary.store.open import open_store

ROOT = Path(__file__).resolve().parents[2]
AGENTS = {"planner", "coder", "critic-ruff", "critic-pytest", "merger", "indexer"}
RUN_TIMEOUT_S = 240


@dataclass
class DemoRun:
    returncode: int
    output: str
    data_dir: Path
    events: list[Event]

    @property
    def repo(self) -> Path:
        return self.data_dir / "repo"

    def of(self, *kinds: str) -> list[Event]:
        return [e for e in self.events if e.event_type in kinds]


async def _read_log(data_dir: Path) -> list[Event]:
    async with open_store(None, data_dir) as store:
        return await store.events.read(after=0, limit=100_000)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    data_dir = tmp_path_factory.mktemp("demo") / "run"
    done = subprocess.run(
        [sys.executable, "-m", "apiary.cli.main", "demo", "--data-dir", str(data_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False,
        stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    events = asyncio.run(_read_log(data_dir)) if (data_dir / "apiary.db").exists() else []
    return DemoRun(done.returncode, done.stdout + done.stderr, data_dir, events)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()


def test_the_command_exits_0_and_says_where_to_look(run: DemoRun) -> None:
    assert run.returncode == 0, run.output
    assert "demo ok" in run.output
    assert "what happened" in run.output
    assert f"apiary serve --config {run.data_dir / 'apiary.toml'}" in run.output
    # Without a terminal the progress is one line per notable event, not a live view.
    assert "asks a human: TOOL_PRIVILEGE_ESCALATION (git_merge)" in run.output


def test_the_fix_is_merged_into_main_and_main_passes_its_tests(run: DemoRun) -> None:
    merge = git(run.repo, "log", "-1", "--format=%an|%P|%s", "main").split("|")
    author, parents, subject = merge
    assert author == "merger" and subject.startswith("Merge fix/apply-discount")
    approved = parents.split()[1]
    assert git(run.repo, "log", "--format=%an", f"main..{approved}") == ""
    assert git(run.repo, "log", "--format=%an", "-2", approved).split() == ["coder", "coder"]
    # Checked here again, not taken from the demo's word: the tests and ruff pass on main.
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=run.repo,
        capture_output=True, text=True, env=env, check=False, timeout=120,
    )  # fmt: skip
    assert tests.returncode == 0 and "4 passed" in tests.stdout, tests.stdout
    lint = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=run.repo,
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert lint.returncode == 0, lint.stdout
    changelog = (run.repo / "CHANGELOG.md").read_text()
    assert "`apply_discount` takes a percentage" in changelog
    assert " UTC: " in changelog  # stamped with the MCP time server's answer


def test_the_workflow_ran_fix_review_merge_in_order(run: DemoRun) -> None:
    flow = run.of("workflow.created", "workflow.node_completed", "workflow.completed")
    assert [e.details.get("node_id", e.event_type) for e in flow] == [
        "workflow.created", "fix", "review", "merge", "workflow.completed",
    ]  # fmt: skip
    (created,) = run.of("workflow.created")
    assert created.actor == "workflow" and created.details["nodes"] == 3


def test_the_room_asked_for_a_revision_after_the_critics_real_tool_runs(run: DemoRun) -> None:
    decided = run.of("room.decided")
    assert [(e.details["outcome"], e.details["via"]) for e in decided] == [
        ("REVISION_REQUESTED", "policy"), ("APPROVED", "policy"),
    ]  # fmt: skip
    votes = run.of("room.voted")
    assert len(votes) == 4
    first = {e.details["critic_id"]: e.details for e in votes[:2]}
    assert first["critic-ruff"]["passed"] is False
    assert "ruff check --fix" in first["critic-ruff"]["recommendations"][0]
    assert first["critic-pytest"]["passed"] is True
    assert all(e.details["passed"] for e in votes[2:])
    # Each review checked the proposed commit out in a new worktree of the critic's own and
    # ran the tool there, through the coordinator.
    bound = {
        e.details["worktree_id"]
        for e in run.of("worktree.binding")
        if e.details["input"] == "BIND_OK"
    }
    assert {"critic-ruff-1", "critic-ruff-2", "critic-pytest-1", "critic-pytest-2"} <= bound
    calls = [(e.actor, e.details["tool_name"]) for e in run.of("tool.call_finished")]
    assert calls.count(("critic-ruff", "ruff_check")) == 2
    assert calls.count(("critic-pytest", "pytest")) == 2
    assert ("coder", "ruff_fix") in calls


def test_the_coder_used_its_worktree_tools_and_the_mcp_bridge(run: DemoRun) -> None:
    finished = [e for e in run.of("tool.call_finished") if e.actor == "coder"]
    pytest_runs = [e.details["error_code"] for e in finished if e.details["tool_name"] == "pytest"]
    assert pytest_runs[0] == "TOOL_FAILED"  # reproduced: the tests fail before the fix
    assert pytest_runs[1:] == ["", ""]
    (now,) = [e for e in finished if e.details["tool_name"] == "get_current_time"]
    assert (now.details["provider_id"], now.details["error_code"]) == ("time", "")
    homes = [e.details["current"] for e in run.of("worktree.binding") if e.agent_id == "coder"]
    assert homes == ["shop/coder"]


def test_the_merge_was_approved_through_hitl_by_the_demo_operator(run: DemoRun) -> None:
    (opened,) = run.of("hitl.opened")
    assert opened.details["reason_type"] == "TOOL_PRIVILEGE_ESCALATION"
    assert opened.details["subject"]["tool_name"] == "git_merge"
    assert opened.actor == "merger"
    (decided,) = run.of("hitl.decided")
    assert decided.actor == "demo-operator"
    decision = decided.details["changes"]["decision"]["to"]
    assert (decision["action"], decision["decided_by"]) == ("approve", "demo-operator")
    (merged,) = [e for e in run.of("tool.call_finished") if e.details["tool_name"] == "git_merge"]
    assert merged.details["error_code"] == "" and merged.sequence > decided.sequence
    (privilege,) = run.of("tool.privilege")
    assert privilege.details["reasons"] == ["privilege_level=PRIVILEGED"]


def test_the_background_index_yielded_to_the_lookup_and_resumed(run: DemoRun) -> None:
    submitted = {e.details["task_id"]: e for e in run.of("task.submitted")}
    (index,) = [t for t, e in submitted.items() if e.details["priority"] == 10]
    (lookup,) = [t for t, e in submitted.items() if e.details["priority"] == -5]
    assert submitted[index].agent_id == submitted[lookup].agent_id == "indexer"

    def story(task_id: str) -> list[str]:
        return [
            e.event_type + (f"->{e.details['to']}" if e.event_type == "task.preemption" else "")
            for e in run.events
            if e.details.get("task_id") == task_id
            and e.event_type.startswith("task.")
            and e.event_type != "task.progress"
        ]

    assert story(index) == [
        "task.submitted", "task.dispatched", "task.running", "task.preempt_requested",
        "task.preemption->PREEMPT_REQUESTED", "task.control", "task.preemption->YIELDED",
        "task.requeued", "task.dispatched", "task.running", "task.completed",
    ]  # fmt: skip
    position = {(e.event_type, e.details.get("task_id")): e.sequence for e in run.events}
    # The lookup ran while the index waited in the queue: after the yield, before the resume.
    assert (
        position[("task.requeued", index)]
        < position[("task.completed", lookup)]
        < position[("task.completed", index)]
    )
    commands = [e.details["command"] for e in run.of("task.control")]
    assert commands == ["preempt_request"]  # cooperation sufficed: no terminate, no kill
    result = json.loads(next(e for e in run.of("task.completed")
                             if e.details["task_id"] == index).details["note"])  # fmt: skip
    assert result["attempt"] == 2 and result["resumed_after"] > 0


def test_six_agent_processes_registered_and_left_gracefully(run: DemoRun) -> None:
    assert {e.agent_id for e in run.of("agent.registered")} == {*AGENTS, "user"}
    left = {e.agent_id: e.details["reason"] for e in run.of("agent.deregistered")}
    assert {a: left.get(a) for a in AGENTS} == dict.fromkeys(AGENTS, "shutdown")
    assert not run.of("dlq.added")


async def _deny(invocation: Invocation) -> Verdict:
    return Verdict("deny", "not before the release freeze ends")


async def test_a_denied_merge_fails_the_demo_with_the_reason_and_the_events(
    tmp_path: Path,
) -> None:
    # The preemption is not under test here: a fast index keeps this run short.
    result = await run_demo(
        DemoOptions(data_dir=tmp_path / "denied", decide=_deny, index_rate=100_000)
    )
    assert not result.ok
    assert "merge approval: demo-operator answered deny: not before the release freeze" in (
        result.reason
    )
    assert "the approved commit is not on main" in result.reason
    kinds = [e.event_type for e in result.excerpt]
    assert "hitl.decided" in kinds and "workflow.failed" in kinds and "task.failed" in kinds
    assert result.repo is not None and not result.repo.merged and not result.repo.tests_ok
    assert result.report["status"] == "FAILED"
    assert result.report["nodes"]["merge"]["error"].startswith("permission_denied")


def test_a_directory_that_is_not_empty_is_refused(tmp_path: Path) -> None:
    (tmp_path / "apiary.db").write_text("someone else's state")
    done = subprocess.run(
        [sys.executable, "-m", "apiary.cli.main", "demo", "--yes", "--data-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"apiary demo: {tmp_path} is not empty" in done.stderr
    assert (tmp_path / "apiary.db").read_text() == "someone else's state"
