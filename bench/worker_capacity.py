"""Benchmark: one worker process holding many connections - memory, CPU, renew punctuality.

Starts its own embedded moto server and an upstream simulator (each its own process, so
neither is counted in the worker's figures), creates N connections, hints them all, starts
one ``python -m wsfleet_worker`` and waits until it streams every one. Then, over a steady
window, it samples the worker's RSS and CPU time (``/proc``) and reads the worker's own EMF
output (printed every few seconds) for messages, write requests and renewal lateness.

* RSS per connection = (RSS with N connections - RSS of the same worker idle) / N.
* Renew lateness = completion of the worker-lease renewal minus the moment it was due
  (``RenewLatenessMs``, maximum per EMF interval). Lease model v2: one renewal per worker per
  heartbeat, whatever it holds (``WORKER#<id>``; connection items are not renewed), so the
  figure shows whether N sessions' frames starve the one renewal that keeps all N owned.
  The target is "never later than half the lease".
* Requests per message = BatchWriteItem requests / frames written.

The embedded backend serialises every request and sustains only a few hundred writes/s, so
the frame rate is chosen so message batches (and, in v2, one renewal per heartbeat plus a
checkpoint per connection every CHECKPOINT_SECONDS) fit; settings are printed beside the
figures.

Usage::

    python bench/worker_capacity.py                       # 1,000 connections
    python bench/worker_capacity.py --connections 2000 --heartbeat 20 --lease 60
    python bench/worker_capacity.py --json-only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from wsfleet_local.waiting import WaitTimeout, wait_until

ROOT = Path(__file__).resolve().parents[1]


def status_kb(pid: int, field: str) -> int:
    """A memory figure of ``/proc/<pid>/status`` in KiB (``VmRSS`` now, ``VmHWM`` its peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


def json_lines(path: Path, prefix: str = "{") -> list[dict[str, Any]]:
    """The JSON objects a process printed one a line (the lines starting with ``prefix``),
    skipping a line that does not parse (cut short by a kill, say)."""
    documents = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(prefix):
            try:
                documents.append(json.loads(line))
            except ValueError:
                continue
    return documents


def emf_documents(path: Path) -> list[dict[str, Any]]:
    """The worker's EMF documents (Powertools prints ``_aws`` first)."""
    return json_lines(path, '{"_aws"')


def value(document: dict[str, Any], name: str) -> float:
    raw = document.get(name, 0)
    return sum(raw) if isinstance(raw, list) else float(raw)


def wait_for(condition: Any, timeout: float, what: str, interval: float = 0.5) -> bool:
    """:func:`wait_until` that warns and goes on (returning False) when ``timeout`` runs out:
    a ramp that falls short is measured anyway, at what it reached."""
    try:
        wait_until(condition, timeout=timeout, interval=interval, message=what)
    except WaitTimeout:
        print(f"warning: timed out waiting for {what}; measuring anyway", file=sys.stderr)
        return False
    return True


def worker_env(
    resources_env: Mapping[str, str], workdir: Path, prefix: str, **settings: str
) -> dict[str, str]:
    """The environment of one ``python -m wsfleet_worker`` on the embedded backend against an
    upstream on loopback, with the run's own ``settings`` (lease, capacity...) on top."""
    return {
        **os.environ,
        **resources_env,
        "WORKER_HINT_WAIT_SECONDS": "1",
        "WORKER_CONTROL_WAIT_SECONDS": "5",
        "HEALTH_FILE": str(workdir / "health"),
        "CONTROL_QUEUE_PREFIX": f"{prefix}-{uuid.uuid4().hex[:6]}-",
        # The upstream is ws:// on 127.0.0.1: without these the worker refuses every
        # connection (InvalidUpstreamUrl) and the run measures nothing.
        "ALLOW_INSECURE_WS": "true",
        "ALLOWED_UPSTREAM_HOSTS": "127.0.0.1",
        "PYTHONUNBUFFERED": "1",
        **settings,
    }


def serve_upstream(handler: Callable[[Any], Any], **options: Any) -> None:
    """A bench's own upstream process: serve ``handler`` on 127.0.0.1, print the URL as one JSON
    line (what ``ChildProcess.read_json_line`` waits for), then serve until a signal ends it."""
    import websockets

    async def main() -> None:
        async with websockets.serve(handler, "127.0.0.1", 0, **options) as server:
            port = server.sockets[0].getsockname()[1]
            print(json.dumps({"url": f"ws://127.0.0.1:{port}"}), flush=True)
            await asyncio.Future()

    asyncio.run(main())


def print_result(
    result: Any, *, json_only: bool, table: Callable[[Any], str] | None = None
) -> None:
    """A run's result as JSON (what bench/wrapped.py reads) and, unless ``json_only``, its
    table for a person."""
    print(json.dumps(result, indent=2))
    if table is not None and not json_only:
        print(table(result))


def create_connections(dynamodb: Any, table: str, ids: list[str], sim_url: str) -> None:
    """STARTED connection items, 25 per BatchWriteItem (the router is not under test)."""
    from boto3.dynamodb.types import TypeSerializer

    from wsfleet.clock import now_ms
    from wsfleet.record import ConnectionRecord

    serializer = TypeSerializer()
    now = now_ms()
    for start in range(0, len(ids), 25):
        requests = [
            {
                "PutRequest": {
                    "Item": {
                        k: serializer.serialize(v)
                        for k, v in ConnectionRecord.new(i, f"{sim_url}/{i}", now).to_item().items()
                    }
                }
            }
            for i in ids[start:start + 25]
        ]
        pending: dict[str, Any] = {table: requests}
        while pending:
            pending = dynamodb.batch_write_item(RequestItems=pending).get("UnprocessedItems") or {}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from wsfleet.hint_sender import HintSender
    from wsfleet.hints import Hint
    from wsfleet.store import DynamoDBLeaseStore
    from wsfleet_local.backend import EmbeddedBackend, local_client
    from wsfleet_local.procs import ChildProcess, spawn

    workdir = Path(tempfile.mkdtemp(prefix="wsfleet-capacity-"))
    simulator = spawn(
        "simulator",
        [sys.executable, "-m", "wsfleet_local.simulator", "--port", "0", "--rate", str(args.rate)],
        capture_stdout=True,
    )
    backend = EmbeddedBackend().start()
    worker: ChildProcess | None = None
    try:
        sim_url = simulator.read_json_line(60)["url"]
        resources = backend.create_resources(f"cap-{uuid.uuid4().hex[:6]}")
        dynamodb = local_client("dynamodb", resources.endpoint_url, resources.region)
        sqs = local_client("sqs", resources.endpoint_url, resources.region)
        store = DynamoDBLeaseStore(
            dynamodb, resources.connections_table, lease_ms=int(args.lease * 1000)
        )

        log_path = workdir / "worker.log"
        env = worker_env(
            resources.env(),
            workdir,
            "cap",
            WORKER_ID="capacity-worker",
            MAX_CONNECTIONS=str(args.connections),
            LEASE_SECONDS=str(args.lease),
            HEARTBEAT_EVERY=str(args.heartbeat),
            LEASE_SAFETY_MARGIN_SECONDS=str(args.margin),
            MESSAGE_FLUSH_MS="100",
            WORKER_METRICS_FLUSH_SECONDS=str(args.metrics_every),
            POWERTOOLS_LOG_LEVEL="INFO",
        )
        worker = spawn("worker", [sys.executable, "-m", "wsfleet_worker"], env=env,
                       log_path=log_path)  # fmt: skip
        wait_until(lambda: len(emf_documents(log_path)) >= 2, timeout=120, interval=0.5,
                   message="the idle worker")  # fmt: skip
        time.sleep(args.metrics_every)
        idle_rss = status_kb(worker.pid, "VmRSS")

        t0 = time.monotonic()
        ids = [f"cap{i:05d}" for i in range(args.connections)]
        create_connections(dynamodb, resources.connections_table, ids, sim_url)
        created_s = time.monotonic() - t0
        sender = HintSender(sqs, resources.hint_queue_url)

        def active() -> float:
            documents = emf_documents(log_path)
            return value(documents[-1], "ActiveConnections") if documents else 0

        # Hints go out in waves (the router sends one per START as they come): moto's SQS
        # scans the whole queue on every receive, so thousands of queued hints would slow
        # every request of the backend, renewals included, which is not what is measured.
        failed: list[Any] = []
        ramp_deadline = time.monotonic() + args.ramp_timeout
        for start in range(0, len(ids), args.hint_wave):
            wave = ids[start:start + args.hint_wave]
            failed += sender.send_many(Hint(f"CONN#{i}") for i in wave)
            target = start + len(wave) - args.hint_wave // 2
            left = max(1.0, ramp_deadline - time.monotonic())
            wait_for(lambda t=target: active() >= t, left, "the hints", 1.0)
        left = max(1.0, ramp_deadline - time.monotonic())
        wait_for(lambda: active() >= args.connections, left, "all active", 1.0)
        ramp_s = time.monotonic() - t0 - created_s
        held = int(active())
        time.sleep(2 * args.heartbeat)  # settle: the ramp's renewals spread out

        # ---- steady window
        cpu_start, wall_start, ts_start = cpu_seconds(worker.pid), time.monotonic(), time.time()
        rss_samples = []
        while time.monotonic() - wall_start < args.window:
            rss_samples.append(status_kb(worker.pid, "VmRSS"))
            time.sleep(1.0)
        cpu_used = cpu_seconds(worker.pid) - cpu_start
        window_s = time.monotonic() - wall_start
        ts_end = time.time()
        time.sleep(args.metrics_every + 0.5)
        # EMF documents whose interval lies inside the window; rates use their own span.
        stamped = [(d["_aws"]["Timestamp"] / 1000, d) for d in emf_documents(log_path)]
        inside = [i for i, (ts, _) in enumerate(stamped) if ts_start < ts <= ts_end and i > 0]
        window_docs = [stamped[i][1] for i in inside]
        docs_span = (stamped[inside[-1]][0] - stamped[inside[0] - 1][0]) if inside else window_s

        def total(name: str) -> float:
            return sum(value(d, name) for d in window_docs)

        received = total("MessagesReceived")
        written = total("MessagesWritten")
        requests = total("MessageWriteRequests")
        all_docs = emf_documents(log_path)
        lateness_window = max((value(d, "RenewLatenessMs") for d in window_docs), default=0)
        lateness_ramp = max((value(d, "RenewLatenessMs") for d in all_docs), default=0)
        owned = sum(
            1 for i in ids if (r := store.get(f"CONN#{i}", consistent=False)) is not None
            and r.lease_owner == "capacity-worker"
        )

        # ---- graceful drain of everything
        drain_start = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        exit_code = worker.wait(120)  # None: still draining after 120 s
        drain_s = time.monotonic() - drain_start
        drained = [line for line in json_lines(log_path) if line.get("message") == "drained"]
        peak_rss = max(rss_samples)
        return {
            "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
            "settings": {
                "connections": args.connections,
                "frames_per_second_per_connection": args.rate,
                "lease_seconds": args.lease,
                "heartbeat_seconds": args.heartbeat,
                "safety_margin_seconds": args.margin,
                "window_seconds": round(window_s, 1),
                "renewals_per_second": round(1 / args.heartbeat, 2),  # one worker lease
            },
            "setup_seconds": round(created_s, 1),
            "ramp_seconds_to_all_streaming": round(ramp_s, 1),
            "hints_failed": len(failed),
            "active_at_start_of_window": held,
            "owned_at_end_of_window": owned,
            "rss_idle_mb": round(idle_rss / 1024, 1),
            "rss_peak_mb": round(peak_rss / 1024, 1),
            "rss_per_connection_kb": round((peak_rss - idle_rss) / max(1, held), 1),
            "cpu_percent_of_one_core": round(100 * cpu_used / window_s, 1),
            "messages_per_second": round(received / docs_span, 1),
            "cpu_ms_per_message": (
                round(1000 * cpu_used / (received * window_s / docs_span), 3) if received else None
            ),
            "messages_written": int(written),
            "write_requests_per_message": round(requests / written, 4) if written else None,
            "renew_lateness_max_ms_steady": lateness_window,
            "renew_lateness_max_ms_incl_ramp": lateness_ramp,
            "renew_lateness_limit_ms": args.lease * 500,
            "self_fenced": total("SelfFenced"),
            "lease_lost": sum(value(d, "LeaseLost") for d in all_docs),
            "renew_failures": sum(value(d, "RenewFailures") for d in all_docs),
            "drain": {
                "exit_code": exit_code,
                "seconds": round(drain_s, 2),
                "worker_drain_ms": drained[0].get("drain_ms") if drained else None,
                "hints_sent": drained[0].get("hints_sent") if drained else None,
            },
            "worker_log": str(log_path),
        }
    finally:
        if worker is not None:
            worker.stop(signal.SIGKILL)
        simulator.stop(signal.SIGTERM, 30)
        backend.stop()


def table(result: dict[str, Any]) -> str:
    s = result["settings"]
    rows = [
        ("connections (active)", f'{s["connections"]} ({result["active_at_start_of_window"]})'),
        ("frames/s per connection", s["frames_per_second_per_connection"]),
        ("lease / heartbeat / margin (s)",
         f'{s["lease_seconds"]} / {s["heartbeat_seconds"]} / {s["safety_margin_seconds"]}'),
        ("renewals/s", s["renewals_per_second"]),
        ("ramp to all streaming (s)", result["ramp_seconds_to_all_streaming"]),
        ("RSS idle / peak (MB)", f'{result["rss_idle_mb"]} / {result["rss_peak_mb"]}'),
        ("RSS per connection (KB)", result["rss_per_connection_kb"]),
        ("CPU (% of one core)", result["cpu_percent_of_one_core"]),
        ("messages/s", result["messages_per_second"]),
        ("CPU ms per message", result["cpu_ms_per_message"]),
        ("write requests per message", result["write_requests_per_message"]),
        ("max renew lateness steady (ms)", result["renew_lateness_max_ms_steady"]),
        ("max renew lateness incl. ramp (ms)", result["renew_lateness_max_ms_incl_ramp"]),
        ("limit: half the lease (ms)", result["renew_lateness_limit_ms"]),
        ("self-fenced / lease lost", f'{result["self_fenced"]} / {result["lease_lost"]}'),
        ("owned at end of window", result["owned_at_end_of_window"]),
        ("SIGTERM drain (s) / hints sent",
         f'{result["drain"]["seconds"]} / {result["drain"]["hints_sent"]}'),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [f"| {'metric'.ljust(width)} | value |", f"|{'-' * (width + 2)}|-------|"]
    lines += [f"| {name.ljust(width)} | {val} |" for name, val in rows]
    cores = result["machine"]["cores"]
    return f"worker capacity on {cores} cores (embedded moto backend)\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=0.5, help="frames/s per connection")
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--heartbeat", type=float, default=10.0)
    parser.add_argument("--margin", type=float, default=3.0)
    parser.add_argument("--window", type=float, default=60.0, help="steady-state seconds")
    parser.add_argument("--metrics-every", type=float, default=5.0)
    parser.add_argument("--hint-wave", type=int, default=200, help="hints queued at a time")
    parser.add_argument(
        "--ramp-timeout", type=float, default=900.0,
        help="seconds allowed to reach N connections; then measure what is active",
    )
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args(argv)
    print_result(run(args), json_only=args.json_only, table=table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
