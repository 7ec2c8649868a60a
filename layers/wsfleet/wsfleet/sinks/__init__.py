"""Sinks: where a worker's frames go (``WORKER_SINK``), one contract, one module per backend.

* :mod:`~wsfleet.sinks.base` - the contract (:class:`FrameSink`, :class:`SinkLimits`,
  :class:`PutResult`, the send guard);
* :mod:`~wsfleet.sinks.dynamodb` - the messages table, one item per frame (the default);
* :mod:`~wsfleet.sinks.kinesis` - a Kinesis data stream, partition key = connection id, user
  records aggregated in the KPL format (or one per record);
* :mod:`~wsfleet.sinks.firehose` - a Firehose delivery stream, newline-delimited JSON packed
  into records;
* :mod:`~wsfleet.sinks.select` - builds the configured one from the settings.

Exports resolve lazily: :mod:`wsfleet.messages` imports the contract, and a backend module
imports :mod:`wsfleet.messages`.
"""

from __future__ import annotations

from typing import Any

from ..lazy_exports import resolve_export

_EXPORTS = {
    "FrameSink": "base",
    "Guard": "base",
    "PutResult": "base",
    "SinkLimits": "base",
    "DynamoDBSink": "dynamodb",
    "FirehoseSink": "firehose",
    "KinesisSink": "kinesis",
    "AT_LEAST_ONCE_SINKS": "select",
    "SINK_KINDS": "select",
    "sink_from_settings": "select",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    return resolve_export(__name__, _EXPORTS, name)
