"""The ``firehose`` sink: frames to a Firehose delivery stream as newline-delimited JSON.

Every frame is one line, the JSON object of :func:`~wsfleet.sinks.records.frame_json`
(connection id, seq or local key, lease epoch, received time, data) and a ``\\n``; consecutive
lines of a batch, of any connections, are packed into one Firehose record up to the record
limit (1,000 KiB), so a delivered S3 object is plain JSON Lines and many small frames share
one record (Firehose bills ingestion per record, rounded up to 5 KB).

**Limits**: PutRecordBatch carries at most 500 records and 4 MiB; a record at most 1,000 KiB.
A frame whose line would not fit in one record is stored as its marker.

Firehose keeps no order, so the sink is not *ordered*: the flusher writes several batches at
once. Records refused in a batch (``FailedPutCount``; ``ServiceUnavailableException`` when the
stream is over its limits) are sent again with backoff, then handed back unwritten
(backpressure, never loss). Delivery is at-least-once: consumers drop duplicates on
(``connection_id``, ``seq``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from ..messages import Message
from ..record import connection_id_from_pk
from .base import SinkLimits
from .records import OutRecord, RecordStreamSink, frame_json_bytes

__all__ = ["MAX_RECORD_BYTES", "FirehoseSink"]

#: Firehose: a record at most 1,000 KiB; PutRecordBatch at most 500 records and 4 MiB.
MAX_RECORD_BYTES = 1000 * 1024
PUT_RECORD_BATCH_LIMIT = 500
PUT_RECORD_BATCH_BYTES = 4 * 1024 * 1024
#: Line bytes per flusher batch (one request's worth: packed lines never take more) and
#: frames per batch.
BATCH_BYTES = PUT_RECORD_BATCH_BYTES
BATCH_FRAMES = 5_000


class FirehoseSink(RecordStreamSink):
    """Frames to a Firehose delivery stream (module docstring).

    :param client: a boto3 Firehose client (:func:`wsfleet.aws.firehose_client`).
    :param delivery_stream: the delivery stream's name or ARN (PutRecordBatch takes the name).
    :param max_record_bytes: the largest record (lines packed into it).
    """

    kind = "firehose"
    operation = "PutRecordBatch"
    method = "put_record_batch"
    records_first = False
    keyed = False
    request_records = PUT_RECORD_BATCH_LIMIT
    request_bytes = PUT_RECORD_BATCH_BYTES

    def __init__(
        self,
        client: Any,
        delivery_stream: str,
        *,
        max_record_bytes: int = MAX_RECORD_BYTES,
        s3: Any = None,
        **retry: Any,
    ) -> None:
        super().__init__(client, **retry)
        self.delivery_stream = delivery_stream.rsplit("/", 1)[-1]  # an ARN ends in /<name>
        self._s3 = s3
        self._max_record_bytes = min(max_record_bytes, MAX_RECORD_BYTES)
        self.limits = SinkLimits(
            batch_frames=BATCH_FRAMES,
            batch_bytes=BATCH_BYTES,
            frame_bytes=self._max_record_bytes,
        )

    @property
    def destination(self) -> str:
        return self.delivery_stream

    def frame_bytes(self, message: Message) -> int:
        """The bytes of the frame's line (its JSON and the newline)."""
        return frame_json_bytes(message) + 1

    def _pack(
        self, messages: Sequence[Message], encoded: Callable[[Message], bytes]
    ) -> list[OutRecord]:
        records: list[OutRecord] = []
        frames: list[Message] = []
        lines: list[bytes] = []
        size = 0
        for message in messages:
            line = encoded(message) + b"\n"
            if frames and size + len(line) > self._max_record_bytes:
                records.append(OutRecord(frames, b"".join(lines)))
                frames, lines, size = [], [], 0
            frames.append(message)
            lines.append(line)
            size += len(line)
        if frames:
            records.append(OutRecord(frames, b"".join(lines)))
        return records

    def read_frames(self, pk: str) -> list[dict[str, Any]]:
        """One connection's frames in what the stream delivered to S3 (its destination's
        bucket and prefix, every object), in delivery order. For tools and tests: it reads
        every object; S3 delivery lags by the stream's buffering interval."""
        description = self._client.describe_delivery_stream(
            DeliveryStreamName=self.delivery_stream
        )["DeliveryStreamDescription"]
        s3 = self._s3
        if s3 is None:
            import boto3

            from ..aws import client_config

            s3 = boto3.client("s3", config=client_config())
        connection_id = connection_id_from_pk(pk)
        frames: list[dict[str, Any]] = []
        for destination in description.get("Destinations", []):
            where = destination.get("ExtendedS3DestinationDescription") or destination.get(
                "S3DestinationDescription"
            )
            if not where:
                continue
            bucket = where["BucketARN"].split(":::", 1)[-1]
            keys = [
                item["Key"]
                for page in s3.get_paginator("list_objects_v2").paginate(
                    Bucket=bucket, Prefix=where.get("Prefix", "")
                )
                for item in page.get("Contents", [])
            ]
            for key in sorted(keys):  # object names carry the delivery time
                body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
                for line in body.splitlines():
                    frame = json.loads(line)
                    if frame.get("connection_id") == connection_id:
                        frames.append(frame)
        return frames

    def _send(self, records: Sequence[OutRecord]) -> list[str | None]:
        response = self._request({"DeliveryStreamName": self.delivery_stream}, records)
        return [entry.get("ErrorCode") for entry in response.get("RequestResponses", [])]
