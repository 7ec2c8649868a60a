"""What the lease-store tests share: a settable clock, either store, and a registered worker."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import pytest

from bench.dynalite import create_table_request
from wsfleet.aws import dynamodb_client
from wsfleet.memstore import InMemoryLeaseStore
from wsfleet.record import WorkerRecord
from wsfleet.store import DynamoDBLeaseStore, LeaseStore
from wsfleet_local.backend import local_client

#: The stores every contract scenario runs against: DynamoDB on the embedded moto server and on
#: dynalite (a second, independent implementation), and the in-memory store.
STORES = ["dynamodb", "dynalite", "memory"]


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
    """The store a ``params=STORES`` fixture asks for, on ``clock``: the moto server's table
    (through the ``aws`` fixture), a table of the same shape on dynalite (the
    ``dynalite_server`` fixture; skipped without dynalite, failed in CI), or the in-memory
    store."""
    if request.param == "dynamodb":
        aws = request.getfixturevalue("aws")
        return DynamoDBLeaseStore(
            dynamodb_client(), aws.connections_table, lease_ms=lease_ms, clock=clock, **options
        )
    if request.param == "dynalite":
        server = request.getfixturevalue("dynalite_server")
        client = server.client()
        return DynamoDBLeaseStore(
            client, dynalite_table(request, client), lease_ms=lease_ms, clock=clock, **options
        )
    return InMemoryLeaseStore(lease_ms=lease_ms, clock=clock, **options)


_shape: dict[str, Any] = {}
_tables = itertools.count(1)


def dynalite_table(request: pytest.FixtureRequest, client: Any) -> str:
    """A fresh connections table on dynalite, shaped as template.yaml makes it: the shape is
    read once from the embedded backend (the ``backend`` fixture), then copied per test."""
    if not _shape:
        resources = request.getfixturevalue("backend").create_resources("dynalite-shape")
        source = local_client("dynamodb", resources.endpoint_url, resources.region)
        table = source.describe_table(TableName=resources.connections_table)["Table"]
        _shape.update(create_table_request(table))
    name = f"connections-{next(_tables)}-{uuid.uuid4().hex[:6]}"
    client.create_table(**{**_shape, "TableName": name})
    client.get_waiter("table_exists").wait(
        TableName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 100}
    )
    return name


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
