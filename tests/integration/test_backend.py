"""The embedded backend: atomic conditional writes, non-blocking long polls, template resources.

These tests run their own server (a module-scoped EmbeddedBackend) so they do not depend on
the shared fixtures, and each test provisions resources under its own prefix.
"""

from __future__ import annotations

import http.client
import json
import signal
import socket
import sys
import threading
import time
import urllib.request
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import boto3
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from bench.waiting import wait_until
from wsfleet_local.backend import (
    HEALTH_PATH,
    BackendError,
    EmbeddedBackend,
    Resources,
    TemplateError,
    find_template,
    load_template,
    provision_resources,
)
from wsfleet_local.procs import pid_alive, spawn

pytestmark = pytest.mark.integration

REGION = "us-east-1"
RACERS = 32
ROUNDS = 100
#: Long enough that a poll still pending after the checks proves it was not blocking them.
LONG_POLL_SECONDS = 20
#: A poll submitted on another thread is waited for until its request leaves the client; the
#: server (another process) cannot be asked whether it is parked in the wait yet. Had it not
#: arrived when the test acts, the test would be weaker, never wrong: the assertions do not
#: depend on it.

SQS_XMLNS = {"sqs": "http://queue.amazonaws.com/doc/2012-11-05/"}


# ----------------------------------------------------------------- helpers


def make_client(endpoint_url: str, service: str, *, read_timeout: int = 60) -> Any:
    """A boto3 client of its own session, with retries off so every 5xx shows up as an error."""
    session = boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION
    )
    config = Config(retries={"total_max_attempts": 1}, read_timeout=read_timeout)
    return session.client(service, endpoint_url=endpoint_url, config=config)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def try_acquire(dynamodb: Any, table: str, pk: str, owner: str) -> str:
    """One racer's conditional acquire of a free connection (the lease model's free path:
    no owner yet), which also moves the item between indexes: "won", "lost", or a failure."""
    try:
        dynamodb.update_item(
            TableName=table,
            Key={"pk": {"S": pk}},
            UpdateExpression="SET lease_owner = :me, updated_at_ms = :now "
            "REMOVE unowned_shard, unowned_since_ms ADD lease_epoch :one",
            ConditionExpression="attribute_not_exists(lease_owner)",
            ExpressionAttributeValues={
                ":me": {"S": owner},
                ":now": {"N": str(now_ms())},
                ":one": {"N": "1"},
            },
        )
    except ClientError as exc:
        code = exc.response["Error"]["Code"]
        status = exc.response["ResponseMetadata"].get("HTTPStatusCode")
        return "lost" if code == "ConditionalCheckFailedException" else f"{code} ({status})"
    except Exception as exc:  # a dropped connection or a botocore error is a failure too
        return f"{type(exc).__name__}: {exc}"
    return "won"


def send_query(
    endpoint_url: str,
    params: dict[str, str],
    *,
    timeout: float = 60,
    sent: threading.Event | None = None,
) -> bytes:
    """POST an SQS query-protocol (form) request, SigV4-signed like an old SDK would; set
    ``sent`` once the request is written (the answer may take a long poll's wait)."""
    request = AWSRequest(
        method="POST",
        url=endpoint_url + "/",
        data=urlencode({**params, "Version": "2012-11-05"}).encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"},
    )
    SigV4Auth(Credentials("testing", "testing"), "sqs", REGION).add_auth(request)
    prepared = request.prepare()
    url = urlsplit(prepared.url)
    connection = http.client.HTTPConnection(url.hostname or "", url.port, timeout=timeout)
    try:
        connection.request("POST", url.path or "/", body=prepared.body, headers=prepared.headers)
        if sent is not None:
            sent.set()
        response = connection.getresponse()
        body = response.read()
        assert response.status == 200, body
        return body
    finally:
        connection.close()


def query_bodies(response: bytes) -> list[str]:
    root = ET.fromstring(response)
    return [element.text or "" for element in root.iterfind(".//sqs:Message/sqs:Body", SQS_XMLNS)]


# ----------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def embedded() -> Iterator[EmbeddedBackend]:
    with EmbeddedBackend() as backend:
        yield backend


@pytest.fixture
def resources(embedded: EmbeddedBackend) -> Resources:
    return embedded.create_resources(f"t-{uuid.uuid4().hex[:8]}")


# ----------------------------------------------------------------- (a) atomicity


def test_racing_conditional_updates_have_exactly_one_winner_per_round(
    embedded: EmbeddedBackend, resources: Resources
) -> None:
    # GIVEN 32 racers, each with its own client (own connection pool), and one lease item
    table, pk = resources.connections_table, "CONN#race"
    setup = make_client(embedded.endpoint_url, "dynamodb")
    clients = [make_client(embedded.endpoint_url, "dynamodb") for _ in range(RACERS)]
    go = threading.Barrier(RACERS + 1, timeout=60)
    done = threading.Barrier(RACERS + 1, timeout=60)
    outcomes = [[""] * RACERS for _ in range(ROUNDS)]

    def racer(index: int) -> None:
        for round_ in range(ROUNDS):
            go.wait()
            outcomes[round_][index] = try_acquire(clients[index], table, pk, f"racer-{index}")
            done.wait()

    threads = [threading.Thread(target=racer, args=(i,), daemon=True) for i in range(RACERS)]
    for thread in threads:
        thread.start()

    # WHEN every round starts from a free connection (alternately: never held / released, in
    # gsi_unowned) and all race
    for round_ in range(ROUNDS):
        item = {"pk": {"S": pk}}
        if round_ % 2:
            item |= {
                "lease_epoch": {"N": str(round_)},
                "unowned_shard": {"S": "07"},
                "unowned_since_ms": {"N": str(now_ms())},
            }
        setup.put_item(TableName=table, Item=item)
        go.wait()
        done.wait()
    for thread in threads:
        thread.join(timeout=10)

    # THEN each round has exactly one winner and every loser lost by the condition (no 5xx)
    failures = {o for round_ in outcomes for o in round_ if o not in ("won", "lost")}
    assert failures == set()
    assert [round_.count("won") for round_ in outcomes] == [1] * ROUNDS


# ----------------------------------------------------------------- (b) long polls, JSON


@pytest.mark.parametrize(
    "wait_seconds",
    [LONG_POLL_SECONDS, None],
    ids=["WaitTimeSeconds-in-request", "queue-ReceiveMessageWaitTimeSeconds"],
)
def test_long_poll_does_not_block_other_calls_and_gets_a_message_sent_meanwhile(
    embedded: EmbeddedBackend, resources: Resources, wait_seconds: int | None
) -> None:
    # GIVEN a long poll waiting on the empty hint queue (whose attribute says 20 s)
    poller = make_client(embedded.endpoint_url, "sqs")
    wait = {} if wait_seconds is None else {"WaitTimeSeconds": wait_seconds}
    sending = threading.Event()
    poller.meta.events.register("before-send.sqs.ReceiveMessage", lambda **_: sending.set())
    with ThreadPoolExecutor(max_workers=1) as pool:
        poll: Future[dict[str, Any]] = pool.submit(
            poller.receive_message, QueueUrl=resources.hint_queue_url, **wait
        )
        wait_until(sending.is_set, timeout=30, message="the poll's request")

        # WHEN another thread uses DynamoDB meanwhile, then sends a hint
        dynamodb = make_client(embedded.endpoint_url, "dynamodb")
        for n in range(20):
            dynamodb.put_item(
                TableName=resources.connections_table, Item={"pk": {"S": f"CONN#{n}"}}
            )
        stored = dynamodb.get_item(
            TableName=resources.connections_table, Key={"pk": {"S": "CONN#19"}}
        )
        served_during_poll = not poll.done()
        body = json.dumps({"pk": f"CONN#{uuid.uuid4()}"})
        make_client(embedded.endpoint_url, "sqs").send_message(
            QueueUrl=resources.hint_queue_url, MessageBody=body
        )
        received = poll.result(timeout=60)

    # THEN the DynamoDB calls completed while the poll was still open, and the poll got the hint
    assert "Item" in stored
    assert served_during_poll
    assert [message["Body"] for message in received.get("Messages", [])] == [body]


def test_long_poll_on_an_empty_queue_ends_empty_after_its_wait(
    embedded: EmbeddedBackend, resources: Resources
) -> None:
    sqs = make_client(embedded.endpoint_url, "sqs")

    received = sqs.receive_message(QueueUrl=resources.hint_dlq_url, WaitTimeSeconds=1)

    assert received.get("Messages", []) == []


@pytest.mark.parametrize("wait", [{}, {"WaitTimeSeconds": 5}], ids=["queue-default", "explicit"])
def test_long_poll_on_a_missing_queue_fails_like_moto(
    embedded: EmbeddedBackend, resources: Resources, wait: dict[str, int]
) -> None:
    sqs = make_client(embedded.endpoint_url, "sqs")
    missing = resources.hint_queue_url + "-missing"

    with pytest.raises(ClientError) as caught:
        sqs.receive_message(QueueUrl=missing, **wait)

    assert "NonExistentQueue" in caught.value.response["Error"]["Code"]


# ----------------------------------------------------------------- (c) long polls, query


@pytest.mark.parametrize(
    "wait", [{"WaitTimeSeconds": str(LONG_POLL_SECONDS)}, {}], ids=["explicit", "queue-default"]
)
def test_query_protocol_long_poll_gets_a_message_sent_meanwhile(
    embedded: EmbeddedBackend, resources: Resources, wait: dict[str, str]
) -> None:
    # GIVEN a query-protocol long poll waiting on the empty hint queue
    params = {"Action": "ReceiveMessage", "QueueUrl": resources.hint_queue_url, **wait}
    with ThreadPoolExecutor(max_workers=1) as pool:
        sent = threading.Event()
        poll = pool.submit(send_query, embedded.endpoint_url, params, sent=sent)
        wait_until(sent.is_set, timeout=30, message="the poll's request")

        # WHEN a hint is sent (over the query protocol too) while it waits
        still_waiting = not poll.done()
        body = f"hint-{uuid.uuid4()}"
        send_query(
            embedded.endpoint_url,
            {"Action": "SendMessage", "QueueUrl": resources.hint_queue_url, "MessageBody": body},
        )
        response = poll.result(timeout=60)

    # THEN that poll returns it
    assert still_waiting
    assert query_bodies(response) == [body]


def test_query_protocol_long_poll_on_an_empty_queue_ends_empty(
    embedded: EmbeddedBackend, resources: Resources
) -> None:
    params = {
        "Action": "ReceiveMessage",
        "QueueUrl": resources.hint_dlq_url,
        "WaitTimeSeconds": "1",
    }

    assert query_bodies(send_query(embedded.endpoint_url, params)) == []


# ----------------------------------------------------------------- (d) resources


def test_connections_table_has_the_lease_indexes_and_a_readable_stream(
    embedded: EmbeddedBackend, resources: Resources
) -> None:
    dynamodb = make_client(embedded.endpoint_url, "dynamodb")
    streams = make_client(embedded.endpoint_url, "dynamodbstreams")

    table = dynamodb.describe_table(TableName=resources.connections_table)["Table"]
    indexes = {i["IndexName"]: i for i in table["GlobalSecondaryIndexes"]}
    assert sorted(indexes) == ["gsi_owner", "gsi_state", "gsi_unowned", "gsi_workers"]
    keys = {name: [k["AttributeName"] for k in i["KeySchema"]] for name, i in indexes.items()}
    assert keys == {
        "gsi_owner": ["lease_owner"],
        "gsi_state": ["state_shard", "pk"],
        "gsi_unowned": ["unowned_shard", "unowned_since_ms"],
        "gsi_workers": ["worker_index"],
    }
    projections = {name: i["Projection"]["ProjectionType"] for name, i in indexes.items()}
    assert projections == {
        "gsi_owner": "INCLUDE", "gsi_state": "KEYS_ONLY", "gsi_unowned": "INCLUDE",
        "gsi_workers": "KEYS_ONLY",
    }  # fmt: skip
    assert table["StreamSpecification"]["StreamViewType"] == "NEW_AND_OLD_IMAGES"
    assert table["LatestStreamArn"] == resources.stream_arn

    dynamodb.put_item(TableName=resources.connections_table, Item={"pk": {"S": "CONN#s"}})
    [shard] = streams.describe_stream(StreamArn=resources.stream_arn)["StreamDescription"]["Shards"]
    iterator = streams.get_shard_iterator(
        StreamArn=resources.stream_arn,
        ShardId=shard["ShardId"],
        ShardIteratorType="TRIM_HORIZON",
    )["ShardIterator"]
    records = streams.get_records(ShardIterator=iterator)["Records"]
    assert [(r["eventName"], r["dynamodb"]["NewImage"]["pk"]["S"]) for r in records] == [
        ("INSERT", "CONN#s")
    ]


def test_messages_table_is_keyed_by_connection_and_sequence(
    embedded: EmbeddedBackend, resources: Resources
) -> None:
    dynamodb = make_client(embedded.endpoint_url, "dynamodb")

    table = dynamodb.describe_table(TableName=resources.messages_table)["Table"]

    assert table["KeySchema"] == [
        {"AttributeName": "pk", "KeyType": "HASH"},
        {"AttributeName": "sk", "KeyType": "RANGE"},
    ]


def test_hint_queue_has_the_template_attributes_and_redrives_to_the_dlq(
    embedded: EmbeddedBackend, resources: Resources
) -> None:
    sqs = make_client(embedded.endpoint_url, "sqs")

    hint = sqs.get_queue_attributes(QueueUrl=resources.hint_queue_url, AttributeNames=["All"])
    dlq = sqs.get_queue_attributes(QueueUrl=resources.hint_dlq_url, AttributeNames=["All"])

    attributes = hint["Attributes"]
    assert attributes["VisibilityTimeout"] == "30"
    assert attributes["ReceiveMessageWaitTimeSeconds"] == "20"
    assert attributes["MessageRetentionPeriod"] == "3600"
    assert json.loads(attributes["RedrivePolicy"]) == {
        "deadLetterTargetArn": dlq["Attributes"]["QueueArn"],
        "maxReceiveCount": 5,
    }
    assert dlq["Attributes"]["MessageRetentionPeriod"] == "1209600"


def test_resources_carry_the_get_att_values_the_backend_reported(
    embedded: EmbeddedBackend, resources: Resources
) -> None:
    # GIVEN created resources WHEN their GetAtt map is read
    get_att = resources.get_att()

    # THEN it holds the ARNs the backend gave (the fleet resolves the template's !GetAtt with it)
    dynamodb = make_client(embedded.endpoint_url, "dynamodb")
    sqs = make_client(embedded.endpoint_url, "sqs")
    table = dynamodb.describe_table(TableName=resources.connections_table)["Table"]
    dlq = sqs.get_queue_attributes(QueueUrl=resources.hint_dlq_url, AttributeNames=["QueueArn"])
    assert get_att[("ConnectionsTable", "Arn")] == table["TableArn"]
    assert get_att[("ConnectionsTable", "StreamArn")] == resources.stream_arn
    assert get_att[("HintDeadLetterQueue", "Arn")] == dlq["Attributes"]["QueueArn"]
    assert get_att[("HintQueue", "QueueUrl")] == resources.hint_queue_url
    assert Resources(**json.loads(json.dumps(asdict(resources)))) == resources  # the ready line


def test_resources_of_two_prefixes_are_independent(embedded: EmbeddedBackend) -> None:
    # GIVEN two resource sets on one server
    first = embedded.create_resources(f"a-{uuid.uuid4().hex[:8]}")
    second = embedded.create_resources(f"b-{uuid.uuid4().hex[:8]}")
    dynamodb = make_client(embedded.endpoint_url, "dynamodb")
    sqs = make_client(embedded.endpoint_url, "sqs")

    # WHEN one of them gets an item and a hint
    dynamodb.put_item(TableName=first.connections_table, Item={"pk": {"S": "CONN#1"}})
    sqs.send_message(QueueUrl=first.hint_queue_url, MessageBody="hint")

    # THEN the other sees neither
    assert set(first.tables.values()).isdisjoint(second.tables.values())
    assert set(first.queues.values()).isdisjoint(second.queues.values())
    assert dynamodb.scan(TableName=second.connections_table)["Items"] == []
    assert "Messages" not in sqs.receive_message(QueueUrl=second.hint_queue_url, WaitTimeSeconds=0)
    assert dynamodb.scan(TableName=first.connections_table)["Count"] == 1


def test_env_points_boto3_at_the_resources(embedded: EmbeddedBackend, resources: Resources) -> None:
    env = resources.env()

    assert env == {
        "AWS_ENDPOINT_URL": embedded.endpoint_url,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "CONNECTIONS_TABLE": resources.connections_table,
        "MESSAGES_TABLE": resources.messages_table,
        "HINT_QUEUE_URL": resources.hint_queue_url,
    }
    # the template may hold more tables and queues; the named ones are among them
    assert (
        resources.tables.items()
        >= {
            "ConnectionsTable": resources.connections_table,
            "MessagesTable": resources.messages_table,
        }.items()
    )
    assert (
        resources.queues.items()
        >= {
            "HintQueue": resources.hint_queue_url,
            "HintDeadLetterQueue": resources.hint_dlq_url,
        }.items()
    )


def test_reusing_a_prefix_on_one_server_is_refused(
    embedded: EmbeddedBackend, resources: Resources
) -> None:
    prefix = resources.connections_table.removesuffix("-ConnectionsTable")

    with pytest.raises(BackendError, match="ResourceInUse"):
        embedded.create_resources(prefix)


EXTENDED_TEMPLATE = """
Parameters:
  Stage: {Type: String, Default: dev}
  Visibility: {Type: Number, Default: 45}
Resources:
  ConnectionsTable:
    Type: AWS::DynamoDB::Table
    Properties:
      TableName: !Sub "${AWS::StackName}-ignored"
      BillingMode: PAY_PER_REQUEST
      AttributeDefinitions: [{AttributeName: pk, AttributeType: S}]
      KeySchema: [{AttributeName: pk, KeyType: HASH}]
      StreamSpecification: {StreamViewType: KEYS_ONLY}
      TimeToLiveSpecification: {AttributeName: expires_at_s, Enabled: true}
      SSESpecification: {SSEEnabled: true}
  MessagesTable:
    Type: AWS::DynamoDB::Table
    Properties:
      BillingMode: PAY_PER_REQUEST
      AttributeDefinitions: [{AttributeName: pk, AttributeType: S}]
      KeySchema: [{AttributeName: pk, KeyType: HASH}]
  AuditTable:
    Type: AWS::DynamoDB::Table
    Properties:
      ProvisionedThroughput: {ReadCapacityUnits: 1, WriteCapacityUnits: 1}
      AttributeDefinitions: [{AttributeName: id, AttributeType: S}]
      KeySchema: [{AttributeName: id, KeyType: HASH}]
  HintQueue:
    Type: AWS::SQS::Queue
    Properties:
      VisibilityTimeout: !Ref Visibility
      RedrivePolicy:
        deadLetterTargetArn: !GetAtt HintDeadLetterQueue.Arn
        maxReceiveCount: 3
  HintDeadLetterQueue:
    Type: AWS::SQS::Queue
  OrderedQueue:
    Type: AWS::SQS::Queue
    Properties:
      FifoQueue: true
      ContentBasedDeduplication: true
      Tags: [{Key: stage, Value: !Ref Stage}]
  Topic:
    Type: AWS::SNS::Topic
"""


def test_every_table_and_queue_of_the_template_is_created(
    embedded: EmbeddedBackend, tmp_path: Path
) -> None:
    # GIVEN a template with an extra table, a FIFO queue, a parameter Ref and a forward GetAtt
    template = tmp_path / "template.yaml"
    template.write_text(EXTENDED_TEMPLATE)
    prefix = f"x-{uuid.uuid4().hex[:8]}"

    # WHEN its resources are provisioned
    created = provision_resources(embedded.endpoint_url, prefix, template_path=template)

    # THEN every table and queue exists under the prefix, wired as the template says
    dynamodb = make_client(embedded.endpoint_url, "dynamodb")
    sqs = make_client(embedded.endpoint_url, "sqs")
    assert created.tables["AuditTable"] == f"{prefix}-AuditTable"
    assert created.connections_table == f"{prefix}-ConnectionsTable"
    assert created.queues["OrderedQueue"].endswith(f"/{prefix}-OrderedQueue.fifo")
    assert "Topic" not in created.tables and "Topic" not in created.queues
    ttl = dynamodb.describe_time_to_live(TableName=created.connections_table)
    assert ttl["TimeToLiveDescription"]["AttributeName"] == "expires_at_s"
    hint = sqs.get_queue_attributes(QueueUrl=created.hint_queue_url, AttributeNames=["All"])
    assert hint["Attributes"]["VisibilityTimeout"] == "45"
    assert json.loads(hint["Attributes"]["RedrivePolicy"])["deadLetterTargetArn"].endswith(
        f":{prefix}-HintDeadLetterQueue"
    )
    fifo = sqs.get_queue_attributes(QueueUrl=created.queues["OrderedQueue"], AttributeNames=["All"])
    assert fifo["Attributes"]["FifoQueue"] == "true"


def test_template_without_the_wsfleet_resources_is_refused(
    embedded: EmbeddedBackend, tmp_path: Path
) -> None:
    template = tmp_path / "template.yaml"
    template.write_text("Resources:\n  Only:\n    Type: AWS::SQS::Queue\n")

    with pytest.raises(TemplateError, match="ConnectionsTable"):
        provision_resources(
            embedded.endpoint_url, f"m-{uuid.uuid4().hex[:8]}", template_path=template
        )


def test_a_reference_with_no_local_value_is_refused_naming_the_resource(
    embedded: EmbeddedBackend, tmp_path: Path
) -> None:
    template = tmp_path / "template.yaml"
    template.write_text(
        "Resources:\n"
        "  HintQueue:\n"
        "    Type: AWS::SQS::Queue\n"
        "    Properties: {VisibilityTimeout: !Ref NoSuchParameter}\n"
    )

    with pytest.raises(TemplateError, match="HintQueue: Ref NoSuchParameter"):
        provision_resources(
            embedded.endpoint_url, f"u-{uuid.uuid4().hex[:8]}", template_path=template
        )


def test_find_template_prefers_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_template(find_template())["Resources"]["HintQueue"]["Properties"]["RedrivePolicy"][
        "deadLetterTargetArn"
    ] == {"Fn::GetAtt": ["HintDeadLetterQueue", "Arn"]}
    override = tmp_path / "other.yaml"
    override.write_text("Resources: {}\n")
    monkeypatch.setenv("WSFLEET_TEMPLATE", str(override))

    assert find_template() == override


# ----------------------------------------------------------------- (e) lifecycle


def test_stop_ends_the_child_and_frees_the_port() -> None:
    # GIVEN a running backend
    backend = EmbeddedBackend().start()
    pid, port = backend.pid, backend.port
    assert pid is not None
    with urllib.request.urlopen(backend.endpoint_url + HEALTH_PATH, timeout=5) as response:
        assert response.status == 200

    # WHEN it is stopped (twice: stop is idempotent)
    backend.stop()
    backend.stop()

    # THEN the child is gone, nothing listens on the port, and a new server could listen there
    assert not pid_alive(pid)
    assert backend.pid is None
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    with socket.socket() as listener:  # bound as werkzeug binds (SO_REUSEADDR)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen()


def test_command_line_prints_env_and_exits_cleanly_on_sigterm() -> None:
    # GIVEN the command line asked to create resources
    prefix = f"cli-{uuid.uuid4().hex[:8]}"
    child = spawn(
        "backend", [sys.executable, "-m", "wsfleet_local.backend", "--port", "0",
                    "--create-resources", prefix], capture_stdout=True,
    )  # fmt: skip
    try:
        ready = child.read_json_line(60)

        # WHEN its printed env is used, then it is signalled
        env = ready["env"]
        dynamodb = make_client(env["AWS_ENDPOINT_URL"], "dynamodb")
        table = dynamodb.describe_table(TableName=env["CONNECTIONS_TABLE"])["Table"]
        child.send_signal(signal.SIGTERM)
        code = child.wait(20)
    finally:
        child.stop(signal.SIGKILL)

    # THEN it served the resources it announced and exited with status 0
    assert ready["endpoint_url"] == env["AWS_ENDPOINT_URL"]
    assert table["TableName"] == f"{prefix}-ConnectionsTable"
    assert code == 0


def test_child_exits_when_its_parent_goes_away() -> None:
    # GIVEN a child watching its stdin, as EmbeddedBackend starts it
    child = spawn(
        "backend", [sys.executable, "-m", "wsfleet_local.backend", "--port", "0",
                    "--exit-on-stdin-eof"], stdin_pipe=True, capture_stdout=True,
    )  # fmt: skip
    try:
        child.read_json_line(60)

        # WHEN the parent's end of the pipe closes (as it does when the parent dies)
        child.close_stdin()

        # THEN the child exits cleanly on its own
        code = child.wait(20)
    finally:
        child.stop(signal.SIGKILL)
    assert code == 0
