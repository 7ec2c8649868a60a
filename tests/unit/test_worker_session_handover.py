"""Make-before-break at the session level, in memory (issue #26; docs/handoff.md steps 2-7):
a giver's hand-over ends with the one transfer write and then the close, a taker's prepared
session writes nothing until it adopts the connection, then stores only what the giver did
not. The rig (lease store, messages, upstream doubles, real flusher) is the memstore session
tests' own."""

from __future__ import annotations

import asyncio
import dataclasses

from test_worker_session_memstore import WORKER, Rig, ended, until
from worker_doubles import sync

from wsfleet.control import CommitNotice, PrepareCommand, ReadyReply
from wsfleet.lease import Lease
from wsfleet_worker.control_channel import HandoffMessage
from wsfleet_worker.flusher import MessageFlusher
from wsfleet_worker.handover import Handover
from wsfleet_worker.parts import WorkerParts
from wsfleet_worker.session import Session
from wsfleet_worker.session_rules import ExitReason

TAKER = "w2"


@sync
async def test_a_prepared_session_writes_nothing_then_adopts_and_stores_only_above_the_transfer():
    async with Rig() as rig:
        # GIVEN a giver that stored 1..5
        giver = await rig.streaming(1, 2, 3, 4, 5)
        record = rig.stored(giver.record.pk)
        # AND a taker's prepared session (of the record it confirmed) that received 4..7
        taker_ctx = dataclasses.replace(rig.context(), worker_id=TAKER)
        taker = Session.prepared_for(record, taker_ctx, durable=giver.session.tracker.durable)
        taker_task = asyncio.create_task(taker.run())
        socket = await rig.upstream.socket(2)
        # resumed at the giver's last stored frame (a replaying upstream sends it at once: the
        # READY need not wait for the stream's next frame), not at the record's checkpoint
        assert socket.from_seq == 5
        socket.feed(4, 5, 6, 7)
        await until(lambda: taker.first_buffered_seq == 4, "buffered")
        await asyncio.sleep(0.1)  # (several flush intervals: nothing may be written)
        # THEN nothing of the taker's was written anywhere
        assert {m.worker_id for m in rig.messages.items.values()} == {WORKER}
        assert rig.stored(record.pk) == record

        # WHEN the giver hands over (its frames stored, then the one transfer write)
        giver.socket.feed(6)
        await until(lambda: giver.session.tracker.durable == 6, "giver stored 6")
        giver.session.hand_over(TAKER, ExitReason.REBALANCED)
        result = await ended(giver.task)
        # THEN the item names the taker under the next epoch, with the giver's checkpoint,
        # and the giver closed its socket (1001) only after that
        moved = rig.stored(record.pk)
        assert (moved.lease_owner, moved.lease_epoch, moved.last_seq) == (
            TAKER, record.lease_epoch + 1, 6)
        assert (result.transferred_to, result.released, result.last_seq) == (TAKER, False, 6)
        assert giver.socket.protocol.close_sent.code == 1001
        # WHEN the taker adopts it (a consistent read showed the transfer)
        assert await taker.adopt(moved, TAKER)
        socket.feed(8)
        await until(lambda: rig.messages.seqs(record.pk) == [1, 2, 3, 4, 5, 6, 7, 8], "stored")
        # THEN the taker stored only 7 and 8, under its own epoch; 1..6 stay the giver's
        by_seq = {m.seq: (m.worker_id, m.lease_epoch) for m in rig.messages.items.values()}
        assert {s for s, who in by_seq.items() if who == (TAKER, moved.lease_epoch)} == {7, 8}
        assert all(by_seq[s] == (WORKER, record.lease_epoch) for s in range(1, 7))
        # AND it is an ordinary session of the new epoch now (a STOP ends it, released)
        assert taker.lease == Lease.of(moved)
        taker.finish(ExitReason.STOPPED, via="test")
        ended_taker = await ended(taker_task)
        assert ended_taker.released and rig.stored(record.pk).last_seq == 8


@sync
async def test_a_prepared_session_over_its_buffer_budget_is_abandoned_and_writes_nothing():
    async with Rig() as rig:
        giver = await rig.streaming(1)
        record = rig.stored(giver.record.pk)
        small = dataclasses.replace(rig.config, handoff_buffer_frames=3)
        ctx = dataclasses.replace(rig.context(), worker_id=TAKER, config=small)
        taker = Session.prepared_for(record, ctx)
        task = asyncio.create_task(taker.run())
        socket = await rig.upstream.socket(2)
        socket.feed(2, 3, 4, 5)
        result = await ended(task)
        assert (result.reason, taker.abandon_reason, result.released) == (
            ExitReason.ABANDONED, "budget", False)
        assert {m.worker_id for m in rig.messages.items.values()} == {WORKER}
        assert rig.stored(record.pk) == record  # no lease write of the taker's
        # AND a transfer to it could not be adopted any more (the worker re-acquires instead)
        assert not await taker.adopt(record, TAKER)
        giver.session.finish(ExitReason.STOPPED)
        await ended(giver.task)


@sync
async def test_a_prepared_buffer_is_not_bounded_by_the_in_flight_frame_budget():
    # A fast stream overlaps for longer than the in-flight budget lasts (500 frames: half a
    # second at 1,000 frames/s); the buffer has its own frame bound, within the same bytes.
    async with Rig() as rig:
        giver = await rig.streaming(1)
        record = rig.stored(giver.record.pk)
        config = dataclasses.replace(rig.config, session_queue_frames=3, handoff_buffer_frames=50)
        ctx = dataclasses.replace(rig.context(), worker_id=TAKER, config=config)
        taker = Session.prepared_for(record, ctx)
        task = asyncio.create_task(taker.run())
        socket = await rig.upstream.socket(2)
        socket.feed(*range(2, 22))
        await until(lambda: taker.first_buffered_seq == 2, "buffered")
        await asyncio.sleep(0.1)  # (every frame fed has been read)
        assert not taker.abandon_reason and not task.done()
        taker.abandon("test")
        await ended(task)
        giver.session.finish(ExitReason.STOPPED)
        await ended(giver.task)


@sync
async def test_a_hand_over_whose_transfer_is_refused_breaks_as_today():
    async with Rig() as rig:
        giver = await rig.streaming(1, 2)
        rig.store.stop(giver.record.pk)  # STOPPED meanwhile: the transfer must not land
        giver.session.hand_over(TAKER, ExitReason.REBALANCED)
        result = await ended(giver.task)
        stored = rig.stored(giver.record.pk)
        assert result.transferred_to == "" and result.released
        assert (stored.lease_owner, stored.last_seq) == ("", 2)


@sync
async def test_a_giver_leaves_its_unwritten_frames_to_the_taker_instead_of_flushing_them():
    # The taker holds every frame above what the giver stored (the giver's verdict saw
    # first_seq <= durable + 1), so the transfer does not wait for the giver's write backlog.
    rig = Rig()
    # (a flush interval longer than the test: a frame is written only when flushed)
    rig.flusher = MessageFlusher(rig.messages, rig.offloader, rig.metrics, flush_ms=600_000,
                                 logger=rig.logger)  # fmt: skip
    async with rig:
        # GIVEN a giver that stored 1..3 and has received 4 and 5, not yet written
        record = rig.acquire()
        session, task = rig.run(record)
        socket = await rig.upstream.socket()
        socket.feed(1, 2, 3)
        rig.flusher.flush_now()
        await until(lambda: session.tracker.durable == 3, "1..3 stored")
        socket.feed(4, 5)
        await until(lambda: session.tracker.highest_received == 5, "4 and 5 received")
        # WHEN it hands over
        session.hand_over(TAKER, ExitReason.REBALANCED)
        result = await ended(task)
        # THEN the transfer carries what it stored, and 4 and 5 were not written by it (the
        # taker stores them, above the checkpoint)
        moved = rig.stored(record.pk)
        assert (result.transferred_to, result.last_seq) == (TAKER, 3)
        assert (moved.lease_owner, moved.last_seq) == (TAKER, 3)
        rig.flusher.flush_now()
        await asyncio.sleep(0.05)  # (a flush now would have written them by now)
        assert rig.messages.seqs(record.pk) == [1, 2, 3]


class _Outbox:
    def __init__(self) -> None:
        self.hints: list[object] = []

    def add(self, hint: object) -> None:
        self.hints.append(hint)


@sync
async def test_the_commit_goes_to_the_taker_once_the_transfer_landed_not_after_the_close():
    # The giver's close is a round trip to the upstream (up to its close timeout): the taker,
    # which streams already, need not wait for it.
    async with Rig() as rig:
        # GIVEN a giver streaming 1..3 whose socket close does not finish yet
        giver = await rig.streaming(1, 2, 3)
        closing = asyncio.Event()
        closed = giver.socket.close

        async def slow_close(code: int = 1000, reason: str = "") -> None:
            await closing.wait()
            await closed(code, reason)

        giver.socket.close = slow_close  # type: ignore[method-assign]
        sent: list[HandoffMessage] = []

        async def send(queue_url: str, messages: list[HandoffMessage]) -> set[str]:
            sent.extend(messages)
            return {message.pk for message in messages}

        outbox = _Outbox()
        parts = WorkerParts(worker_id=WORKER, leases=rig.store, offloader=rig.offloader,
                            metrics=rig.metrics, logger=rig.logger)  # fmt: skip
        handover = Handover(
            parts, None, outbox, prepare_seconds=5, queue_prefix="q-",  # type: ignore[arg-type]
            sessions={giver.record.pk: giver.session},
            session_tasks={giver.record.pk: giver.task}, prepared={}, prepared_tasks={},
            start_prepared=None, adopt=None, acquiring=set(), acquire=None,  # type: ignore[arg-type]
            send=send, own_queue_url=lambda: "https://sqs.invalid/1/q-w1",
            has_room=lambda: True,
        )  # fmt: skip
        # WHEN it gives the connection to a taker, which answers READY from seq 3
        give = asyncio.create_task(handover.give(
            giver.session, TAKER, "https://sqs.invalid/1/q-w2", ExitReason.REBALANCED))
        await until(lambda: any(isinstance(m, PrepareCommand) for m in sent), "PREPARE")
        handover.on_reply(ReadyReply(giver.record.pk, giver.session.epoch, TAKER, 3))
        # THEN COMMIT goes out while the giver's socket is still closing
        await until(lambda: any(isinstance(m, CommitNotice) for m in sent), "COMMIT")
        assert giver.socket.protocol.close_sent is None and not giver.task.done()
        moved = rig.stored(giver.record.pk)
        commit = next(m for m in sent if isinstance(m, CommitNotice))
        assert (moved.lease_owner, commit.epoch) == (TAKER, moved.lease_epoch)
        # AND the move ends with the session, its delayed copy queued for anyone
        closing.set()
        await asyncio.wait_for(give, 10)
        assert giver.socket.protocol.close_sent.code == 1001
        assert handover.outcomes == {"transferred": 1}
        assert [(h.pk, h.epoch, h.delay_seconds) for h in outbox.hints] == [  # type: ignore[attr-defined]
            (giver.record.pk, moved.lease_epoch, 5)]
