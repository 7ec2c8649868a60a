"""ConnectionRecord / WorkerRecord round trips and key helpers."""

from decimal import Decimal

import pytest

from wsfleet.record import (
    ConnectionRecord,
    DesiredState,
    WorkerRecord,
    connection_id_from_pk,
    connection_pk,
    is_valid_connection_id,
    worker_pk,
)


def test_new_record_has_no_lease():
    rec = ConnectionRecord.new("m-1", "wss://up/x", 123)
    assert rec.pk == "CONN#m-1"
    assert rec.connection_id == "m-1"
    lease = (rec.lease_owner, rec.lease_expires_at_ms, rec.lease_epoch, rec.last_seq)
    assert lease == ("", 0, 0, 0)
    assert rec.created_at_ms == rec.updated_at_ms == 123


def test_item_round_trip_drops_none_and_reads_decimals():
    rec = ConnectionRecord.new("a", "wss://up/x", 5).with_changes(lease_epoch=2, last_error="boom")
    item = rec.to_item()
    assert "stop_reason" not in item
    assert item["desired_state"] == "STARTED"
    # DynamoDB hands numbers back as Decimal
    item = {k: Decimal(v) if isinstance(v, int) and not isinstance(v, bool) else v
            for k, v in item.items()}
    assert ConnectionRecord.from_item(item) == rec


def test_missing_fields_take_defaults():
    rec = ConnectionRecord.from_item({"pk": "CONN#x", "desired_state": "STOPPED"})
    assert rec.desired_state is DesiredState.STOPPED
    assert rec.resume is True and rec.stop_reason is None


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


def test_worker_record_round_trip():
    worker = WorkerRecord(worker_id="w", control_queue_url="http://q", started_at_ms=1,
                          heartbeat_at_ms=2, expires_at_ms=3, connection_count=4)
    item = worker.to_item()
    assert item["pk"] == "WORKER#w"
    assert "desired_state" not in item  # keeps worker items out of the orphan GSI
    assert WorkerRecord.from_item(item) == worker
