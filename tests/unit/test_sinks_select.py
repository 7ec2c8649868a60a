"""MESSAGE_SINK: the default stays the messages table; the stream sinks need their stream."""

from __future__ import annotations

import pytest

from wsfleet.exceptions import ConfigurationError
from wsfleet.messages import MessageStore
from wsfleet.settings import Settings
from wsfleet.sinks import SINK_KINDS, DynamoDBSink, FirehoseSink, KinesisSink, sink_from_settings


def test_the_default_sink_is_the_messages_table_as_before():
    # GIVEN the environment of an existing stack (no sink variable at all)
    settings = Settings.from_env(
        {"MESSAGES_TABLE": "stack-messages", "MESSAGE_RETENTION_DAYS": "7"}
    )
    sink = sink_from_settings(settings, dynamodb=object())
    # THEN the worker writes the same table, with the same TTL, through the same store
    assert settings.message_sink == "dynamodb" and SINK_KINDS[0] == "dynamodb"
    assert isinstance(sink, MessageStore) and DynamoDBSink is MessageStore
    assert (sink.table_name, sink.retention_seconds) == ("stack-messages", 7 * 86_400)


def test_kinesis_and_firehose_are_selected_with_their_stream():
    arn = "arn:aws:kinesis:us-east-1:1:stream/f"
    kinesis = sink_from_settings(
        Settings.from_env(
            {"MESSAGE_SINK": "kinesis", "MESSAGE_STREAM": arn, "MESSAGE_KINESIS_AGGREGATION": "0"}
        ),
        kinesis=object(),
    )
    assert isinstance(kinesis, KinesisSink) and not kinesis.aggregate
    assert kinesis.stream == arn
    firehose = sink_from_settings(
        Settings.from_env({"MESSAGE_SINK": "firehose", "MESSAGE_STREAM": "d"}), firehose=object()
    )
    assert isinstance(firehose, FirehoseSink) and firehose.delivery_stream == "d"
    by_arn = sink_from_settings(
        Settings.from_env(
            {
                "MESSAGE_SINK": "firehose",
                "MESSAGE_STREAM": "arn:aws:firehose:us-east-1:1:deliverystream/d",
            }
        ),
        firehose=object(),
    )
    assert by_arn.delivery_stream == "d"  # PutRecordBatch takes the name


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MESSAGE_SINK": "s3"}, "MESSAGE_SINK must be dynamodb, kinesis or firehose"),
        ({"MESSAGE_SINK": "kinesis"}, "MESSAGE_STREAM is required with MESSAGE_SINK=kinesis"),
        ({"MESSAGE_SINK": "firehose"}, "MESSAGE_STREAM is required with MESSAGE_SINK=firehose"),
        ({"MESSAGE_KINESIS_AGGREGATION": "maybe"}, "MESSAGE_KINESIS_AGGREGATION must be true"),
        (
            {
                "MESSAGE_SINK": "kinesis",
                "MESSAGE_STREAM": "arn:aws:firehose:us-east-1:1:deliverystream/d",
            },
            "is not a kinesis ARN",
        ),
    ],
)
def test_a_bad_sink_setting_names_the_variable(env, message):
    with pytest.raises(ConfigurationError, match=message):
        Settings.from_env(env)
