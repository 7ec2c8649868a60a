"""HintPoller: turns hint-queue messages into acquired leases and running sessions.

Each round receives (through :class:`~wsfleet_worker.sqs_consumer.QueueConsumer`, the receive
loop it shares with the control channel) at most as many messages as the worker has free
slots (never more than 10, the SQS maximum); at MAX_CONNECTIONS it does not receive at all and
waits for a slot. The batch is triaged (:func:`~wsfleet_worker.session_rules.triage_hints`):

* unusable hints (any body :meth:`~wsfleet.hints.Hint.parse` refuses: not JSON, nested,
  over-long, a bad pk or epoch) are counted (``InvalidHints``), logged by excerpt and deleted;
* a hint whose handling raises is counted (``HintFailures``) and left for redelivery: one
  message never ends a round or the worker;
* hints for connections this worker already runs (and repeats within the batch) are deleted;
* the rest go to the lease taker (:class:`~wsfleet_worker.taking.LeaseTaker`), concurrently.
  Its acquire is the real decision: it succeeds only for a STARTED connection whose lease is
  free or whose owner's worker lease is over, so stale or duplicate hints cost one refused
  conditional write (``AcquireConflicts``) and are deleted. An early hint, whose lease lapses
  within ``EARLY_HINT_MAX_WAIT_MS``, waits for the expiry and tries once more;
* a hint whose acquire failed for an unclassified reason (DynamoDB trouble) is left in the
  queue, to come back after its visibility timeout;
* hints over capacity (only possible if capacity shrank meanwhile) are made visible again at
  once for a peer.

Handled messages are deleted with one DeleteMessageBatch per round.

Placement (REBALANCE_PLACEMENT_SECONDS): before a receive, a worker holding more than its share
of the fleet's load plus the band (:meth:`~wsfleet_worker.rebalancing.Rebalancer.placement_delay`)
waits, then receives without waiting, so new and orphaned connections go to less loaded
peers first. Not while hints are queued (the last receive brought more than one: a drain or
failover burst, where speed comes first and rebalancing evens the spread out afterwards).

Rounds overlap: while one batch is being acted on (its acquires, or an early hint's wait for
its lease to lapse), the next receive is already out. What bounds them is the hints *in hand*
(received, their acquire not finished): at most ``MAX_HINTS_IN_HAND``, and never more than the
free slots, so overlapping never receives beyond capacity. A hint leaves the hand as soon as
its own acquire ends, not when its whole round does: a round waiting for one slow acquire (an
early hint, a throttled write) and for its DeleteMessageBatch holds one place, not ten, and the
receives go on. Taking over a hundred connections is then a pipeline, not rounds back to back
each as slow as its slowest acquire.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from wsfleet.hints import Hint
from wsfleet.record import connection_id_from_pk

from .observability import WorkerMetrics
from .session_rules import triage_hints
from .sqs_consumer import RECEIVE_LIMIT, Message, QueueConsumer
from .taking import HintOutcome, LeaseTaker

__all__ = ["HintPoller"]

#: Hints received whose acquire has not finished, at most (three full receives; see the
#: module docstring).
MAX_HINTS_IN_HAND = 3 * RECEIVE_LIMIT
#: The wait of a receive after a placement deferral: none, so the loaded worker takes only
#: what its less loaded peers' long polls left queued meanwhile.
_DEFERRED_WAIT_SECONDS = 0


class HintPoller:
    """Receives hints for the lease taker of one worker.

    The taker answers the poller's questions: how many more sessions the worker wants now
    (:meth:`~wsfleet_worker.taking.LeaseTaker.free_slots`, zero while it is at capacity or its
    renewals run late: decides whether and how much to receive), how many fit at all
    (:meth:`~wsfleet_worker.taking.LeaseTaker.capacity_left`: decides, once messages are in
    hand, how many to act on; giving a received hint back costs a receive, and a hint received
    too often ends in the dead-letter queue), which connections run here, and what became of
    each hint (:class:`~wsfleet_worker.taking.HintOutcome`).
    """

    def __init__(
        self,
        queue: QueueConsumer,
        taker: LeaseTaker,
        metrics: WorkerMetrics,
        logger: Any,
        *,
        placement: Callable[[], float] | None = None,
    ) -> None:
        """``placement``: seconds to wait before the next receive, so less loaded peers take
        new work first (:meth:`~wsfleet_worker.rebalancing.Rebalancer.placement_delay`)."""
        self._queue = queue
        self._placement = placement
        self._wait_seconds = queue.wait_seconds
        self._requested = 0  # messages the last receive asked for
        #: The last receive brought more than one hint (or all it asked for): hints are
        #: queued (a drain or failover burst), so placement does not hold this worker back
        #: (speed first; rebalancing evens out after). Placement is for a trickle.
        self._backlog = False
        self._taker = taker
        self._metrics = metrics
        self._logger = logger
        self._slot_freed = asyncio.Event()
        self._rounds: set[asyncio.Task[None]] = set()
        self._in_hand = 0  # hints received whose acquire has not finished
        self._round_failed: BaseException | None = None

    @property
    def queue_url(self) -> str:
        return self._queue.queue_url

    def stop(self) -> None:
        """Finish the current round (releasing what it received) and return from :meth:`run`."""
        self._queue.stop()
        self._slot_freed.set()

    def slot_freed(self) -> None:
        """A session ended: a worker at capacity may receive again."""
        self._slot_freed.set()

    async def run(self) -> None:
        """Receive and act on hints until :meth:`stop`; then wait for the rounds in hand."""
        try:
            await self._queue.run(self._start_round, room=self._room)
        finally:
            if self._rounds:
                await asyncio.gather(*self._rounds, return_exceptions=True)
        if self._round_failed is not None:
            raise self._round_failed

    async def _room(self) -> int:
        """How many hints to receive next: the free slots less the hints in hand, within
        ``MAX_HINTS_IN_HAND``. Waits while that is none; 0 (receive no more) once stopped or a
        round failed."""
        deferred = False
        while not self._queue.stopped and self._round_failed is None:
            free = min(self._taker.free_slots(), MAX_HINTS_IN_HAND) - self._in_hand
            if free > 0:
                delay = 0.0
                if not deferred and not self._backlog and self._placement is not None:
                    delay = self._placement()
                if delay <= 0:
                    if not deferred:
                        self._queue.wait_seconds = self._wait_seconds
                    self._requested = min(free, RECEIVE_LIMIT)
                    return free
                # Placement: a more loaded worker lets its peers' long polls take what
                # arrives meanwhile, then takes what they left without waiting (a long poll
                # of its own would compete with theirs).
                deferred = True
                self._queue.wait_seconds = min(self._wait_seconds, _DEFERRED_WAIT_SECONDS)
                self._metrics.count("PlacementDeferrals")
                try:
                    async with asyncio.timeout(delay):
                        await self._queue.wait_stopped()
                except TimeoutError:
                    pass
                continue
            self._slot_freed.clear()
            try:
                async with asyncio.timeout(1.0):
                    await self._slot_freed.wait()
            except TimeoutError:
                pass
        return 0

    async def _start_round(self, messages: list[Message]) -> None:
        self._backlog = len(messages) > 1 or len(messages) >= self._requested > 0
        self._in_hand += len(messages)
        task = asyncio.create_task(self._handle(messages), name="hint-round")
        self._rounds.add(task)

        def settled(done: asyncio.Task[None]) -> None:
            self._rounds.discard(done)
            if not done.cancelled() and done.exception() is not None:
                self._round_failed = done.exception()  # a bug: run() re-raises it
            self._slot_freed.set()

        task.add_done_callback(settled)

    async def _handle(self, messages: list[Message]) -> None:
        held = len(messages)  # this round's hints still in hand

        def let_go(count: int) -> None:
            """``count`` of this round's hints are done with: room for the next receive."""
            nonlocal held
            count = min(count, held)
            held -= count
            self._in_hand -= count
            if count:
                self._slot_freed.set()

        async def act(hint: Hint) -> HintOutcome:
            try:
                return await self._taker.acquire(hint)
            finally:
                let_go(1)

        try:
            await self._act(messages, let_go, act)
        finally:
            let_go(held)

    async def _act(
        self,
        messages: list[Message],
        let_go: Callable[[int], None],
        act: Callable[[Hint], Awaitable[HintOutcome]],
    ) -> None:
        """Triage the round, acquire what it asks for, delete or give back each message."""
        triage = triage_hints(
            ((m["ReceiptHandle"], m.get("Body", "")) for m in messages),
            self._taker.running(),
            self._taker.capacity_left(),
        )
        self._logger.debug(
            "hints received",
            extra={"count": len(messages),
                   "connection_ids": [connection_id_from_pk(h.pk) for h, _ in triage.acquire]},
        )
        if triage.invalid:
            self._metrics.count("InvalidHints", len(triage.invalid))
            self._logger.warning(
                "deleting unusable hints",
                extra={"count": len(triage.invalid), "errors": triage.invalid[:3]},
            )
        let_go(len(messages) - len(triage.acquire))  # nothing to acquire for those
        # return_exceptions: one hint whose handling fails costs that hint, not the round (and
        # so not the worker: run() re-raises only failures of the round itself).
        outcomes = await asyncio.gather(
            *(act(hint) for hint, _ in triage.acquire), return_exceptions=True
        )
        handled, give_back = list(triage.drop), list(triage.release)
        for (hint, receipt), outcome in zip(triage.acquire, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, Exception):
                    raise outcome  # CancelledError and friends are not about this hint
                self._metrics.count("HintFailures")
                self._logger.error(
                    "hint failed; left for redelivery (then the dead-letter queue)",
                    extra={
                        "connection_id": connection_id_from_pk(hint.pk),
                        "error": type(outcome).__name__,
                    },
                    exc_info=outcome,
                )
            elif outcome is HintOutcome.DONE:
                handled.append(receipt)
            elif outcome is HintOutcome.GIVE_BACK:
                give_back.append(receipt)
        await self._queue.delete(handled)
        await self._queue.give_back(give_back)
