"""The worker's own control queue: STOP commands delivered to the worker that owns a stream.

At start the worker creates an SQS queue named ``control_queue_name(CONTROL_QUEUE_PREFIX,
worker_id)``, tagged ``wsfleet:worker_id=<id>`` (so the reconciler can trace a queue back to a
dead worker and delete it), and registers its URL in its worker item. The stream notifier
Lambda reads ``lease_owner`` from a STOPPED record, finds that worker's item and sends a
:class:`~wsfleet.control.StopCommand` here. The worker closes the named session if it still
holds it under that epoch and a consistent read of the record confirms the STOP
(:func:`~wsfleet.control.stop_confirmed`): milliseconds instead of up to one heartbeat, and a
forged command cannot end a live stream.

Planned hand-offs use the same queue: a peer handing a connection over sends a
:class:`~wsfleet.control.HandoffHint` here (break-before-make), which the worker acquires at
once (:mod:`~wsfleet_worker.rebalancing`), and the make-before-break messages (``PREPARE``,
``READY``, ``DECLINE``, ``COMMIT``, docs/handoff.md) travel between giver and taker here too.
Every message other than a STOP goes to the worker's hand-off callback, at once: a round's
DeleteMessageBatch does not hold up the next receive, and while receives come back full (a
drain's burst) up to two more receives run beside the long poll until one is not full. Hand-off
messages to peers go through :class:`ControlBatcher` (ten per SendMessageBatch, per queue).

Who may send here: with ``CONTROL_QUEUE_SENDER_ARNS`` set (the stack passes the notifier's
role and the worker role, for hand-offs), the queue is created with a policy denying
``SendMessage`` to every other principal (:func:`~wsfleet.control.control_queue_policy`).
Whatever still arrives is untrusted input: an unusable body is counted
(``InvalidControlMessages``), logged by excerpt and deleted, and a failure while acting on one
message (``ControlMessageFailures``) never ends the consumer.

Receiving (with backoff on errors) and deleting are
:class:`~wsfleet_worker.sqs_consumer.QueueConsumer`'s, the loop the hint poller uses too; this
module only says what a control message means.

Messages are short-lived (retention 300 s): a STOP nobody consumed in that time is moot, the
renewal has noticed the STOPPED record long before.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from wsfleet.bodies import excerpt
from wsfleet.control import (
    WORKER_ID_TAG,
    CommitNotice,
    DeclineReply,
    HandoffHint,
    PrepareCommand,
    ReadyReply,
    StopCommand,
    control_queue_name,
    control_queue_policy,
    parse_control_message,
    queue_name_of,
)
from wsfleet.hints import SQS_BATCH_LIMIT
from wsfleet.record import connection_id_from_pk

from .connector import describe_error
from .observability import WorkerMetrics
from .offload import Offloader
from .sqs_consumer import RECEIVE_LIMIT, Message, QueueConsumer

__all__ = ["ControlBatcher", "ControlChannel", "HandoffMessage", "by_type"]

#: What the control queue carries besides STOP: hand-off hints and the overlap protocol.
HandoffMessage = HandoffHint | PrepareCommand | ReadyReply | DeclineReply | CommitNotice
#: Each hand-off message's ``type`` on the wire (log lines name them so).
_TYPES: dict[type, str] = {HandoffHint: "HANDOFF", PrepareCommand: "PREPARE",
                           ReadyReply: "READY", DeclineReply: "DECLINE", CommitNotice: "COMMIT"}


def by_type(messages: Iterable[HandoffMessage]) -> dict[str, list[str]]:
    """The connection ids of ``messages`` by message type: one log line names a batch (the
    hand-off bench times each step of a move from these, bench/handoff_stages.py).

    >>> by_type([PrepareCommand("CONN#a", 1, "g", 0, "q"), CommitNotice("CONN#b", 2)])
    {'PREPARE': ['a'], 'COMMIT': ['b']}
    """
    named: dict[str, list[str]] = {}
    for message in messages:
        named.setdefault(_TYPES[type(message)], []).append(connection_id_from_pk(message.pk))
    return named

_RETENTION_SECONDS = 300
#: Receives beside the long poll at most while messages come ten at a time (a drain's burst:
#: a hundred PREPAREs or READYs were ten receives one after another). Idle, none run.
_BURST_RECEIVES = 2
#: A partial batch of hand-off messages goes out at once while fewer sends than this to its
#: queue are out (one SQS thread of the four stays free for deletes and other queues).
_PARTIAL_SENDS_OUT = 3


class ControlBatcher:
    """Hand-off messages to peers' control queues, batched per queue: ten make a
    SendMessageBatch, which goes out at once; fewer go out at the end of the event loop's
    turn unless ``_PARTIAL_SENDS_OUT`` sends to that queue are out already, else when one
    returns, with whatever was queued meanwhile. So a drain's hundred PREPAREs to two peers
    are ten requests at once, not a hundred one after another on the four SQS threads, a
    READY or COMMIT that comes alone goes at once, and a burst of them (a hundred sessions
    getting their first frames) shares requests instead of queueing one per message on the
    SQS threads. Each caller learns whether its own message went out.

    :param send: sends up to ten messages to one queue; returns the pks that went out (or
        raises: every caller of that batch gets the error).
    """

    def __init__(self, send: Callable[[str, list[HandoffMessage]], Awaitable[set[str]]]) -> None:
        self._send = send
        self._queued: dict[str, list[tuple[HandoffMessage, asyncio.Future[bool]]]] = {}
        self._out: dict[str, int] = {}  # sends in flight per queue
        self._sending: set[asyncio.Task[None]] = set()
        #: requests made (tests, logs)
        self.requests = 0

    async def send(self, queue_url: str, message: HandoffMessage) -> bool:
        """Queue ``message`` for ``queue_url``; True once it went out."""
        loop = asyncio.get_running_loop()
        sent: asyncio.Future[bool] = loop.create_future()
        queued = self._queued.setdefault(queue_url, [])
        queued.append((message, sent))
        if len(queued) >= SQS_BATCH_LIMIT:
            self._start(queue_url)
        elif len(queued) == 1:
            # after every caller already runnable in this turn (a drain's PREPAREs)
            loop.call_soon(self._start_partial, queue_url)
        return await sent

    def _start_partial(self, queue_url: str) -> None:
        if self._out.get(queue_url, 0) < _PARTIAL_SENDS_OUT:
            self._start(queue_url)

    def _start(self, queue_url: str) -> None:
        queued = self._queued.get(queue_url, [])
        batch, rest = queued[:SQS_BATCH_LIMIT], queued[SQS_BATCH_LIMIT:]
        if not batch:
            return
        if rest:
            self._queued[queue_url] = rest
        else:
            del self._queued[queue_url]
        self._out[queue_url] = self._out.get(queue_url, 0) + 1
        self.requests += 1
        task = asyncio.create_task(self._send_batch(queue_url, batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send_batch(
        self, queue_url: str, batch: list[tuple[HandoffMessage, asyncio.Future[bool]]]
    ) -> None:
        try:
            sent = await self._send(queue_url, [message for message, _ in batch])
        except Exception as exc:  # each caller decides what a lost message costs
            for _, waiter in batch:
                if not waiter.done():  # (a caller cancelled meanwhile: nobody to tell)
                    waiter.set_exception(exc)
            return
        else:
            for message, waiter in batch:
                if not waiter.done():
                    waiter.set_result(message.pk in sent)
        finally:
            self._out[queue_url] -= 1
            if not self._out[queue_url]:
                del self._out[queue_url]
            while len(self._queued.get(queue_url, ())) >= SQS_BATCH_LIMIT:
                self._start(queue_url)
            if self._out.get(queue_url, 0) < _PARTIAL_SENDS_OUT:
                self._start(queue_url)  # what was queued meanwhile


class ControlChannel:
    """Creates, consumes and deletes one worker's control queue."""

    def __init__(
        self,
        sqs: Any,
        offloader: Offloader,
        metrics: WorkerMetrics,
        logger: Any,
        *,
        prefix: str,
        worker_id: str,
        wait_seconds: int = 20,
        sender_arns: tuple[str, ...] = (),
    ) -> None:
        self._sqs = sqs
        self._offloader = offloader
        self._metrics = metrics
        self._logger = logger
        self.worker_id = worker_id
        self.queue_name = control_queue_name(prefix, worker_id)
        self._wait_seconds = wait_seconds
        self._sender_arns = sender_arns
        self._takes: set[asyncio.Task[None]] = set()  # hand-offs being acquired
        self._bursts = 0  # receives running beside the loop (see run)
        self._queue = QueueConsumer(
            sqs,
            offloader,
            logger,
            queue="control queue",
            message="control message",
            wait_seconds=wait_seconds,
        )

    @property
    def queue_url(self) -> str:
        """The queue's URL once :meth:`open` created it ("" before)."""
        return self._queue.queue_url

    async def open(self) -> str:
        """Create (or adopt) the queue and return its URL."""
        attributes = {
            "MessageRetentionPeriod": str(_RETENTION_SECONDS),
            "ReceiveMessageWaitTimeSeconds": str(self._wait_seconds),
            "VisibilityTimeout": "30",
        }
        if self._sender_arns:  # set at creation: the worker role has no SetQueueAttributes
            attributes["Policy"] = control_queue_policy(
                self.queue_name, self._sqs.meta.region_name, self._sender_arns
            )
        response = await self._offloader.sqs(
            self._sqs.create_queue,
            QueueName=self.queue_name,
            Attributes=attributes,
            tags={WORKER_ID_TAG: self.worker_id},
        )
        self._queue.queue_url = response["QueueUrl"]
        return self.queue_url

    async def run(
        self,
        on_stop: Callable[[StopCommand], Awaitable[bool]],
        on_handoff: Callable[[HandoffMessage], Awaitable[None]] | None = None,
    ) -> None:
        """Long-poll until cancelled; ``on_stop`` returns whether the STOP applied;
        ``on_handoff`` takes a hand-off message addressed here (None: ignored)."""

        async def handle(messages: list[Message]) -> None:
            handoffs: list[HandoffMessage] = []
            for message in messages:
                handoff = await self._handle(message, on_stop)
                if handoff is not None:
                    handoffs.append(handoff)
            if handoffs:
                self._logger.debug("control messages received",
                                   extra={"messages": by_type(handoffs)})
            for handoff in handoffs:
                # At once, and without holding up the next receive: each is a peer's
                # stream waiting for its taker.
                if on_handoff is not None:
                    self._spawn(self._take(on_handoff, handoff))
            # Every message is deleted, applied or not: a STOP is idempotent and an unusable
            # body would only come back. The delete does not hold up the next receive either
            # (a message whose delete is late only comes back after the visibility timeout,
            # which every message tolerates).
            self._spawn(self._queue.delete([m["ReceiptHandle"] for m in messages]))
            if len(messages) >= RECEIVE_LIMIT and self._bursts < _BURST_RECEIVES:
                # A full receive: a burst (a peer's drain: its PREPAREs; our drain: the
                # takers' READYs). One more receive runs beside the loop while it lasts.
                self._bursts += 1
                self._spawn(self._burst(handle))

        await self._queue.run(handle)

    async def _burst(self, handle: Callable[[list[Message]], Awaitable[None]]) -> None:
        """Receive (without waiting) beside the long poll until a receive is not full; a
        receive that fails ends it (the loop's backoff covers the queue)."""
        try:
            while not self._queue.stopped:
                try:
                    messages = await self._queue.receive(RECEIVE_LIMIT, wait_seconds=0)
                except (ClientError, BotoCoreError):
                    return
                if messages:
                    await handle(messages)
                if len(messages) < RECEIVE_LIMIT:
                    return
        finally:
            self._bursts -= 1

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._takes.add(task)
        task.add_done_callback(self._takes.discard)

    async def _take(
        self, on_handoff: Callable[[HandoffMessage], Awaitable[None]], handoff: HandoffMessage
    ) -> None:
        try:
            await on_handoff(handoff)
        except Exception as exc:  # a bug must cost this hand-off (its copy follows), no more
            self._metrics.count("ControlMessageFailures")
            self._logger.error(
                "hand-off failed",
                extra={"connection_id": connection_id_from_pk(handoff.pk),
                       "error": describe_error(exc)},
                exc_info=exc,
            )

    async def send_handoffs(
        self, queue_url: str, handoffs: list[HandoffHint] | list[HandoffMessage]
    ) -> set[str]:
        """Send up to ten hand-off messages to a peer's control queue in one
        SendMessageBatch; returns the pks that went out (for hints: the others' delayed
        copies on the hint queue go out at once)."""
        batch = handoffs[:SQS_BATCH_LIMIT]
        entries = [{"Id": str(i), "MessageBody": h.body()} for i, h in enumerate(batch)]
        try:
            response = await self._offloader.sqs(
                self._sqs.send_message_batch, QueueUrl=queue_url, Entries=entries
            )
        except (ClientError, BotoCoreError) as exc:
            self._logger.warning(
                "hand-off messages not sent to the peer",
                extra={"count": len(entries), "error": str(exc), "queue": queue_name_of(queue_url)},
            )
            return set()
        landed = [handoffs[int(entry["Id"])] for entry in response.get("Successful", [])]
        sent = {handoff.pk for handoff in landed}
        self._logger.debug("control messages sent",
                           extra={"messages": by_type(landed), "queue": queue_name_of(queue_url)})
        if len(sent) < len(entries):
            self._logger.warning(
                "some hand-off hints not sent to the peer",
                extra={"count": len(entries) - len(sent)},
            )
        return sent

    async def _handle(
        self, message: Message, on_stop: Callable[[StopCommand], Awaitable[bool]]
    ) -> HandoffMessage | None:
        """Act on one STOP, or return the hand-off message; nothing a message holds ends the
        consumer."""
        body = message.get("Body", "")
        try:
            command = parse_control_message(body)
        except ValueError as exc:
            self._metrics.count("InvalidControlMessages")
            self._logger.warning(
                "deleting unusable control message",
                extra={"error": str(exc), "body": excerpt(body)},
            )
            return None
        if isinstance(command, HandoffHint):
            self._metrics.count("HandoffHints")
            return command
        if not isinstance(command, StopCommand):
            self._metrics.count("HandoffMessages")
            return command
        try:
            applied = await on_stop(command)
        except Exception as exc:  # a bug must cost this message, not the control channel
            self._metrics.count("ControlMessageFailures")
            self._logger.error(
                "STOP command failed",
                extra={
                    "connection_id": connection_id_from_pk(command.pk),
                    "error": describe_error(exc),
                },
                exc_info=exc,
            )
            return None
        self._metrics.count("StopCommands")
        self._logger.info(
            "STOP command received",
            extra={
                "connection_id": connection_id_from_pk(command.pk),
                "epoch": command.epoch,
                "applied": applied,
            },
        )
        return None

    async def close(self) -> None:
        """Delete the queue (graceful exit). The reconciler removes those of crashed workers."""
        if not self.queue_url:
            return
        try:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(
                None, functools.partial(self._sqs.delete_queue, QueueUrl=self.queue_url)
            )
        except (ClientError, BotoCoreError) as exc:
            self._logger.warning("control queue delete failed", extra={"error": str(exc)})
