"""An operator living in the console: the real page in headless Chromium against a coordinator
with agents, tasks, a workflow run, HITL invocations, a room and negotiations
(tests/server/console_scenario.py). The test follows the dashboard's links and the pages'
addresses, and checks what each page shows: the subject's record and state, its history from
the event log (paged with **Older events**), decided things without deadlines, an agent that
failed shown FAILED as `apiary status` shows it, a page that follows the live stream, the
finished work searched and paged, and an events feed that stays in its column."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from tests.server.chromium import Page, installed_chromium, open_console
from tests.server.console_scenario import OPERATOR_HEADERS, TOKEN, World, open_world

BULK = 55
"""Decided HITL invocations beyond the scenario's: more than a page of finished work (50)."""


@pytest.fixture
def chromium() -> Path:
    return installed_chromium()


async def _open(page: Page, address: str) -> None:
    """Go to `address` (#/kind/id) and wait until the page read its subject."""
    kind, _, encoded = address.removeprefix("#/").partition("/")
    await page.value(f"location.hash = {json.dumps(address)}")
    wanted = json.dumps(f"{kind}:{unquote(encoded)}")
    await page.until(f"() => document.getElementById('page').dataset.loaded === {wanted}", address)


async def _facts(page: Page) -> dict[str, str]:
    """The page's facts tables, label -> text."""
    found = await page.value(
        "Object.fromEntries([...document.querySelectorAll('#page-body tr[data-fact]')]"
        ".map((r) => [r.dataset.fact, r.querySelector('td').textContent]))"
    )
    return dict(found)


async def _history(page: Page) -> list[str]:
    """The event types of the page's history, as shown (newest first)."""
    return list(
        await page.value(
            "[...document.querySelectorAll('.history tbody tr[data-event-type]')]"
            ".map((r) => r.dataset.eventType)"
        )
    )


async def _heading(page: Page) -> str:
    return str(await page.value("document.querySelector('#page-body .page-head').textContent"))


async def _count(page: Page, selector: str) -> int:
    return int(await page.value(f"document.querySelectorAll({json.dumps(selector)}).length"))


async def _dashboard_states(page: Page) -> dict[str, str]:
    await page.until(
        "() => document.querySelector('#agents-body tr[data-agent=\"ghost\"]')", "ghost listed"
    )
    rows = await page.value(
        "Object.fromEntries([...document.querySelectorAll('#agents-body tr[data-agent]')]"
        ".map((r) => [r.dataset.agent, r.querySelector('.badge').textContent]))"
    )
    return dict(rows)


async def test_an_operator_browses_every_kind_of_page(tmp_path: Path, chromium: Path) -> None:
    async with (
        open_world(tmp_path, bulk=BULK) as world,
        open_console(chromium, tmp_path / "profile", world.coordinator.http_address) as page,
    ):
        states = await _dashboard_states(page)
        assert (states["ghost"], states["worker"]) == ("FAILED", "RUNNABLE")
        await _agents(page)
        await _tasks_and_workflow(page)
        await _room_and_negotiations(world, page)
        await _hitl(world, page)
        await _finished(world, page)


async def _agents(page: Page) -> None:
    # From the dashboard, by its link.
    await page.value("document.querySelector('#agents-body a[href=\"#/agent/worker\"]').click()")
    await page.until(
        "() => document.getElementById('page').dataset.loaded === 'agent:worker'", "worker"
    )
    assert not await page.hidden("page") and await page.hidden("dashboard")
    facts = await _facts(page)
    assert facts["state"] == "RUNNABLE"
    assert facts["inbound queue"].endswith("of 10 messages")
    history = await _history(page)
    assert len(history) == 50 and "hitl.decided" in history  # its invocations name it
    older = history
    while not await page.value("document.querySelector('.history-older').hidden"):
        shown = len(older)
        await page.value("document.querySelector('.history-older').click()")
        await page.until(
            f"() => document.querySelectorAll('.history tbody tr[data-event-type]').length"
            f" > {shown}",
            "older events",
        )
        older = await _history(page)
    assert len(older) > 100 and older[:50] == history
    assert older[-1] == "agent.registered"  # back to the beginning
    assert {"task.completed", "agent.lifecycle", "stream.opened"} <= set(older)
    sequences = await page.value(
        "[...document.querySelectorAll('.history tbody tr')].map((r) => Number(r.dataset.seq))"
    )
    assert sequences == sorted(sequences, reverse=True) and len(set(sequences)) == len(sequences)

    await _open(page, "#/agent/ghost")
    assert (await _facts(page))["state"] == "FAILED"
    assert "FAILED" in await _heading(page)
    assert {"agent.lifecycle", "agent.state", "agent.registered"} <= set(await _history(page))


async def _tasks_and_workflow(page: Page) -> None:
    await _open(page, "#/task/task-ok-1")
    facts = await _facts(page)
    assert (facts["state"], facts["agent"], facts["note"]) == (
        "COMPLETED",
        "worker",
        "done task-ok-1",
    )
    assert facts["result"] == '"done task-ok-1"'  # the note's text, as a JSON string
    tasks = [t for t in await _history(page) if t.startswith("task.")]
    assert tasks == ["task.completed", "task.running", "task.dispatched", "task.submitted"]
    await _open(page, "#/task/task-bad")
    facts = await _facts(page)
    assert (facts["state"], facts["error"]) == ("FAILED", "internal_error")

    # A node's task (an id with colons) links its workflow run.
    await _open(page, "#/task/workflow%3Awf-1%3Aa%3A1")
    assert (await _facts(page))["workflow"] == "wf-1"
    await page.value("document.querySelector('#page-body a[href=\"#/workflow/wf-1\"]').click()")
    await page.until(
        "() => document.getElementById('page').dataset.loaded === 'workflow:wf-1'", "wf-1"
    )
    assert "COMPLETED" in await _heading(page)
    nodes = await page.value(
        "Object.fromEntries([...document.querySelectorAll('#page-body tr[data-node]')]"
        ".map((r) => [r.dataset.node, r.querySelector('.badge').textContent]))"
    )
    assert nodes == {"a": "COMPLETED", "b": "COMPLETED"}
    history = await _history(page)
    assert history[0] == "workflow.completed" and history[-1] == "workflow.created"
    assert history.count("workflow.node_completed") == 2


async def _room_and_negotiations(world: World, page: Page) -> None:
    await _open(page, "#/room/ops")
    cards = await page.value(
        "[...document.querySelectorAll('#page-body article[data-artifact]')].map((c) =>"
        " [c.dataset.artifact, c.querySelector('.badge').textContent,"
        " !!c.querySelector('.vote-deadline')])"
    )
    assert sorted(map(tuple, cards)) == sorted(
        [(world.decided_artifact, "APPROVED", False), (world.open_artifact, "OPEN", True)]
    )
    history = await _history(page)
    assert history.count("room.proposed") == 2 and history.count("room.voted") == 2
    assert "room.decided" in history

    await _open(page, "#/negotiation/neg-1")
    facts = await _facts(page)
    assert (facts["state"], facts["topic"], facts["participants"]) == (
        "DECIDED", "/api/neg-1", "frontend, graphql",
    )  # fmt: skip
    assert "deadline" not in facts and "round deadline" not in facts
    assert facts["stop reason"] == "threshold_met"
    assert "negotiation.decided" in await _history(page)
    assert await _count(page, "#page-body tr[data-round]") == 1
    await _open(page, "#/negotiation/neg-2")
    facts = await _facts(page)
    assert facts["state"] == "OPEN" and facts["deadline"].startswith("in ")
    assert await _history(page) == ["negotiation.opened"]


async def _hitl(world: World, page: Page) -> None:
    decided = f"#/hitl/{world.decided_hitl}"
    await _open(page, decided)
    # Reading an invocation needs an operator: the page says so and shows the history.
    assert "needs an operator" in await page.text("page-body")
    assert await _history(page) == ["hitl.decided", "hitl.opened"]
    assert not await page.hidden("signin")
    await page.value("document.getElementById('signin-credential').focus()")
    await page.call("Input.insertText", text=TOKEN)
    await page.value("document.querySelector('#signin-form button[type=submit]').click()")
    await page.until(
        "() => document.querySelector('#page-body article[data-invocation] .badge')",
        "the invocation",
    )
    facts = await _facts(page)
    assert facts["decision"] == "approve by olivia"
    assert facts["rationale"] == "reviewed the diff" and facts["about"] == "worker"
    assert await _count(page, "#page-body article .deadline") == 0
    assert await _count(page, "#page-body article button") == 0

    # A pending one: its deadline and the decision buttons, then live once decided elsewhere.
    await _open(page, f"#/hitl/{world.pending_hitl}")
    await page.until("() => document.querySelector('#page-body article .deadline')", "deadline")
    assert await _count(page, "#page-body article button") >= 3
    await world.call(
        "apiary.v1.HitlOperatorService/Decide",
        {"invocation_id": world.pending_hitl, "action": "deny", "rationale": "not now"},
        OPERATOR_HEADERS,
    )
    await page.until(
        "() => document.querySelector('#page-body article .badge').textContent === 'DECIDED'",
        "the decision, live",
    )
    assert await _count(page, "#page-body article .deadline") == 0
    assert (await _history(page))[0] == "hitl.decided"


async def _finished(world: World, page: Page) -> None:
    await page.value("document.querySelector('.views a[data-view=\"finished\"]').click()")
    rows = await _finished_rows(page, lambda rows: len(rows) == 50)
    assert rows[0][1] == world.pending_hitl  # decided last, listed first
    # Searching tasks by the start of their ids, with the form.
    await page.value("document.getElementById('finished-kind').value = 'task'")
    await page.value("document.getElementById('finished-q').focus()")
    await page.call("Input.insertText", text="task-ok")
    await page.value("document.querySelector('#finished-form button[type=submit]').click()")
    rows = await _finished_rows(page, lambda rows: len(rows) == 2)
    assert [r[:3] for r in rows] == [
        ["task", "task-ok-2", "COMPLETED"], ["task", "task-ok-1", "COMPLETED"],
    ]  # fmt: skip
    assert await page.value("location.hash") == "#/finished?kind=task&q=task-ok"
    # Paging: more HITL invocations than one page.
    await page.value("location.hash = '#/finished?kind=hitl'")
    rows = await _finished_rows(page, lambda rows: len(rows) == 50 and rows[0][0] == "hitl")
    assert not await page.hidden("finished-more")
    await page.value("document.getElementById('finished-more').click()")
    total = BULK + 2  # the bulk, the one decided first, the one decided while watching
    rows = await _finished_rows(page, lambda rows: len(rows) == total)
    assert await page.hidden("finished-more")
    assert len({r[1] for r in rows}) == total and {r[0] for r in rows} == {"hitl"}
    # A finished item opens its page.
    await page.value(
        f"document.querySelector('#finished-body a[href=\"#/hitl/{world.decided_hitl}\"]').click()"
    )
    await page.until(
        f"() => document.getElementById('page').dataset.loaded === 'hitl:{world.decided_hitl}'",
        "the invocation's page",
    )


async def _finished_rows(page: Page, done: Any) -> list[list[str]]:
    """The finished list's rows [kind, id, state] once `done(rows)` holds."""
    script = (
        "[...document.querySelectorAll('#finished-body tr[data-kind]')].map((r) =>"
        " [r.dataset.kind, r.dataset.id, r.querySelector('.badge').textContent])"
    )
    rows: Any = []
    for _ in range(20):
        rows = await page.until(f"() => {{ const r = {script}; return r.length && r; }}", "rows")
        if done(rows):
            return [list(r) for r in rows]
        shown = json.dumps(rows, separators=(",", ":"))  # as JSON.stringify writes it
        await page.until(f"() => JSON.stringify({script}) !== {json.dumps(shown)}", "a change")
    raise AssertionError(f"the finished work never showed what was expected: {rows}")


LAYOUT = """
(() => {
  const panel = document.getElementById('feed').getBoundingClientRect();
  const spilled = [];
  for (const row of document.querySelectorAll('#feed-body li')) {
    const box = row.getBoundingClientRect();
    if (box.right > panel.right + 0.5) spilled.push(`row #${row.dataset.seq} past the panel`);
    for (const cell of row.children) {
      const clipped = getComputedStyle(cell).overflowX === 'hidden';
      if (cell.scrollWidth > cell.clientWidth + 1 && !clipped) {
        spilled.push(`#${row.dataset.seq}: '${cell.textContent.slice(0, 40)}' overflows`);
      }
    }
  }
  return {spilled, page: document.documentElement.scrollWidth, window: window.innerWidth,
          rows: document.querySelectorAll('#feed-body li').length};
})()
"""


async def test_the_events_feed_stays_in_its_column(tmp_path: Path, chromium: Path) -> None:
    async with (
        open_world(tmp_path) as world,
        open_console(chromium, tmp_path / "profile", world.coordinator.http_address) as page,
    ):
        await page.call("Emulation.setDeviceMetricsOverride", width=1100, height=900,
                        deviceScaleFactor=1, mobile=False)  # fmt: skip
        long_actor = "operator:an-operator-with-a-rather-long-name@a-tenant-named-at-length"
        await world.coordinator.events.record(
            "console.a_very_long_event_type_name_that_goes_on_and_on", long_actor,
            agent_id="", correlation_id="c" * 200, blob="x" * 5000,
        )  # fmt: skip
        await page.shows("feed-body", "console.a_very_long_event_type_name")
        layout = await page.value(LAYOUT)
        assert layout["rows"] > 1
        assert layout["spilled"] == []
        assert layout["page"] <= layout["window"]
