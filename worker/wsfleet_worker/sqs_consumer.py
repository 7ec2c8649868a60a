"""QueueConsumer: the one SQS receive loop, shared by the hint poller and the control channel.

Both queues are consumed the same way; only what is done with a batch differs:

* **receive**: long polls on a daemon thread (:meth:`~wsfleet_worker.offload.Offloader.poll`),
  at most 10 messages (the SQS maximum), or fewer when the owner has less room
  (:class:`~wsfleet_worker.poller.HintPoller` asks for no more hints than it has free slots);
* **back off on errors**: a receive that fails (throttling, an endpoint away) is logged
  (``<queue> receive failed``) and retried after a full-jitter exponential delay
  (:func:`wsfleet.backoff.backoff`, up to 5 s), reset by the next success, so a fleet that
  lost SQS together does not come back in lockstep;
* **delete in batches**: one DeleteMessageBatch per call; a failed delete only means the
  message comes back, which both owners tolerate (a refused acquire, an idempotent STOP);
* **give back on stop**: a batch that arrives after :meth:`QueueConsumer.stop` (the long poll
  was already out) is made visible again at once (ChangeMessageVisibility 0) for a peer,
  instead of waiting out its visibility timeout in a worker that is going away.

The consumer does not interpret bodies: the owner's ``handle`` does (and deletes or gives back
what it is done with).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from wsfleet.backoff import backoff

from .offload import Offloader

__all__ = ["RECEIVE_LIMIT", "Message", "QueueConsumer"]

#: SQS returns at most 10 messages per ReceiveMessage.
RECEIVE_LIMIT = 10
#: Receive retries: the ceiling starts at 0.4 s and doubles up to 5 s (full jitter below it).
_BACKOFF_INITIAL_SECONDS = 0.4
_BACKOFF_CAP_SECONDS = 5.0

#: One received SQS message, as boto3 returns it (``ReceiptHandle``, ``Body``, ...).
Message = dict[str, Any]


class QueueConsumer:
    """Long-polls one queue for one owner until stopped (or cancelled).

    :param queue: names the queue in log lines (``"hint queue"``, ``"control queue"``).
    :param message: names one of its messages in log lines (``"hint"``, ``"control message"``).
    :param queue_url: may be set later (the control queue exists only once it is created).
    """

    def __init__(
        self,
        sqs: Any,
        offloader: Offloader,
        logger: Any,
        *,
        queue: str,
        message: str,
        queue_url: str = "",
        wait_seconds: int = 20,
    ) -> None:
        self._sqs = sqs
        self._offloader = offloader
        self._logger = logger
        self._queue = queue
        self._message = message
        self.queue_url = queue_url
        self.wait_seconds = wait_seconds
        self._stopping = asyncio.Event()

    @property
    def stopped(self) -> bool:
        return self._stopping.is_set()

    def stop(self) -> None:
        """Receive no more; a batch already on its way is given back (see :meth:`run`)."""
        self._stopping.set()

    async def wait_stopped(self) -> None:
        """Return once :meth:`stop` was called."""
        await self._stopping.wait()

    async def run(
        self,
        handle: Callable[[list[Message]], Awaitable[None]],
        *,
        room: Callable[[], Awaitable[int]] | None = None,
    ) -> None:
        """Receive and pass every non-empty batch to ``handle`` until :meth:`stop`.

        ``room`` (default: always 10) returns how many messages to receive next, waiting
        while there is no room; 0 ends the loop (the owner stopped, or failed). A batch
        received after :meth:`stop` is given back at once and ``run`` returns.
        """
        delays: Iterator[float] | None = None
        while not self.stopped:
            limit = RECEIVE_LIMIT if room is None else min(RECEIVE_LIMIT, await room())
            if limit <= 0:
                return
            try:
                messages = await self.receive(limit, wait_seconds=self.wait_seconds)
            except (ClientError, BotoCoreError) as exc:
                self._logger.warning(f"{self._queue} receive failed", extra={"error": str(exc)})
                if delays is None:
                    delays = backoff(
                        initial=_BACKOFF_INITIAL_SECONDS, cap=_BACKOFF_CAP_SECONDS
                    )
                await asyncio.sleep(next(delays))
                continue
            delays = None
            if messages:  # (none when received after stop: given straight back)
                await handle(messages)

    async def receive(self, limit: int, *, wait_seconds: int) -> list[Message]:
        """One receive of at most ``limit`` messages (:meth:`run`'s, or one beside its loop;
        errors raise); what arrives after :meth:`stop` is given back and not returned."""
        response = await self._offloader.poll(
            self._sqs.receive_message,
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=min(limit, RECEIVE_LIMIT),
            WaitTimeSeconds=wait_seconds,
        )
        messages: list[Message] = response.get("Messages", [])
        if messages and self.stopped:
            await self.give_back([m["ReceiptHandle"] for m in messages])
            return []
        return messages

    async def delete(self, receipts: list[str]) -> None:
        """Delete handled messages, one DeleteMessageBatch (at most 10 receipts)."""
        if not receipts:
            return
        entries = [{"Id": str(i), "ReceiptHandle": r} for i, r in enumerate(receipts)]
        try:
            await self._offloader.sqs(
                self._sqs.delete_message_batch, QueueUrl=self.queue_url, Entries=entries
            )
        except (ClientError, BotoCoreError) as exc:  # redelivery is tolerated by every owner
            self._logger.warning(f"{self._message} delete failed", extra={"error": str(exc)})

    async def give_back(self, receipts: list[str]) -> None:
        """Make messages visible again now, for a peer (ChangeMessageVisibility 0)."""
        if not receipts:
            return
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
            self._logger.warning(f"{self._message} release failed", extra={"error": str(exc)})
