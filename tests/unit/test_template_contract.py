"""template.yaml keeps the contract the code relies on.

The code and the stack meet at names: table keys and index, the stream view, the TTL attribute,
environment variables, metric names and dimensions, the IAM actions each component calls, the
schedule and the stream filter. Nothing checks those at deploy time until something fails in
an account, so this test reads the template (plus the Dockerfile, samconfig.toml and
docs/deploy.md, which must agree with it) and pins each of them. Fast, no network, no AWS.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import json
import re
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from wsfleet.rebalance import FLEET_VIEW_PK
from wsfleet.record import INDEX_SHARDS, WORKER_INDEX_VALUE
from wsfleet.settings import ENVIRONMENT, Settings
from wsfleet.store import OWNER_INDEX, STATE_INDEX, UNOWNED_INDEX, WORKERS_INDEX
from wsfleet.upstream_options import InvalidUpstreamOptions, parse_upstream_options
from wsfleet_local.backend import load_template
from wsfleet_local.stack import StackResolver, container_environment
from wsfleet_worker.config import WORKER_ENVIRONMENT

ROOT = Path(__file__).resolve().parents[2]
CTL_QUEUES = "arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:${AWS::StackName}-ctl-*"
CTL_PREFIX = {"Fn::Sub": "${AWS::StackName}-ctl-"}
TABLE = "ConnectionsTable.Arn"
INDEXES = (OWNER_INDEX, UNOWNED_INDEX, STATE_INDEX, WORKERS_INDEX)
#: Policy Resource of one index of the connections table.
INDEX = {name: f"${{ConnectionsTable.Arn}}/index/{name}" for name in INDEXES}
WORKER_ITEMS_ONLY = {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["WORKER#*"]}}
CONNECTION_ITEMS_ONLY = {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["CONN#*"]}}


# ------------------------------------------------------------------------------------- loading
@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_template(ROOT / "template.yaml")


@pytest.fixture(scope="module")
def resources(template: dict[str, Any]) -> dict[str, Any]:
    return template["Resources"]


def props(resources: Mapping[str, Any], logical_id: str) -> dict[str, Any]:
    return resources[logical_id]["Properties"]


def function_env(template: Mapping[str, Any], logical_id: str) -> dict[str, Any]:
    """Globals' variables merged with the function's own, as SAM merges them."""
    merged = dict(template["Globals"]["Function"]["Environment"]["Variables"])
    merged.update(props(template["Resources"], logical_id)["Environment"]["Variables"])
    return merged


def worker_container(resources: Mapping[str, Any]) -> dict[str, Any]:
    (container,) = props(resources, "WorkerTaskDefinition")["ContainerDefinitions"]
    return container


def task_env(resources: Mapping[str, Any]) -> dict[str, Any]:
    """Name -> value; a conditional entry's value is an ``Fn::If`` (resolve_conditions)."""
    return container_environment(worker_container(resources)["Environment"])


# ------------------------------------------------------------------------------------- IAM view
def as_list(value: Any) -> list[Any]:
    """IAM allows a single Action/Resource in place of a list."""
    return value if isinstance(value, list) else [value]


def _resource_key(resource: Any) -> str:
    """A readable, comparable name for a policy Resource value."""
    if resource == "*":
        return "*"
    if isinstance(resource, dict) and "Fn::GetAtt" in resource:
        return ".".join(resource["Fn::GetAtt"])
    if isinstance(resource, dict) and "Fn::Sub" in resource:
        sub = resource["Fn::Sub"]
        return sub if isinstance(sub, str) else sub[0]
    raise AssertionError(f"unexpected Resource form {resource!r}")


@functools.cache
def _template() -> dict[str, Any]:
    return load_template(ROOT / "template.yaml")


def resolver(**parameters: str) -> StackResolver:
    """The template's conditions and parameters as a stack deployed with ``parameters``."""
    template = _template()
    return StackResolver(
        stack_name="wsfleet", region="eu-west-1", names={},
        parameters=template["Parameters"], conditions=template["Conditions"],
        overrides=parameters,
    )


def statements(
    resources: Mapping[str, Any], role: str, **parameters: str
) -> Iterator[dict[str, Any]]:
    """The role's policy statements as deployed with ``parameters`` (Defaults otherwise):
    Fn::If evaluated, AWS::NoValue entries gone, every other intrinsic as written."""
    policies = resolver(**parameters).resolve_conditions(props(resources, role)["Policies"])
    for policy in policies:
        yield from policy["PolicyDocument"]["Statement"]


def grants(resources: Mapping[str, Any], role: str) -> set[tuple[str, str]]:
    """(action, resource) pairs of a role, leaving out logging and tracing plumbing."""
    pairs = set()
    for statement in statements(resources, role):
        assert statement["Effect"] == "Allow"
        for action in as_list(statement["Action"]):
            if action.split(":")[0] in ("logs", "xray"):
                continue
            pairs |= {(action, _resource_key(target)) for target in as_list(statement["Resource"])}
    return pairs


def conditions(resources: Mapping[str, Any], role: str, action: str) -> list[Any]:
    return [s.get("Condition") for s in statements(resources, role) if action in s["Action"]]


# ============================================================================ tables and queues
def test_connections_table_keys_indexes_stream_and_ttl(resources: dict[str, Any]) -> None:
    table = props(resources, "ConnectionsTable")

    assert table["KeySchema"] == [{"AttributeName": "pk", "KeyType": "HASH"}]
    assert {(a["AttributeName"], a["AttributeType"]) for a in table["AttributeDefinitions"]} == {
        ("pk", "S"),
        ("lease_owner", "S"),
        ("unowned_shard", "S"),
        ("unowned_since_ms", "N"),
        ("state_shard", "S"),
        ("worker_index", "S"),
    }
    indexes = {index["IndexName"]: index for index in table["GlobalSecondaryIndexes"]}
    assert set(indexes) == set(INDEXES)
    assert indexes[OWNER_INDEX]["KeySchema"] == [
        {"AttributeName": "lease_owner", "KeyType": "HASH"}
    ]
    # the sweep and the reconciler read the epoch and the desired state from the index
    assert indexes[OWNER_INDEX]["Projection"] == {
        "ProjectionType": "INCLUDE", "NonKeyAttributes": ["lease_epoch", "desired_state"],
    }
    assert indexes[UNOWNED_INDEX]["KeySchema"] == [
        {"AttributeName": "unowned_shard", "KeyType": "HASH"},
        {"AttributeName": "unowned_since_ms", "KeyType": "RANGE"},
    ]
    assert indexes[UNOWNED_INDEX]["Projection"] == {
        "ProjectionType": "INCLUDE", "NonKeyAttributes": ["lease_epoch"],
    }
    assert indexes[STATE_INDEX]["KeySchema"] == [
        {"AttributeName": "state_shard", "KeyType": "HASH"},
        {"AttributeName": "pk", "KeyType": "RANGE"},
    ]
    assert indexes[WORKERS_INDEX]["KeySchema"] == [
        {"AttributeName": "worker_index", "KeyType": "HASH"}
    ]
    for name in (STATE_INDEX, WORKERS_INDEX):
        assert indexes[name]["Projection"] == {"ProjectionType": "KEYS_ONLY"}
    assert table["StreamSpecification"] == {"StreamViewType": "NEW_AND_OLD_IMAGES"}
    assert table["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
    assert table["BillingMode"] == "PAY_PER_REQUEST"
    assert (INDEX_SHARDS, WORKER_INDEX_VALUE) == (16, "WORKER")  # what the comments describe


def test_messages_table_keys_and_ttl(resources: dict[str, Any]) -> None:
    table = props(resources, "MessagesTable")

    assert table["KeySchema"] == [
        {"AttributeName": "pk", "KeyType": "HASH"},
        {"AttributeName": "sk", "KeyType": "RANGE"},
    ]
    assert {(a["AttributeName"], a["AttributeType"]) for a in table["AttributeDefinitions"]} == {
        ("pk", "S"),
        ("sk", "S"),
    }
    assert table["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}


@pytest.mark.parametrize("table", ["ConnectionsTable", "MessagesTable"])
def test_tables_are_protected(resources: dict[str, Any], table: str) -> None:
    definition = resources[table]

    assert definition["Properties"]["SSESpecification"] == {"SSEEnabled": True}
    assert definition["Properties"]["PointInTimeRecoverySpecification"] == {
        "PointInTimeRecoveryEnabled": True
    }
    assert definition["Properties"]["DeletionProtectionEnabled"] == {"Ref": "DeletionProtection"}
    assert definition["DeletionPolicy"] == definition["UpdateReplacePolicy"] == "Retain"


def test_every_queue_is_encrypted_and_the_hint_queue_redrives(resources: dict[str, Any]) -> None:
    queues = {k: v for k, v in resources.items() if v["Type"] == "AWS::SQS::Queue"}

    assert set(queues) >= {
        "HintQueue",
        "HintDeadLetterQueue",
        "ReconcilerDeadLetterQueue",
        "StreamNotifierFailureQueue",
        "TaskExitDeadLetterQueue",
    }
    assert all(q["Properties"]["SqsManagedSseEnabled"] is True for q in queues.values())
    redrive = props(resources, "HintQueue")["RedrivePolicy"]
    assert redrive["deadLetterTargetArn"] == {"Fn::GetAtt": ["HintDeadLetterQueue", "Arn"]}
    assert redrive["maxReceiveCount"] >= 1


def test_tables_and_queues_use_only_what_the_local_provisioner_resolves(
    resources: dict[str, Any], template: dict[str, Any]
) -> None:
    # local/wsfleet_local/backend.py creates these from this file; it resolves Ref (to
    # parameters only when they have a Default), GetAtt, Sub and Join, nothing else.
    def walk(value: Any) -> Iterator[tuple[str, Any]]:
        if isinstance(value, dict):
            for key, item in value.items():
                yield key, item
                yield from walk(item)
        elif isinstance(value, list):
            for item in value:
                yield from walk(item)

    parameters = template["Parameters"]
    for definition in resources.values():
        if definition["Type"] not in ("AWS::DynamoDB::Table", "AWS::SQS::Queue"):
            continue
        for key, argument in walk(definition["Properties"]):
            if key.startswith("Fn::"):
                assert key in ("Fn::GetAtt", "Fn::Sub", "Fn::Join"), key
            if key == "Ref" and argument in parameters:
                assert "Default" in parameters[argument], argument


# ============================================================================ functions
FUNCTIONS = {
    "RouterFunction": "router",
    "ReconcilerFunction": "reconciler",
    "StreamNotifierFunction": "stream_notifier",
}


@pytest.mark.parametrize(("logical_id", "folder"), FUNCTIONS.items())
def test_each_function_points_at_a_lambda_handler_in_its_folder(
    resources: dict[str, Any], logical_id: str, folder: str
) -> None:
    function = props(resources, logical_id)
    assert function["CodeUri"] == f"functions/{folder}/"
    assert function["Handler"] == "app.lambda_handler"

    app = ROOT / "functions" / folder / "app.py"
    assert app.is_file(), f"{app} is missing: the template points at no handler"
    tree = ast.parse(app.read_text())
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    names |= {
        t.id
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    assert "lambda_handler" in names


def test_globals_pass_the_shared_settings_to_every_function(template: dict[str, Any]) -> None:
    variables = template["Globals"]["Function"]["Environment"]["Variables"]

    assert variables["CONNECTIONS_TABLE"] == {"Ref": "ConnectionsTable"}
    assert variables["MESSAGES_TABLE"] == {"Ref": "MessagesTable"}
    assert variables["HINT_QUEUE_URL"] == {"Ref": "HintQueue"}
    assert variables["LEASE_SECONDS"] == {"Ref": "LeaseSeconds"}
    assert variables["HEARTBEAT_EVERY"] == {"Ref": "HeartbeatSeconds"}
    assert variables["POWERTOOLS_METRICS_NAMESPACE"] == "wsfleet"
    assert template["Globals"]["Function"]["Runtime"] == "python3.11"
    assert template["Globals"]["Function"]["Tracing"] == "Active"


def test_router_environment(template: dict[str, Any]) -> None:
    env = function_env(template, "RouterFunction")

    assert env["ALLOWED_UPSTREAM_HOSTS"] == {"Ref": "AllowedUpstreamHosts"}
    assert env["ALLOW_INSECURE_WS"] == {"Ref": "AllowInsecureWs"}
    assert env["UPSTREAM_SECRET_PREFIXES"] == {"Ref": "UpstreamSecretPrefix"}
    assert env["POWERTOOLS_SERVICE_NAME"] == {"Fn::Sub": "${AWS::StackName}-router"}


def test_reconciler_environment_and_timeout(template: dict[str, Any]) -> None:
    env = function_env(template, "ReconcilerFunction")

    assert env["RECONCILE_PASS_SECONDS"] == {"Ref": "ReconcilePassSeconds"}
    assert int(env["RECONCILE_PAGE_SIZE"]) > 0
    assert env["CONTROL_QUEUE_PREFIX"] == CTL_PREFIX
    assert env["POWERTOOLS_SERVICE_NAME"] == {"Fn::Sub": "${AWS::StackName}-reconciler"}
    assert props(template["Resources"], "ReconcilerFunction")["Timeout"] == 60


def test_stream_notifier_environment(template: dict[str, Any]) -> None:
    env = function_env(template, "StreamNotifierFunction")

    assert env["CONTROL_QUEUE_PREFIX"] == CTL_PREFIX
    assert env["POWERTOOLS_SERVICE_NAME"] == {"Fn::Sub": "${AWS::StackName}-stream-notifier"}


def test_reconciler_schedule(template: dict[str, Any]) -> None:
    events = props(template["Resources"], "ReconcilerFunction")["Events"]
    (schedule,) = [e["Properties"] for e in events.values() if e["Type"] == "ScheduleV2"]

    assert schedule["ScheduleExpression"] == {"Ref": "ReconcileSchedule"}
    assert schedule["State"] == {"Ref": "ReconcileScheduleState"}
    assert "${AWS::StackName}" in schedule["Name"]["Fn::Sub"]  # unique per stack
    # An invoke the scheduler could not deliver (throttled) is retried a little, and never past
    # one period: a late retry cannot overlap the next scheduled pass.
    assert schedule["RetryPolicy"] == {"MaximumRetryAttempts": 2, "MaximumEventAgeInSeconds": 60}
    dead_letters = {"Fn::GetAtt": ["ReconcilerDeadLetterQueue", "Arn"]}
    assert schedule["DeadLetterConfig"] == {"Arn": dead_letters}
    parameters = template["Parameters"]
    assert parameters["ReconcileSchedule"]["Default"] == "rate(1 minute)"
    assert parameters["ReconcileScheduleState"]["AllowedValues"] == ["ENABLED", "DISABLED"]


def test_task_exit_rule_takes_the_worker_clusters_stopped_containers(
    template: dict[str, Any],
) -> None:
    resources = template["Resources"]
    function = props(resources, "TaskExitFunction")
    (rule,) = [e["Properties"] for e in function["Events"].values()]
    # GIVEN the rule's pattern: this stack's worker cluster, a container STOPPED
    assert rule["Pattern"] == {
        "source": ["aws.ecs"],
        "detail-type": ["ECS Task State Change"],
        "detail": {
            "clusterArn": [{"Fn::GetAtt": ["WorkerCluster", "Arn"]}],
            "containers": {"lastStatus": ["STOPPED"]},
        },
    }
    # THEN the rule's name is what the DLQ's policy lets send, and both DLQs are the one queue
    dead_letters = {"Fn::GetAtt": ["TaskExitDeadLetterQueue", "Arn"]}
    assert rule["DeadLetterConfig"] == {"Arn": dead_letters}
    on_failure = function["EventInvokeConfig"]["DestinationConfig"]["OnFailure"]
    assert on_failure == {"Type": "SQS", "Destination": dead_letters}
    assert rule["RetryPolicy"]["MaximumRetryAttempts"] >= 1
    assert function["EventInvokeConfig"]["MaximumRetryAttempts"] >= 1
    (sender,) = props(resources, "TaskExitDeadLetterQueuePolicy")["PolicyDocument"]["Statement"]
    assert sender["Principal"] == {"Service": "events.amazonaws.com"}
    source = sender["Condition"]["ArnEquals"]["aws:SourceArn"]["Fn::Sub"]
    assert source.endswith(":rule/" + rule["RuleName"]["Fn::Sub"])
    # AND the handler looks for the container the task definition runs
    env = function_env(template, "TaskExitFunction")
    assert env["WORKER_CONTAINER_NAME"] == worker_container(resources)["Name"]
    assert env["POWERTOOLS_SERVICE_NAME"] == {"Fn::Sub": "${AWS::StackName}-task-exit"}
    assert "TaskExitDeadLetterQueueAlarm" in alarms(resources)


def test_task_exit_reads_and_kills_only_worker_items(resources: dict[str, Any]) -> None:
    for action in ("dynamodb:GetItem", "dynamodb:BatchGetItem"):
        assert conditions(resources, "TaskExitRole", action) == [WORKER_ITEMS_ONLY]
    (kill,) = conditions(resources, "TaskExitRole", "dynamodb:UpdateItem")
    assert kill["ForAllValues:StringLike"] == WORKER_ITEMS_ONLY["ForAllValues:StringLike"]
    assert set(kill["ForAllValues:StringEquals"]["dynamodb:Attributes"]) == {
        "pk", "container_runtime_id", "dead_at_ms", "expires_at_ms", "hinted_at_ms",
        "hinted_expiry_ms", "started_at_ms", "task_arn",
    }


def test_stop_notifier_stream_source(template: dict[str, Any]) -> None:
    events = props(template["Resources"], "StreamNotifierFunction")["Events"]
    (source,) = [e["Properties"] for e in events.values() if e["Type"] == "DynamoDB"]

    assert source["Stream"] == {"Fn::GetAtt": ["ConnectionsTable", "StreamArn"]}
    assert source["StartingPosition"] == "LATEST"
    assert source["BisectBatchOnFunctionError"] is True
    assert source["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert source["MaximumRetryAttempts"] >= 1
    assert source["BatchSize"] >= 1
    assert source["DestinationConfig"]["OnFailure"]["Destination"] == {
        "Fn::GetAtt": ["StreamNotifierFailureQueue", "Arn"]
    }
    (only,) = [json.loads(f["Pattern"]) for f in source["FilterCriteria"]["Filters"]]
    assert only == {
        "eventName": ["MODIFY"],
        "dynamodb": {
            "NewImage": {"desired_state": {"S": ["STOPPED"]}},
            "OldImage": {"desired_state": {"S": [{"anything-but": ["STOPPED"]}]}},
        },
    }


# ============================================================================ worker service
def test_task_environment(resources: dict[str, Any]) -> None:
    env = task_env(resources)

    assert env["CONNECTIONS_TABLE"] == {"Ref": "ConnectionsTable"}
    assert env["MESSAGES_TABLE"] == {"Ref": "MessagesTable"}
    assert env["HINT_QUEUE_URL"] == {"Ref": "HintQueue"}
    assert env["LEASE_SECONDS"] == {"Ref": "LeaseSeconds"}
    assert env["HEARTBEAT_EVERY"] == {"Ref": "HeartbeatSeconds"}
    assert env["MAX_CONNECTIONS"] == {"Ref": "MaxConnectionsPerTask"}
    assert env["CONTROL_QUEUE_PREFIX"] == CTL_PREFIX
    assert env["SERVICE_NAME"] == {"Fn::Sub": "${AWS::StackName}-worker"}
    assert env["POWERTOOLS_SERVICE_NAME"] == env["SERVICE_NAME"]
    assert env["POWERTOOLS_METRICS_NAMESPACE"] == "wsfleet"
    assert env["AWS_REGION"] == {"Ref": "AWS::Region"}
    assert float(env["DRAIN_TIMEOUT_SECONDS"]) > 0


def test_every_variable_the_stack_sets_is_one_the_code_reads(
    template: dict[str, Any], resources: dict[str, Any]
) -> None:
    known = {v.name for v in ENVIRONMENT} | {name for name, *_ in WORKER_ENVIRONMENT}
    known |= {
        "POWERTOOLS_SERVICE_NAME",
        "POWERTOOLS_METRICS_NAMESPACE",
        "POWERTOOLS_LOG_LEVEL",
        "AWS_REGION",
        "AWS_ENDPOINT_URL",  # read by boto3 itself; declared for `sam local invoke` only
    }
    passed = set(task_env(resources))
    for logical_id in FUNCTIONS:
        passed |= set(function_env(template, logical_id))

    assert passed - known == set()


def test_endpoint_variable_exists_only_when_local_endpoint_is_given(
    template: dict[str, Any],
) -> None:
    # GIVEN the Globals declaration of AWS_ENDPOINT_URL
    declared = template["Globals"]["Function"]["Environment"]["Variables"]["AWS_ENDPOINT_URL"]
    condition = template["Conditions"]["HasLocalEndpoint"]

    # THEN it is the parameter when given and AWS::NoValue (no variable) otherwise, and the
    # parameter defaults to empty, so a deployed stack talks to the real AWS endpoints
    assert declared == {
        "Fn::If": ["HasLocalEndpoint", {"Ref": "LocalEndpointUrl"}, {"Ref": "AWS::NoValue"}]
    }
    assert condition == {"Fn::Not": [{"Fn::Equals": [{"Ref": "LocalEndpointUrl"}, ""]}]}
    assert template["Parameters"]["LocalEndpointUrl"]["Default"] == ""
    for env in ("default", "dev", "prod"):
        assert "LocalEndpointUrl" not in _samconfig_parameters()[env]


def test_stop_timeout_outlasts_the_drain(resources: dict[str, Any]) -> None:
    container = worker_container(resources)

    assert container["StopTimeout"] > float(task_env(resources)["DRAIN_TIMEOUT_SECONDS"])


def test_health_check_reads_the_file_the_worker_writes(resources: dict[str, Any]) -> None:
    container = worker_container(resources)

    assert container["HealthCheck"]["Command"] == ["CMD", "python", "-m", "wsfleet_worker.health"]
    settings_default = next(v.default for v in ENVIRONMENT if v.name == "HEALTH_FILE")
    assert task_env(resources)["HEALTH_FILE"] == settings_default == "/tmp/wsfleet-worker.health"
    # The root filesystem is read-only; the health file's directory is a writable volume.
    assert container["ReadonlyRootFilesystem"] is True
    tmp = {"SourceVolume": "tmp", "ContainerPath": "/tmp", "ReadOnly": False}
    assert tmp in container["MountPoints"]


def test_service_is_private_autoscaled_and_rolls_safely(resources: dict[str, Any]) -> None:
    service = props(resources, "WorkerService")

    assert "DesiredCount" not in service
    assert service["LaunchType"] == "FARGATE"
    network = service["NetworkConfiguration"]["AwsvpcConfiguration"]
    assert network["AssignPublicIp"] == "DISABLED"
    assert network["Subnets"] == {"Ref": "SubnetIds"}
    deployment = service["DeploymentConfiguration"]
    assert deployment["MinimumHealthyPercent"] == 100
    assert deployment["MaximumPercent"] == 200
    assert deployment["DeploymentCircuitBreaker"] == {"Enable": True, "Rollback": True}
    assert service["ServiceName"] == task_env(resources)["SERVICE_NAME"]
    assert "SecurityGroupIngress" not in props(resources, "WorkerSecurityGroup")


def test_task_has_separate_execution_and_task_roles(resources: dict[str, Any]) -> None:
    task = props(resources, "WorkerTaskDefinition")

    assert task["ExecutionRoleArn"] == {"Fn::GetAtt": ["WorkerExecutionRole", "Arn"]}
    assert task["TaskRoleArn"] == {"Fn::GetAtt": ["WorkerTaskRole", "Arn"]}
    assert task["RequiresCompatibilities"] == ["FARGATE"]
    log = worker_container(resources)["LogConfiguration"]
    assert log["LogDriver"] == "awslogs"
    assert log["Options"]["awslogs-group"] == {"Ref": "WorkerLogGroup"}
    assert props(resources, "WorkerLogGroup")["RetentionInDays"] == {"Ref": "LogRetentionDays"}


def test_autoscaling_tracks_the_metric_the_worker_emits(resources: dict[str, Any]) -> None:
    target = props(resources, "WorkerScalableTarget")
    policy = props(resources, "WorkerScalingPolicy")["TargetTrackingScalingPolicyConfiguration"]

    assert target["MinCapacity"] == {"Ref": "MinTasks"}
    assert target["MaxCapacity"] == {"Ref": "MaxTasks"}
    assert policy["TargetValue"] == {"Ref": "TargetConnectionsPerTask"}
    metric = policy["CustomizedMetricSpecification"]
    assert (metric["Namespace"], metric["MetricName"], metric["Statistic"]) == (
        "wsfleet",
        "ActiveConnections",
        "Average",
    )
    service = task_env(resources)["SERVICE_NAME"]
    assert metric["Dimensions"] == [{"Name": "ServiceName", "Value": service}]
    assert policy["ScaleInCooldown"] > float(task_env(resources)["DRAIN_TIMEOUT_SECONDS"])


def test_dockerfile_runs_the_worker_as_the_task_expects() -> None:
    dockerfile = (ROOT / "worker" / "Dockerfile").read_text()

    assert 'ENTRYPOINT ["python", "-m", "wsfleet_worker"]' in dockerfile
    assert 'CMD ["python", "-m", "wsfleet_worker.health"]' in dockerfile
    assert "HEALTH_FILE=/tmp/wsfleet-worker.health" in dockerfile
    assert re.search(r"^USER 10001:10001$", dockerfile, re.MULTILINE)
    # Both stages on one base, python:3.11-slim unless the PYTHON_BASE build argument says
    # otherwise (a stand-in where no registry is reachable: docs/sam-local.md).
    assert re.findall(r"^ARG PYTHON_BASE=(\S+)$", dockerfile, re.MULTILINE) == ["python:3.11-slim"]
    assert re.findall(r"^FROM (\S+)", dockerfile, re.MULTILINE) == ["${PYTHON_BASE}"] * 2


# ============================================================================ IAM
EXPECTED_GRANTS = {
    "RouterRole": {
        ("dynamodb:GetItem", TABLE),
        ("dynamodb:BatchGetItem", TABLE),
        ("dynamodb:PutItem", TABLE),
        ("dynamodb:UpdateItem", TABLE),
        ("dynamodb:Query", INDEX[STATE_INDEX]),
        ("sqs:SendMessage", "HintQueue.Arn"),
    },
    "ReconcilerRole": {
        ("dynamodb:Query", INDEX[OWNER_INDEX]),
        ("dynamodb:Query", INDEX[UNOWNED_INDEX]),
        ("dynamodb:Query", INDEX[WORKERS_INDEX]),
        ("dynamodb:GetItem", TABLE),
        ("dynamodb:BatchGetItem", TABLE),
        ("dynamodb:UpdateItem", TABLE),
        ("dynamodb:DeleteItem", TABLE),
        ("dynamodb:PutItem", TABLE),  # the fleet view only
        ("sqs:SendMessage", "HintQueue.Arn"),
        ("sqs:ListQueues", "*"),
        ("sqs:GetQueueAttributes", CTL_QUEUES),
        ("sqs:ListQueueTags", CTL_QUEUES),
        ("sqs:DeleteQueue", CTL_QUEUES),
        ("sqs:SendMessage", "ReconcilerDeadLetterQueue.Arn"),  # Lambda's async DLQ
    },
    "StreamNotifierRole": {
        ("dynamodb:GetItem", TABLE),
        ("dynamodb:DescribeStream", "ConnectionsTable.StreamArn"),
        ("dynamodb:GetRecords", "ConnectionsTable.StreamArn"),
        ("dynamodb:GetShardIterator", "ConnectionsTable.StreamArn"),
        ("dynamodb:ListStreams", "${ConnectionsTable.Arn}/stream/*"),
        ("sqs:SendMessage", CTL_QUEUES),
        ("sqs:SendMessage", "StreamNotifierFailureQueue.Arn"),
    },
    "TaskExitRole": {
        ("dynamodb:Query", INDEX[WORKERS_INDEX]),
        ("dynamodb:Query", INDEX[OWNER_INDEX]),
        ("dynamodb:GetItem", TABLE),
        ("dynamodb:BatchGetItem", TABLE),
        ("dynamodb:UpdateItem", TABLE),
        ("sqs:SendMessage", "HintQueue.Arn"),
        ("sqs:SendMessage", "TaskExitDeadLetterQueue.Arn"),  # on-failure destination
    },
    "WorkerTaskRole": {
        # No DeleteItem: a worker retires its item; the reconciler deletes it later.
        *{(f"dynamodb:{a}", TABLE) for a in ("GetItem", "PutItem", "UpdateItem", "BatchGetItem")},
        ("dynamodb:Query", INDEX[OWNER_INDEX]),  # its sweep
        ("dynamodb:BatchWriteItem", "MessagesTable.Arn"),
        ("dynamodb:PutItem", "MessagesTable.Arn"),
        ("dynamodb:Query", "MessagesTable.Arn"),  # highest stored seq at a live-only takeover
        # Only what the worker calls (HintPoller, HintSender, ControlChannel): no
        # GetQueueAttributes, GetQueueUrl or SetQueueAttributes (issue #11, finding 7).
        *{
            (f"sqs:{a}", "HintQueue.Arn")
            for a in ("ReceiveMessage", "DeleteMessage", "ChangeMessageVisibility", "SendMessage")
        },
        *{
            (f"sqs:{a}", CTL_QUEUES)
            for a in (
                "CreateQueue", "TagQueue", "DeleteQueue", "ReceiveMessage", "DeleteMessage",
                "SendMessage",  # rebalancing hand-offs to a peer's control queue
            )
        },
    },
}


@pytest.mark.parametrize("role", EXPECTED_GRANTS)
def test_each_component_gets_exactly_the_actions_it_calls(
    resources: dict[str, Any], role: str
) -> None:
    assert grants(resources, role) == EXPECTED_GRANTS[role]


@pytest.mark.parametrize(
    ("role", "action"),
    [
        ("ReconcilerRole", "dynamodb:DeleteItem"),
        ("StreamNotifierRole", "dynamodb:GetItem"),
    ],
)
def test_item_deletes_and_notifier_reads_are_limited_to_worker_items(
    resources: dict[str, Any], role: str, action: str
) -> None:
    assert conditions(resources, role, action) == [WORKER_ITEMS_ONLY]


def test_router_writes_only_connection_items_and_reads_workers_only_for_the_view(
    resources: dict[str, Any],
) -> None:
    for action in ("dynamodb:PutItem", "dynamodb:UpdateItem"):
        assert conditions(resources, "RouterRole", action) == [CONNECTION_ITEMS_ONLY]
    for action in ("dynamodb:GetItem", "dynamodb:BatchGetItem"):
        assert conditions(resources, "RouterRole", action) == [
            CONNECTION_ITEMS_ONLY, WORKER_ITEMS_ONLY,
        ]


def test_the_throttle_alarm_covers_the_table_and_every_index(resources: dict[str, Any]) -> None:
    alarm = alarms(resources)["ConnectionsTableThrottleAlarm"]
    stats = [m for m in alarm["Metrics"] if "MetricStat" in m]
    watched = set()
    for query in stats:
        metric = query["MetricStat"]["Metric"]
        dims = {d["Name"]: d["Value"] for d in metric["Dimensions"]}
        assert dims.pop("TableName") == {"Ref": "ConnectionsTable"}
        watched.add((metric["MetricName"], dims.get("GlobalSecondaryIndexName")))
        assert query["ReturnData"] is False
    assert watched == {("ReadThrottleEvents", None), ("WriteThrottleEvents", None)} | {
        ("WriteThrottleEvents", name) for name in INDEXES
    }
    assert len(stats) <= 10  # CloudWatch's limit of metrics per alarm
    (total,) = [m for m in alarm["Metrics"] if "Expression" in m]
    assert total["ReturnData"] is True
    assert sorted(re.findall(r"FILL\((\w+), 0\)", total["Expression"])) == sorted(
        q["Id"] for q in stats
    )


@pytest.mark.parametrize(
    ("function", "role"),
    [
        ("RouterFunction", "RouterRole"),
        ("ReconcilerFunction", "ReconcilerRole"),
        ("StreamNotifierFunction", "StreamNotifierRole"),
    ],
)
def test_functions_use_their_own_role_and_log_only_to_their_log_group(
    resources: dict[str, Any], function: str, role: str
) -> None:
    assert props(resources, function)["Role"] == {"Fn::GetAtt": [role, "Arn"]}
    assert "Policies" not in props(resources, function)  # no SAM-managed role, no managed policies
    name = props(resources, function)["FunctionName"]["Fn::Sub"]  # ${AWS::StackName}-<name>
    (logs,) = [s for s in statements(resources, role) if s["Action"][0].startswith("logs:")]
    assert logs["Resource"]["Fn::Sub"].endswith(f":log-group:/aws/lambda/{name}:*")
    group = next(
        r
        for r in resources.values()
        if r["Type"] == "AWS::Logs::LogGroup"
        and r["Properties"]["LogGroupName"] == {"Fn::Sub": f"/aws/lambda/${{{function}}}"}
    )
    assert group["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}


def test_wildcard_resources_only_where_aws_requires_them(resources: dict[str, Any]) -> None:
    # X-Ray writes, ECR login and ListQueues have no resource type to scope to.
    allowed = {
        "xray:PutTraceSegments",
        "xray:PutTelemetryRecords",
        "ecr:GetAuthorizationToken",
        "sqs:ListQueues",
    }
    for logical_id, definition in resources.items():
        if definition["Type"] != "AWS::IAM::Role":
            continue
        for statement in statements(resources, logical_id):
            actions = as_list(statement["Action"])
            assert all("*" not in action for action in actions), (logical_id, actions)
            if statement["Resource"] == "*":
                assert set(actions) <= allowed, (logical_id, actions)


def test_execution_role_pulls_only_the_worker_repository(resources: dict[str, Any]) -> None:
    (pull,) = [
        s for s in statements(resources, "WorkerExecutionRole") if s["Sid"] == "PullWorkerImage"
    ]

    assert sorted(pull["Action"]) == [
        "ecr:BatchCheckLayerAvailability",
        "ecr:BatchGetImage",
        "ecr:GetDownloadUrlForLayer",
    ]
    assert pull["Resource"]["Fn::Sub"][0].endswith(":repository/${RepositoryName}")


# ============================================================================ API
def test_api_routes_match_the_router_events_and_follow_api_auth(resources: dict[str, Any]) -> None:
    api = props(resources, "Api")
    events = props(resources, "RouterFunction")["Events"].values()
    routes = {(e["Properties"]["Path"], e["Properties"]["Method"].lower()) for e in events}
    paths = api["DefinitionBody"]["paths"]

    assert {(path, method) for path, methods in paths.items() for method in methods} == routes
    expected = {"Fn::If": ["UseApiKeyAuth", [{"api_key": []}], [{"sigv4": []}]]}
    assert all(methods[m]["security"] == expected for methods in paths.values() for m in methods)
    schemes = api["DefinitionBody"]["components"]["securitySchemes"]
    assert schemes["sigv4"]["x-amazon-apigateway-authtype"] == "awsSigv4"
    assert api["MergeDefinitions"] is True
    assert api["AccessLogSetting"]["DestinationArn"] == {"Fn::GetAtt": ["ApiAccessLogGroup", "Arn"]}
    assert json.loads(api["AccessLogSetting"]["Format"])  # structured (JSON) access logs
    assert api["TracingEnabled"] is True
    (throttle,) = api["MethodSettings"]
    assert throttle["ThrottlingRateLimit"] > 0 and throttle["ThrottlingBurstLimit"] > 0
    for usage in ("ApiUsagePlan", "ApiKey", "ApiUsagePlanKey"):
        assert resources[usage]["Condition"] == "UseApiKeyAuth"


# ============================================================================ alarms, dashboard
def alarms(resources: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        k: v["Properties"] for k, v in resources.items() if v["Type"] == "AWS::CloudWatch::Alarm"
    }


def test_alarms_notify_the_optional_topic(resources: dict[str, Any]) -> None:
    expected = {"Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]}

    assert len(alarms(resources)) >= 9
    for alarm in alarms(resources).values():
        assert alarm["AlarmActions"] == alarm["OKActions"] == expected


def test_metric_alarms_use_the_dimensions_the_code_emits(
    template: dict[str, Any], resources: dict[str, Any]
) -> None:
    orphan = alarms(resources)["OldestOrphanAgeAlarm"]
    (age,) = [m["MetricStat"]["Metric"] for m in orphan["Metrics"] if "MetricStat" in m]
    assert (age["Namespace"], age["MetricName"]) == ("wsfleet", "OldestOrphanAgeMs")
    reconciler_service = function_env(template, "ReconcilerFunction")["POWERTOOLS_SERVICE_NAME"]
    assert age["Dimensions"] == [{"Name": "service", "Value": reconciler_service}]
    (expression,) = [m["Expression"] for m in orphan["Metrics"] if "Expression" in m]
    assert expression == {"Fn::Sub": "age / (2000 * ${LeaseSeconds})"}  # above 2 x lease
    assert orphan["Threshold"] == 1

    lost = alarms(resources)["WorkerLeaseLostAlarm"]
    assert (lost["Namespace"], lost["MetricName"]) == ("wsfleet", "LeaseLost")
    service = task_env(resources)["SERVICE_NAME"]
    assert lost["Dimensions"] == [{"Name": "ServiceName", "Value": service}]


def test_dashboard_body_is_json_once_substituted(resources: dict[str, Any]) -> None:
    body, _variables = props(resources, "Dashboard")["DashboardBody"]["Fn::Sub"]

    # the sink alarms' ARNs (a Sub variable) are empty without a stream sink
    parsed = json.loads(re.sub(r"\$\{[^}]+\}", "1", body.replace("${SinkAlarmArns}", "")))
    assert len(parsed["widgets"]) >= 6


# ============================================================================ parameters
def _samconfig_parameters() -> dict[str, dict[str, str]]:
    config = tomllib.loads((ROOT / "samconfig.toml").read_text())
    found = {}
    for env in ("default", "dev", "prod"):
        overrides = config[env]["deploy"]["parameters"]["parameter_overrides"]
        found[env] = {k: v.strip('"') for k, v in (item.split("=", 1) for item in overrides)}
    return found


# Parameters without a Default, which every environment must give, and Stage, which names it.
REQUIRED_IN_EVERY_ENV = {"Stage", "WorkerImageUri", "VpcId", "SubnetIds"}


@pytest.mark.parametrize("env", ["default", "dev", "prod"])
def test_samconfig_env_lists_only_differences_and_is_consistent(
    template: dict[str, Any], env: str
) -> None:
    # GIVEN an environment of samconfig.toml and the template's defaults
    config = tomllib.loads((ROOT / "samconfig.toml").read_text())[env]["deploy"]["parameters"]
    pinned = _samconfig_parameters()[env]
    defaults = {
        name: str(spec["Default"])
        for name, spec in template["Parameters"].items()
        if "Default" in spec
    }

    # THEN it names the required parameters and otherwise only values that differ from the
    # Default: a parameter pinned to its Default would be re-sent by every `sam deploy` and
    # revert an operator's change of it (left out, SAM sends UsePreviousValue on updates).
    assert set(pinned) >= REQUIRED_IN_EVERY_ENV
    assert set(pinned) <= set(template["Parameters"])
    for name, value in pinned.items():
        if name not in REQUIRED_IN_EVERY_ENV:
            assert value != defaults.get(name), f"{env}: {name} repeats its template Default"
    assert config["capabilities"] == "CAPABILITY_IAM"
    assert config["resolve_s3"] is True
    assert "confirm_changeset" in config

    # AND what the stack is created with (Default unless pinned) is consistent
    values = {**defaults, **pinned}
    assert values["ReconcileSchedule"] == "rate(1 minute)"
    assert values["ReconcileScheduleState"] in ("ENABLED", "DISABLED")
    lease, heartbeat = float(values["LeaseSeconds"]), float(values["HeartbeatSeconds"])
    assert lease >= 2 * heartbeat
    assert float(values["ReconcilePassSeconds"]) < lease - heartbeat
    assert int(values["MinTasks"]) <= int(values["MaxTasks"])
    assert int(values["TargetConnectionsPerTask"]) < int(values["MaxConnectionsPerTask"])


@pytest.mark.parametrize(
    ("expression", "accepted"),
    [
        ("rate(1 minute)", True),
        ("rate(5 minutes)", True),
        ("rate(2 hours)", True),
        ("cron(0/5 * * * ? *)", True),
        ("rate(0 minutes)", False),
        ("rate(1 minute", False),
        ("every 5 minutes", False),
        ("at(2030-01-01T00:00:00)", False),
        ("", False),
    ],
)
def test_reconcile_schedule_allowed_pattern(
    template: dict[str, Any], expression: str, accepted: bool
) -> None:
    # CloudFormation anchors AllowedPattern to the whole value, as fullmatch does.
    pattern = template["Parameters"]["ReconcileSchedule"]["AllowedPattern"]
    assert (re.fullmatch(pattern, expression) is not None) is accepted


def test_template_defaults_are_consistent(template: dict[str, Any]) -> None:
    p = {k: v.get("Default") for k, v in template["Parameters"].items()}

    assert p["LeaseSeconds"] >= 2 * p["HeartbeatSeconds"]
    assert p["ReconcilePassSeconds"] < p["LeaseSeconds"] - p["HeartbeatSeconds"]
    assert p["MinTasks"] <= p["MaxTasks"]
    assert p["TargetConnectionsPerTask"] < p["MaxConnectionsPerTask"]


# ============================================================================ docs
def test_deploy_doc_covers_every_parameter_alarm_and_output(template: dict[str, Any]) -> None:
    doc = (ROOT / "docs" / "deploy.md").read_text()

    for parameter in template["Parameters"]:
        assert f"`{parameter}`" in doc, parameter
    for alarm in alarms(template["Resources"]).values():
        suffix = alarm["AlarmName"]["Fn::Sub"].removeprefix("${AWS::StackName}")
        assert f"`<stack>{suffix}`" in doc, suffix
    for output in template["Outputs"]:
        assert f"`{output}`" in doc, output


# ============================================================== worker write limits (issue #11)
#: Attributes the worker may write, per item kind. tests/integration/test_worker_iam_contract.py
#: runs every worker-side LeaseStore write against the moto server and checks the attribute
#: names of each request against these lists, so the three (store, test, template) move together.
WORKER_CONNECTION_ATTRIBUTES = {
    "pk", "desired_state", "expires_at", "failure_count", "failure_seq", "failure_since_ms",
    "gap_frames", "hinted_at_ms", "hinted_since_ms", "last_error", "last_seq", "lease_epoch",
    "lease_owner", "rebalanced_at_ms", "resume_gaps", "state_shard", "stop_reason", "unowned_shard",
    "unowned_since_ms", "updated_at_ms",
    # at-least-once sinks: the send limit and replay totals (wsfleet_worker.checkpoint)
    "sent_limit", "replayed_takeovers", "replayed_frames", "replayed_from_seq", "replayed_to_seq",
}
WORKER_ITEM_ATTRIBUTES = {
    "pk", "capacity", "connection_count", "container_runtime_id", "control_queue_url",
    "dead_at_ms", "expires_at_ms", "heartbeat_at_ms", "started_at_ms", "task_arn", "worker_id",
    "worker_index",
}


def worker_write_limits(resources: Mapping[str, Any]) -> dict[str, set[str]]:
    """Leading-key pattern -> attributes the worker role may write under it (Put/UpdateItem)."""
    limits: dict[str, set[str]] = {}
    for statement in statements(resources, "WorkerTaskRole"):
        actions = set(as_list(statement["Action"]))
        if not actions & {"dynamodb:PutItem", "dynamodb:UpdateItem"}:
            continue
        if _resource_key(statement["Resource"]) != TABLE:
            continue
        condition = statement.get("Condition") or {}
        keys = condition["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
        attributes = condition["ForAllValues:StringEquals"]["dynamodb:Attributes"]
        for key in keys:
            limits[key] = set(attributes)
    return limits


def test_worker_writes_to_the_connections_table_are_limited_by_key_and_attribute(
    resources: dict[str, Any],
) -> None:
    # Every Put/UpdateItem grant on the table carries both conditions (a statement without
    # them would lift the limit for everything), and ws_url is never writable by the worker.
    limits = worker_write_limits(resources)
    assert limits == {"CONN#*": WORKER_CONNECTION_ATTRIBUTES, "WORKER#*": WORKER_ITEM_ATTRIBUTES}
    for key in ("ws_url", "resume", "created_at_ms"):
        assert key not in limits["CONN#*"]
    # the reconciler's hint claim on a worker item is not the worker's to write
    assert "hinted_expiry_ms" not in limits["WORKER#*"]
    put_on_connections = [
        s for s in statements(resources, "WorkerTaskRole")
        if "dynamodb:PutItem" in as_list(s["Action"]) and _resource_key(s["Resource"]) == TABLE
    ]
    assert all(
        s["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"] == ["WORKER#*"]
        for s in put_on_connections
    )


def test_control_queues_accept_only_the_notifier_and_peers(resources: dict[str, Any]) -> None:
    # The worker sets the queue policy from this variable at CreateQueue; the notifier sends
    # STOP and peers (the worker role) send rebalancing hand-offs; the reconciler only lists
    # and deletes control queues.
    assert task_env(resources)["CONTROL_QUEUE_SENDER_ARNS"] == {
        "Fn::Join": [",", [
            {"Fn::GetAtt": ["StreamNotifierRole", "Arn"]},
            {"Fn::GetAtt": ["WorkerTaskRole", "Arn"]},
        ]]
    }
    senders = {
        role for role in EXPECTED_GRANTS if ("sqs:SendMessage", CTL_QUEUES) in EXPECTED_GRANTS[role]
    }
    assert senders == {"StreamNotifierRole", "WorkerTaskRole"}


# ================================================== credentials by reference (issue #13)
SM_PREFIX = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:wsfleet/"
SSM_PREFIX = "arn:aws:ssm:eu-west-1:123456789012:parameter/wsfleet/"
KMS_KEY = "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
SECRET_ACTIONS = {"secretsmanager:GetSecretValue", "ssm:GetParameter", "ssm:GetParameters"}


def secret_grants(resources: Mapping[str, Any], **parameters: str) -> dict[str, Any]:
    """Action -> resolved Resource list (and the kms statement's condition) of every statement
    of every role that touches secrets, SSM or KMS, as deployed with ``parameters``."""
    found: dict[str, Any] = {}
    for logical_id, definition in resources.items():
        if definition["Type"] != "AWS::IAM::Role":
            continue
        for statement in statements(resources, logical_id, **parameters):
            for action in as_list(statement["Action"]):
                if action.split(":")[0] in ("secretsmanager", "ssm", "kms"):
                    assert logical_id == "WorkerTaskRole", (logical_id, action)
                    found[action] = (
                        as_list(resolver(**parameters).resolve(statement["Resource"])),
                        resolver(**parameters).resolve(statement.get("Condition")),
                    )
    return found


def test_without_a_secret_prefix_no_role_may_read_any_secret(
    template: dict[str, Any], resources: dict[str, Any]
) -> None:
    # GIVEN the defaults (UpstreamSecretPrefix empty), even with a KMS key given
    assert template["Parameters"]["UpstreamSecretPrefix"]["Default"] == ""
    assert template["Parameters"]["UpstreamSecretKmsKeyArn"]["Default"] == ""
    # THEN the worker role has no secret policy at all: the If leaves AWS::NoValue
    assert secret_grants(resources) == {}
    assert secret_grants(resources, UpstreamSecretKmsKeyArn=KMS_KEY) == {}
    names = [p["PolicyName"] for p in resolver().resolve_conditions(
        props(resources, "WorkerTaskRole")["Policies"])]
    assert names == ["worker"]
    # AND the raw template spells it as a conditional policy
    conditional = [
        p for p in props(resources, "WorkerTaskRole")["Policies"] if "Fn::If" in p
    ]
    (policy,) = conditional
    assert policy["Fn::If"][0] == "HasUpstreamSecrets"
    assert policy["Fn::If"][2] == {"Ref": "AWS::NoValue"}
    assert template["Conditions"]["HasUpstreamSecrets"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "UpstreamSecretPrefix"}, ""]}]
    }


@pytest.mark.parametrize(
    ("prefix", "resources_granted"),
    [
        (SM_PREFIX, [SM_PREFIX + "*"]),
        (SSM_PREFIX, [SSM_PREFIX + "*"]),
        (f"{SM_PREFIX},{SSM_PREFIX}", [SM_PREFIX + "*", SSM_PREFIX + "*"]),
    ],
)
def test_with_a_secret_prefix_the_worker_reads_exactly_that_prefix(
    resources: dict[str, Any], prefix: str, resources_granted: list[str]
) -> None:
    # GIVEN a stack deployed with UpstreamSecretPrefix set, without a KMS key
    grants_ = secret_grants(resources, UpstreamSecretPrefix=prefix)
    # THEN the worker may read the prefixes (and nothing else), and decrypt with no key
    assert set(grants_) == SECRET_ACTIONS
    for action in SECRET_ACTIONS:
        assert grants_[action] == (resources_granted, None)
    # AND with a customer managed key it may decrypt with that key, via those services only
    grants_ = secret_grants(resources, UpstreamSecretPrefix=prefix, UpstreamSecretKmsKeyArn=KMS_KEY)
    assert set(grants_) == SECRET_ACTIONS | {"kms:Decrypt"}
    assert grants_["kms:Decrypt"] == (
        [KMS_KEY],
        {"StringEquals": {"kms:ViaService": [
            "secretsmanager.eu-west-1.amazonaws.com", "ssm.eu-west-1.amazonaws.com",
        ]}},
    )


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        ("", True),
        (SM_PREFIX, True),
        (SSM_PREFIX, True),
        (f"{SM_PREFIX},{SSM_PREFIX}", True),
        ("arn:aws:secretsmanager:eu-west-1:123456789012:secret:wsfleet-feed", True),
        ("arn:aws-cn:ssm:cn-north-1:123456789012:parameter/a", True),
        ("arn:aws:secretsmanager:eu-west-1:123456789012:secret:", False),  # every secret
        ("arn:aws:ssm:eu-west-1:123456789012:parameter/", False),  # every parameter
        (SM_PREFIX + "*", False),  # no wildcards
        ("arn:aws:secretsmanager:eu-west-1:*:secret:wsfleet/", False),
        ("arn:aws:s3:::bucket/", False),
        (f"{SM_PREFIX}, {SSM_PREFIX}", False),  # no spaces
        (f"{SM_PREFIX},", False),
        ("wsfleet/", False),
    ],
)
def test_secret_prefix_allowed_pattern(
    template: dict[str, Any], value: str, accepted: bool
) -> None:
    pattern = template["Parameters"]["UpstreamSecretPrefix"]["AllowedPattern"]
    assert (re.fullmatch(pattern, value) is not None) is accepted


@pytest.mark.parametrize(
    "ref",
    [
        SM_PREFIX + "feed-AbCdEf",
        SM_PREFIX + "team/feed-AbCdEf",
        SSM_PREFIX + "feed",
        "arn:aws:secretsmanager:eu-west-1:123456789012:secret:wsfleetx/feed-AbCdEf",
        "arn:aws:secretsmanager:eu-west-1:123456789012:secret:other/feed-AbCdEf",
        "arn:aws:ssm:eu-west-1:123456789012:parameter/other/feed",
        "arn:aws:secretsmanager:us-east-1:123456789012:secret:wsfleet/feed-AbCdEf",
    ],
)
def test_the_router_accepts_a_reference_exactly_when_the_worker_role_may_read_it(
    resources: dict[str, Any], ref: str
) -> None:
    # GIVEN the router's setting and the worker's policy from the same parameter value
    prefix = f"{SM_PREFIX},{SSM_PREFIX}"
    (patterns, _condition) = secret_grants(resources, UpstreamSecretPrefix=prefix)[
        "secretsmanager:GetSecretValue"
    ]
    setting = tuple(p.strip() for p in prefix.split(","))  # how Settings reads the variable
    try:
        parse_upstream_options(
            {"credential": {"ref": ref, "header": "Authorization"}}, secret_prefixes=setting
        )
        accepted = True
    except InvalidUpstreamOptions:
        accepted = False
    # THEN what the router lets through is what IAM lets the worker read, and nothing more
    assert accepted is any(fnmatch.fnmatchcase(ref, p) for p in patterns)


def test_the_reconciler_puts_only_the_fleet_view(resources: dict[str, Any]) -> None:
    assert conditions(resources, "ReconcilerRole", "dynamodb:PutItem") == [
        {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [FLEET_VIEW_PK]}}
    ]


def test_rebalancing_parameters_reach_the_reconciler_and_the_worker(
    template: dict[str, Any], resources: dict[str, Any]
) -> None:
    reconciler, worker = function_env(template, "ReconcilerFunction"), task_env(resources)
    for name, parameter in (("REBALANCE", "Rebalance"), ("REBALANCE_SECONDS", "RebalanceSeconds"),
                            ("REBALANCE_BAND_PERCENT", "RebalanceBandPercent")):
        assert reconciler[name] == worker[name] == {"Ref": parameter}
    assert reconciler["REBALANCE_MAX_MOVES"] == {"Ref": "RebalanceMaxMoves"}
    assert worker["REBALANCE_DWELL_SECONDS"] == {"Ref": "RebalanceDwellSeconds"}
    assert worker["REBALANCE_PLACEMENT_SECONDS"] == {"Ref": "RebalancePlacementSeconds"}
    defaults = {k: str(v.get("Default")) for k, v in template["Parameters"].items()}
    settings = Settings()
    assert defaults["Rebalance"] == str(settings.rebalance).lower()
    assert float(defaults["RebalanceSeconds"]) == settings.rebalance_seconds
    assert int(defaults["RebalanceMaxMoves"]) == settings.rebalance_max_moves
    assert float(defaults["RebalanceDwellSeconds"]) == settings.rebalance_dwell_seconds
    assert float(defaults["RebalanceBandPercent"]) == settings.rebalance_band_percent
    assert float(defaults["RebalancePlacementSeconds"]) == settings.rebalance_placement_seconds
