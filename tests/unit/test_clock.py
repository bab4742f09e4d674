"""Injected time and ids: FakeClock with asyncio sleepers, SequentialIds, the real ones."""

from __future__ import annotations

import ast
import asyncio
import math
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.clock import Clock
from apiary.core.ids import IdGenerator, is_uuid4
from apiary.system import SystemClock, UuidIds
from apiary.testing import FakeClock, SequentialIds

CORE = Path(__file__).resolve().parents[2] / "src" / "apiary" / "core"
FORBIDDEN_IN_CORE = {"time", "asyncio", "grpc", "sqlite3", "psycopg", "random", "os"}


async def started(
    coro_fn: Callable[[float], Coroutine[object, object, None]], arg: float
) -> asyncio.Task[None]:
    """Start a sleeper task and let it reach its await."""
    task = asyncio.ensure_future(coro_fn(arg))
    await asyncio.sleep(0)
    return task


async def settle() -> None:
    """Let every woken task run to its next await (zero-length yields, no real waiting)."""
    for _ in range(5):
        await asyncio.sleep(0)


# --- FakeClock: time ----------------------------------------------------------------------


def test_starts_at_fixed_times() -> None:
    clock = FakeClock()
    assert clock.now() == 1_700_000_000.0
    assert clock.monotonic() == 0.0
    assert FakeClock(start=42.5).now() == 42.5


def test_advance_moves_both_clocks() -> None:
    clock = FakeClock(start=100.0)
    clock.advance(2.5)
    clock.advance(0)
    assert (clock.now(), clock.monotonic()) == (102.5, 2.5)


@pytest.mark.parametrize("step", [-0.001, -1.0, math.nan, math.inf, -math.inf])
def test_advance_refuses_backward_or_non_finite_steps(step: float) -> None:
    clock = FakeClock()
    with pytest.raises(ValueError, match="advance"):
        clock.advance(step)
    assert (clock.now(), clock.monotonic()) == (1_700_000_000.0, 0.0)


def test_set_wall_steps_wall_time_only() -> None:
    clock = FakeClock()
    clock.advance(5)
    clock.set_wall(10.0)
    assert (clock.now(), clock.monotonic()) == (10.0, 5.0)
    with pytest.raises(ValueError):
        clock.set_wall(math.nan)


def test_fakes_satisfy_the_protocols() -> None:
    clocks: list[Clock] = [FakeClock(), SystemClock()]
    ids: list[IdGenerator] = [SequentialIds(), UuidIds()]
    assert all(isinstance(c.now(), float) for c in clocks)
    assert all(is_uuid4(i.new_id()) for i in ids)


# --- FakeClock: sleepers ------------------------------------------------------------------


async def test_sleeper_wakes_only_when_advanced_past_its_deadline() -> None:
    clock = FakeClock()
    task = await started(clock.sleep, 10.0)
    assert clock.pending_sleepers == 1
    assert clock.next_deadline == 10.0
    clock.advance(9.999)
    await settle()
    assert not task.done()
    clock.advance(0.001)
    await settle()
    assert task.done()
    assert clock.pending_sleepers == 0
    assert clock.next_deadline is None


async def test_advance_wakes_in_deadline_order_ties_first_come() -> None:
    clock = FakeClock()
    woken: list[str] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woken.append(name)

    plan = [("c", 5.0), ("a", 1.0), ("b1", 3.0), ("b2", 3.0), ("late", 60.0)]
    tasks = [asyncio.ensure_future(sleeper(name, seconds)) for name, seconds in plan]
    await settle()
    assert clock.pending_sleepers == 5
    clock.advance(2.0)
    await settle()
    assert woken == ["a"]
    clock.advance(10.0)
    await settle()
    assert woken == ["a", "b1", "b2", "c"]
    assert clock.pending_sleepers == 1
    assert [t.done() for t in tasks] == [True, True, True, True, False]
    tasks[-1].cancel()
    await settle()
    assert clock.pending_sleepers == 0


async def test_sleep_until_uses_monotonic_deadline() -> None:
    clock = FakeClock()
    clock.advance(100.0)
    task = await started(clock.sleep_until, 150.0)
    clock.set_wall(0.0)  # a wall step must not matter to a monotonic deadline
    clock.advance(49.0)
    await settle()
    assert not task.done()
    clock.advance(1.0)
    await settle()
    assert task.done()


@pytest.mark.parametrize("seconds", [0.0, -5.0])
async def test_non_positive_sleep_returns_without_advance(seconds: float) -> None:
    clock = FakeClock()
    await asyncio.wait_for(clock.sleep(seconds), timeout=5)
    assert clock.pending_sleepers == 0


async def test_sleep_until_a_past_deadline_returns_at_once() -> None:
    clock = FakeClock()
    clock.advance(10.0)
    await asyncio.wait_for(clock.sleep_until(3.0), timeout=5)
    assert clock.pending_sleepers == 0


async def test_cancelled_sleeper_is_forgotten() -> None:
    clock = FakeClock()
    short = await started(clock.sleep, 1.0)
    long = await started(clock.sleep, 5.0)
    short.cancel()
    with pytest.raises(asyncio.CancelledError):
        await short
    assert clock.pending_sleepers == 1
    assert clock.next_deadline == 5.0
    clock.advance(10.0)
    await settle()
    assert long.done() and not long.cancelled()


async def test_many_cancelled_timers_do_not_accumulate() -> None:
    clock = FakeClock()
    tasks = [await started(clock.sleep, 100.0 + i) for i in range(200)]
    for task in tasks[:-1]:
        task.cancel()
    await settle()
    assert clock.pending_sleepers == 1
    assert len(clock._sleepers) < 200  # compaction ran
    clock.advance(1000.0)
    await settle()
    assert tasks[-1].done() and not tasks[-1].cancelled()


@given(
    durations=st.lists(st.floats(0.001, 100.0), min_size=1, max_size=12),
    steps=st.lists(st.floats(0.0, 40.0), min_size=1, max_size=12),
)
def test_sleepers_wake_exactly_when_due_in_deadline_order(
    durations: list[float], steps: list[float]
) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        woken: list[int] = []

        async def sleeper(index: int) -> None:
            await clock.sleep(durations[index])
            woken.append(index)

        tasks = [asyncio.ensure_future(sleeper(index)) for index in range(len(durations))]
        await settle()
        for step in steps:
            clock.advance(step)
            await settle()
            due = sorted(
                (i for i, d in enumerate(durations) if d <= clock.monotonic()),
                key=lambda i: (durations[i], i),
            )
            assert woken == due
            assert clock.pending_sleepers == len(durations) - len(due)
        clock.advance(1000.0)
        await settle()
        assert sorted(woken) == list(range(len(durations)))
        assert all(task.done() for task in tasks)

    asyncio.run(scenario())


# --- ids ------------------------------------------------------------------------------------


def test_sequential_ids_are_deterministic_valid_uuid4() -> None:
    first, second = SequentialIds(), SequentialIds()
    got = [first.new_id() for _ in range(50)]
    assert got == [second.new_id() for _ in range(50)]
    assert got[0] == "00000000-0000-4000-8000-000000000001"
    assert len(set(got)) == 50
    for value in got:
        assert is_uuid4(value)
        assert uuid.UUID(value).version == 4
        assert uuid.UUID(value).variant == uuid.RFC_4122


def test_sequential_id_streams_do_not_collide() -> None:
    a, b = SequentialIds(stream=1), SequentialIds(stream=2)
    assert {a.new_id() for _ in range(20)}.isdisjoint({b.new_id() for _ in range(20)})


@pytest.mark.parametrize("kwargs", [{"start": -1}, {"start": 1 << 62}, {"stream": 1 << 32}])
def test_sequential_ids_reject_out_of_range_arguments(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        SequentialIds(**kwargs)


def test_sequential_ids_refuse_to_wrap() -> None:
    ids = SequentialIds(start=(1 << 62) - 1)
    assert is_uuid4(ids.new_id())
    with pytest.raises(OverflowError):
        ids.new_id()


@given(st.integers(0, (1 << 62) - 1), st.integers(0, (1 << 32) - 1))
def test_sequential_ids_always_valid(start: int, stream: int) -> None:
    assert is_uuid4(SequentialIds(start=start, stream=stream).new_id())


def test_system_implementations() -> None:
    ids = UuidIds()
    assert is_uuid4(ids.new_id())
    assert ids.new_id() != ids.new_id()
    clock = SystemClock()
    first = clock.monotonic()
    assert clock.monotonic() >= first
    assert clock.now() > 1_600_000_000


@given(st.uuids(version=4))
def test_is_uuid4_accepts_every_uuid4_in_either_case(value: uuid.UUID) -> None:
    assert is_uuid4(str(value))
    assert is_uuid4(str(value).upper())


@given(st.uuids().filter(lambda u: u.version != 4))
def test_is_uuid4_rejects_other_versions(value: uuid.UUID) -> None:
    assert not is_uuid4(str(value))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not-a-uuid",
        "6ae58b74-4e19-1b2f-9e7a-1a1a1fd2d001",  # version 1
        "6ae58b74-4e19-4b2f-7e7a-1a1a1fd2d001",  # NCS variant
        "6ae58b74-4e19-4b2f-ce7a-1a1a1fd2d001",  # Microsoft variant
        "6ae58b744e194b2f9e7a1a1a1fd2d001",  # no hyphens
        "{6ae58b74-4e19-4b2f-9e7a-1a1a1fd2d001}",
        "urn:uuid:6ae58b74-4e19-4b2f-9e7a-1a1a1fd2d001",
        "6ae58b74-4e19-4b2f-9e7a-1a1a1fd2d001\n",
        " 6ae58b74-4e19-4b2f-9e7a-1a1a1fd2d001",
        "6ae58b74-4e19-4b2f-9e7a-1a1a1fd2d00g",
    ],
)
def test_is_uuid4_rejects(text: str) -> None:
    assert not is_uuid4(text)


def test_core_never_imports_clocks_io_or_randomness() -> None:
    # The import-linter contract covers some of these; random and os matter just as much
    # for determinism, and this check runs with the unit tests.
    for path in sorted(CORE.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN_IN_CORE, f"{path.name} imports {name}"
