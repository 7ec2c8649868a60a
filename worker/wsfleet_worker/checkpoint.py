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

__all__ = ["CheckpointTracker"]


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
