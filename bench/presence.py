"""Presence benchmark: a fleet registering, with its agents away and with them connected.

    .venv/bin/python bench/presence.py [--agents 300] [--store sqlite|memory]

Against the real engine (`apiary.testing.open_test_engine`: registry, presence, router,
delivery, event log) over a fresh SQLite file per run. Each agent is registered as
RegistryService.RegisterAgent does (`EngineHarness.register`: the registry, then its join
announced):

- away: N agents register and none opens its stream (a fleet whose processes are still
  starting). Nothing is announced to an agent that cannot read it: it gets the directory
  when its stream opens.
- connected (the baseline): each agent opens its stream right after registering, so every
  join is announced to every agent connected before it, N(N-1)/2 notices in all, as every
  join was announced to every registered agent before presence followed connections.

Prints registrations per second, notices stored, and one heartbeat round's time, side by
side, with the ratio of the two.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from apiary.testing.engine import open_test_engine


async def _fleet(agents: int, connect: bool, store: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/apiary.db" if store == "sqlite" else "memory://"
        async with open_test_engine(store_url=url, data_dir=Path(tmp)) as h:
            started = time.perf_counter()
            for n in range(agents):
                await h.register(f"agent-{n}")
                if connect:
                    await h.connect(f"agent-{n}")
            seconds = time.perf_counter() - started
            rows = 0
            for n in range(agents):
                rows += len(await h.store.messages.inbox(f"agent-{n}", 0, 1_000_000))
            started = time.perf_counter()
            await h.engine.presence.tick()
            tick = time.perf_counter() - started
    return {
        "agents": agents, "seconds": round(seconds, 3),
        "registrations_per_s": round(agents / seconds), "notices": rows,
        "heartbeat_round_ms": round(tick * 1000, 1),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=300)
    parser.add_argument("--store", choices=("sqlite", "memory"), default="sqlite")
    args = parser.parse_args()
    away = asyncio.run(_fleet(args.agents, False, args.store))
    connected = asyncio.run(_fleet(args.agents, True, args.store))
    print(f"{'fleet':<11}{'agents':>8}{'reg/s':>9}{'notices':>10}{'beat ms':>9}")
    for label, row in (("away", away), ("connected", connected)):
        print(f"{label:<11}{row['agents']:>8}{row['registrations_per_s']:>9}"
              f"{row['notices']:>10}{row['heartbeat_round_ms']:>9}")  # fmt: skip
    ratio = away["registrations_per_s"] / max(connected["registrations_per_s"], 1)
    print(f"registrations, away vs connected: {ratio:.1f}x")


if __name__ == "__main__":
    main()
