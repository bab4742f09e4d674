"""Durable appends/s: the SQLite store's group commit vs. one commit per row.

    .venv/bin/python bench/store_commit.py [--n 20000] [--in-flight 64]

Both sides use WAL with synchronous=NORMAL on a fresh file in a temporary directory; each
append is durable (committed) before it counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import tempfile
import threading
import time
from pathlib import Path

from apiary.core.events import EventDraft
from apiary.store.sqlite.store import open_sqlite_store


def _draft(i: int) -> EventDraft:
    return EventDraft("bench.event", "bench", ts=time.time(), correlation_id=f"c{i % 97}")


def baseline(path: Path, n: int, in_flight: int) -> float:
    """One INSERT + COMMIT per row, `in_flight` threads sharing one writer lock."""
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE events (seq INTEGER PRIMARY KEY, type TEXT, details TEXT)")
    lock = threading.Lock()
    per_thread = n // in_flight

    def work() -> None:
        for _ in range(per_thread):
            with lock:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("INSERT INTO events (type, details) VALUES (?, ?)", ("b", "{}"))
                conn.execute("COMMIT")

    threads = [threading.Thread(target=work) for _ in range(in_flight)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    conn.close()
    return per_thread * in_flight / elapsed


async def apiary_store(path: Path, n: int, in_flight: int) -> tuple[float, int]:
    async with open_sqlite_store(path) as store:
        per_task = n // in_flight

        async def work(k: int) -> None:
            for i in range(per_task):
                await store.events.append([_draft(k * per_task + i)])

        started = time.perf_counter()
        await asyncio.gather(*(work(k) for k in range(in_flight)))
        elapsed = time.perf_counter() - started
        return per_task * in_flight / elapsed, store.stats.writer.commits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--in-flight", type=int, default=64)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, flight in (("sequential", 1), (f"{args.in_flight} in flight", args.in_flight)):
            n = args.n if flight > 1 else max(args.n // 4, 1)
            base = baseline(Path(tmp) / f"base-{flight}.db", n, flight)
            ours, commits = asyncio.run(apiary_store(Path(tmp) / f"apiary-{flight}.db", n, flight))
            rows.append(
                {"case": label, "appends": n, "baseline_per_s": round(base),
                 "apiary_per_s": round(ours), "ratio": round(ours / base, 2), "commits": commits}
            )  # fmt: skip
    print(f"{'case':<16}{'appends':>9}{'baseline/s':>12}{'apiary/s':>10}{'ratio':>7}{'commits':>9}")
    for r in rows:
        print(
            f"{r['case']:<16}{r['appends']:>9}{r['baseline_per_s']:>12}{r['apiary_per_s']:>10}"
            f"{r['ratio']:>7}{r['commits']:>9}"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
