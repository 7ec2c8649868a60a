"""The sink a worker writes to, built from its settings (``MESSAGE_SINK``, ``MESSAGE_STREAM``).

>>> from wsfleet.settings import Settings
>>> sink_from_settings(Settings(message_sink="kinesis", message_stream="frames"),
...                    kinesis=object()).kind
'kinesis'
"""

from __future__ import annotations

from typing import Any

from .base import FrameSink

__all__ = ["AT_LEAST_ONCE_SINKS", "SINK_KINDS", "sink_from_settings"]

#: The values of ``MESSAGE_SINK``; the first is the default.
SINK_KINDS = ("dynamodb", "kinesis", "firehose")
#: The sinks where a frame sent again is stored again (a failover's replay duplicates): the
#: worker bounds what a failover re-sends (``MESSAGE_REPLAY_WINDOW``) and reports it.
AT_LEAST_ONCE_SINKS = ("kinesis", "firehose")


def sink_from_settings(
    settings: Any,
    *,
    dynamodb: Any = None,
    kinesis: Any = None,
    firehose: Any = None,
    s3: Any = None,
    max_pool_connections: int = 10,
) -> FrameSink:
    """The configured sink (:class:`wsfleet.settings.Settings`), with the client given for
    its service or a new one (standard retries, ``max_pool_connections`` connections);
    ``s3`` only serves reading a Firehose sink's deliveries back."""
    kind = settings.message_sink
    if kind == "kinesis":
        from ..aws import kinesis_client
        from .kinesis import KinesisSink

        client = kinesis or kinesis_client(max_pool_connections=max_pool_connections)
        return KinesisSink(
            client, settings.message_stream, aggregate=settings.message_kinesis_aggregation
        )
    if kind == "firehose":
        from ..aws import firehose_client
        from .firehose import FirehoseSink

        client = firehose or firehose_client(max_pool_connections=max_pool_connections)
        return FirehoseSink(client, settings.message_stream, s3=s3)
    from ..messages import MessageStore

    return MessageStore.from_settings(settings, dynamodb)
