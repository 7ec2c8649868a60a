"""Benchmark: the receive floor - what receiving a frame with websockets on asyncio costs alone.

Issue #27 asks for >= 30,000 frames per worker vCPU-second (33.3 us of CPU per frame) with the
Kinesis sink at 100 connections x 20 frames/s. At that rate every socket read carries one
frame, so a frame pays the event loop's wake-up, the transport's read, websockets' frame parser,
its message queue and ``recv``, and the wake-up of the reading task before the worker does
anything with it. This bench measures that floor in the same conditions as the sinks:

* the same upstream as bench/throughput.py (:func:`bench.throughput.start_upstream`: frames of
  the same size, paced at the same rate, every 50 ms what is due);
* a bare client in its own process (``--client``): N connections opened with
  ``websockets.asyncio.client.connect`` (``compression=None``, as the worker's connector),
  each read with ``async for msg in ws: count += 1`` and nothing else; with ``--parse`` it also
  runs the worker's own :func:`wsfleet_worker.frames.parse_frame` on each frame (the least
  the worker must do with a frame);
* its CPU (user + system, ``/proc``) measured exactly as the worker's: the client prints its
  counts once a second under the worker's metric names (an EMF-shaped line), and
  :class:`bench.throughput.EmfTail` / :func:`bench.throughput.steady_window` stamp each line
  with the process's CPU seconds and take the frames and CPU between two lines after the
  warm-up.

Output: frames per vCPU-second and CPU microseconds per frame. A worker that stores frames
cannot do better than the floor; ``python -m bench --only sinks`` runs it at every load beside
the sinks (bench/sink_bench.py).

Usage::

    python bench/receive_floor.py                          # 100 x 20 frames/s, 200 B
    python bench/receive_floor.py --connections 10 --rate 1000 --parse
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a script (python bench/x.py): the repository root on the path, for bench.*.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.throughput import EmfTail, start_upstream, steady_window
from bench.worker_capacity import cpu_seconds, print_result
from wsfleet_local.procs import ChildProcess, spawn

ROOT = Path(__file__).resolve().parents[1]

#: The variants: counting only, and counting after parse_frame.
VARIANTS = {"receive-floor": False, "receive-floor+parse": True}
#: window_figures' keys about storing, which a client that only counts has no use for.
_WORKER_ONLY = ("write_requests_per_frame", "flush_latency_max_ms", "queued_frames_last")


# ---------------------------------------------------------------------------- the bare client
def client(url: str, connections: int, parse: bool, prefix: str = "rf") -> None:
    """N connections to ``url``, each frame counted (and parsed, with ``parse``); every second
    one line of counts since the last one, in the worker's metric names."""
    from websockets.asyncio.client import connect

    if parse:
        from wsfleet_worker.frames import parse_frame

    count = 0
    active = 0

    async def read(stream: str) -> None:
        nonlocal count, active
        async with connect(f"{url}/{stream}?from_seq=1", compression=None) as ws:
            active += 1
            try:
                if parse:
                    async for msg in ws:
                        parse_frame(msg)
                        count += 1
                else:
                    async for _msg in ws:
                        count += 1
            finally:
                active -= 1

    async def report() -> None:
        nonlocal count
        while True:
            await asyncio.sleep(1.0)
            counted, count = count, 0
            print(json.dumps({"_aws": {"bench": "receive_floor"}, "MessagesReceived": counted,
                              "MessagesWritten": counted, "ActiveConnections": active}),
                  flush=True)  # fmt: skip

    async def main() -> None:
        readers = [asyncio.create_task(read(f"{prefix}{i:04d}")) for i in range(connections)]
        reporter = asyncio.create_task(report())
        await asyncio.gather(*readers)
        reporter.cancel()

    asyncio.run(main())


# ---------------------------------------------------------------------------- measurement
def start_client(
    url: str, connections: int, *, parse: bool, log_path: Path, prefix: str = "rf"
) -> ChildProcess:
    argv = [sys.executable, __file__, "--client", "--url", url, "--connections",
            str(connections), "--prefix", prefix] + (["--parse"] if parse else [])  # fmt: skip
    return spawn("receive floor", argv, log_path=log_path, cwd=ROOT,
                 env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip


def measure_client(
    url: str, connections: int, *, parse: bool, warmup: float, window: float, log_path: Path,
    prefix: str = "rf",
) -> dict[str, Any]:  # fmt: skip
    """One bare client measured over a steady window (the keys of
    :func:`bench.throughput.window_figures`: here "stored" is "counted", "worker" the client)."""
    process = start_client(url, connections, parse=parse, log_path=log_path, prefix=prefix)
    try:
        tail = EmfTail(log_path, process.pid)
        figures = steady_window(tail, connections, warmup=warmup, window=window)
    finally:
        process.stop(timeout_seconds=10)
    return {k: v for k, v in figures.items() if k not in _WORKER_ONLY}


def run_floor(
    *, connections: int, rate: float, frame_bytes: int, warmup: float, window: float,
    run_dir: Path, variants: tuple[str, ...] = tuple(VARIANTS),
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Every variant against one upstream (bench/throughput.py's), one after the other:
    ``{variant: figures}``, each with the load average before and after and the upstream's
    cores over the client's run."""
    run_dir.mkdir(parents=True, exist_ok=True)
    upstream, url = start_upstream(rate, frame_bytes)
    results: dict[str, dict[str, Any]] = {}
    try:
        for index, variant in enumerate(variants):
            before = [round(x, 2) for x in os.getloadavg()]
            started, upstream_cpu = time.monotonic(), cpu_seconds(upstream.pid)
            figures = measure_client(
                url, connections, parse=VARIANTS[variant], warmup=warmup, window=window,
                log_path=run_dir / f"{variant}.log", prefix=f"rf{index}-",
            )  # fmt: skip
            wall = time.monotonic() - started
            figures["upstream_cores_used"] = round((cpu_seconds(upstream.pid) - upstream_cpu)
                                                   / wall, 2)  # fmt: skip
            figures["load_average_before"] = before
            figures["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
            results[variant] = figures
    finally:
        upstream.stop(timeout_seconds=10)
    return results


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = ["| variant | frames/s per vCPU | CPU us/frame | frames/s | client cores | "
             "connections | load avg before / after |", "|---|---|---|---|---|---|---|"]
    for variant, r in results.items():
        lines.append(f"| {variant} | {r['frames_per_cpu_second']:,.0f} | "
                     f"{r['cpu_us_per_frame']} | {r['frames_stored_per_second']} | "
                     f"{r['worker_cores_used']} | {r['active_connections']} | "
                     f"{r['load_average_before'][0]} / {r['load_average_after'][0]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--connections", type=int, default=100)
    parser.add_argument("--rate", type=float, default=20.0, help="frames/s per connection")
    parser.add_argument("--frame-bytes", type=int, default=200)
    parser.add_argument("--window", type=float, default=15.0, help="steady seconds measured")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--variants", nargs="+", choices=tuple(VARIANTS),
                        default=list(VARIANTS))  # fmt: skip
    parser.add_argument("--out", help="run directory (default: a new temporary one)")
    parser.add_argument("--json-only", action="store_true")
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", default="rf", help=argparse.SUPPRESS)
    parser.add_argument("--parse", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        client(args.url, args.connections, args.parse, args.prefix)
        return 0
    results = run_floor(
        connections=args.connections, rate=args.rate, frame_bytes=args.frame_bytes,
        warmup=args.warmup, window=args.window, variants=tuple(args.variants),
        run_dir=Path(args.out or tempfile.mkdtemp(prefix="wsfleet-receive-floor-")),
    )  # fmt: skip
    print_result(results, json_only=args.json_only, table=table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
