"""bench/request_cost.py: what each recorded request is counted as, and the units it costs.

The coordination-cost figure of issue #12 is a sum of these categories, so a misfiled request
(a checkpoint counted as a heartbeat, an index write missed) would move the reported figure.
"""

from __future__ import annotations

from typing import Any

import pytest

from bench.request_cost import classify, read_category, write_category
from bench.scale_model import IndexDef, TableDef

TABLE = TableDef(
    "pk",
    indexes=(
        IndexDef("gsi_owner", "lease_owner", None, "INCLUDE",
                 frozenset({"lease_epoch", "desired_state"})),
        IndexDef("gsi_workers", "worker_index", None, "KEYS_ONLY"),
    ),
)


def _s(value: str) -> dict[str, str]:
    return {"S": value}


def _n(value: int) -> dict[str, str]:
    return {"N": str(value)}


WORKER = {"pk": _s("WORKER#w1"), "worker_index": _s("WORKER"), "expires_at_ms": _n(1000)}
VIEW = {"pk": _s("FLEET#view"), "at_ms": _n(1000)}
CONN = {"pk": _s("CONN#a"), "desired_state": _s("STARTED"), "lease_owner": _s("w1"),
        "lease_epoch": _n(3), "last_seq": _n(10)}  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (WORKER, {**WORKER, "expires_at_ms": _n(6000)}, "worker-lease heartbeats"),
        (WORKER, {**WORKER, "dead_at_ms": _n(7000)}, "reconciler hint claims and kills"),
        (WORKER, {**WORKER, "hinted_expiry_ms": _n(1000)}, "reconciler hint claims and kills"),
        (None, WORKER, "worker register / delete"),
        (CONN, {**CONN, "last_seq": _n(99)}, "checkpoints"),
        (CONN, {k: v for k, v in CONN.items() if k != "lease_owner"}, "acquire / release"),
        (CONN, {**CONN, "lease_owner": _s("w2"), "lease_epoch": _n(4)}, "acquire / release"),
        ({k: v for k, v in CONN.items() if k != "lease_owner"}, CONN, "acquire / release"),
        (CONN, {**CONN, "desired_state": _s("STOPPED")}, "START / STOP"),
        (CONN, {**CONN, "last_error": _s("boom")}, "other connection writes"),
        (None, VIEW, "fleet view (reconciler)"),
        (VIEW, {**VIEW, "at_ms": _n(2000)}, "fleet view (reconciler)"),
    ],
)
def test_write_category(old: Any, new: Any, expected: str) -> None:
    assert write_category(old, new) == expected


def test_read_category_by_label_and_index() -> None:
    sweep = {"label": "worker", "operation": "Query", "request": {"IndexName": "gsi_owner"}}
    get = {"label": "worker", "operation": "GetItem", "request": {"ConsistentRead": True}}
    assert read_category(sweep) == "worker sweeps (gsi_owner)"
    assert read_category(get) == "other worker reads (acquire, confirmations)"
    view = {"label": "worker", "operation": "GetItem", "request": {"Key": {"pk": VIEW["pk"]}}}
    assert read_category(view) == "fleet view (workers)"
    assert read_category({**get, "label": "reconciler"}) == "reconciler passes"
    assert read_category({**get, "label": "router"}) == "router / notifier"


def _record(old: Any, new: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"Keys": {"pk": (new or old)["pk"]}}
    if old is not None:
        data["OldImage"] = old
    if new is not None:
        data["NewImage"] = new
    return {"dynamodb": data}


def test_classify_counts_index_writes_and_scales_per_connection_hour() -> None:
    released = {k: v for k, v in CONN.items() if k != "lease_owner"}
    raw = {
        "table": TABLE,
        "table_name": "t",
        "images": {"CONN#a": released, "WORKER#w1": WORKER},
        "stream_records": [
            _record(WORKER, {**WORKER, "expires_at_ms": _n(6000)}),  # no index attribute moves
            _record(CONN, {**CONN, "last_seq": _n(20)}),  # last_seq is not projected
            _record(CONN, released),  # leaves gsi_owner: one index delete
        ],
        "entries": [
            {"label": "worker", "operation": "Query", "status": 200,
             "request": {"TableName": "t", "IndexName": "gsi_owner",
                         "KeyConditionExpression": "lease_owner = :o",
                         "ExpressionAttributeValues": {":o": _s("w1")}},
             "response": {"Items": [], "ScannedCount": 0}},
            {"label": "worker", "operation": "UpdateItem", "status": 400,
             "request": {"TableName": "t", "Key": {"pk": _s("CONN#a")}},
             "response": {"__type": "x#ConditionalCheckFailedException"}},
        ],
    }  # fmt: skip
    figures = classify(raw, connection_hours=0.5)
    writes = figures["writes_per_connection_hour"]
    assert writes["worker-lease heartbeats"] == {
        "requests": 2.0, "write_units": 2.0, "gsi_writes": 0.0, "gsi_write_units": 0.0}
    assert writes["checkpoints"]["gsi_writes"] == 0.0
    assert writes["acquire / release"]["gsi_writes"] == 2.0
    assert writes["failed conditional writes"]["requests"] == 2.0
    reads = figures["reads_per_connection_hour"]
    assert reads["worker sweeps (gsi_owner)"] == {"requests": 2.0, "read_units": 1.0}
    assert figures["totals_per_connection_hour"]["writes"] == 8.0
