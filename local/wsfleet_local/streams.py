"""A local DynamoDB Streams event source mapping: poll the table's stream, filter, invoke, retry.

On AWS, Lambda's event source mapping reads the ConnectionsTable stream, drops records the
``FilterCriteria`` reject, invokes the STOP notifier with batches, and on failure retries from
the first failed record (``ReportBatchItemFailures``) or bisects the batch
(``BisectBatchOnFunctionError``) until ``MaximumRetryAttempts``, then gives the batch up to the
on-failure destination. :class:`StreamPoller` does the same against the embedded backend's
stream with the settings read from template.yaml (:class:`wsfleet_local.stack.StreamSource`),
so the notifier sees exactly the records and batches it would see on AWS.

Shards are followed the way the Kinesis Client Library does: listed with DescribeStream,
parents drained before their children, closed shards (no ``NextShardIterator``) retired.
Records of one shard are processed in order, and a shard blocks while its batch is retried.

The poll interval is short (150 ms by default) because this is the STOP path: a STOP must
reach its worker well under a second after the API call.

Example::

    poller = StreamPoller(client=boto3.client("dynamodbstreams"), stream_arn=arn,
                          invoke=notifier.invoke, source=spec.streams[0]).start()
    ...
    poller.stop()
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from .eventfilter import RecordFilter
from .events import lambda_stream_record, stream_batch_event
from .lambda_process import FunctionError
from .serving import BackgroundLoop
from .stack import StreamSource

__all__ = ["BatchOutcome", "PollerStats", "StreamPoller", "failed_from", "on_failure_message"]

logger = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL_SECONDS = 0.15
#: Re-list shards this often even when nothing closed (a new shard can appear after a split).
DESCRIBE_EVERY_SECONDS = 10.0
#: Keep reusing an idle iterator this long; AWS expires iterators after 15 minutes.
ITERATOR_REFRESH_SECONDS = 300.0
RETRY_BACKOFF_SECONDS = (0.1, 0.2, 0.5, 1.0, 2.0)

Invoke = Callable[[dict[str, Any]], Any]


@dataclass(frozen=True)
class BatchOutcome:
    """What one invocation said: all done, or retry from ``retry_from`` (an index in the batch)."""

    retry_from: int | None
    function_error: bool = False


def failed_from(response: Any, batch: Sequence[Mapping[str, Any]]) -> int | None:
    """Index of the first record to retry, per a ``batchItemFailures`` response; None if none.

    As on AWS: the lowest failed sequence number wins, and an identifier that is missing,
    empty or not in the batch fails the whole batch (index 0).

    >>> batch = [{"dynamodb": {"SequenceNumber": "1"}}, {"dynamodb": {"SequenceNumber": "2"}}]
    >>> failed_from({"batchItemFailures": [{"itemIdentifier": "2"}]}, batch)
    1
    >>> failed_from({"batchItemFailures": []}, batch) is None
    True
    """
    if not isinstance(response, Mapping):
        return None
    failures = response.get("batchItemFailures")
    if not failures:
        return None
    positions = {str(r["dynamodb"]["SequenceNumber"]): i for i, r in enumerate(batch)}
    indexes = []
    for failure in failures:
        identifier = failure.get("itemIdentifier") if isinstance(failure, Mapping) else None
        if not identifier or str(identifier) not in positions:
            return 0
        indexes.append(positions[str(identifier)])
    return min(indexes)


def on_failure_message(
    batch: Sequence[Mapping[str, Any]],
    *,
    shard_id: str,
    stream_arn: str,
    function_arn: str,
    attempts: int,
    condition: str,
) -> dict[str, Any]:
    """The record Lambda sends an on-failure destination when it gives a stream batch up."""
    first, last = batch[0]["dynamodb"], batch[-1]["dynamodb"]
    return {
        "requestContext": {
            "requestId": f"local-{first['SequenceNumber']}",
            "functionArn": function_arn,
            "condition": condition,
            "approximateInvokeCount": attempts,
        },
        "responseContext": {"statusCode": 200, "executedVersion": "$LATEST"},
        "version": "1.0",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()),
        "DDBStreamBatchInfo": {
            "shardId": shard_id,
            "startSequenceNumber": first["SequenceNumber"],
            "endSequenceNumber": last["SequenceNumber"],
            "approximateArrivalOfFirstRecord": first.get("ApproximateCreationDateTime"),
            "approximateArrivalOfLastRecord": last.get("ApproximateCreationDateTime"),
            "batchSize": len(batch),
            "streamArn": stream_arn,
        },
    }


@dataclass
class PollerStats:
    """Counters for the demo and tests (read while the poller runs; ints only)."""

    records_read: int = 0
    records_matched: int = 0
    invocations: int = 0
    retries: int = 0
    records_dropped: int = 0
    errors: int = 0


@dataclass
class _Shard:
    shard_id: str
    parent_id: str | None
    iterator: str | None = None
    iterator_at: float = 0.0
    last_sequence: str | None = None


class StreamPoller(BackgroundLoop):
    """Polls one stream on a background thread and invokes the function like Lambda's ESM.

    ``on_failure`` receives the on-failure destination message of every batch given up
    (after ``MaximumRetryAttempts``); without one, the drop is only logged.
    """

    thread_name = "wsfleet-streams"

    def __init__(
        self,
        *,
        client: Any,
        stream_arn: str,
        invoke: Invoke,
        source: StreamSource,
        region: str = "us-east-1",
        function_arn: str = "",
        poll_interval_seconds: float = DEFAULT_POLL_INTERVAL_SECONDS,
        on_failure: Callable[[dict[str, Any]], None] | None = None,
        sleep: Callable[[float], bool] | None = None,
    ) -> None:
        super().__init__()
        self.client = client
        self.stream_arn = stream_arn
        self.invoke = invoke
        self.source = source
        self.region = region
        self.function_arn = function_arn
        self.poll_interval_seconds = poll_interval_seconds
        self.on_failure = on_failure
        self.accept = RecordFilter.from_criteria(source.filter_criteria)
        self.stats = PollerStats()
        self._sleep = sleep or self._stop.wait  # returns True when stopping
        self._shards: dict[str, _Shard] = {}  # the open ones
        self._finished: set[str] = set()  # closed shards, read to their end
        self._described_at = 0.0
        self._first_listing = True

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> StreamPoller:
        """List the shards and position the iterators now, then poll on a daemon thread.

        Positioning before returning matters with ``StartingPosition: LATEST``: a write made
        right after start() is then guaranteed to be seen.
        """
        self._refresh_shards(time.monotonic())
        return super().start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                busy = self.poll_once()
            except Exception:  # keep the event source alive, as AWS does, and say why
                self.stats.errors += 1
                logger.exception("stream poll failed; retrying")
                busy = False
            if not busy and self._sleep(self.poll_interval_seconds):
                return

    # -- one round ---------------------------------------------------------------------------

    def poll_once(self) -> bool:
        """Read each open shard once and deliver what it holds. True if any record was read."""
        now = time.monotonic()
        if now - self._described_at >= DESCRIBE_EVERY_SECONDS:
            self._refresh_shards(now)
        busy = False
        for shard in list(self._shards.values()):
            if self._stop.is_set():
                break
            # A child shard waits until its parent is drained (order across a split).
            if shard.parent_id not in self._shards:
                busy |= self._poll_shard(shard)
        return busy

    def _refresh_shards(self, now: float) -> None:
        shards: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"StreamArn": self.stream_arn}
        while True:  # DescribeStream pages by hand: botocore has no paginator for it
            description = self.client.describe_stream(**kwargs)["StreamDescription"]
            shards.extend(description.get("Shards", []))
            if not description.get("LastEvaluatedShardId"):
                break
            kwargs["ExclusiveStartShardId"] = description["LastEvaluatedShardId"]
        for item in shards:
            shard_id = item["ShardId"]
            if shard_id in self._shards or shard_id in self._finished:
                continue
            shard = _Shard(shard_id=shard_id, parent_id=item.get("ParentShardId"))
            # Shards present when the mapping starts use StartingPosition; later ones are new
            # (children of a split) and are read from their beginning.
            position = self.source.starting_position if self._first_listing else "TRIM_HORIZON"
            shard.iterator = self._iterator(shard_id, position)
            shard.iterator_at = now
            self._shards[shard_id] = shard
        self._first_listing = False
        self._described_at = now

    def _iterator(self, shard_id: str, position: str, sequence: str | None = None) -> str:
        kwargs: dict[str, Any] = {
            "StreamArn": self.stream_arn,
            "ShardId": shard_id,
            "ShardIteratorType": position,
        }
        if sequence is not None:
            kwargs["SequenceNumber"] = sequence
        return str(self.client.get_shard_iterator(**kwargs)["ShardIterator"])

    def _poll_shard(self, shard: _Shard) -> bool:
        assert shard.iterator is not None
        try:
            page = self.client.get_records(
                ShardIterator=shard.iterator, Limit=max(1, min(self.source.batch_size, 1000))
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ExpiredIteratorException":
                raise
            position = "AFTER_SEQUENCE_NUMBER" if shard.last_sequence else "TRIM_HORIZON"
            shard.iterator = self._iterator(shard.shard_id, position, shard.last_sequence)
            shard.iterator_at = time.monotonic()
            return True
        records = page.get("Records") or []
        next_iterator = page.get("NextShardIterator")
        if records:
            self._deliver(shard, records)
            shard.last_sequence = str(records[-1]["dynamodb"]["SequenceNumber"])
        if next_iterator is None:
            del self._shards[shard.shard_id]
            self._finished.add(shard.shard_id)
            self._described_at = 0.0  # look for its children now
            return bool(records)
        # An empty page's next iterator is the same position: keep the old one for a while, so
        # an idle poll loop does not mint a new iterator every 150 ms (moto keeps them all).
        now = time.monotonic()
        if records or now - shard.iterator_at >= ITERATOR_REFRESH_SECONDS:
            shard.iterator = str(next_iterator)
            shard.iterator_at = now
        return bool(records)

    # -- delivery ----------------------------------------------------------------------------

    def _deliver(self, shard: _Shard, raw_records: Sequence[Mapping[str, Any]]) -> None:
        self.stats.records_read += len(raw_records)
        records = [
            lambda_stream_record(raw, event_source_arn=self.stream_arn, region=self.region)
            for raw in raw_records
        ]
        records = self._drop_expired(shard, records)
        matched = [record for record in records if self.accept(record)]
        self.stats.records_matched += len(matched)
        size = max(1, self.source.batch_size)
        for start in range(0, len(matched), size):
            if self._stop.is_set():
                return
            self._deliver_batch(shard, matched[start : start + size], attempt=0)

    def _drop_expired(self, shard: _Shard, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Records older than ``MaximumRecordAgeInSeconds`` are discarded, as on AWS."""
        limit = self.source.maximum_record_age_seconds
        if limit < 0:
            return records
        cutoff = time.time() - limit
        expired = [r for r in records if _created_at(r) < cutoff]
        if expired:
            self._give_up(shard, expired, attempts=0, condition="RecordAgeExceeded")
            return [r for r in records if _created_at(r) >= cutoff]
        return records

    def _deliver_batch(self, shard: _Shard, batch: list[dict[str, Any]], attempt: int) -> None:
        """Invoke until the batch succeeds, retrying its failed tail; give up after the limit."""
        while batch and not self._stop.is_set():
            outcome = self._invoke(batch)
            if outcome.retry_from is None:
                return
            if (
                outcome.function_error
                and self.source.bisect_batch_on_function_error
                and (len(batch) > 1)
            ):
                middle = len(batch) // 2
                self.stats.retries += 1
                self._deliver_batch(shard, batch[:middle], attempt + 1)
                self._deliver_batch(shard, batch[middle:], attempt + 1)
                return
            batch = batch[outcome.retry_from :]
            limit = self.source.maximum_retry_attempts
            if 0 <= limit <= attempt:
                self._give_up(shard, batch, attempts=attempt + 1)
                return
            attempt += 1
            self.stats.retries += 1
            delay = RETRY_BACKOFF_SECONDS[min(attempt - 1, len(RETRY_BACKOFF_SECONDS) - 1)]
            if self._sleep(delay):
                return

    def _invoke(self, batch: list[dict[str, Any]]) -> BatchOutcome:
        self.stats.invocations += 1
        try:
            response = self.invoke(stream_batch_event(batch))
        except FunctionError as exc:
            logger.warning("stream batch of %d failed: %s", len(batch), exc)
            return BatchOutcome(retry_from=0, function_error=True)
        except (BotoCoreError, OSError) as exc:  # the runtime itself could not be reached
            logger.warning("stream batch of %d not delivered: %s", len(batch), exc)
            return BatchOutcome(retry_from=0, function_error=True)
        if not self.source.report_batch_item_failures:
            return BatchOutcome(retry_from=None)  # without the response type, a return is success
        return BatchOutcome(retry_from=failed_from(response, batch))

    def _give_up(
        self,
        shard: _Shard,
        batch: list[dict[str, Any]],
        *,
        attempts: int,
        condition: str = "RetryAttemptsExhausted",
    ) -> None:
        self.stats.records_dropped += len(batch)
        message = on_failure_message(
            batch,
            shard_id=shard.shard_id,
            stream_arn=self.stream_arn,
            function_arn=self.function_arn,
            attempts=attempts,
            condition=condition,
        )
        logger.error(
            "giving up on %d stream record(s) %s..%s after %d attempt(s): %s",
            len(batch),
            batch[0]["dynamodb"]["SequenceNumber"],
            batch[-1]["dynamodb"]["SequenceNumber"],
            attempts,
            condition,
        )
        if self.on_failure is not None:
            try:
                self.on_failure(message)
            except Exception:
                logger.exception("on-failure destination rejected the record")


def _created_at(record: Mapping[str, Any]) -> float:
    """ApproximateCreationDateTime in epoch seconds (records without one never expire)."""
    value = record.get("dynamodb", {}).get("ApproximateCreationDateTime")
    return float(value) if isinstance(value, int | float) else float("inf")
