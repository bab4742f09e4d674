"""Checks of the swarm store (`SwarmStore`): the Agent Swarm Protocol's inbox (idempotent on
message_id, statuses, recent listings capped at 100) and outbox (per destination)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from apiary.core.swarm_mail import InboxEntry, OutboxEntry, SwarmMail
from apiary.testing.store_suite.base import T0, UNICODE, Check, StoreFactory, registry

CHECKS: list[Check] = []
_check = registry(CHECKS)

SWARM_A = "550e8400-e29b-41d4-a716-446655440000"
SWARM_B = "6ba7b810-9dad-11d1-80b4-00c04fd430c8"


def mail(n: int, swarm_id: str = SWARM_A, **fields: Any) -> SwarmMail:
    """A plain message numbered `n` (its id sorts by n)."""
    values: dict[str, Any] = {
        "message_id": f"00000000-0000-4000-8000-{n:012d}",
        "swarm_id": swarm_id,
        "sender_id": "agent-a",
        "recipient_id": "broadcast",
        "message_type": "message",
        "content": f"message {n}",
    }
    values.update(fields)
    return SwarmMail(**values)


def _full() -> SwarmMail:
    wire = {
        "protocol_version": "0.1.0", "message_id": "m-full", "signature": "c2ln",
        "sender": {"agent_id": "agent-a", "endpoint": "https://a.example.com/swarm"},
        "action": "member_joined", "nested": {"list": [1, 2.5, None, True, UNICODE]},
    }  # fmt: skip
    return SwarmMail(
        message_id="m-full", swarm_id=SWARM_A, sender_id=f"agent {UNICODE}",
        recipient_id="agent-b", message_type="notification", content=UNICODE * 50,
        sent_at="2026-02-05T14:30:00.000Z", in_reply_to="m-0", thread_id="t-1",
        priority="high", expires_at="2026-02-06T14:30:00.000Z",
        references=({"type": "github_issue", "repo": "o/r", "number": 3, "action": "claimed"},),
        attachments=({"type": "inline", "mime_type": "text/plain", "content": "aGk="},),
        metadata={"to": "reviewer", "n": 1, "deep": {"x": [UNICODE]}}, wire=wire,
    )  # fmt: skip


def _ids(entries: list[InboxEntry] | list[OutboxEntry]) -> list[str]:
    return [e.mail.message_id for e in entries]


@_check
async def swarm_inbox_keeps_every_field_and_ignores_a_repost(factory: StoreFactory) -> None:
    full = InboxEntry(_full(), T0)
    minimal = InboxEntry(mail(1), T0 + 1)
    async with factory.open() as store:
        assert await store.swarm.inbox_get("m-full") is None
        assert await store.swarm.receive(full)
        assert await store.swarm.receive(minimal)
        assert await store.swarm.inbox_get("m-full") == full
        got = await store.swarm.inbox_get(minimal.mail.message_id)
        assert got == minimal
        assert got is not None
        assert (got.status, got.read_at, got.deleted_at, got.mail.priority) == (
            "unread", None, None, "normal",
        )  # fmt: skip
        assert (got.mail.in_reply_to, got.mail.thread_id, got.mail.expires_at) == (None,) * 3
        # A re-post of the same message_id is ignored, whatever it carries now.
        again = InboxEntry(replace(_full(), content="altered"), T0 + 5)
        assert not await store.swarm.receive(again)
        assert await store.swarm.inbox_get("m-full") == full
    if factory.durable:
        async with factory.open() as store:
            assert await store.swarm.inbox_get("m-full") == full


@_check
async def swarm_recent_is_newest_first_per_swarm_and_capped(factory: StoreFactory) -> None:
    async with factory.open() as store:
        for n in range(105):
            await store.swarm.receive(InboxEntry(mail(n), T0 + n))
        await store.swarm.receive(InboxEntry(mail(200, SWARM_B), T0 + 50.5))
        recent = await store.swarm.list_recent(SWARM_A, limit=1000)
        assert len(recent) == 100
        assert _ids(recent) == [mail(n).message_id for n in range(104, 4, -1)]
        assert _ids(await store.swarm.list_recent(SWARM_A, limit=2)) == [
            mail(104).message_id, mail(103).message_id,
        ]  # fmt: skip
        everywhere = await store.swarm.list_recent(limit=56)
        assert _ids(everywhere[-3:]) == [
            mail(51).message_id, mail(200, SWARM_B).message_id, mail(50).message_id,
        ]  # fmt: skip
        assert _ids(await store.swarm.list_recent(SWARM_B)) == [mail(200).message_id]
        assert await store.swarm.list_recent("no-such-swarm") == []
        assert await store.swarm.list_recent(limit=0) == []
        for bad in (-1,):
            try:
                await store.swarm.list_recent(limit=bad)
            except ValueError:
                pass
            else:
                raise AssertionError("a negative limit must be refused")


@_check
async def swarm_recent_ties_break_by_message_id(factory: StoreFactory) -> None:
    async with factory.open() as store:
        for n in (2, 3, 1):
            await store.swarm.receive(InboxEntry(mail(n), T0))
        assert _ids(await store.swarm.list_recent()) == [
            mail(3).message_id, mail(2).message_id, mail(1).message_id,
        ]  # fmt: skip


@_check
async def swarm_statuses_move_and_deleted_leaves_listings(factory: StoreFactory) -> None:
    async with factory.open() as store:
        for n in range(4):
            await store.swarm.receive(InboxEntry(mail(n), T0 + n))
        first = mail(0).message_id
        read = await store.swarm.set_status(first, "read", T0 + 10)
        assert read is not None
        assert (read.status, read.read_at, read.deleted_at) == ("read", T0 + 10, None)
        archived = await store.swarm.set_status(first, "archived", T0 + 11)
        assert archived is not None
        assert (archived.status, archived.read_at) == ("archived", T0 + 10)  # first read kept
        deleted = await store.swarm.set_status(mail(1).message_id, "deleted", T0 + 12)
        assert deleted is not None
        assert (deleted.status, deleted.read_at, deleted.deleted_at) == ("deleted", None, T0 + 12)
        assert await store.swarm.set_status("unknown", "read", T0) is None
        assert _ids(await store.swarm.list_recent()) == [
            mail(3).message_id, mail(2).message_id, first,
        ]  # fmt: skip
        only = await store.swarm.list_recent(statuses=frozenset({"deleted", "archived"}))
        assert _ids(only) == [mail(1).message_id, first]
        assert await store.swarm.list_recent(statuses=frozenset()) == []
        # A deleted message is still known: a replay of its id is recognised.
        assert await store.swarm.inbox_get(mail(1).message_id) == deleted
        assert not await store.swarm.receive(InboxEntry(mail(1), T0 + 20))
        for bad in ("gone", "READ"):
            for call in (
                store.swarm.set_status(first, bad, T0),
                store.swarm.list_recent(statuses=frozenset({bad})),
            ):
                try:
                    await call
                except ValueError:
                    continue
                raise AssertionError(f"status {bad!r} must be refused")


@_check
async def swarm_thread_latest_finds_the_conversation(factory: StoreFactory) -> None:
    async with factory.open() as store:
        opening = mail(1, thread_id=None)
        reply = mail(2, thread_id=opening.message_id, in_reply_to=opening.message_id)
        later = mail(3, thread_id=opening.message_id)
        other = mail(4, thread_id="t-other")
        for n, item in enumerate((opening, reply, later, other)):
            await store.swarm.receive(InboxEntry(item, T0 + n))
        found = await store.swarm.thread_latest(opening.message_id)
        assert found is not None
        assert found.mail == later
        only = await store.swarm.thread_latest(other.message_id)
        assert only is not None
        assert only.mail == other
        assert await store.swarm.thread_latest("nothing") is None


@_check
async def swarm_outbox_rows_are_per_destination(factory: StoreFactory) -> None:
    full = OutboxEntry(_full(), "agent-b", T0, "failed", 3, T0 + 9, f"refused: {UNICODE}")
    async with factory.open() as store:
        assert await store.swarm.outbox_get("m-full") == []
        broadcast = mail(1)
        for destination in ("agent-c", "agent-b"):
            await store.swarm.outbox_put(OutboxEntry(broadcast, destination, T0 + 1))
        await store.swarm.outbox_put(full)
        rows = await store.swarm.outbox_get(broadcast.message_id)
        assert [(r.destination, r.status, r.attempts) for r in rows] == [
            ("agent-b", "sent", 0), ("agent-c", "sent", 0),
        ]  # fmt: skip
        delivered = replace(rows[0], status="delivered", attempts=1, updated_at=T0 + 2)
        await store.swarm.outbox_put(delivered)
        rows = await store.swarm.outbox_get(broadcast.message_id)
        assert rows[0] == delivered
        assert rows[1].status == "sent"
        assert await store.swarm.outbox_get("m-full") == [full]
        recent = await store.swarm.outbox_recent()
        assert [(r.mail.message_id, r.destination) for r in recent] == [
            (broadcast.message_id, "agent-c"), (broadcast.message_id, "agent-b"),
            ("m-full", "agent-b"),
        ]  # fmt: skip
        failed = await store.swarm.outbox_recent(statuses=frozenset({"failed"}))
        assert failed == [full]
        assert await store.swarm.outbox_recent(SWARM_B) == []
        assert len(await store.swarm.outbox_recent(limit=1)) == 1
    if factory.durable:
        async with factory.open() as store:
            assert await store.swarm.outbox_get("m-full") == [full]


@_check
async def swarm_outbox_pending_rows_come_soonest_first(factory: StoreFactory) -> None:
    rows = [
        OutboxEntry(mail(1), "agent-b", T0, "retrying", 3, T0 + 1, "503", T0 + 60),
        OutboxEntry(mail(2), "agent-b", T0 + 5, "sent"),
        OutboxEntry(mail(3), "agent-b", T0, "retrying", 4, T0 + 2, "timeout", T0 + 30),
        OutboxEntry(mail(4), "agent-b", T0, "delivered", 1, T0 + 1),
        OutboxEntry(mail(5), "agent-b", T0, "failed", 1, T0 + 1, "400"),
        OutboxEntry(mail(6), "agent-c", T0 + 1, "sent"),
    ]
    async with factory.open() as store:
        assert await store.swarm.outbox_pending() == []
        for row in rows:
            await store.swarm.outbox_put(row)
        pending = await store.swarm.outbox_pending()
        # Sent rows (due at 0: not yet tried, or orphaned by a crash) first, by age.
        assert [(r.mail.message_id[-2:], r.destination) for r in pending] == [
            ("06", "agent-c"), ("02", "agent-b"), ("03", "agent-b"), ("01", "agent-b"),
        ]  # fmt: skip
        assert pending[3] == rows[0]  # next_attempt_at survives the round trip
        assert len(await store.swarm.outbox_pending(limit=2)) == 2
        try:
            await store.swarm.outbox_pending(limit=-1)
        except ValueError:
            pass
        else:
            raise AssertionError("a negative limit must be refused")
        await store.swarm.outbox_put(replace(rows[0], status="delivered", next_attempt_at=0))
        assert len(await store.swarm.outbox_pending()) == 3
    if factory.durable:
        async with factory.open() as store:
            assert [r.mail.message_id[-2:] for r in await store.swarm.outbox_pending()] == [
                "06",
                "02",
                "03",
            ]


@_check
async def swarm_store_refuses_what_no_backend_can_hold(factory: StoreFactory) -> None:
    bad_entries = [
        InboxEntry(mail(1, content="nul \x00 inside"), T0),
        InboxEntry(mail(2, metadata={"k": "nul \x00"}), T0),
        InboxEntry(mail(3, message_id=""), T0),
        InboxEntry(mail(4), T0, status="pending"),
        InboxEntry(mail(5, metadata={"nan": float("nan")}), T0),
    ]
    async with factory.open() as store:
        for entry in bad_entries:
            try:
                await store.swarm.receive(entry)
            except ValueError:
                continue
            raise AssertionError(f"{entry} must be refused")
        try:
            await store.swarm.outbox_put(OutboxEntry(mail(6), "agent-b", T0, status="queued"))
        except ValueError:
            pass
        else:
            raise AssertionError("an unknown outbox status must be refused")
        assert await store.swarm.list_recent() == []
        assert await store.swarm.outbox_recent() == []
