"""Cutting a coordinator's PostgreSQL connections from the database side, again and again:
`pg_terminate_backend` of every backend whose application_name is the one the coordinator's
store URL gives its pool (its claim connection carries another name and re-takes itself).
What the tests of honest answers under store faults share."""

from __future__ import annotations

import asyncio

import psycopg

CUT_EVERY_S = 0.2


def cut_url(dsn: str, schema: str, application: str) -> str:
    """The store URL of a coordinator whose pool connections carry `application`."""
    return f"{dsn}?apiary_schema={schema}&application_name={application}"


async def cut_until(
    stop: asyncio.Event, dsn: str, application: str, every_s: float = CUT_EVERY_S
) -> int:
    """Terminate the backends named `application` every `every_s` until `stop`; how many."""
    cut = 0
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
        while not stop.is_set():
            rows = await (
                await admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = %s AND pid <> pg_backend_pid()",
                    (application,),
                )
            ).fetchall()
            cut += sum(1 for (done,) in rows if done)
            await asyncio.sleep(every_s)
    return cut
