"""`apiary demo` end to end: the command a new user runs first, run here as CI runs it (no
terminal, so the demo operator decides the merge). A real coordinator in secure mode (TLS
and mTLS on both ports, default-deny authorization, message signing), six real agent
processes each with its own certificate and signing key, a real git repository, real tools
in the sandbox and a real MCP server.

The run happens once (module fixture), with `--keep`: the console's address comes first, and
once the run is over and judged the coordinator keeps serving (the fixture reads the console
as the driver meanwhile) until SIGINT, which ends the demo cleanly. Each test asserts one part
of the outcome from what the run left behind: its output, the event log (read back from the
run's SQLite database, as `apiary serve --data-dir` would), the repository itself, and the
run's configuration, reopened in secure mode. A second, in-process run shows that a denied
merge fails the demo with the reason and the events that explain it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from apiary.core.events import Event
from apiary.core.ids import is_uuid4
from apiary.core.runtime.log import is_runtime, runtime_event
from apiary.demo.job import DemoError, DemoOptions, run_demo
from apiary.demo.operator import Invocation, Verdict
from apiary.errors import AgentUnavailableError, PermissionDeniedError
from apiary.sdk.client import Client
from apiary.sdk.credentials import ClientCredentials, ClientTls
from apiary.server.config.address import Address
from apiary.server.config.loader import load_config
from apiary.server.config.server import exposure_problem, secured
from apiary.server.coordinator import open_coordinator
from apiary.store.open import open_store
from apiary.wire import pb
from tests.server.runtime_harness import check_event, check_snapshot

ROOT = Path(__file__).resolve().parents[2]
AGENTS = {"planner", "coder", "critic-ruff", "critic-pytest", "merger", "indexer"}
RUN_TIMEOUT_S = 240
OPERATOR = "operator:demo-operator@default"
DRIVER = "operator:demo-driver@default"
APPLICATION = "application:demo-app@default"


KEPT_READ = "GET /console/api/finished"
"""The fixture's first read while the coordinator lingers: what the run did ends there."""


@dataclass
class DemoRun:
    returncode: int
    output: str
    data_dir: Path
    events: list[Event]
    """What the run did (the fixture's reads while it lingered are `kept_events`)."""
    kept: dict[str, Any] = field(default_factory=dict)
    """What the console answered while the coordinator lingered."""
    kept_events: list[Event] = field(default_factory=list)

    @property
    def repo(self) -> Path:
        return self.data_dir / "repo"

    def of(self, *kinds: str) -> list[Event]:
        return [e for e in self.events if e.event_type in kinds]


async def _read_log(data_dir: Path) -> list[Event]:
    async with open_store(None, data_dir) as store:
        return await store.events.read(after=0, limit=100_000)


def _read_kept(data_dir: Path, output: str) -> dict[str, Any]:
    """The console at the address the demo printed first, read as the driver (its client
    certificate, trusting the run's CA): the page, the finished work, a workflow's history."""
    found = re.search(r"console: (https://127\.0\.0\.1:\d+)/console", output)
    assert found, output
    certs = data_dir / "certs"
    context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    context.load_cert_chain(certs / "operator-demo-driver.pem", certs / "operator-demo-driver.key")

    def get(path: str) -> tuple[int, str]:
        with urllib.request.urlopen(f"{found.group(1)}{path}", context=context, timeout=30) as r:
            return r.status, r.read().decode()

    status, body = get("/console/api/finished?kind=workflow")
    items = json.loads(body)["items"]
    kept: dict[str, Any] = {"finished": (status, items), "page": get("/console")[0]}
    if items:
        query = urllib.parse.urlencode({"kind": "workflow", "id": items[0]["id"]})
        status, body = get(f"/console/api/history?{query}")
        kept["history"] = (status, [e["event_type"] for e in json.loads(body)["events"]])
    return kept


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    data_dir = tmp_path_factory.mktemp("demo") / "run"
    demo = subprocess.Popen(
        [sys.executable, "-m", "apiary.cli.main", "demo", "--keep", "--data-dir", str(data_dir)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    watchdog = threading.Timer(RUN_TIMEOUT_S, demo.kill)
    watchdog.start()
    output, kept = "", {}
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            output += line
            if "Press Ctrl-C to stop it." in line:
                kept = _read_kept(data_dir, output)  # still serving after the run
                demo.send_signal(signal.SIGINT)
        demo.wait(timeout=60)
    finally:
        watchdog.cancel()
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    events = asyncio.run(_read_log(data_dir)) if (data_dir / "apiary.db").exists() else []
    ended = next(
        (i for i, e in enumerate(events)
         if e.event_type == "access.decided" and e.details.get("action") == KEPT_READ),
        len(events),
    )  # fmt: skip
    return DemoRun(demo.returncode, output, data_dir, events[:ended], kept, events[ended:])


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()


def test_the_console_comes_first_and_keep_serves_it_until_ctrl_c(run: DemoRun) -> None:
    first = run.output.lstrip().splitlines()[0]
    assert re.fullmatch(r"console: https://127\.0\.0\.1:\d+/console \(watch the run live\)", first)
    # Printed before any agent started: the first lines of the run come after it.
    assert run.output.index(first) < run.output.index("planner")
    # --keep: the summary, then the coordinator kept serving until the SIGINT ended it (exit 0).
    assert run.output.index("what happened") < run.output.index("Press Ctrl-C to stop it.")
    assert run.returncode == 0, run.output
    assert run.kept["page"] == 200
    status, items = run.kept["finished"]
    assert status == 200 and [(i["kind"], i["state"]) for i in items] == [("workflow", "COMPLETED")]
    status, history = run.kept["history"]
    assert status == 200 and history[0] == "workflow.completed" and "workflow.created" in history
    # The reads while it lingered were allowed, and are not the run's.
    kept = [e for e in run.kept_events if e.event_type == "access.decided"]
    assert kept and all(e.details["allowed"] and e.actor == DRIVER for e in kept)


def test_the_command_exits_0_and_says_where_to_look(run: DemoRun) -> None:
    assert run.returncode == 0, run.output
    assert "demo ok" in run.output
    assert "what happened" in run.output
    assert f"apiary serve --config {run.data_dir / 'apiary.toml'}" in run.output
    # Without a terminal the progress is one line per notable event, not a live view.
    assert "asks a human: TOOL_PRIVILEGE_ESCALATION (git_merge)" in run.output
    # The summary says the run was secure, and who took part with which roles.
    assert "secure mode: TLS + mTLS on gRPC and HTTP, 10 principals" in run.output
    assert "every envelope signed (Ed25519), default-deny authorization" in run.output
    assert f"{OPERATOR}" in run.output and "roles: release_manager" in run.output
    assert f"{DRIVER}" in run.output and "roles: dlq, events" in run.output
    for agent in (*AGENTS, "user"):
        assert f"agent:{agent}@default" in run.output
    assert ", 0 refused" in run.output
    assert f"APIARY_CLIENT_CONFIG={run.data_dir / 'certs' / 'operator-demo-driver.toml'}" in (
        run.output
    )


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


def test_task_results_came_back_to_their_submitters_through_their_handles(
    run: DemoRun,
) -> None:
    submitted = {e.details["task_id"]: e for e in run.of("task.submitted")}
    (index,) = [t for t, e in submitted.items() if e.details["priority"] == 10]
    (lookup,) = [t for t, e in submitted.items() if e.details["priority"] == -5]
    assert is_uuid4(index) and is_uuid4(lookup)  # the coordinator's ids: the agents made none
    # Each submitter waited for its own task (its handle's result(): over its client's
    # FollowTasks stream, or WaitTask), as its owner.
    waits = {
        (e.actor, e.details["object"], e.details["reason"])
        for e in run.of("access.decided")
        if e.details.get("action")
        in (
            "/apiary.v1.TaskQueryService/FollowTasks",
            "/apiary.v1.TaskQueryService/WaitTask",
        )
        and e.details["object"]
    }
    assert waits == {
        ("agent:coder@default", lookup, "its owner"),
        ("agent:planner@default", index, "its owner"),
    }
    # What came back is what the indexer's on_task returned; no answer went as a message.
    assert re.search(
        rf"coder +result: lookup {lookup}: apply_discount is defined at shop/pricing\.py:\d+",
        run.output,
    ), run.output
    assert re.search(
        rf"planner +result: background index {index}: \d+ symbols in \d+ files "
        r"\(attempt 2, resumed after [1-9]\d*\)",
        run.output,
    ), run.output
    assert not [e for e in run.of("message.received") if e.actor == "indexer"]


def test_six_agent_processes_registered_and_left_gracefully(run: DemoRun) -> None:
    assert {e.agent_id for e in run.of("agent.registered")} == {*AGENTS, "user"}
    left = {e.agent_id: e.details["reason"] for e in run.of("agent.deregistered")}
    assert {a: left.get(a) for a in AGENTS} == dict.fromkeys(AGENTS, "shutdown")
    assert not run.of("dlq.added")


def test_every_call_was_a_principals_over_mtls_and_none_was_refused(run: DemoRun) -> None:
    decided = run.of("access.decided")
    assert [e.details for e in decided if not e.details["allowed"]] == []
    # In secure mode allowed calls are recorded too: every one authenticated by its client
    # certificate, none anonymous.
    assert {e.details["mechanism"] for e in decided} == {"mtls"}
    by = {e.actor for e in decided}
    assert by == {f"agent:{a}@default" for a in (*AGENTS, "user")} | {
        OPERATOR, DRIVER, APPLICATION,
    }  # fmt: skip
    # Each principal did what it is there for, and the operators nothing else.
    actions = {(e.actor, e.details["action"]) for e in decided}
    assert {a for who, a in actions if who == OPERATOR} == {
        "/apiary.v1.HitlOperatorService/Watch", "/apiary.v1.HitlOperatorService/Decide",
    }  # fmt: skip
    assert {a for who, a in actions if who == DRIVER} == {"GET /console/api/workflows"}
    assert {a for who, a in actions if who == APPLICATION} >= {
        "/runtime/v1/submit_turn", "/runtime/v1/export_evidence",
    }  # fmt: skip
    assert all(a.startswith("/runtime/v1/") for who, a in actions if who == APPLICATION)
    assert ("agent:user@default", "/sw4rm.router.RouterService/SendMessage") in actions
    assert ("agent:planner@default", "/sw4rm.workflow.WorkflowService/CreateWorkflow") in actions
    (decision,) = run.of("hitl.decided")
    assert decision.actor == "demo-operator"


def test_each_agent_registered_its_own_signing_key(run: DemoRun) -> None:
    registered = {e.agent_id: e.details for e in run.of("agent.registered")}
    assert {a: d["signing_key"] for a, d in registered.items()} == dict.fromkeys(
        (*AGENTS, "user"), True
    )
    keys = sorted(p.name for p in (run.data_dir / "keys").iterdir())
    assert keys == sorted(f"{a}.pem" for a in (*AGENTS, "user"))
    assert all((run.data_dir / "keys" / k).stat().st_mode & 0o077 == 0 for k in keys)
    # Signing is required: a message that was not signed would have been refused.
    assert not run.of("dlq.added") and run.of("message.received")


def test_the_demo_prints_where_its_evidence_export_is_a_valid_pack_of_the_log(
    run: DemoRun,
) -> None:
    """The application's runtime session: its turns asked the indexer through the control
    plane, and its evidence export, at the path the demo printed, holds the session's events
    as the log has them, each valid against the contract's schema, under digests anyone can
    recompute."""
    found = re.search(
        r"^evidence export: (\S+) \((\d+) events of runtime session (\S+);", run.output, re.M
    )
    assert found, run.output
    path, count, session_id = Path(found.group(1)), int(found.group(2)), found.group(3)
    assert path.is_file() and path.parent == run.data_dir
    pages = [json.loads(line) for line in path.read_text().splitlines()]
    events: list[dict[str, Any]] = []
    for page in pages:
        assert (page["kind"], page["sessionId"]) == ("evidence", session_id)
        text = json.dumps(page["events"], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert page["digest"] == "sha256:" + hashlib.sha256(text.encode()).hexdigest()
        check_snapshot(page["snapshot"])
        for event in page["events"]:
            check_event(event)
        events.extend(page["events"])
    assert not pages[-1]["more"] and len(events) == count
    through = int(pages[-1]["range"]["through"])
    logged = [runtime_event(e).to_json() for e in run.events if is_runtime(e)]
    of_session = [e for e in logged if e.get("sessionId") == session_id]
    assert [e for e in of_session if e["sequence"] <= through] == events
    assert {e["runtimeId"] for e in events} == {"apiary:default"}
    # Two turns on one thread bound to the indexer, answered with its lookups.
    done = [e for e in events if e["type"] == "turn.completed"]
    answers = {e["payload"]["result"]["symbol"]: e["payload"]["result"] for e in done}
    assert set(answers) == {"apply_discount", "total"}
    assert [d["file"] for d in answers["apply_discount"]["definitions"]] == ["shop/pricing.py"]
    (thread,) = pages[-1]["snapshot"]["threads"]
    assert thread["agentId"] == "indexer" and thread["status"] == "completed"
    assert "runtime session" in run.output  # the summary's row
    # The progress lines show the turns as they are submitted and end.
    assert (
        len(re.findall(r"application +turn \S+ for indexer \(runtime control plane\)", run.output))
        == 2
    )
    assert len(re.findall(r"indexer +turn \S+ completed", run.output)) == 2


def _as(data_dir: Path, principal: str) -> ClientCredentials:
    certs = data_dir / "certs"
    return ClientCredentials(
        tls=ClientTls(certs / "ca.pem", certs / f"{principal}.pem", certs / f"{principal}.key")
    )


async def test_the_runs_configuration_reopens_in_secure_mode(run: DemoRun) -> None:
    """Last of the run's tests: it reopens the run's state (as `apiary serve --config`)."""
    config = load_config(
        run.data_dir / "apiary.toml", {}, {"grpc": "127.0.0.1:0", "http": "127.0.0.1:0"}
    )
    assert config.auth.secure and config.router.signing_required
    assert config.tls_client_ca == run.data_dir / "certs" / "ca.pem"
    assert secured(config) == config
    exposed = replace(config, grpc=Address("0.0.0.0", 50051))
    assert exposure_problem(exposed) is None  # secure enough to serve beyond loopback
    read = pb.apiary_pb2.ReadEventsRequest(event_types=["hitl.decided"])
    async with open_coordinator(config) as coordinator:
        address = str(coordinator.grpc_address)
        async with Client(address, credentials=_as(run.data_dir, "operator-demo-driver")) as c:
            page = await c.events.ReadEvents(read)  # the run's log, read as the driver
            assert [e.actor for e in page.events] == ["demo-operator"]
            assert page.last_sequence > run.events[-1].sequence
        # An agent reads no event log: it is not an operator holding `events`.
        async with Client(address, credentials=_as(run.data_dir, "agent-coder")) as c:
            denied = r"agent:coder@default is not an operator \(the role 'events'"
            with pytest.raises(PermissionDeniedError, match=denied):
                await c.events.ReadEvents(read)
        # Without a client certificate the TLS handshake itself fails: no call is made.
        certs = run.data_dir / "certs"
        bare = ClientCredentials(tls=ClientTls(certs / "ca.pem"))
        async with Client(address, credentials=bare) as c:
            with pytest.raises(AgentUnavailableError, match="coordinator unreachable"):
                await c.events.ReadEvents(read, timeout=5)
        plain = grpc.aio.insecure_channel(address)
        with pytest.raises(grpc.aio.AioRpcError):
            await pb.apiary_pb2_grpc.EventLogServiceStub(plain).ReadEvents(read, timeout=5)
        await plain.close()


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
    # The merge was refused by the person, not by the access rules: no call was denied.
    assert "access:" not in result.reason
    assert result.state.denials == 0 and result.state.counts["access:allowed"] > 0


async def test_an_operator_name_that_cannot_be_a_principal_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DemoError, match=r"cannot set up the run .*name 'not a name' must be"):
        await run_demo(DemoOptions(data_dir=tmp_path / "run", operator="not a name"))
    assert not (tmp_path / "run" / "apiary.toml").exists()


def test_a_directory_that_is_not_empty_is_refused(tmp_path: Path) -> None:
    (tmp_path / "apiary.db").write_text("someone else's state")
    done = subprocess.run(
        [sys.executable, "-m", "apiary.cli.main", "demo", "--yes", "--data-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"apiary demo: {tmp_path} is not empty" in done.stderr
    assert (tmp_path / "apiary.db").read_text() == "someone else's state"
