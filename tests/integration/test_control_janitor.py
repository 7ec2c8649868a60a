"""wsfleet.control_janitor against the embedded moto server: leftover control queues go once
past the grace, and the work per sweep is capped.

A dead worker whose connections are still being taken over is the reconciler's pass as a
whole (tests/integration/test_reconciler.py); here the janitor runs on its own. Clocks are set,
never waited for: the store's starts at the real now, so SQS queue ages stay comparable.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from lease_helpers import FakeClock, register

from wsfleet.aws import dynamodb_client, sqs_client
from wsfleet.clock import now_ms
from wsfleet.control import WORKER_ID_TAG, control_queue_name
from wsfleet.control_janitor import ControlQueueJanitor
from wsfleet.reconcile import dead_worker_grace_ms
from wsfleet.record import WorkerRecord
from wsfleet.store import DynamoDBLeaseStore

pytestmark = pytest.mark.integration

LEASE_MS = 10_000
GRACE_MS = dead_worker_grace_ms(LEASE_MS)


@dataclass
class Queues:
    """A control-queue prefix of the test's own, the store and SQS client, and a set clock."""

    prefix: str
    clock: FakeClock
    store: DynamoDBLeaseStore
    sqs: Any

    def names(self) -> list[str]:
        urls = self.sqs.list_queues(QueueNamePrefix=self.prefix).get("QueueUrls", [])
        return sorted(u.rsplit("/", 1)[-1] for u in urls)

    def register(self, worker_id: str, *, lease_ms: int) -> WorkerRecord:
        """A worker item with a control queue, created and tagged the way the worker does."""
        url = self.sqs.create_queue(
            QueueName=control_queue_name(self.prefix, worker_id), tags={WORKER_ID_TAG: worker_id}
        )["QueueUrl"]
        return register(self.store, self.clock, worker_id, lease_ms=lease_ms, control_queue_url=url)

    def janitor(self, clock: Any, **bounds: int) -> ControlQueueJanitor:
        return ControlQueueJanitor(
            self.sqs, self.store, prefix=self.prefix, grace_ms=GRACE_MS, clock=clock, **bounds
        )


@pytest.fixture
def queues(aws: Any) -> Iterator[Queues]:
    clock = FakeClock(start=now_ms())
    store = DynamoDBLeaseStore(
        dynamodb_client(), aws.connections_table, lease_ms=LEASE_MS, clock=clock
    )
    rig = Queues(f"j{uuid.uuid4().hex[:8]}-ctl-", clock, store, sqs_client())
    yield rig
    for url in rig.sqs.list_queues(QueueNamePrefix=rig.prefix).get("QueueUrls", []):
        rig.sqs.delete_queue(QueueUrl=url)


def test_leftover_queues_without_a_worker_item_go_once_past_the_grace(queues: Queues) -> None:
    # GIVEN a queue nobody registered (tagged) and an untagged one, both created just now
    queues.sqs.create_queue(
        QueueName=control_queue_name(queues.prefix, "never-registered"),
        tags={WORKER_ID_TAG: "never-registered"},
    )
    queues.sqs.create_queue(QueueName=control_queue_name(queues.prefix, "untagged"))
    live = queues.register("live", lease_ms=3_600_000)

    # WHEN a janitor looks now, nothing is old enough to be a leftover
    assert queues.janitor(now_ms).sweep().queues_deleted == 0

    # WHEN one looks after the grace period (a clock set ahead stands in for waiting)
    later = now_ms() + GRACE_MS + 1_000
    report = queues.janitor(lambda: later).sweep()

    # THEN both leftovers are deleted; the live worker (whose item is valid for an hour) is not
    assert (report.queues_seen, report.queues_deleted, report.workers_deleted) == (3, 2, 0)
    assert queues.names() == [live.control_queue_url.rsplit("/", 1)[-1]]


def test_cleanup_work_per_sweep_is_capped(queues: Queues) -> None:
    # GIVEN five dead workers that own nothing and a janitor allowed two deletions per sweep
    for i in range(5):
        queues.register(f"dead-{i}", lease_ms=LEASE_MS)
    queues.clock.advance(LEASE_MS + GRACE_MS + 1)
    janitor = queues.janitor(queues.clock, max_lookups=4, max_deletions=2)

    # WHEN sweeps run, THEN each removes at most two and together they remove all five
    deleted = [janitor.sweep().workers_deleted for _ in range(4)]
    assert deleted == [2, 2, 1, 0]
    assert queues.names() == []
