"""Benchmark: peak RSS of one worker under a flood of maximum-size frames on many sessions.

Issue #11 finding 5: memory was bounded in frames, not bytes (10,000 x 384 KiB per worker
against a 1 GiB task). This starts its own embedded moto server and a flooding upstream (its
own process: ``--serve``), which sends every connection frames of the largest accepted size
(``WORKER_MAX_FRAME_BYTES``, non-ASCII text) as fast as TCP lets it. One real
``python -m wsfleet_worker`` holds N connections with its default byte budgets. The moto server
stores far fewer bytes per second than the upstream sends, so the budgets, not the frame
caps, are what bound the worker: the figure is the worker's peak RSS (``VmHWM``) over the
whole run, against the task memory of ``template.yaml`` (1024 MiB). The worker-lease renewal's
lateness (``RenewLatenessMs``) and lost leases show that backpressure did not starve the
heartbeat. A run is only met if the flood really happened: every connection active and at
least ``MIN_MIB_PER_CONNECTION`` MiB received per connection (a worker that refused the
upstream streams nothing, and its memory would prove nothing).

Usage::

    python bench/frame_flood.py                          # 50 connections, 60 s
    python bench/frame_flood.py --connections 20 --window 30 --json-only
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from worker_capacity import (
    create_connections,
    emf_documents,
    print_result,
    serve_upstream,
    status_kb,
    value,
    worker_env,
)

from wsfleet_local.waiting import wait_until

#: The Fargate task's memory (template.yaml, WorkerTaskDefinition Memory).
TASK_MEMORY_MIB = 1024
MAX_FRAME_BYTES = 393_216
#: The least a run must have received per connection to count as a flood (a 60 s run on a
#: loaded 2-core machine receives hundreds of MiB in total).
MIN_MIB_PER_CONNECTION = 1.0
CJK = "\u8a9e"  # 3 bytes of UTF-8


def serve(frame_bytes: int) -> None:
    """The flooding upstream: prints its URL, then streams max-size frames to every client."""
    chars = (frame_bytes - 64) // len(CJK.encode())

    async def handler(ws: Any) -> None:
        query = ws.request.path.partition("?")[2]
        seq = int(dict(p.split("=", 1) for p in query.split("&") if "=" in p).get("from_seq", 1))
        data = CJK * chars
        while True:
            await ws.send(json.dumps({"seq": seq, "data": data}, ensure_ascii=False))
            seq += 1

    serve_upstream(handler, max_size=None)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from wsfleet.hint_sender import HintSender
    from wsfleet.hints import Hint
    from wsfleet.settings import ENVIRONMENT
    from wsfleet_local.backend import EmbeddedBackend, local_client
    from wsfleet_local.procs import ChildProcess, spawn

    defaults = {v.name: v.default for v in ENVIRONMENT}
    workdir = Path(tempfile.mkdtemp(prefix="wsfleet-flood-"))
    upstream = spawn(
        "flooding upstream",
        [sys.executable, __file__, "--serve", "--frame-bytes", str(args.frame_bytes)],
        capture_stdout=True, inherit_stderr=True,
    )  # fmt: skip
    backend = EmbeddedBackend().start()
    worker: ChildProcess | None = None
    try:
        url = upstream.read_json_line(60)["url"]
        resources = backend.create_resources(f"flood-{uuid.uuid4().hex[:6]}")
        dynamodb = local_client("dynamodb", resources.endpoint_url, resources.region)
        sqs = local_client("sqs", resources.endpoint_url, resources.region)
        log_path = workdir / "worker.log"
        env = worker_env(
            resources.env(),
            workdir,
            "flood",
            WORKER_ID="flood-worker",
            MAX_CONNECTIONS=str(args.connections),
            LEASE_SECONDS=str(args.lease),
            HEARTBEAT_EVERY=str(args.heartbeat),
            LEASE_SAFETY_MARGIN_SECONDS="2",
            WORKER_METRICS_FLUSH_SECONDS="2",
        )
        worker = spawn("worker", [sys.executable, "-m", "wsfleet_worker"], env=env,
                       log_path=log_path)  # fmt: skip
        wait_until(lambda: len(emf_documents(log_path)) >= 2, timeout=120, interval=0.5,
                   message="the idle worker")  # fmt: skip
        idle_rss = status_kb(worker.pid, "VmRSS")
        ids = [f"flood{i:04d}" for i in range(args.connections)]
        create_connections(dynamodb, resources.connections_table, ids, url)
        HintSender(sqs, resources.hint_queue_url).send_many(Hint(f"CONN#{i}") for i in ids)

        started = time.monotonic()
        samples: list[int] = []
        while time.monotonic() - started < args.window and worker.alive():
            samples.append(status_kb(worker.pid, "VmRSS"))
            time.sleep(0.25)
        alive = worker.alive()
        peak_kb = status_kb(worker.pid, "VmHWM") if alive else max(samples, default=0)
        documents = emf_documents(log_path)
        active = value(documents[-1], "ActiveConnections") if documents else 0
        total = {
            name: sum(value(d, name) for d in documents)
            for name in ("MessagesWritten", "MessagesReceived", "LeaseLost", "OversizeFrames")
        }
        lateness = max((value(d, "RenewLatenessMs") for d in documents), default=0)
        peak_mib = round(peak_kb / 1024, 1)
        received_mib = total["MessagesReceived"] * args.frame_bytes / 2**20
        flooded = (
            int(active) >= args.connections
            and received_mib >= MIN_MIB_PER_CONNECTION * args.connections
        )
        return {
            "connections": args.connections,
            "active_at_end": int(active),
            "frame_bytes": args.frame_bytes,
            "frame_text": "non-ASCII (3-byte UTF-8)",
            "window_seconds": args.window,
            "queue_bytes": int(defaults.get("WORKER_QUEUE_BYTES", 0)),
            "session_queue_bytes": int(defaults.get("WORKER_SESSION_QUEUE_BYTES", 0)),
            "idle_rss_mib": round(idle_rss / 1024, 1),
            "peak_rss_mib": peak_mib,
            "task_memory_mib": TASK_MEMORY_MIB,
            "frames_written": int(total["MessagesWritten"]),
            "frames_received": int(total["MessagesReceived"]),
            "written_mib": round(total["MessagesWritten"] * args.frame_bytes / 2**20, 1),
            "received_mib": round(received_mib, 1),
            "min_received_mib": MIN_MIB_PER_CONNECTION * args.connections,
            "flooded": flooded,
            "lease_lost": int(total["LeaseLost"]),
            "renew_lateness_max_ms": lateness,
            "renew_lateness_limit_ms": args.lease * 1000 / 2,
            "worker_alive": alive,
            "target": f"peak RSS < task memory ({TASK_MEMORY_MIB} MiB), no lease lost, every "
                      f"connection flooded (>= {MIN_MIB_PER_CONNECTION:g} MiB received each)",
            "target_met": (
                alive and flooded and peak_mib < TASK_MEMORY_MIB and total["LeaseLost"] == 0
            ),
        }
    finally:
        if worker is not None:
            worker.stop(timeout_seconds=30)
        upstream.stop(timeout_seconds=10)
        backend.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--window", type=float, default=60.0, help="flood seconds")
    parser.add_argument("--frame-bytes", type=int, default=MAX_FRAME_BYTES)
    parser.add_argument("--lease", type=float, default=10.0)
    parser.add_argument("--heartbeat", type=float, default=2.0)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.frame_bytes)
        return 0
    result = run(args)
    print_result(result, json_only=args.json_only)
    return 0 if result["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
