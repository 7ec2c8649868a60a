"""MessageStore without a server: keys, item shape, batching and retry decisions.

The DynamoDB behaviour that matters (overwrites, pagination, TTL attribute) is exercised
against the moto server in tests/integration/test_messages.py. Here botocore's Stubber plays
back the responses that are hard to provoke from a server: UnprocessedItems, throttling and a
ValidationException for one oversized item.
"""

from __future__ import annotations

import hashlib
import json

import boto3
import pytest
from botocore.stub import ANY, Stubber

from wsfleet.exceptions import StoreError
from wsfleet.messages import (
    BATCH_WRITE_LIMIT,
    Message,
    MessageStore,
    batch_write_body,
    local_sk,
    seq_sk,
)

TABLE = "messages"


def message(seq: int | None, *, sk: str | None = None, data: str | bytes = "d") -> Message:
    return Message(
        pk="CONN#a",
        sk=sk or seq_sk(seq or 0),
        message_data=data,
        received_at_ms=1_700_000_000_123,
        worker_id="w1",
        lease_epoch=4,
        seq=seq,
    )


@pytest.fixture
def client():
    return boto3.client(
        "dynamodb",
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
        endpoint_url="http://127.0.0.1:9",  # never reached: the Stubber answers
    )


def store_for(client, **kwargs) -> MessageStore:
    return MessageStore(client, TABLE, sleep=lambda _s: None, **kwargs)


def unprocessed(*messages: Message) -> dict:
    return {
        "UnprocessedItems": {
            TABLE: [{"PutRequest": {"Item": m.to_wire(None)}} for m in messages]
        }
    }


# ---------------------------------------------------------------- keys
def test_seq_keys_sort_numerically():
    assert seq_sk(9) < seq_sk(10) < seq_sk(10**19)
    assert len(seq_sk(1)) == 20


def test_seq_keys_reject_values_that_do_not_fit():
    with pytest.raises(ValueError):
        seq_sk(10**20)
    with pytest.raises(ValueError):
        seq_sk(-1)


def test_local_keys_sort_after_every_seq_key_and_by_epoch_time_counter():
    keys = [local_sk(2, 1_000, 1), local_sk(2, 1_000, 2), local_sk(2, 2_000, 1), local_sk(10, 5, 1)]
    assert keys == sorted(keys)
    assert seq_sk(10**20 - 1) < min(keys)


# ---------------------------------------------------------------- item shape
def test_item_carries_every_attribute_and_ttl():
    wire = message(7, data="s1:7").to_wire(1_702_592_000)
    assert wire == {
        "pk": {"S": "CONN#a"},
        "sk": {"S": "00000000000000000007"},
        "seq": {"N": "7"},
        "message_data": {"S": "s1:7"},
        "received_at_ms": {"N": "1700000000123"},
        "worker_id": {"S": "w1"},
        "lease_epoch": {"N": "4"},
        "expires_at": {"N": "1702592000"},
    }


def test_unnumbered_frames_have_no_seq_and_binary_data_stays_binary():
    wire = message(None, sk=local_sk(4, 1, 1), data=b"\xff").to_wire(None)
    assert "seq" not in wire and "expires_at" not in wire
    assert wire["message_data"] == {"B": b"\xff"}


def test_ttl_follows_retention_days_and_zero_keeps_items():
    assert MessageStore(None, TABLE, retention_days=30).expires_at(1_700_000_000_999) == (
        1_700_000_000 + 30 * 86_400
    )
    assert MessageStore(None, TABLE, retention_days=0).expires_at(1_700_000_000_999) is None


# ---------------------------------------------------------------- put_batch
def test_batches_hold_at_most_25_items(client):
    messages = [message(seq) for seq in range(1, 61)]
    with Stubber(client) as stub:
        for _ in range(3):  # 25 + 25 + 10
            stub.add_response(
                "batch_write_item",
                {},
                {"RequestItems": {TABLE: ANY}},
            )
        result = store_for(client).put_batch(messages)
        stub.assert_no_pending_responses()
    assert (result.written, result.unwritten, result.rejected, result.requests) == (60, [], [], 3)
    assert BATCH_WRITE_LIMIT == 25


def test_duplicate_keys_in_one_call_keep_the_last_frame(client):
    first, second = message(1, data="old"), message(1, data="new")
    with Stubber(client) as stub:
        stub.add_response(
            "batch_write_item",
            {},
            {"RequestItems": {TABLE: [{"PutRequest": {"Item": second.to_wire(None)}}]}},
        )
        result = store_for(client).put_batch([first, second])
    assert result.written == 1


def test_unprocessed_items_are_retried_until_written(client):
    a, b, c = message(1), message(2), message(3)
    with Stubber(client) as stub:
        stub.add_response("batch_write_item", unprocessed(b, c), {"RequestItems": ANY})
        stub.add_response("batch_write_item", unprocessed(c), {"RequestItems": ANY})
        stub.add_response(
            "batch_write_item",
            {},
            {"RequestItems": {TABLE: [{"PutRequest": {"Item": c.to_wire(None)}}]}},
        )
        result = store_for(client).put_batch([a, b, c])
        stub.assert_no_pending_responses()
    assert (result.written, result.unwritten, result.requests) == (3, [], 3)


def test_items_still_unprocessed_after_the_bound_are_handed_back(client):
    a, b = message(1), message(2)
    with Stubber(client) as stub:
        for _ in range(3):
            stub.add_response("batch_write_item", unprocessed(b), {"RequestItems": ANY})
        result = store_for(client, attempts=3).put_batch([a, b])
    assert (result.written, result.unwritten, result.requests) == (1, [b], 3)


def test_throttling_of_the_whole_call_is_retried(client):
    with Stubber(client) as stub:
        stub.add_client_error(
            "batch_write_item", "ProvisionedThroughputExceededException", http_status_code=400
        )
        stub.add_client_error("batch_write_item", "InternalServerError", http_status_code=500)
        stub.add_response("batch_write_item", {}, {"RequestItems": ANY})
        result = store_for(client).put_batch([message(1)])
    assert (result.written, result.requests) == (1, 3)


def test_an_invalid_item_is_isolated_and_the_rest_is_written(client):
    good = [message(seq) for seq in (1, 2, 3)]
    bad = message(4, data="x" * 10)
    with Stubber(client) as stub:
        stub.add_client_error("batch_write_item", "ValidationException", http_status_code=400)
        # halves: [1, 2] ok; [3, 4] invalid -> [3] ok, [4] invalid -> PutItem refused
        stub.add_response("batch_write_item", {}, {"RequestItems": ANY})
        stub.add_client_error("batch_write_item", "ValidationException", http_status_code=400)
        stub.add_response("batch_write_item", {}, {"RequestItems": ANY})
        stub.add_client_error("batch_write_item", "ValidationException", http_status_code=400)
        stub.add_client_error("put_item", "ValidationException", http_status_code=400)
        result = store_for(client).put_batch([*good, bad])
        stub.assert_no_pending_responses()
    assert result.written == 3
    assert result.rejected == [bad]
    assert result.unwritten == []


def test_other_errors_are_store_errors(client):
    with Stubber(client) as stub:
        stub.add_client_error("batch_write_item", "ResourceNotFoundException", http_status_code=400)
        with pytest.raises(StoreError):
            store_for(client).put_batch([message(1)])


# ---------------------------------------------------------------- guard (fencing)
def test_guard_filters_items_before_the_request(client):
    keep, fenced = message(1), message(2)
    with Stubber(client) as stub:
        stub.add_response(
            "batch_write_item",
            {},
            {"RequestItems": {TABLE: [{"PutRequest": {"Item": keep.to_wire(None)}}]}},
        )
        result = store_for(client).put_batch([keep, fenced], guard=lambda m: m.seq == 1)
        stub.assert_no_pending_responses()
    assert (result.written, result.fenced, result.requests) == (1, [fenced], 1)


def test_guard_is_asked_again_before_each_retry(client):
    a, b = message(1), message(2)
    allowed = {1, 2}
    with Stubber(client) as stub:
        stub.add_response("batch_write_item", unprocessed(b), {"RequestItems": ANY})
        store = store_for(client)
        store._sleep = lambda _s: allowed.discard(2)  # the lease lapses during the backoff
        result = store.put_batch([a, b], guard=lambda m: m.seq in allowed)
        stub.assert_no_pending_responses()
    assert (result.written, result.fenced, result.unwritten, result.requests) == (1, [b], [], 1)


def test_fully_fenced_batch_sends_nothing(client):
    with Stubber(client) as stub:
        result = store_for(client).put_batch([message(1)], guard=lambda m: False)
        stub.assert_no_pending_responses()
    assert (result.written, result.requests, len(result.fenced)) == (0, 0, 1)


def test_item_bytes_counts_names_and_utf8_values_like_dynamodb():
    # GIVEN a frame of CJK text: 3 bytes of UTF-8 per character (6 as a JSON \u escape)
    message = Message("CONN#a", seq_sk(7), "\u8a9e" * 1000, 1_700_000_000_000, "w1", 3, seq=7)
    names = sum(len(n) for n in message.to_wire(None))
    strings = len("CONN#a") + len(seq_sk(7)) + 3000 + len("w1")
    numbers = (13 + 1) // 2 + 1 + (1 + 1) // 2 + 1 + (1 + 1) // 2 + 1  # received_at, epoch, seq
    assert message.item_bytes(None) == names + strings + numbers


def test_a_marker_keeps_the_key_and_seq_and_drops_the_data():
    message = Message("CONN#a", seq_sk(7), b"\xff" * 10, 1, "w1", 3, seq=7)
    marker = message.as_marker(500_000)
    wire = marker.to_wire(None)
    assert "message_data" not in wire and marker.is_marker and not message.is_marker
    assert (wire["sk"], wire["seq"], wire["oversize_bytes"]) == (
        {"S": seq_sk(7)}, {"N": "7"}, {"N": "500000"}
    )
    assert wire["data_sha256"]["S"] == hashlib.sha256(b"\xff" * 10).hexdigest()


def test_module_examples_hold():
    import doctest

    from wsfleet import messages

    assert doctest.testmod(messages).failed == 0


# ---------------------------------------------------------------- the request body
MIXED = [
    Message("CONN#a", seq_sk(1), 'q "quoted" \\ \n \x01 \u00e9\u8a9e\U0001f600', 1_700_000_000_123,
            "w\u00e9", 4, seq=1),
    Message("CONN#a", local_sk(4, 5, 1), b"\xff\x00binary", 1_700_000_000_124, "w1", 4),
    Message("CONN#a", seq_sk(2), "x" * 10, 1, "w1", 4, seq=2).as_marker(500_000),
    Message("CONN#a", local_sk(4, 6, 2), "", 1, "w1", 4),
]  # fmt: skip


@pytest.mark.parametrize("retention_days", [0, 30])
def test_the_prebuilt_body_is_what_botocore_would_send(client, retention_days):
    # GIVEN frames of every kind: escapes, non-ASCII, binary, a marker, empty data
    store = store_for(client, retention_days=retention_days)
    items = [(m, store.expires_at(m.received_at_ms)) for m in MIXED]
    request = [{"PutRequest": {"Item": m.to_wire(ttl)}} for m, ttl in items]
    operation = client.meta.service_model.operation_model("BatchWriteItem")
    # WHEN botocore's own serializer (validation included) builds the request
    botocore_request = client._serializer.inner.serialize_to_request(
        {"RequestItems": {TABLE: request}}, operation
    )
    # THEN the body put_batch sends instead is the same bytes
    assert batch_write_body(TABLE, items) == botocore_request["body"]


def test_the_prebuilt_body_goes_only_with_the_request_it_was_built_for(client):
    store_for(client)
    serializer = client._serializer
    operation = client.meta.service_model.operation_model("BatchWriteItem")
    request = [{"PutRequest": {"Item": MIXED[0].to_wire(None)}}]
    serializer.prepare(
        "BatchWriteItem",
        lambda p: p["RequestItems"][TABLE] is request,
        {"RequestItems": {TABLE: request}},
        b"{}",
    )
    try:
        same = serializer.serialize_to_request({"RequestItems": {TABLE: request}}, operation)
        copy = [dict(r) for r in request]
        other = serializer.serialize_to_request({"RequestItems": {TABLE: copy}}, operation)
    finally:
        serializer.clear()
    assert same["body"] == b"{}"
    assert json.loads(other["body"])["RequestItems"][TABLE] == copy
    assert store_for(client)._prebuilt is serializer  # wrapped once per client


def test_writes_with_the_prebuilt_body_are_stubbed_like_any_other(client):
    # The Stubber checks the parameters the client was called with: the real items
    with Stubber(client) as stub:
        stub.add_response(
            "batch_write_item", {"UnprocessedItems": {}},
            {"RequestItems": {TABLE: [{"PutRequest": {"Item": m.to_wire(None)}} for m in MIXED]}},
        )  # fmt: skip
        result = store_for(client).put_batch(MIXED)
    assert (result.written, result.requests) == (len(MIXED), 1)


@pytest.mark.parametrize("message", MIXED, ids=["text", "binary", "marker", "empty"])
@pytest.mark.parametrize("expires_at", [None, 1_702_592_000])
def test_item_bytes_is_dynamodbs_size_of_the_item_sent(message, expires_at):
    size = 0
    for name, value in message.to_wire(expires_at).items():
        ((kind, raw),) = value.items()
        size += len(name) + (
            len(raw) if kind == "B"
            else (len(raw) + 1) // 2 + 1 if kind == "N"
            else len(raw.encode("utf-8"))
        )  # fmt: skip
    assert message.item_bytes(expires_at) == size
