"""Benchmark: frames stored per second per worker vCPU, and where the worker's time goes.

Issue #12: with renewals gone, per-frame cost is what sizes the fleet. Target: >= 10,000
frames/s per vCPU at 100 connections.

Setup (each its own process, so only the worker is measured): the tables on dynalite (messages
and connections; SQS stays on the embedded moto server, as the dynalite fleet runs do), an
upstream (``--serve``) that sends every connection small numbered frames (the simulator's
format, ``{"seq": n, "data": "<id>:<n>"}``) as fast as TCP lets it (or ``--rate`` frames/s per
connection), and one ``python -m wsfleet_worker`` holding N connections.

Measured over a steady window, between two of the worker's EMF documents (printed every
second; the worker's CPU time is read from ``/proc`` as each one appears, so frames and CPU
cover the same interval):

* frames stored per second (``MessagesWritten``) and the worker's CPU seconds (user + system,
  all threads): **frames per CPU-second = frames/s per vCPU** (a process using 1.3 cores for
  13,000 frames/s does 10,000 per vCPU). The upstream's and dynalite's CPU are shown beside
  it: on a small machine they share the cores, which bounds frames/s but not frames/CPU-s.
* a profile of the worker: a second pass with ``WSFLEET_PROFILE`` (cProfile in every thread,
  see ``wsfleet_worker.__main__``), top functions by own and by cumulative time; and, if the
  ``py-spy`` binary is on PATH or in the venv, a sampling profile of the *unprofiled* pass.
* exactly once: after both passes (the second worker resumes every stream from the first one's
  checkpoints), every connection's stored frames are read back: seqs 1..max with no gap, each
  once, each with its own content, and the record's checkpoint within them.

With ``--sink kinesis`` or ``--sink firehose`` the worker stores frames in a Kinesis stream or a
Firehose delivery stream (to S3) on the embedded moto server (``MESSAGE_SINK``), through a
counting proxy (:mod:`bench.sink_requests`) that counts every record the service took, its size
and its frames; the check reads the whole stream (or every delivered S3 object) back and allows
duplicates (the sinks are at-least-once) but no loss. The cost per million frames
(:mod:`bench.sink_cost`) comes from those records; for the ``dynamodb`` sink from the items read
back from the table (one write per frame, each checked stored exactly once).

Usage::

    python bench/throughput.py                        # 100 connections, 30 s window
    python bench/throughput.py --sink kinesis --no-profile
    python bench/throughput.py --sink firehose --rate 20 --frame-bytes 1024 --no-profile
    python bench/throughput.py --window 20 --json-only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import pstats
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Run as a script (python bench/x.py): the repository root on the path, for bench.*.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.waiting import wait_until
from bench.worker_capacity import (
    cpu_seconds,
    create_connections,
    print_result,
    serve_upstream,
    value,
    worker_env,
)
from wsfleet_local.procs import ChildProcess, spawn

ROOT = Path(__file__).resolve().parents[1]
TARGET_PER_VCPU = 10_000


# ---------------------------------------------------------------------------- the upstream
def frame_data(stream: str, seq: int, frame_bytes: int = 0) -> str:
    """The ``data`` of frame ``seq``: ``<stream>:<seq>``, padded (``|xxx...``) so that the
    whole frame is about ``frame_bytes`` long (0: no padding).

    >>> len(f'{{"seq": 7, "data": "{frame_data("s", 7, 200)}"}}')
    200
    """
    data = f"{stream}:{seq}"
    pad = frame_bytes - len(f'{{"seq": {seq}, "data": "{data}"}}') - 1
    return f"{data}|{'x' * pad}" if pad > 0 else data


def serve(rate: float, frame_bytes: int = 0) -> None:
    """The upstream: prints its URL, then streams numbered frames to every client.

    Resumes at ``from_seq`` (the worker asks for it). Frames are written to the socket
    directly, several per write, already framed (server frames are unmasked, so a text frame
    is two or four header bytes and the payload): going through ``send()`` one frame at a time
    cost this process more CPU than the worker spends per frame, and on a small machine the
    upstream, not the worker, set the pace. Without a rate a session writes 100 frames
    whenever its socket's buffer is below 256 KiB: as fast as the worker reads. With a rate it
    writes every 50 ms what is due (20 frames/s: one frame per write), so frames arrive as a
    paced feed sends them: a burst of 100 frames every 5 s would let the stream sinks pack 100
    frames into one record where a real 20 frames/s feed gives them about 2 per flush.
    """
    chunk = 100 if rate <= 0 else max(1, min(100, math.ceil(rate * 0.05)))

    def framed(text: str) -> bytes:
        payload = text.encode()
        size = len(payload)
        if size < 126:
            return bytes((0x81, size)) + payload
        return bytes((0x81, 126)) + size.to_bytes(2, "big") + payload

    async def handler(ws: Any) -> None:
        path, _, query = ws.request.path.partition("?")
        stream = path.strip("/")
        params = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
        seq = int(params.get("from_seq", 1))
        transport = ws.transport
        started, sent = time.monotonic(), 0
        while not transport.is_closing():
            if transport.get_write_buffer_size() > 256 * 1024:
                await asyncio.sleep(0.002)
                continue
            transport.write(b"".join(
                framed(f'{{"seq": {n}, "data": "{frame_data(stream, n, frame_bytes)}"}}')
                for n in range(seq, seq + chunk)
            ))  # fmt: skip
            seq += chunk
            sent += chunk
            ahead = sent / rate - (time.monotonic() - started) if rate > 0 else 0.0
            await asyncio.sleep(max(0.0, ahead))

    serve_upstream(handler, compression=None)


def start_upstream(rate: float, frame_bytes: int) -> tuple[ChildProcess, str]:
    """:func:`serve` in its own process (this script, ``--serve``), and its URL. Shared with
    bench/receive_floor.py, whose bare client reads from the same upstream."""
    upstream = spawn("upstream", [sys.executable, __file__, "--serve", "--rate", str(rate),
                                  "--frame-bytes", str(frame_bytes)],
                     capture_stdout=True, inherit_stderr=True)  # fmt: skip
    try:
        return upstream, str(upstream.read_json_line(60)["url"])
    except BaseException:
        upstream.stop(timeout_seconds=10)
        raise


# ---------------------------------------------------------------------------- measurement
class EmfTail:
    """Reads the worker's log as it grows; stamps each EMF document with the worker's CPU."""

    def __init__(self, path: Path, pid: int) -> None:
        self.path, self.pid = path, pid
        self._offset = 0
        self._partial = b""
        self.samples: list[tuple[float, float, dict[str, Any]]] = []  # (monotonic, cpu, doc)

    def poll(self) -> int:
        with open(self.path, "rb") as log:
            log.seek(self._offset)
            chunk = log.read()
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        new = 0
        for line in lines:
            if line.startswith(b'{"_aws"'):
                try:
                    document = json.loads(line)
                except ValueError:
                    continue
                self.samples.append((time.monotonic(), cpu_seconds(self.pid), document))
                new += 1
        return new

    def follow(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.poll()
            time.sleep(0.02)

    def last(self, name: str) -> float:
        return value(self.samples[-1][2], name) if self.samples else 0.0


def window_figures(samples: list[tuple[float, float, dict[str, Any]]]) -> dict[str, Any]:
    """Frames and CPU between the first and the last sample (documents after the first)."""
    (t0, cpu0, _), (t1, cpu1, _) = samples[0], samples[-1]
    documents = [doc for _, _, doc in samples[1:]]
    written = sum(value(d, "MessagesWritten") for d in documents)
    received = sum(value(d, "MessagesReceived") for d in documents)
    requests = sum(value(d, "MessageWriteRequests") for d in documents)
    wall, cpu = t1 - t0, cpu1 - cpu0
    return {
        "window_seconds": round(wall, 2),
        "frames_stored": int(written),
        "frames_received": int(received),
        "frames_stored_per_second": round(written / wall, 1),
        "worker_cpu_seconds": round(cpu, 2),
        "worker_cores_used": round(cpu / wall, 2),
        "frames_per_cpu_second": round(written / cpu, 1) if cpu else None,
        "cpu_us_per_frame": round(1e6 * cpu / written, 1) if written else None,
        "write_requests_per_frame": round(requests / written, 4) if written else None,
        "flush_latency_max_ms": max((value(d, "FlushLatencyMs") for d in documents), default=0),
        "queued_frames_last": value(documents[-1], "QueuedFrames") if documents else 0,
    }


def profile_tables(path: Path, top: int) -> dict[str, Any]:
    """Top functions of a cProfile dump, by own time and by cumulative time."""
    stats = pstats.Stats(str(path))
    rows = []
    total = 0.0
    for (filename, line, name), (_cc, calls, own, cumulative, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        total += own
        short = filename.replace(str(ROOT) + "/", "")
        short = short.split("site-packages/")[-1].split("/lib/python3.11/")[-1]
        rows.append({
            "function": f"{short}:{line}({name})" if line else name,
            "calls": calls,
            "own_seconds": round(own, 3),
            "cumulative_seconds": round(cumulative, 3),
        })
    idle = ("select.epoll", "acquire' of '_thread.lock", "_queue.SimpleQueue", "run_forever",
            "wait' of 'threading.Condition", "threading.py", "concurrent/futures/thread.py")
    busy = [r for r in rows if not any(marker in r["function"] for marker in idle)]
    busy_total = sum(r["own_seconds"] for r in busy)
    for row in busy:
        row["own_percent"] = round(100 * row["own_seconds"] / busy_total, 1) if busy_total else 0
    return {
        "total_own_seconds": round(total, 2),
        "busy_own_seconds": round(busy_total, 2),
        "note": "cProfile, CPU time of every thread; waits (epoll, locks, queues) left out",
        "by_own": sorted(busy, key=lambda r: -r["own_seconds"])[:top],
        "by_cumulative": sorted(busy, key=lambda r: -r["cumulative_seconds"])[:top],
    }


def py_spy_binary() -> str | None:
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else shutil.which("py-spy")


def py_spy_tables(raw: Path, top: int) -> dict[str, Any]:
    """Own and cumulative sample shares per function, from py-spy's collapsed stacks."""
    own: Counter[str] = Counter()
    cumulative: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = [  # per function, not per line: "name (file:line)" -> "name (file)"
            re.sub(r":\d+\)$", ")", f) for f in stack.split(";")
            if f and not f.startswith(("thread (", "process "))
        ]  # fmt: skip
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            cumulative[frame] += count

    def rows(counter: Counter[str]) -> list[dict[str, Any]]:
        return [{"function": _short(f), "samples": n, "percent": round(100 * n / total, 1)}
                for f, n in counter.most_common(top)]  # fmt: skip

    note = "py-spy --gil: samples of the thread holding the GIL (CPU in Python code)"
    return {"samples": total, "note": note, "by_own": rows(own), "by_cumulative": rows(cumulative)}


def _short(frame: str) -> str:
    return frame.replace(str(ROOT) + "/", "").split("site-packages/")[-1]


# ---------------------------------------------------------------------------- the run
def start_worker(env: dict[str, str], log_path: Path) -> ChildProcess:
    return spawn("worker", [sys.executable, "-m", "wsfleet_worker"], env=env, log_path=log_path)


def measure_pass(
    env: dict[str, str], log_path: Path, hint: Any, args: argparse.Namespace, *,
    warmup: float, window: float, py_spy_raw: Path | None = None,
) -> tuple[dict[str, Any], ChildProcess]:  # fmt: skip
    worker = start_worker(env, log_path)
    tail = EmfTail(log_path, worker.pid)
    wait_until(lambda: (tail.poll(), len(tail.samples) >= 2)[1], timeout=120, interval=0.5,
               message="the worker's first metrics")  # fmt: skip
    hint()
    spies: list[ChildProcess] = []

    def start_py_spy() -> None:
        binary = py_spy_binary() if py_spy_raw is not None else None
        if binary is not None and py_spy_raw is not None:
            spies.append(spawn("py-spy", [
                binary, "record", "--pid", str(worker.pid), "--duration", str(int(window)),
                "--rate", "200", "--nonblocking", "--gil", "--format", "raw",
                "--output", str(py_spy_raw),
            ]))  # fmt: skip

    figures = steady_window(tail, args.connections, warmup=warmup, window=window,
                            at_start=start_py_spy)  # fmt: skip
    for spy in spies:
        if spy.wait(30) is None:
            spy.stop(signal.SIGKILL)
    return figures, worker


def steady_window(
    tail: EmfTail, connections: int, *, warmup: float, window: float,
    at_start: Callable[[], None] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Wait until the measured process reports ``connections`` active, follow it ``warmup``
    seconds, then measure ``window`` seconds between two of its documents
    (:func:`window_figures`; ``at_start`` runs as the window opens). Shared with
    bench/receive_floor.py, which measures a bare websockets client the same way."""
    wait_until(
        lambda: tail.poll() is not None and tail.last("ActiveConnections") >= connections,
        timeout=120, interval=0.2, message="every connection streaming",
    )  # fmt: skip
    tail.follow(warmup)
    first = len(tail.samples) - 1
    if at_start is not None:
        at_start()
    tail.follow(window)
    figures = window_figures(tail.samples[first:])
    figures["active_connections"] = int(tail.last("ActiveConnections"))
    return figures


def drain(worker: ChildProcess) -> int:
    worker.send_signal(signal.SIGTERM)
    code = worker.wait(120)
    return code if code is not None else worker.stop(signal.SIGKILL)


def verify(
    dynamodb: Any, resources: Any, ids: list[str], store: Any, frame_bytes: int = 0
) -> dict[str, Any]:
    """Every connection's stored frames: seq 1..max, each once, its own content; the
    record's checkpoint (``last_seq``) within what is stored."""
    from bench.request_cost import dynamodb_item_size
    from bench.sink_cost import dynamodb_cost
    from wsfleet.messages import seq_sk

    problems: list[str] = []
    stored = 0
    checkpoints = 0
    sizes: Counter[int] = Counter()
    for connection_id in ids:
        pk = f"CONN#{connection_id}"
        items = []
        pages = dynamodb.get_paginator("query").paginate(
            TableName=resources.messages_table, KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": pk}},
        )  # fmt: skip
        for page in pages:
            items += page["Items"]
        stored += len(items)
        sizes.update(dynamodb_item_size(item) for item in items)
        seqs = [int(item["seq"]["N"]) for item in items if "seq" in item]
        if len(seqs) != len(items):
            problems.append(f"{connection_id}: {len(items) - len(seqs)} frames without seq")
        if seqs != list(range(1, len(seqs) + 1)):
            missing = len(set(range(1, max(seqs, default=0) + 1)) - set(seqs))
            problems.append(f"{connection_id}: seqs not 1..{len(seqs)} ({missing} missing)")
        wrong = [
            item for item in items if "seq" in item and (
                item["sk"]["S"] != seq_sk(int(item["seq"]["N"]))
                or item["message_data"]["S"]
                != frame_data(connection_id, int(item["seq"]["N"]), frame_bytes))
        ]  # fmt: skip
        if wrong:
            problems.append(f"{connection_id}: {len(wrong)} frames with other content")
        record = store.get(pk, consistent=True)
        last_seq = record.last_seq if record is not None else 0
        checkpoints += last_seq
        if last_seq > len(seqs):
            problems.append(f"{connection_id}: checkpoint {last_seq} past stored {len(seqs)}")
    return {
        "connections_checked": len(ids),
        "frames_stored": stored,
        "checkpointed_frames": checkpoints,
        "problems": problems[:20],
        "exactly_once": not problems,
        "no_loss": not problems,
        "duplicates": 0,
        "cost": {"counted": "items read back from the table (one write each)",
                 **dynamodb_cost(sizes, stored)},
    }


def check_frames(
    by_connection: dict[str, list[dict[str, Any]]], ids: list[str], store: Any, frame_bytes: int
) -> dict[str, Any]:
    """Every connection's frames as a stream sink delivered them: seq 1..max all there, each
    with its own content; duplicates counted (at-least-once), the record's checkpoint within
    what is stored. ``ordered``: first appearances in seq order as well (Kinesis)."""
    problems: list[str] = []
    stored = duplicates = checkpoints = 0
    for connection_id in ids:
        frames = by_connection.get(connection_id, [])
        stored += len(frames)
        seqs = [f["seq"] for f in frames]
        unique = sorted(set(seqs))
        duplicates += len(seqs) - len(unique)
        if unique != list(range(1, len(unique) + 1)):
            problems.append(f"{connection_id}: seqs not 1..{len(unique)}")
        if any(f["data"] != frame_data(connection_id, f["seq"], frame_bytes) for f in frames):
            problems.append(f"{connection_id}: frames with other content")
        record = store.get(f"CONN#{connection_id}", consistent=True)
        last_seq = record.last_seq if record is not None else 0
        checkpoints += last_seq
        if last_seq > len(unique):
            problems.append(f"{connection_id}: checkpoint {last_seq} past stored {len(unique)}")
    return {
        "connections_checked": len(ids),
        "frames_stored": stored,
        "duplicates": duplicates,
        "checkpointed_frames": checkpoints,
        "problems": problems[:20],
        "exactly_once": not problems and not duplicates,
        "no_loss": not problems,
    }


def verify_stream(
    client: Any, stream: str, ids: list[str], store: Any, frame_bytes: int,
    counted: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """The Kinesis stream read back (deaggregated): :func:`check_frames`, each connection's
    first appearances in seq order (one shard per connection), and the cost of the records the
    proxy counted, beside the cost of the records the stream holds (the same, when every
    record the service took is still there)."""
    from bench.sink_cost import kinesis_cost, read_kinesis

    by_connection, sizes = read_kinesis(client, stream)
    checked = check_frames(by_connection, ids, store, frame_bytes)
    for connection_id in ids:
        seqs = [f["seq"] for f in by_connection.get(connection_id, [])]
        if list(dict.fromkeys(seqs)) != sorted(set(seqs)):
            checked["problems"].append(f"{connection_id}: out of order in its shard")
            checked["no_loss"] = checked["exactly_once"] = False
    sent = counted.get("kinesis", {})
    checked["requests"] = {k: v for k, v in sent.items() if k != "sizes"}
    checked["cost"] = {"counted": "records the service took, at the counting proxy",
                       **kinesis_cost(sent.get("sizes", {}), sent.get("frames", 0))}  # fmt: skip
    checked["cost_of_records_in_stream"] = kinesis_cost(sizes, checked["frames_stored"])
    return checked


def verify_firehose(
    s3: Any, bucket: str, ids: list[str], store: Any, frame_bytes: int, counted: dict[str, Any]
) -> dict[str, Any]:
    """Every object the delivery stream wrote to S3 read back (JSON Lines): :func:`check_frames`
    (Firehose keeps no order), and the cost of the records the proxy counted."""
    from bench.sink_cost import firehose_cost

    by_connection: dict[str, list[dict[str, Any]]] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            body = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            for line in body.splitlines():
                frame = json.loads(line)
                by_connection.setdefault(frame["connection_id"], []).append(frame)
    checked = check_frames(by_connection, ids, store, frame_bytes)
    sent = counted.get("firehose", {})
    checked["requests"] = {k: v for k, v in sent.items() if k != "sizes"}
    checked["cost"] = {"counted": "records the service took, at the counting proxy",
                       **firehose_cost(sent.get("sizes", {}), sent.get("frames", 0))}  # fmt: skip
    return checked


def start_request_counter(upstream: str, log_path: Path) -> tuple[ChildProcess, str]:
    """The counting proxy (:mod:`bench.sink_requests`) in front of ``upstream``."""
    proxy = spawn("sink requests", [sys.executable, "-m", "bench.sink_requests",
                                    "--upstream", upstream],
                  capture_stdout=True, log_path=log_path, cwd=ROOT)  # fmt: skip
    return proxy, str(proxy.read_json_line(30)["url"])


def request_counts(url: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(f"{url}/__counts", timeout=30) as answer:
        counts: dict[str, Any] = json.loads(answer.read())
    return counts


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.dynalite import Dynalite, available
    from wsfleet.hint_sender import HintSender
    from wsfleet.hints import Hint
    from wsfleet.store import DynamoDBLeaseStore
    from wsfleet_local.backend import EmbeddedBackend, local_client

    if not available():
        raise SystemExit("dynalite is not installed (python -m bench.dynalite --install)")
    workdir = Path(args.out or tempfile.mkdtemp(prefix="wsfleet-throughput-"))
    workdir.mkdir(parents=True, exist_ok=True)
    upstream, url = start_upstream(args.rate, args.frame_bytes)
    backend = EmbeddedBackend().start()
    dynalite = Dynalite(log_path=workdir / "dynalite.log")
    workers: list[ChildProcess] = []
    helpers: list[ChildProcess] = []
    try:
        resources = backend.create_resources(f"tp-{uuid.uuid4().hex[:6]}")
        dynalite.start()
        dynalite.create_tables(resources)
        dynamodb = local_client("dynamodb", dynalite.endpoint_url, resources.region)
        sqs = local_client("sqs", resources.endpoint_url, resources.region)
        store = DynamoDBLeaseStore(dynamodb, resources.connections_table, lease_ms=30_000)
        ids = [f"tp{i:04d}" for i in range(args.connections)]
        create_connections(dynamodb, resources.connections_table, ids, url)
        sender = HintSender(sqs, resources.hint_queue_url)

        def hint() -> None:
            sender.send_many(Hint(f"CONN#{i}") for i in ids)

        base_env = worker_env(
            resources.env(),
            workdir,
            "tp",
            AWS_ENDPOINT_URL_DYNAMODB=dynalite.endpoint_url,
            MAX_CONNECTIONS=str(args.connections),
            LEASE_SECONDS="30",
            HEARTBEAT_EVERY="10",
            LEASE_SAFETY_MARGIN_SECONDS="3",
            WORKER_METRICS_FLUSH_SECONDS="1",
            POWERTOOLS_LOG_LEVEL="WARNING",
        )
        base_env.pop("WSFLEET_PROFILE", None)
        counter_url = ""
        if args.sink != "dynamodb":
            from wsfleet_local.frame_sinks import create_local_sink

            prefix = resources.connections_table.removesuffix("-ConnectionsTable")
            base_env.update(create_local_sink(
                args.sink, resources.endpoint_url, resources.region, prefix
            ))  # fmt: skip
            counter, counter_url = start_request_counter(
                resources.endpoint_url, workdir / "sink-requests.log"
            )
            helpers.append(counter)
            base_env[f"AWS_ENDPOINT_URL_{args.sink.upper()}"] = counter_url
        base_env.update(dict(setting.split("=", 1) for setting in args.worker_env))
        others = {"upstream": upstream.pid, "dynalite": dynalite.pid}
        other_cpu = {name: cpu_seconds(pid) for name, pid in others.items() if pid}
        t0 = time.monotonic()

        # ---- pass 1: unprofiled (the figure), py-spy sampling alongside if present
        spy_raw = workdir / "py-spy.txt"
        env = {**base_env, "WORKER_ID": "throughput-1"}
        measured, worker = measure_pass(
            env, workdir / "worker-1.log", hint, args, warmup=args.warmup, window=args.window,
            py_spy_raw=spy_raw if not args.no_py_spy else None,
        )  # fmt: skip
        workers.append(worker)
        wall = time.monotonic() - t0
        others_used = {
            name: round((cpu_seconds(pid) - other_cpu[name]) / wall, 2)
            for name, pid in others.items() if pid
        }  # fmt: skip
        exit_1 = drain(worker)

        # ---- pass 2: under cProfile (every thread); it resumes from pass 1's checkpoints
        profile: dict[str, Any] = {}
        profiled: dict[str, Any] = {}
        exit_2 = None
        if not args.no_profile:
            dump = workdir / "worker.prof"
            env = {**base_env, "WORKER_ID": "throughput-2", "WSFLEET_PROFILE": str(dump)}
            profiled, worker = measure_pass(
                env, workdir / "worker-2.log", hint, args, warmup=3, window=args.profile_window,
            )  # fmt: skip
            workers.append(worker)
            exit_2 = drain(worker)
            if dump.exists():
                profile = profile_tables(dump, args.top)
                profile["dump"] = str(dump)
        spy = py_spy_tables(spy_raw, args.top) if spy_raw.exists() else None

        upstream.send_signal(signal.SIGTERM)
        counted = request_counts(counter_url) if counter_url else {}
        if args.sink == "kinesis":
            kinesis = local_client("kinesis", resources.endpoint_url, resources.region)
            checked = verify_stream(
                kinesis, base_env["MESSAGE_STREAM"], ids, store, args.frame_bytes, counted
            )
        elif args.sink == "firehose":
            s3 = local_client("s3", resources.endpoint_url, resources.region)
            checked = verify_firehose(
                s3, base_env["MESSAGE_STREAM"], ids, store, args.frame_bytes, counted
            )
        else:
            checked = verify(dynamodb, resources, ids, store, args.frame_bytes)
        per_cpu = measured["frames_per_cpu_second"]
        result = {
            "machine": {"cores": os.cpu_count(), "python": platform.python_version(),
                        "load_average": [round(x, 2) for x in os.getloadavg()]},
            "settings": {"connections": args.connections,
                         "upstream_rate_per_connection": args.rate or "unbounded",
                         "window_seconds": args.window, "dynamodb": "dynalite",
                         "sink": args.sink, "frame_bytes": args.frame_bytes or "small",
                         "worker_env": args.worker_env},
            **measured,
            "other_processes_cores_used": others_used,
            "profiled_pass": profiled,
            "drain_exit_codes": [exit_1, exit_2],
            "verify": checked,
            "profile_cprofile": profile,
            "profile_py_spy": spy,
            "target": f">= {TARGET_PER_VCPU:,} frames/s per vCPU at 100 connections",
            "target_met": bool(per_cpu and per_cpu >= TARGET_PER_VCPU and checked["no_loss"]),
            "sink": args.sink,
            "run_dir": str(workdir),
        }  # fmt: skip
        (workdir / "throughput.json").write_text(json.dumps(result, indent=2))
        (workdir / "throughput.md").write_text(table(result) + "\n")
        return result
    finally:
        for worker in workers:
            worker.stop(signal.SIGKILL)
        for helper in helpers:
            helper.stop(signal.SIGTERM)
        upstream.stop(timeout_seconds=10)
        dynalite.stop()
        backend.stop()


def run_throughput(*, run_dir: Path, connections: int, window: float,
                   timeout: float = 900) -> dict[str, Any]:  # fmt: skip
    """``python -m bench``'s step: this script in a child process (its servers and imports
    stay apart from the other steps'); only its ``--json-only`` output is relied on."""
    argv = [sys.executable, __file__, "--json-only", "--connections", str(connections),
            "--window", str(window), "--out", str(run_dir)]  # fmt: skip
    completed = subprocess.run(
        argv, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True,
        text=True, timeout=timeout, check=False,
    )  # fmt: skip
    if completed.returncode != 0:
        raise RuntimeError(f"throughput exited {completed.returncode}: {completed.stderr[-1500:]}")
    result: dict[str, Any] = json.loads(completed.stdout)
    result["benchmark"] = "throughput"
    return result


def table(result: dict[str, Any]) -> str:
    rows = [
        ("connections (active)", f"{result['settings']['connections']} "
                                 f"({result['active_connections']})"),
        ("frames stored/s", result["frames_stored_per_second"]),
        ("worker cores used", result["worker_cores_used"]),
        ("frames/s per worker vCPU", result["frames_per_cpu_second"]),
        ("CPU us per frame", result["cpu_us_per_frame"]),
        ("write requests per frame", result["write_requests_per_frame"]),
        ("upstream / dynalite cores", " / ".join(
            str(v) for v in result["other_processes_cores_used"].values())),
        ("exactly once (frames checked)",
         f"{result['verify']['exactly_once']} ({result['verify']['frames_stored']})"),
    ]  # fmt: skip
    width = max(len(name) for name, _ in rows)
    lines = [f"| {'metric'.ljust(width)} | value |", f"|{'-' * (width + 2)}|-------|"]
    lines += [f"| {name.ljust(width)} | {val} |" for name, val in rows]
    for title, key, column in (("py-spy", "profile_py_spy", "percent"),
                               ("cProfile", "profile_cprofile", "own_percent")):  # fmt: skip
        profile = result.get(key) or {}
        if profile.get("by_own"):
            lines.append(f"\ntop by own time ({title}, % of samples/time):")
            lines += [f"  {r[column]:5}%  {r['function']}" for r in profile["by_own"][:12]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--connections", type=int, default=100)
    parser.add_argument("--rate", type=float, default=0.0,
                        help="frames/s per connection (0: as fast as the worker reads)")
    parser.add_argument("--window", type=float, default=30.0, help="steady seconds measured")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--profile-window", type=float, default=15.0)
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile pass")
    parser.add_argument("--no-py-spy", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--worker-env", nargs="*", default=[], metavar="NAME=VALUE",
                        help="extra worker settings (e.g. WORKER_WRITE_THREADS=8)")
    parser.add_argument("--out", help="run directory (default: a new temporary one)")
    parser.add_argument("--frame-bytes", type=int, default=0,
                        help="pad every frame to about this many bytes (0: ~30-byte frames)")
    parser.add_argument("--sink", choices=("dynamodb", "kinesis", "firehose"), default="dynamodb",
                        help="where the worker stores frames (MESSAGE_SINK)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.rate, args.frame_bytes)
        return 0
    print_result(run(args), json_only=args.json_only, table=table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
