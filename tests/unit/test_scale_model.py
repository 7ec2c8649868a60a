"""The scale model (bench/scale_model.py): index writes from item images, reads per partition
value, how keys scale with the fleet, ceilings; and the proxy's request journal it reads."""

from __future__ import annotations

import json
import math

import boto3
import pytest

from bench.scale_model import (
    TABLE,
    Affine,
    IndexDef,
    KeyLoad,
    KeyRead,
    Run,
    TableDef,
    ceiling,
    failed_write,
    key_class,
    model,
    reads_of_request,
    render_markdown,
    table_def,
    writes_of_change,
)

V1_TABLE = TableDef("pk", indexes=(IndexDef("gsi_desired_state_lease", "desired_state",
                                            "lease_expires_at_ms", "ALL"),))  # fmt: skip


def s(value: str) -> dict[str, str]:
    return {"S": value}


def n(value: int) -> dict[str, str]:
    return {"N": str(value)}


@pytest.fixture(scope="module")
def v2_table() -> TableDef:
    from wsfleet_local.backend import find_template, load_template

    return table_def(load_template(find_template()))


def owned_connection(**changes: dict[str, str]) -> dict[str, dict[str, str]]:
    item = {"pk": s("CONN#a"), "desired_state": s("STARTED"), "lease_owner": s("w0"),
            "lease_epoch": n(3), "last_seq": n(10), "ws_url": s("wss://x/a"),
            "state_shard": s("STARTED#04")}  # fmt: skip
    item.update(changes)
    return item


def targets(writes: list) -> list[tuple[str, str]]:
    return sorted((w.target, w.key) for w in writes)


# -- the template -----------------------------------------------------------------------------


def test_template_indexes_are_parsed_with_their_projections(v2_table: TableDef) -> None:
    # GIVEN the checkout's template.yaml WHEN parsed THEN every GSI has its key and projection
    assert v2_table.hash_key == "pk"
    owner = v2_table.index("gsi_owner")
    assert (owner.hash_key, owner.projection) == ("lease_owner", "INCLUDE")
    assert owner.non_key == {"lease_epoch", "desired_state"}
    assert v2_table.index("gsi_unowned").range_key == "unowned_since_ms"
    assert v2_table.index("gsi_workers").projection == "KEYS_ONLY"


# -- writes -----------------------------------------------------------------------------------


def test_v1_renewal_moves_the_gsi_entry_under_the_same_hot_key() -> None:
    # GIVEN a v1 renewal: the GSI sort key lease_expires_at_ms changes
    old = {"pk": s("CONN#a"), "desired_state": s("STARTED"), "lease_expires_at_ms": n(1000)}
    new = {**old, "lease_expires_at_ms": n(6000)}
    # WHEN THEN one base write plus a delete and a put of the index entry, both on STARTED
    writes = writes_of_change(old, new, V1_TABLE)
    assert targets(writes) == [("gsi_desired_state_lease", "STARTED")] * 2 + [(TABLE, "CONN#a")]
    assert sum(w.units for w in writes) == 3


def test_v2_checkpoint_writes_the_base_item_only(v2_table: TableDef) -> None:
    # GIVEN an owned connection whose checkpoint advances (last_seq is no index key or projection)
    old = owned_connection()
    writes = writes_of_change(old, owned_connection(last_seq=n(99)), v2_table)
    # THEN no index is written
    assert targets(writes) == [(TABLE, "CONN#a")]


def test_v2_worker_heartbeat_writes_the_base_item_only(v2_table: TableDef) -> None:
    old = {"pk": s("WORKER#w0"), "worker_index": s("WORKER"), "expires_at_ms": n(1)}
    writes = writes_of_change(old, {**old, "expires_at_ms": n(2)}, v2_table)
    assert targets(writes) == [(TABLE, "WORKER#w0")]
    assert writes[0].source == "worker"


def test_acquire_enters_the_owner_index_and_leaves_the_unowned_one(v2_table: TableDef) -> None:
    # GIVEN a free STARTED connection waiting in gsi_unowned
    free = owned_connection(unowned_shard=s("07"), unowned_since_ms=n(5))
    del free["lease_owner"]
    taken = owned_connection(lease_epoch=n(4))
    # WHEN it is acquired THEN it is put under its owner and deleted from its unowned shard
    writes = writes_of_change(free, taken, v2_table)
    assert targets(writes) == [("gsi_owner", "w0"), ("gsi_unowned", "07"), (TABLE, "CONN#a")]


def test_a_projected_attribute_change_rewrites_the_entry_in_place(v2_table: TableDef) -> None:
    # GIVEN an INCLUDE projection of desired_state WHEN a STOP changes it (state_shard kept)
    writes = writes_of_change(owned_connection(), owned_connection(desired_state=s("STOPPED")),
                              v2_table)  # fmt: skip
    # THEN one put on the same owner key: no delete, since the index key did not change
    assert targets(writes) == [("gsi_owner", "w0"), (TABLE, "CONN#a")]


def test_write_units_follow_the_larger_image_per_started_kilobyte() -> None:
    old = {"pk": s("CONN#a"), "blob": s("x" * 1500)}
    writes = writes_of_change(old, {"pk": s("CONN#a")}, V1_TABLE)
    assert [w.units for w in writes] == [2]
    assert writes_of_change({"pk": s("CONN#a")}, None, V1_TABLE)[0].units == 1


def test_a_failed_conditional_write_costs_units_on_its_key() -> None:
    entry = {"operation": "UpdateItem", "status": 400, "label": "worker",
             "request": {"Key": {"pk": s("CONN#a")}},
             "response": {"__type": "com.amazonaws.dynamodb.v20120810#"
                                    "ConditionalCheckFailedException"}}  # fmt: skip
    write = failed_write(entry, V1_TABLE, {"CONN#a": {"pk": s("CONN#a")}})
    assert write is not None and (write.target, write.key, write.units) == (TABLE, "CONN#a", 1)
    assert failed_write({**entry, "status": 200}, V1_TABLE, {}) is None


# -- reads ------------------------------------------------------------------------------------


def test_reads_are_attributed_to_the_partition_value_they_read(v2_table: TableDef) -> None:
    images = {"CONN#a": owned_connection(ws_url=s("x" * 5000))}
    get = {"operation": "GetItem", "status": 200, "label": "worker",
           "request": {"Key": {"pk": s("CONN#a")}, "ConsistentRead": True,
                       "ProjectionExpression": "pk"},
           "response": {"Item": {"pk": s("CONN#a")}}}  # fmt: skip
    (read,) = reads_of_request(get, v2_table, "c", images)
    # charged for the stored item (> 4 KB), strongly consistent, not for the projection
    assert (read.target, read.key, read.factor, read.by_worker) == (TABLE, "CONN#a", 1.0, True)
    assert read.units == 2.0
    query = {"operation": "Query", "status": 200, "label": "reconciler",
             "request": {"TableName": "c", "IndexName": "gsi_owner",
                         "KeyConditionExpression": "#o = :o",
                         "ExpressionAttributeNames": {"#o": "lease_owner"},
                         "ExpressionAttributeValues": {":o": s("w0")}},
             "response": {"Items": [{"pk": s("CONN#a")}], "Count": 1,
                          "ScannedCount": 3}}  # fmt: skip
    (read,) = reads_of_request(query, v2_table, "c", images)
    assert (read.target, read.key, read.factor, read.by_worker) == ("gsi_owner", "w0", 0.5, False)
    # the entry is what gsi_owner projects (not the 5 KB url), three of them were read
    assert 0 < read.connection_bytes < 300 and read.connection_bytes % 3 == 0


def test_a_batch_get_reads_each_key_once(v2_table: TableDef) -> None:
    entry = {"operation": "BatchGetItem", "status": 200, "label": "reconciler",
             "request": {"RequestItems": {"c": {"Keys": [{"pk": s("WORKER#w0")},
                                                         {"pk": s("WORKER#w9")}]}}},
             "response": {"Responses": {"c": [{"pk": s("WORKER#w0")}]}}}  # fmt: skip
    reads = reads_of_request(entry, v2_table, "c", {})
    assert [(r.key, r.worker_bytes > 0) for r in reads] == [("WORKER#w0", True),
                                                             ("WORKER#w9", False)]  # fmt: skip
    assert all(r.units == 0.5 for r in reads)


def test_key_classes() -> None:
    assert key_class(TABLE, "CONN#a", ["w0"]) == "connection"
    assert key_class(TABLE, "WORKER#w0", ["w0"]) == "worker"
    assert key_class("gsi_owner", "w0", ["w0"]) == "worker"
    assert key_class("gsi_workers", "WORKER", ["w0"]) == "fleet"
    assert key_class(TABLE, "*", ["w0"]) == "fleet"


# -- the model --------------------------------------------------------------------------------


def test_ceiling_of_an_affine_load() -> None:
    assert ceiling(Affine(0.0, 0.4), 1000.0) == 2500.0
    assert ceiling(Affine(10.0, 0.0), 1000.0) == math.inf
    assert ceiling(Affine(1000.0, 1.0), 1000.0) == 0.0


def test_a_fleet_key_reaches_its_limit_in_proportion_to_the_fleet() -> None:
    # GIVEN v1's shape: 100 connections, 2 workers, 0.4 index WCU/s per connection on STARTED,
    # measured for 50 s with every cadence / 2 (= 100 production seconds)
    run = Run(connections=100, workers=2, window_seconds=50.0, factor=2.0)
    hot = KeyLoad("gsi", "STARTED", "fleet", write_units_connection=0.4 * 100 * 100)
    hot.add_read(KeyRead("gsi", "STARTED", 0.5))  # one reconciler query in the window
    cold = KeyLoad(TABLE, "CONN#a", "connection", write_units_connection=20.0)
    result = model([cold, hot], run)
    # THEN the fleet key is the hottest, at 400 WCU/s per 1,000 connections
    assert result["hottest"]["key"] == "STARTED"
    assert result["hottest"]["wcu_per_s_at_1000"] == pytest.approx(400.0)
    assert result["ceiling_50"] == pytest.approx(1250.0)
    assert result["ceiling_100"] == pytest.approx(2500.0)
    assert result["target_met"] is False


def test_worker_keys_scale_with_connections_per_worker_not_with_the_fleet() -> None:
    # GIVEN a per-worker key read by its worker (a sweep): 50 connections' entries per read
    run = Run(connections=100, workers=2, window_seconds=100.0, factor=1.0)
    key = KeyLoad("gsi_owner", "w0", "worker", read_request_units_worker=10.0,
                  read_byte_units_connection=5.0)  # fmt: skip
    (figures,) = model([key], run, connections_per_worker=1000)["keys"]
    # THEN at C = 1,000 the bytes are 20x the measured ones; requests stay per worker
    assert figures["rcu_per_s_at_1m"] == pytest.approx(0.1 + 0.05 * 20)
    assert figures["rcu_per_s_at_1000"] == figures["rcu_per_s_at_1m"]
    assert figures["ceiling_50"] is None  # never, whatever N


def test_lambda_requests_stay_per_pass_and_worker_items_grow_with_workers() -> None:
    run = Run(connections=100, workers=2, window_seconds=100.0, factor=1.0)
    key = KeyLoad("gsi_workers", "WORKER", "fleet", read_request_units_other=10.0,
                  read_byte_units_worker=0.2, write_units_worker=2.0)  # fmt: skip
    result = model([key], run, connections_per_worker=1000)
    (figures,) = result["keys"]
    # 1,000,000 connections = 1,000 workers = 500x the two measured
    assert figures["rcu_per_s_at_1m"] == pytest.approx(0.1 + 0.002 * 500)
    assert figures["wcu_per_s_at_1m"] == pytest.approx(0.02 * 500)
    assert result["target_met"] is True


def test_render_has_a_table_per_version_and_says_what_is_missing() -> None:
    run = Run(connections=100, workers=2, window_seconds=50.0, factor=2.0)
    load = KeyLoad("gsi", "STARTED", "fleet", write_units_connection=4000.0)
    recording = {"connections": 100, "workers": 2, "production": {"heartbeat": 5.0}}
    text = render_markdown([("v1", recording, model([load], run)), ("v2", None, None)])
    assert "| gsi | `STARTED` | fleet | 1 |" in text
    assert "Not recorded yet" in text


# -- the proxy's journal ----------------------------------------------------------------------


def test_the_proxy_journals_requests_to_the_named_table_with_their_answers(aws, tmp_path) -> None:
    from bench.faults import FaultProxy

    journal = tmp_path / "journal.jsonl"
    with FaultProxy(aws.endpoint_url, labels=("worker",), journal=journal,
                    journal_table="Connections") as proxy:  # fmt: skip
        client = boto3.client("dynamodb", endpoint_url=proxy.url_for("worker"))
        client.put_item(TableName=aws.connections_table, Item={"pk": s("CONN#j")})
        client.get_item(TableName=aws.connections_table, Key={"pk": s("CONN#j")})
        client.scan(TableName=aws.messages_table, Limit=1)  # another table: not journalled
        assert proxy.stats().total(operation="Scan") == 1  # counting is unchanged
    entries = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [(e["label"], e["operation"], e["status"]) for e in entries] == [
        ("worker", "PutItem", 200), ("worker", "GetItem", 200)]  # fmt: skip
    assert entries[1]["request"]["Key"] == {"pk": s("CONN#j")}
    assert entries[1]["response"]["Item"] == {"pk": s("CONN#j")}


def test_the_recorder_sums_stream_images_and_journal_entries_per_key() -> None:
    from bench.scale_record import _loads

    # GIVEN one v1 renewal from the stream, one refused renewal and one reconciler query
    old = {"pk": s("CONN#a"), "desired_state": s("STARTED"), "lease_expires_at_ms": n(1)}
    records = [
        {
            "eventName": "MODIFY",
            "dynamodb": {"OldImage": old, "NewImage": {**old, "lease_expires_at_ms": n(2)}},
        }
    ]
    refused = {
        "label": "worker",
        "operation": "UpdateItem",
        "status": 400,
        "request": {"Key": {"pk": s("CONN#a")}},
        "response": {"__type": "x#ConditionalCheckFailedException"},
    }
    query = {"label": "reconciler", "operation": "Query", "status": 200,
             "request": {"IndexName": "gsi_desired_state_lease",
                         "KeyConditionExpression": "desired_state = :s",
                         "ExpressionAttributeValues": {":s": s("STARTED")}},
             "response": {"Items": [], "Count": 0, "ScannedCount": 0}}  # fmt: skip
    loads, operations = _loads(V1_TABLE, "c", records, [refused, query], {"CONN#a": old}, ["w0"])
    by_key = {(load.target, load.key): load for load in loads}
    # THEN the connection key has two writes, the hot key two index writes and one read
    assert by_key[(TABLE, "CONN#a")].write_requests == 2
    hot = by_key[("gsi_desired_state_lease", "STARTED")]
    assert (hot.key_class, hot.write_units_connection, hot.read_requests) == ("fleet", 2.0, 1)
    assert operations["stream:MODIFY"] == 1 and operations["worker:UpdateItem:400"] == 1
