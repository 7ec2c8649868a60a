"""The fault-injecting proxy (bench.faults) in front of the embedded moto server.

What must hold for the chaos suite and the benchmarks to mean anything:

* without rules the proxy is transparent (boto3 works through it, keep-alive included) and
  counts every request by listener label, service, operation and table;
* an injected error is the one the real service sends, so botocore and wsfleet classify it
  the way they would on AWS (throttling vs ambiguous 5xx);
* ``after=True`` applies the request and *then* fails it: the write is there, the caller
  saw a 500;
* rules are reproducible from a seed and controllable at runtime over HTTP and from a file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from fleet_helpers import wait_until

from bench.faults import (
    FaultClient,
    FaultError,
    FaultKind,
    FaultPlan,
    FaultProxy,
    FaultRule,
    RequestInfo,
    classify,
    error_response,
)
from wsfleet.aws import is_ambiguous, is_throttling
from wsfleet.exceptions import StoreError
from wsfleet.record import WorkerRecord, connection_pk
from wsfleet.store import DynamoDBLeaseStore

pytestmark = pytest.mark.integration


def client(service: str, endpoint: str, attempts: int = 1):
    """A boto3 client through the proxy; one attempt unless asked, so injected errors show."""
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"mode": "standard", "total_max_attempts": attempts}),
    )


@pytest.fixture
def proxy(backend):
    with FaultProxy(backend.endpoint_url, labels=("worker", "lambda"), seed=3) as running:
        yield running


def put(ddb, table: str, pk: str, value: str = "v") -> None:
    ddb.put_item(TableName=table, Item={"pk": {"S": pk}, "v": {"S": value}})


def test_without_rules_it_is_transparent_and_counts_by_label_operation_and_table(aws, proxy):
    ddb = client("dynamodb", proxy.url_for("worker"))
    sqs = client("sqs", proxy.url_for("lambda"))
    for i in range(3):
        put(ddb, aws.connections_table, f"CONN#a{i}")
    assert ddb.get_item(TableName=aws.connections_table, Key={"pk": {"S": "CONN#a1"}})["Item"]
    ddb.batch_write_item(
        RequestItems={
            aws.messages_table: [
                {"PutRequest": {"Item": {"pk": {"S": "CONN#a"}, "sk": {"S": f"{i:020d}"}}}}
                for i in range(7)
            ]
        }
    )
    sqs.send_message(QueueUrl=aws.hint_queue_url, MessageBody="{}")
    assert sqs.receive_message(QueueUrl=aws.hint_queue_url, WaitTimeSeconds=1)["Messages"]

    stats = proxy.stats()
    assert stats.total(label="worker", operation="PutItem", table=aws.connections_table) == 3
    assert stats.total(label="worker", operation="GetItem") == 1
    assert stats.total(operation="BatchWriteItem", table=aws.messages_table) == 1
    assert stats.total(operation="BatchWriteItem", what="items") == 7
    assert stats.total(label="lambda", service="sqs") == 2
    assert stats.total(label="worker", service="sqs") == 0
    assert stats.total(what="injected") == 0
    proxy.reset_stats()
    assert proxy.stats().total() == 0


def test_dynamodb_throttle_is_refused_and_classified_as_throttling(aws, proxy):
    proxy.set_rules([FaultRule(kind="throttle", service="dynamodb", operations={"PutItem"})])
    ddb = client("dynamodb", proxy.url_for("worker"))

    with pytest.raises(ClientError) as caught:
        put(ddb, aws.connections_table, "CONN#t")

    error = caught.value
    assert error.response["Error"]["Code"] == "ProvisionedThroughputExceededException"
    assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert is_throttling(error) and not is_ambiguous(error)
    assert "Item" not in ddb.get_item(TableName=aws.connections_table, Key={"pk": {"S": "CONN#t"}})
    assert proxy.stats().total(operation="PutItem", what="injected") == 1


def test_sqs_errors_have_the_json_protocol_shape_with_the_query_compatible_code(aws, proxy):
    proxy.set_rules([
        FaultRule(kind="throttle", service="sqs", operations={"SendMessage"}, budget=1),
        FaultRule(kind="503", service="sqs", operations={"SendMessage"}, budget=1),
    ])
    sqs = client("sqs", proxy.url_for("worker"))

    with pytest.raises(ClientError) as throttled:
        sqs.send_message(QueueUrl=aws.hint_queue_url, MessageBody="1")
    with pytest.raises(ClientError) as unavailable:
        sqs.send_message(QueueUrl=aws.hint_queue_url, MessageBody="2")
    sqs.send_message(QueueUrl=aws.hint_queue_url, MessageBody="3")  # budgets spent

    assert throttled.value.response["Error"]["Code"] == "RequestThrottled"
    assert is_throttling(throttled.value)
    assert unavailable.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert is_ambiguous(unavailable.value)
    bodies = [
        m["Body"]
        for m in sqs.receive_message(
            QueueUrl=aws.hint_queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1
        ).get("Messages", [])
    ]
    assert bodies == ["3"]


def test_botocore_retries_ride_through_transient_faults(aws, proxy):
    proxy.set_rules([FaultRule(kind="500", service="dynamodb", budget=2)])
    ddb = client("dynamodb", proxy.url_for("worker"), attempts=4)

    put(ddb, aws.connections_table, "CONN#r")

    assert ddb.get_item(TableName=aws.connections_table, Key={"pk": {"S": "CONN#r"}})["Item"]
    stats = proxy.stats()
    assert stats.total(operation="PutItem", what="injected") == 2
    assert stats.total(operation="PutItem") == 3  # two refused, one forwarded


def test_after_mode_applies_the_write_and_then_answers_500(aws, proxy):
    proxy.set_rules([FaultRule(kind="500", operations={"PutItem"}, after=True, budget=1)])
    ddb = client("dynamodb", proxy.url_for("worker"))

    with pytest.raises(ClientError) as caught:
        put(ddb, aws.connections_table, "CONN#amb", "landed")

    assert caught.value.response["Error"]["Code"] == "InternalServerError"
    assert is_ambiguous(caught.value)
    item = ddb.get_item(TableName=aws.connections_table, Key={"pk": {"S": "CONN#amb"}})["Item"]
    assert item["v"] == {"S": "landed"}


@pytest.mark.parametrize("attempts", [4, 1], ids=["botocore-retries", "no-retry"])
def test_an_ambiguous_acquire_that_landed_is_acquired_under_a_new_epoch(aws, proxy, attempts):
    # GIVEN a STARTED connection and an acquire whose write lands but is answered with a 500
    direct = DynamoDBLeaseStore(
        client("dynamodb", aws.endpoint_url), aws.connections_table, lease_ms=5000
    )
    direct.start("amb", "ws://127.0.0.1:9/amb")
    proxy.set_rules([FaultRule(kind="500", operations={"UpdateItem"}, after=True, budget=1)])
    through = DynamoDBLeaseStore(
        client("dynamodb", proxy.url_for("worker"), attempts=attempts), aws.connections_table,
        lease_ms=5000,
    )  # fmt: skip

    # WHEN botocore retries it (the retry's condition meets the lease it just took), or,
    # without retries, the call fails ambiguously
    record = through.acquire(connection_pk("amb"), "w-amb")

    # THEN the caller is told it holds the connection, re-taken once under an epoch nobody saw
    # before (whatever the landed attempt might have started is fenced)
    stored = direct.get(connection_pk("amb"))
    assert (stored.lease_owner, stored.lease_epoch) == ("w-amb", 2)
    assert record == stored
    assert proxy.stats().total(operation="UpdateItem", what="injected") == 1


def test_an_ambiguous_acquire_that_did_not_land_still_fails(aws, proxy):
    direct = DynamoDBLeaseStore(
        client("dynamodb", aws.endpoint_url), aws.connections_table, lease_ms=5000
    )
    direct.start("amb2", "ws://127.0.0.1:9/amb2")
    proxy.set_rules([FaultRule(kind="500", operations={"UpdateItem"}, budget=1)])  # before
    through = DynamoDBLeaseStore(
        client("dynamodb", proxy.url_for("worker"), attempts=1), aws.connections_table,
        lease_ms=5000,
    )  # fmt: skip
    with pytest.raises(StoreError):
        through.acquire(connection_pk("amb2"), "w-amb")
    assert not direct.get(connection_pk("amb2")).lease_owner  # never acquired


def test_delay_rule_delays_but_answers_for_real(aws, proxy):
    proxy.set_rules([FaultRule(kind="delay", delay_ms=50, operations={"DescribeTable"})])
    ddb = client("dynamodb", proxy.url_for("lambda"))
    assert ddb.describe_table(TableName=aws.connections_table)["Table"]["TableName"]
    assert proxy.stats().total(operation="DescribeTable", what="injected") == 1


def test_rules_apply_only_to_their_label_and_table(aws, proxy):
    proxy.set_rules([FaultRule(kind="throttle", label="worker", table="MessagesTable")])
    worker = client("dynamodb", proxy.url_for("worker"))
    lam = client("dynamodb", proxy.url_for("lambda"))

    put(worker, aws.connections_table, "CONN#ok")  # another table: untouched
    lam.describe_table(TableName=aws.messages_table)  # another label: untouched
    with pytest.raises(ClientError) as caught:
        worker.describe_table(TableName=aws.messages_table)
    assert is_throttling(caught.value)


def test_runtime_control_over_http(aws, proxy):
    control = FaultClient(proxy.url_for("lambda"))
    control.set_rules([FaultRule(kind="503", service="dynamodb")], seed=11)
    state = control.state()
    assert state["seed"] == 11 and state["rules"][0]["kind"] == "503"
    ddb = client("dynamodb", proxy.url_for("worker"))
    with pytest.raises(ClientError):
        ddb.describe_table(TableName=aws.connections_table)
    assert control.stats().total(what="injected") == 1

    control.clear_rules()
    ddb.describe_table(TableName=aws.connections_table)
    control.reset_stats()
    assert control.stats().total() == 0
    with pytest.raises(FaultError, match="400"):
        control._call("PUT", "/_faults", {"rules": [{"kind": "500", "bogus": 1}]})


def test_rules_file_is_reloaded_when_it_changes(aws, backend, tmp_path):
    rules_file = tmp_path / "rules.json"
    rules_file.write_text("[]")
    with FaultProxy(backend.endpoint_url, rules_file=rules_file) as proxy:
        ddb = client("dynamodb", proxy.url)
        ddb.describe_table(TableName=aws.connections_table)
        rules_file.write_text(json.dumps({"rules": [{"kind": "throttle"}], "seed": 5}))

        def throttled() -> bool:
            try:
                ddb.describe_table(TableName=aws.connections_table)
            except ClientError:
                return True
            return False

        wait_until(throttled, timeout=10, interval=0.1)
        assert proxy.plan.seed == 5


def test_upstream_can_be_set_after_start_and_requests_before_fail_retryably(aws, backend):
    with FaultProxy(None) as proxy:
        ddb = client("dynamodb", proxy.url)
        with pytest.raises(ClientError) as caught:
            ddb.describe_table(TableName=aws.connections_table)
        assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 502
        FaultClient(proxy.url).set_upstream(backend.endpoint_url)
        assert ddb.describe_table(TableName=aws.connections_table)["Table"]


def test_command_line_proxy_prints_its_urls_and_exits_on_stdin_eof(aws, backend):
    command = [
        sys.executable, "-m", "bench.faults", "--upstream", backend.endpoint_url,
        "--labels", "worker,lambda", "--exit-on-stdin-eof",
    ]  # fmt: skip
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=Path(__file__).parents[2]
    )
    try:
        ready = json.loads(process.stdout.readline())
        assert set(ready["urls"]) == {"worker", "lambda"}
        ddb = client("dynamodb", ready["urls"]["worker"])
        assert ddb.describe_table(TableName=aws.connections_table)["Table"]
        assert FaultClient(ready["url"]).stats().total(label="worker") == 1
    finally:
        process.stdin.close()
        assert process.wait(10) == 0
        process.stdout.close()


# ------------------------------------------------------------------ pure parts, no server


def test_a_seed_makes_the_decisions_reproducible():
    rules = [FaultRule(kind="500", probability=0.3)]
    info = RequestInfo("dynamodb", "UpdateItem", ("t",))

    def run(seed: int) -> list[bool]:
        plan = FaultPlan(rules, seed=seed)
        return [plan.decide(info, "w") is not None for _ in range(200)]

    assert run(42) == run(42)
    assert run(42) != run(43)
    assert 30 < sum(run(42)) < 90


def test_classify_reads_targets_tables_items_and_the_sqs_query_protocol():
    batch = json.dumps(
        {"RequestItems": {"m": [{"PutRequest": {}}] * 3, "c": [{"DeleteRequest": {}}]}}
    ).encode()
    info = classify({"X-Amz-Target": "DynamoDB_20120810.BatchWriteItem"}, batch)
    assert (info.service, info.operation, info.tables, info.items) == (
        "dynamodb", "BatchWriteItem", ("c", "m"), 4,
    )  # fmt: skip
    query = classify({}, b"Action=ReceiveMessage&QueueUrl=x")
    assert (query.service, query.operation, query.protocol) == ("sqs", "ReceiveMessage", "query")
    streams = classify({"x-amz-target": "DynamoDBStreams_20120810.GetRecords"}, b"{}")
    assert streams.service == "streams"


def test_error_shapes_per_protocol():
    sqs_request = RequestInfo("sqs", "X", protocol="query")
    status, _, body = error_response(FaultKind.ERROR_500, sqs_request)
    assert status == 500 and b"<Code>InternalError</Code>" in body
    status, _, body = error_response(FaultKind.THROTTLING, RequestInfo("dynamodb", "GetItem"))
    assert status == 400 and json.loads(body)["__type"].endswith("#ThrottlingException")
    with pytest.raises(FaultError):
        FaultRule(kind="delay")
    with pytest.raises(FaultError):
        FaultRule.from_dict({"kind": "500", "probability": 2})
    assert FaultRule.from_dict(FaultRule(kind="503", operations={"A"}).to_dict()) == FaultRule(
        kind="503", operations=frozenset({"A"})
    )


def _worker(worker_id: str, started_at_ms: int) -> WorkerRecord:
    return WorkerRecord(
        worker_id=worker_id, control_queue_url=f"http://q/{worker_id}",
        started_at_ms=started_at_ms, heartbeat_at_ms=started_at_ms,
        expires_at_ms=started_at_ms + 5000, capacity=100,
    )  # fmt: skip


def test_an_ambiguous_registration_that_landed_is_a_registration(aws, proxy):
    # GIVEN a worker registration whose PutItem lands but is answered with a 500
    proxy.set_rules([FaultRule(kind="500", operations={"PutItem"}, after=True, budget=1)])
    through = DynamoDBLeaseStore(
        client("dynamodb", proxy.url_for("worker"), attempts=4), aws.connections_table
    )
    worker = _worker("w-amb-reg", 1_000)

    # WHEN botocore retries it and the retry's condition meets the item just written
    through.register_worker(worker)

    # THEN the worker is registered (not "already registered"), as written
    assert proxy.stats().total(operation="PutItem", what="injected") == 1
    assert through.get_worker("w-amb-reg", consistent=True) == worker


def test_a_registration_that_meets_another_incarnation_is_still_refused(aws, proxy):
    store = DynamoDBLeaseStore(client("dynamodb", proxy.url_for("worker")), aws.connections_table)
    store.register_worker(_worker("w-twice", 1_000))
    with pytest.raises(StoreError, match="already registered"):
        store.register_worker(_worker("w-twice", 2_000))
