"""An admission whose COMMIT PostgreSQL carried out but whose answer the connection lost
(tests/server/pg_commit_cut.py): the router cannot tell from the write whether it
committed, reads back what the store holds and answers each member as it stands. A member
admitted is accepted; a member the committed transaction refused because another attempt
of its token came first (another replica's, here a transaction of the test's own that
inserts the token's record while the admission waits for it) is answered from that record
(already_in_progress naming the other attempt), and one whose record does not refuse it is
answered `unavailable` (its outcome is not known: a retry is answered rightly). Never
"message_id already used": nothing else holds its id."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import psycopg
import pytest
from psycopg import sql

from apiary.engine.router.dedup_gate import cache_key
from apiary.server.inprocess import open_test_coordinator
from apiary.store.protocols import MessageStore
from apiary.wire import pb
from tests.server.pg_commit_cut import CommitCut
from tests.server.wire_client import envelope, register

WAIT_S = 30.0


@dataclass
class Cut:
    channel: grpc.aio.Channel
    proxy: CommitCut
    application: str
    messages: MessageStore


@asynccontextmanager
async def _coordinator(tmp_path: Path, dsn: str, schema: str) -> AsyncIterator[Cut]:
    """A coordinator whose store connections go through a `CommitCut` proxy."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    application = f"apiary-doubt-{uuid.uuid4().hex[:8]}"
    async with CommitCut(
        str(params.get("host", "127.0.0.1")), int(str(params.get("port", 5432)))
    ) as proxy:
        url = (
            f"postgresql://{params.get('user', 'postgres')}@127.0.0.1:{proxy.port}/"
            f"{params.get('dbname', 'test')}?apiary_schema={schema}&sslmode=disable"
            f"&application_name={application}"
        )
        async with (
            open_test_coordinator(tmp_path, url) as coordinator,
            grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel,
        ):
            await register(channel, "alice", "bob")
            yield Cut(channel, proxy, application, coordinator.store.messages)


async def _waits_on_a_lock(admin: psycopg.AsyncConnection, application: str) -> None:
    for _ in range(600):
        cursor = await admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
            " AND wait_event_type = 'Lock'",
            (application,),
        )
        row = await cursor.fetchone()
        if row is not None and row[0] > 0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the admission never waited for the other attempt's token")


@pytest.mark.parametrize(
    ("status", "answer"),
    [("RECEIVED", "already_in_progress"), ("TIMED_OUT", "unavailable")],
)
async def test_a_member_refused_by_a_commit_in_doubt_is_answered_from_its_tokens_record(
    tmp_path: Path, postgres_dsn: str, postgres_schema: str, status: str, answer: str
) -> None:
    async with _coordinator(tmp_path, postgres_dsn, postgres_schema) as cut:
        ops = [f"op-{uuid.uuid4().hex[:8]}" for _ in range(2)]
        first = envelope("alice", {"n": 1}, idempotency_token=ops[0])
        second = envelope("alice", {"n": 2}, idempotency_token=ops[1])
        other = f"other-{uuid.uuid4().hex[:8]}"
        insert = sql.SQL(
            "INSERT INTO {}.idempotency (token, producer_id, original_message_id,"
            " current_message_id, status, created_at, updated_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)"
        ).format(sql.Identifier(postgres_schema))
        now = time.time()
        async with (
            await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as admin,
            await psycopg.AsyncConnection.connect(postgres_dsn) as rival,
        ):
            # Another attempt of the second's token (as another replica's would be), not
            # committed yet: the admission's check does not see it, its claim waits for it.
            await rival.execute(
                insert, (cache_key("alice", ops[1]), "alice", other, other, status, now, now)
            )
            # The admission's transaction writes the first's token record (its key is in no
            # other transaction's parameters: events carry the token alone).
            lost = cut.proxy.arm(cache_key("alice", ops[0]).encode())
            call = pb.apiary_pb2_grpc.RouterStreamServiceStub(cut.channel).SendStream()
            await call.write(apiary_frame((first, "bob"), (second, "bob")))
            reply = asyncio.create_task(call.read())
            await _waits_on_a_lock(admin, cut.application)
            await rival.commit()
            answered = await asyncio.wait_for(reply, WAIT_S)
            await call.done_writing()
        assert lost.is_set(), "the COMMIT's answer was not lost"
        results = [(r.message_id, r.accepted, r.error_code) for r in answered.results]
        assert results == [(first.message_id, True, ""), (second.message_id, False, answer)]
        if answer == "already_in_progress":
            assert other in answered.results[1].reason
        assert (await cut.messages.get(first.message_id)) is not None
        assert (await cut.messages.get(second.message_id)) is None


def apiary_frame(*items: tuple[pb.common_pb2.Envelope, str]) -> pb.apiary_pb2.SendFrame:
    return pb.apiary_pb2.SendFrame(
        items=[pb.apiary_pb2.OutboundEnvelope(msg=m, recipient=r) for m, r in items]
    )
