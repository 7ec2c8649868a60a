"""The ``kinesis`` sink: frames to a Kinesis data stream, partition key = connection id.

Each connection's frames go to one shard (its partition key is the connection id), so a
consumer reads them in order. Every frame is one *user record*, the JSON object of
:func:`~wsfleet.sinks.records.frame_json` (connection id, seq or local key, lease epoch,
received time, data).

**Aggregation** (the default): a connection's frames of one batch are packed into Kinesis
records in the KPL aggregation format, which the Kinesis Client Library, Lambda with the
``aws-kinesis-agg`` deaggregator and Flink's consumer read as they read KPL output::

    0xF3 0x89 0x9A 0xC2 | AggregatedRecord (protobuf) | MD5 of the protobuf bytes

    message AggregatedRecord { repeated string partition_key_table = 1;
                               repeated string explicit_hash_key_table = 2;
                               repeated Record records = 3; }
    message Record { required uint64 partition_key_index = 1;
                     optional uint64 explicit_hash_key_index = 2;
                     required bytes data = 3; repeated Tag tags = 4; }

Every aggregated record holds one connection's frames (one partition key, index 0), up to
``max_record_bytes``. Kinesis bills PUT payload units of 25 KB, so many small frames cost a
fraction of one unit each. ``aggregate=False`` is the plain mode: one frame per record.

**Limits**: PutRecords carries at most 500 records and 5 MiB (data plus partition keys), a
record at most 1 MiB (data plus partition key). A frame whose record would not fit in one
Kinesis record is stored as its marker (:data:`MAX_FRAME_BYTES`).

**Order and retries.** The sink is *ordered*: the flusher writes one batch at a time, and
a frame handed back unwritten goes again before its connection's later frames. In the
aggregated mode a request carries at most one record per connection, so a later record of a
connection can never be taken while an earlier one of the same request is refused: each
connection's frames reach its shard in order. In the plain mode a request carries many
records per connection and Kinesis may refuse one (``ProvisionedThroughputExceededException``)
while taking the next: that one is sent again first, but it lands after its successor.
Consumers order by ``seq`` and drop duplicates on (connection id, seq) in any case: delivery
is at-least-once (an ambiguous failure, a failover replay).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from ..messages import Message
from ..record import connection_id_from_pk
from .base import SinkLimits
from .records import (
    OutRecord,
    RecordStreamSink,
    connection_id_of,
    frame_json_bytes,
)

__all__ = [
    "KPL_MAGIC",
    "MAX_FRAME_BYTES",
    "MAX_RECORD_BYTES",
    "KinesisSink",
    "aggregate",
    "aggregated_size",
    "deaggregate",
]

#: The first four bytes of every KPL aggregated record.
KPL_MAGIC = b"\xf3\x89\x9a\xc2"
_DIGEST_BYTES = 16
#: Kinesis: data plus partition key of one record at most 1 MiB; PutRecords at most 500
#: records and 5 MiB.
MAX_RECORD_BYTES = 1024 * 1024
PUT_RECORDS_LIMIT = 500
PUT_RECORDS_BYTES = 5 * 1024 * 1024
#: The largest frame record stored: room left for the partition key (a connection id is at
#: most 128 bytes) and the aggregation envelope of a lone frame (under 200 bytes).
MAX_FRAME_BYTES = MAX_RECORD_BYTES - 512
#: Frame bytes per flusher batch (a request holds at most 5 MiB) and frames per batch.
BATCH_BYTES = 4 * 1024 * 1024
BATCH_FRAMES_AGGREGATED = 5_000


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _varint_len(value: int) -> int:
    length = 1
    while value > 0x7F:
        value >>= 7
        length += 1
    return length


@functools.lru_cache(maxsize=4096)
def _user_record_prefix(data_len: int) -> bytes:
    """What precedes a user record's data in ``records``: the entry's tag and length, then
    partition_key_index = 0 and the data's tag and length (the same for every record of a
    length, so built once per length)."""
    size = _varint(data_len)
    return b"\x1a" + _varint(3 + len(size) + data_len) + b"\x08\x00\x1a" + size


def _user_record_len(data_len: int) -> int:
    """Bytes of one ``records`` entry: tag, length, then partition_key_index = 0 and data."""
    return len(_user_record_prefix(data_len)) + data_len


def aggregated_size(partition_key: str, data_lengths: Sequence[int]) -> int:
    """The size of :func:`aggregate` of user records of these lengths under one key.

    >>> aggregated_size("a", [5]) == len(aggregate("a", [b"hello"]))
    True
    """
    key = len(partition_key.encode("utf-8"))
    table = 1 + _varint_len(key) + key
    return len(KPL_MAGIC) + table + sum(map(_user_record_len, data_lengths)) + _DIGEST_BYTES


def aggregate(partition_key: str, user_records: Sequence[bytes]) -> bytes:
    """One KPL aggregated record of ``user_records``, all under ``partition_key``.

    >>> aggregate("a", [b"hello"]).hex()[:8]
    'f3899ac2'
    """
    key = partition_key.encode("utf-8")
    parts = [b"\x0a", _varint(len(key)), key]  # partition_key_table[0]
    prefix = _user_record_prefix
    for data in user_records:
        parts += (prefix(len(data)), data)
    message = b"".join(parts)
    return KPL_MAGIC + message + hashlib.md5(message, usedforsecurity=False).digest()


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """The (field number, value) pairs of a protobuf message: varints and length-delimited
    fields only (all the aggregation format uses); anything else is a ValueError."""
    out: list[tuple[int, int | bytes]] = []
    at = 0
    while at < len(data):
        key, at = _read_varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _read_varint(data, at)
            out.append((number, value))
        elif wire == 2:
            length, at = _read_varint(data, at)
            if at + length > len(data):
                raise ValueError("truncated field")
            out.append((number, data[at : at + length]))
            at += length
        else:
            raise ValueError(f"unexpected wire type {wire}")
    return out


def deaggregate(data: bytes, partition_key: str) -> list[tuple[str, bytes]]:
    """The user records of one Kinesis record, as (partition key, data); a record that is not
    a valid KPL aggregated record is one user record, itself (as KPL deaggregators do).

    >>> deaggregate(aggregate("a", [b"x", b"yz"]), "a")
    [('a', b'x'), ('a', b'yz')]
    """
    body = data[len(KPL_MAGIC) : -_DIGEST_BYTES]
    if (
        len(data) <= len(KPL_MAGIC) + _DIGEST_BYTES
        or not data.startswith(KPL_MAGIC)
        or hashlib.md5(body, usedforsecurity=False).digest() != data[-_DIGEST_BYTES:]
    ):
        return [(partition_key, data)]
    try:
        keys: list[str] = []
        users: list[tuple[str, bytes]] = []
        for number, value in _fields(body):
            if number == 1 and isinstance(value, bytes):
                keys.append(value.decode("utf-8"))
            elif number == 3 and isinstance(value, bytes):
                index, payload = 0, b""
                for inner_number, inner in _fields(value):
                    if inner_number == 1 and isinstance(inner, int):
                        index = inner
                    elif inner_number == 3 and isinstance(inner, bytes):
                        payload = inner
                users.append((keys[index], payload))
        return users
    except (ValueError, IndexError, UnicodeDecodeError):
        return [(partition_key, data)]


class KinesisSink(RecordStreamSink):
    """Frames to a Kinesis data stream (module docstring).

    :param client: a boto3 Kinesis client (:func:`wsfleet.aws.kinesis_client`).
    :param stream: the stream's name or ARN.
    :param aggregate: KPL aggregation (default) or one frame per record.
    :param max_record_bytes: the largest aggregated record (data plus partition key).

    Example::

        sink = KinesisSink(kinesis_client(), "wsfleet-frames")
        result = sink.put_batch(messages)
    """

    kind = "kinesis"
    operation = "PutRecords"
    method = "put_records"
    records_first = True
    keyed = True
    request_records = PUT_RECORDS_LIMIT
    request_bytes = PUT_RECORDS_BYTES

    def __init__(
        self,
        client: Any,
        stream: str,
        *,
        aggregate: bool = True,
        max_record_bytes: int = MAX_RECORD_BYTES,
        **retry: Any,
    ) -> None:
        super().__init__(client, **retry)
        self.stream = stream
        self.aggregate = aggregate
        self._max_record_bytes = min(max_record_bytes, MAX_RECORD_BYTES)
        self._target = (
            {"StreamARN": stream} if stream.startswith("arn:") else {"StreamName": stream}
        )
        self.limits = SinkLimits(
            batch_frames=BATCH_FRAMES_AGGREGATED if aggregate else PUT_RECORDS_LIMIT,
            batch_bytes=BATCH_BYTES,
            frame_bytes=MAX_FRAME_BYTES,
            ordered=True,
        )

    @property
    def destination(self) -> str:
        return self.stream

    @property
    def one_record_per_key(self) -> bool:
        return self.aggregate

    def frame_bytes(self, message: Message) -> int:
        """The bytes of the frame's user record (its JSON)."""
        return frame_json_bytes(message)

    def _pack(
        self, messages: Sequence[Message], encoded: Callable[[Message], bytes]
    ) -> list[OutRecord]:
        if not self.aggregate:
            return [OutRecord([m], encoded(m), connection_id_of(m)) for m in messages]
        # Per connection, in order: consecutive frames into records up to the size limit.
        # An open record is [frames, user records, its size, its size limit], by pk.
        open_records: dict[str, list[Any]] = {}
        packed: list[tuple[str, list[Any]]] = []
        for message in messages:
            data = encoded(message)
            grow = _user_record_len(len(data))
            current = open_records.get(message.pk)
            if current is not None and current[2] + grow <= current[3]:
                current[0].append(message)
                current[1].append(data)
                current[2] += grow
                continue
            key = connection_id_of(message)
            limit = self._max_record_bytes - len(key.encode("utf-8"))
            current = [[message], [data], aggregated_size(key, [len(data)]), limit]
            open_records[message.pk] = current
            packed.append((key, current))
        return [OutRecord(fs, aggregate(key, datas), key) for key, (fs, datas, *_) in packed]

    def read_frames(self, pk: str) -> list[dict[str, Any]]:
        """Every frame of one connection in the stream, oldest first (GetRecords on every shard
        from the trim horizon, deaggregated, filtered on the partition key). For tools and
        tests: it reads whole shards."""
        key = connection_id_from_pk(pk)
        frames: list[dict[str, Any]] = []
        shards = self._client.list_shards(**self._target)["Shards"]
        for shard in shards:
            iterator = self._client.get_shard_iterator(
                ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON", **self._target
            )["ShardIterator"]
            while iterator:
                arn = {k: v for k, v in self._target.items() if k == "StreamARN"}
                page = self._client.get_records(ShardIterator=iterator, Limit=1000, **arn)
                for record in page["Records"]:
                    if record["PartitionKey"] != key:
                        continue
                    for _key, data in deaggregate(record["Data"], key):
                        frames.append(json.loads(data))
                records = page["Records"]
                caught_up = not records or (
                    page.get("MillisBehindLatest") == 0 and len(records) < 1000
                )
                iterator = None if caught_up else page.get("NextShardIterator")
        return frames

    def _send(self, records: Sequence[OutRecord]) -> list[str | None]:
        response = self._request(self._target, records)
        return [entry.get("ErrorCode") for entry in response.get("Records", [])]
