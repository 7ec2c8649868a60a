"""MessageFlusher: one writer per worker process, batching frames of every connection.

Sessions hand each received frame to :meth:`MessageFlusher.put`; the flusher writes them to
the worker's sink (:class:`wsfleet.sinks.base.FrameSink`: the messages table by default, or a
Kinesis or Firehose stream) in batches cut to the sink's :class:`~wsfleet.sinks.base.SinkLimits`
(for DynamoDB, BatchWriteItem, 25 per request), from all connections together. That coalescing
is what keeps the request count per message low: at 100 frames/s a worker sends about 4
DynamoDB requests per second (<= 1 per 25 frames) instead of 100. A batch is sent when it is
full or when its oldest frame has waited ``flush_ms`` (MESSAGE_FLUSH_MS), whichever comes
first, and up to ``max_in_flight`` batches are written concurrently. For a sink that keeps
each connection's order (``limits.ordered``: the streams) one batch is written at a time and
the next is formed only once it settled, so a frame handed back unwritten is sent again before
its connection's later frames.

Acknowledgement flows back per frame (:meth:`FrameOwner.on_written`), which is what advances a
session's checkpoint. Frames the sink did not take (throttling beyond its retry bound, or an
outage) go back to the front of the line after a pause; they are never silently dropped,
because the checkpoint must not pass them.

Fencing: each frame's owner is asked :meth:`FrameOwner.may_write` when its batch is formed,
and again (through the store's ``guard``) before every request, at the last moment before it
is sent. A session that lost its lease, or whose self-fence deadline has passed (e.g. the
process was paused past its lease), gets its frames dropped: a fenced worker writes nothing.
The guard cannot recall a request that has already left, so a session that releases its lease
first waits (:meth:`MessageFlusher.quiesce`) until no batch holding its frames is still being
written: no sink write takes a condition, and a batch landing after the release could land after
the next owner's acquire.

Backpressure: the queue is bounded in frames (``capacity``) and in bytes (``capacity_bytes``:
the sink's size of every frame held, :meth:`~wsfleet.sinks.base.FrameSink.frame_bytes`, from
:meth:`put` until its write is settled, the batches being written included, because that is
the memory they hold). When either is full,
:meth:`put` waits, the session stops reading its socket, websockets stops reading TCP, and the
upstream's sends block. Memory stays flat under any inbound rate. A frame is always admitted
into an empty queue, so a frame larger than the budget cannot wedge the worker. Only the
sessions' reading waits on it: renewals, the control channel and the flusher's own writes
never do, so backpressure cannot starve the heartbeat or the fencing.

Size: :meth:`put` computes each frame's size in the sink before queueing it. A frame that
cannot be stored (over the sink's ``limits.frame_bytes``: for DynamoDB, an item over
:data:`~wsfleet.messages.MAX_ITEM_BYTES`) is replaced by a marker at its key (its size and
SHA-256, see :meth:`~wsfleet.messages.Message.as_marker`), counted (``OversizeFrames``) and
logged. So is a frame the sink rejects anyway. Only a rejected
*marker* reaches :meth:`FrameOwner.on_rejected`: the session then ends without its checkpoint
passing the frame.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from wsfleet.clock import Clock, now_ms
from wsfleet.messages import MAX_BATCH_BYTES, Message, PutResult
from wsfleet.sinks.base import FrameSink

from .observability import WorkerMetrics
from .offload import Offloader

__all__ = ["MAX_BATCH_BYTES", "FrameOwner", "MessageFlusher", "QueuedFrame"]

# MAX_BATCH_BYTES (re-exported): the DynamoDB sink's batch byte bound, wsfleet.messages.


class FrameOwner(Protocol):
    """What the flusher needs from the session a frame belongs to."""

    def may_write(self, now_ms: int) -> bool: ...

    def on_written(self, message: Message) -> None: ...

    def on_rejected(self, message: Message) -> None: ...


@dataclass(slots=True)
class QueuedFrame:
    message: Message
    owner: FrameOwner
    enqueued_at: float = field(default_factory=time.monotonic)
    size: int = 0  # sink bytes held against the byte budget (set by MessageFlusher.put)


class MessageFlusher:
    """Coalesces frames of all sessions into the sink's write requests.

    :param store: the sink (the messages table by default).
    :param offloader: runs ``put_batch`` on its ``write`` pool.
    :param flush_ms: the longest a frame waits for its batch to fill.
    :param capacity: frames queued at most before :meth:`put` blocks (backpressure).
    :param capacity_bytes: item bytes held at most (queued and being written) before
        :meth:`put` blocks; ``None`` for no byte limit.
    :param max_in_flight: batches being written at the same time (1 for an ordered sink).
    """

    def __init__(
        self,
        store: FrameSink,
        offloader: Offloader,
        metrics: WorkerMetrics,
        *,
        flush_ms: int = 100,
        capacity: int = 10_000,
        capacity_bytes: int | None = None,
        max_in_flight: int = 4,
        logger: Any = None,
        clock: Clock = now_ms,
    ) -> None:
        self._store = store
        self._limits = store.limits
        self._ordered = store.limits.ordered
        self._offloader = offloader
        self._metrics = metrics
        self._flush_seconds = max(0, flush_ms) / 1000
        self._capacity = max(1, capacity)
        self._capacity_bytes = capacity_bytes
        self._held_bytes = 0
        self._frames: collections.deque[QueuedFrame] = collections.deque()
        self._queued_bytes = 0  # sizes of the frames in _frames
        # put() wakes the collector only once this many frames or more than this many bytes
        # are queued: the first frame of a batch, or enough to fill the batch being formed.
        self._wake_frames = 1
        self._wake_bytes = 0
        self._retry: collections.deque[QueuedFrame] = collections.deque()
        self._not_empty = asyncio.Event()
        # put() calls waiting for room, first come first served: (item bytes, wake-up).
        self._room_waiters: collections.deque[tuple[int, asyncio.Future[None]]] = (
            collections.deque()
        )
        self._slots = asyncio.Semaphore(1 if self._ordered else max_in_flight)
        self._urgent = False
        self._writes: set[asyncio.Task[None]] = set()
        self._logger = logger
        self._clock = clock
        self._writing: collections.Counter[FrameOwner] = collections.Counter()
        self._write_ended = asyncio.Event()

    @property
    def store(self) -> FrameSink:
        """The sink the flusher writes to (sessions read its highest seq)."""
        return self._store

    @property
    def queued(self) -> int:
        """Frames waiting for a batch (not counting batches being written)."""
        return len(self._frames) + len(self._retry)

    @property
    def held_bytes(self) -> int:
        """Sink bytes of the frames held: queued, waiting for a retry, or being written."""
        return self._held_bytes

    @property
    def waiting_puts(self) -> int:
        """put() calls blocked for room: sessions under backpressure."""
        return len(self._room_waiters)

    async def put(self, frame: QueuedFrame) -> int:
        """Queue a frame; waits while the queue is full (the caller stops reading).

        Returns the bytes the frame holds against the budget (its size, or its marker's)
        until the owner hears :meth:`FrameOwner.on_written` or ``on_rejected`` about it.
        """
        size = self._fit(frame)
        if self._room_waiters or not self._has_room(size):
            self._not_empty.set()  # the collector moves queued frames into its batch
            await self._wait_for_room(size)
        frame.size = size
        self._held_bytes += size
        self._frames.append(frame)
        self._queued_bytes += size
        if len(self._frames) >= self._wake_frames or self._queued_bytes > self._wake_bytes:
            self._not_empty.set()
        return size

    def _has_room(self, size: int) -> bool:
        return self._fits(len(self._frames), self._held_bytes, size)

    def _fits(self, frames: int, held: int, size: int) -> bool:
        if frames >= self._capacity:
            return False
        budget = self._capacity_bytes
        return budget is None or held == 0 or held + size <= budget

    async def _wait_for_room(self, size: int) -> None:
        """Queue behind the puts already waiting; return once this frame fits.

        Each put waits on a future of its own, woken in arrival order by :meth:`_wake`, and
        only as many as the room freed can take. With one event for all, every batch taken
        woke every waiting session (a hundred, under backpressure) to find, all but a few,
        that there was still no room: most of the worker's CPU went to that.
        """
        loop = asyncio.get_running_loop()
        front = False  # a put woken for room that is no longer there keeps its turn
        while True:
            waiter: asyncio.Future[None] = loop.create_future()
            entry = (size, waiter)
            if front:
                self._room_waiters.appendleft(entry)
            else:
                self._room_waiters.append(entry)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken, then cancelled: the room goes to the next one
                else:
                    with contextlib.suppress(ValueError):
                        self._room_waiters.remove(entry)
                raise
            if self._has_room(size):
                return
            front = True

    def _wake(self) -> None:
        """Room was freed: wake the waiting puts, in order, that it has room for."""
        waiters = self._room_waiters
        frames, held = len(self._frames), self._held_bytes
        while waiters:
            size, waiter = waiters[0]
            if waiter.done():  # cancelled
                waiters.popleft()
                continue
            if not self._fits(frames, held, size):
                return
            waiters.popleft()
            waiter.set_result(None)
            frames += 1
            held += size

    def _release(self, frames: list[QueuedFrame]) -> None:
        """Frames settled or dropped: their bytes leave the budget."""
        if frames:
            self._held_bytes -= sum(frame.size for frame in frames)
            self._wake()

    def _fit(self, frame: QueuedFrame) -> int:
        """The frame's size in the sink; a frame too large to store is swapped for its marker."""
        message = frame.message
        size = self._store.frame_bytes(message)
        if size > self._limits.frame_bytes and not message.is_marker:
            why = f"larger than the {self._store.kind} sink stores"
            frame.message = self._marker(message, size, why)
            size = self._store.frame_bytes(frame.message)
        return size

    def _marker(self, message: Message, size: int, why: str) -> Message:
        marker = message.as_marker(size)
        self._metrics.count("OversizeFrames")
        if self._logger is not None:
            self._logger.error(
                "frame cannot be stored; a marker with its size and digest is stored instead",
                extra={
                    "pk": message.pk, "sk": message.sk, "item_bytes": size,
                    "data_sha256": marker.data_sha256, "why": why,
                },
            )
        return marker

    def flush_now(self) -> None:
        """Send what is queued without waiting for batches to fill (shutdown, STOP)."""
        self._urgent = True
        self._not_empty.set()

    async def quiesce(self, owner: FrameOwner) -> None:
        """Wait until no batch holding ``owner``'s frames is being written.

        Call it once ``owner.may_write`` has turned false, so that no new request (nor a
        retry: the guard runs before every attempt) can carry its frames. It waits as long as
        a request is out: the caller bounds it (``asyncio.timeout``).
        """
        while self._writing[owner]:
            self._write_ended.clear()
            await self._write_ended.wait()

    async def run(self) -> None:
        """Collect and send batches forever (cancel to stop; in-flight writes finish)."""
        while True:
            if self._ordered:  # the next batch starts after the last one's retries were queued
                await self._slots.acquire()
                try:
                    batch = await self._collect()
                except BaseException:
                    self._slots.release()
                    raise
            else:
                batch = await self._collect()
                await self._slots.acquire()
            task = asyncio.create_task(self._write(batch))
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)

    def _take(self, batch: list[QueuedFrame], used: int) -> int:
        """Move queued frames (retries first) into ``batch``, holding ``used`` bytes, up to a
        full batch (the sink's ``batch_frames`` and ``batch_bytes``). Returns the bytes the
        batch holds then."""
        for source in (self._retry, self._frames):
            while source and not self._full(batch, used, source[0]):
                frame = source.popleft()
                used += frame.size
                batch.append(frame)
                if source is self._frames:
                    self._queued_bytes -= frame.size
        if self._room_waiters:
            self._wake()
        return used

    def _next(self) -> QueuedFrame | None:
        """The frame :meth:`_take` would take next."""
        source = self._retry or self._frames
        return source[0] if source else None

    async def _wait_for_frames(self) -> None:
        if not (self._frames or self._retry):
            await self._wait_not_empty(None)

    async def _wait_not_empty(self, seconds: float | None) -> None:
        self._not_empty.clear()
        try:
            async with asyncio.timeout(seconds):
                await self._not_empty.wait()
        except TimeoutError:
            pass

    async def _wait_to_fill(self, batch: list[QueuedFrame], used: int, seconds: float) -> None:
        """Wait until the batch being formed could be filled, for ``seconds`` at most.

        A frame queued meanwhile waits in the queue: waking the collector for each one (a
        task switch and a timer per frame, at 20 frames/s on each of 100 connections) cost
        more CPU than writing the frame. The collector wakes when the queue holds enough to
        fill the batch, when a put waits for room in the queue (the frames it moves into the
        batch make room), on :meth:`flush_now`, or on a retry, else at the batch's deadline.
        """
        limits = self._limits
        self._wake_frames = max(1, limits.batch_frames - len(batch))
        self._wake_bytes = max(0, limits.batch_bytes - used)
        try:
            await self._wait_not_empty(seconds)
        finally:
            self._wake_frames, self._wake_bytes = 1, 0

    async def _collect(self) -> list[QueuedFrame]:
        batch: list[QueuedFrame] = []
        used = 0
        while not batch:
            await self._wait_for_frames()
            used = self._take(batch, used)
        deadline = batch[0].enqueued_at + self._flush_seconds
        while not self._full(batch, used, self._next()):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._urgent:
                break
            if not (self._frames or self._retry):
                await self._wait_to_fill(batch, used, remaining)
            used = self._take(batch, used)
        if not (self._frames or self._retry):
            self._urgent = False
        return batch

    async def _write(self, batch: list[QueuedFrame]) -> None:
        try:
            live = self._writable(batch)
            if not live:
                return
            owners = {frame.message.key: frame.owner for frame in live}
            writing = set(owners.values())
            self._writing.update(writing)
            clock = self._clock

            def guard(message: Message) -> bool:  # runs on the write thread, before each send
                return owners[message.key].may_write(clock())

            try:
                result: PutResult = await self._offloader.write(
                    self._store.put_batch, [frame.message for frame in live], guard=guard
                )
            except Exception as exc:  # StoreError, or anything unexpected: keep the frames
                self._log_warning("message batch failed; will retry", exc)
                result = PutResult(unwritten=[frame.message for frame in live], requests=1)
            finally:
                self._done_writing(writing)
            if result.fenced:
                self._metrics.count("FencedFramesDropped", len(result.fenced))
            self._settle(live, result)
            if result.unwritten:
                await asyncio.sleep(random.uniform(0.05, 0.25))  # let the sink recover
                unwritten = _keys(result.unwritten)
                self._retry.extend(frame for frame in live if frame.message.key in unwritten)
                self._not_empty.set()
        finally:
            self._slots.release()

    def _done_writing(self, owners: set[FrameOwner]) -> None:
        for owner in owners:
            self._writing[owner] -= 1
            if not self._writing[owner]:
                del self._writing[owner]  # a finished session must not stay referenced
        self._write_ended.set()

    def _writable(self, batch: list[QueuedFrame]) -> list[QueuedFrame]:
        """Drop frames whose session may no longer write (fenced or past its deadline)."""
        now = self._clock()
        live = [frame for frame in batch if frame.owner.may_write(now)]
        if len(live) < len(batch):
            self._metrics.count("FencedFramesDropped", len(batch) - len(live))
            self._release([frame for frame in batch if not frame.owner.may_write(now)])
        return live

    def _settle(self, live: list[QueuedFrame], result: PutResult) -> None:
        unwritten, rejected = _keys(result.unwritten), _keys(result.rejected)
        fenced = _keys(result.fenced)
        oldest = min(frame.enqueued_at for frame in live)
        self._metrics.observe("FlushLatencyMs", (time.monotonic() - oldest) * 1000)
        self._metrics.count("MessageWriteRequests", result.requests)
        self._metrics.count("MessagesWritten", result.written)
        settled: list[QueuedFrame] = []
        for frame in live:
            key = frame.message.key
            if key in unwritten:
                continue  # re-queued by the caller: still held
            if key in rejected and not frame.message.is_marker:
                # the sink refused the frame itself: store its marker instead (never skip it)
                self._metrics.count("MessagesRejected")
                message = frame.message
                size = self._store.frame_bytes(message)
                frame.message = self._marker(message, size, f"rejected by {self._store.kind}")
                self._retry.append(frame)
                self._not_empty.set()
                continue
            settled.append(frame)
            if key in fenced:
                continue
            if key in rejected:
                self._metrics.count("MessagesRejected")
                frame.owner.on_rejected(frame.message)
            else:
                frame.owner.on_written(frame.message)
        self._release(settled)

    async def aclose(self) -> None:
        """Wait for batches already being written (the caller cancels :meth:`run`)."""
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)

    def _full(self, batch: list[QueuedFrame], used: int, following: QueuedFrame | None) -> bool:
        """Whether ``batch`` (holding ``used`` bytes) cannot take ``following`` as well."""
        limits = self._limits
        if len(batch) >= limits.batch_frames:
            return True
        return bool(batch) and following is not None and used + following.size > limits.batch_bytes

    def _log_warning(self, message: str, exc: BaseException) -> None:
        if self._logger is not None:
            self._logger.warning(message, extra={"error": str(exc)})


def _keys(messages: list[Message]) -> set[tuple[str, str]]:
    return {m.key for m in messages}
