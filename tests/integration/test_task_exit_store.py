"""``LeaseStore.kill_exited_worker`` against both stores (the moto server and the in-memory
one), the contract of the crash-failover write: fenced by the task ARN and the container's
runtime id (or its start), never on a dead item, and followed at once by a takeover.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from lease_helpers import FakeClock, make_store, register as register_worker

from wsfleet.aws import dynamodb_client
from wsfleet.exceptions import LeaseLost, WorkerDead
from wsfleet.lease import Lease
from wsfleet.record import WorkerRecord
from wsfleet.store import DynamoDBLeaseStore, LeaseStore
from wsfleet.task_exit import ContainerStop, ExitKill

pytestmark = pytest.mark.integration

LEASE_MS = 20_000
TASK = "arn:aws:ecs:us-east-1:123456789012:task/wsfleet/0123abcd"
OTHER_TASK = "arn:aws:ecs:us-east-1:123456789012:task/wsfleet/4567ef01"
CLUSTER = "arn:aws:ecs:us-east-1:123456789012:cluster/wsfleet"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["dynamodb", "memory"])
def store(request: pytest.FixtureRequest, clock: FakeClock) -> LeaseStore:
    return make_store(request, clock, lease_ms=LEASE_MS)


def register(
    store: LeaseStore, clock: FakeClock, worker_id: str, **identity: Any
) -> WorkerRecord:
    return register_worker(store, clock, worker_id, lease_ms=LEASE_MS, **identity)


def stop(clock: FakeClock, **changes: Any) -> ContainerStop:
    base = ContainerStop(
        task_arn=TASK, cluster_arn=CLUSTER, container_name="worker", runtime_id="rt-1",
        exit_code=137, version=3, stopped_at_ms=clock.now,
    )  # fmt: skip
    return replace(base, **changes)


def test_the_exit_kills_the_incarnation_and_a_peer_takes_over_at_once(store, clock):
    # GIVEN w1 (task T, container rt-1) holding a connection, its lease far from expiry
    pk = store.start("c1", "wss://up.example/s").record.pk
    register(store, clock, "w1", task_arn=TASK, container_runtime_id="rt-1")
    register(store, clock, "w2", task_arn=OTHER_TASK, container_runtime_id="rt-9")
    old = Lease.of(store.acquire(pk, "w1"))
    clock.advance(1_000)
    # WHEN the exit of T's worker container is applied
    assert store.kill_exited_worker("w1", stop(clock)) is ExitKill.KILLED
    # THEN w1's lease is over now (dead, expired, that expiry claimed for hinting), it can
    # never renew, and w2 takes the connection without waiting for the lease
    dead = store.get_worker("w1", consistent=True)
    assert (dead.dead_at_ms, dead.expires_at_ms) == (clock.now, clock.now)
    assert (dead.hinted_expiry_ms, dead.hinted_at_ms) == (clock.now, clock.now)
    with pytest.raises(WorkerDead):
        store.renew_worker("w1", expires_at_ms=clock.now + LEASE_MS, connection_count=1)
    taken = store.acquire(pk, "w2")
    assert (taken.lease_owner, taken.lease_epoch) == ("w2", old.epoch + 1)
    with pytest.raises(LeaseLost):
        store.checkpoint(old, 5)
    # AND the same event again (at least once delivery) changes nothing
    assert store.kill_exited_worker("w1", stop(clock)) is ExitKill.ALREADY_DEAD
    assert store.get_worker("w1", consistent=True) == dead


def test_the_exit_never_kills_another_task_or_a_restarted_container(store, clock):
    register(store, clock, "other", task_arn=OTHER_TASK, container_runtime_id="rt-1")
    register(store, clock, "restarted", task_arn=TASK, container_runtime_id="rt-2")
    register(store, clock, "plain")  # outside ECS: no task
    for worker_id in ("other", "restarted", "plain"):
        assert store.kill_exited_worker(worker_id, stop(clock)) is ExitKill.NOT_THIS_CONTAINER
        assert not store.get_worker(worker_id, consistent=True).dead
    assert store.kill_exited_worker("ghost", stop(clock)) is ExitKill.GONE
    assert store.get_worker("ghost") is None  # a refused kill creates no item


def test_without_runtime_ids_the_start_time_fences(store, clock):
    # GIVEN two incarnations of task T without runtime ids, one started after the stop
    register(store, clock, "before", task_arn=TASK)
    stopped = stop(clock, runtime_id=None)
    clock.advance(1)
    register(store, clock, "after", task_arn=TASK)
    # THEN only the one that started no later than the stop is killed
    assert store.kill_exited_worker("after", stopped) is ExitKill.NOT_THIS_CONTAINER
    assert store.kill_exited_worker("before", stopped) is ExitKill.KILLED
    # AND an event carrying a runtime id still kills an item that registered none by its start
    register(store, clock, "unnamed", task_arn=TASK)
    assert store.kill_exited_worker("unnamed", stop(clock)) is ExitKill.KILLED
    # AND with neither a runtime id nor a time nothing is written
    register(store, clock, "blind", task_arn=TASK)
    blind = stop(clock, runtime_id=None, stopped_at_ms=None)
    assert store.kill_exited_worker("blind", blind) is ExitKill.NOT_THIS_CONTAINER
    assert not store.get_worker("blind", consistent=True).dead


def test_a_retired_worker_is_already_dead(store, clock):
    # GIVEN a worker that drained on SIGTERM and retired before its container stopped
    register(store, clock, "w1", task_arn=TASK, container_runtime_id="rt-1")
    store.retire_worker("w1")
    retired = store.get_worker("w1", consistent=True)
    clock.advance(5)
    # THEN the exit finds it dead and leaves the item as the retirement wrote it
    assert store.kill_exited_worker("w1", stop(clock)) is ExitKill.ALREADY_DEAD
    assert store.get_worker("w1", consistent=True) == retired


def test_the_kill_names_only_attributes_the_task_exit_role_may_write(aws, clock):
    # GIVEN a store whose requests are recorded (the IAM contract: template.yaml's list)
    from pathlib import Path

    from test_worker_iam_contract import request_attributes

    from wsfleet_local.backend import load_template

    client = dynamodb_client()
    requests: list[dict[str, Any]] = []
    client.meta.events.register(
        "provide-client-params.dynamodb.UpdateItem",
        lambda params, **_: requests.append(dict(params)),
    )
    store = DynamoDBLeaseStore(client, aws.connections_table, lease_ms=LEASE_MS, clock=clock)
    register(store, clock, "w1", task_arn=TASK, container_runtime_id="rt-1")
    # WHEN it kills, with and without a runtime id
    assert store.kill_exited_worker("w1", stop(clock)) is ExitKill.KILLED
    assert store.kill_exited_worker("w1", stop(clock, runtime_id=None)) is ExitKill.ALREADY_DEAD
    # THEN every request stays within the role's attribute list
    role = load_template(Path(__file__).resolve().parents[2] / "template.yaml")["Resources"][
        "TaskExitRole"
    ]["Properties"]
    (kill,) = [
        s for p in role["Policies"] for s in p["PolicyDocument"]["Statement"]
        if s["Sid"] == "KillExitedWorkers"
    ]  # fmt: skip
    allowed = set(kill["Condition"]["ForAllValues:StringEquals"]["dynamodb:Attributes"])
    assert len(requests) == 2
    assert all(request_attributes(r) <= allowed for r in requests)
    assert set().union(*(request_attributes(r) for r in requests)) == allowed
