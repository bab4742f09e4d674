"""export_evidence, export_replay and export_review against a real coordinator (HTTP
socket, an SDK agent over gRPC): packs built from the session's facts in the log and the
runtime store, the same facts giving the same pack; the evidence pages through the events
with a digest anyone can recompute; the replay case lists each turn's input and outcome in
order; the review has an item per outcome with its audit ref; bad parameters are refused
naming the field. Every event and snapshot in a pack is validated against the contract."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from apiary.sdk.runtime import RuntimeClient
from apiary.server.coordinator import Coordinator
from tests.server.runtime_harness import (
    Answerer,
    RuntimeHttp,
    check_event,
    check_snapshot,
    session_events,
)

AGENT = "answerer"


async def _session(runtime: RuntimeHttp) -> dict[str, Any]:
    """A session with a completed turn and a failed one, in one thread."""
    first = await runtime.ok("submit_turn", agent_id=AGENT, turn_id="x-1", input={"value": 7})
    await runtime.thread_status(first["threadId"], "completed")
    await runtime.ok("submit_turn", thread_id=first["threadId"], turn_id="x-2",
                     input={"mode": "fail"})  # fmt: skip
    await runtime.thread_status(first["threadId"], "failed")
    return first


def _digest(events: list[dict[str, Any]]) -> str:
    text = json.dumps(events, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


async def test_the_evidence_pack_is_the_sessions_events_with_a_digest_and_pages(
    coordinator: Coordinator, runtime: RuntimeHttp, answerer: Answerer
) -> None:
    made = await _session(runtime)
    session_id = made["sessionId"]
    logged = await session_events(coordinator, session_id)
    pack = (await runtime.ok("export_evidence", session_id=session_id))["evidence"]
    assert (pack["kind"], pack["sessionId"], pack["more"]) == ("evidence", session_id, False)
    assert pack["events"] == logged
    for event in pack["events"]:
        check_event(event)
    check_snapshot(pack["snapshot"])
    assert pack["digest"] == _digest(logged)
    assert pack["range"]["after"] == 0 and pack["range"]["through"] >= logged[-1]["sequence"]
    # The same facts give the same pack.
    again = (await runtime.ok("export_evidence", session_id=session_id))["evidence"]
    assert (again["events"], again["digest"]) == (pack["events"], pack["digest"])
    # Paged: each page starts after the last one ended; together they are the whole.
    pages, after = [], 0
    while True:
        page = (await runtime.ok("export_evidence", session_id=session_id, after=after,
                                 limit=4))["evidence"]  # fmt: skip
        pages.append(page)
        assert len(page["events"]) <= 4 and page["digest"] == _digest(page["events"])
        if not page["more"]:
            break
        assert page["range"]["through"] == page["events"][-1]["sequence"]
        after = page["range"]["through"]
    assert len(pages) == -(-len(logged) // 4)
    assert [e for p in pages for e in p["events"]] == logged


async def test_the_replay_case_lists_each_turns_input_and_outcome_in_order(
    coordinator: Coordinator, runtime: RuntimeHttp, answerer: Answerer
) -> None:
    made = await _session(runtime)
    case = (await runtime.ok("export_replay", session_id=made["sessionId"]))["replay"]
    (thread,) = case["threads"]
    assert (thread["threadId"], thread["agentId"]) == (made["threadId"], AGENT)
    first, second = thread["turns"]
    assert (first["turnId"], first["input"]) == ("x-1", {"value": 7})
    assert first["expected"] == {"status": "completed", "result": {"answer": 7}}
    assert (second["turnId"], second["input"]) == ("x-2", {"mode": "fail"})
    assert second["expected"]["status"] == "failed"
    assert second["expected"]["error"]["code"] == "no_answer"
    # One thread by id; a thread of another session is not this session's.
    one = await runtime.ok(
        "export_replay", session_id=made["sessionId"], thread_id=made["threadId"]
    )
    assert one["replay"]["threads"] == case["threads"]
    other = await runtime.ok("submit_turn", agent_id=AGENT, input={"value": 1})
    error = await runtime.error(
        404, "export_replay", session_id=made["sessionId"], thread_id=other["threadId"]
    )
    assert error["details"]["field"] == "thread_id"


async def test_the_review_has_an_item_per_outcome_with_its_audit_ref(
    coordinator: Coordinator, runtime: RuntimeHttp, answerer: Answerer
) -> None:
    made = await _session(runtime)
    logged = await session_events(coordinator, made["sessionId"])
    review = (await runtime.ok("export_review", session_id=made["sessionId"]))["review"]
    assert (review["kind"], review["verdict"], review["truncated"]) == ("review", None, False)
    ended = [e for e in logged if e["type"] in ("turn.completed", "turn.failed", "task.completed",
                                                 "task.failed")]  # fmt: skip
    assert [i["ref"] for i in review["items"]] == [
        {"sequence": e["sequence"], "eventId": e["eventId"], "type": e["type"]} for e in ended
    ]
    assert review["summary"] == {"task.completed": 1, "task.failed": 1, "turn.completed": 1,
                                 "turn.failed": 1}  # fmt: skip
    turn_items = [i for i in review["items"] if i["ref"]["type"].startswith("turn.")]
    assert [i["subject"]["turnId"] for i in turn_items] == ["x-1", "x-2"]
    assert [i["outcome"] for i in turn_items] == ["completed", "failed"]


async def test_bad_parameters_are_refused_naming_the_field(
    coordinator: Coordinator, runtime: RuntimeHttp, answerer: Answerer
) -> None:
    made = await _session(runtime)
    session_id = made["sessionId"]
    top = (await session_events(coordinator, session_id))[-1]["sequence"]
    for command, params, status, field in [
        ("export_evidence", {"session_id": "nope"}, 404, "session_id"),
        ("export_replay", {"session_id": "nope"}, 404, "session_id"),
        ("export_review", {"session_id": "nope"}, 404, "session_id"),
        ("export_evidence", {}, 400, "session_id"),
        ("export_evidence", {"session_id": session_id, "limit": 0}, 400, "limit"),
        ("export_evidence", {"session_id": session_id, "limit": 5001}, 400, "limit"),
        ("export_evidence", {"session_id": session_id, "after": -1}, 400, "after"),
        ("export_evidence", {"session_id": session_id, "after": top + 10_000}, 400, "after"),
        ("export_review", {"session_id": session_id, "after": 1}, 400, "after"),
    ]:  # fmt: skip
        error = await runtime.error(status, command, **params)
        assert error["details"].get("field") == field, (command, params, error)
    # At the limits.
    page = await runtime.ok("export_evidence", session_id=session_id, limit=5000)
    assert page["evidence"]["more"] is False
    one = await runtime.ok("export_evidence", session_id=session_id, limit=1)
    assert len(one["evidence"]["events"]) == 1 and one["evidence"]["more"] is True


async def _cli(coordinator: Coordinator, *args: str, code: int = 0) -> tuple[str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "apiary.cli.main", "runtime", "export", *args,
        "--http", str(coordinator.http_address),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == code, (proc.returncode, out.decode(), err.decode())
    return out.decode(), err.decode()


async def test_the_sdk_and_the_command_line_export_every_page(
    coordinator: Coordinator, runtime: RuntimeHttp, answerer: Answerer, tmp_path: Path
) -> None:
    made = await _session(runtime)
    session_id = made["sessionId"]
    logged = await session_events(coordinator, session_id)
    async with RuntimeClient(f"http://{coordinator.http_address}") as client:
        pages = [page async for page in client.evidence_pages(session_id, limit=5)]
        assert [e for p in pages for e in p["events"]] == logged
        replay = await client.export_replay(session_id, thread_id=made["threadId"])
        assert [t["turnId"] for t in replay["threads"][0]["turns"]] == ["x-1", "x-2"]
        assert (await client.export_review(session_id))["kind"] == "review"
    out, err = await _cli(coordinator, "evidence", session_id, "--limit", "5")
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == len(pages) and [e for p in lines for e in p["events"]] == logged
    assert err.splitlines()[-1] == (
        f"evidence: {len(logged)} events through sequence {lines[-1]['range']['through']}"
    )
    one, _ = await _cli(coordinator, "evidence", session_id, "--after", "0", "--limit", "2")
    assert [e["sequence"] for e in json.loads(one)["events"]] == [e["sequence"] for e in logged[:2]]
    target = tmp_path / "replay.json"
    _, said = await _cli(coordinator, "replay", session_id, "--out", str(target))
    assert json.loads(target.read_text())["threads"] == replay["threads"]
    assert said.strip() == f"replay of {session_id} written to {target}"
    _, refused = await _cli(coordinator, "review", session_id, "--thread", "t", code=2)
    assert "--thread is for replay only" in refused
    _, missing = await _cli(coordinator, "review", "no-such-session", code=1)
    assert "no-such-session" in missing
