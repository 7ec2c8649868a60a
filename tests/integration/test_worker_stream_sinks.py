"""A real worker process with MESSAGE_SINK=kinesis / firehose, streaming from the simulator
into the moto server: frames reach the stream (and not the messages table), the checkpoint
advances only over frames the sink took, and a graceful stop's final checkpoint is covered.
"""

from __future__ import annotations

import uuid

import boto3
import fleet_helpers
import pytest
from fleet_helpers import wait_until
from test_sinks_streams import read_bucket, read_stream

from wsfleet.aws import client_config, firehose_client, kinesis_client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

sim, fleet, spawn = fleet_helpers.sim, fleet_helpers.fleet, fleet_helpers.spawn


def start_and_checkpoint(fleet, sim, worker, stream_id: str) -> int:
    """START ``stream_id`` and wait until its stored checkpoint reaches 20; return it."""
    fleet.start(stream_id, sim.url_for(stream_id))
    return wait_until(
        lambda: (last := fleet.record(stream_id).last_seq) >= 20 and last,
        timeout=60,
        message=worker.tail,
    )


@pytest.fixture
def kinesis_stream(aws) -> str:
    name = f"frames-{uuid.uuid4().hex[:8]}"
    client = kinesis_client()
    client.create_stream(StreamName=name, ShardCount=1)
    client.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 0.2})
    return name


def test_a_worker_on_the_kinesis_sink_streams_in_order_and_checkpoints(
    fleet, sim, spawn, kinesis_stream
):
    worker = spawn(MESSAGE_SINK="kinesis", MESSAGE_STREAM=kinesis_stream)
    checkpoint = start_and_checkpoint(fleet, sim, worker, "kin")
    # THEN every frame up to the checkpoint is in the stream, in order, with its lease epoch
    frames = [u for u in read_stream(kinesis_stream) if u["connection_id"] == "kin"]
    seqs = [f["seq"] for f in frames]
    assert seqs[:checkpoint] == list(range(1, checkpoint + 1)), seqs[: checkpoint + 5]
    assert seqs == sorted(set(seqs))
    assert {f["lease_epoch"] for f in frames} == {fleet.record("kin").lease_epoch}
    assert fleet.stored_seqs("kin") == []  # nothing went to the messages table
    # WHEN the worker drains THEN its final checkpoint is covered by the stream too
    worker.stop()
    final = fleet.record("kin").last_seq
    seqs = [u["seq"] for u in read_stream(kinesis_stream) if u["connection_id"] == "kin"]
    assert final >= checkpoint and set(range(1, final + 1)) <= set(seqs)


def test_a_worker_on_the_firehose_sink_delivers_json_lines(fleet, sim, spawn, aws):
    bucket = f"frames-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", config=client_config()).create_bucket(Bucket=bucket)
    name = f"frames-{uuid.uuid4().hex[:8]}"
    firehose_client().create_delivery_stream(
        DeliveryStreamName=name,
        ExtendedS3DestinationConfiguration={
            "RoleARN": "arn:aws:iam::123456789012:role/firehose",
            "BucketARN": f"arn:aws:s3:::{bucket}",
        },
    )
    worker = spawn(MESSAGE_SINK="firehose", MESSAGE_STREAM=name)
    checkpoint = start_and_checkpoint(fleet, sim, worker, "fh")
    seqs = {line["seq"] for line in read_bucket(bucket) if line["connection_id"] == "fh"}
    assert set(range(1, checkpoint + 1)) <= seqs
