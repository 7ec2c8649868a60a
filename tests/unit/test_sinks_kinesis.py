"""The kinesis sink without a server: the KPL format (read back with the reference
deaggregator, aws-kinesis-agg), packing, request cutting, and the put loop's retries.

The put loop talks to a real botocore Kinesis client whose responses come from botocore's
Stubber (which also validates every request against the service model); what the moto server
does with real requests is in tests/integration/test_sinks_streams.py.
"""

from __future__ import annotations

import base64
import json

import boto3
import pytest
from aws_kinesis_agg.deaggregator import deaggregate_records
from botocore.stub import ANY, Stubber
from hypothesis import given, settings, strategies as st

from wsfleet.aws import client_config
from wsfleet.messages import Message, local_sk, seq_sk
from wsfleet.sinks.kinesis import (
    MAX_FRAME_BYTES,
    MAX_RECORD_BYTES,
    KinesisSink,
    aggregate,
    aggregated_size,
    deaggregate,
)
from wsfleet.sinks.records import OutRecord, frame_json, take_request


def lambda_event_records(data: bytes, partition_key: str) -> list[dict]:
    """A Kinesis record as a Lambda event carries it (what consumers deaggregate)."""
    return [{
        "eventSource": "aws:kinesis",
        "kinesis": {
            "kinesisSchemaVersion": "1.0", "partitionKey": partition_key,
            "sequenceNumber": "49590338271490256608559692538361571095921575989136588898",
            "data": base64.b64encode(data).decode(), "approximateArrivalTimestamp": 1.0,
        },
    }]  # fmt: skip


def deaggregated(data: bytes, partition_key: str) -> list[tuple[str, bytes]]:
    users = deaggregate_records(lambda_event_records(data, partition_key))
    return [(u["kinesis"]["partitionKey"], base64.b64decode(u["kinesis"]["data"])) for u in users]


def message(conn: str, seq: int, data: str = "x", *, epoch: int = 1) -> Message:
    return Message(f"CONN#{conn}", seq_sk(seq), data, 1_700_000_000_000 + seq, "w1", epoch, seq)


def kinesis():
    return boto3.client("kinesis", region_name="us-east-1", config=client_config())


# ------------------------------------------------------------------ the KPL format
@settings(max_examples=60, deadline=None)
@given(
    key=st.text(alphabet="abcXYZ019._:-", min_size=1, max_size=128),
    records=st.lists(st.binary(max_size=20_000), min_size=1, max_size=12),
)
def test_the_reference_deaggregator_reads_back_every_user_record_in_order(key, records):
    # GIVEN user records of many sizes (1-, 2- and 3-byte length varints) under one key
    data = aggregate(key, records)
    # THEN the reference library finds every one, in order, under that key
    assert data[:4] == b"\xf3\x89\x9a\xc2"
    assert deaggregated(data, key) == [(key, r) for r in records]
    # AND the size the packer plans with is the size produced
    assert aggregated_size(key, [len(r) for r in records]) == len(data)


@settings(max_examples=40, deadline=None)
@given(
    records=st.lists(
        st.tuples(st.sampled_from(["a", "b", "conn:3"]), st.binary(max_size=3_000)),
        min_size=1,
        max_size=10,
    )
)
def test_our_deaggregator_reads_the_reference_aggregators_records(records):
    # GIVEN a record aggregated by the reference library (several keys, explicit hash keys)
    from aws_kinesis_agg.aggregator import RecordAggregator

    aggregator = RecordAggregator()
    for key, data in records:
        aggregator.add_user_record(key, data, "123" if key == "b" else None)
    partition_key, _hash_key, data = aggregator.clear_and_get().get_contents()
    # THEN deaggregate gives back every user record with its own key
    assert deaggregate(data, partition_key) == records


def test_a_damaged_aggregate_is_passed_through_as_one_record():
    data = bytearray(aggregate("a", [b"x", b"y"]))
    data[-1] ^= 1  # the digest no longer matches
    assert deaggregate(bytes(data), "a") == [("a", bytes(data))]
    assert deaggregate(b"plain", "a") == [("a", b"plain")]


def test_a_record_that_is_not_aggregated_is_what_the_deaggregator_passes_through():
    data = frame_json(message("a", 1))
    assert deaggregated(data, "a") == [("a", data)]


def test_a_frame_record_carries_connection_seq_epoch_and_received_time():
    plain = json.loads(frame_json(message("a", 42, '{"p":"\u00e9"}', epoch=7)))
    assert plain == {
        "connection_id": "a", "key": seq_sk(42), "seq": 42, "lease_epoch": 7,
        "received_at_ms": 1_700_000_000_042, "worker_id": "w1", "data": '{"p":"\u00e9"}',
    }  # fmt: skip
    local = Message("CONN#b", local_sk(3, 5, 1), b"\xff\x00", 5, "w1", 3)
    unnumbered = json.loads(frame_json(local))
    assert "seq" not in unnumbered and unnumbered["key"] == local_sk(3, 5, 1)
    assert base64.b64decode(unnumbered["data_base64"]) == b"\xff\x00"
    marker = json.loads(frame_json(message("c", 9, "y" * 2_000_000).as_marker(2_000_100)))
    assert "data" not in marker and marker["oversize_bytes"] == 2_000_100
    assert len(marker["data_sha256"]) == 64


# ------------------------------------------------------------------ packing and requests
def test_aggregated_records_hold_one_connection_each_in_order_within_the_size_limit():
    # GIVEN 3 connections' frames interleaved, some large enough to need several records
    sink = KinesisSink(None, "s", max_record_bytes=100_000)
    frames = [message(c, s, "z" * 30_000) for s in range(1, 9) for c in ("a", "b", "c")]
    records = sink._pack(frames, frame_json)
    # THEN every record is one connection's, under the limit, and reading the records of a
    # connection in order gives its frames in order
    for record in records:
        assert {m.pk for m in record.frames} == {f"CONN#{record.partition_key}"}
        assert len(record.data) + len(record.partition_key) <= 100_000
        users = deaggregated(record.data, record.partition_key)
        assert [json.loads(d)["seq"] for _, d in users] == [m.seq for m in record.frames]
    for conn in "abc":
        mine = [m.seq for r in records if r.partition_key == conn for m in r.frames]
        assert mine == list(range(1, 9))
    assert len(records) == 3 * 3  # 8 frames of ~30 kB: 3 per 100 kB record


def test_plain_mode_is_one_frame_per_record_keyed_by_connection():
    sink = KinesisSink(None, "s", aggregate=False)
    records = sink._pack([message("a", 1), message("b", 1)], frame_json)
    assert [(r.partition_key, json.loads(r.data)["seq"]) for r in records] == [("a", 1), ("b", 1)]
    assert sink.limits.batch_frames == 500


def test_a_request_takes_at_most_500_records_and_its_byte_cap():
    records = [OutRecord([], b"x" * 10, f"k{i}") for i in range(700)]
    assert len(take_request(records, max_records=500, max_bytes=10**9, one_per_key=False)) == 500
    big = [OutRecord([], b"x" * 1_000_000, f"k{i}") for i in range(8)]
    taken = take_request(big, max_records=500, max_bytes=5 * 1024 * 1024, one_per_key=False)
    assert len(taken) == 5 and sum(r.request_bytes for r in taken) <= 5 * 1024 * 1024


def test_an_ordered_request_carries_one_record_per_connection_never_skipping_ahead():
    records = [OutRecord([], b"1", "a"), OutRecord([], b"2", "a"), OutRecord([], b"3", "b")]
    taken = take_request(records, max_records=500, max_bytes=10**9, one_per_key=True)
    assert [r.data for r in taken] == [b"1", b"3"]


def test_a_frame_over_the_record_limit_is_the_flushers_to_turn_into_a_marker():
    sink = KinesisSink(None, "s")
    assert sink.limits.frame_bytes == MAX_FRAME_BYTES < MAX_RECORD_BYTES
    assert sink.frame_bytes(message("a", 1, "q" * MAX_FRAME_BYTES)) > sink.limits.frame_bytes
    assert sink.limits.ordered


# ------------------------------------------------------------------ the put loop
def put_records_response(codes: list[str | None]) -> dict:
    records = []
    for code in codes:
        if code is None:
            records.append({"SequenceNumber": "1", "ShardId": "shardId-000000000000"})
        else:
            records.append({"ErrorCode": code, "ErrorMessage": "slow down"})
    failed = sum(c is not None for c in codes)
    return {"Records": records, **({"FailedRecordCount": failed} if failed else {})}


def sent_seqs(params: dict) -> list[list[int]]:
    out = []
    for record in params["Records"]:
        users = deaggregated(record["Data"], record["PartitionKey"])
        out.append([json.loads(d)["seq"] for _, d in users])
    return out


class Recorder:
    """Keeps the parameters of every PutRecords the Stubber answered."""

    def __init__(self, client) -> None:
        self.calls: list[dict] = []
        client.meta.events.register("before-parameter-build.kinesis.PutRecords", self._record)

    def _record(self, params, **_kwargs) -> None:
        self.calls.append(params)


def test_partial_failures_are_sent_again_first_and_written_once_each():
    # GIVEN two connections; in the first request Kinesis refuses connection a's record
    client = kinesis()
    recorder = Recorder(client)
    sink = KinesisSink(client, "frames", sleep=lambda _s: None)
    frames = [message("a", 1), message("b", 1), message("a", 2), message("b", 2)]
    with Stubber(client) as stub:
        expected = {"Records": ANY, "StreamName": "frames"}
        stub.add_response(
            "put_records",
            put_records_response(["ProvisionedThroughputExceededException", None]),
            expected,
        )
        stub.add_response("put_records", put_records_response([None]), expected)
        # WHEN the batch is written
        result = sink.put_batch(frames)
        stub.assert_no_pending_responses()
    # THEN a's frames went again, alone, and everything is written exactly as acknowledged
    assert [sent_seqs(c) for c in recorder.calls] == [[[1, 2], [1, 2]], [[1, 2]]]
    assert [r["PartitionKey"] for r in recorder.calls[1]["Records"]] == ["a"]
    assert (result.written, result.unwritten, result.requests) == (4, [], 2)


def test_throttling_past_the_bound_hands_frames_back_in_order_never_drops_them():
    # GIVEN a shard that throttles every attempt
    client = kinesis()
    sink = KinesisSink(client, "frames", aggregate=False, attempts=3, sleep=lambda _s: None)
    frames = [message("a", s) for s in (1, 2, 3)]
    with Stubber(client) as stub:
        for _ in range(3):
            stub.add_response(
                "put_records", put_records_response(["ProvisionedThroughputExceededException"] * 3)
            )
        result = sink.put_batch(frames)
    # THEN nothing is lost: every frame comes back unwritten, in order (the flusher re-queues)
    assert result.written == 0 and [m.seq for m in result.unwritten] == [1, 2, 3]


def test_a_throttled_request_as_a_whole_is_retried():
    client = kinesis()
    sink = KinesisSink(client, "frames", sleep=lambda _s: None)
    with Stubber(client) as stub:
        stub.add_client_error("put_records", "ProvisionedThroughputExceededException")
        stub.add_response("put_records", put_records_response([None]))
        result = sink.put_batch([message("a", 1)])
    assert (result.written, result.requests) == (1, 2)


def test_a_missing_stream_is_a_store_error():
    from wsfleet.exceptions import StoreError

    client = kinesis()
    sink = KinesisSink(client, "gone", sleep=lambda _s: None)
    with Stubber(client) as stub:
        stub.add_client_error("put_records", "ResourceNotFoundException")
        with pytest.raises(StoreError, match="PutRecords on gone"):
            sink.put_batch([message("a", 1)])


def test_the_guard_fences_frames_before_each_attempt():
    # GIVEN connection a's lease lapses after the first (partly failed) attempt
    client = kinesis()
    recorder = Recorder(client)
    sink = KinesisSink(client, "frames", sleep=lambda _s: None)
    lapsed: set[str] = set()
    with Stubber(client) as stub:
        stub.add_response(
            "put_records",
            put_records_response(
                ["ProvisionedThroughputExceededException", "ProvisionedThroughputExceededException"]
            ),
        )
        stub.add_response("put_records", put_records_response([None]))
        calls = 0

        def guard(m: Message) -> bool:
            nonlocal calls
            calls += 1
            if recorder.calls:
                lapsed.add("CONN#a")
            return m.pk not in lapsed

        result = sink.put_batch([message("a", 1), message("b", 1)], guard=guard)
    # THEN the retry carries b only, and a's frame is reported fenced, not written
    assert [r["PartitionKey"] for r in recorder.calls[1]["Records"]] == ["b"]
    assert [m.pk for m in result.fenced] == ["CONN#a"] and result.written == 1


def test_the_readme_consumer_deaggregates_and_drops_replayed_frames():
    # GIVEN the README's consumer Lambda and a stream holding a failover's replay: a's frames
    # 1-3 from the old owner, then 2-4 again from the new one (epoch 2), b's 1 in between
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("A consumer Lambda on the stream:\n\n```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(block, namespace)
    sink = KinesisSink(None, "s")
    old = [message("a", s) for s in (1, 2, 3)] + [message("b", 1)]
    new = [message("a", s, epoch=2) for s in (2, 3, 4)]
    records = []
    for batch in (old, new):
        for r in sink._pack(batch, frame_json):
            records += lambda_event_records(r.data, r.partition_key)
    # WHEN it handles them THEN every frame is handed on once, the replayed ones dropped
    fresh = namespace["handler"]({"Records": records}, None)
    assert [(f["connection_id"], f["seq"], f["lease_epoch"]) for f in fresh] == [
        ("a", 1, 1),
        ("a", 2, 1),
        ("a", 3, 1),
        ("b", 1, 1),
        ("a", 4, 2),
    ]
