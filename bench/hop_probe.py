"""The rig's SQS hop floor, measured beside a hand-off (issue #26 item 5).

A make-before-break hand-off crosses SQS three times on its critical path (PREPARE giver ->
taker, READY taker -> giver, COMMIT giver -> taker). What one such hop costs *on this rig* is
not a property of the protocol: it is the moto server (one Python process, a thread per
request) under whatever else the machine runs. The probe measures it directly, in the same
run as the hand-offs: a child process (its own interpreter, so neither the bench's polling nor
the workers share its GIL) sends a small message every ``interval`` seconds to a queue of its
own on the fleet's moto server and long-polls that queue, as the workers' control channels do
(WaitTimeSeconds 20, up to 10 messages, each round's DeleteMessageBatch beside the next
receive).

Every send is one JSON line in ``out`` (``n``, ``sent`` = the call's start, ``returned`` = its
return, epoch seconds), every receipt another (``n``, ``received`` = when ReceiveMessage
returned it). The bench marks windows by wall clock (the idle rig before any stream starts,
the steady fleet before the signal, the hand-off from the signal to the last stream's first
stored frame); :func:`window_stats` gives each window's

* **send call**: ``returned - sent`` (the SendMessage request itself);
* **send -> receive**: ``received - sent`` (deciding to send until the other side holds it:
  what one protocol hop costs, send call included);
* **hop**: ``received - returned`` (what the stage table's ``x_sent->x_seen`` steps measure:
  they are stamped when the SendMessageBatch returned and when the receive returned).

:func:`path_floor` is ``HOPS`` times the window's send -> receive p50: what the three hops
alone cost a hand-off on this rig, before any DynamoDB write, connect or frame.

Run as ``python -m bench.hop_probe --endpoint URL --queue NAME --out FILE``; it prints one
JSON ready line (``{"queue_url": ...}``) and runs until killed (SIGTERM's default action:
every sample is already written and flushed).
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .harness import percentiles

__all__ = [
    "HOPS",
    "HopProbe",
    "merge_samples",
    "path_floor",
    "window_stats",
]

#: The hops on a make-before-break hand-off's critical path: PREPARE, READY, COMMIT.
HOPS = 3
#: The probe's send cadence, seconds.
INTERVAL_SECONDS = 0.1
#: The workers' control channel long poll (queue_wait_seconds of the default profile).
WAIT_SECONDS = 20


def merge_samples(lines: Iterable[str]) -> dict[int, dict[str, float]]:
    """The probe's output lines joined per message ``n``: ``sent``, ``returned`` and (once
    received) ``received``; unreadable lines (a line cut by the kill) are skipped, and a
    message received twice keeps its first receipt."""
    samples: dict[int, dict[str, float]] = {}
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or not isinstance(record.get("n"), int):
            continue
        sample = samples.setdefault(record["n"], {})
        for key in ("sent", "returned", "received"):
            value = record.get(key)
            if isinstance(value, int | float) and key not in sample:
                sample[key] = float(value)
    return samples


def _stats(values: Iterable[float]) -> dict[str, float | int] | None:
    stats = percentiles(values)
    return None if stats is None else stats.to_dict()


def window_stats(
    samples: Mapping[int, Mapping[str, float]], start: float, end: float
) -> dict[str, Any]:
    """Over the messages whose send began in ``[start, end)``: how many were sent, how many
    were received (at any time before the probe stopped), and the percentiles (seconds) of
    ``send_call``, ``send_to_receive`` and ``hop`` (see the module docstring); a figure with no
    sample is left out."""
    inside = [s for s in samples.values() if "sent" in s and start <= s["sent"] < end]
    result: dict[str, Any] = {
        "window_seconds": round(end - start, 3),
        "sent": len(inside),
        "received": sum(1 for s in inside if "received" in s),
    }
    figures = {
        "send_call": [s["returned"] - s["sent"] for s in inside if "returned" in s],
        "send_to_receive": [s["received"] - s["sent"] for s in inside if "received" in s],
        "hop": [s["received"] - s["returned"] for s in inside
                if "received" in s and "returned" in s],
    }  # fmt: skip
    for name, values in figures.items():
        if (stats := _stats(values)) is not None:
            result[name] = stats
    return result


def path_floor(window: Mapping[str, Any], hops: int = HOPS) -> float | None:
    """``hops`` x the window's send -> receive p50 (seconds), None without receipts."""
    stats = window.get("send_to_receive")
    return None if not stats else round(hops * float(stats["p50"]), 3)


class HopProbe:
    """The probe child of one run: started on the fleet's SQS endpoint, stopped, read.

    ``windows`` maps a window's name to its ``(start, end)`` wall-clock seconds; :meth:`result`
    gives each window's :func:`window_stats` and :func:`path_floor`."""

    def __init__(self, endpoint_url: str, region: str, run_dir: Path) -> None:
        self.endpoint_url = endpoint_url
        self.region = region
        self.out = Path(run_dir) / "hop-probe.jsonl"
        self._child: Any = None

    def start(self) -> HopProbe:
        from wsfleet_local.procs import spawn

        self._child = spawn(
            "hop-probe",
            [sys.executable, "-m", "bench.hop_probe", "--endpoint", self.endpoint_url,
             "--region", self.region, "--queue", f"wsfleet-bench-hop-probe-{time.time_ns()}",
             "--out", str(self.out)],
            log_path=self.out.with_suffix(".log"),
            capture_stdout=True,
        )  # fmt: skip
        self._child.read_json_line(30.0)  # the queue exists, sending has begun
        return self

    def stop(self) -> None:
        """Kill the child (safe to call twice); what it wrote stays in ``out``."""
        if self._child is not None:
            self._child.stop()
            self._child = None

    def __enter__(self) -> HopProbe:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def samples(self) -> dict[int, dict[str, float]]:
        try:
            text = self.out.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return {}
        return merge_samples(text.splitlines())

    def result(self, windows: Mapping[str, tuple[float, float]]) -> dict[str, Any]:
        samples = self.samples()
        timed = {name: window_stats(samples, start, end)
                 for name, (start, end) in windows.items()}  # fmt: skip
        return {
            "interval_seconds": INTERVAL_SECONDS,
            "wait_seconds": WAIT_SECONDS,
            "hops": HOPS,
            "windows": timed,
            "path_floor_seconds": {name: path_floor(w) for name, w in timed.items()},
        }


# ------------------------------------------------------------------ the child


def _run(endpoint: str, region: str, queue_name: str, out: Path, interval: float) -> None:
    import boto3

    from wsfleet.aws import client_config
    from wsfleet_local.backend import LOCAL_ACCESS_KEY, LOCAL_SECRET_KEY

    session = boto3.session.Session(aws_access_key_id=LOCAL_ACCESS_KEY,
                                    aws_secret_access_key=LOCAL_SECRET_KEY, region_name=region)
    # the workers' SQS client (wsfleet.aws.sqs_client): a long poll needs a read timeout > 20 s
    sqs = session.client("sqs", endpoint_url=endpoint, config=client_config(read_timeout=25.0))
    queue_url = sqs.create_queue(QueueName=queue_name)["QueueUrl"]
    lock = threading.Lock()
    log = out.open("a", encoding="utf-8")

    def write(record: dict[str, Any]) -> None:
        with lock:
            log.write(json.dumps(record) + "\n")
            log.flush()

    receipts: queue.Queue[list[str]] = queue.Queue()

    def receive() -> None:
        while True:
            try:
                response = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10,
                                               WaitTimeSeconds=WAIT_SECONDS)  # fmt: skip
            except Exception as exc:  # a probe keeps probing
                print(f"receive failed: {exc}", file=sys.stderr, flush=True)
                time.sleep(0.1)
                continue
            at = time.time()
            messages = response.get("Messages", [])
            for message in messages:
                write({"n": json.loads(message["Body"])["n"], "received": at})
            if messages:
                receipts.put([m["ReceiptHandle"] for m in messages])

    def delete() -> None:
        while True:
            handles = receipts.get()
            entries = [{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(handles)]
            try:
                sqs.delete_message_batch(QueueUrl=queue_url, Entries=entries)
            except Exception as exc:
                print(f"delete failed: {exc}", file=sys.stderr, flush=True)

    def send(n: int) -> None:
        sent = time.time()
        try:
            sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps({"n": n}))
        except Exception as exc:
            print(f"send {n} failed: {exc}", file=sys.stderr, flush=True)
            return
        write({"n": n, "sent": sent, "returned": time.time()})

    for target in (receive, delete):
        threading.Thread(target=target, daemon=True).start()
    print(json.dumps({"queue_url": queue_url}), flush=True)
    # Sends on a fixed cadence from a small pool, so a slow send does not thin the samples
    # exactly when the rig is slow.
    with ThreadPoolExecutor(max_workers=4) as pool:
        began = time.monotonic()
        n = 0
        while True:
            pool.submit(send, n)
            n += 1
            time.sleep(max(0.0, began + n * interval - time.monotonic()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hop_probe",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--interval", type=float, default=INTERVAL_SECONDS)
    args = parser.parse_args(argv)
    _run(args.endpoint, args.region, args.queue, args.out, args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
