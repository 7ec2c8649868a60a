"""The stream sinks' frame record (wsfleet.sinks.records): frame_json writes exactly what
``json.dumps`` of the record's fields writes (compact, ``ensure_ascii=False``), and
frame_json_bytes, which the sinks size every queued frame with, is its exact length."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.parsers import create_parser
from hypothesis import given, settings, strategies as st

from wsfleet.aws import client_config
from wsfleet.messages import Message, local_sk, seq_sk
from wsfleet.sinks.base import PrebuiltBody
from wsfleet.sinks.firehose import FirehoseSink
from wsfleet.sinks.kinesis import KinesisSink
from wsfleet.sinks.records import (
    OutRecord,
    frame_json,
    frame_json_bytes,
    read_json_results,
    records_body,
)


def reference(message: Message) -> bytes:
    """The record as json.dumps writes it: the definition frame_json must keep."""
    pk = message.pk
    record: dict[str, Any] = {"connection_id": pk.removeprefix("CONN#"), "key": message.sk}
    if message.seq is not None:
        record["seq"] = message.seq
    record["lease_epoch"] = message.lease_epoch
    record["received_at_ms"] = message.received_at_ms
    record["worker_id"] = message.worker_id
    if message.oversize_bytes is not None:
        record["oversize_bytes"] = message.oversize_bytes
        record["data_sha256"] = message.data_sha256 or ""
    elif isinstance(message.message_data, bytes):
        record["data_base64"] = base64.b64encode(message.message_data).decode("ascii")
    else:
        record["data"] = message.message_data
    text = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
    return text.encode("utf-8", "surrogatepass")


# Text with everything JSON escapes or UTF-8 widens: quotes, backslashes, control characters,
# non-ASCII and astral characters, and lone surrogates (stored as the raw frame can hold them).
texts = st.text(
    alphabet=st.one_of(
        st.sampled_from('"\\/\n\r\t\b\f\x00\x1f\x7f é€😀\u2028'),
        st.characters(codec="utf-8"),
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
    ),
    max_size=40,
)
ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=20)
ints = st.integers(min_value=0, max_value=2**53 - 1)


@st.composite
def messages(draw: Any) -> Message:
    connection = draw(ids)
    epoch, received = draw(ints), draw(ints)
    seq = draw(st.one_of(st.none(), st.integers(min_value=1, max_value=2**53 - 1)))
    sk = seq_sk(seq) if seq is not None else local_sk(epoch % 10**10, received % 10**13, 1)
    pk = draw(st.sampled_from([f"CONN#{connection}", connection]))
    data = draw(st.one_of(texts, st.binary(max_size=40)))
    message = Message(pk, sk, data, received, draw(st.one_of(ids, texts)), epoch, seq)
    if draw(st.booleans()):
        raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
        message = message.as_marker(len(raw) + draw(ints))
        assert message.data_sha256 == hashlib.sha256(raw).hexdigest()
    return message


@settings(max_examples=400, deadline=None)
@given(messages())
def test_frame_json_is_the_json_of_the_record_and_its_size_is_exact(message):
    encoded = frame_json(message)
    assert encoded == reference(message)
    assert frame_json_bytes(message) == len(encoded)


def test_the_sinks_size_a_frame_as_the_bytes_they_send():
    frame = Message("CONN#a", seq_sk(3), 'caf\u00e9 "quoted"\n', 1_700_000_000_000, "w1", 2, 3)
    record = frame_json(frame)
    assert json.loads(record)["data"] == 'caf\u00e9 "quoted"\n'
    assert KinesisSink(object(), "s").frame_bytes(frame) == len(record)
    assert FirehoseSink(object(), "d").frame_bytes(frame) == len(record) + 1  # its newline


def test_the_guard_is_asked_once_per_lease_and_fences_that_lease_only():
    # GIVEN frames of three leases: connection a under epochs 1 and 2 (a failover on this
    # worker: the old session's frames still queued), b under epoch 1; a's epoch 1 lapsed
    import boto3
    from botocore.stub import ANY, Stubber

    from wsfleet.aws import client_config

    client = boto3.client("kinesis", region_name="us-east-1", config=client_config())
    sink = KinesisSink(client, "frames", sleep=lambda _s: None)
    frames = [
        Message("CONN#a", seq_sk(s), f"a{s}", 1_000 + s, "w1", 1 if s <= 3 else 2, s)
        for s in range(1, 6)
    ] + [Message("CONN#b", seq_sk(1), "b1", 1_000, "w1", 1, 1)]
    asked: list[tuple[str, int]] = []

    def guard(m: Message) -> bool:
        asked.append((m.pk, m.lease_epoch))
        return (m.pk, m.lease_epoch) != ("CONN#a", 1)

    with Stubber(client) as stub:
        ok = {"SequenceNumber": "1", "ShardId": "shardId-000000000000"}
        stub.add_response("put_records", {"Records": [ok, ok]}, {"Records": ANY,
                                                                 "StreamName": "frames"})
        result = sink.put_batch(frames, guard=guard)
    # THEN the guard heard each lease once; a's epoch-1 frames are fenced, never sent
    assert sorted(asked) == [("CONN#a", 1), ("CONN#a", 2), ("CONN#b", 1)]
    assert [m.seq for m in result.fenced] == [1, 2, 3]
    assert result.written == 3 and not result.unwritten


# ------------------------------------------------------------------ the prebuilt request body
def _botocore_body(client: Any, operation: str, parameters: dict[str, Any]) -> bytes:
    """The body botocore's own serializer (validation included) builds for ``parameters``."""
    serializer = client._serializer
    inner = serializer.inner if isinstance(serializer, PrebuiltBody) else serializer
    model = client.meta.service_model.operation_model(operation)
    body: bytes = inner.serialize_to_request(parameters, model)["body"]
    return body


RECORDS = [
    OutRecord([], b"\xf3\x89\x9a\xc2 binary \x00\xff", "conn-1"),
    OutRecord([], '{"data":"h\u00e9 \\"x\\""}'.encode(), "k\u00e9y/\u00fc"),
    OutRecord([], b"", "c"),
]


@pytest.mark.parametrize(
    "target",
    [{"StreamName": "frames"},
     {"StreamARN": "arn:aws:kinesis:us-east-1:123456789012:stream/fr\u00e4mes"}],
)  # fmt: skip
def test_the_prebuilt_put_records_body_is_what_botocore_would_send(target):
    client = boto3.client("kinesis", region_name="us-east-1", config=client_config())
    entries = [{"Data": r.data, "PartitionKey": r.partition_key} for r in RECORDS]
    expected = _botocore_body(client, "PutRecords", {"Records": entries, **target})
    assert records_body(RECORDS, target, records_first=True, keyed=True) == expected


def test_the_prebuilt_put_record_batch_body_is_what_botocore_would_send():
    client = boto3.client("firehose", region_name="us-east-1", config=client_config())
    target = {"DeliveryStreamName": "fr\u00e4mes"}
    entries = [{"Data": r.data} for r in RECORDS]
    expected = _botocore_body(client, "PutRecordBatch", {**target, "Records": entries})
    assert records_body(RECORDS, target, records_first=False, keyed=False) == expected


def test_a_put_records_request_leaves_with_the_prebuilt_body_and_botocores_headers():
    # GIVEN a sink whose client answers every request itself, recording what would be sent
    client = boto3.client("kinesis", region_name="us-east-1", config=client_config(),
                          aws_access_key_id="x", aws_secret_access_key="x")  # fmt: skip
    sink = KinesisSink(client, "frames", sleep=lambda _seconds: None)
    sent: list[Any] = []

    def answer(request: Any, **_kwargs: Any) -> AWSResponse:
        sent.append(request)
        count = len(json.loads(request.body)["Records"])
        taken = {"SequenceNumber": "1", "ShardId": "shardId-000000000000"}
        refused = {"ErrorCode": "ProvisionedThroughputExceededException", "ErrorMessage": "x"}
        records = [taken] * count if sent[1:] else [refused] + [taken] * (count - 1)
        body = json.dumps({"FailedRecordCount": 0, "Records": records}).encode()
        return AWSResponse(request.url, 200, {}, _Raw(body))

    client.meta.events.register_first("before-send.kinesis.PutRecords", answer)
    serialised: list[int] = []  # records botocore validated and serialised, per request
    inner = client._serializer.inner
    serialize = inner.serialize_to_request

    def counting(parameters: Any, model: Any) -> Any:
        serialised.append(len(parameters["Records"]))
        return serialize(parameters, model)

    inner.serialize_to_request = counting
    frames = [Message(f"CONN#c{i % 3}", seq_sk(i), f"d{i}", i, "w1", 1, seq=i) for i in range(1, 7)]
    # WHEN a batch is put
    result = sink.put_batch(frames)
    # THEN the first request carried every record, its body the prebuilt one (botocore
    # serialised a one-record skeleton only), signed as usual; the record refused in its
    # answer (read by the JSON hook) went again alone
    request, retry = sent
    assert serialised == [1, 1]
    records = sink._pack(frames, frame_json)
    assert retry.body == records_body(records[:1], {"StreamName": "frames"},
                                      records_first=True, keyed=True)  # fmt: skip
    assert request.body == records_body(records, {"StreamName": "frames"},
                                        records_first=True, keyed=True)  # fmt: skip
    assert request.headers["X-Amz-Target"] == b"Kinesis_20131202.PutRecords"
    assert b"Signature=" in request.headers["Authorization"]
    assert (result.written, result.requests) == (6, 2)


class _Raw:
    """A raw HTTP response body as botocore reads it."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_kwargs: Any) -> Any:
        yield self._body


PUT_RECORDS_ANSWER = {"FailedRecordCount": 1, "EncryptionType": "NONE", "Records": [
    {"SequenceNumber": "4959033827149025660855969253836157", "ShardId": "shardId-000000000001"},
    {"ErrorCode": "ProvisionedThroughputExceededException", "ErrorMessage": "Rate exceeded"},
]}  # fmt: skip
PUT_RECORD_BATCH_ANSWER = {"FailedPutCount": 1, "Encrypted": False, "RequestResponses": [
    {"RecordId": "49543463076548007577105092703039560359975228518395012"},
    {"ErrorCode": "ServiceUnavailableException", "ErrorMessage": "Slow down."},
]}  # fmt: skip


@pytest.mark.parametrize(
    ("service", "operation", "answer"),
    [("kinesis", "PutRecords", PUT_RECORDS_ANSWER),
     ("firehose", "PutRecordBatch", PUT_RECORD_BATCH_ANSWER)],
)  # fmt: skip
def test_a_write_answer_read_as_json_is_what_botocores_parser_makes_of_it(
    service, operation, answer
):
    client = boto3.client(service, region_name="us-east-1", config=client_config())
    model = client.meta.service_model.operation_model(operation)
    body = json.dumps(answer).encode()
    response = {"status_code": 200, "headers": {}, "body": body}
    expected = create_parser("json").parse(dict(response), model.output_shape)
    # the hook's values, merged into what botocore parses of the body it leaves
    customized: dict[str, Any] = {}
    read_json_results(response_dict=response, customized_response_dict=customized)
    parsed = create_parser("json").parse(response, model.output_shape)
    parsed.update(customized)
    assert parsed == expected
    assert response["body"] == b"{}"  # botocore's parser no longer walks the records


def test_an_error_answer_is_left_to_botocore():
    response = {"status_code": 400, "headers": {}, "body": b'{"__type": "ResourceNotFound"}'}
    customized: dict[str, Any] = {}
    read_json_results(response_dict=response, customized_response_dict=customized)
    assert customized == {} and response["body"] == b'{"__type": "ResourceNotFound"}'
