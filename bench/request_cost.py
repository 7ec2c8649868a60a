"""Benchmark: what a connection costs in DynamoDB and SQS requests (and WCU/RCU) at steady state.

One worker (production lease settings: lease 20 s, heartbeat 5 s, queue long polls 20 s)
runs behind the counting proxy (:mod:`wsfleet_local.faults`, no faults), which sees every
request the worker process makes. For each load phase (streams x frames/s) the proxy's counters
are reset once every stream is streaming, then read after a steady window:

* connection-table writes per connection-hour (renewals carry the checkpoint; the worker
  item's own heartbeat, one per heartbeat per worker, is subtracted);
* DynamoDB reads by the worker (must be 0: no polling reads; hints and STOPs arrive by SQS);
* SQS requests per worker-hour (long polls of the hint queue and the control queue);
* messages-table BatchWriteItem requests per message (frames of all connections coalesced).

WCU/RCU are estimated from the measured item sizes with DynamoDB's rules: a write costs
ceil(size / 1 KB) WCU; an update that changes a GSI key attribute also deletes and re-puts
the GSI entry (projection ALL: 2 x ceil(size / 1 KB) more). Every renewal changes
``lease_expires_at_ms``, the GSI sort key, so a renewal costs 3 WCU for an item under 1 KB.
The Lambdas are not behind the proxy: their cost is per pass / per STOP, not per
connection (see the notes in RESULTS.md).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from .fleet_bench import Profile, _all_streaming, _start_streams, fleet_for_bench, timings_for
from .harness import aws_client, by_stream, wait_until

__all__ = ["dynamodb_item_size", "run_request_cost"]

READ_OPERATIONS = frozenset({"GetItem", "BatchGetItem", "Query", "Scan", "TransactGetItems"})


def _number_size(text: str) -> int:
    digits = text.lstrip("-").replace(".", "").strip("0") or "0"
    return math.ceil(len(digits) / 2) + 1


def dynamodb_item_size(item: dict[str, Any]) -> int:
    """Approximate DynamoDB item size (bytes) of a low-level item: names + values.

    >>> dynamodb_item_size({"pk": {"S": "CONN#a"}, "n": {"N": "12345"}})
    13
    """
    size = 0
    for name, value in item.items():
        size += len(name.encode())
        (kind, raw), = value.items()
        if kind == "S":
            size += len(raw.encode())
        elif kind == "N":
            size += _number_size(raw)
        elif kind in ("BOOL", "NULL"):
            size += 1
        elif kind == "B":
            size += len(raw)
        else:  # lists/maps/sets: a rough upper bound is enough here
            size += len(str(raw).encode()) + 3
    return size


def _wcu(size: int) -> int:
    return max(1, math.ceil(size / 1024))


def run_request_cost(
    *,
    run_dir: Path,
    phases: list[tuple[int, float]],
    window_seconds: float,
    flush_ms: int | None = None,
) -> dict[str, Any]:
    """Run each (streams, frames/s per stream) phase on one worker; counts per phase."""
    timings = timings_for(Profile.DEFAULT, max_connections=200)
    hb = timings.heartbeat_seconds
    worker_env = {"MESSAGE_FLUSH_MS": str(flush_ms)} if flush_ms else {}
    result: dict[str, Any] = {
        "benchmark": "request_cost",
        "settings": {
            "lease_seconds": timings.lease_seconds,
            "heartbeat_seconds": hb,
            "queue_long_poll_seconds": timings.queue_wait_seconds,
            "message_flush_ms": flush_ms or 100,
            "window_seconds": window_seconds,
            "workers": 1,
        },
        "phases": [],
    }
    with fleet_for_bench(
        workers=1, timings=timings, rate=1.0, run_dir=run_dir, worker_env=worker_env, proxied=True
    ) as faulty:
        fleet = faulty.fleet
        faults = faulty.faults
        connections_table = fleet.resources.connections_table
        messages_table = fleet.resources.messages_table
        ddb = aws_client("dynamodb", fleet.endpoint_url)
        from wsfleet_local.client import ApiClient

        api = ApiClient(fleet.api_url)
        for number, (streams, rate) in enumerate(phases):
            ids = [f"cost{number}-{i:03d}" for i in range(streams)]
            for stream_id in ids:
                fleet.simulator.open_stream(stream_id, rate=rate)
            _start_streams(fleet, ids)
            wait_until(lambda ids=ids: _all_streaming(fleet, ids), timeout=120, interval=0.5,
                       what=f"phase {number} streaming")  # fmt: skip
            time.sleep(hb + 1)  # the start-up burst (acquire, first renewals, replay) is over
            faults.reset_stats()
            started = time.monotonic()
            time.sleep(window_seconds)
            stats = faults.stats()
            elapsed = time.monotonic() - started
            conn_item = ddb.get_item(
                TableName=connections_table, Key={"pk": {"S": f"CONN#{ids[0]}"}}
            )["Item"]
            message_item = ddb.query(
                TableName=messages_table,
                KeyConditionExpression="pk = :pk",
                ExpressionAttributeValues={":pk": {"S": f"CONN#{ids[0]}"}},
                Limit=1,
            )["Items"][0]
            conn_size = dynamodb_item_size(conn_item)
            message_size = dynamodb_item_size(message_item)

            written = stats.total(operation="BatchWriteItem", table=messages_table, what="items")
            batch_requests = stats.total(operation="BatchWriteItem", table=messages_table)
            conn_updates = stats.total(operation="UpdateItem", table=connections_table)
            worker_heartbeats = elapsed / hb
            renewals = max(0.0, conn_updates - worker_heartbeats)
            connection_hours = streams * elapsed / 3600
            reads = sum(
                stats.total(service="dynamodb", operation=op) for op in READ_OPERATIONS
            )
            sqs_requests = stats.total(service="sqs")
            ops: dict[str, int] = {}
            for (_label, service, operation, _table), count in stats.requests.items():
                key = f"{service}:{operation}"
                ops[key] = ops.get(key, 0) + count
            per_renewal_wcu = _wcu(conn_size) * 3
            phase = {
                "streams": streams,
                "frames_per_second_per_stream": rate,
                "window_seconds": round(elapsed, 1),
                "messages_per_second": round(written / elapsed, 1),
                "requests_by_operation": dict(sorted(ops.items())),
                "messages_written": written,
                "message_write_requests": batch_requests,
                "requests_per_message": round(batch_requests / written, 4) if written else None,
                "messages_per_request": (
                    round(written / batch_requests, 1) if batch_requests else None
                ),
                "connection_item_bytes": conn_size,
                "message_item_bytes": message_size,
                "renewals_per_connection_hour": round(renewals / connection_hours),
                "dynamodb_reads_by_worker": reads,
                "sqs_requests_per_worker_hour": round(sqs_requests * 3600 / elapsed),
                "wcu_per_renewal": per_renewal_wcu,
                "wcu_per_connection_hour_renewals": round(
                    renewals / connection_hours * per_renewal_wcu
                ),
                "wcu_per_message": _wcu(message_size),
                "rcu_per_connection_hour": 0 if reads == 0 else round(reads / connection_hours, 1),
            }
            result["phases"].append(phase)
            for stream_id in ids:
                api.stop(stream_id)

            def closed(ids: list[str] = ids) -> bool:
                grouped = by_stream(fleet.simulator.sessions())
                return not any(s.is_open for i in ids for s in grouped.get(i, []))

            wait_until(closed, timeout=60, interval=0.25, what="phase streams closed")
    busy = [p for p in result["phases"] if p["messages_per_second"] >= 90]
    result["no_polling_reads"] = all(p["dynamodb_reads_by_worker"] == 0 for p in result["phases"])
    result["target_requests_per_message"] = "<= 0.05 (1 per 20 messages) at >= 100 msg/s"
    result["target_met"] = bool(busy) and all(
        (p["requests_per_message"] or 1) <= 0.05 for p in busy
    )
    return result
