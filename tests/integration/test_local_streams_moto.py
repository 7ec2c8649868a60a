"""The local stream event source against the real moto stream of the connections table."""

from __future__ import annotations

import threading

import boto3
import pytest

from wsfleet.store import DynamoDBLeaseStore
from wsfleet_local.backend import find_template, load_template
from wsfleet_local.stack import read_stack
from wsfleet_local.streams import StreamPoller

pytestmark = pytest.mark.integration


def test_only_stop_transitions_reach_the_notifier_in_lambda_shape(aws):
    # GIVEN the template's stream source over the table's real stream
    source = read_stack(load_template(find_template())).function("stream_notifier").streams[0]
    delivered: list[dict] = []
    got = threading.Event()

    def invoke(event):
        delivered.extend(event["Records"])
        got.set()
        return {"batchItemFailures": []}

    poller = StreamPoller(
        client=boto3.client("dynamodbstreams"),
        stream_arn=aws.stream_arn,
        invoke=invoke,
        source=source,
        poll_interval_seconds=0.05,
    ).start()
    try:
        store = DynamoDBLeaseStore(boto3.client("dynamodb"), aws.connections_table, lease_ms=4_000)
        # WHEN a connection is started, acquired and then stopped
        store.start("c1", "ws://127.0.0.1:1/c1")
        store.acquire("CONN#c1", "w1")
        store.stop("CONN#c1")
        store.stop("CONN#c1")  # idempotent: no second transition
        # THEN exactly the STARTED -> STOPPED modify is delivered, as Lambda would shape it
        assert got.wait(10)
    finally:
        poller.stop()
    (record,) = delivered
    assert record["eventName"] == "MODIFY"
    assert record["eventSource"] == "aws:dynamodb"
    assert record["eventSourceARN"] == aws.stream_arn
    assert record["dynamodb"]["NewImage"]["desired_state"] == {"S": "STOPPED"}
    assert record["dynamodb"]["OldImage"]["desired_state"] == {"S": "STARTED"}
    assert record["dynamodb"]["NewImage"]["lease_owner"] == {"S": "w1"}
    assert isinstance(record["dynamodb"]["ApproximateCreationDateTime"], int)
    assert poller.stats.records_read >= 3 and poller.stats.records_matched == 1
