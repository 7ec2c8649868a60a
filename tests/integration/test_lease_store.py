"""DynamoDBLeaseStore against the embedded moto server: what only a real server shows.

The scenarios every store must pass are in test_lease_store_contract.py (run against this
store and the in-memory one). Here: real concurrency (a hundred peers taking over one dead
worker's connections at once, a paused worker whose renewal lands after it was killed),
ambiguous failures injected through botocore's own event hooks, a backend that ignores
``ReturnValuesOnConditionCheckFailure`` (dynalite), and the wrapping of unknown errors.
"""

from __future__ import annotations

import collections
import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError
from lease_helpers import FakeClock, register as register_worker

from wsfleet.aws import dynamodb_client
from wsfleet.exceptions import (
    ConnectionStopped,
    LeaseConflict,
    LeaseLost,
    StoreError,
    WorkerDead,
)
from wsfleet.lease import Lease
from wsfleet.record import DesiredState, WorkerRecord
from wsfleet.store import DynamoDBLeaseStore, LeaseStore

pytestmark = pytest.mark.integration

LEASE_MS = 2_000
URL = "wss://up.example/s"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_store(aws, clock, client=None) -> DynamoDBLeaseStore:
    return DynamoDBLeaseStore(
        client or dynamodb_client(), aws.connections_table, lease_ms=LEASE_MS, clock=clock
    )


@pytest.fixture
def store(aws, clock) -> DynamoDBLeaseStore:
    return make_store(aws, clock)


def started(store: LeaseStore, cid: str = "c1") -> str:
    return store.start(cid, URL).record.pk


def register(store: LeaseStore, clock: FakeClock, worker_id: str) -> WorkerRecord:
    return register_worker(store, clock, worker_id, lease_ms=LEASE_MS)


def inject_once(client: Any, event: str, exc_factory, when=lambda **_kw: True) -> list[int]:
    """Raise ``exc_factory()`` from the first ``event`` hook call that ``when`` accepts; the
    returned list counts how often it fired (so a test can tell the fault really happened)."""
    fired: list[int] = []
    lock = threading.Lock()

    def handler(**kwargs: Any) -> None:
        with lock:
            if fired or not when(**kwargs):
                return
            fired.append(1)
        raise exc_factory()

    client.meta.events.register(event, handler)
    return fired


def timeout(aws):
    return lambda: ReadTimeoutError(endpoint_url=aws.endpoint_url)


def is_take_write(parsed: dict[str, Any] | None = None, **_kw: Any) -> bool:
    """An UpdateItem answer of a take (ALL_NEW with an owner): not the kill of the owner."""
    return bool((parsed or {}).get("Attributes", {}).get("lease_owner"))


# ------------------------------------------------------------------ real concurrency
def count_successful_kills(client: Any) -> list[int]:
    """Count kill_worker writes the server accepted, by request (botocore event hooks)."""
    kills: list[int] = []

    def mark(params: dict[str, Any], context: dict[str, Any], **_kw: Any) -> None:
        context["kill"] = params.get("UpdateExpression") == "SET dead_at_ms = :now"

    def count(parsed: dict[str, Any], context: dict[str, Any], **_kw: Any) -> None:
        if context.get("kill") and "Error" not in parsed:
            kills.append(1)

    client.meta.events.register("before-parameter-build.dynamodb.UpdateItem", mark)
    client.meta.events.register("after-call.dynamodb.UpdateItem", count)
    return kills


def test_a_hundred_peers_take_over_a_dead_workers_connections_once_each(aws, clock):
    # GIVEN a worker holding 100 connections whose lease expired, and 100 live peers
    client = dynamodb_client(max_pool_connections=100)
    store = make_store(aws, clock, client)
    register(store, clock, "dead")
    pks = [started(store, f"d{i:03d}") for i in range(100)]
    for pk in pks:
        store.acquire(pk, "dead")
    clock.advance(LEASE_MS + 1)
    peers = [f"p{i:03d}" for i in range(100)]
    for peer in peers:
        register(store, clock, peer)
    kills = count_successful_kills(client)
    barrier = threading.Barrier(len(peers))

    # WHEN every peer, at once, tries three of them (each connection contended by three)
    def take(index: int) -> list[str]:
        barrier.wait()
        won = []
        for pk in (pks[(index + k) % len(pks)] for k in range(3)):
            try:
                store.acquire(pk, peers[index])
                won.append(pk)
            except LeaseConflict as conflict:
                assert conflict.current.lease_owner in peers
        return won

    with ThreadPoolExecutor(len(peers)) as pool:
        results = list(pool.map(take, range(len(peers))))

    # THEN every connection was taken exactly once, under the next epoch
    winners = collections.defaultdict(list)
    for index, won in enumerate(results):
        for pk in won:
            winners[pk].append(peers[index])
    assert {pk: len(names) for pk, names in winners.items()} == dict.fromkeys(pks, 1)
    records = store.batch_get(pks, consistent=True)
    assert {pk: (r.lease_owner, r.lease_epoch) for pk, r in records.items()} == {
        pk: (names[0], 2) for pk, names in winners.items()
    }
    # AND the dead worker was killed by exactly one of them, and owns nothing
    assert kills == [1]
    assert store.get_worker("dead", consistent=True).dead
    assert not list(store.owned_by("dead"))
    assert sum(len(list(store.owned_by(peer))) for peer in peers) == len(pks)


def test_concurrent_acquirers_of_a_free_connection_exactly_one_wins(aws, clock):
    """32 live racers, each with its own client: one winner per round, epoch 1."""
    racers, rounds = 32, 20
    stores = [make_store(aws, clock) for _ in range(racers)]
    for index in range(racers):
        register(stores[0], clock, f"w{index}")  # alive: a winner is never taken over
    pks = [started(stores[0], f"race-{i}") for i in range(rounds)]
    barrier = threading.Barrier(racers)

    def race(index: int) -> list[str]:
        won = []
        for pk in pks:
            barrier.wait()
            try:
                stores[index].acquire(pk, f"w{index}")
                won.append(pk)
            except LeaseConflict:
                pass
        return won

    with ThreadPoolExecutor(racers) as pool:
        results = list(pool.map(race, range(racers)))
    winners = {pk: [i for i, won in enumerate(results) if pk in won] for pk in pks}
    assert all(len(won) == 1 for won in winners.values()), winners
    for pk, (winner,) in winners.items():
        rec = stores[0].get(pk)
        assert (rec.lease_owner, rec.lease_epoch) == (f"w{winner}", 1)


def test_a_paused_worker_whose_renewal_lands_after_the_kill_is_dead(aws, clock):
    # GIVEN w1 holding a connection; its next renewal is sent, then held up on the way
    # (a GC pause, a stalled network) until after its lease expired
    w1_client = dynamodb_client(max_attempts=0)
    w1 = make_store(aws, clock, w1_client)
    w2 = make_store(aws, clock)
    registered = register(w1, clock, "w1")
    pk = started(w1)
    lease = Lease.of(w1.acquire(pk, "w1"))
    release_renewal = threading.Event()
    in_flight = threading.Event()

    def hold(request: Any, **_kw: Any) -> None:
        body = request.body or b""
        if b"heartbeat_at_ms" in (body.encode() if isinstance(body, str) else body):
            in_flight.set()
            assert release_renewal.wait(30)

    w1_client.meta.events.register("before-send.dynamodb.UpdateItem", hold)
    with ThreadPoolExecutor(1) as pool:
        renewal = pool.submit(
            w1.renew_worker, "w1", expires_at_ms=clock.now + 10 * LEASE_MS, connection_count=1
        )
        assert in_flight.wait(30)
        # WHEN a peer finds the lease expired and takes the connection over
        clock.advance(LEASE_MS + 1)
        taken = w2.acquire(pk, "w2")
        release_renewal.set()
        # THEN the renewal that lands afterwards is refused: that incarnation is over
        with pytest.raises(WorkerDead):
            renewal.result(30)
    assert taken.lease_epoch == lease.epoch + 1
    dead = w2.get_worker("w1", consistent=True)
    assert dead.dead and dead.expires_at_ms == registered.expires_at_ms  # not extended
    with pytest.raises(LeaseLost):
        w1.checkpoint(lease, 5)


# ------------------------------------------------------------------ ambiguous failures
def test_an_ambiguous_acquire_that_landed_gives_the_connection_under_a_new_epoch(aws, clock):
    # GIVEN a free connection, and an acquire whose write lands but whose answer is lost
    client = dynamodb_client()
    store = make_store(aws, clock, client)
    pk = started(store)
    fired = inject_once(client, "after-call.dynamodb.UpdateItem", timeout(aws), is_take_write)
    # WHEN it is acquired
    record = store.acquire(pk, "w1")
    # THEN the caller holds it, under an epoch past the one its lost answer carried
    assert fired == [1]
    assert (record.lease_owner, record.lease_epoch) == ("w1", 2)
    assert store.get(pk) == record
    store.checkpoint(Lease.of(record), 3)
    with pytest.raises(LeaseLost):
        store.checkpoint(Lease(pk, "w1", 1), 4)  # whatever the lost attempt started is fenced


def test_an_ambiguous_takeover_that_landed_gives_the_connection_under_a_new_epoch(aws, clock):
    # GIVEN a connection of an expired worker, and a takeover whose answer is lost
    client = dynamodb_client()
    store = make_store(aws, clock, client)
    register(store, clock, "w1")
    pk = started(store)
    store.acquire(pk, "w1")
    clock.advance(LEASE_MS + 1)
    fired = inject_once(client, "after-call.dynamodb.UpdateItem", timeout(aws), is_take_write)
    # WHEN w2 takes it over
    record = store.acquire(pk, "w2")
    # THEN w2 holds it (epoch 1 of w1, 2 of the lost answer, 3 now) and w1 is dead
    assert fired == [1]
    assert (record.lease_owner, record.lease_epoch) == ("w2", 3)
    assert store.get(pk) == record
    assert store.get_worker("w1", consistent=True).dead


def test_an_ambiguous_acquire_that_did_not_land_fails_and_leaves_it_free(aws, clock):
    client = dynamodb_client(max_attempts=0)  # botocore's retries, not counting the first
    store = make_store(aws, clock, client)
    pk = started(store)
    fired = inject_once(client, "before-send.dynamodb.UpdateItem", timeout(aws))
    with pytest.raises(StoreError) as failed:
        store.acquire(pk, "w1")
    assert fired == [1] and isinstance(failed.value.__cause__, ReadTimeoutError)
    assert store.get(pk).lease_owner == ""
    assert store.acquire(pk, "w1").lease_epoch == 1


def test_an_ambiguous_failure_botocore_retried_is_invisible(aws, clock):
    client = dynamodb_client(max_attempts=1)
    store = make_store(aws, clock, client)
    pk = started(store)
    fired = inject_once(client, "before-send.dynamodb.UpdateItem", timeout(aws))
    record = store.acquire(pk, "w1")
    assert fired == [1] and (record.lease_owner, record.lease_epoch) == ("w1", 1)


def test_unknown_errors_are_wrapped(aws):
    store = DynamoDBLeaseStore(dynamodb_client(), "no-such-table", lease_ms=LEASE_MS)
    with pytest.raises(StoreError) as err:
        store.get("CONN#a")
    assert isinstance(err.value.__cause__, ClientError)


# ------------------------------------------------------------------ refusals without ALL_OLD
class WithoutAllOld:
    """A DynamoDB client whose refusals come without the item, as from dynalite (which
    ignores ``ReturnValuesOnConditionCheckFailure``): the store must read it back instead."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.refusals = itertools.count()  # conditional writes refused, each seen without Item

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        if name in ("meta", "get_paginator", "exceptions"):
            return method

        def call(**kwargs: Any) -> Any:
            try:
                return method(**kwargs)
            except ClientError as exc:
                exc.response.pop("Item", None)  # moto sends it; dynalite never does
                if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                    next(self.refusals)
                raise

        return call


def test_refusals_without_the_old_item_are_still_classified(aws, clock):
    client = WithoutAllOld(dynamodb_client())
    store = make_store(aws, clock, client)
    register(store, clock, "w1")
    register(store, clock, "w2")
    pk = started(store)
    # start of an existing connection: the current record, read back
    assert store.start("c1", URL).record == store.get(pk)
    lease = Lease.of(store.acquire(pk, "w1"))
    # a live owner: LeaseConflict with the current record
    with pytest.raises(LeaseConflict) as conflict:
        store.acquire(pk, "w2", max_wait_ms=0)
    assert conflict.value.current.lease_owner == "w1"
    # STOP: the holder's checkpoint is told it stopped, not that it lost the lease
    store.stop(pk)
    assert not store.stop(pk).stopped
    with pytest.raises(ConnectionStopped) as stopped:
        store.checkpoint(lease, 5)
    assert stopped.value.current.desired_state is DesiredState.STOPPED
    store.release(lease, stopped=True)
    # a takeover: the kill of an alive worker is refused (False), of an expired one not
    store.start("c1", URL)
    old = Lease.of(store.acquire(pk, "w1"))
    assert not store.kill_worker("w1")
    clock.advance(LEASE_MS + 1)
    store.renew_worker("w2", expires_at_ms=clock.now + LEASE_MS, connection_count=0)
    assert store.acquire(pk, "w2").lease_epoch == old.epoch + 1
    assert store.kill_worker("w1")  # dead already
    with pytest.raises(LeaseLost) as lost:
        store.checkpoint(old, 9)
    assert lost.value.current.lease_owner == "w2"
    # the stale checkpoint rule needs the current record too
    taken = Lease.of(store.get(pk))
    store.checkpoint(taken, 10)
    store.checkpoint(taken, 8)
    assert store.get(pk).last_seq == 10
    assert next(client.refusals) > 5  # every one of them classified without the old item


def test_batch_get_over_the_hundred_key_limit(store):
    pks = [started(store, f"b{i}") for i in range(130)]
    found = store.batch_get([*pks, "CONN#absent"])
    assert set(found) == set(pks)
