"""CheckpointTracker: how far a connection's stream is durably stored. Pure, no I/O.

The checkpoint (``last_seq`` on the connection record) promises the next owner: "every frame
up to here is in the messages table, resume after it". So it may only pass frames whose write
was acknowledged. Writes complete out of order (batches of many connections are in flight at
once), hence the rule:

    durable = the highest seq received such that every seq received up to it is written.

The tracker also decides which received frames need writing at all. A resumed session replays
a few frames that are already stored (at or below ``durable``), already acknowledged, or still
waiting in the write queue; those are skipped (:meth:`accept` returns False). Writing them again
would be harmless (the key is the seq, so the write is idempotent) but would cost requests.

Memory stays proportional to the frames in flight: acknowledged seqs are only remembered while
an older write is still pending.

Example::

    t = CheckpointTracker(durable=10)
    t.accept(11), t.accept(12), t.accept(11)   # (True, True, False)
    t.written(12)                               # False: 11 still pending
    t.written(11)                               # True: durable is now 12
"""

from __future__ import annotations

import heapq

__all__ = ["CheckpointTracker", "SendWindow"]


class CheckpointTracker:
    """Tracks received, in-flight and acknowledged seqs of one connection.

    :param durable: the checkpoint the session started from (the record's ``last_seq``).
    """

    __slots__ = (
        "_acked",
        "_acked_heap",
        "_pending",
        "_pending_heap",
        "durable",
        "highest_received",
    )

    def __init__(self, durable: int = 0) -> None:
        self.durable = durable
        self.highest_received = durable
        self._pending: set[int] = set()
        self._pending_heap: list[int] = []  # lazy: may hold seqs already acknowledged
        self._acked: set[int] = set()  # acknowledged but above a pending seq
        self._acked_heap: list[int] = []

    @property
    def outstanding(self) -> int:
        """Frames accepted for writing and not yet acknowledged."""
        return len(self._pending)

    def resume_from(self) -> int:
        """The first seq a new upstream session should ask for: ``durable + 1``.

        Frames between ``durable`` and ``highest_received`` that are still in flight will be
        sent again by the upstream and skipped by :meth:`accept`.
        """
        return self.durable + 1

    def accept(self, seq: int) -> bool:
        """A frame arrived; True if it must be written, False if it is a known duplicate."""
        if seq <= self.durable or seq in self._pending or seq in self._acked:
            return False
        self._pending.add(seq)
        heapq.heappush(self._pending_heap, seq)
        if seq > self.highest_received:
            self.highest_received = seq
        return True

    def written(self, seq: int) -> bool:
        """The write of ``seq`` was acknowledged. True if ``durable`` advanced."""
        if seq not in self._pending:
            return False  # unknown or already counted: nothing to do
        self._pending.discard(seq)
        self._acked.add(seq)
        heapq.heappush(self._acked_heap, seq)
        return self._advance()

    def _lowest_pending(self) -> int | None:
        heap = self._pending_heap
        while heap and heap[0] not in self._pending:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def _advance(self) -> bool:
        before = self.durable
        lowest = self._lowest_pending()
        heap = self._acked_heap
        while heap and (lowest is None or heap[0] < lowest):
            seq = heapq.heappop(heap)
            self._acked.discard(seq)
            if seq > self.durable:
                self.durable = seq
        if not self._pending:
            self._pending_heap.clear()
        return self.durable > before


class SendWindow:
    """What a failover of an at-least-once sink (kinesis, firehose) can re-send. Pure, no I/O.

    The next owner resumes after the checkpoint (``last_seq``), so it re-sends every frame
    this holder sent above it. Those are bounded by a *send limit* stored on the connection
    item (``sent_limit``) before any frame above the previous one leaves: the holder hands a
    frame to the sink only while its seq is at most :attr:`limit`, the bound that the last
    write of the item that landed carries. Raising it rides on the checkpoint write
    (``last_seq = durable`` and ``sent_limit = durable + frames`` in one update), so:

    * a takeover re-sends at most the seqs ``(last_seq, sent_limit]`` it acquired with: at most
      ``frames`` (MESSAGE_REPLAY_WINDOW) seqs past the checkpoint;
    * the checkpoint of a busy stream is written when a quarter of the allowance is left
      (:meth:`running_low`), i.e. about every ``0.75 x frames`` frames, besides the time cadence
      (CHECKPOINT_SECONDS); a frame that finds the limit reached waits for that write
      (backpressure, as a full write queue);
    * a clean ending (release, STOP, FAILED, or a make-before-break transfer) with nothing in
      flight stores ``sent_limit`` equal to the final checkpoint: the next owner re-sends
      nothing (:meth:`final_limit`).

    A session that inherits a window (``sent_limit > last_seq``) counts the frames it writes
    inside it (:meth:`written`): the ``replayed`` totals of the connection view, stored with
    its next checkpoint or final write (no write of their own).

    Example::

        w = SendWindow(last_seq=100, sent_limit=140, frames=1000)
        w.replay, w.allows(140), w.allows(141)   # ((101, 140), True, False)
        w.next_limit(durable=120)                # 1120
    """

    __slots__ = ("frames", "limit", "replay", "replayed_frames", "takeovers")

    def __init__(
        self,
        *,
        last_seq: int,
        sent_limit: int | None,
        frames: int,
        takeovers: int = 0,
        replayed_frames: int = 0,
    ) -> None:
        self.frames = max(1, frames)
        self.limit = max(last_seq, sent_limit or 0)
        #: The inherited window ``(from_seq, to_seq)``: what this takeover may re-send.
        self.replay: tuple[int, int] | None = (
            (last_seq + 1, self.limit) if self.limit > last_seq else None
        )
        self.takeovers = takeovers + (self.replay is not None)
        self.replayed_frames = replayed_frames

    def allows(self, seq: int) -> bool:
        """May a frame with this seq be handed to the sink now?"""
        return seq <= self.limit

    def running_low(self, highest_received: int) -> bool:
        """A quarter of the allowance or less is left: raise the limit (checkpoint) now."""
        return self.limit - highest_received <= self.frames // 4

    def next_limit(self, durable: int, outstanding: int = 0, waiting: int = 0) -> int:
        """The limit the next checkpoint write stores: ``frames`` past the checkpoint it
        writes, never below the current one. A frame ``waiting`` beyond that (the upstream
        skipped more than ``frames`` seqs) is let through once nothing is in flight
        (``outstanding``): the window then holds that one frame."""
        limit = max(self.limit, durable + self.frames)
        return max(limit, waiting) if outstanding == 0 else limit

    def stored(self, limit: int) -> None:
        """A write carrying ``limit`` landed: frames up to it may be sent."""
        self.limit = max(self.limit, limit)

    def final_limit(self, durable: int, outstanding: int) -> int:
        """The limit of a final write: the checkpoint itself if no frame is in flight (all
        that was sent is acknowledged, so at or below ``durable``), else the stored limit."""
        return durable if outstanding == 0 else self.limit

    def written(self, seq: int) -> None:
        """A frame was acknowledged by the sink; counted if inside the inherited window."""
        replay = self.replay
        if replay is not None and replay[0] <= seq <= replay[1]:
            self.replayed_frames += 1

    def fields(self, limit: int) -> dict[str, int]:
        """The item attributes a write storing ``limit`` carries (``sent_limit`` and, once
        there was a replay, the totals and the last window)."""
        values = {"sent_limit": limit}
        if self.takeovers:
            values["replayed_takeovers"] = self.takeovers
            values["replayed_frames"] = self.replayed_frames
        if self.replay is not None:
            values["replayed_from_seq"], values["replayed_to_seq"] = self.replay
        return values
