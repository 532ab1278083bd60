"""bench/run.py's workloads by name, and :func:`run`: one workload in a fresh (spawned) process."""

from __future__ import annotations

import functools
import multiprocessing
import resource
import sys
from collections.abc import Callable
from queue import Empty
from typing import Any

from bench.aio_workloads import _tasks, follow_latency
from bench.common import ROOT, Result, Setup
from bench.follow import follow_idle, follow_latency_process
from bench.workloads import (
    append_batch_10,
    append_batch_100,
    append_into_full_room,
    append_single,
    append_with_many_rooms,
    core_floor,
    ledger_cycle,
    ledger_full_cycle,
    raw_baseline,
    raw_fast_baseline,
    raw_writers_1,
    raw_writers_8,
    read_middle,
    read_start,
    read_whole_log_memory,
    writers_1,
    writers_4,
    writers_4_one_room,
    writers_8,
)

WORKLOADS: dict[str, Callable[[Setup], Result]] = {
    "raw": raw_baseline,
    "raw-fast": raw_fast_baseline,
    "core-floor": core_floor,
    "single": append_single,
    "batch10": append_batch_10,
    "batch100": append_batch_100,
    "read-middle": read_middle,
    "read-start": read_start,
    "read-memory": read_whole_log_memory,
    "ledger": ledger_cycle,
    "ledger-full": ledger_full_cycle,
    "full-room": append_into_full_room,
    "many-rooms": append_with_many_rooms,
    "follow-latency": follow_latency,
    "follow-idle": follow_idle,
    "follow-process": follow_latency_process,
}
SQLITE_ONLY = frozenset({"raw-fast", "core-floor"})
POSTGRES_WORKLOADS: dict[str, Callable[[Setup], Result]] = {
    "writers-1": writers_1,
    "writers-4": writers_4,
    "writers-8": writers_8,
    "writers-4-one-room": writers_4_one_room,
    "raw-writers-1": raw_writers_1,
    "raw-writers-8": raw_writers_8,
    "aio-tasks-1": functools.partial(_tasks, tasks=1, how="aio"),
    "aio-tasks-50": functools.partial(_tasks, tasks=50, how="aio"),
    "aio-awaited-tasks-1": functools.partial(_tasks, tasks=1, how="aio-awaited"),
    "aio-awaited-tasks-50": functools.partial(_tasks, tasks=50, how="aio-awaited"),
    "to-thread-tasks-1": functools.partial(_tasks, tasks=1, how="to_thread"),
    "to-thread-tasks-50": functools.partial(_tasks, tasks=50, how="to_thread"),
    "sync-on-loop-tasks-50": functools.partial(_tasks, tasks=50, how="sync-on-loop"),
}


def _child(name: str, setup: Setup, queue: Any) -> None:
    sys.path.insert(0, str(ROOT))
    workloads = {**WORKLOADS, **POSTGRES_WORKLOADS}
    result = workloads[name](setup)
    result.peak_rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    queue.put(result)


def run(name: str, setup: Setup) -> Result:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(name, setup, queue))
    process.start()
    while True:  # a workload whose process dies (an exception in it) ends the run instead of hanging it
        try:
            result: Result = queue.get(timeout=1.0)
            break
        except Empty:
            if not process.is_alive():
                failed = f"workload {name} failed (exit code {process.exitcode}); see its traceback above"
                raise SystemExit(failed) from None
    process.join()
    return result
