"""The local fleet's frame sink: a Kinesis stream or a Firehose delivery stream on the embedded
backend (``wsfleet local up --sink kinesis``), and reading a connection's frames back from
whichever sink a fleet or a stack uses (``wsfleet tail``).

The template does not define the stream yet (issue #27), so the local fleet creates it here:
``<stack>-frames`` (Kinesis, 2 shards), or ``<stack>-frames`` delivering to the bucket
``<stack>-frames`` (Firehose). The workers get ``MESSAGE_SINK`` and ``MESSAGE_STREAM``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from wsfleet.exceptions import ConfigurationError, StoreError
from wsfleet.record import connection_pk, is_valid_connection_id
from wsfleet.sinks.base import FrameSink
from wsfleet.sinks.select import SINK_KINDS

from .backend import local_client

__all__ = ["create_local_sink", "local_sink", "sink_settings", "tail_frames"]

_ROLE = "arn:aws:iam::123456789012:role/wsfleet-local-firehose"


def create_local_sink(kind: str, endpoint_url: str, region: str, stack: str) -> dict[str, str]:
    """Create the sink's stream on the local backend; the worker variables that select it."""
    if kind not in SINK_KINDS:
        raise ConfigurationError(f"sink must be one of {', '.join(SINK_KINDS)}, got {kind!r}")
    if kind == "dynamodb":
        return {"MESSAGE_SINK": "dynamodb"}
    name = f"{stack}-frames"
    if kind == "kinesis":
        kinesis = local_client("kinesis", endpoint_url, region)
        kinesis.create_stream(StreamName=name, ShardCount=2)
        kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 0.2})
    else:
        local_client("s3", endpoint_url, region).create_bucket(Bucket=name)
        local_client("firehose", endpoint_url, region).create_delivery_stream(
            DeliveryStreamName=name,
            DeliveryStreamType="DirectPut",
            ExtendedS3DestinationConfiguration={
                "RoleARN": _ROLE,
                "BucketARN": f"arn:aws:s3:::{name}",
                "Prefix": "frames/",
            },
        )
    return {"MESSAGE_SINK": kind, "MESSAGE_STREAM": name}


def sink_settings(state: Mapping[str, Any]) -> dict[str, str]:
    """The sink variables a local fleet's state file (``fleet.json``) records."""
    return {
        "MESSAGE_SINK": str(state.get("message_sink") or "dynamodb"),
        "MESSAGE_STREAM": str(state.get("message_stream") or ""),
        "MESSAGES_TABLE": str(state["messages_table"]),
    }


def local_sink(state: Mapping[str, Any]) -> FrameSink:
    """The sink of a running local fleet, from its ``fleet.json``, with local clients."""
    from wsfleet.settings import Settings
    from wsfleet.sinks.select import sink_from_settings

    settings = Settings.from_env(sink_settings(state), hint_queue_url="")
    endpoint, region = str(state["endpoint_url"]), str(state.get("region") or "us-east-1")
    tables = str(state.get("dynamodb_endpoint_url") or endpoint)
    return sink_from_settings(
        settings,
        dynamodb=local_client("dynamodb", tables, region),
        kinesis=local_client("kinesis", endpoint, region),
        firehose=local_client("firehose", endpoint, region),
        s3=local_client("s3", endpoint, region),
    )


def tail_frames(connection_id: str, fleet_dir: Path | None, lines: int) -> list[str]:
    """The last ``lines`` frames (0: all) of a connection as JSON lines, from the local fleet
    in ``fleet_dir`` or, without it, from the sink the environment configures (the worker's
    variables and boto3's credentials and endpoint)."""
    if not is_valid_connection_id(connection_id):
        raise ConfigurationError(f"not a connection id: {connection_id!r}")
    if fleet_dir is not None:
        try:
            state = json.loads((Path(fleet_dir) / "fleet.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"no local fleet state in {fleet_dir}: {exc}") from exc
        sink = local_sink(state)
    else:
        from wsfleet.settings import Settings
        from wsfleet.sinks.select import sink_from_settings

        sink = sink_from_settings(Settings.from_env(hint_queue_url=""))
    try:
        frames = sink.read_frames(connection_pk(connection_id))
    except (ClientError, BotoCoreError) as exc:
        raise StoreError(f"reading the {sink.kind} sink failed: {exc}") from exc
    shown = frames[-lines:] if lines else frames
    return [json.dumps(frame, ensure_ascii=False) for frame in shown]
