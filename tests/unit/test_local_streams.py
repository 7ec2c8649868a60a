"""The local stream event source: filter, batch, partial-failure retry, bisect, give up.

The stream is a stub of the three read calls (DescribeStream, GetShardIterator, GetRecords)
serving a fixed list of records: enough to drive the poller's delivery rules without I/O. The
poller against the real moto stream is covered by the local fleet integration test.
"""

from __future__ import annotations

import time

import pytest

from wsfleet_local.lambda_process import FunctionError
from wsfleet_local.stack import StreamSource
from wsfleet_local.streams import StreamPoller, failed_from

STOP_PATTERN = (
    '{"eventName": ["MODIFY"], "dynamodb": {"NewImage": {"desired_state": {"S": ["STOPPED"]}}}}'
)


def raw_record(seq: int, new_state: str = "STOPPED", *, created: float | None = None) -> dict:
    return {
        "eventID": f"e{seq}",
        "eventName": "MODIFY",
        "eventVersion": "1.1",
        "eventSource": "aws:dynamodb",
        "awsRegion": "us-east-1",
        "dynamodb": {
            "ApproximateCreationDateTime": int(created if created is not None else time.time()),
            "Keys": {"pk": {"S": f"CONN#c{seq}"}},
            "NewImage": {"pk": {"S": f"CONN#c{seq}"}, "desired_state": {"S": new_state}},
            "OldImage": {"pk": {"S": f"CONN#c{seq}"}, "desired_state": {"S": "STARTED"}},
            "SequenceNumber": str(seq),
            "SizeBytes": 10,
            "StreamViewType": "NEW_AND_OLD_IMAGES",
        },
    }


class StubStream:
    """One open shard holding ``records``; iterators are positions."""

    def __init__(self, records: list[dict]) -> None:
        self.records = records
        self.get_records_calls = 0

    def describe_stream(self, **kwargs):
        return {"StreamDescription": {"Shards": [{"ShardId": "shard-1"}]}}

    def get_shard_iterator(self, **kwargs):
        start = 0 if kwargs["ShardIteratorType"] == "TRIM_HORIZON" else len(self.records)
        return {"ShardIterator": str(start)}

    def get_records(self, ShardIterator, Limit):
        self.get_records_calls += 1
        start = int(ShardIterator)
        page = self.records[start : start + Limit]
        return {"Records": page, "NextShardIterator": str(start + len(page))}


class Recorder:
    """A fake function: records each batch's sequence numbers, answers from a script."""

    def __init__(self, answers=None) -> None:
        self.batches: list[list[str]] = []
        self.answers = list(answers or [])

    def __call__(self, event):
        self.batches.append([r["dynamodb"]["SequenceNumber"] for r in event["Records"]])
        answer = self.answers.pop(0) if self.answers else {"batchItemFailures": []}
        if isinstance(answer, Exception):
            raise answer
        return answer


def poller(records, invoke, **source_settings) -> tuple[StreamPoller, list[dict]]:
    settings = {
        "starting_position": "TRIM_HORIZON",
        "batch_size": 10,
        "maximum_retry_attempts": 2,
        "report_batch_item_failures": True,
        "filter_criteria": {"Filters": [{"Pattern": STOP_PATTERN}]},
        **source_settings,
    }
    failures: list[dict] = []
    p = StreamPoller(
        client=StubStream(records),
        stream_arn="arn:aws:dynamodb:us-east-1:123456789012:table/t/stream/x",
        invoke=invoke,
        source=StreamSource(stream=None, **settings),
        on_failure=failures.append,
        sleep=lambda seconds: False,  # no real waiting in unit tests
    )
    p._refresh_shards(time.monotonic())
    return p, failures


def test_filtered_records_never_reach_the_function():
    invoke = Recorder()
    p, _ = poller([raw_record(1), raw_record(2, "STARTED"), raw_record(3)], invoke)
    assert p.poll_once() is True
    assert invoke.batches == [["1", "3"]]
    assert (p.stats.records_read, p.stats.records_matched) == (3, 2)
    assert p.poll_once() is False  # nothing new


def test_batches_respect_batch_size():
    invoke = Recorder()
    p, _ = poller([raw_record(i) for i in range(1, 6)], invoke, batch_size=2)
    p.poll_once()
    p.poll_once()
    p.poll_once()
    assert invoke.batches == [["1", "2"], ["3", "4"], ["5"]]


def test_partial_failure_retries_from_the_first_failed_record():
    invoke = Recorder([{"batchItemFailures": [{"itemIdentifier": "3"}, {"itemIdentifier": "4"}]}])
    p, failures = poller([raw_record(i) for i in range(1, 5)], invoke)
    p.poll_once()
    assert invoke.batches == [["1", "2", "3", "4"], ["3", "4"]]
    assert p.stats.retries == 1 and not failures


def test_without_report_batch_item_failures_a_return_value_is_success():
    invoke = Recorder([{"batchItemFailures": [{"itemIdentifier": "1"}]}])
    p, _ = poller([raw_record(1)], invoke, report_batch_item_failures=False)
    p.poll_once()
    assert invoke.batches == [["1"]]


def test_gives_up_after_maximum_retry_attempts_and_reports_it():
    failing = {"batchItemFailures": [{"itemIdentifier": "2"}]}
    invoke = Recorder([failing] * 10)
    p, failures = poller([raw_record(1), raw_record(2)], invoke, maximum_retry_attempts=2)
    p.poll_once()
    assert invoke.batches == [["1", "2"], ["2"], ["2"]]  # 1 try + 2 retries
    assert p.stats.records_dropped == 1
    (message,) = failures
    assert message["requestContext"]["condition"] == "RetryAttemptsExhausted"
    assert message["requestContext"]["approximateInvokeCount"] == 3
    info = message["DDBStreamBatchInfo"]
    assert (info["startSequenceNumber"], info["endSequenceNumber"], info["batchSize"]) == (
        "2",
        "2",
        1,
    )
    assert p.poll_once() is False  # the shard moved on


def test_unknown_item_identifier_fails_the_whole_batch():
    batch = [raw_record(1), raw_record(2)]
    records = [{"dynamodb": r["dynamodb"]} for r in batch]
    assert failed_from({"batchItemFailures": [{"itemIdentifier": "9"}]}, records) == 0
    assert failed_from({"batchItemFailures": [{"itemIdentifier": None}]}, records) == 0
    assert failed_from({"batchItemFailures": [{"itemIdentifier": "2"}]}, records) == 1
    assert failed_from(None, records) is None


def test_function_error_bisects_the_batch():
    error = FunctionError("notifier", "RuntimeError", "boom")
    invoke = Recorder([error, {"batchItemFailures": []}, {"batchItemFailures": []}])
    p, _ = poller([raw_record(i) for i in range(1, 5)], invoke, bisect_batch_on_function_error=True)
    p.poll_once()
    assert invoke.batches == [["1", "2", "3", "4"], ["1", "2"], ["3", "4"]]


def test_function_error_without_bisect_retries_the_batch():
    error = FunctionError("notifier", "RuntimeError", "boom")
    invoke = Recorder([error])
    p, _ = poller([raw_record(1), raw_record(2)], invoke)
    p.poll_once()
    assert invoke.batches == [["1", "2"], ["1", "2"]]


def test_records_older_than_the_maximum_age_are_discarded():
    invoke = Recorder()
    old = raw_record(1, created=time.time() - 600)
    p, failures = poller([old, raw_record(2)], invoke, maximum_record_age_seconds=300)
    p.poll_once()
    assert invoke.batches == [["2"]]
    assert failures[0]["requestContext"]["condition"] == "RecordAgeExceeded"


@pytest.mark.parametrize("position", ["LATEST", "TRIM_HORIZON"])
def test_starting_position_applies_to_shards_present_at_start(position):
    invoke = Recorder()
    p, _ = poller([raw_record(1)], invoke, starting_position=position)
    p.poll_once()
    assert invoke.batches == ([] if position == "LATEST" else [["1"]])


def test_an_idle_shard_keeps_its_iterator():
    p, _ = poller([], Recorder())
    first = p._shards["shard-1"].iterator
    for _ in range(3):
        p.poll_once()
    assert p._shards["shard-1"].iterator == first
