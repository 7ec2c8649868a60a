"""template.yaml's frame sink: MessageSink / MessageStreamArn reach the worker, the worker role
may write exactly the chosen sink, and a stack that sets nothing is unchanged (dynamodb)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import test_template_contract
from test_template_contract import props, resolver, statements, task_env

from wsfleet.settings import Settings
from wsfleet.sinks.select import SINK_KINDS

STREAM_ARN = "arn:aws:kinesis:eu-west-1:123456789012:stream/market-frames"
DELIVERY_ARN = "arn:aws:firehose:eu-west-1:123456789012:deliverystream/frames-to-s3"

# The template fixtures of test_template_contract; binding them here is what makes pytest find
# them in this module.
template, resources = test_template_contract.template, test_template_contract.resources


def frame_grants(resources: dict[str, Any], **parameters: str) -> dict[str, Any]:
    """Action -> Resource (If evaluated) of the worker role's frame-writing statements."""
    found = {}
    for statement in statements(resources, "WorkerTaskRole", **parameters):
        for action in statement["Action"]:
            if action.split(":")[0] in ("kinesis", "firehose") or action in (
                "dynamodb:BatchWriteItem",
            ):
                found[action] = resolver(**parameters).resolve_conditions(statement["Resource"])
    return found


def worker_env(resources: dict[str, Any], **parameters: str) -> dict[str, Any]:
    return resolver(**parameters).resolve_conditions(task_env(resources))


def created(resources: dict[str, Any], logical_id: str, **parameters: str) -> bool:
    condition = resources[logical_id].get("Condition")
    return condition is None or resolver(**parameters).condition(condition)


def test_a_stack_that_sets_nothing_keeps_the_messages_table(template, resources):
    assert template["Parameters"]["MessageSink"]["Default"] == "dynamodb"
    env = worker_env(resources)
    # no sink variable is declared: the worker's own default is the messages table
    assert not {"MESSAGE_SINK", "MESSAGE_STREAM", "MESSAGE_KINESIS_AGGREGATION"} & set(env)
    assert Settings.from_env({}, hint_queue_url="").message_sink == "dynamodb"
    assert worker_env(resources, MessageSink="kinesis")["MESSAGE_SINK"] == {"Ref": "MessageSink"}
    assert frame_grants(resources) == {"dynamodb:BatchWriteItem": {"Fn::GetAtt": [
        "MessagesTable", "Arn"]}}  # fmt: skip
    assert not created(resources, "FrameStream")
    assert not created(resources, "FrameStreamThrottledAlarm")


def test_kinesis_without_a_stream_gets_its_own_and_may_write_only_that(resources):
    assert created(resources, "FrameStream", MessageSink="kinesis")
    stream = props(resources, "FrameStream")
    assert stream["StreamModeDetails"] == {"StreamMode": "ON_DEMAND"}
    assert stream["StreamEncryption"]["EncryptionType"] == "KMS"
    own = {"Fn::GetAtt": ["FrameStream", "Arn"]}
    assert frame_grants(resources, MessageSink="kinesis") == {"kinesis:PutRecords": own}
    assert worker_env(resources, MessageSink="kinesis")["MESSAGE_STREAM"] == own
    for alarm in ("FrameStreamThrottledAlarm", "FrameStreamIteratorAgeAlarm"):
        assert created(resources, alarm, MessageSink="kinesis")
    assert not created(resources, "FrameDeliveryThrottledAlarm", MessageSink="kinesis")


def test_a_given_stream_is_the_one_the_worker_may_write(resources):
    given = {"MessageSink": "kinesis", "MessageStreamArn": STREAM_ARN}
    assert not created(resources, "FrameStream", **given)
    grants = frame_grants(resources, **given)
    assert grants == {"kinesis:PutRecords": {"Ref": "MessageStreamArn"}}
    assert worker_env(resources, **given)["MESSAGE_STREAM"] == {"Ref": "MessageStreamArn"}
    firehose = {"MessageSink": "firehose", "MessageStreamArn": DELIVERY_ARN}
    assert frame_grants(resources, **firehose) == {
        "firehose:PutRecordBatch": {"Ref": "MessageStreamArn"}
    }
    assert created(resources, "FrameDeliveryThrottledAlarm", **firehose)


def test_firehose_without_its_delivery_stream_is_refused_by_a_rule(template):
    (assertion,) = template["Rules"]["FirehoseSinkNeedsItsDeliveryStream"]["Assertions"]
    assert assertion["Assert"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "MessageStreamArn"}, ""]}]}


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        ("", True),
        (STREAM_ARN, True),
        (DELIVERY_ARN, True),
        ("arn:aws:kinesis:eu-west-1:123456789012:stream/*", False),
        ("arn:aws:sqs:eu-west-1:123456789012:queue", False),
        ("market-frames", False),
    ],
)
def test_stream_arn_allowed_pattern(template, value, accepted):
    pattern = template["Parameters"]["MessageStreamArn"]["AllowedPattern"]
    assert bool(re.fullmatch(pattern, value)) is accepted


def test_every_allowed_sink_and_arn_is_a_setting_the_worker_accepts(template):
    assert template["Parameters"]["MessageSink"]["AllowedValues"] == list(SINK_KINDS)
    for sink, arn in (("dynamodb", ""), ("kinesis", STREAM_ARN), ("firehose", DELIVERY_ARN)):
        settings = Settings.from_env({"MESSAGE_SINK": sink, "MESSAGE_STREAM": arn})
        assert (settings.message_sink, settings.message_stream) == (sink, arn)


SINK_PARAMETERS = ("MessageSink", "MessageStreamArn", "MessageKinesisAggregation")


def mentions(value: Any, names: set[str]) -> set[str]:
    """The names among ``names`` that ``value`` refers to (Ref, GetAtt, DependsOn, Sub)."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "Ref" and item in names:
                found.add(item)
            elif key == "Fn::GetAtt" and isinstance(item, list) and item[0] in names:
                found.add(item[0])
            found |= mentions(item, names)
    elif isinstance(value, list):
        for item in value:
            found |= mentions(item, names)
    elif isinstance(value, str):
        found |= {n for n in names if "${" + n + "}" in value or "${" + n + "." in value}
    return found


def test_an_existing_dynamodb_stack_updates_without_change(template, resources):
    # GIVEN the default parameters (what a stack deployed before sinks existed updates with)
    defaults = resolver()
    created_ids = {name for name in resources if created(resources, name)}
    sink_only = set(resources) - created_ids
    # THEN every resource the sinks added is left out of it (stream, alarms) ...
    assert {"FrameStream", "FrameStreamThrottledAlarm", "FrameStreamIteratorAgeAlarm",
            "FrameDeliveryThrottledAlarm"} <= sink_only  # fmt: skip
    # ... and no resource it keeps renders anything of the sinks: no sink parameter, no
    # sink-only resource, so each is what it was in the template before sinks (a new
    # task-definition revision, say, would roll every worker of the stack for nothing)
    for name in sorted(created_ids):
        rendered = defaults.resolve_conditions(resources[name])
        assert not mentions(rendered, set(SINK_PARAMETERS) | sink_only), name
