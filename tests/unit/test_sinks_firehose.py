"""The firehose sink without a server: JSON Lines packing and the put loop's retries
(responses from botocore's Stubber; the moto server: tests/integration/test_sinks_streams.py)."""

from __future__ import annotations

import json

import boto3
from botocore.stub import Stubber

from wsfleet.aws import client_config
from wsfleet.messages import Message, seq_sk
from wsfleet.sinks.firehose import MAX_RECORD_BYTES, FirehoseSink
from wsfleet.sinks.records import frame_json


def message(conn: str, seq: int, data: str = "x") -> Message:
    return Message(f"CONN#{conn}", seq_sk(seq), data, 1_700_000_000_000 + seq, "w1", 4, seq)


def firehose():
    return boto3.client("firehose", region_name="us-east-1", config=client_config())


def lines(data: bytes) -> list[dict]:
    assert data.endswith(b"\n")
    return [json.loads(line) for line in data.decode().splitlines()]


def test_lines_of_every_connection_are_packed_into_records_up_to_the_limit():
    # GIVEN 40 frames of ~100 kB, two connections interleaved
    sink = FirehoseSink(None, "d")
    frames = [message("ab"[i % 2], i + 1, "z" * 100_000) for i in range(40)]
    records = sink._pack(frames, frame_json)
    # THEN each record is whole JSON lines within 1,000 KiB, all frames in queue order
    assert all(len(r.data) <= MAX_RECORD_BYTES for r in records)
    assert [line["seq"] for r in records for line in lines(r.data)] == list(range(1, 41))
    assert len(records) == 4  # 10 lines of ~100 kB per 1,000 KiB record
    assert {line["connection_id"] for line in lines(records[0].data)} == {"a", "b"}
    assert lines(records[0].data)[0]["lease_epoch"] == 4


def test_a_lone_line_at_the_limit_fits_one_over_it_is_a_marker_for_the_flusher():
    sink = FirehoseSink(None, "d")
    assert sink.limits.frame_bytes == MAX_RECORD_BYTES and not sink.limits.ordered
    big = message("a", 1, "q" * MAX_RECORD_BYTES)
    assert sink.frame_bytes(big) > sink.limits.frame_bytes


def test_failed_records_are_sent_again_and_each_frame_is_acknowledged_once():
    client = firehose()
    sent: list[list[int]] = []
    client.meta.events.register(
        "before-parameter-build.firehose.PutRecordBatch",
        lambda params, **kw: sent.append(
            [line["seq"] for r in params["Records"] for line in lines(r["Data"])]
        ),
    )
    sink = FirehoseSink(client, "d", max_record_bytes=300, sleep=lambda _s: None)
    frames = [message("a", s) for s in range(1, 7)]  # ~130-byte lines: 2 per record
    with Stubber(client) as stub:
        stub.add_response("put_record_batch", {"FailedPutCount": 1, "RequestResponses": [
            {"RecordId": "1"}, {"ErrorCode": "ServiceUnavailableException", "ErrorMessage": "x"},
            {"RecordId": "3"},
        ]})  # fmt: skip
        stub.add_response("put_record_batch", {"FailedPutCount": 0, "RequestResponses": [
            {"RecordId": "4"}]})  # fmt: skip
        result = sink.put_batch(frames)
        stub.assert_no_pending_responses()
    assert sent == [[1, 2, 3, 4, 5, 6], [3, 4]]
    assert (result.written, result.unwritten, result.requests) == (6, [], 2)


def test_a_stream_refusing_every_attempt_hands_the_frames_back():
    client = firehose()
    sink = FirehoseSink(client, "d", attempts=2, sleep=lambda _s: None)
    with Stubber(client) as stub:
        for _ in range(2):
            stub.add_client_error("put_record_batch", "ServiceUnavailableException",
                                  http_status_code=503)  # fmt: skip
        result = sink.put_batch([message("a", 1), message("b", 1)])
    assert result.written == 0 and [m.pk for m in result.unwritten] == ["CONN#a", "CONN#b"]
