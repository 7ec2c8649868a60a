"""A planted secret value appears nowhere but in the upstream's handshake (#13).

The secret lives in the moto server's Secrets Manager; a START through the router names it by
reference; a real worker streams the connection (with a reconnect) and then stops it through
the router. Then every place the fleet writes is searched for the value: every item of both
DynamoDB tables, every SQS message that could be seen on the fleet's queues, every line the
worker printed (JSON logs and EMF), everything the router printed or logged, and every router
API answer. The value must be found nowhere, and it must be found in the simulator's record
of the handshake header, so the search is known to look for the right thing.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import boto3
import fleet_helpers
import pytest
from fleet_helpers import wait_until
from lambda_helpers import fresh_function
from test_router import api_event, invoke

from wsfleet.record import DesiredState

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:No application metrics to publish:UserWarning"),
]

sim, spawn = fleet_helpers.sim, fleet_helpers.spawn

PREFIX = "arn:aws:secretsmanager:us-east-1:123456789012:secret:wsfleet/"


def clients(aws: Any) -> dict[str, Any]:
    session = boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name=aws.region
    )
    return {
        name: session.client(name, endpoint_url=aws.endpoint_url)
        for name in ("dynamodb", "sqs", "secretsmanager")
    }


def every_item(dynamodb: Any, table: str) -> str:
    pages = dynamodb.get_paginator("scan").paginate(TableName=table, ConsistentRead=True)
    return json.dumps([item for page in pages for item in page.get("Items", [])])


def visible_messages(sqs: Any) -> list[str]:
    """Every message on every queue of the endpoint, peeked (visibility 0: left in place)."""
    bodies: list[str] = []
    for url in sqs.list_queues().get("QueueUrls", []):
        reply = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0, WaitTimeSeconds=0,
            MessageAttributeNames=["All"], AttributeNames=["All"],
        )
        bodies += [json.dumps(m) for m in reply.get("Messages", [])]
    return bodies


@pytest.fixture
def router(aws, monkeypatch: pytest.MonkeyPatch):
    yield from fresh_function(
        "router",
        monkeypatch,
        ALLOWED_UPSTREAM_HOSTS="127.0.0.1",
        ALLOW_INSECURE_WS="true",
        UPSTREAM_SECRET_PREFIXES=PREFIX,
        POWERTOOLS_SERVICE_NAME="wsfleet-router",
    )


def test_a_planted_secret_is_found_only_in_the_upstream_handshake(
    aws, router, sim, spawn, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
):
    planted = f"planted-{uuid.uuid4().hex}"
    aws_clients = clients(aws)
    arn = aws_clients["secretsmanager"].create_secret(
        Name=f"wsfleet/leak-{uuid.uuid4().hex[:6]}", SecretString=json.dumps({"key": planted})
    )["ARN"]
    sim.set_shape("leak", "header_auth", header="Authorization", value=f"Bearer {planted}")
    answers: list[str] = []
    seen_messages: list[str] = []

    def api(method: str, path: str, body: Any = None, **kw: Any) -> Any:
        reply = invoke(router, api_event(method, path, body, **kw))
        answers.append(json.dumps(reply.body))
        return reply

    started = api("PUT", "/connections/leak", {
        "ws_url": sim.url_for("leak"),
        "upstream": {
            "headers": {"X-Client": "leak-test"},
            "credential": {"ref": arn, "header": "Authorization", "format": "Bearer {{secret}}",
                           "json_key": "key"},
        },
    })
    assert started.status in (200, 201), started
    seen_messages += visible_messages(aws_clients["sqs"])  # the START hint, before it is taken

    worker = spawn()
    wait_until(
        lambda: len(fleet_helpers.StoreDriver(aws.env()).stored_seqs("leak")) >= 20,
        timeout=60,
        message=lambda: worker.tail(30),
    )
    sim.inject_fault("leak", "drop")  # a reconnect: one more resolve, one more handshake
    wait_until(lambda: len(sim.sessions("leak")) >= 2, timeout=60, message=worker.tail)
    api("GET", "/connections/leak")
    api("GET", "/connections", query={"state": "STARTED"})
    api("DELETE", "/connections/leak")
    seen_messages += visible_messages(aws_clients["sqs"])  # the STOP on the control queue
    wait_until(
        lambda: fleet_helpers.StoreDriver(aws.env()).record("leak").desired_state
        is DesiredState.STOPPED
        and not fleet_helpers.StoreDriver(aws.env()).record("leak").lease_owner,
        timeout=60,
        message=worker.tail,
    )
    api("GET", "/connections/leak")
    worker.stop()
    router_output = capfd.readouterr()

    places = {
        "connections table": every_item(aws_clients["dynamodb"], aws.connections_table),
        "messages table": every_item(aws_clients["dynamodb"], aws.messages_table),
        "sqs messages": "\n".join(seen_messages),
        "worker stdout (logs and EMF)": worker.output(),
        "router stdout/stderr": router_output.out + router_output.err,
        "router log records": "\n".join(
            json.dumps(vars(r), default=str) for r in caplog.records
        ),
        "router API answers": "\n".join(answers),
    }
    assert places["connections table"].count(arn) >= 1  # the reference is stored...
    assert "X-Client" in places["router API answers"]  # ...and the answers were captured
    for place, text in places.items():
        assert planted not in text, f"the planted secret leaked into the {place}"

    # The control: the value did travel, in the handshake header, where it belongs.
    headers = [s.headers.get("Authorization") for s in sim.sessions("leak")]
    assert headers.count(f"Bearer {planted}") >= 2
