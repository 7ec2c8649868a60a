"""What the lease-store tests share: a settable clock, either store, and a registered worker."""

from __future__ import annotations

from typing import Any

import pytest

from wsfleet.aws import dynamodb_client
from wsfleet.memstore import InMemoryLeaseStore
from wsfleet.record import WorkerRecord
from wsfleet.store import DynamoDBLeaseStore, LeaseStore


class FakeClock:
    """A settable wall clock in epoch ms, so expiry is tested without sleeping."""

    def __init__(self, start: int = 1_800_000_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def make_store(
    request: pytest.FixtureRequest, clock: FakeClock, *, lease_ms: int, **options: Any
) -> LeaseStore:
    """The store a ``params=["dynamodb", "memory"]`` fixture asks for: the moto server's table
    (through the ``aws`` fixture) or the in-memory store, on ``clock``."""
    if request.param == "dynamodb":
        aws = request.getfixturevalue("aws")
        return DynamoDBLeaseStore(
            dynamodb_client(), aws.connections_table, lease_ms=lease_ms, clock=clock, **options
        )
    return InMemoryLeaseStore(lease_ms=lease_ms, clock=clock, **options)


def register(
    store: LeaseStore,
    clock: FakeClock,
    worker_id: str,
    *,
    lease_ms: int,
    control_queue_url: str | None = None,
    **identity: Any,
) -> WorkerRecord:
    """Register ``worker_id`` with a lease of ``lease_ms`` from the clock's now (and a made-up
    control queue URL unless one is given); ``identity``: the task fields (``task_arn``...)."""
    worker = WorkerRecord(
        worker_id=worker_id,
        control_queue_url=control_queue_url or f"http://q/{worker_id}",
        started_at_ms=clock.now,
        heartbeat_at_ms=clock.now,
        expires_at_ms=clock.now + lease_ms,
        capacity=100,
        **identity,
    )
    store.register_worker(worker)
    return worker
