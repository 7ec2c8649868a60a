"""What the stream sinks (Kinesis, Firehose) share: the frame's JSON record and the put loop.

**A frame as a record.** Every frame becomes one compact JSON object (UTF-8, non-ASCII kept),
:func:`frame_json`::

    {"connection_id": "a", "key": "00000000000000000042", "seq": 42, "lease_epoch": 3,
     "received_at_ms": 1700000000123, "worker_id": "w1", "data": "..."}

``key`` is the DynamoDB sort key the frame would have had (the zero-padded seq, or the local
key ``L<epoch>-<received_ms>-<counter>`` of a frame without a seq, which then has no ``seq``).
``data`` is the string the messages table stores in ``message_data`` (the frame's ``data``
field as compact JSON text if it is not a string, else the raw frame); a binary frame that is
not UTF-8 carries ``data_base64`` instead. A marker (a frame too large to store) carries
``oversize_bytes`` and ``data_sha256`` and no data. Consumers deduplicate on
(``connection_id``, ``seq``), or (``connection_id``, ``key``) for frames without a seq.

**The put loop** (:class:`RecordStreamSink`). A batch's frames stay in one list, in the order
they were queued. Each round asks the guard about every frame's lease (a connection's pk and
lease epoch: one answer for all its frames; a refused frame is reported ``fenced``), packs
what is left into records (the backend's :meth:`~RecordStreamSink._pack`), takes the first
records that fit one request (count and bytes), sends them with the send
guard armed, and drops the frames of the records the service took. Frames of failed records
keep their place in front of their connection's later frames, so they go again first. A round
in which nothing failed is progress and goes on at once; a round with failures (per-record
errors such as ``ProvisionedThroughputExceededException``, a throttled or ambiguous request)
backs off with full jitter, and after ``attempts`` such rounds what is left is handed back
``unwritten`` (the flusher re-queues it: backpressure, never loss). Whole-request throttling
is first retried by botocore itself (``standard`` retry mode). A request refused as invalid is
split until the offending record is alone; its frames are reported rejected (they become
markers).
"""

from __future__ import annotations

import base64
import functools
import json
import random
import re
import time
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from botocore.exceptions import BotoCoreError, ClientError

from ..aws import is_ambiguous, is_throttling
from ..backoff import backoff
from ..exceptions import StoreError
from ..messages import Message
from ..record import CONNECTION_PREFIX
from .base import FrameSink, Guard, GuardTripped, PrebuiltBody, PutResult, SendGuard

__all__ = [
    "OutRecord",
    "RecordStreamSink",
    "connection_id_of",
    "frame_json",
    "frame_json_bytes",
    "read_json_results",
    "records_body",
    "take_request",
]

#: JSON string escaping as ``json.dumps(..., ensure_ascii=False)`` does it (the C encoder):
#: non-ASCII kept, ``"``, ``\\`` and control characters escaped.
_escape: Callable[[str], str] = json.encoder.encode_basestring
#: What ``_escape`` changes; a string without any of these is its own JSON body.
_NEEDS_ESCAPE = re.compile(r'[\x00-\x1f\\"]')


def connection_id_of(message: Message) -> str:
    """The connection id of a frame (its pk without ``CONN#``)."""
    pk = message.pk
    return pk[len(CONNECTION_PREFIX) :] if pk.startswith(CONNECTION_PREFIX) else pk


def frame_json(message: Message) -> bytes:
    """The frame as its JSON record (see the module docstring), UTF-8.

    Written out field by field rather than through ``json.dumps`` of a dict: the bytes are
    the same (compact separators, ``ensure_ascii=False``, the fields in this order), and this
    runs for every frame a stream sink stores, where the encoder's per-call set-up was the
    largest single share of the worker's time (bench/throughput.py, issue #27).

    >>> from wsfleet.messages import seq_sk
    >>> frame_json(Message("CONN#a", seq_sk(7), "hi", 1000, "w1", 2, seq=7))
    b'{"connection_id":"a","key":"00000000000000000007","seq":7,"lease_epoch":2,\
"received_at_ms":1000,"worker_id":"w1","data":"hi"}'
    """
    data = message.message_data
    seq = message.seq
    if seq is not None and message.oversize_bytes is None and data.__class__ is str:
        # The common frame, as one f-string (a third cheaper than the parts joined below).
        return (
            f'{{"connection_id":{_escape(connection_id_of(message))},'
            f'"key":{_escape(message.sk)},"seq":{int.__repr__(seq)},'
            f'"lease_epoch":{int.__repr__(message.lease_epoch)},'
            f'"received_at_ms":{int.__repr__(message.received_at_ms)},'
            f'"worker_id":{_escape(message.worker_id)},"data":{_escape(data)}}}'
        ).encode("utf-8", "surrogatepass")
    parts = ['{"connection_id":', _escape(connection_id_of(message)), ',"key":',
             _escape(message.sk)]  # fmt: skip
    if message.seq is not None:
        parts += [',"seq":', int.__repr__(message.seq)]
    parts += [',"lease_epoch":', int.__repr__(message.lease_epoch),
              ',"received_at_ms":', int.__repr__(message.received_at_ms),
              ',"worker_id":', _escape(message.worker_id)]  # fmt: skip
    if message.oversize_bytes is not None:
        parts += [',"oversize_bytes":', int.__repr__(message.oversize_bytes),
                  ',"data_sha256":', _escape(message.data_sha256 or "")]  # fmt: skip
    elif isinstance(data, bytes):
        parts += [',"data_base64":"', base64.b64encode(data).decode("ascii"), '"']
    else:
        parts += [',"data":', _escape(data)]
    parts.append("}")
    return "".join(parts).encode("utf-8", "surrogatepass")


def _json_string_bytes(text: str) -> int:
    """``len(_escape(text))`` in UTF-8, without building it for plain ASCII text."""
    if text.isascii() and _NEEDS_ESCAPE.search(text) is None:
        return len(text) + 2
    return len(_escape(text).encode("utf-8", "surrogatepass"))


@functools.lru_cache(maxsize=4096)
def _fixed_bytes(pk: str, worker_id: str) -> int:
    """What every record of one connection and worker has: names, punctuation, both ids."""
    names = '{"connection_id":,"key":,"lease_epoch":,"received_at_ms":,"worker_id":}'
    connection_id = pk[len(CONNECTION_PREFIX) :] if pk.startswith(CONNECTION_PREFIX) else pk
    return len(names) + _json_string_bytes(connection_id) + _json_string_bytes(worker_id)


def frame_json_bytes(message: Message) -> int:
    """``len(frame_json(message))``, counted without encoding the frame.

    A stream sink sizes every frame when it is queued and encodes it when it is sent; this
    counts the escaped lengths instead (no join, no UTF-8 copy of plain ASCII data).

    >>> from wsfleet.messages import seq_sk
    >>> m = Message("CONN#a", seq_sk(7), 'h\u00e9 "x"', 1000, "w1", 2, seq=7)
    >>> frame_json_bytes(m) == len(frame_json(m))
    True
    """
    size = _fixed_bytes(message.pk, message.worker_id) + _json_string_bytes(message.sk)
    if message.seq is not None:
        size += 7 + len(int.__repr__(message.seq))  # ,"seq":
    size += len(int.__repr__(message.lease_epoch)) + len(int.__repr__(message.received_at_ms))
    data = message.message_data
    if message.oversize_bytes is not None:  # ,"oversize_bytes": and ,"data_sha256":
        size += 18 + len(int.__repr__(message.oversize_bytes)) + 15
        size += _json_string_bytes(message.data_sha256 or "")
    elif isinstance(data, bytes):  # ,"data_base64":"...", base64 in 4-byte groups
        size += 16 + 4 * ((len(data) + 2) // 3) + 1
    else:  # ,"data":
        size += 8 + _json_string_bytes(data)
    return size


def records_body(
    records: Sequence[OutRecord], target: dict[str, str], *, records_first: bool, keyed: bool
) -> bytes:
    """The JSON body botocore sends for a PutRecords (``records_first``: ``Records`` then the
    stream; ``keyed``: with partition keys) or a PutRecordBatch (the delivery stream, then
    ``Records``, data only) of ``records``.

    Byte for byte ``json.dumps`` of the parameters as botocore serialises them (default
    separators, non-ASCII escaped, data in base64, members in the order given), written as
    text directly: the sinks' tests compare it with botocore's own serializer.
    """
    quoted = json.encoder.encode_basestring_ascii  # what json.dumps uses for every string
    entries = []
    for record in records:
        data = base64.b64encode(record.data).decode("ascii")
        if keyed:
            entries.append(
                f'{{"Data": "{data}", "PartitionKey": {quoted(record.partition_key)}}}'
            )
        else:
            entries.append(f'{{"Data": "{data}"}}')
    listed = f'"Records": [{", ".join(entries)}]'
    named = ", ".join(f"{quoted(name)}: {quoted(value)}" for name, value in target.items())
    text = f"{{{listed}, {named}}}" if records_first else f"{{{named}, {listed}}}"
    return text.encode("ascii")


def read_json_results(
    response_dict: dict[str, Any], customized_response_dict: dict[str, Any], **_kwargs: Any
) -> None:
    """botocore ``before-parse`` hook of the sinks' write operations: a successful response's
    JSON is read as it is, not walked through the service model record by record.

    A PutRecords or PutRecordBatch answer holds one small object per record (sequence number
    and shard, or error code and message: strings only) and two scalars; botocore's parser
    produced the same values at a few microseconds per record, the largest share left of a
    request's cost. The values go to ``customized_response_dict`` (which botocore merges into
    its parsed response) and botocore parses an empty body for the rest (response metadata).
    An error response, or a body that is not a JSON object, is left to botocore.
    """
    if response_dict.get("status_code") != 200:
        return
    body = response_dict.get("body")
    if not isinstance(body, bytes | bytearray) or not body:
        return
    try:
        parsed = json.loads(body)
    except ValueError:
        return
    if isinstance(parsed, dict):
        customized_response_dict.update(parsed)
        response_dict["body"] = b"{}"


@dataclass(slots=True)
class OutRecord:
    """One record of a request: the frames it carries, its bytes and its partition key."""

    frames: list[Message]
    data: bytes
    partition_key: str = ""

    @property
    def request_bytes(self) -> int:
        """What the record counts against a request's byte cap (data and partition key)."""
        return len(self.data) + len(self.partition_key.encode("utf-8"))


def take_request(
    records: Sequence[OutRecord], *, max_records: int, max_bytes: int, one_per_key: bool
) -> list[OutRecord]:
    """The records the next request carries: from the front, while they fit.

    With ``one_per_key`` a request carries at most one record per partition key, the first
    one: a stream keeps a key's records in order only if a later record cannot be accepted
    while an earlier one of the same request is refused. A record that does not fit is
    skipped (records of other keys may still fit), but never one of a key already skipped.
    """
    taken: list[OutRecord] = []
    used = 0
    seen: set[str] = set()
    for record in records:
        if len(taken) >= max_records:
            break
        key = record.partition_key
        if one_per_key and key in seen:
            continue
        seen.add(key)
        size = record.request_bytes
        if taken and used + size > max_bytes:
            if not one_per_key:
                break
            continue
        taken.append(record)
        used += size
    return taken


class RecordStreamSink(FrameSink):
    """The put loop of a record stream (module docstring); backends pack and send.

    :param attempts: rounds with failures before what is left is handed back unwritten.
    :param sleep: how to wait between rounds (injectable for tests).
    """

    #: The write operation (botocore name) the send guard watches, and the client's method.
    operation: ClassVar[str]
    method: ClassVar[str]
    #: Whether botocore's body has ``Records`` before the stream's name (the order the
    #: request's parameters are given in).
    records_first: ClassVar[bool]
    #: Whether every record carries a ``PartitionKey`` (Kinesis) or only ``Data`` (Firehose).
    keyed: ClassVar[bool]
    #: Per-request limits of that operation.
    request_records: ClassVar[int]
    request_bytes: ClassVar[int]

    def __init__(
        self,
        client: Any,
        *,
        attempts: int = 6,
        backoff_initial: float = 0.05,
        backoff_cap: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self._client = client
        self._attempts = max(1, attempts)
        self._backoff_initial = backoff_initial
        self._backoff_cap = backoff_cap
        self._sleep = sleep
        self._rng = rng
        self._send_guard = SendGuard(client, self.operation)
        self._prebuilt = PrebuiltBody.install(client)
        meta = getattr(client, "meta", None)
        if meta is not None:
            service = meta.service_model.service_id.hyphenize()
            meta.events.register(
                f"before-parse.{service}.{self.operation}",
                read_json_results,
                unique_id=f"wsfleet-sink-results-{self.operation}",
            )

    # ------------------------------------------------------------------ backend hooks
    @property
    @abstractmethod
    def destination(self) -> str:
        """The stream's name or ARN, for messages."""

    @property
    def one_record_per_key(self) -> bool:
        """Whether a request may carry one record per partition key only (ordered streams)."""
        return False

    @abstractmethod
    def _pack(
        self, messages: Sequence[Message], encoded: Callable[[Message], bytes]
    ) -> list[OutRecord]:
        """The frames as records, in order (``encoded(m)`` is :func:`frame_json`, cached)."""

    @abstractmethod
    def _send(self, records: Sequence[OutRecord]) -> list[str | None]:
        """Send one request; per record, its error code (None: taken). Raises ClientError or
        BotoCoreError for a request refused or failed as a whole."""

    def _request(self, target: dict[str, str], records: Sequence[OutRecord]) -> dict[str, Any]:
        """One write request of ``records`` to ``target`` (the stream's name or ARN), its JSON
        body prebuilt (:class:`~wsfleet.sinks.base.PrebuiltBody`, :func:`records_body`):
        botocore validates and serialises a one-record skeleton, not every record."""
        keyed = self.keyed
        entries = [
            {"Data": r.data, "PartitionKey": r.partition_key} if keyed else {"Data": r.data}
            for r in records
        ]  # fmt: skip
        first = self.records_first
        parameters = {"Records": entries, **target} if first else {**target, "Records": entries}
        call = getattr(self._client, self.method)
        prebuilt = self._prebuilt
        if prebuilt is None or not entries:
            response: dict[str, Any] = call(**parameters)
            return response
        body = records_body(records, target, records_first=first, keyed=keyed)
        skeleton = {**parameters, "Records": entries[:1]}
        with prebuilt.prepared(
            self.operation, lambda p: p.get("Records") is entries, skeleton, body
        ):
            response = call(**parameters)
        return response

    # ------------------------------------------------------------------ the put loop
    def put_batch(self, messages: Iterable[Message], *, guard: Guard | None = None) -> PutResult:
        """Write every frame at least once, or report it unwritten, rejected or fenced."""
        pending = list(messages)
        result = PutResult()
        cache: dict[int, bytes] = {}

        def encoded(message: Message) -> bytes:
            data = cache.get(id(message))
            if data is None:
                data = cache[id(message)] = frame_json(message)
            return data

        delays = self._delays()
        failed_rounds = 0
        while pending:
            if guard is not None:
                verdicts = _lease_verdicts(guard, pending)
                if not all(verdicts.values()):
                    result.fenced.extend(m for m in pending if not verdicts[_lease(m)])
                    pending = [m for m in pending if verdicts[_lease(m)]]
                    if not pending:
                        break
            request = take_request(
                self._pack(pending, encoded),
                max_records=self.request_records,
                max_bytes=self.request_bytes,
                one_per_key=self.one_record_per_key,
            )
            done, trouble = self._put_request(request, result, guard)
            if done:
                pending = [m for m in pending if id(m) not in done]
            if trouble:
                failed_rounds += 1
                if failed_rounds >= self._attempts:
                    break
                self._sleep(next(delays))
        result.unwritten.extend(pending)
        return result

    def _put_request(
        self, request: list[OutRecord], result: PutResult, guard: Guard | None
    ) -> tuple[set[int], bool]:
        """Send one request. Returns the ids of the frames settled (taken or rejected) and
        whether anything failed that is worth a backoff."""
        check = None
        if guard is not None:
            check = lambda: all(  # noqa: E731
                _lease_verdicts(guard, (m for r in request for m in r.frames)).values()
            )
        try:
            with self._send_guard.armed(check):
                errors = self._send(request)
        except GuardTripped:
            return set(), False  # not sent: the next round asks the guard frame by frame
        except ClientError as exc:
            result.requests += 1
            if _is_invalid(exc):
                return self._isolate_invalid(request, result, guard), False
            if is_throttling(exc) or is_ambiguous(exc) or _error_code(exc) in _STREAM_THROTTLING:
                return set(), True
            raise StoreError(f"{self.operation} on {self.destination} failed: {exc}") from exc
        except BotoCoreError as exc:
            result.requests += 1
            if is_ambiguous(exc):
                return set(), True
            raise StoreError(f"{self.operation} on {self.destination} failed: {exc}") from exc
        result.requests += 1
        done: set[int] = set()
        trouble = False
        for record, error in zip(request, errors, strict=True):
            if error is None:
                result.written += len(record.frames)
                done.update(id(m) for m in record.frames)
            else:
                trouble = True
        return done, trouble

    def _isolate_invalid(
        self, request: list[OutRecord], result: PutResult, guard: Guard | None
    ) -> set[int]:
        """A request was refused as invalid: send its records one by one; the frames of a
        record refused on its own are rejected. Returns the frames settled."""
        if len(request) == 1:
            (record,) = request
            result.rejected.extend(record.frames)
            return {id(m) for m in record.frames}
        done: set[int] = set()
        for record in request:
            settled, _trouble = self._put_request([record], result, guard)
            done |= settled
        return done

    def _delays(self) -> Iterator[float]:
        return backoff(initial=self._backoff_initial, cap=self._backoff_cap, rng=self._rng)


def _lease(message: Message) -> tuple[str, int]:
    return (message.pk, message.lease_epoch)


def _lease_verdicts(guard: Guard, messages: Iterable[Message]) -> dict[tuple[str, int], bool]:
    """The guard's answer for every connection lease (pk, lease epoch) among ``messages``,
    asked of the lease's first frame only: every frame of one lease is its session's, and the
    session's right to write is what the guard answers (it was asked of every frame twice per
    request, a measurable share of a frame's CPU)."""
    verdicts: dict[tuple[str, int], bool] = {}
    for message in messages:
        lease = (message.pk, message.lease_epoch)
        if lease not in verdicts:
            verdicts[lease] = guard(message)
    return verdicts


#: Whole-request refusals of the stream services that mean "later" (Firehose answers
#: ServiceUnavailableException, HTTP 503, when a delivery stream is over its limits).
_STREAM_THROTTLING = frozenset({"KMSThrottlingException", "ServiceUnavailableException"})


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _is_invalid(exc: ClientError) -> bool:
    return _error_code(exc) in {"ValidationException", "InvalidArgumentException"}
