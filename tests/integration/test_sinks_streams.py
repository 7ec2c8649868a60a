"""The kinesis and firehose sinks against the embedded moto server, through real boto3 clients.

The moto server enforces PutRecords' limits itself (500 records, 5 MiB per request, 1 MiB per
record): a request over them is refused, so these tests also check that the sink cuts its
requests right. Frames are read back the way consumers read them: Kinesis with GetRecords,
deaggregated by the reference KPL library; Firehose from the S3 objects it delivered.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid

import pytest
from aws_kinesis_agg.deaggregator import deaggregate_records

from wsfleet.aws import client_config, firehose_client, kinesis_client
from wsfleet.messages import Message, seq_sk
from wsfleet.sinks.kinesis import KinesisSink
from wsfleet_worker.flusher import MessageFlusher, QueuedFrame
from wsfleet_worker.observability import WorkerMetrics
from wsfleet_worker.offload import Offloader

pytestmark = pytest.mark.integration

WAIT = 30.0


def message(conn: str, seq: int, data: str = "x") -> Message:
    return Message(f"CONN#{conn}", seq_sk(seq), data, 1_700_000_000_000 + seq, "w1", 2, seq)


@pytest.fixture
def stream(aws) -> str:
    client = kinesis_client()
    name = f"frames-{uuid.uuid4().hex[:8]}"
    client.create_stream(StreamName=name, ShardCount=2)
    client.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 0.2})
    return name


def read_stream(name: str) -> list[dict]:
    """Every user record of the stream, shard by shard, in shard order, deaggregated."""
    client = kinesis_client()
    users: list[dict] = []
    for shard in client.list_shards(StreamName=name)["Shards"]:
        iterator = client.get_shard_iterator(
            StreamName=name, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while iterator:
            page = client.get_records(ShardIterator=iterator, Limit=1000)
            events = [{"kinesis": {
                "kinesisSchemaVersion": "1.0", "partitionKey": r["PartitionKey"],
                "sequenceNumber": r["SequenceNumber"], "data": base64.b64encode(r["Data"]),
                "approximateArrivalTimestamp": 0,
            }} for r in page["Records"]]  # fmt: skip
            for user in deaggregate_records(events):
                record = json.loads(base64.b64decode(user["kinesis"]["data"]))
                assert user["kinesis"]["partitionKey"] == record["connection_id"]
                users.append(record)
            iterator = page.get("NextShardIterator") if page["Records"] else None
    return users


@pytest.mark.parametrize("aggregate", [True, False], ids=["aggregated", "plain"])
def test_every_frame_lands_once_in_order_per_connection(stream, aggregate):
    # GIVEN 1,200 frames of 4 connections (more than 500 records in the plain mode)
    sink = KinesisSink(kinesis_client(), stream, aggregate=aggregate)
    frames = [message(f"c{c}", s, f"payload {c}/{s}") for s in range(1, 301) for c in range(4)]
    # WHEN they are written as one batch
    result = sink.put_batch(frames)
    # THEN every frame is acknowledged, and each connection's frames are in its shard, in order
    assert (result.written, result.unwritten, result.rejected) == (1200, [], [])
    users = read_stream(stream)
    for c in range(4):
        mine = [u for u in users if u["connection_id"] == f"c{c}"]
        assert [u["seq"] for u in mine] == list(range(1, 301))
        assert all(u["lease_epoch"] == 2 and u["received_at_ms"] > 0 for u in mine)
        assert mine[0]["data"] == f"payload {c}/1"
    if aggregate:
        assert result.requests == 1  # one aggregated record per connection: one request
    else:
        assert result.requests == 3  # 500 + 500 + 200 records


def test_requests_stay_within_five_mib_and_records_within_one(stream):
    # GIVEN 12 frames of ~900 kB (over 5 MiB in all; the server refuses larger requests)
    sink = KinesisSink(kinesis_client(), stream)
    frames = [message(f"c{c % 6}", c + 1, "y" * 900_000) for c in range(12)]
    result = sink.put_batch(frames)
    # THEN all of them landed, over several requests
    assert result.written == 12 and result.requests >= 3
    assert sorted(u["seq"] for u in read_stream(stream)) == list(range(1, 13))


def test_the_flusher_writes_an_ordered_sink_one_batch_at_a_time_and_acknowledges(stream):
    class Owner:
        def __init__(self) -> None:
            self.written: list[int] = []
            self.done = asyncio.Event()

        def may_write(self, now_ms: int) -> bool:
            return True

        def on_written(self, m: Message) -> None:
            self.written.append(m.seq or 0)
            if len(self.written) == 200:
                self.done.set()

        def on_rejected(self, m: Message) -> None:
            raise AssertionError(m)

    async def main() -> list[Owner]:
        offloader = Offloader(io_threads=1, write_threads=4)
        sink = KinesisSink(kinesis_client(), stream)
        flusher = MessageFlusher(sink, offloader, WorkerMetrics("t", emit=lambda d: None),
                                 flush_ms=5, max_in_flight=4)  # fmt: skip
        task = asyncio.create_task(flusher.run())
        owners = [Owner() for _ in range(3)]
        try:
            for seq in range(1, 201):
                for i, owner in enumerate(owners):
                    await flusher.put(QueuedFrame(message(f"o{i}", seq), owner))
            await asyncio.wait_for(asyncio.gather(*(o.done.wait() for o in owners)), WAIT)
        finally:
            task.cancel()
            await flusher.aclose()
            offloader.shutdown()
        return owners

    owners = asyncio.run(main())
    assert all(sorted(o.written) == list(range(1, 201)) for o in owners)
    users = read_stream(stream)
    for i in range(3):
        assert [u["seq"] for u in users if u["connection_id"] == f"o{i}"] == list(range(1, 201))


def test_a_frame_too_large_for_a_record_is_stored_as_its_marker(stream):
    async def main() -> None:
        offloader = Offloader(io_threads=1, write_threads=1)
        flusher = MessageFlusher(KinesisSink(kinesis_client(), stream), offloader,
                                 WorkerMetrics("t", emit=lambda d: None), flush_ms=5)  # fmt: skip
        task = asyncio.create_task(flusher.run())

        class Owner:
            done = asyncio.Event()

            def may_write(self, now_ms: int) -> bool:
                return True

            def on_written(self, m: Message) -> None:
                self.done.set()

            def on_rejected(self, m: Message) -> None:
                raise AssertionError(m)

        owner = Owner()
        try:
            await flusher.put(QueuedFrame(message("big", 1, "\u8a9e" * 400_000), owner))
            await asyncio.wait_for(owner.done.wait(), WAIT)
        finally:
            task.cancel()
            await flusher.aclose()
            offloader.shutdown()

    asyncio.run(main())
    (stored,) = read_stream(stream)
    assert stored["seq"] == 1 and "data" not in stored and stored["oversize_bytes"] > 1_200_000


def test_the_guard_keeps_a_fenced_request_from_leaving(stream):
    # GIVEN a client whose generic before-send handler (like the adaptive rate limiter) holds the
    # request while the lease lapses
    client = kinesis_client()
    sink = KinesisSink(client, stream, attempts=1, sleep=lambda _s: None)
    lapsed = []
    client.meta.events.register("before-send", lambda **kw: lapsed.append(True))
    result = sink.put_batch([message("late", 1)], guard=lambda m: not lapsed)
    # THEN it was not sent: nothing in the stream, and the frame is reported fenced
    assert [m.seq for m in result.fenced] == [1] and result.written == 0
    assert read_stream(stream) == []


def test_kinesis_client_uses_standard_retries():
    assert client_config().retries["mode"] == "standard"
    assert firehose_client().meta.config.retries["mode"] == "standard"
    assert kinesis_client().meta.config.retries["mode"] == "standard"


@pytest.fixture
def delivery_stream(aws) -> tuple[str, str]:
    import boto3

    bucket = f"frames-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", config=client_config()).create_bucket(Bucket=bucket)
    name = f"frames-{uuid.uuid4().hex[:8]}"
    firehose_client().create_delivery_stream(
        DeliveryStreamName=name,
        DeliveryStreamType="DirectPut",
        ExtendedS3DestinationConfiguration={
            "RoleARN": "arn:aws:iam::123456789012:role/firehose",
            "BucketARN": f"arn:aws:s3:::{bucket}", "Prefix": "frames/",
        },
    )  # fmt: skip
    return name, bucket


def read_bucket(bucket: str) -> list[dict]:
    import boto3

    s3 = boto3.client("s3", config=client_config())
    lines: list[dict] = []
    for item in s3.list_objects_v2(Bucket=bucket).get("Contents", []):
        body = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
        assert body.endswith(b"\n")
        lines.extend(json.loads(line) for line in body.splitlines())
    return lines


def test_firehose_delivers_every_frame_once_as_json_lines(delivery_stream):
    from wsfleet.sinks.firehose import FirehoseSink

    name, bucket = delivery_stream
    # GIVEN 3,000 frames of 3 connections, some 300 kB (several 1,000 KiB records, several
    # requests of at most 4 MiB)
    sink = FirehoseSink(firehose_client(), name)
    frames = [
        message(f"f{s % 3}", s, ("w" * 300_000) if s % 200 == 0 else f"frame {s}")
        for s in range(1, 3001)
    ]
    result = sink.put_batch(frames)
    # THEN each landed once, with its fields, as JSON Lines in the bucket
    assert (result.written, result.unwritten, result.rejected) == (3000, [], [])
    lines = read_bucket(bucket)
    assert sorted(line["seq"] for line in lines) == list(range(1, 3001))
    first = next(line for line in lines if line["seq"] == 1)
    assert first == {
        "connection_id": "f1", "key": seq_sk(1), "seq": 1, "lease_epoch": 2,
        "received_at_ms": 1_700_000_000_001, "worker_id": "w1", "data": "frame 1",
    }  # fmt: skip
    assert result.requests >= 2


def test_a_throttled_shard_is_backpressure_then_every_frame_lands_in_order(stream):
    # GIVEN a stream whose shard refuses every record of the first 8 PutRecords
    # (ProvisionedThroughputExceededException per record: the request itself succeeds), and a
    # flusher whose byte budget holds only a few frames
    import botocore.awsrequest

    client = kinesis_client()
    throttled = {"left": 8}

    def throttle(params, **_kwargs):
        if throttled["left"] <= 0:
            return None  # the real request goes to the server
        throttled["left"] -= 1
        records = params["Records"]
        body = {"FailedRecordCount": len(records), "Records": [
            {"ErrorCode": "ProvisionedThroughputExceededException", "ErrorMessage": "slow"}
            for _ in records
        ]}  # fmt: skip
        return botocore.awsrequest.AWSResponse("", 200, {}, None), body

    client.meta.events.register("before-call.kinesis.PutRecords", throttle)
    sink = KinesisSink(client, stream, attempts=2, sleep=lambda _s: None)

    class Owner:
        def __init__(self) -> None:
            self.written: list[int] = []
            self.done = asyncio.Event()

        def may_write(self, now_ms: int) -> bool:
            return True

        def on_written(self, m: Message) -> None:
            self.written.append(m.seq or 0)
            if len(self.written) == 60:
                self.done.set()

        def on_rejected(self, m: Message) -> None:
            raise AssertionError(m)

    async def main() -> tuple[Owner, int]:
        offloader = Offloader(io_threads=1, write_threads=1)
        flusher = MessageFlusher(sink, offloader, WorkerMetrics("t", emit=lambda d: None),
                                 flush_ms=5, capacity_bytes=2_000)  # fmt: skip
        task = asyncio.create_task(flusher.run())
        owner = Owner()
        blocked = 0
        try:
            for seq in range(1, 61):
                put = asyncio.ensure_future(flusher.put(QueuedFrame(message("t", seq), owner)))
                await asyncio.sleep(0)
                if not put.done() and throttled["left"] > 0:
                    blocked += 1  # the session would have stopped reading its socket
                await asyncio.wait_for(put, WAIT)
            await asyncio.wait_for(owner.done.wait(), WAIT)
        finally:
            task.cancel()
            await flusher.aclose()
            offloader.shutdown()
        return owner, blocked

    owner, blocked = asyncio.run(main())
    # THEN producers waited while the shard refused, nothing was acknowledged before it landed,
    # and the stream holds every frame once, in order
    assert throttled["left"] == 0 and blocked > 0
    assert owner.written == list(range(1, 61))
    assert [u["seq"] for u in read_stream(stream)] == list(range(1, 61))


def test_every_sink_reads_a_connections_frames_back_in_one_shape(aws, stream, delivery_stream):
    # GIVEN the same frames (one binary, one marker) written to each sink
    from wsfleet.aws import dynamodb_client
    from wsfleet.messages import MessageStore
    from wsfleet.sinks.firehose import FirehoseSink

    frames = [
        message("r", 1, "one"),
        Message("CONN#r", seq_sk(2), b"\xff\x01", 5, "w1", 2, 2),
        message("r", 3, "z" * 10).as_marker(999_999),
        message("other", 1),
    ]
    sinks = [
        MessageStore(dynamodb_client(), aws.messages_table),
        KinesisSink(kinesis_client(), stream),
        FirehoseSink(firehose_client(), delivery_stream[0]),
    ]
    read = []
    for sink in sinks:
        assert sink.put_batch(frames).written == 4
        read.append(sink.read_frames("CONN#r"))
    # THEN each gives back that connection's frames, the same records
    assert read[0] == read[1] == read[2]
    assert [f["seq"] for f in read[0]] == [1, 2, 3]
    assert read[0][1]["data_base64"] == "/wE=" and read[0][2]["oversize_bytes"] == 999_999


def test_the_sinks_take_their_stream_by_arn_as_the_template_passes_it(stream, delivery_stream):
    from wsfleet.sinks.firehose import FirehoseSink

    arn = kinesis_client().describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"][
        "StreamARN"
    ]
    by_arn = KinesisSink(kinesis_client(), arn)
    assert by_arn.put_batch([message("arn", 1)]).written == 1
    assert [f["seq"] for f in by_arn.read_frames("CONN#arn")] == [1]
    name, _bucket = delivery_stream
    description = firehose_client().describe_delivery_stream(DeliveryStreamName=name)
    delivery = FirehoseSink(
        firehose_client(), description["DeliveryStreamDescription"]["DeliveryStreamARN"]
    )
    assert delivery.put_batch([message("arn", 1)]).written == 1
    assert [f["seq"] for f in delivery.read_frames("CONN#arn")] == [1]
