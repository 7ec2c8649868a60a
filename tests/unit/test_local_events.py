"""Local event builders produce the shapes AWS sends (compared with the samples in events/)."""

from __future__ import annotations

import base64
import datetime as dt
import json
from pathlib import Path

from wsfleet_local.backend import find_template
from wsfleet_local.events import (
    api_gateway_event,
    lambda_stream_record,
    scheduler_event,
    stream_batch_event,
)

EVENTS = Path(find_template()).parent / "events"


def sample(name: str) -> dict:
    return json.loads((EVENTS / f"{name}.json").read_text())


def build_put(body: bytes = b'{"ws_url": "ws://127.0.0.1:1/s"}', content_type="application/json"):
    return api_gateway_event(
        method="PUT",
        path="/connections/s1",
        resource="/connections/{id}",
        path_parameters={"id": "s1"},
        headers=[
            ("Host", "127.0.0.1:8080"),
            ("Content-Type", content_type),
            ("X-A", "1"),
            ("X-A", "2"),
        ],
        query="a=1&a=2&b=",
        body=body,
        stage="dev",
        request_id="req-1",
        source_ip="127.0.0.1",
        now=1_700_000_000.5,
    )


def test_api_event_has_every_field_of_the_sample():
    event = build_put()
    reference = sample("api_put_connection")
    assert set(reference) <= set(event)
    assert set(reference["requestContext"]) <= set(event["requestContext"])
    assert set(reference["requestContext"]["identity"]) <= set(event["requestContext"]["identity"])


def test_api_event_values():
    event = build_put()
    assert event["httpMethod"] == "PUT"
    assert event["resource"] == "/connections/{id}"
    assert event["pathParameters"] == {"id": "s1"}
    assert event["headers"]["X-A"] == "2" and event["multiValueHeaders"]["X-A"] == ["1", "2"]
    assert event["queryStringParameters"] == {"a": "2", "b": ""}
    assert event["multiValueQueryStringParameters"]["a"] == ["1", "2"]
    assert json.loads(event["body"]) == {"ws_url": "ws://127.0.0.1:1/s"}
    assert event["isBase64Encoded"] is False
    context = event["requestContext"]
    assert context["path"] == "/dev/connections/s1"
    assert context["stage"] == "dev" and context["requestId"] == "req-1"
    assert context["requestTimeEpoch"] == 1_700_000_000_500
    assert context["identity"]["sourceIp"] == "127.0.0.1"


def test_api_event_empty_and_binary_bodies():
    assert build_put(b"")["body"] is None
    event = build_put(b"\x00\xff", content_type="application/octet-stream")
    assert event["isBase64Encoded"] is True
    assert base64.b64decode(event["body"]) == b"\x00\xff"


def test_api_event_without_query_or_params_uses_null():
    event = api_gateway_event(
        method="GET",
        path="/connections",
        resource="/connections",
        path_parameters={},
        headers=[],
        query="",
        body=b"",
        stage="dev",
        request_id="r",
        source_ip="127.0.0.1",
        now=0,
    )
    assert event["queryStringParameters"] is None
    assert event["multiValueQueryStringParameters"] is None
    assert event["pathParameters"] is None


def test_scheduler_event_follows_the_sample():
    reference = sample("scheduler_reconcile")
    event = scheduler_event(
        schedule_name="x-reconcile", event_id="id-1", now=1_767_225_600, template=reference
    )
    assert set(event) == set(reference)
    assert event["id"] == "id-1"
    assert event["time"] == "2026-01-01T00:00:00Z"
    assert event["resources"] == [
        "arn:aws:scheduler:us-east-1:123456789012:schedule/default/x-reconcile"
    ]
    assert scheduler_event(schedule_name="x", event_id="i", now=0)["source"] == "aws.scheduler"


def test_stream_record_in_lambda_shape():
    # GIVEN a record as boto3's GetRecords returns it (datetime, bytes)
    raw = {
        "eventID": "e1",
        "eventName": "MODIFY",
        "eventVersion": "1.1",
        "eventSource": "aws:dynamodb",
        "awsRegion": "us-east-1",
        "dynamodb": {
            "ApproximateCreationDateTime": dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
            "Keys": {"pk": {"S": "CONN#a"}},
            "NewImage": {"pk": {"S": "CONN#a"}, "blob": {"B": b"\x01"}, "set": {"BS": [b"\x02"]}},
            "SequenceNumber": "100",
            "SizeBytes": 10,
            "StreamViewType": "NEW_AND_OLD_IMAGES",
        },
    }
    # WHEN converted THEN it is what Lambda delivers
    record = lambda_stream_record(raw, event_source_arn="arn:stream", region="us-east-1")
    reference = sample("stream_stop_modify")["Records"][0]
    assert set(record) == set(reference)
    assert record["eventSourceARN"] == "arn:stream"
    assert record["dynamodb"]["ApproximateCreationDateTime"] == 1_767_225_600
    assert record["dynamodb"]["NewImage"]["blob"] == {"B": "AQ=="}
    assert record["dynamodb"]["NewImage"]["set"] == {"BS": ["Ag=="]}
    json.dumps(stream_batch_event([record]))  # JSON-serialisable, like the real payload
