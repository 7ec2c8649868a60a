"""HintPoller: turns hint-queue messages into acquired leases and running sessions.

Each round long-polls the hint queue for at most as many messages as the worker has free
slots (never more than 10, the SQS maximum); at MAX_CONNECTIONS it does not receive at all and
waits for a slot. The batch is triaged (:func:`~wsfleet_worker.protocol.triage_hints`):

* unusable hints (any body :meth:`~wsfleet.hints.Hint.parse` refuses: not JSON, nested,
  over-long, a bad pk or epoch) are counted (``InvalidHints``), logged by excerpt and deleted;
* a hint whose handling raises is counted (``HintFailures``) and left for redelivery: one
  message never ends a round or the worker;
* hints for connections this worker already runs (and repeats within the batch) are deleted;
* the rest are acquired concurrently. ``acquire`` is the real decision: it succeeds only for a
  STARTED connection whose lease is free or expired, so stale or duplicate hints cost one
  refused conditional write (``AcquireConflicts``) and are deleted. An early hint, whose
  lease lapses within ``EARLY_HINT_MAX_WAIT_MS``, waits for the expiry and tries once more;
* a hint whose acquire failed for an unclassified reason (DynamoDB trouble) is left in the
  queue, to come back after its visibility timeout;
* hints over capacity (only possible if capacity shrank meanwhile) are made visible again at
  once for a peer.

Handled messages are deleted with one DeleteMessageBatch per round.

Rounds overlap: while one batch is being acted on (its acquires, or an early hint's wait for
its lease to lapse), the next receive is already out, up to ``MAX_ROUNDS_IN_FLIGHT`` batches
in hand. Taking over a hundred connections is then a pipeline, not ten rounds back to back.
Hints in hand count against the free slots, so overlapping never receives beyond capacity.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from wsfleet.hints import Hint
from wsfleet.record import connection_id_from_pk

from .observability import WorkerMetrics
from .offload import Offloader
from .protocol import triage_hints
from .taking import HintOutcome

__all__ = ["HintPoller"]

#: SQS returns at most 10 messages per ReceiveMessage.
RECEIVE_LIMIT = 10
#: Received batches being acted on at once (see the module docstring).
MAX_ROUNDS_IN_FLIGHT = 3


class HintPoller:
    """Long-polls the hint queue on behalf of a worker.

    :param free_slots: how many more sessions the worker wants to start now (zero while it
        is at capacity or its renewals run late): decides whether and how much to receive.
    :param capacity: how many more sessions fit at all: decides, once messages are in hand,
        how many to act on. Giving a received hint back costs a receive, and a hint received
        too often ends in the dead-letter queue.
    :param running: pks of the connections the worker holds.
    :param acquire: try to acquire and start one connection; see :class:`HintOutcome`.
    """

    def __init__(
        self,
        sqs: Any,
        queue_url: str,
        offloader: Offloader,
        metrics: WorkerMetrics,
        logger: Any,
        *,
        free_slots: Callable[[], int],
        capacity: Callable[[], int],
        running: Callable[[], set[str]],
        acquire: Callable[[Hint], Awaitable[HintOutcome]],
        wait_seconds: int = 20,
    ) -> None:
        self._sqs = sqs
        self.queue_url = queue_url
        self._offloader = offloader
        self._metrics = metrics
        self._logger = logger
        self._free_slots = free_slots
        self._capacity = capacity
        self._running = running
        self._acquire = acquire
        self._wait_seconds = wait_seconds
        self._stopping = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._rounds: dict[asyncio.Task[None], int] = {}  # round -> hints it holds
        self._round_failed: BaseException | None = None

    def stop(self) -> None:
        """Finish the current round (releasing what it received) and return from :meth:`run`."""
        self._stopping.set()
        self._slot_freed.set()

    def slot_freed(self) -> None:
        """A session ended: a worker at capacity may receive again."""
        self._slot_freed.set()

    async def run(self) -> None:
        """Receive and act on hints until :meth:`stop`; then wait for the rounds in hand."""
        try:
            await self._receive_rounds()
        finally:
            if self._rounds:
                await asyncio.gather(*self._rounds, return_exceptions=True)
        if self._round_failed is not None:
            raise self._round_failed

    async def _receive_rounds(self) -> None:
        failures = 0
        while not self._stopping.is_set() and self._round_failed is None:
            free = self._free_slots() - sum(self._rounds.values())
            if free <= 0 or len(self._rounds) >= MAX_ROUNDS_IN_FLIGHT:
                self._slot_freed.clear()
                try:
                    async with asyncio.timeout(1.0):
                        await self._slot_freed.wait()
                except TimeoutError:
                    pass
                continue
            try:
                response = await self._offloader.poll(
                    self._sqs.receive_message,
                    QueueUrl=self.queue_url,
                    MaxNumberOfMessages=min(RECEIVE_LIMIT, free),
                    WaitTimeSeconds=self._wait_seconds,
                )
            except (ClientError, BotoCoreError) as exc:
                failures += 1
                self._logger.warning("hint queue receive failed", extra={"error": str(exc)})
                await asyncio.sleep(min(5.0, 0.2 * 2**failures))
                continue
            failures = 0
            messages = response.get("Messages", [])
            if not messages:
                continue
            if self._stopping.is_set():  # received after stop: give them straight back
                await self._release([m["ReceiptHandle"] for m in messages])
                return
            self._start_round(messages)

    def _start_round(self, messages: list[dict[str, Any]]) -> None:
        task = asyncio.create_task(self._handle(messages), name="hint-round")
        self._rounds[task] = len(messages)

        def settled(done: asyncio.Task[None]) -> None:
            del self._rounds[done]
            if not done.cancelled() and done.exception() is not None:
                self._round_failed = done.exception()  # a bug: run() re-raises it
            self._slot_freed.set()  # room for another round

        task.add_done_callback(settled)

    async def _handle(self, messages: list[dict[str, Any]]) -> None:
        triage = triage_hints(
            ((m["ReceiptHandle"], m.get("Body", "")) for m in messages),
            self._running(),
            self._capacity(),
        )
        if triage.invalid:
            self._metrics.count("InvalidHints", len(triage.invalid))
            self._logger.warning(
                "deleting unusable hints",
                extra={"count": len(triage.invalid), "errors": triage.invalid[:3]},
            )
        # return_exceptions: one hint whose handling fails costs that hint, not the round (and
        # so not the worker: run() re-raises only failures of the round itself).
        outcomes = await asyncio.gather(
            *(self._acquire(hint) for hint, _ in triage.acquire), return_exceptions=True
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
        if handled:
            await self._delete(handled)
        if give_back:
            await self._release(give_back)

    async def _delete(self, receipts: list[str]) -> None:
        entries = [{"Id": str(i), "ReceiptHandle": r} for i, r in enumerate(receipts)]
        try:
            await self._offloader.sqs(
                self._sqs.delete_message_batch, QueueUrl=self.queue_url, Entries=entries
            )
        except (ClientError, BotoCoreError) as exc:  # redelivered hints only cost a refused acquire
            self._logger.warning("hint delete failed", extra={"error": str(exc)})

    async def _release(self, receipts: list[str]) -> None:
        """Make messages visible again now, for a peer."""
        entries = [
            {"Id": str(i), "ReceiptHandle": r, "VisibilityTimeout": 0}
            for i, r in enumerate(receipts)
        ]
        try:
            await self._offloader.sqs(
                self._sqs.change_message_visibility_batch,
                QueueUrl=self.queue_url,
                Entries=entries,
            )
        except (ClientError, BotoCoreError) as exc:
            self._logger.warning("hint release failed", extra={"error": str(exc)})
