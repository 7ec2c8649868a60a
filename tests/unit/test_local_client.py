"""The CLI's API client and status rows."""

from __future__ import annotations

from typing import Any

import pytest

from wsfleet.aws import dynamodb_client
from wsfleet.clock import now_ms
from wsfleet.record import ConnectionRecord, DesiredState, WorkerRecord, connection_pk
from wsfleet.store import DynamoDBLeaseStore
from wsfleet.views import connection_view
from wsfleet_local.client import ApiClient, ConnectionRow, is_loopback_url, read_table


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("http://127.0.0.1:8080/dev", True),
        ("http://localhost/dev", True),
        ("http://[::1]:9/dev", True),
        ("https://abc123.execute-api.eu-west-1.amazonaws.com/dev", False),
        ("http://10.0.0.1/dev", False),
    ],
)
def test_only_non_loopback_urls_are_signed(url, loopback):
    assert is_loopback_url(url) is loopback
    assert ApiClient(url).sign is (not loopback)


def test_region_comes_from_the_execute_api_host():
    assert ApiClient("https://abc.execute-api.eu-west-1.amazonaws.com/dev").region == "eu-west-1"


def test_deployed_requests_carry_a_sigv4_signature(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    client = ApiClient("https://abc.execute-api.eu-west-1.amazonaws.com/dev")
    headers = client._signed_headers(
        "PUT", client.base_url + "/connections/a", b"{}", {"Content-Type": "application/json"}
    )
    assert headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "/eu-west-1/execute-api/aws4_request" in headers["Authorization"]
    assert "X-Amz-Date" in headers


def owner(expires_at_ms: int = 5_000, **changes: Any) -> WorkerRecord:
    return WorkerRecord(
        worker_id="w1", control_queue_url="q://w1", started_at_ms=0, heartbeat_at_ms=0,
        expires_at_ms=expires_at_ms, **changes,
    )


def row_of(record: ConnectionRecord, owner: WorkerRecord | None, now_ms: int) -> ConnectionRow:
    """The row ``wsfleet status --table`` shows: from the router's view of the record."""
    return ConnectionRow.from_api(connection_view(record, owner, now_ms))


def test_rows_from_the_api_view_and_from_a_record_agree():
    # GIVEN a connection owned by w1, whose worker lease runs until 5 000
    record = ConnectionRecord(
        pk="CONN#a",
        desired_state=DesiredState.STARTED,
        ws_url="ws://x",
        last_seq=7,
        lease_owner="w1",
        lease_epoch=2,
    )
    from_record = row_of(record, owner(), now_ms=1_000)
    view = {
        "connection_id": "a",
        "desired_state": "STARTED",
        "last_seq": 7,
        "lease": {"state": "held", "owner": "w1", "epoch": 2, "expires_in_ms": 4_000},
    }
    # THEN the row read from the table matches the router's view of it
    assert ConnectionRow.from_api(view) == from_record
    assert from_record.streaming
    # AND it is expired once the owner's lease lapsed, was killed, or its item is gone
    for worker, now in ((owner(), 6_000), (owner(dead_at_ms=900), 1_000), (None, 1_000)):
        expired = row_of(record, worker, now_ms=now)
        assert (expired.lease_state, expired.lease_left_ms, expired.streaming) == (
            "expired", 0, False,
        )
    free = row_of(record.with_changes(lease_owner=""), None, 0)
    assert (free.lease_state, free.owner, free.lease_left_ms) == ("free", None, None)


def test_rows_read_from_the_table_take_each_owners_worker_item(aws):
    # GIVEN two connections of a live worker, one of a lapsed one, and a free one
    store = DynamoDBLeaseStore(dynamodb_client(), aws.connections_table)
    for worker_id, lease_ms in (("live", 60_000), ("lapsed", -1_000)):
        now = now_ms()
        store.register_worker(WorkerRecord(
            worker_id=worker_id, control_queue_url="", started_at_ms=now, heartbeat_at_ms=now,
            expires_at_ms=now + lease_ms,
        ))
    for cid, owner_id in (("a", "live"), ("b", "live"), ("c", "lapsed"), ("d", "")):
        store.start(cid, f"ws://x/{cid}")
        if owner_id:
            store.acquire(connection_pk(cid), owner_id)
    # WHEN the table is read
    rows, workers = read_table(dynamodb_client(), aws.connections_table, now_ms())
    # THEN each row is judged by its own owner's worker item
    states = {row.connection_id: row.lease_state for row in rows}
    assert states == {"a": "held", "b": "held", "c": "expired", "d": "free"}
    left = {row.connection_id: row.lease_left_ms for row in rows}
    assert 0 < left["a"] <= 60_000 and left["c"] == 0 and left["d"] is None
    assert set(workers) == {"live", "lapsed"}


def test_a_failed_connection_row_shows_the_reason_and_the_breaker_count():
    # GIVEN a connection the breaker ended FAILED, read from the table and from the API
    reason = "closed_by_worker (code 1009: message too big)"
    record = ConnectionRecord(
        pk="CONN#p", desired_state=DesiredState.FAILED, ws_url="ws://x", last_seq=2,
        lease_epoch=3, stop_reason=reason, last_error=reason, failure_count=5, failure_seq=2,
    )
    view = {
        "connection_id": "p", "desired_state": "FAILED", "last_seq": 2,
        "lease": {"state": "free", "owner": None, "epoch": 3, "expires_in_ms": None},
        "stop_reason": reason, "last_error": reason, "failures": {"count": 5, "at_seq": 2},
    }
    # THEN both rows agree, are FAILED (not streaming) and say why and how often
    row = row_of(record, None, now_ms=0)
    assert ConnectionRow.from_api(view) == row
    assert row.failed and not row.streaming
    assert row.note == f"{reason} (5 failures at one checkpoint)"
