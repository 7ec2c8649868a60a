"""ConnectionRecord / WorkerRecord round trips, key helpers and the derived index keys."""

from __future__ import annotations

import zlib
from dataclasses import replace
from decimal import Decimal

import pytest

from wsfleet.record import (
    INDEX_SHARDS,
    WORKER_INDEX_VALUE,
    ConnectionRecord,
    DesiredState,
    WorkerRecord,
    connection_id_from_pk,
    connection_pk,
    index_keys,
    index_shard,
    is_valid_connection_id,
    worker_pk,
)

STARTED, STOPPED, FAILED = DesiredState.STARTED, DesiredState.STOPPED, DesiredState.FAILED
UNOWNED = ("unowned_shard", "unowned_since_ms")


def as_dynamodb(item: dict) -> dict:
    """Numbers as boto3's deserializer hands them back: Decimal."""
    return {
        k: Decimal(v) if isinstance(v, int) and not isinstance(v, bool) else v
        for k, v in item.items()
    }


# ------------------------------------------------------------------ keys
@pytest.mark.parametrize("value", ["a", "A.b_c:d-9", "x" * 128])
def test_valid_ids(value):
    assert is_valid_connection_id(value)


@pytest.mark.parametrize("value", ["", "x" * 129, "a b", "a/b", "é", "a#b"])
def test_invalid_ids(value):
    assert not is_valid_connection_id(value)


def test_keys():
    assert connection_pk("a") == "CONN#a"
    assert connection_id_from_pk("CONN#a") == "a"
    assert worker_pk("w") == "WORKER#w"
    with pytest.raises(ValueError):
        connection_id_from_pk("WORKER#w")


def test_index_shard_is_stable_and_spread():
    # crc32, not hash(): every process (worker, Lambda, CLI) must agree on it
    assert index_shard("CONN#abc") == zlib.crc32(b"CONN#abc") % INDEX_SHARDS == 3
    shards = {index_shard(connection_pk(f"c{i}")) for i in range(500)}
    assert shards == set(range(INDEX_SHARDS))


# ------------------------------------------------------------------ index keys
@pytest.mark.parametrize("state", list(DesiredState))
@pytest.mark.parametrize("owned", [True, False])
def test_index_keys_for_every_state_and_ownership(state, owned):
    keys, removed = index_keys("CONN#abc", state, owned=owned, since_ms=42)
    assert keys["state_shard"] == f"{state.value}#03"
    if state is STARTED and not owned:
        # a free STARTED connection is what the reconciler's orphan pass must find
        assert keys == {"state_shard": "STARTED#03", "unowned_shard": "03", "unowned_since_ms": 42}
        assert removed == ()
    else:
        assert keys == {"state_shard": f"{state.value}#03"}
        assert set(removed) == set(UNOWNED)
    assert not set(keys) & set(removed)


# ------------------------------------------------------------------ connection items
def test_new_record_is_started_free_and_unowned_since_creation():
    rec = ConnectionRecord.new("m-1", "wss://up/x", 123)
    assert (rec.pk, rec.connection_id, rec.desired_state) == ("CONN#m-1", "m-1", STARTED)
    assert (rec.lease_owner, rec.lease_epoch, rec.last_seq) == ("", 0, 0)
    assert rec.created_at_ms == rec.updated_at_ms == rec.unowned_since_ms == 123


def test_a_free_started_item_carries_the_unowned_keys_and_no_owner():
    item = ConnectionRecord.new("abc", "wss://up/x", 5).to_item()
    assert "lease_owner" not in item  # an index key may not be empty; free = absent
    assert (item["state_shard"], item["unowned_shard"], item["unowned_since_ms"]) == (
        "STARTED#03", "03", 5,
    )
    assert item["desired_state"] == "STARTED"
    assert "stop_reason" not in item and "failure_seq" not in item  # None is left out


@pytest.mark.parametrize(
    "changes",
    [
        {"lease_owner": "w1", "lease_epoch": 2, "unowned_since_ms": None},
        {"desired_state": STOPPED, "stop_reason": "api", "unowned_since_ms": None},
        {"desired_state": FAILED, "lease_epoch": 4, "unowned_since_ms": None,
         "last_error": "boom", "failure_count": 3, "failure_seq": 9},
        {"lease_owner": "w1", "desired_state": STOPPED, "unowned_since_ms": None},
    ],
)
def test_other_items_carry_their_state_shard_only(changes):
    rec = ConnectionRecord.new("abc", "wss://up/x", 5).with_changes(**changes)
    item = rec.to_item()
    assert item["state_shard"] == f"{rec.desired_state.value}#03"
    assert not set(UNOWNED) & set(item)
    assert ("lease_owner" in item) is bool(rec.lease_owner)


@pytest.mark.parametrize(
    "rec",
    [
        ConnectionRecord.new("a", "wss://up/x", 5),
        ConnectionRecord.new("a", "wss://up/x", 5).with_changes(
            lease_owner="w1", lease_epoch=2, last_seq=17, last_error="boom",
            unowned_since_ms=None, resume=False,
        ),
        ConnectionRecord.new("a", "wss://up/x", 5).with_changes(lease_epoch=3, unowned_since_ms=9),
        ConnectionRecord.new("a", "", 5).with_changes(
            desired_state=FAILED, stop_reason="poison", last_error="poison", failure_count=5,
            failure_seq=0, unowned_since_ms=None,
        ),
    ],
)
def test_item_round_trip(rec):
    item = rec.to_item()
    assert ConnectionRecord.from_item(item) == rec
    assert ConnectionRecord.from_item(as_dynamodb(item)) == rec  # DynamoDB hands back Decimal


def test_an_owned_record_never_writes_a_stale_unowned_since():
    # a record that says it is owned yet still has unowned_since_ms: the index keys win,
    # or the item would be half in gsi_unowned (sort key without partition key)
    rec = ConnectionRecord.new("a", "wss://up/x", 5).with_changes(lease_owner="w1")
    assert not set(UNOWNED) & set(rec.to_item())
    assert ConnectionRecord.from_item(rec.to_item()).unowned_since_ms is None


def test_from_item_ignores_index_and_claim_attributes_and_fills_defaults():
    rec = ConnectionRecord.from_item(
        {"pk": "CONN#x", "desired_state": "STOPPED", "state_shard": "STOPPED#01",
         "hinted_since_ms": Decimal(4), "expires_at": Decimal(99)}
    )  # fmt: skip
    assert rec == ConnectionRecord(pk="CONN#x", desired_state=STOPPED, ws_url="")
    assert rec.resume is True and rec.stop_reason is None and rec.lease_owner == ""
    assert ConnectionRecord.from_item({"pk": "CONN#y"}).desired_state is STOPPED


# ------------------------------------------------------------------ worker items
def worker(**changes) -> WorkerRecord:
    base = WorkerRecord(worker_id="w", control_queue_url="http://q", started_at_ms=1,
                        heartbeat_at_ms=2, expires_at_ms=3, connection_count=4, capacity=100)
    return replace(base, **changes)


@pytest.mark.parametrize(
    "rec",
    [
        worker(),
        worker(dead_at_ms=7),
        worker(hinted_expiry_ms=3, hinted_at_ms=5),
    ],
)
def test_worker_round_trip(rec):
    item = rec.to_item()
    assert (item["pk"], item["worker_index"]) == ("WORKER#w", WORKER_INDEX_VALUE)
    assert "desired_state" not in item and "state_shard" not in item  # no connection index
    assert not {k for k, v in item.items() if v is None}
    assert WorkerRecord.from_item(item) == rec
    assert WorkerRecord.from_item(as_dynamodb(item)) == rec
    assert rec.pk == "WORKER#w"


def test_worker_dead_once_dead_at_is_set():
    assert not worker().dead
    assert worker(dead_at_ms=0).dead  # any value, even 0, is a kill
    assert "dead_at_ms" not in worker().to_item()
