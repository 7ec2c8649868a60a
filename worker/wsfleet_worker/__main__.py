"""``python -m wsfleet_worker``: run one worker process, configured from the environment.

Profiling (opt-in, for benchmarks; never in production): ``WSFLEET_PROFILE=<path>`` runs the
worker under cProfile in *every* thread (the event loop, and the pools where boto3 serialises
and sends the message batches: most of a frame's cost is there, which a main-thread-only
profile would miss) and writes one merged ``pstats`` dump to ``<path>`` when the worker exits
(SIGTERM drain, or any other return). Read it with ``python -m pstats <path>`` or
``bench/throughput.py``. cProfile slows the process by a large factor: measure throughput
without it.

Garbage collection (:func:`tune_gc`): every frame allocates a few dozen short-lived objects
(websockets' frame, the parsed JSON, the Message, the request dicts), and CPython's default
collector runs a young-generation pass every 700 net allocations and re-scans everything alive
(tens of thousands of queued frames, boto3's service models) on older passes: at 100
connections that was about a tenth of the worker's CPU (bench/throughput.py). The objects of a
frame are freed by reference counting, not by the collector, so collecting less often costs
little memory.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from collections.abc import Callable

from .worker import main

PROFILE_VARIABLE = "WSFLEET_PROFILE"
#: Young-generation threshold (allocations net of frees) and the two older generations'
#: (collections of the younger one); CPython's defaults are 700, 10, 10.
GC_THRESHOLDS = (20_000, 20, 20)


def tune_gc() -> None:
    """Collect less often, and never re-scan what was alive at start (see the module doc)."""
    gc.collect()
    gc.freeze()  # modules, boto3's loaders and models: long-lived, nothing to collect there
    gc.set_threshold(*GC_THRESHOLDS)


def profiled(run: Callable[[], int], path: str) -> int:
    """Run ``run`` under cProfile in this thread and in every thread started meanwhile.

    ``threading.setprofile`` installs a bootstrap hook in each new thread; its first call
    enables that thread's own profiler (one ``cProfile.Profile`` per thread: a profiler
    records one thread's call stack). At the end the per-thread tables are merged. Times are
    each thread's CPU time (``time.thread_time``), not wall time: a thread blocked on a socket
    or waiting for the GIL costs nothing, so the dump shows where the CPU goes.
    """
    import cProfile
    import pstats

    profilers: list[cProfile.Profile] = []
    lock = threading.Lock()

    def start_thread_profiler(*_args: object) -> None:
        sys.setprofile(None)  # this hook only bootstraps the thread's own profiler
        profiler = cProfile.Profile(time.thread_time)
        with lock:
            profilers.append(profiler)
        profiler.enable()

    main_profiler = cProfile.Profile(time.thread_time)
    threading.setprofile(start_thread_profiler)
    main_profiler.enable()
    try:
        return run()
    finally:
        main_profiler.disable()
        threading.setprofile(None)
        stats = pstats.Stats(main_profiler)
        with lock:
            others = list(profilers)
        for profiler in others:
            try:
                profiler.create_stats()  # a thread still running keeps its own hook: harmless
                stats.add(profiler)
            except (TypeError, ValueError):  # a thread that recorded nothing
                continue
        stats.dump_stats(path)
        print(f"wsfleet-worker: profile written to {path}", file=sys.stderr)


if __name__ == "__main__":
    tune_gc()
    _profile_path = os.environ.get(PROFILE_VARIABLE)
    sys.exit(profiled(main, _profile_path) if _profile_path else main())
