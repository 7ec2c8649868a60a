"""MessageFlusher: coalescing, acknowledgement, fencing, retries and backpressure.

The store is a stand-in that records batches (what DynamoDB does with them is covered by the
MessageStore tests); everything else is the real flusher on a real event loop.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import threading

import pytest

from bench.waiting import wait_until_async
from wsfleet.messages import Message, MessageStore, PutResult, seq_sk
from wsfleet_worker.flusher import MAX_BATCH_BYTES, MessageFlusher, QueuedFrame
from wsfleet_worker.observability import WorkerMetrics
from wsfleet_worker.offload import Offloader

WAIT = 10.0


class RecordingStore(MessageStore):
    """put_batch stand-in (the DynamoDB sink's limits): records batch sizes; can refuse,
    reject, or block."""

    def __init__(self) -> None:
        super().__init__(None, "messages")
        self.batches: list[list[Message]] = []
        self.unwritten_once: set[tuple[str, str]] = set()
        self.rejected: set[tuple[str, str]] = set()
        self.reject_markers = False  # True: DynamoDB refuses a frame's marker too
        self.gate = threading.Event()
        self.gate.set()
        self.at_gate = threading.Event()  # a batch reached put_batch (and maybe the gate)
        self.sent = threading.Event()  # a request passed the guard ("left the process")
        self.landed = threading.Event()  # ...and its response came back
        self.landed.set()

    def expires_at(self, received_at_ms: int) -> int | None:
        return None

    def put_batch(self, messages: list[Message], guard=None) -> PutResult:
        self.at_gate.set()
        self.gate.wait(WAIT)
        result = PutResult(requests=1)
        if guard is not None:
            result.fenced = [m for m in messages if not guard(m)]
            messages = [m for m in messages if guard(m)]
        self.sent.set()
        self.landed.wait(WAIT)
        self.batches.append(list(messages))
        for m in messages:
            if m.key in self.unwritten_once:
                self.unwritten_once.discard(m.key)
                result.unwritten.append(m)
            elif m.key in self.rejected and (self.reject_markers or not m.is_marker):
                result.rejected.append(m)
            else:
                result.written += 1
        return result


class Owner:
    def __init__(self, name: str, *, writable: bool = True) -> None:
        self.name = name
        self.writable = writable
        self.written: list[int] = []
        self.rejected: list[int] = []

    def may_write(self, now_ms: int) -> bool:
        return self.writable

    def on_written(self, message: Message) -> None:
        self.written.append(message.seq or 0)

    def on_rejected(self, message: Message) -> None:
        self.rejected.append(message.seq or 0)


def frame_of(owner: Owner, seq: int, size: int) -> QueuedFrame:
    message = Message(f"CONN#{owner.name}", seq_sk(seq), "x" * size, 0, "w", 1, seq)
    return QueuedFrame(message, owner)


def frame(owner: Owner, seq: int) -> QueuedFrame:
    message = Message(f"CONN#{owner.name}", seq_sk(seq), f"{owner.name}:{seq}", 0, "w", 1, seq)
    return QueuedFrame(message, owner)


#: The shared poll (bench.waiting), bounded by WAIT.
until = functools.partial(wait_until_async, timeout=WAIT)


def run_with_flusher(
    scenario, *, flush_ms: int = 20, capacity: int = 1000, in_flight: int = 2,
    capacity_bytes: int | None = None,
):
    async def main():
        store = RecordingStore()
        metrics = WorkerMetrics("t", emit=lambda doc: None)
        offloader = Offloader(io_threads=1, write_threads=in_flight)
        flusher = MessageFlusher(
            store, offloader, metrics, flush_ms=flush_ms, capacity=capacity,
            capacity_bytes=capacity_bytes, max_in_flight=in_flight,
        )
        task = asyncio.create_task(flusher.run())
        try:
            await scenario(flusher, store, metrics)
        finally:
            store.gate.set()
            store.landed.set()
            task.cancel()
            await flusher.aclose()
            offloader.shutdown()

    asyncio.run(main())


def test_frames_of_many_connections_share_batches_of_25():
    async def scenario(flusher, store, metrics):
        owners = [Owner(f"c{i}") for i in range(3)]
        for seq in range(1, 21):
            for owner in owners:
                await flusher.put(frame(owner, seq))
        await until(lambda: all(len(o.written) == 20 for o in owners))
        sizes = [len(b) for b in store.batches]
        assert sum(sizes) == 60 and max(sizes) <= 25
        assert len(store.batches) <= 4  # 60 frames: 3 full batches, maybe one split by timing
        assert {m.pk for b in store.batches[:1] for m in b} == {"CONN#c0", "CONN#c1", "CONN#c2"}
        assert metrics.totals["MessagesWritten"] == 60
        assert metrics.totals["MessageWriteRequests"] == len(store.batches)

    run_with_flusher(scenario, flush_ms=200)


def test_frames_trickling_in_wake_the_collector_once_per_batch_not_once_per_frame():
    async def scenario(flusher, store, metrics):
        takes = 0
        take = flusher._take

        def counting_take(*args):
            nonlocal takes
            takes += 1
            return take(*args)

        flusher._take = counting_take
        owner = Owner("a")
        # GIVEN a batch being formed (its first frame queued, a minute before its deadline)
        await flusher.put(frame(owner, 1))
        await until(lambda: takes >= 1)
        # WHEN 59 more frames arrive one at a time, the loop running between them
        for seq in range(2, 61):
            await flusher.put(frame(owner, seq))
            await asyncio.sleep(0)
        # THEN two full batches of 25 left at once, without waiting for the deadline...
        await until(lambda: len(owner.written) == 50)
        assert [len(b) for b in store.batches] == [25, 25]
        # ...the collector having woken about once per batch, not once per frame
        assert takes <= 6
        # and the 10 left over go with flush_now
        flusher.flush_now()
        await until(lambda: owner.written == list(range(1, 61)))

    run_with_flusher(scenario, flush_ms=60_000)


def test_a_queue_smaller_than_a_batch_does_not_hold_producers_until_the_deadline():
    async def scenario(flusher, store, metrics):
        owner = Owner("a")
        # GIVEN a queue of 5 frames and batches of 25, the deadline a minute away
        # WHEN 12 frames arrive one at a time
        for seq in range(1, 13):
            await asyncio.wait_for(flusher.put(frame(owner, seq)), WAIT)
        # THEN every put was admitted (the collector moved queued frames into its batch),
        # and the batch goes, in order, once flushed
        flusher.flush_now()
        await until(lambda: owner.written == list(range(1, 13)))

    run_with_flusher(scenario, flush_ms=60_000, capacity=5)


def test_a_lone_frame_is_flushed_after_flush_ms():
    async def scenario(flusher, store, metrics):
        owner = Owner("a")
        await flusher.put(frame(owner, 1))
        await until(lambda: owner.written == [1])
        assert [len(b) for b in store.batches] == [1]

    run_with_flusher(scenario)


def test_flush_now_does_not_wait_for_the_batch_to_fill():
    async def scenario(flusher, store, metrics):
        owner = Owner("a")
        await flusher.put(frame(owner, 1))
        flusher.flush_now()
        await until(lambda: owner.written == [1])

    run_with_flusher(scenario, flush_ms=60_000)


def test_frames_of_a_fenced_owner_are_dropped_not_written():
    async def scenario(flusher, store, metrics):
        fenced, live = Owner("z", writable=False), Owner("a")
        for seq in (1, 2, 3):
            await flusher.put(frame(fenced, seq))
            await flusher.put(frame(live, seq))
        await until(lambda: live.written == [1, 2, 3])
        assert fenced.written == []
        assert all(m.pk != "CONN#z" for b in store.batches for m in b)
        assert metrics.totals["FencedFramesDropped"] == 3

    run_with_flusher(scenario)


def test_an_owner_fenced_while_its_batch_waits_for_a_thread_writes_nothing():
    async def scenario(flusher, store, metrics):
        owner, other = Owner("a"), Owner("b")
        store.gate.clear()  # the write thread is busy: the batch waits at the store
        await flusher.put(frame(owner, 1))
        await flusher.put(frame(other, 1))
        flusher.flush_now()
        await until(store.at_gate.is_set)
        owner.writable = False  # the lease is lost before the request leaves
        store.gate.set()
        await until(lambda: other.written == [1])
        assert owner.written == []
        assert all(m.pk != "CONN#a" for b in store.batches for m in b)
        assert metrics.totals["FencedFramesDropped"] == 1

    run_with_flusher(scenario)


def test_unwritten_frames_are_retried_and_acknowledged_once():
    async def scenario(flusher, store, metrics):
        owner = Owner("a")
        store.unwritten_once = {("CONN#a", seq_sk(2))}
        for seq in (1, 2, 3):
            await flusher.put(frame(owner, seq))
        await until(lambda: sorted(owner.written) == [1, 2, 3])
        assert owner.written.count(2) == 1
        assert sum(1 for b in store.batches for m in b if m.seq == 2) == 2

    run_with_flusher(scenario)


def test_a_rejected_frame_is_stored_as_a_marker_and_acknowledged_as_that():
    async def scenario(flusher, store, metrics):
        # GIVEN DynamoDB refuses frame 2 itself (but takes a small marker at its key)
        owner = Owner("a")
        store.rejected = {("CONN#a", seq_sk(2))}
        for seq in (1, 2):
            await flusher.put(frame(owner, seq))
        # THEN frame 2 is acknowledged only once its marker is written: never skipped
        await until(lambda: sorted(owner.written) == [1, 2])
        marker = store.batches[-1][-1]
        assert (marker.seq, marker.message_data) == (2, "")
        assert marker.oversize_bytes and marker.data_sha256
        assert owner.rejected == []
        assert metrics.totals["MessagesRejected"] == 1
        assert metrics.totals["OversizeFrames"] == 1
        assert flusher.held_bytes == 0

    run_with_flusher(scenario)


def test_a_rejected_marker_is_reported_to_its_owner():
    async def scenario(flusher, store, metrics):
        owner = Owner("a")
        store.rejected = {("CONN#a", seq_sk(2))}
        store.reject_markers = True
        for seq in (1, 2):
            await flusher.put(frame(owner, seq))
        await until(lambda: owner.written == [1] and owner.rejected == [2])
        assert metrics.totals["MessagesRejected"] == 2  # the frame, then its marker

    run_with_flusher(scenario)


def test_a_frame_too_large_for_an_item_is_queued_as_a_marker_before_any_write():
    async def scenario(flusher, store, metrics):
        # GIVEN a frame of 200,000 CJK characters: 600 KB of UTF-8, over the item limit
        owner = Owner("big")
        data = "\u8a9e" * 200_000
        message = Message("CONN#big", seq_sk(1), data, 0, "w", 1, 1)
        # WHEN it is queued THEN what is held is the marker: small, with the size and digest
        held = await flusher.put(QueuedFrame(message, owner))
        assert held < 1_000
        await until(lambda: owner.written == [1])
        (stored,) = store.batches[0]
        assert stored.message_data == "" and stored.oversize_bytes > 600_000
        assert stored.data_sha256 == hashlib.sha256(data.encode()).hexdigest()
        assert metrics.totals["OversizeFrames"] == 1

    run_with_flusher(scenario)


def test_the_byte_budget_blocks_the_producer_until_writes_settle():
    async def scenario(flusher, store, metrics):
        # GIVEN a budget of 100 kB and writes that hang
        owner = Owner("a")
        store.gate.clear()
        sizes = [await flusher.put(frame_of(owner, seq, 40_000)) for seq in (1, 2)]
        assert flusher.held_bytes == sum(sizes) > 80_000
        # WHEN a third 40 kB frame comes THEN put waits: the budget holds in-flight writes
        third = asyncio.create_task(flusher.put(frame_of(owner, 3, 40_000)))
        await until(lambda: flusher.waiting_puts == 1)
        assert not third.done()
        # WHEN the writes land THEN the bytes are released and the producer goes on
        store.gate.set()
        await asyncio.wait_for(third, WAIT)
        await until(lambda: sorted(owner.written) == [1, 2, 3])
        assert flusher.held_bytes == 0

    run_with_flusher(scenario, capacity_bytes=100_000)


def test_a_frame_larger_than_the_budget_is_admitted_into_an_empty_queue():
    async def scenario(flusher, store, metrics):
        owner = Owner("a")
        await asyncio.wait_for(flusher.put(frame_of(owner, 1, 50_000)), WAIT)
        await until(lambda: owner.written == [1])

    run_with_flusher(scenario, capacity_bytes=10_000)


def test_fenced_frames_release_their_bytes():
    async def scenario(flusher, store, metrics):
        owner = Owner("a", writable=False)
        await flusher.put(frame_of(owner, 1, 40_000))
        await until(lambda: flusher.held_bytes == 0)
        assert metrics.totals["FencedFramesDropped"] == 1

    run_with_flusher(scenario, capacity_bytes=100_000)


def test_a_full_queue_blocks_the_producer():
    async def scenario(flusher, store, metrics):
        owner = Owner("a")
        store.gate.clear()  # DynamoDB is slow: nothing completes
        # capacity 5 + 2 batches in flight of 1 frame each (they are taken as they come)
        accepted = 0

        async def produce():
            nonlocal accepted
            for seq in range(1, 101):
                await flusher.put(frame(owner, seq))
                accepted += 1

        producer = asyncio.create_task(produce())
        await until(lambda: flusher.waiting_puts == 1)
        assert accepted < 100  # blocked: the session would stop reading its socket
        assert not producer.done()
        store.gate.set()
        await producer
        await until(lambda: len(owner.written) == 100)

    run_with_flusher(scenario, capacity=5)


def test_quiesce_waits_for_a_request_that_already_left():
    """A session about to release its lease must not race its own last batch: the guard
    cannot recall a request already sent, so quiesce waits until its response is back."""

    async def scenario(flusher, store, metrics):
        owner, bystander = Owner("a"), Owner("b")
        store.landed.clear()
        await flusher.put(frame(owner, 1))
        flusher.flush_now()
        await until(store.sent.is_set)
        owner.writable = False  # the session is ending: no new request may carry its frames
        await asyncio.wait_for(flusher.quiesce(bystander), 0.01)  # nothing of b's is out
        with pytest.raises(TimeoutError):  # a's batch is still out: nothing may end the wait
            await asyncio.wait_for(flusher.quiesce(owner), 0.2)
        store.landed.set()
        await asyncio.wait_for(flusher.quiesce(owner), WAIT)
        assert [m.seq for b in store.batches for m in b] == [1]  # it had landed by then
        assert owner.written == [1]

    run_with_flusher(scenario)


def test_a_batch_holds_at_most_max_batch_bytes_of_frames():
    async def scenario(flusher, store, metrics):
        # GIVEN twenty 350 kB frames (7 MB) queued at once (writes held until all are queued)
        owner = Owner("a")
        store.gate.clear()
        for seq in range(1, 21):
            await flusher.put(frame_of(owner, seq, 350_000))
        store.gate.set()
        await until(lambda: len(owner.written) == 20)
        # THEN no request carried more than MAX_BATCH_BYTES of items (botocore copies a batch)
        sizes = [sum(m.item_bytes(None) for m in batch) for batch in store.batches]
        assert max(sizes) <= MAX_BATCH_BYTES and sum(len(b) for b in store.batches) == 20
        assert "OversizeFrames" not in metrics.totals

    run_with_flusher(scenario, flush_ms=200)


def test_producers_blocked_on_a_full_queue_are_admitted_in_arrival_order():
    async def scenario(flusher, store, metrics):
        store.gate.clear()  # DynamoDB is slow: the queue fills up
        owners = [Owner(f"c{i}") for i in range(8)]
        admitted: list[str] = []

        async def produce(owner: Owner) -> None:
            await flusher.put(frame(owner, 1))
            admitted.append(owner.name)

        tasks = []
        for owner in owners:  # each starts (and, once the queue is full, waits) in turn
            tasks.append(asyncio.create_task(produce(owner)))
            await until(lambda: len(admitted) + flusher.waiting_puts == len(tasks))
        assert len(admitted) < len(owners)  # some are waiting for room
        store.gate.set()
        await asyncio.gather(*tasks)
        assert admitted == [owner.name for owner in owners]
        await until(lambda: all(owner.written == [1] for owner in owners))

    run_with_flusher(scenario, capacity=1, in_flight=1, flush_ms=0)  # batches close at once


def test_a_cancelled_waiting_producer_does_not_hold_up_the_ones_behind_it():
    async def scenario(flusher, store, metrics):
        store.gate.clear()
        first, cancelled, behind = Owner("a"), Owner("b"), Owner("c")
        await flusher.put(frame(first, 1))
        await until(lambda: flusher.queued == 0)  # taken into a batch: its write waits
        await flusher.put(frame(first, 2))
        await until(lambda: flusher.queued == 0)  # the next batch, waiting for the slot
        await flusher.put(frame(first, 3))  # the queue (capacity 1) is full
        waiting = asyncio.create_task(flusher.put(frame(cancelled, 1)))
        later = asyncio.create_task(flusher.put(frame(behind, 1)))
        await until(lambda: flusher.waiting_puts == 2)
        assert not waiting.done() and not later.done()
        waiting.cancel()
        store.gate.set()
        await later
        await until(lambda: first.written == [1, 2, 3] and behind.written == [1])
        assert cancelled.written == []

    run_with_flusher(scenario, capacity=1, in_flight=1, flush_ms=0)  # batches close at once
