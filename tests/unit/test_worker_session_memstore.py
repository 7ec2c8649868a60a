"""A session end to end in memory: frames from an upstream double into a message-store double,
its lease on :class:`wsfleet.memstore.InMemoryLeaseStore`, with the real flusher and offloader.

What is covered here does not depend on placement or hand-off rules: frames streamed and
stored in order, the checkpoint written from what is stored (and telling the session of a STOP
or a lost lease), the resume position of every connect (the acquired checkpoint, then the
highest frame received), and the endings (a control STOP, a clean upstream close, a fence).

Doubles: :class:`Upstream` stands for the connector and :class:`FakeSocket` for the
``ClientConnection`` it returns (``async for``, ``send``, ``close``, ``transport.abort`` and
the closing-handshake record the session reads); :class:`Messages` keeps written messages in a
dict and honours the flusher's guard like the DynamoDB one. Each test reads GIVEN / WHEN / THEN.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

from websockets.exceptions import ConnectionClosedError
from websockets.frames import Close
from worker_doubles import Logger, sync

from bench.waiting import wait_until_async
from wsfleet.memstore import InMemoryLeaseStore
from wsfleet.messages import Guard, Message, MessageStore, PutResult
from wsfleet.record import ConnectionRecord, DesiredState, connection_pk
from wsfleet.settings import Settings
from wsfleet.upstream_options import parse_upstream_options
from wsfleet_worker.config import WorkerConfig
from wsfleet_worker.flusher import MessageFlusher
from wsfleet_worker.observability import WorkerMetrics
from wsfleet_worker.offload import Offloader
from wsfleet_worker.session import Session, SessionContext, SessionResult
from wsfleet_worker.session_rules import ExitReason

WAIT = 10.0
WORKER = "w1"

#: The shared poll (bench.waiting), bounded by WAIT.
until = functools.partial(wait_until_async, timeout=WAIT)


# ---------------------------------------------------------------- doubles


class FakeSocket:
    """The part of ``websockets``' ClientConnection a session uses. Frames are fed with
    :meth:`feed`; :meth:`close_from_upstream` and :meth:`drop` end the iteration the way
    websockets does (a clean close ends it, anything else raises ConnectionClosedError)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._inbox: asyncio.Queue[Any] = asyncio.Queue()
        self.protocol = SimpleNamespace(close_rcvd=None, close_sent=None, close_rcvd_then_sent=None)
        self.transport = SimpleNamespace(abort=self._abort)
        self.aborted = False
        self.sent: list[str] = []

    @property
    def from_seq(self) -> int | None:
        values = parse_qs(urlsplit(self.url).query).get("from_seq")
        return int(values[0]) if values else None

    def feed(self, *seqs: int) -> None:
        for seq in seqs:
            self._inbox.put_nowait(json.dumps({"seq": seq, "data": f"frame {seq}"}))

    def close_from_upstream(self, code: int) -> None:
        self._inbox.put_nowait(Close(code, ""))

    def drop(self) -> None:
        """The link dies without a closing handshake."""
        self._inbox.put_nowait(None)

    def fail_by_worker(self, code: int, reason: str = "") -> None:
        """websockets fails the connection for what the upstream sent (1009: too big)."""
        self._inbox.put_nowait(("fail", Close(code, reason)))

    def _abort(self) -> None:
        self.aborted = True
        self.drop()

    async def send(self, message: str) -> None:
        self.sent.append(message)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.protocol.close_sent = Close(code, reason)
        self._inbox.put_nowait(Close(code, reason))

    def __aiter__(self) -> FakeSocket:
        return self

    async def __anext__(self) -> str:
        item = await self._inbox.get()
        if isinstance(item, str):
            return item
        if isinstance(item, tuple):
            self.protocol.close_sent = item[1]
            raise ConnectionClosedError(None, item[1])
        if isinstance(item, Close) and self.protocol.close_sent is None:
            self.protocol.close_rcvd = item
        if isinstance(item, Close) and item.code in (1000, 1001):
            raise StopAsyncIteration
        raise ConnectionClosedError(self.protocol.close_rcvd, self.protocol.close_sent)


class Upstream:
    """The connector: every connect returns a new :class:`FakeSocket`, kept in order."""

    def __init__(self) -> None:
        self.sockets: list[FakeSocket] = []

    async def connect(self, url: str, **_options: Any) -> FakeSocket:
        socket = FakeSocket(url)
        self.sockets.append(socket)
        return socket

    async def socket(self, number: int = 1) -> FakeSocket:
        """The ``number``-th socket, once the session has connected it."""
        await until(lambda: len(self.sockets) >= number, f"connect #{number}")
        return self.sockets[number - 1]


class Messages(MessageStore):
    """The messages table in a dict; the guard is asked per message, as the real store does
    before every attempt, and a refused message is reported fenced, never written."""

    def __init__(self) -> None:
        super().__init__(None, "messages")
        self.items: dict[tuple[str, str], Message] = {}

    def put_batch(self, messages: Iterable[Message], *, guard: Guard | None = None) -> PutResult:
        result = PutResult(requests=1)
        for message in messages:
            if guard is not None and not guard(message):
                result.fenced.append(message)
                continue
            self.items[message.key] = message
            result.written += 1
        return result

    def seqs(self, pk: str) -> list[int | None]:
        return sorted(m.seq for m in self.items.values() if m.pk == pk and m.seq is not None)


class Alive:
    """The worker lease as a session sees it: held, and far from its fence."""

    fenced = False
    fence_at_ms = 2**62

    def may_write(self, now: int) -> bool:
        return True


class Rig:
    """One session's world: lease store, messages, upstream, flusher, and the session task."""

    def __init__(self, *, checkpoint_seconds: float = 600.0) -> None:
        self.store = InMemoryLeaseStore(lease_ms=60_000)
        self.messages = Messages()
        self.upstream = Upstream()
        self.logger = Logger()
        self.metrics = WorkerMetrics("test", emit=lambda document: None)
        self.offloader = Offloader(io_threads=2, write_threads=1)
        settings = Settings(
            hint_queue_url="https://sqs.invalid/hints", worker_id=WORKER, lease_seconds=60.0,
            heartbeat_seconds=10.0, lease_safety_margin_seconds=2.0,
            checkpoint_seconds=checkpoint_seconds, message_flush_ms=10,
        )  # fmt: skip
        self.config = WorkerConfig(settings=settings, control_channel=False)
        self.flusher = MessageFlusher(
            self.messages, self.offloader, self.metrics, flush_ms=10, logger=self.logger
        )
        self._flushing: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Rig:
        self._flushing = asyncio.create_task(self.flusher.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._flushing is not None
        self._flushing.cancel()
        await asyncio.gather(self._flushing, return_exceptions=True)
        self.offloader.shutdown()

    def acquire(
        self, connection_id: str = "c1", *, checkpoint: int = 0, upstream: Any = None
    ) -> ConnectionRecord:
        """START the connection and take its lease (over a checkpoint a holder before wrote)."""
        options = {} if upstream is None else {"upstream": upstream}
        self.store.start(connection_id, f"wss://up.example/{connection_id}", **options)
        pk = connection_pk(connection_id)
        if checkpoint:
            earlier = self.store.acquire(pk, "w0")
            lease = Session(earlier, self.context()).lease
            self.store.checkpoint(lease, checkpoint)
            self.store.release(lease, last_seq=checkpoint)
        return self.store.acquire(pk, WORKER)

    def context(self) -> SessionContext:
        return SessionContext(
            config=self.config, worker_id=WORKER, leases=self.store, offloader=self.offloader,
            flusher=self.flusher, liveness=Alive(), metrics=self.metrics, logger=self.logger,
            connect=self.upstream.connect,  # type: ignore[arg-type]  # the double
        )  # fmt: skip

    def run(self, record: ConnectionRecord) -> tuple[Session, asyncio.Task[SessionResult]]:
        session = Session(record, self.context())
        return session, asyncio.create_task(session.run())

    async def streaming(self, *seqs: int) -> Streaming:
        """A session on a fresh connection that has received and written ``seqs``."""
        record = self.acquire()
        session, task = self.run(record)
        socket = await self.upstream.socket()
        socket.feed(*seqs)
        await until(lambda: session.tracker.durable == max(seqs), f"frames {seqs} written")
        return Streaming(record, session, task, socket)

    def stored(self, pk: str) -> ConnectionRecord:
        record = self.store.get(pk)
        assert record is not None
        return record


@dataclass
class Streaming:
    record: ConnectionRecord
    session: Session
    task: asyncio.Task[SessionResult]
    socket: FakeSocket


async def ended(task: asyncio.Task[SessionResult]) -> SessionResult:
    return await asyncio.wait_for(task, WAIT)


# ---------------------------------------------------------------- streaming


@sync
async def test_frames_are_stored_in_order_under_the_sessions_epoch_and_a_stop_releases():
    async with Rig() as rig:
        # GIVEN a session on a fresh connection
        record = rig.acquire()
        session, task = rig.run(record)
        socket = await rig.upstream.socket()
        # WHEN the upstream sends three frames
        socket.feed(1, 2, 3)
        await until(lambda: rig.messages.seqs(record.pk) == [1, 2, 3], "three frames stored")
        # THEN they are stored as received (the frame's data), stamped with this worker and epoch
        stored = sorted(rig.messages.items.values(), key=lambda m: m.seq or 0)
        assert [m.message_data for m in stored] == ["frame 1", "frame 2", "frame 3"]
        assert {(m.worker_id, m.lease_epoch) for m in stored} == {(WORKER, record.lease_epoch)}
        await until(lambda: session.tracker.durable == 3, "the checkpoint tracker")
        # WHEN a control STOP names its epoch
        assert session.stop_command(record.lease_epoch)
        result = await ended(task)
        # THEN the socket closed normally and the lease was released at the last frame
        assert (result.reason, result.via, result.released) == (ExitReason.STOPPED, "control", True)
        assert result.last_seq == 3 and not socket.aborted
        assert socket.protocol.close_sent is not None
        assert (rig.stored(record.pk).lease_owner, rig.stored(record.pk).last_seq) == ("", 3)


@sync
async def test_a_stop_for_another_epoch_is_ignored_and_repeated_frames_are_stored_once():
    async with Rig() as rig:
        # GIVEN a streaming session that received some frames twice
        s = await rig.streaming(1, 2, 2, 1, 3)
        # WHEN a STOP names an older epoch
        # THEN it does not apply, and the session keeps streaming
        assert not s.session.stop_command(s.record.lease_epoch - 1)
        s.socket.feed(4)
        await until(lambda: rig.messages.seqs(s.record.pk) == [1, 2, 3, 4], "the next frame")
        assert rig.metrics.totals["DuplicateFrames"] == 2
        s.session.finish(ExitReason.SHUTDOWN, via="shutdown")
        result = await ended(s.task)
        assert result.released and result.hint  # a hand-off: a peer is hinted


# ---------------------------------------------------------------- checkpoints


@sync
async def test_a_checkpoint_stores_the_highest_written_seq_and_only_when_advanced():
    async with Rig(checkpoint_seconds=1.0) as rig:
        # GIVEN a session that has stored frames 1..5
        s = await rig.streaming(1, 2, 3, 4, 5)
        # WHEN its checkpoint is due and written
        assert s.session.checkpoint_due(s.session.checkpointed_at_ms + 1_000)
        await s.session.checkpoint()
        # THEN the record holds it, and nothing is due again until the stream advances
        assert rig.stored(s.record.pk).last_seq == 5
        assert not s.session.checkpoint_due(s.session.checkpointed_at_ms + 1_000)
        assert rig.metrics.totals["CheckpointWrites"] == 1
        s.session.finish(ExitReason.SHUTDOWN)
        await ended(s.task)


@sync
async def test_a_checkpoint_that_finds_the_connection_stopped_ends_the_session_stopped():
    async with Rig() as rig:
        # GIVEN a streaming session whose connection was STOPPED by the API
        s = await rig.streaming(1, 2)
        rig.store.stop(s.record.pk)
        # WHEN it writes its checkpoint
        await s.session.checkpoint()
        result = await ended(s.task)
        # THEN the refused write told it: it ends STOPPED, releasing at what it stored
        assert (result.reason, result.via) == (ExitReason.STOPPED, "checkpoint")
        after = rig.stored(s.record.pk)
        assert (after.desired_state, after.lease_owner, after.last_seq) == (
            DesiredState.STOPPED, "", 2)  # fmt: skip


@sync
async def test_a_checkpoint_that_finds_the_lease_taken_fences_and_writes_nothing_more():
    async with Rig() as rig:
        # GIVEN a session whose lease a peer took over (its worker item lapsed, say)
        s = await rig.streaming(1)
        rig.store.release(s.session.lease, last_seq=1)
        taken = rig.store.acquire(s.record.pk, "w2")
        # WHEN it writes its checkpoint
        await s.session.checkpoint()
        result = await ended(s.task)
        # THEN it is fenced: socket aborted, no release, and the peer's lease untouched
        assert (result.reason, result.released) == (ExitReason.FENCED, False)
        assert s.socket.aborted
        after = rig.stored(s.record.pk)
        assert (after.lease_owner, after.lease_epoch) == ("w2", taken.lease_epoch)


# ---------------------------------------------------------------- resume position


@sync
async def test_the_first_connect_resumes_after_the_acquired_checkpoint():
    async with Rig() as rig:
        # GIVEN a connection a previous holder checkpointed at 41
        record = rig.acquire(checkpoint=41)
        assert record.last_seq == 41
        # WHEN a session starts on it
        session, task = rig.run(record)
        socket = await rig.upstream.socket()
        # THEN it asks the upstream for frame 42 on
        assert socket.from_seq == 42
        session.finish(ExitReason.SHUTDOWN)
        await ended(task)


@sync
async def test_a_dropped_link_reconnects_from_the_highest_frame_received():
    async with Rig() as rig:
        # GIVEN a session that received frames 1..7 (checkpoint still 0)
        s = await rig.streaming(*range(1, 8))
        # WHEN the link dies without a close frame, and again with an abnormal close
        s.socket.drop()
        second = await rig.upstream.socket(2)
        second.feed(8)
        await until(lambda: s.session.tracker.durable == 8, "the eighth frame")
        second.close_from_upstream(1011)
        third = await rig.upstream.socket(3)
        # THEN every reconnect resumes right after what it has, and the trouble is recorded
        assert (s.socket.from_seq, second.from_seq, third.from_seq) == (1, 8, 9)
        await until(lambda: rig.stored(s.record.pk).last_error, "last_error recorded")
        s.session.finish(ExitReason.SHUTDOWN)
        result = await ended(s.task)
        assert result.last_seq == 8
        assert rig.messages.seqs(s.record.pk) == list(range(1, 9))


# ---------------------------------------------------------------- endings


@sync
async def test_a_normal_upstream_close_reconnects_and_resumes_after_what_it_has():
    async with Rig() as rig:
        # GIVEN a streaming session
        s = await rig.streaming(1, 2)
        # WHEN the upstream closes with 1001 (its deploy), then 1000 (a session limit)
        s.socket.close_from_upstream(1001)
        second = await rig.upstream.socket(2)
        second.feed(3)
        await until(lambda: s.session.tracker.durable == 3, "the third frame")
        second.close_from_upstream(1000)
        third = await rig.upstream.socket(3)
        # THEN each close reconnected, resuming right after what the session had
        assert (second.from_seq, third.from_seq) == (3, 4)
        await until(
            lambda: rig.stored(s.record.pk).last_error == "upstream_closed (code 1000)",
            "last_error recorded",
        )
        # AND the stream goes on: still STARTED, owned, nothing counted by the breaker
        after = rig.stored(s.record.pk)
        assert (after.desired_state, after.lease_owner, after.failure_count) == (
            DesiredState.STARTED, WORKER, 0)  # fmt: skip
        s.session.finish(ExitReason.SHUTDOWN)
        await ended(s.task)


@sync
async def test_with_normal_close_final_a_normal_close_ends_the_connection_stopped():
    async with Rig() as rig:
        # GIVEN a session on a connection whose options make a normal close final
        record = rig.acquire(upstream=parse_upstream_options(
            {"normal_close": "final"}, secret_prefixes=()))  # fmt: skip
        session, task = rig.run(record)
        socket = await rig.upstream.socket()
        socket.feed(1, 2)
        await until(lambda: session.tracker.durable == 2, "frames written")
        # WHEN the upstream ends the stream with 1000
        socket.close_from_upstream(1000)
        result = await ended(task)
        # THEN the connection is STOPPED at its last frame, not handed to a peer
        assert (result.reason, result.released, result.hint) == (
            ExitReason.UPSTREAM_CLOSED, True, False)  # fmt: skip
        after = rig.stored(record.pk)
        assert (after.desired_state, after.stop_reason, after.lease_owner, after.last_seq) == (
            DesiredState.STOPPED, "upstream_closed", "", 2)  # fmt: skip
        assert len(rig.upstream.sockets) == 1


@sync
async def test_an_upstream_that_closes_normally_before_any_frame_ends_failed():
    async with Rig() as rig:
        # GIVEN a breaker of 3 and an upstream that closes 1000 at once on every connect
        rig.config = dataclasses.replace(rig.config, breaker_max_failures=3)
        record = rig.acquire()
        _session, task = rig.run(record)
        for number in range(1, 4):
            (await rig.upstream.socket(number)).close_from_upstream(1000)
        result = await ended(task)
        # THEN it ends FAILED after three sessions, not a reconnect loop
        assert result.reason is ExitReason.FAILED
        after = rig.stored(record.pk)
        assert (after.desired_state, after.failure_count) == (DesiredState.FAILED, 3)
        assert after.last_error == "upstream_closed (code 1000)"
        assert len(rig.upstream.sockets) == 3


@sync
async def test_progress_then_poison_on_every_connect_ends_failed_within_the_window():
    async with Rig() as rig:
        # GIVEN a breaker of 3, and an upstream that sends one new frame and then a frame the
        # worker refuses (1009) on every connect: each session moves the checkpoint
        rig.config = dataclasses.replace(rig.config, breaker_max_failures=3)
        record = rig.acquire()
        session, task = rig.run(record)
        for number in range(1, 4):
            socket = await rig.upstream.socket(number)
            assert socket.from_seq == number  # resumed after the frame the last one sent
            socket.feed(number)
            await until(lambda n=number: session.tracker.durable == n, f"frame {number}")
            socket.fail_by_worker(1009, "frame too big")
        result = await ended(task)
        # THEN the window counted every failure: FAILED after three sessions
        assert result.reason is ExitReason.FAILED
        after = rig.stored(record.pk)
        assert (after.desired_state, after.failure_count, after.failure_seq) == (
            DesiredState.FAILED, 3, 3)  # fmt: skip
        assert after.failure_since_ms is not None
        assert after.last_error == "closed_by_worker (code 1009: frame too big)"
        assert len(rig.upstream.sockets) == 3
        assert rig.metrics.totals["BreakerFailures"] == 3


@sync
async def test_a_fenced_session_aborts_its_socket_and_writes_nothing():
    async with Rig() as rig:
        # GIVEN a streaming session with frames stored
        s = await rig.streaming(1)
        # WHEN its lease is lost
        s.session.fence("test")
        result = await ended(s.task)
        # THEN the socket is aborted (no closing handshake) and the item is left as it was
        assert (result.reason, result.released) == (ExitReason.FENCED, False)
        assert s.socket.aborted and s.socket.protocol.close_sent is None
        after = rig.stored(s.record.pk)
        assert (after.lease_owner, after.last_seq) == (WORKER, 0)
