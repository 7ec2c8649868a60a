"""MessageStore against the embedded moto server: idempotent keys, pagination, TTL, retries."""

from __future__ import annotations

import pytest

from wsfleet.aws import dynamodb_client
from wsfleet.messages import Message, MessageStore, local_sk, seq_sk

pytestmark = pytest.mark.integration


def frame(seq: int, *, data: str | None = None, epoch: int = 1, worker: str = "w1") -> Message:
    return Message(
        pk="CONN#s1",
        sk=seq_sk(seq),
        message_data=data if data is not None else f"s1:{seq}",
        received_at_ms=1_700_000_000_000 + seq,
        worker_id=worker,
        lease_epoch=epoch,
        seq=seq,
    )


@pytest.fixture
def store(aws) -> MessageStore:
    return MessageStore(dynamodb_client(), aws.messages_table, retention_days=7)


def test_batch_is_stored_with_every_attribute(store):
    result = store.put_batch([frame(1), frame(2)])
    assert (result.written, result.unwritten, result.rejected, result.requests) == (2, [], [], 1)
    items = store.read_all("CONN#s1")
    assert items[0] == {
        "pk": "CONN#s1",
        "sk": "00000000000000000001",
        "seq": 1,
        "message_data": "s1:1",
        "received_at_ms": 1_700_000_000_001,
        "worker_id": "w1",
        "lease_epoch": 1,
        "expires_at": 1_700_000_000 + 7 * 86_400,
    }


def test_a_replayed_frame_overwrites_itself(store):
    store.put_batch([frame(5, epoch=1, worker="w1")])
    store.put_batch([frame(5, epoch=2, worker="w2")])  # the next owner replays seq 5
    (item,) = store.read_all("CONN#s1")
    assert (item["seq"], item["lease_epoch"], item["worker_id"]) == (5, 2, "w2")


def test_read_all_can_project_the_attributes_a_reader_needs(store):
    store.put_batch([frame(1), frame(2)])
    items = store.read_all("CONN#s1", attributes=("seq", "message_data", "lease_epoch"))
    assert items == [{"seq": n, "message_data": f"s1:{n}", "lease_epoch": 1} for n in (1, 2)]


def test_many_frames_are_chunked_and_read_back_in_order_over_pages(store):
    big = "x" * 3000  # ~3 KB each: 600 items exceed one 1 MB query page
    result = store.put_batch([frame(seq, data=f"{big}{seq}") for seq in range(600, 0, -1)])
    assert (result.written, result.requests) == (600, 24)
    items = store.read_all("CONN#s1")
    assert [item["seq"] for item in items] == list(range(1, 601))


def test_unnumbered_frames_sort_after_numbered_ones(store):
    local = Message("CONN#s1", local_sk(1, 1_700_000_000_000, 1), b"\x00\xff", 1, "w1", 1)
    store.put_batch([local, frame(10**15)])
    items = store.read_all("CONN#s1")
    assert [item.get("seq") for item in items] == [10**15, None]
    assert items[1]["message_data"] == b"\x00\xff"


def test_zero_retention_stores_no_ttl(aws):
    store = MessageStore(dynamodb_client(), aws.messages_table, retention_days=0)
    store.put_batch([frame(1)])
    assert "expires_at" not in store.read_all("CONN#s1")[0]


def test_an_oversized_frame_is_rejected_alone(store):
    huge = frame(2, data="y" * 410_000)  # over DynamoDB's 400 KB item limit
    result = store.put_batch([frame(1), huge, frame(3)])
    assert result.rejected == [huge]
    assert [item["seq"] for item in store.read_all("CONN#s1")] == [1, 3]


def test_a_guard_failing_at_the_last_moment_keeps_the_request_from_leaving(store):
    """The before-send hook re-checks the guard after signing: nothing is written."""
    messages = [frame(1), frame(2)]
    answers = iter([True, True])  # the per-item check passes; every later check fails

    result = store.put_batch(messages, guard=lambda m: next(answers, False))

    assert (result.written, result.requests) == (0, 0)
    assert sorted(m.seq for m in result.fenced) == [1, 2]
    assert store.read_all("CONN#s1") == []


def test_a_passing_guard_writes_normally(store):
    result = store.put_batch([frame(1)], guard=lambda m: True)
    assert (result.written, result.fenced) == (1, [])
