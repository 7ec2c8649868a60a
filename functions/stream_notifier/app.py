"""Stream notifier Lambda: deliver STOP to the worker that owns the connection, at once.

The ConnectionsTable stream (NEW_AND_OLD_IMAGES) feeds this function through an event source
mapping whose FilterCriteria pass only changes of ``desired_state`` to STOPPED. This is the
primary STOP path: the owner hears about it in milliseconds on its own control queue. Without
it a STOP would take effect at the owner's next sweep of the connections it owns
(``WORKER_SWEEP_SECONDS``) or its next checkpoint write (refused once STOPPED), whichever
comes first.

Per record (Powertools ``BatchProcessor``, partial batch responses):

1. Re-check that it is a transition to STOPPED (the filter is configuration, this is code);
   anything else is ignored (:func:`stopped_connection`).
2. Read ``lease_owner`` and ``lease_epoch`` from the new image. No ``lease_owner`` (the
   attribute is absent while a connection is free): nothing to tell anyone.
3. Read the owner's worker item (one GetItem): a connection holds no expiry of its own, it is
   alive while its owner's worker lease is (lease model v2). Missing, without a control
   queue, lapsed or dead: nothing is sent (:func:`delivery_outcome`); that worker's sessions
   are fenced already, and a STOPPED connection is never acquired again.
4. Send ``{"type": "STOP", "pk", "epoch"}`` to the worker's control queue. A failed send
   raises inside the record handler, so only that record is reported in
   ``batchItemFailures`` and retried (a duplicate STOP is harmless: the worker checks the
   epoch).

Metrics per invocation: StopsDelivered, StopsSkipped, StopsFailed.
"""

from __future__ import annotations

import functools
from collections import Counter
from enum import StrEnum
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import (
    DynamoDBRecord,
    DynamoDBRecordEventName,
)
from aws_lambda_powertools.utilities.typing import LambdaContext

from wsfleet.aws import dynamodb_client, sqs_client
from wsfleet.clock import Clock, now_ms
from wsfleet.control import StopCommand
from wsfleet.lease import LeaseState, lease_state
from wsfleet.record import CONNECTION_PREFIX, ConnectionRecord, DesiredState, WorkerRecord
from wsfleet.settings import Settings
from wsfleet.store import LeaseStore

__all__ = [
    "Outcome",
    "StopNotifier",
    "delivery_outcome",
    "lambda_handler",
    "notifier",
    "reset_dependencies",
    "stopped_connection",
]

logger = Logger()
metrics = Metrics()
tracer = Tracer()


class Outcome(StrEnum):
    """What happened to one stream record."""

    DELIVERED = "delivered"  # STOP sent to the owner's control queue
    IGNORED = "ignored"  # not a transition to STOPPED
    NO_OWNER = "no_owner"  # nobody held the lease
    LEASE_EXPIRED = "lease_expired"  # the owner's worker lease lapsed or was killed: fenced
    WORKER_GONE = "worker_gone"  # the owner has no worker item, or no control queue in it

    @property
    def skipped(self) -> bool:
        return self in {Outcome.NO_OWNER, Outcome.LEASE_EXPIRED, Outcome.WORKER_GONE}


def _desired_state(image: dict[str, Any]) -> str | None:
    value = image.get("desired_state")
    return None if value is None else str(value)


def stopped_connection(record: DynamoDBRecord) -> ConnectionRecord | None:
    """The new image as a record if this stream record turns a connection STOPPED, else None.

    A transition is an INSERT or MODIFY whose new image is STOPPED and whose old image is
    absent or not STOPPED. Acquires, checkpoints, releases, worker items and REMOVEs are not.
    """
    if record.event_name not in (DynamoDBRecordEventName.INSERT, DynamoDBRecordEventName.MODIFY):
        return None
    stream = record.dynamodb
    if stream is None:
        return None
    new_image, old_image = stream.new_image, stream.old_image
    if _desired_state(new_image) != DesiredState.STOPPED:
        return None
    if old_image and _desired_state(old_image) == DesiredState.STOPPED:
        return None
    if not str(new_image.get("pk", "")).startswith(CONNECTION_PREFIX):
        return None
    return ConnectionRecord.from_item(new_image)


def delivery_outcome(
    connection: ConnectionRecord, owner: WorkerRecord | None, now_ms: int
) -> Outcome:
    """Whether a STOP of ``connection`` goes to its owner: DELIVERED means send it.

    ``owner`` is the worker item named by ``connection.lease_owner`` (None if there is none).
    Only a live owner (:func:`wsfleet.lease.lease_state` says ``held``) with a control queue
    is told; any other owner has no session left that could still stream.
    """
    state = lease_state(connection, owner, now_ms)
    if state is LeaseState.FREE:
        return Outcome.NO_OWNER
    if owner is None or not owner.control_queue_url:
        return Outcome.WORKER_GONE
    if state is LeaseState.EXPIRED:
        return Outcome.LEASE_EXPIRED
    return Outcome.DELIVERED


class StopNotifier:
    """Turns stream records into STOP commands on owners' control queues.

    :param store: reads worker items (GetItem).
    :param sqs: sends to control queues.
    """

    def __init__(self, store: LeaseStore, sqs: Any, *, clock: Clock = now_ms) -> None:
        self.store = store
        self._sqs = sqs
        self._clock = clock

    def handle(self, record: DynamoDBRecord) -> Outcome:
        """Process one record; raises if the STOP could not be sent (fails only this record)."""
        connection = stopped_connection(record)
        if connection is None:
            return Outcome.IGNORED
        if not connection.lease_owner:
            return Outcome.NO_OWNER  # free: not worth a read
        worker = self.store.get_worker(connection.lease_owner)
        outcome = delivery_outcome(connection, worker, self._clock())
        if outcome is not Outcome.DELIVERED or worker is None:
            return outcome
        command = StopCommand(connection.pk, connection.lease_epoch)
        self._sqs.send_message(QueueUrl=worker.control_queue_url, MessageBody=command.body())
        logger.info(
            "STOP delivered",
            extra={
                "pk": connection.pk,
                "epoch": connection.lease_epoch,
                "worker_id": worker.worker_id,
            },
        )
        return Outcome.DELIVERED


@functools.cache
def notifier() -> StopNotifier:
    """The container's notifier: settings and clients built on first use, then reused."""
    settings = Settings.from_env()
    return StopNotifier(LeaseStore.from_settings(settings, client=dynamodb_client()), sqs_client())


def reset_dependencies() -> None:
    """Forget the cached clients (the next invocation behaves like a cold start)."""
    notifier.cache_clear()


# An all-failed batch is reported record by record too (no exception): with
# ReportBatchItemFailures Lambda then retries from the first failed record, same as for a
# partial failure, and the on-failure destination gets it after MaximumRetryAttempts.
processor = BatchProcessor(
    event_type=EventType.DynamoDBStreams, raise_on_entire_batch_failure=False
)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics(capture_cold_start_metric=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """DynamoDB Streams batch -> ``{"batchItemFailures": [...]}`` (ReportBatchItemFailures)."""
    stop_notifier = notifier()
    outcomes: Counter[Outcome] = Counter()

    def record_handler(record: DynamoDBRecord) -> str:
        try:
            outcome = stop_notifier.handle(record)
        except Exception:
            logger.exception(
                "STOP not delivered; the record is reported for retry",
                extra={"sequence_number": (record.get("dynamodb") or {}).get("SequenceNumber")},
            )
            raise
        outcomes[outcome] += 1
        return outcome.value

    response = process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
    failed = len(response.get("batchItemFailures", []))
    delivered = outcomes[Outcome.DELIVERED]
    metrics.add_metric(name="StopsDelivered", unit=MetricUnit.Count, value=delivered)
    metrics.add_metric(
        name="StopsSkipped",
        unit=MetricUnit.Count,
        value=sum(n for outcome, n in outcomes.items() if outcome.skipped),
    )
    metrics.add_metric(name="StopsFailed", unit=MetricUnit.Count, value=failed)
    logger.info(
        "stream batch processed",
        extra={"outcomes": {k.value: v for k, v in outcomes.items()}, "failed": failed},
    )
    return dict(response)
