"""Benchmark: how long one reconcile pass (lease model v2) takes over N orphans.

Starts its own embedded moto server, writes N connection items and their workers' items
straight into the table with BatchWriteItem (fast setup; the router and the workers are not
under test; the index attributes come from ``ConnectionRecord.to_item``), and times real
reconciler passes (``Reconciler.run_pass`` from functions/reconciler/app.py) over them:

* ``steady``: every worker is alive; 1% of the connections are free and STARTED since well
  past the grace (the hint that should have found them was lost);
* ``worker-crash``: one of the 50 workers crashed (its lease expired): 2% are orphans;
* ``fleet-crash``: every worker's lease expired (the whole fleet died at once).

A v2 pass never reads all connections: it reads the worker items, gsi_owner for the lapsed
workers only, and gsi_unowned (16 shards) for free connections past the grace. So the live
connections of the ``steady`` and ``worker-crash`` tables cost it nothing.

For each table it times three passes, each split into scan (worker items, index queries and
planning), claim (one conditional UpdateItem per lapsed worker and per free connection) and
send (SendMessageBatch):

* *first*: finds the orphans, claims and sends one hint each;
* *warm*: a second pass in the same container; the hint ledger skips every claim;
* *cold*: a second pass in a new container (empty ledger): every claim is refused by
  DynamoDB, so nothing is sent twice.

The benchmark uses a one-hour re-hint interval: on a slow local server a pass can take longer
than the production 60 s, and the second passes must measure de-duplication, not re-hinting.

Timings are for moto on this machine (one serialised server process), far slower per call
than DynamoDB and SQS, and moto's GSI query reads the whole table for every page, and its
SendMessage slows down as the queue fills. The figures show how a pass scales and where its
time goes, not production latency.

Usage::

    python bench/reconcile_pass.py                 # 10,000 items, steady
    python bench/reconcile_pass.py --items 10000 100000 --scenarios steady fleet-crash
    python bench/reconcile_pass.py --json-only

Prints a JSON document (one entry per run) and a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

#: Per scenario: the fraction of connections that are free (lost hint) and how many of the
#: WORKERS have an expired lease.
SCENARIOS = {"steady": (0.01, 0), "worker-crash": (0.0, 1), "fleet-crash": (0.0, 50)}
WORKERS = 50
LEASE_MS = 20_000
PASS_SECONDS = 10
PAGE_SIZE = 500
REHINT_AFTER_MS = 3_600_000


@dataclass(frozen=True)
class PassTiming:
    pass_ms: int
    scan_ms: int
    claim_ms: int
    send_ms: int
    orphans_found: int
    hints_sent: int
    already_pending: int
    claims_refused: int

    @classmethod
    def of(cls, report: Any) -> PassTiming:
        h = report.hints
        return cls(
            report.pass_ms,
            h.scan_ms,
            h.claim_ms,
            h.send_ms,
            h.orphans_found,
            h.hints_sent,
            h.already_pending,
            h.claims_refused,
        )


@dataclass(frozen=True)
class Run:
    scenario: str
    items: int
    orphans: int
    setup_s: float
    first: PassTiming
    warm: PassTiming
    cold: PassTiming
    hint_queue_depth: int


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def write_items(client: Any, table: str, items: int, scenario: str, now: int) -> int:
    """BatchWriteItem 25 at a time: the workers, then the connections (round robin over the
    workers, the free ones first). Returns the number of orphans written."""
    from boto3.dynamodb.types import TypeSerializer

    from wsfleet.record import ConnectionRecord, DesiredState, WorkerRecord

    serializer = TypeSerializer()
    batch: list[dict[str, Any]] = []

    def put(item: dict[str, Any]) -> None:
        serialized = {key: serializer.serialize(value) for key, value in item.items()}
        batch.append({"PutRequest": {"Item": serialized}})
        if len(batch) == 25:
            flush()

    def flush() -> None:
        request = {table: list(batch)}
        while request:
            request = client.batch_write_item(RequestItems=request).get("UnprocessedItems") or {}
        batch.clear()

    free_fraction, expired_workers = SCENARIOS[scenario]
    for w in range(WORKERS):
        # Crashed workers' leases ended 5-65 s before setup began. Live leases end 10 minutes
        # ahead, well beyond the pass horizon, so they stay live however long the setup takes.
        expires = now - 5_000 - w * 1_000 if w < expired_workers else now + 600_000
        put(WorkerRecord(
            worker_id=f"worker-{w}",
            control_queue_url="",
            started_at_ms=now - 3_600_000,
            heartbeat_at_ms=expires - LEASE_MS,
            expires_at_ms=expires,
            capacity=1_000,
        ).to_item())
    free = round(items * free_fraction)
    orphans = free
    for i in range(items):
        owner = "" if i < free else f"worker-{i % WORKERS}"
        if owner and i % WORKERS < expired_workers:
            orphans += 1
        put(ConnectionRecord(
            pk=f"CONN#bench-{i:06d}",
            desired_state=DesiredState.STARTED,
            ws_url=f"wss://upstream.example/feeds/{i}",
            last_seq=1000 + i,
            lease_owner=owner,
            lease_epoch=1 + i % 7,
            created_at_ms=now - 3_600_000,
            updated_at_ms=now - 30_000,
            # Free since 5-65 s before setup plus one pass: past the grace (one pass interval).
            unowned_since_ms=None if owner else now - PASS_SECONDS * 1000 - 5_000 - i % 60_000,
        ).to_item())
    if batch:
        flush()
    return orphans


def queue_depth(sqs: Any, url: str) -> int:
    attributes = sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesDelayed"],
    )["Attributes"]
    return sum(int(v) for v in attributes.values())


def run_one(backend: Any, scenario: str, items: int) -> Run:
    from wsfleet.aws import dynamodb_client, sqs_client
    from wsfleet.clock import now_ms
    from wsfleet.hint_sender import HintSender
    from wsfleet.reconcile import HintLedger
    from wsfleet.store import DynamoDBLeaseStore
    from wsfleet_local.handler_loader import load_function

    app = load_function("reconciler")
    resources = backend.create_resources(f"b{uuid.uuid4().hex[:8]}")
    os.environ.update(resources.env())
    # moto's GSI query reads the whole table per page: 100,000 items outlast the 5 s default.
    dynamodb, sqs = dynamodb_client(read_timeout=300.0), sqs_client()
    started = time.perf_counter()
    orphans = write_items(dynamodb, resources.connections_table, items, scenario, now_ms())
    setup_s = time.perf_counter() - started

    def reconciler() -> Any:
        return app.Reconciler(
            DynamoDBLeaseStore(dynamodb, resources.connections_table, lease_ms=LEASE_MS),
            HintSender(sqs, resources.hint_queue_url),
            None,  # no control queues in this benchmark
            pass_interval_ms=PASS_SECONDS * 1000,
            page_size=PAGE_SIZE,
            ledger=HintLedger(REHINT_AFTER_MS),
            max_hints_per_pass=max(items, 1),
        )

    progress(f"{scenario} {items:,}: setup {setup_s:.1f} s")
    warm = reconciler()
    timings = []
    for label, instance in (("first", warm), ("warm", warm), ("cold", None)):
        instance = instance or reconciler()
        timing = PassTiming.of(instance.run_pass())
        progress(f"  {label}: {timing}")
        timings.append(timing)
        if label != "first":
            instance.close()
    depth = queue_depth(sqs, resources.hint_queue_url)
    for url in resources.queues.values():
        sqs.delete_queue(QueueUrl=url)
    for table_name in resources.tables.values():
        dynamodb.delete_table(TableName=table_name)
    first, warm_pass, cold_pass = timings
    return Run(scenario, items, orphans, round(setup_s, 1), first, warm_pass, cold_pass, depth)


def table(runs: list[Run]) -> str:
    def cell(t: PassTiming) -> str:
        return f"{t.pass_ms:>8,} ({t.scan_ms:,}/{t.claim_ms:,}/{t.send_ms:,})"

    header = (
        f"{'scenario':<12} {'items':>8} {'orphans':>8}  {'first pass ms (scan/claim/send)':<34}"
        f"{'hints':>7}  {'warm pass ms':<30}{'cold pass ms':<30}{'re-sent':>8} {'queue':>7}"
    )
    lines = [header, "-" * len(header)]
    for r in runs:
        lines.append(
            f"{r.scenario:<12} {r.items:>8,} {r.orphans:>8,}  {cell(r.first):<34}"
            f"{r.first.hints_sent:>7,}  {cell(r.warm):<30}{cell(r.cold):<30}"
            f"{r.warm.hints_sent + r.cold.hints_sent:>8,} {r.hint_queue_depth:>7,}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, nargs="+", default=[10_000])
    parser.add_argument("--scenarios", nargs="+", choices=sorted(SCENARIOS), default=["steady"])
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args(argv)

    os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")
    os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "wsfleet")
    from wsfleet_local.backend import EmbeddedBackend

    runs: list[Run] = []
    with EmbeddedBackend() as backend:
        for items in args.items:
            for scenario in args.scenarios:
                runs.append(run_one(backend, scenario, items))
    document = {
        "benchmark": "reconcile_pass",
        "page_size": PAGE_SIZE,
        "pass_seconds": PASS_SECONDS,
        "backend": "embedded moto (serialised, one process)",
        "runs": [asdict(r) for r in runs],
    }
    print(json.dumps(document, indent=2))
    if not args.json_only:
        print()
        print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
