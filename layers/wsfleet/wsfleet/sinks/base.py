"""The sink contract: where a worker's frames go, and what every backend promises.

A worker's :class:`~wsfleet_worker.flusher.MessageFlusher` hands batches of
:class:`~wsfleet.messages.Message` to one :class:`FrameSink`. Every backend keeps the same
promises, so the flusher (byte budgets, batching, re-queueing) and the session (checkpoint)
do not know which one they write to:

* **Sizes and budgets.** :meth:`FrameSink.frame_bytes` is what one frame costs in that sink
  (a DynamoDB item, a Kinesis user record, a Firehose line), computed before the frame is
  queued; the flusher holds it against its byte budgets until the write settles.
  :class:`SinkLimits` says how large a batch and a frame may be.
* **Markers.** A frame over ``limits.frame_bytes`` cannot be stored: the flusher stores its
  marker instead (:meth:`~wsfleet.messages.Message.as_marker`: same key, size and SHA-256),
  and so for a frame the sink rejects on its own (``PutResult.rejected``).
* **Fencing.** ``put_batch(messages, guard=...)`` asks ``guard(message)`` before every attempt
  and once more for the whole request microseconds before it leaves (:class:`SendGuard`, a
  botocore ``before-send`` hook). A refused frame is reported ``fenced``, never sent.
* **Retries.** Throttling of a whole request is botocore's (``standard`` or ``adaptive``
  retry mode); what a request leaves unwritten (DynamoDB ``UnprocessedItems``, Kinesis and
  Firehose per-record errors) is retried with full-jitter backoff up to a bound, then handed
  back ``unwritten``: the flusher re-queues it in front of everything else, so throttling
  becomes backpressure, never loss.
* **The checkpoint never passes an unwritten frame**: a frame is acknowledged
  (``PutResult.written``) only once the sink took it, or took its marker.

Delivery (docs: README "Where frames go"): the ``dynamodb`` sink is idempotent (a frame
replayed after a failover overwrites its own item); ``kinesis`` and ``firehose`` are
at-least-once, every record carries ``connection_id`` and ``seq`` (or the local ``key``), and
consumers drop duplicates on (connection id, seq).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # pragma: no cover
    from ..messages import Message

__all__ = [
    "FrameSink",
    "Guard",
    "GuardTripped",
    "PrebuiltBody",
    "PutResult",
    "SendGuard",
    "SinkLimits",
]

Guard = Callable[["Message"], bool]


@dataclass
class PutResult:
    """What a :meth:`FrameSink.put_batch` achieved.

    ``unwritten``: still throttled after the retry bound (safe to retry later).
    ``rejected``: refused as invalid on its own; retrying cannot help.
    ``fenced``: not sent because the caller's guard refused them (lease no longer safe).
    ``requests``: write requests sent (the request-cost benchmark reads it).
    """

    written: int = 0
    unwritten: list[Message] = field(default_factory=list)
    rejected: list[Message] = field(default_factory=list)
    fenced: list[Message] = field(default_factory=list)
    requests: int = 0

    def merge(self, other: PutResult) -> None:
        self.written += other.written
        self.unwritten.extend(other.unwritten)
        self.rejected.extend(other.rejected)
        self.fenced.extend(other.fenced)
        self.requests += other.requests


@dataclass(frozen=True, slots=True)
class SinkLimits:
    """How the flusher must cut batches for a sink.

    :param batch_frames: frames per :meth:`FrameSink.put_batch` call at most.
    :param batch_bytes: :meth:`FrameSink.frame_bytes` per batch at most (a lone larger frame
        still goes alone): bounds the memory a request holds while botocore builds it.
    :param frame_bytes: the largest frame the sink stores; a larger one becomes its marker.
    :param ordered: the sink keeps each connection's frames in order (a stream): the flusher
        then writes one batch at a time and forms the next only after the last one settled,
        so a re-queued frame goes out before its connection's later frames.
    """

    batch_frames: int
    batch_bytes: int
    frame_bytes: int
    ordered: bool = False


class FrameSink(ABC):
    """Where a worker stores its frames. One instance per worker process, shared by the
    flusher's write threads: implementations keep per-request state thread-local."""

    #: The ``WORKER_SINK`` value that selects this backend.
    kind: ClassVar[str]
    limits: SinkLimits

    @abstractmethod
    def frame_bytes(self, message: Message) -> int:
        """The bytes ``message`` costs in this sink (held against the budgets, checked
        against ``limits.frame_bytes``)."""

    @abstractmethod
    def put_batch(self, messages: Iterable[Message], *, guard: Guard | None = None) -> PutResult:
        """Write every message (at least once), or report it unwritten, rejected or fenced.

        Runs on a worker thread. Raises :class:`~wsfleet.exceptions.StoreError` only for a
        failure that is not about throughput or a single frame (a missing stream, bad
        credentials); the caller keeps the frames and tries again later.
        """

    def read_frames(self, pk: str) -> list[dict[str, Any]]:
        """Every stored frame of one connection, oldest first, each as the JSON record of
        :func:`wsfleet.sinks.records.frame_json` (``wsfleet tail``, the demo and tests; it may
        read a whole stream)."""
        raise NotImplementedError(f"the {self.kind} sink cannot be read back")

    def highest_seq(self, pk: str) -> int:
        """The highest seq stored for a connection, 0 when unknown. Only a sink that can be
        read by key (DynamoDB) knows it; a stream sink answers 0 and a live-only upstream's
        resume gap is then measured from the checkpoint."""
        return 0


class GuardTripped(Exception):
    """Raised from the before-send hook: the request must not leave (never escapes put_batch)."""


class SendGuard:
    """The last check before a write request leaves the process.

    Registers a botocore ``before-send`` hook on ``client`` for ``operation``: while a request
    is :meth:`armed` on this thread, the hook runs ``check()`` after the request was
    serialised and signed, and raises :class:`GuardTripped` instead of sending it if the check
    fails. It is registered last on the generic event: botocore runs handlers of the more
    specific name first, and the adaptive retry mode's rate limiter (which may sleep past the
    lease when throttled) hangs on before-send. The guard must run after it.
    """

    def __init__(self, client: Any, operation: str) -> None:
        self._operation = operation
        self._pending = threading.local()
        events = getattr(getattr(client, "meta", None), "events", None)
        if events is not None:
            events.register_last(
                "before-send",
                self._before_send,
                unique_id=f"wsfleet-sink-guard-{operation}-{id(self)}",
            )

    @contextmanager
    def armed(self, check: Callable[[], bool] | None) -> Iterator[None]:
        """Requests sent on this thread inside the block are checked (``None``: not)."""
        self._pending.check = check
        try:
            yield
        finally:
            self._pending.check = None

    def _before_send(self, event_name: str = "", **_kwargs: Any) -> None:
        if not event_name.endswith(f".{self._operation}"):
            return
        check = getattr(self._pending, "check", None)
        if check is not None and not check():
            raise GuardTripped()


class PrebuiltBody:
    """Wraps a botocore client's request serializer: a write request whose JSON body the sink
    has already built is not validated and serialised again.

    botocore validates every parameter against the service model and serialises the request
    by walking the model, value by value: for a BatchWriteItem of 25 frames, or a PutRecords
    of 100 records, that was a large share of the worker's CPU per frame. A sink builds the
    body itself, byte for byte what botocore would send (``json.dumps`` of the same values in
    the same order, blobs in base64; unit tests compare the two), and the rest of the request
    (URL, method, headers) still comes from botocore, from a request with one record
    (``skeleton``). Everything else (signing, retries, the guard's ``before-send`` hook,
    Stubber in tests) is unchanged: the parameters still pass through the client, only their
    serialisation is skipped. It applies only to the request ``matches`` recognises (the very
    list the body was built from), on the thread that prepared it.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._pending = threading.local()

    def serialize_to_request(self, parameters: Any, operation_model: Any) -> Any:
        pending: _Prepared | None = getattr(self._pending, "request", None)
        if (
            pending is not None
            and operation_model.name == pending.operation
            and pending.matches(parameters)
        ):
            serialized = self.inner.serialize_to_request(pending.skeleton, operation_model)
            serialized["body"] = pending.body
            return serialized
        return self.inner.serialize_to_request(parameters, operation_model)

    def prepare(
        self,
        operation: str,
        matches: Callable[[Mapping[str, Any]], bool],
        skeleton: Mapping[str, Any],
        body: bytes,
    ) -> None:
        """The next ``operation`` request on this thread whose parameters ``matches`` accepts
        goes with ``body``; its URL and headers come from ``skeleton``."""
        self._pending.request = _Prepared(operation, matches, skeleton, body)

    def clear(self) -> None:
        self._pending.request = None

    @contextmanager
    def prepared(
        self,
        operation: str,
        matches: Callable[[Mapping[str, Any]], bool],
        skeleton: Mapping[str, Any],
        body: bytes,
    ) -> Iterator[None]:
        """:meth:`prepare` for the requests sent inside the block."""
        self.prepare(operation, matches, skeleton, body)
        try:
            yield
        finally:
            self.clear()

    @classmethod
    def install(cls, client: Any) -> PrebuiltBody | None:
        """Wrap ``client``'s serializer once (clients may be shared); None if it has none."""
        current = getattr(client, "_serializer", None)
        if isinstance(current, cls):
            return current
        if current is None or not callable(getattr(current, "serialize_to_request", None)):
            return None
        wrapper = cls(current)
        client._serializer = wrapper
        return wrapper


@dataclass(frozen=True, slots=True)
class _Prepared:
    operation: str
    matches: Callable[[Mapping[str, Any]], bool]
    skeleton: Mapping[str, Any]
    body: bytes
