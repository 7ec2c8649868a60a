"""MessageStore: the messages table, written in batches by workers and read back by tools.

Every upstream frame a worker receives becomes one item ``(pk = "CONN#<id>", sk)``:

* ``sk`` is the frame's sequence number zero-padded to 20 digits (:func:`seq_sk`), so the sort
  order is the stream order and a frame received twice (a resumed session replays a few) lands
  on the same key and simply overwrites itself: writes are idempotent, duplicates impossible.
* A frame without a usable sequence number still gets stored, under a worker-local key from
  :func:`local_sk`: ``"L<epoch>-<received_ms>-<counter>"``, zero-padded. ``"L"`` sorts after
  every digit, so these keys form their own range after all numbered frames of the connection
  and are ordered by lease epoch, then arrival time. They cannot be deduplicated across a
  resume (nothing identifies them), which is the price of never dropping a frame.

Attributes: ``pk, sk, seq`` (absent for unnumbered frames), ``message_data`` (the frame's
``data`` field, else the whole frame), ``received_at_ms``, ``worker_id``, ``lease_epoch`` and
``expires_at`` (epoch seconds, the table's TTL attribute; left out when retention is 0).

Fencing (``guard``): a worker may only write frames while it surely holds the connection's
lease. BatchWriteItem takes no condition, so :meth:`MessageStore.put_batch` accepts a
``guard(message) -> bool`` that it evaluates before every attempt (a retry after a backoff
sleep may come after the lease was lost) and once more, for the whole request, in a botocore
``before-send`` hook: after serialisation and signing, microseconds before the bytes leave. A
request whose guard fails there is not sent; its items are re-checked one by one, and those
refused are reported as ``fenced``. What remains is the time between that last check and
DynamoDB applying the write, which the lease's safety margin covers.

Writes go through BatchWriteItem, 25 items per request. ``UnprocessedItems`` (DynamoDB's way of
saying "throttled, try these again") are retried with full-jitter backoff up to a bound; what is
still unwritten after that is handed back to the caller, which owns the retry policy (the worker
re-queues them, because its checkpoint must not pass an unwritten frame). A request DynamoDB
refuses as invalid (an item over 400 KB, say) is split until the offending item is isolated and
reported as rejected, so one poison frame never blocks the 24 others.

Item size: :meth:`Message.item_bytes` is DynamoDB's size of the item (attribute names and
values, UTF-8), computed before a frame is queued. A frame whose item would exceed
:data:`MAX_ITEM_BYTES` cannot be stored; :meth:`Message.as_marker` turns it into a *marker* item
at the same key, holding ``oversize_bytes`` (the item size it would have had) and
``data_sha256`` (a digest of its data) instead of ``message_data``. The marker is what the
checkpoint passes: a frame is never skipped silently, and the gap is visible to any reader.

Example::

    store = MessageStore(dynamodb_client(), "wsfleet-messages", retention_days=30)
    result = store.put_batch([Message("CONN#a", seq_sk(1), '{"x": 1}', 1_700_000_000_000,
                                      "worker-1", 3, seq=1)])
    assert not result.unwritten and not result.rejected
    store.read_all("CONN#a")[0]["seq"]   # 1
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from boto3.dynamodb.types import Binary, TypeDeserializer
from botocore.exceptions import BotoCoreError, ClientError

from .aws import is_ambiguous, is_throttling
from .backoff import backoff
from .exceptions import StoreError
from .sinks.base import (
    FrameSink,
    Guard,
    GuardTripped,
    PrebuiltBody,
    PutResult,
    SendGuard,
    SinkLimits,
)

__all__ = [
    "BATCH_WRITE_LIMIT",
    "LOCAL_SK_PREFIX",
    "MAX_BATCH_BYTES",
    "MAX_ITEM_BYTES",
    "SEQ_DIGITS",
    "Guard",
    "Message",
    "MessageStore",
    "PutResult",
    "local_sk",
    "seq_sk",
]

#: BatchWriteItem accepts at most 25 put/delete requests.
BATCH_WRITE_LIMIT = 25
#: Sequence numbers are stored as 20-digit keys: every unsigned 64-bit value fits.
SEQ_DIGITS = 20
MAX_SEQ = 10**SEQ_DIGITS - 1
#: Prefix of keys for frames without a sequence number; sorts after all digits.
LOCAL_SK_PREFIX = "L"
#: The largest item the worker sends. DynamoDB's limit is 400 KB (409,600 bytes); the margin
#: covers the estimate of number sizes and the moto server, which refuses items above 405,000.
MAX_ITEM_BYTES = 400_000
#: Item bytes per BatchWriteItem at most (a lone larger frame still goes alone). botocore
#: builds each request as JSON with non-ASCII escaped (up to 2x for 3-byte UTF-8), then as
#: bytes, then signs it: a batch of 25 maximum-size frames costs tens of MB while it is sent,
#: times the batches in flight. 4 MiB keeps that transient bounded (and far below the 16 MB
#: request limit); small frames still fill batches of 25.
MAX_BATCH_BYTES = 4 * 1024 * 1024

_SECONDS_PER_DAY = 86_400
_deserializer = TypeDeserializer()


def seq_sk(seq: int) -> str:
    """The sort key of frame ``seq``: 20 digits, so string order is numeric order.

    >>> seq_sk(42)
    '00000000000000000042'
    """
    if not 0 <= seq <= MAX_SEQ:
        raise ValueError(f"seq {seq} does not fit in {SEQ_DIGITS} digits")
    return f"{seq:0{SEQ_DIGITS}d}"


def local_sk(epoch: int, received_ms: int, counter: int) -> str:
    """A worker-local sort key for a frame without a sequence number.

    Unique per connection because the epoch is unique per lease holder and the counter is
    unique within one holder's session; zero-padded so keys sort by (epoch, time, counter).

    >>> local_sk(3, 1_700_000_000_123, 7)
    'L0000000003-1700000000123-0000000007'
    """
    return f"{LOCAL_SK_PREFIX}{epoch:010d}-{received_ms:013d}-{counter:010d}"


@dataclass(frozen=True, slots=True)
class Message:
    """One frame to store. ``seq`` is None for frames stored under a :func:`local_sk`."""

    pk: str
    sk: str
    message_data: str | bytes
    received_at_ms: int
    worker_id: str
    lease_epoch: int
    seq: int | None = None
    #: set on a marker (see :meth:`as_marker`): the item size the frame would have had
    oversize_bytes: int | None = None
    data_sha256: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.pk, self.sk)

    @property
    def is_marker(self) -> bool:
        return self.oversize_bytes is not None

    def item_bytes(self, expires_at: int | None) -> int:
        """DynamoDB's size of this item: attribute names plus values, strings in UTF-8.

        Numbers are counted as DynamoDB documents them (one byte per two significant digits,
        plus one), rounded up. Computed from the fields, not from :meth:`to_wire`: it runs for
        every frame, and building the item twice per frame was a measurable share of it.

        >>> Message("CONN#a", seq_sk(1), "\u00e9", 0, "w", 1, seq=1).item_bytes(None)
        88
        """
        # names: pk, sk, received_at_ms, worker_id, lease_epoch (2 + 2 + 14 + 9 + 11)
        total = 38 + _utf8_len(self.pk) + _utf8_len(self.sk) + _utf8_len(self.worker_id)
        total += _number_bytes(self.received_at_ms) + _number_bytes(self.lease_epoch)
        if self.oversize_bytes is None:
            data = self.message_data
            total += 12 + (len(data) if isinstance(data, bytes) else _utf8_len(data))
        else:  # oversize_bytes, data_sha256
            total += 25 + _number_bytes(self.oversize_bytes) + _utf8_len(self.data_sha256 or "")
        if self.seq is not None:
            total += 3 + _number_bytes(self.seq)
        if expires_at is not None:
            total += 10 + _number_bytes(expires_at)
        return total

    def as_marker(self, item_bytes: int) -> Message:
        """The marker stored instead of a frame that cannot be: same key, size and digest.

        >>> m = Message("CONN#a", seq_sk(1), "x" * 500_000, 0, "w", 1, seq=1).as_marker(500_080)
        >>> (m.message_data, m.oversize_bytes, m.data_sha256[:8])
        ('', 500080, 'c7adf628')
        """
        data = self.message_data
        raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
        return replace(
            self,
            message_data="",
            oversize_bytes=item_bytes,
            data_sha256=hashlib.sha256(raw).hexdigest(),
        )

    def to_wire(self, expires_at: int | None) -> dict[str, Any]:
        """The low-level DynamoDB item (built by hand: TypeSerializer costs CPU per frame)."""
        data = self.message_data
        item: dict[str, Any] = {
            "pk": {"S": self.pk},
            "sk": {"S": self.sk},
            "received_at_ms": {"N": str(self.received_at_ms)},
            "worker_id": {"S": self.worker_id},
            "lease_epoch": {"N": str(self.lease_epoch)},
        }
        if self.oversize_bytes is None:
            item["message_data"] = {"B": data} if isinstance(data, bytes) else {"S": data}
        else:  # a marker: no data, what it would have been instead
            item["oversize_bytes"] = {"N": str(self.oversize_bytes)}
            item["data_sha256"] = {"S": self.data_sha256 or ""}
        if self.seq is not None:
            item["seq"] = {"N": str(self.seq)}
        if expires_at is not None:
            item["expires_at"] = {"N": str(expires_at)}
        return item


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def _number_bytes(number: int) -> int:
    """DynamoDB's size of a number: (significant digits + 1) // 2 + 1, as :meth:`to_wire`
    writes it (``str(number)``, sign not counted)."""
    return (len(str(number).lstrip("-")) + 1) // 2 + 1


def batch_write_body(table: str, items: Sequence[tuple[Message, int | None]]) -> bytes:
    """The JSON body botocore sends for a BatchWriteItem putting ``items`` (message, TTL).

    Byte for byte ``json.dumps`` of the request dicts that :meth:`Message.to_wire` builds
    (default separators, non-ASCII escaped, blobs in base64), written as text directly: about
    an eighth of the cost of building the dicts and dumping them.
    """
    quoted = json.encoder.encode_basestring_ascii  # what json.dumps uses for every string
    parts = []
    for message, expires_at in items:
        data = message.message_data
        if message.oversize_bytes is not None:
            payload = (f'"oversize_bytes": {{"N": "{message.oversize_bytes}"}}, '
                       f'"data_sha256": {{"S": {quoted(message.data_sha256 or "")}}}')
        elif isinstance(data, bytes):
            payload = f'"message_data": {{"B": "{base64.b64encode(data).decode("ascii")}"}}'
        else:
            payload = f'"message_data": {{"S": {quoted(data)}}}'
        seq = "" if message.seq is None else f', "seq": {{"N": "{message.seq}"}}'
        ttl = "" if expires_at is None else f', "expires_at": {{"N": "{expires_at}"}}'
        parts.append(
            f'{{"PutRequest": {{"Item": {{"pk": {{"S": {quoted(message.pk)}}}, '
            f'"sk": {{"S": {quoted(message.sk)}}}, '
            f'"received_at_ms": {{"N": "{message.received_at_ms}"}}, '
            f'"worker_id": {{"S": {quoted(message.worker_id)}}}, '
            f'"lease_epoch": {{"N": "{message.lease_epoch}"}}, {payload}{seq}{ttl}}}}}}}'
        )  # fmt: skip
    return f'{{"RequestItems": {{{quoted(table)}: [{", ".join(parts)}]}}}}'.encode("ascii")


class MessageStore(FrameSink):
    """Batched, idempotent writes to the messages table and paginated reads: the ``dynamodb``
    sink (:class:`~wsfleet.sinks.base.FrameSink`), the default.

    :param client: a boto3 DynamoDB client (see :func:`wsfleet.aws.dynamodb_client`).
    :param table_name: the messages table.
    :param retention_days: TTL for stored frames (``expires_at``); 0 keeps them forever.
    :param attempts: BatchWriteItem rounds per chunk before leftovers are handed back.
    :param sleep: how to wait between rounds (injectable for tests).
    """

    def __init__(
        self,
        client: Any,
        table_name: str,
        *,
        retention_days: float = 0,
        attempts: int = 6,
        backoff_initial: float = 0.05,
        backoff_cap: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self._client = client
        self.table_name = table_name
        self.retention_seconds = int(retention_days * _SECONDS_PER_DAY)
        self._attempts = max(1, attempts)
        self._backoff_initial = backoff_initial
        self._backoff_cap = backoff_cap
        self._sleep = sleep
        self._rng = rng
        self._prebuilt = PrebuiltBody.install(client)
        self._send_guard = SendGuard(client, "BatchWriteItem")

    @classmethod
    def from_settings(cls, settings: Any, client: Any = None) -> MessageStore:
        """Build from :class:`wsfleet.settings.Settings`, creating a client if none is given."""
        if client is None:
            from .aws import dynamodb_client

            client = dynamodb_client()
        return cls(client, settings.messages_table, retention_days=settings.message_retention_days)

    kind = "dynamodb"
    limits = SinkLimits(
        batch_frames=BATCH_WRITE_LIMIT, batch_bytes=MAX_BATCH_BYTES, frame_bytes=MAX_ITEM_BYTES
    )

    def frame_bytes(self, message: Message) -> int:
        """The frame's DynamoDB item size, its TTL attribute included."""
        return message.item_bytes(self.expires_at(message.received_at_ms))

    def expires_at(self, received_at_ms: int) -> int | None:
        """TTL (epoch seconds) for a frame received at ``received_at_ms``; None keeps it."""
        if self.retention_seconds <= 0:
            return None
        return received_at_ms // 1000 + self.retention_seconds

    # ------------------------------------------------------------------ writes
    def put_batch(self, messages: Iterable[Message], *, guard: Guard | None = None) -> PutResult:
        """Write every message, 25 per BatchWriteItem; see :class:`PutResult`.

        Two messages with the same key in one call keep the last one (DynamoDB refuses
        duplicate keys inside one request, and the later frame is the one to keep).
        ``guard`` (see the module docstring) is asked before every attempt whether each
        message may still be written. Raises StoreError for failures that are not about
        throughput or single items (a missing table, bad credentials).
        """
        unique = list({m.key: m for m in messages}.values())
        result = PutResult()
        for start in range(0, len(unique), BATCH_WRITE_LIMIT):
            self._put_chunk(unique[start:start + BATCH_WRITE_LIMIT], result, guard)
        return result

    def _put_chunk(self, chunk: Sequence[Message], result: PutResult, guard: Guard | None) -> None:
        pending = {m.key: m for m in chunk}
        delays = self._delays()
        wait = False
        for _attempt in range(self._attempts):
            if wait:
                self._sleep(next(delays))
            wait = True
            if guard is not None:
                pending = self._apply_guard(pending, guard, result)
                if not pending:
                    return
            items = [(m, self.expires_at(m.received_at_ms)) for m in pending.values()]
            request = [{"PutRequest": {"Item": m.to_wire(ttl)}} for m, ttl in items]
            try:
                response = self._send_batch(request, items, guard)
            except GuardTripped:
                wait = False  # not sent: re-check the items one by one, no need to back off
                continue
            except ClientError as exc:
                result.requests += 1
                if _is_validation(exc):
                    self._isolate_invalid(list(pending.values()), result, guard)
                    return
                if is_throttling(exc) or is_ambiguous(exc):
                    continue  # nothing (or something idempotent) was written: go again
                raise StoreError(f"batch_write_item on {self.table_name} failed: {exc}") from exc
            except BotoCoreError as exc:
                result.requests += 1
                if is_ambiguous(exc):
                    continue
                raise StoreError(f"batch_write_item on {self.table_name} failed: {exc}") from exc
            result.requests += 1
            left = _unprocessed_keys(response, self.table_name)
            result.written += len(pending) - len(left)
            pending = {key: pending[key] for key in left if key in pending}
            if not pending:
                return
        result.unwritten.extend(pending.values())

    @staticmethod
    def _apply_guard(
        pending: dict[tuple[str, str], Message], guard: Guard, result: PutResult
    ) -> dict[tuple[str, str], Message]:
        allowed = {key: m for key, m in pending.items() if guard(m)}
        if len(allowed) < len(pending):
            result.fenced.extend(m for key, m in pending.items() if key not in allowed)
        return allowed

    def _send_batch(
        self,
        request: list[dict[str, Any]],
        items: list[tuple[Message, int | None]],
        guard: Guard | None,
    ) -> dict[str, Any]:
        check = (lambda: all(guard(m) for m, _ in items)) if guard is not None else None
        prebuilt = self._prebuilt
        table = self.table_name
        if prebuilt is None:
            with self._send_guard.armed(check):
                response: dict[str, Any] = self._client.batch_write_item(
                    RequestItems={table: request}
                )
            return response

        def matches(parameters: Mapping[str, Any]) -> bool:
            items = parameters.get("RequestItems") or {}
            return len(items) == 1 and items.get(table) is request

        skeleton = {"RequestItems": {table: request[:1]}}
        with prebuilt.prepared(
            "BatchWriteItem", matches, skeleton, batch_write_body(table, items)
        ), self._send_guard.armed(check):
            response = self._client.batch_write_item(RequestItems={table: request})
        return response

    def _isolate_invalid(
        self, messages: list[Message], result: PutResult, guard: Guard | None
    ) -> None:
        """A request was refused as invalid: find the item(s) responsible by halving."""
        if len(messages) == 1:
            message = messages[0]
            if guard is not None and not guard(message):
                result.fenced.append(message)
                return
            result.requests += 1
            try:
                self._client.put_item(
                    TableName=self.table_name,
                    Item=message.to_wire(self.expires_at(message.received_at_ms)),
                )
            except ClientError as exc:
                if _is_validation(exc):
                    result.rejected.append(message)
                    return
                result.unwritten.append(message)
                return
            except BotoCoreError:
                result.unwritten.append(message)
                return
            result.written += 1
            return
        middle = len(messages) // 2
        for half in (messages[:middle], messages[middle:]):
            sub = PutResult()
            self._put_chunk(half, sub, guard)
            result.merge(sub)

    def _delays(self) -> Iterator[float]:
        return backoff(initial=self._backoff_initial, cap=self._backoff_cap, rng=self._rng)

    # ------------------------------------------------------------------ reads
    def highest_seq(self, pk: str) -> int:
        """The highest seq stored for one connection (0 if none): one strongly consistent
        Query, newest sequence key first, ``Limit=1`` (frame markers count: they record it).

        A worker taking over a connection whose upstream cannot replay asks this once: the
        frames the previous holder stored above its checkpoint are not lost, so the resume
        gap is measured from here (see ``wsfleet_worker.session``).
        """
        try:
            response = self._client.query(
                TableName=self.table_name,
                KeyConditionExpression="pk = :pk AND sk < :local",
                ExpressionAttributeValues={":pk": {"S": pk}, ":local": {"S": LOCAL_SK_PREFIX}},
                ScanIndexForward=False,
                Limit=1,
                ConsistentRead=True,
                ProjectionExpression="sk",
            )
        except (ClientError, BotoCoreError) as exc:
            raise StoreError(f"query on {self.table_name} failed: {exc}") from exc
        items = response.get("Items") or []
        return int(items[0]["sk"]["S"]) if items else 0

    def read_frames(self, pk: str) -> list[dict[str, Any]]:
        """Every stored frame of one connection in key order, in the stream sinks' record
        shape (``connection_id``, ``key``, ``seq``, ``lease_epoch``, ``received_at_ms``,
        ``worker_id``, then ``data``, ``data_base64`` or a marker's fields)."""
        frames = []
        for item in self.read_all(pk):
            frame: dict[str, Any] = {"connection_id": pk.removeprefix("CONN#"), "key": item["sk"]}
            for name in ("seq", "lease_epoch", "received_at_ms", "worker_id"):
                if name in item:
                    frame[name] = item[name]
            data = item.get("message_data")
            if "oversize_bytes" in item:
                frame["oversize_bytes"] = int(item["oversize_bytes"])
                frame["data_sha256"] = item.get("data_sha256", "")
            elif isinstance(data, bytes):
                frame["data_base64"] = base64.b64encode(data).decode("ascii")
            else:
                frame["data"] = data
            frames.append(frame)
        return frames

    def read_all(
        self, pk: str, *, consistent: bool = True, attributes: Sequence[str] = ()
    ) -> list[dict[str, Any]]:
        """Every stored frame of one connection in key order (all Query pages).

        Numbers come back as ``int``. ``attributes`` limits each item to those (a projection:
        the local backend's cost grows with every attribute it serialises). Meant for tests,
        the demo and benchmarks: a live connection's partition can be large.
        """
        projection: dict[str, Any] = {}
        if attributes:
            names = {f"#a{i}": name for i, name in enumerate(attributes)}
            projection = {
                "ProjectionExpression": ", ".join(names),
                "ExpressionAttributeNames": names,
            }
        pages = self._client.get_paginator("query").paginate(
            TableName=self.table_name,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": pk}},
            ConsistentRead=consistent,
            **projection,
        )
        try:
            return [_plain(raw) for page in pages for raw in page.get("Items", [])]
        except (ClientError, BotoCoreError) as exc:
            raise StoreError(f"query on {self.table_name} failed: {exc}") from exc


def _is_validation(exc: ClientError) -> bool:
    return bool(exc.response.get("Error", {}).get("Code") == "ValidationException")


def _unprocessed_keys(response: dict[str, Any], table: str) -> list[tuple[str, str]]:
    keys = []
    for request in (response.get("UnprocessedItems") or {}).get(table, []):
        item = request.get("PutRequest", {}).get("Item", {})
        keys.append((item["pk"]["S"], item["sk"]["S"]))
    return keys


def _plain(raw: dict[str, Any]) -> dict[str, Any]:
    item = {k: _deserializer.deserialize(v) for k, v in raw.items()}
    for name in ("seq", "received_at_ms", "lease_epoch", "expires_at"):
        if name in item:
            item[name] = int(item[name])
    if isinstance(item.get("message_data"), Binary):
        item["message_data"] = bytes(item["message_data"])
    return item
