"""What SQLite alone costs per routed message: the rows the coordinator writes, nothing else.

    .venv/bin/python bench/store_rows.py [--messages 30000] [--frame 200] [--rounds 3]

A streamed message that its consumer fulfils soon leaves the SQLite store four rows: its
admission (a `messages` row and a `message.received` event) and its FULFILLED state change
(the row's update and a `message.state` event). Here exactly those statements, the store's
own write functions on its own schema (every migration applied), run on a connection with
the store's settings and its WAL checkpointer, a transaction per frame as the writer's group
commit makes them (a frame's FULFILLED changes eight frames after its admission, as with
route.py's window of eight frames in flight), with every row built before the clock starts:
the CPU they take (the checkpointer's included) is SQLite's share of a routed message,
without the event loop, the writer's job hand-over or gRPC.

Side by side, in the same run, on the same disk:
- `routed, ordered ids`: the same rows, but the message ids (UUIDv4s in form, as producers
  send them) made to sort in admission order: what the random primary key costs;
- `one row`: each message one row of its envelope bytes in a table keyed by an integer, a
  transaction per frame: about the least a durable admission can write per message;
- `one row per frame`: the whole frame's envelopes as one row (a journal of frames).

`docs/performance.md` uses the figures in the CPU budget of the streaming target.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from itertools import zip_longest
from pathlib import Path
from sqlite3 import Connection
from typing import Any

from apiary.core.events import EventDraft
from apiary.core.records import MessageState, StateChange, StoredMessage
from apiary.store.open import open_store
from apiary.store.sql.admission import admit_new
from apiary.store.sql.dialect import SQLITE
from apiary.store.sql.events import append_events, event_rows
from apiary.store.sql.message_rows import message_values
from apiary.store.sql.messages import apply_changes, change_params
from apiary.store.sql.sqlite import run_transaction
from apiary.store.sqlite.checkpoint import WalCheckpointer
from apiary.store.sqlite.database import SqliteOptions, connect_sqlite, enable_wal

Frame = Callable[[Connection], None]
"""Writes one frame's rows (the caller runs it in a transaction of its own)."""


def _messages(n: int, frame: int) -> list[StoredMessage]:
    """`n` admitted messages, a frame's sharing its admission time (as the router's do),
    frames 10 ms apart, each with the default 10 s ACK deadline."""
    start = time.time()
    made = []
    for i in range(n):
        now = start + i // frame * 0.01
        message_id = str(uuid.uuid4())
        envelope = b"\n$" + message_id.encode() + b"\x12\x08producer" + b"x" * 120
        # Positional, in StoredMessage's field order (see Router._record).
        made.append(StoredMessage(
            message_id, "consumer", "producer", message_id, 1, envelope, MessageState.RECEIVED,
            now, now, 0, "", "", i + 1, "STANDARD", now + 10.0, 0.0, 0, 0.0, "", b"",
        ))  # fmt: skip
    return made


def _ordered(messages: list[StoredMessage]) -> list[StoredMessage]:
    """`messages` with ids of the same form and length that sort in admission order."""
    return [
        replace(m, message_id=f"{i:08x}{m.message_id[8:]}", correlation_id=m.message_id)
        for i, m in enumerate(messages)
    ]


def _admit(values: list[tuple[Any, ...]], events: list[tuple[Any, ...]], conn: Connection) -> None:
    run_transaction(conn, admit_new, (values,))
    run_transaction(conn, append_events, (events,))


def _fulfil(params: list[tuple[Any, ...]], events: list[tuple[Any, ...]], conn: Connection) -> None:
    run_transaction(conn, apply_changes, (params, False))  # the store's `record`
    run_transaction(conn, append_events, (events,))


FULFIL_LAG = 8
"""Frames between a frame's admission and its FULFILLED changes (route.py's window)."""


def _routed(messages: list[StoredMessage], frame: int) -> list[Frame]:
    """The admission frames and the FULFILLED frames as the store writes them, each frame's
    changes `FULFIL_LAG` admissions after its own."""
    admits: list[Frame] = []
    fulfils: list[Frame] = []
    for start, part in zip(range(0, len(messages), frame), _parts(messages, frame), strict=True):
        now = part[0].created_at
        received = event_rows(SQLITE, [
            EventDraft("message.received", m.producer_id, now, m.correlation_id, m.recipient,
                       {"message_id": m.message_id, "message_type": "DATA", "offset": i + 1,
                        "lane": m.lane})
            for i, m in enumerate(part, start)
        ])  # fmt: skip
        admits.append(partial(_admit, [message_values(m) for m in part], received))
        changes = [
            StateChange(m.message_id, MessageState.FULFILLED, now, "", "FULFILLED", True, 1, now)
            for m in part
        ]
        state = event_rows(SQLITE, [
            EventDraft("message.state", m.recipient, now, m.correlation_id, m.recipient,
                       {"message_id": m.message_id, "from": "RECEIVED", "to": "FULFILLED",
                        "input": "ACK_FULFILLED", "error_code": ""})
            for m in part
        ])  # fmt: skip
        fulfils.append(partial(_fulfil, change_params(changes), state))
    lagging = [*([None] * FULFIL_LAG), *fulfils]
    return [w for pair in zip_longest(admits, lagging) for w in pair if w is not None]


def _insert_bodies(rows: list[tuple[bytes]], conn: Connection) -> None:
    conn.executemany("INSERT INTO journal (body) VALUES (?)", rows)


def _parts(messages: list[StoredMessage], frame: int) -> list[list[StoredMessage]]:
    return [messages[start : start + frame] for start in range(0, len(messages), frame)]


def _one_row(messages: list[StoredMessage], frame: int) -> list[Frame]:
    return [
        partial(_insert_bodies, [(m.envelope,) for m in part]) for part in _parts(messages, frame)
    ]


def _frame_row(messages: list[StoredMessage], frame: int) -> list[Frame]:
    return [
        partial(_insert_bodies, [(b"".join(m.envelope for m in part),)])
        for part in _parts(messages, frame)
    ]


def _schema(path: Path) -> None:
    """The store's schema, every migration applied (the store opens and closes once)."""

    async def create() -> None:
        async with open_store(f"sqlite:///{path}", path.parent):
            pass

    asyncio.run(create())
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE journal (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
    conn.commit()
    conn.close()


def _run(frames: list[Frame], path: Path) -> float:
    """CPU seconds (the process's: the checkpointer thread included) of running `frames`, a
    transaction each, on `path` with the store's connection settings and WAL checkpointer."""
    options = SqliteOptions()
    conn = connect_sqlite(path, options)
    enable_wal(conn, options)
    checkpointer = WalCheckpointer(
        connect_sqlite(path, options),
        every_changes=options.checkpoint_every_changes,
        restart_frames=options.wal_restart_frames,
    )
    checkpointer.start()
    started = time.process_time()
    for write in frames:
        conn.execute("BEGIN IMMEDIATE")
        write(conn)
        conn.execute("COMMIT")
        checkpointer.note_commit(conn)
    spent = time.process_time() - started
    checkpointer.stop()
    conn.close()
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=30000)
    parser.add_argument("--frame", type=int, default=200, help="messages per transaction")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each, in turns")
    args = parser.parse_args()
    if args.messages < 1 or args.frame < 1 or args.rounds < 1:
        parser.error("--messages, --frame and --rounds must be at least 1")
    patterns = {
        "routed (4 rows)": _routed,
        "routed, ordered ids": lambda messages, frame: _routed(_ordered(messages), frame),
        "one row": _one_row,
        "one row per frame": _frame_row,
    }
    spent: dict[str, list[float]] = {name: [] for name in patterns}
    with tempfile.TemporaryDirectory() as tmp:
        template = Path(tmp) / "template.db"
        _schema(template)
        for round_ in range(args.rounds):
            for name, build in patterns.items():
                messages = _messages(args.messages, args.frame)
                frames = build(messages, args.frame)
                path = Path(tmp) / f"{round_}-{name}" / "apiary.db"
                path.parent.mkdir()
                path.write_bytes(template.read_bytes())
                spent[name].append(_run(frames, path))
    n = args.messages
    print(f"{n} messages, {args.frame} per transaction, median of {args.rounds} runs each")
    print(f"{'rows per message':<22}{'CPU us/msg':>11}{'ratio':>7}")
    floor = statistics.median(spent["one row"])
    for name, runs in spent.items():
        median = statistics.median(runs)
        print(f"{name:<22}{median / n * 1e6:>11.1f}{median / floor:>7.2f}")


if __name__ == "__main__":
    main()
