"""Benchmark: what a connection costs in DynamoDB requests and capacity units at steady state.

Two measurements:

**Coordination cost** (:func:`run_coordination_cost`, issue #12's target: <= 10 writes and
<= 10 reads per connection-hour at 1,000 connections per worker). One worker holds 1,000
connections; every process that talks to DynamoDB (the worker and each Lambda: router,
reconciler, STOP notifier) goes through the counting proxy under its own label, which journals
every request to the connections table with its answer (the recorder of the scale model,
:func:`bench.scale_record.record`). The production cadences (lease 20 s, heartbeat 5 s,
CHECKPOINT_SECONDS 600, WORKER_SWEEP_SECONDS 30, reconcile pass 10 s, REBALANCE_SECONDS 10)
are **time-compressed**: every cadence is divided by ``factor`` and every measured rate
divided by the same factor (each request rate is linear in 1 / interval), because a
1,000-connection run long enough to see checkpoints at 600 s would take an hour per data
point. The window is a whole number of (compressed) checkpoint periods, so every connection
checkpoints the same number of times in it whatever its phase. Every request of the window
is sorted by what it was for:

* writes, from the connections table's stream images (old and new item of every write that
  landed; conditional writes that failed come from the journal and cost units all the same):
  worker-lease heartbeats (``WORKER#`` item renewed), checkpoints (``last_seq`` advanced),
  acquire / release (``lease_owner`` changed), START / STOP, the reconciler's hint claims and
  kills, the fleet view the reconciler writes each pass (``FLEET#view``), other (error notes);
* reads, from the journal: worker sweeps (Query ``gsi_owner``), the workers' reads of the
  fleet view (every REBALANCE_SECONDS), other worker reads (consistent GetItems of acquire and
  of the sweep's confirmations), reconciler passes (everything the reconciler Lambda read),
  router / notifier;
* capacity units with DynamoDB's rules (:mod:`bench.scale_model`): a write ceil(size / 1 KB)
  WCU of the larger image; an index write per index whose entry appears, disappears, changes
  key or changes a projected attribute, ceil(entry size / 1 KB) each; reads ceil(bytes / 4 KB),
  half when eventually consistent.

Lease model v1 (one lease per connection, renewed every heartbeat with the checkpoint) is shown
beside it for comparison, labelled as such: 720 renewals per connection-hour x 3 WCU (the base
item plus a delete and a put in the index whose sort key was the lease expiry) = 2,160 write
units, as measured by this bench before v2 (RESULTS.md section 5 of commit eedcb49) and in the
v1 scale recording (bench/scale_v1.json).

**Messages-table cost** (:func:`run_request_cost`). One worker (production lease settings,
queue long polls 20 s) behind the counting proxy; for each load phase (streams x frames/s)
the proxy's counters are reset once every stream streams, then read after a steady window:
messages-table BatchWriteItem requests per message (frames of all connections coalesced), the
worker's DynamoDB reads (v2: its sweep's gsi_owner queries) and SQS requests per worker-hour.
"""

from __future__ import annotations

import functools
import math
import time
from pathlib import Path
from typing import Any

from wsfleet.rebalance import FLEET_VIEW_PK

from .fleet_bench import Profile, _all_streaming, _start_streams, fleet_for_bench, timings_for
from .harness import aws_client, by_stream
from .waiting import wait_until

__all__ = [
    "V1_PER_CONNECTION_HOUR",
    "dynamodb_item_size",
    "run_coordination_cost",
    "run_request_cost",
]

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
    """Run each (streams, frames/s per stream) phase on one worker; messages-table requests
    per phase (the coordination cost is :func:`run_coordination_cost`'s)."""
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
            wait_until(functools.partial(_all_streaming, fleet, ids), timeout=120, interval=0.5,
                       message=f"phase {number} streaming")  # fmt: skip
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
            reads = sum(
                stats.total(service="dynamodb", operation=op) for op in READ_OPERATIONS
            )
            sqs_requests = stats.total(service="sqs")
            ops: dict[str, int] = {}
            for (_label, service, operation, _table), count in stats.requests.items():
                key = f"{service}:{operation}"
                ops[key] = ops.get(key, 0) + count
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
                "connection_table_updates": conn_updates,
                "dynamodb_reads_by_worker": reads,
                "sqs_requests_per_worker_hour": round(sqs_requests * 3600 / elapsed),
                "wcu_per_message": _wcu(message_size),
            }
            result["phases"].append(phase)
            for stream_id in ids:
                api.stop(stream_id)

            def closed(ids: list[str] = ids) -> bool:
                grouped = by_stream(fleet.simulator.sessions())
                return not any(s.is_open for i in ids for s in grouped.get(i, []))

            wait_until(closed, timeout=60, interval=0.25, message="phase streams closed")
    busy = [p for p in result["phases"] if p["messages_per_second"] >= 90]
    result["target_requests_per_message"] = "<= 0.05 (1 per 20 messages) at >= 100 msg/s"
    result["target_met"] = bool(busy) and all(
        (p["requests_per_message"] or 1) <= 0.05 for p in busy
    )
    return result


# ------------------------------------------------------------------ coordination cost (v2)
#: Lease model v1 per connection-hour at the same cadences (heartbeat 5 s): every connection
#: renewed 720 times an hour, 3 WCU each (base item 1 + index delete and put 2). Measured by
#: this bench before v2 (RESULTS.md section 5, commit eedcb49: 720 renewals, 2,160 WCU per
#: connection-hour) and in bench/scale_v1.json; reads: the v1 reconciler's query per pass.
V1_PER_CONNECTION_HOUR = {
    "source": "v1 (one lease per connection): RESULTS.md section 5 of commit eedcb49 and "
              "bench/scale_v1.json",
    "writes": 720,
    "write_units": 2160,
    "gsi_writes": 1440,  # each renewal moved the index entry: a delete and a put
    "gsi_write_units": 1440,
}
WRITE_CATEGORIES = ("worker-lease heartbeats", "checkpoints", "acquire / release",
                    "START / STOP", "reconciler hint claims and kills", "worker register / delete",
                    "fleet view (reconciler)", "other connection writes",
                    "failed conditional writes")  # fmt: skip
READ_CATEGORIES = ("worker sweeps (gsi_owner)", "fleet view (workers)",
                   "other worker reads (acquire, confirmations)", "reconciler passes",
                   "router / notifier")  # fmt: skip



def _attr(image: dict[str, Any] | None, name: str) -> Any:
    if not image or name not in image:
        return None
    ((_, raw),) = image[name].items()
    return raw


def write_category(old: dict[str, Any] | None, new: dict[str, Any] | None) -> str:
    """What one item change (a stream record's two images) was for.

    >>> w = {"pk": {"S": "WORKER#a"}, "expires_at_ms": {"N": "1"}}
    >>> write_category(w, {**w, "expires_at_ms": {"N": "2"}})
    'worker-lease heartbeats'
    >>> c = {"pk": {"S": "CONN#a"}, "lease_owner": {"S": "w"}, "last_seq": {"N": "1"}}
    >>> write_category(c, {**c, "last_seq": {"N": "9"}})
    'checkpoints'
    >>> write_category(c, {"pk": {"S": "CONN#a"}, "last_seq": {"N": "9"}})
    'acquire / release'
    """
    item = new if new is not None else old
    pk = str(_attr(item, "pk") or "")
    if pk.startswith("WORKER#"):
        if old is None or new is None:
            return "worker register / delete"
        if _attr(new, "dead_at_ms") != _attr(old, "dead_at_ms"):
            return "reconciler hint claims and kills"
        if any(_attr(new, a) != _attr(old, a) for a in ("hinted_expiry_ms", "hinted_at_ms")):
            return "reconciler hint claims and kills"
        return "worker-lease heartbeats"
    if pk == FLEET_VIEW_PK:
        return "fleet view (reconciler)"
    if old is None or new is None:
        return "START / STOP"
    if _attr(new, "lease_owner") != _attr(old, "lease_owner"):
        return "acquire / release"
    if _attr(new, "desired_state") != _attr(old, "desired_state"):
        return "START / STOP"
    if _attr(new, "last_seq") != _attr(old, "last_seq"):
        return "checkpoints"
    return "other connection writes"


def read_category(entry: dict[str, Any]) -> str:
    """What one journalled read was for (by who asked and what)."""
    label = entry.get("label")
    if label == "reconciler":
        return "reconciler passes"
    if label != "worker":
        return "router / notifier"
    request = entry.get("request") or {}
    if entry.get("operation") == "Query" and request.get("IndexName") == "gsi_owner":
        return "worker sweeps (gsi_owner)"
    key = (request.get("Key") or {}).get("pk") or {}
    if key.get("S") == FLEET_VIEW_PK:
        return "fleet view (workers)"
    return "other worker reads (acquire, confirmations)"


def classify(raw: dict[str, Any], connection_hours: float) -> dict[str, Any]:
    """Requests and units per category, per (production) connection-hour."""
    from .scale_model import TABLE, failed_write, reads_of_request, writes_of_change

    table, table_name, images = raw["table"], raw["table_name"], raw["images"]
    writes = {c: {"requests": 0, "write_units": 0.0, "gsi_writes": 0, "gsi_write_units": 0.0}
              for c in WRITE_CATEGORIES}  # fmt: skip
    reads = {c: {"requests": 0, "read_units": 0.0} for c in READ_CATEGORIES}
    for record in raw["stream_records"]:
        data = record["dynamodb"]
        old, new = data.get("OldImage"), data.get("NewImage")
        row = writes[write_category(old, new)]
        row["requests"] += 1
        for write in writes_of_change(old, new, table):
            if write.target == TABLE:
                row["write_units"] += write.units
            else:
                row["gsi_writes"] += 1
                row["gsi_write_units"] += write.units
    for entry in raw["entries"]:
        failed = failed_write(entry, table, images)
        if failed is not None:
            row = writes["failed conditional writes"]
            row["requests"] += 1
            row["write_units"] += failed.units
        found = reads_of_request(entry, table, table_name, images)
        if entry.get("operation") in ("GetItem", "BatchGetItem", "Query", "Scan") \
                and entry.get("status") == 200:
            row = reads[read_category(entry)]
            row["requests"] += 1
            row["read_units"] += sum(r.units for r in found)

    def per_hour(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
        return {c: {k: round(v / connection_hours, 3) for k, v in r.items()}
                for c, r in rows.items()}  # fmt: skip

    w, r = per_hour(writes), per_hour(reads)
    totals = {
        "writes": round(sum(x["requests"] for x in w.values()), 3),
        "write_units": round(sum(x["write_units"] for x in w.values()), 3),
        "gsi_writes": round(sum(x["gsi_writes"] for x in w.values()), 3),
        "gsi_write_units": round(sum(x["gsi_write_units"] for x in w.values()), 3),
        "reads": round(sum(x["requests"] for x in r.values()), 3),
        "read_units": round(sum(x["read_units"] for x in r.values()), 3),
    }
    counted = {
        "writes": {c: x for c, x in writes.items()},
        "reads": {c: x for c, x in reads.items()},
    }
    return {"writes_per_connection_hour": w, "reads_per_connection_hour": r,
            "totals_per_connection_hour": totals, "counted_in_window": counted}  # fmt: skip


def _v1_reads_per_connection_hour() -> float | None:
    """The v1 recording's read units per connection-hour (its reconciler's queries)."""
    import json

    from .scale_record import V1_RECORDING

    try:
        v1 = json.loads(V1_RECORDING.read_text())
    except (OSError, ValueError):
        return None
    hours = v1["connections"] * v1["window_seconds"] * v1["factor"] / 3600
    return round(sum(k["read_units_measured"] for k in v1["keys"]) / hours, 3)


def run_coordination_cost(
    *,
    run_dir: Path,
    connections: int = 1000,
    factor: float = 10.0,
    checkpoint_periods: int = 2,
    rate: float = 0.2,
) -> dict[str, Any]:
    """One worker with ``connections``; coordination requests and units per connection-hour.

    ``factor``: on a loaded 2-core machine the serialised moto server answers a renewal up to
    2-3 s late at 1,000 connections, so the compressed lease must stay longer than that (at
    factor 10, lease 2 s, the worker self-fenced again and again: a recovery was measured, not
    a steady state; the result says so in ``steady_state``)."""
    from .scale_record import PRODUCTION_V2, record

    window = checkpoint_periods * PRODUCTION_V2["checkpoint"] / factor
    recording = record(version="v2", connections=connections, workers=1, factor=factor,
                       window_seconds=window, rate=rate, run_dir=run_dir,
                       keep_raw=True)  # fmt: skip
    raw = recording.pop("raw")
    production_seconds = recording["window_seconds"] * factor
    connection_hours = connections * production_seconds / 3600
    figures = classify(raw, connection_hours)
    totals = figures["totals_per_connection_hour"]
    v1 = {**V1_PER_CONNECTION_HOUR, "read_units": _v1_reads_per_connection_hour()}
    counted = figures["counted_in_window"]["writes"]
    # A steady state has no worker registering and nobody killed: if the worker's lease lapsed
    # (it self-fenced and started over under a new id) the window measured a recovery instead.
    steady = (recording["still_streaming_at_end"]
              and counted["worker register / delete"]["requests"] == 0
              and counted["reconciler hint claims and kills"]["requests"] == 0)  # fmt: skip
    met = (steady and totals["write_units"] <= 10
           and totals["writes"] <= 10 and totals["reads"] <= 10
           and totals["read_units"] <= 10)  # fmt: skip
    return {
        "benchmark": "coordination_cost",
        "settings": {
            "connections": connections,
            "workers": 1,
            "frames_per_second_per_stream": rate,
            "time_compression_factor": factor,
            "production_cadences_seconds": recording["production"],
            "compressed_cadences_seconds": recording["compressed"],
            "window_seconds_wall": recording["window_seconds"],
            "window_seconds_production": round(production_seconds, 1),
            "checkpoint_periods_in_window": checkpoint_periods,
            "lambdas_behind_proxy": ["router", "reconciler", "stream_notifier"],
        },
        "still_streaming_at_end": recording["still_streaming_at_end"],
        "steady_state": steady,
        "operations": recording["operations"],
        **figures,
        "v1_per_connection_hour": v1,
        "target": "<= 10 writes (and write units) and <= 10 reads (and read units) per "
                  "connection-hour at 1,000 connections per worker",
        "target_met": met,
        "commit": recording["commit"],
    }
