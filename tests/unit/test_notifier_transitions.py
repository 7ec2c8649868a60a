"""Stream notifier decisions: which stream records are STOP transitions, and who hears of them.

No network: the sample events are parsed with Powertools' data class, the worker lookup and the
SQS send are small recording stand-ins. The same events go through the real handler against the
moto server in tests/integration/test_stream_notifier.py.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord

from wsfleet.control import StopCommand
from wsfleet.record import WorkerRecord
from wsfleet_local import eventfilter
from wsfleet_local.backend import load_template
from wsfleet_local.handler_loader import load_function

EVENTS = Path(__file__).resolve().parents[2] / "events"
#: The sample events are written at 2026-01-01T00:00:00Z. A connection item carries no expiry
#: (lease model v2): whether its owner is alive is the owner's worker item, made here.
EVENT_NOW_MS = 1_767_225_600_000

notifier_app = load_function("stream_notifier")
Outcome = notifier_app.Outcome


def records(name: str) -> list[dict[str, Any]]:
    return json.loads((EVENTS / name).read_text())["Records"]


def record(raw: dict[str, Any]) -> DynamoDBRecord:
    return DynamoDBRecord(raw)


@dataclass
class Workers:
    """get_worker() over a dict: the part of LeaseStore the notifier reads."""

    items: dict[str, WorkerRecord] = field(default_factory=dict)

    def get_worker(self, worker_id: str) -> WorkerRecord | None:
        return self.items.get(worker_id)


@dataclass
class Outbox:
    """send_message() that records what would have been sent, or raises when told to."""

    sent: list[tuple[str, str]] = field(default_factory=list)
    fail_for: set[str] = field(default_factory=set)

    def send_message(self, *, QueueUrl: str, MessageBody: str) -> dict[str, str]:
        if QueueUrl in self.fail_for:
            raise RuntimeError("queue does not exist")
        self.sent.append((QueueUrl, MessageBody))
        return {"MessageId": "m"}


def live_worker(
    worker_id: str, url: str, *, expires: int = EVENT_NOW_MS + 60_000, dead_at: int | None = None
) -> WorkerRecord:
    return WorkerRecord(
        worker_id=worker_id,
        control_queue_url=url,
        started_at_ms=EVENT_NOW_MS - 3_600_000,
        heartbeat_at_ms=EVENT_NOW_MS,
        expires_at_ms=expires,
        dead_at_ms=dead_at,
    )


def make_notifier(workers: dict[str, WorkerRecord], outbox: Outbox, now: int = EVENT_NOW_MS):
    return notifier_app.StopNotifier(Workers(workers), outbox, clock=lambda: now)


# ---------------------------------------------------------------- is it a transition?
def test_the_stop_modify_sample_is_a_transition_carrying_owner_and_epoch() -> None:
    (raw,) = records("stream_stop_modify.json")
    connection = notifier_app.stopped_connection(record(raw))
    assert connection is not None
    assert (connection.pk, connection.lease_owner, connection.lease_epoch) == (
        "CONN#ticker-btc-usd",
        "worker-a",
        3,
    )


@pytest.mark.parametrize("name", ["stream_ignored_modify.json", "stream_insert.json"])
def test_checkpoints_releases_and_started_inserts_are_not_transitions(name: str) -> None:
    for raw in records(name):
        assert notifier_app.stopped_connection(record(raw)) is None


def test_an_insert_that_is_already_stopped_is_a_transition() -> None:
    (raw,) = records("stream_insert.json")
    raw = copy.deepcopy(raw)
    raw["dynamodb"]["NewImage"]["desired_state"] = {"S": "STOPPED"}
    assert notifier_app.stopped_connection(record(raw)) is not None


def test_remove_events_and_worker_items_are_not_transitions() -> None:
    (raw,) = records("stream_stop_modify.json")
    removed = copy.deepcopy(raw)
    removed["eventName"] = "REMOVE"
    removed["dynamodb"]["OldImage"] = removed["dynamodb"].pop("NewImage")
    assert notifier_app.stopped_connection(record(removed)) is None
    not_a_connection = copy.deepcopy(raw)
    not_a_connection["dynamodb"]["NewImage"]["pk"] = {"S": "WORKER#w1"}
    assert notifier_app.stopped_connection(record(not_a_connection)) is None
    no_body = {k: v for k, v in raw.items() if k != "dynamodb"}
    assert notifier_app.stopped_connection(record(no_body)) is None


# ---------------------------------------------------------------- who hears of it
def test_a_stop_goes_to_the_owners_control_queue() -> None:
    # GIVEN the owner of the stopped connection is a live worker
    outbox = Outbox()
    notifier = make_notifier({"worker-a": live_worker("worker-a", "q://worker-a")}, outbox)
    # WHEN the STOP transition is handled
    (raw,) = records("stream_stop_modify.json")
    outcome = notifier.handle(record(raw))
    # THEN exactly one STOP for that pk and epoch went to worker-a's queue
    assert outcome is Outcome.DELIVERED
    assert outbox.sent == [("q://worker-a", StopCommand("CONN#ticker-btc-usd", 3).body())]


@pytest.mark.parametrize("owner", [None, ""], ids=["absent", "empty"])
def test_nothing_is_sent_when_nobody_holds_the_lease(owner: str | None) -> None:
    # v2 items have no lease_owner while free; an empty one means the same.
    (raw,) = records("stream_stop_modify.json")
    raw = copy.deepcopy(raw)
    image = raw["dynamodb"]["NewImage"]
    del image["lease_owner"]
    if owner is not None:
        image["lease_owner"] = {"S": owner}
    outbox = Outbox()
    notifier = make_notifier({"worker-a": live_worker("worker-a", "q://a")}, outbox)
    assert notifier.handle(record(raw)) is Outcome.NO_OWNER
    assert outbox.sent == []


@pytest.mark.parametrize(
    "owner",
    [
        live_worker("worker-a", "q://a", expires=EVENT_NOW_MS - 1),  # stopped renewing
        live_worker("worker-a", "q://a", dead_at=EVENT_NOW_MS - 5),  # killed by a peer, retired
    ],
    ids=["lapsed", "dead"],
)
def test_nothing_is_sent_when_the_owners_worker_lease_is_over(owner: WorkerRecord) -> None:
    # The connection lives by its owner's worker lease: once that is over, the owner's
    # sessions are fenced and there is nobody to tell.
    (raw,) = records("stream_stop_modify.json")
    outbox = Outbox()
    assert make_notifier({"worker-a": owner}, outbox).handle(record(raw)) is Outcome.LEASE_EXPIRED
    assert outbox.sent == []


@pytest.mark.parametrize(
    "workers",
    [
        {},  # no worker item
        {"worker-a": live_worker("worker-a", "")},  # no control queue registered
        {"worker-b": live_worker("worker-b", "q://b")},  # a live worker, but not the owner
    ],
    ids=["missing", "no-queue", "another-worker"],
)
def test_nothing_is_sent_when_the_owner_has_no_worker_item_or_queue(
    workers: dict[str, WorkerRecord],
) -> None:
    (raw,) = records("stream_stop_modify.json")
    outbox = Outbox()
    assert make_notifier(workers, outbox).handle(record(raw)) is Outcome.WORKER_GONE
    assert outbox.sent == []


# ---------------------------------------------------------------- delivery_outcome (pure)
@pytest.mark.parametrize(
    ("owner_id", "worker", "expected"),
    [
        ("", None, Outcome.NO_OWNER),
        ("", live_worker("w", "q://w"), Outcome.NO_OWNER),
        ("w", None, Outcome.WORKER_GONE),
        ("w", live_worker("w", ""), Outcome.WORKER_GONE),
        ("w", live_worker("w", "", expires=EVENT_NOW_MS - 1), Outcome.WORKER_GONE),
        ("w", live_worker("w", "q://w", expires=EVENT_NOW_MS - 1), Outcome.LEASE_EXPIRED),
        ("w", live_worker("w", "q://w", dead_at=EVENT_NOW_MS), Outcome.LEASE_EXPIRED),
        ("w", live_worker("w", "q://w", expires=EVENT_NOW_MS), Outcome.DELIVERED),  # last ms
        ("w", live_worker("w", "q://w"), Outcome.DELIVERED),
    ],
)
def test_delivery_outcome(owner_id: str, worker: WorkerRecord | None, expected: Outcome) -> None:
    (raw,) = records("stream_stop_modify.json")
    connection = notifier_app.stopped_connection(record(raw))
    assert connection is not None
    connection = connection.with_changes(lease_owner=owner_id)
    assert notifier_app.delivery_outcome(connection, worker, EVENT_NOW_MS) is expected


def test_a_failed_send_raises_so_only_that_record_is_retried() -> None:
    (raw,) = records("stream_stop_modify.json")
    outbox = Outbox(fail_for={"q://a"})
    notifier = make_notifier({"worker-a": live_worker("worker-a", "q://a")}, outbox)
    with pytest.raises(RuntimeError):
        notifier.handle(record(raw))


def test_ignored_records_never_look_up_a_worker() -> None:
    class Untouchable:
        def get_worker(self, worker_id: str) -> None:
            raise AssertionError("an ignored record must not cost a read")

    notifier = notifier_app.StopNotifier(Untouchable(), Outbox(), clock=lambda: EVENT_NOW_MS)
    for raw in records("stream_ignored_modify.json") + records("stream_insert.json"):
        assert notifier.handle(record(raw)) is Outcome.IGNORED


def test_skipped_outcomes_are_the_three_nothing_to_send_cases() -> None:
    assert {o for o in Outcome if o.skipped} == {
        Outcome.NO_OWNER,
        Outcome.LEASE_EXPIRED,
        Outcome.WORKER_GONE,
    }


# ---------------------------------------------------------------- FAILED (crash-loop breaker)
def _failed_by_the_breaker(raw: dict[str, Any]) -> dict[str, Any]:
    """The worker's own mark_failed write: FAILED and released in one MODIFY."""
    raw = copy.deepcopy(raw)
    new = raw["dynamodb"]["NewImage"]
    new["desired_state"] = {"S": "FAILED"}
    new["state_shard"] = {"S": new["state_shard"]["S"].replace("STOPPED", "FAILED")}
    del new["lease_owner"]
    raw["dynamodb"]["OldImage"]["desired_state"] = {"S": "STARTED"}
    return raw


def test_a_connection_turning_failed_sends_no_stop() -> None:
    # GIVEN the worker's write that ends a connection FAILED (it released the lease itself)
    (raw,) = records("stream_stop_modify.json")
    failed = _failed_by_the_breaker(raw)
    # THEN it is not a STOP transition: the filter in template.yaml drops it, so does the code
    resources = load_template(EVENTS.parent / "template.yaml")["Resources"]
    source = resources["StreamNotifierFunction"]["Properties"]["Events"]
    (stream,) = [e["Properties"] for e in source.values() if e["Type"] == "DynamoDB"]
    (pattern,) = [json.loads(f["Pattern"]) for f in stream["FilterCriteria"]["Filters"]]
    assert not eventfilter.matches(pattern, failed)
    assert notifier_app.stopped_connection(record(failed)) is None


def test_stopping_a_failed_connection_tells_nobody() -> None:
    # GIVEN a FAILED connection (lease free) that the API now STOPs
    (raw,) = records("stream_stop_modify.json")
    stopped = _failed_by_the_breaker(raw)
    stopped["dynamodb"]["OldImage"] = copy.deepcopy(stopped["dynamodb"]["NewImage"])
    stopped["dynamodb"]["NewImage"]["desired_state"] = {"S": "STOPPED"}
    stopped["dynamodb"]["NewImage"]["state_shard"] = {
        "S": raw["dynamodb"]["NewImage"]["state_shard"]["S"]
    }
    outbox = Outbox()
    notifier = make_notifier({"worker-a": live_worker("worker-a", "q://a")}, outbox)
    # THEN it is a transition, but nobody holds the lease: nothing is sent
    assert notifier.handle(record(stopped)) is Outcome.NO_OWNER
    assert outbox.sent == []
