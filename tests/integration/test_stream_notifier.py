"""The STOP notifier handler against the embedded moto server.

Two kinds of input: the checked-in samples in ``events/`` (written at 2026-01-01, the notifier's
clock is pinned to that moment; whether an owner is alive is its worker item, registered here)
and the real ConnectionsTable stream, read from moto with GetRecords and turned into the event
Lambda would deliver.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from lambda_helpers import control_queue, drain_queue

from wsfleet.aws import dynamodb_client, sqs_client
from wsfleet.clock import now_ms
from wsfleet.control import StopCommand
from wsfleet.record import WorkerRecord
from wsfleet.store import DynamoDBLeaseStore, LeaseStore
from wsfleet_local.events import lambda_stream_record, stream_batch_event
from wsfleet_local.handler_loader import lambda_context, load_function

pytestmark = pytest.mark.integration

EVENTS = Path(__file__).resolve().parents[2] / "events"
#: When the sample events were "written".
EVENT_NOW_MS = 1_767_225_600_000
LEASE_MS = 4_000

notifier_app = load_function("stream_notifier")


@pytest.fixture
def prefix(aws, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A per-test control queue prefix; a cold notifier each test; queues removed after."""
    control_prefix = f"n{uuid.uuid4().hex[:8]}-ctl-"
    monkeypatch.setenv("LEASE_SECONDS", str(LEASE_MS / 1000))
    monkeypatch.setenv("HEARTBEAT_EVERY", "1")
    monkeypatch.setenv("CONTROL_QUEUE_PREFIX", control_prefix)
    notifier_app.reset_dependencies()
    yield control_prefix
    notifier_app.reset_dependencies()
    sqs = boto3.client("sqs")
    for url in sqs.list_queues(QueueNamePrefix=control_prefix).get("QueueUrls", []):
        sqs.delete_queue(QueueUrl=url)


@pytest.fixture
def store(aws) -> LeaseStore:
    return DynamoDBLeaseStore(dynamodb_client(), aws.connections_table, lease_ms=LEASE_MS)


@pytest.fixture
def pinned_clock(aws, prefix: str) -> Iterator[None]:
    """Run the handler as if it were the moment the sample events were written."""
    pinned = notifier_app.StopNotifier(
        DynamoDBLeaseStore(dynamodb_client(), aws.connections_table, lease_ms=LEASE_MS),
        sqs_client(),
        clock=lambda: EVENT_NOW_MS,
    )
    cached = notifier_app.notifier
    notifier_app.notifier = lambda: pinned
    yield
    notifier_app.notifier = cached


def sample(name: str) -> dict[str, Any]:
    return json.loads((EVENTS / name).read_text())


def invoke(event: dict[str, Any]) -> dict[str, Any]:
    return notifier_app.lambda_handler(event, lambda_context("stream_notifier"))


def register_worker(
    store: LeaseStore, prefix: str, worker_id: str, *, expires_at_ms: int, deleted: bool = False
) -> str:
    """A worker item with a real control queue (deleted again if ``deleted``); returns its URL."""
    sqs = boto3.client("sqs")
    url = control_queue(sqs, prefix, worker_id)
    if deleted:
        sqs.delete_queue(QueueUrl=url)
    store.register_worker(
        WorkerRecord(
            worker_id=worker_id,
            control_queue_url=url,
            started_at_ms=expires_at_ms - 600_000,
            heartbeat_at_ms=expires_at_ms - LEASE_MS,
            expires_at_ms=expires_at_ms,
        )
    )
    return url


def drain(queue_url: str) -> list[str]:
    """Every message body currently in the queue (received and deleted)."""
    return drain_queue(boto3.client("sqs"), queue_url)


def stream_event(aws: Any) -> dict[str, Any]:
    """Everything in the ConnectionsTable stream so far, as one Lambda event.

    Reads every shard from TRIM_HORIZON with GetRecords and converts each record to the shape
    the DynamoDB Streams event source mapping delivers (epoch seconds, eventSourceARN, ...).
    """
    streams = boto3.client("dynamodbstreams")
    description = streams.describe_stream(StreamArn=aws.stream_arn)["StreamDescription"]
    records: list[dict[str, Any]] = []
    for shard in description["Shards"]:
        iterator = streams.get_shard_iterator(
            StreamArn=aws.stream_arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        ).get("ShardIterator")
        while iterator:
            page = streams.get_records(ShardIterator=iterator)
            records.extend(page["Records"])
            iterator = page.get("NextShardIterator") if page["Records"] else None
    return stream_batch_event(
        lambda_stream_record(record, event_source_arn=aws.stream_arn, region=aws.region)
        for record in records
    )


# ---------------------------------------------------------------- the sample events
def test_sample_stop_modify_delivers_stop_to_the_owner(prefix, store, pinned_clock) -> None:
    # GIVEN worker-a (the owner in the sample) is alive, and another worker too
    owner_queue = register_worker(store, prefix, "worker-a", expires_at_ms=EVENT_NOW_MS + 60_000)
    other_queue = register_worker(store, prefix, "worker-b", expires_at_ms=EVENT_NOW_MS + 60_000)
    # WHEN the STARTED -> STOPPED record arrives
    response = invoke(sample("stream_stop_modify.json"))
    # THEN the owner, and only the owner, got the STOP with the lease epoch
    assert response == {"batchItemFailures": []}
    assert drain(owner_queue) == [StopCommand("CONN#ticker-btc-usd", 3).body()]
    assert drain(other_queue) == []


@pytest.mark.parametrize("name", ["stream_ignored_modify.json", "stream_insert.json"])
def test_sample_records_that_are_not_stop_transitions_send_nothing(
    name: str, prefix, store, pinned_clock
) -> None:
    queues = [
        register_worker(store, prefix, worker, expires_at_ms=EVENT_NOW_MS + 60_000)
        for worker in ("worker-a", "worker-b")
    ]
    assert invoke(sample(name)) == {"batchItemFailures": []}
    assert [drain(q) for q in queues] == [[], []]


def test_sample_partial_failure_reports_only_the_record_that_failed(
    prefix, store, pinned_clock, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN worker-a is alive with a working queue; worker-b's item is alive but its control
    # queue has been deleted (e.g. it is mid-restart), so a send to it fails
    good = register_worker(store, prefix, "worker-a", expires_at_ms=EVENT_NOW_MS + 60_000)
    register_worker(store, prefix, "worker-b", expires_at_ms=EVENT_NOW_MS + 60_000, deleted=True)
    event = sample("stream_batch_partial_failure.json")
    failing = event["Records"][1]
    assert failing["dynamodb"]["NewImage"]["lease_owner"] == {"S": "worker-b"}

    # WHEN the batch (STOP for worker-a, STOP for worker-b, a checkpoint) is handled
    response = invoke(event)

    # THEN exactly the worker-b record is reported for retry, the rest went through
    assert response == {
        "batchItemFailures": [{"itemIdentifier": failing["dynamodb"]["SequenceNumber"]}]
    }
    assert drain(good) == [StopCommand("CONN#ticker-btc-eur", 5).body()]
    # (the first invocation in a process also prints a separate ColdStart metric line)
    metrics = next(
        json.loads(line)
        for line in capsys.readouterr().out.splitlines()
        if '"_aws"' in line and '"StopsDelivered"' in line
    )
    assert (metrics["StopsDelivered"], metrics["StopsSkipped"], metrics["StopsFailed"]) == (
        [1.0],
        [0.0],
        [1.0],
    )


# ---------------------------------------------------------------- the real stream
def test_stop_from_the_api_reaches_the_owners_control_queue(aws, prefix, store) -> None:
    # GIVEN a connection held by a live worker, a second live worker, and a dead one
    now = now_ms()
    owner_queue = register_worker(store, prefix, "owner.host", expires_at_ms=now + 60_000)
    bystander_queue = register_worker(store, prefix, "bystander", expires_at_ms=now + 60_000)
    dead_queue = register_worker(store, prefix, "dead", expires_at_ms=now - 1)
    store.start("held", "wss://up.example/held")
    held = store.acquire("CONN#held", "owner.host")
    store.start("orphaned", "wss://up.example/orphaned")
    store.acquire("CONN#orphaned", "dead")
    store.start("unowned", "wss://up.example/unowned")

    # WHEN the API stops all three and the stream (INSERTs, acquires, stops) reaches the handler
    for pk in ("CONN#held", "CONN#orphaned", "CONN#unowned"):
        store.stop(pk, reason="api")
    event = stream_event(aws)
    # 3 worker items, 3 connection inserts, 2 acquires, 3 stops: the handler sees them all
    # (the FilterCriteria would drop most; the handler must not depend on it)
    assert len(event["Records"]) == 11
    response = invoke(event)

    # THEN only the owner of the held connection heard of it, with its epoch
    assert response == {"batchItemFailures": []}
    assert drain(owner_queue) == [StopCommand("CONN#held", held.lease_epoch).body()]
    assert drain(bystander_queue) == []
    assert drain(dead_queue) == []
