"""The worker's own control queue: STOP commands delivered to the worker that owns a stream.

At start the worker creates an SQS queue named ``control_queue_name(CONTROL_QUEUE_PREFIX,
worker_id)``, tagged ``wsfleet:worker_id=<id>`` (so the reconciler can trace a queue back to a
dead worker and delete it), and registers its URL in its worker item. The stream notifier
Lambda reads ``lease_owner`` from a STOPPED record, finds that worker's item and sends a
:class:`~wsfleet.control.StopCommand` here. The worker closes the named session if it still
holds it under that epoch and a consistent read of the record confirms the STOP
(:func:`~wsfleet.control.stop_confirmed`): milliseconds instead of up to one heartbeat, and a
forged command cannot end a live stream.

Who may send here: with ``CONTROL_QUEUE_SENDER_ARNS`` set (the stack passes the notifier's
role), the queue is created with a policy denying ``SendMessage`` to every other principal
(:func:`~wsfleet.control.control_queue_policy`). Whatever still arrives is untrusted input: an
unusable body is counted (``InvalidControlMessages``), logged by excerpt and deleted, and a
failure while acting on one message (``ControlMessageFailures``) never ends the consumer.

Messages are short-lived (retention 300 s): a STOP nobody consumed in that time is moot, the
renewal has noticed the STOPPED record long before.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from wsfleet.bodies import excerpt
from wsfleet.control import (
    WORKER_ID_TAG,
    StopCommand,
    control_queue_name,
    control_queue_policy,
)
from wsfleet.record import connection_id_from_pk

from .observability import WorkerMetrics
from .offload import Offloader
from .upstream import describe_error

__all__ = ["ControlChannel"]

_RETENTION_SECONDS = 300


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
        self.queue_url = ""
        self._wait_seconds = wait_seconds
        self._sender_arns = sender_arns

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
        self.queue_url = response["QueueUrl"]
        return self.queue_url

    async def run(self, on_stop: Callable[[StopCommand], Awaitable[bool]]) -> None:
        """Long-poll until cancelled; ``on_stop`` returns whether the STOP applied."""
        failures = 0
        while True:
            try:
                response = await self._offloader.poll(
                    self._sqs.receive_message,
                    QueueUrl=self.queue_url,
                    MaxNumberOfMessages=10,
                    WaitTimeSeconds=self._wait_seconds,
                )
            except (ClientError, BotoCoreError) as exc:
                failures += 1
                self._logger.warning("control queue receive failed", extra={"error": str(exc)})
                await asyncio.sleep(min(5.0, 0.2 * 2**failures))
                continue
            failures = 0
            messages = response.get("Messages", [])
            for message in messages:
                await self._handle(message, on_stop)
            if messages:
                # Every message is deleted, applied or not: a STOP is idempotent and an
                # unusable body would only come back.
                await self._delete(messages)

    async def _handle(
        self, message: dict[str, Any], on_stop: Callable[[StopCommand], Awaitable[bool]]
    ) -> None:
        """Act on one message; nothing it contains can end the consumer."""
        body = message.get("Body", "")
        try:
            command = StopCommand.parse(body)
        except ValueError as exc:
            self._metrics.count("InvalidControlMessages")
            self._logger.warning(
                "deleting unusable control message",
                extra={"error": str(exc), "body": excerpt(body)},
            )
            return
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
            return
        self._metrics.count("StopCommands")
        self._logger.info(
            "STOP command received",
            extra={
                "connection_id": connection_id_from_pk(command.pk),
                "epoch": command.epoch,
                "applied": applied,
            },
        )

    async def _delete(self, messages: list[dict[str, Any]]) -> None:
        entries = [
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
        ]
        try:
            await self._offloader.sqs(
                self._sqs.delete_message_batch, QueueUrl=self.queue_url, Entries=entries
            )
        except (ClientError, BotoCoreError) as exc:  # redelivery repeats an idempotent STOP
            self._logger.warning("control message delete failed", extra={"error": str(exc)})

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
