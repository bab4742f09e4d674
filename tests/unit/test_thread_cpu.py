"""server/thread_cpu: a thread's CPU ticks from its /proc stat line, whatever its name."""

from __future__ import annotations

import threading

from apiary.server.thread_cpu import stat_cpu_ticks, thread_cpu_seconds


def test_the_ticks_are_counted_after_the_command_name_whatever_it_holds() -> None:
    # Field 2 is the command name in parentheses; it may hold spaces and parentheses.
    fields = " ".join(["S", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "150", "25"])
    assert stat_cpu_ticks(f"4242 (python) {fields} 0 0 20") == 175
    assert stat_cpu_ticks(f"4242 (a (b) c) {fields} 0 0 20") == 175


def test_the_threads_of_this_process_are_listed_by_name() -> None:
    done = threading.Event()

    def spin() -> None:
        while not done.is_set():
            sum(range(10_000))

    worker = threading.Thread(target=spin, name="cpu-test-worker")
    worker.start()
    try:
        seconds = thread_cpu_seconds()
    finally:
        done.set()
        worker.join()
    assert {"MainThread", "cpu-test-worker"} <= set(seconds)
    assert all(value >= 0 for value in seconds.values())
