"""LeaseStore against the embedded moto server, over HTTP: every operation, every refusal.

Conditional writes are exactly what must be real here, so these tests use the real server
(through `AWS_ENDPOINT_URL`) and fault injection through botocore's own event hooks.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from botocore.exceptions import ReadTimeoutError

from wsfleet.aws import dynamodb_client
from wsfleet.exceptions import (
    ConnectionNotFound,
    ConnectionStopped,
    LeaseConflict,
    LeaseLost,
    StoreError,
)
from wsfleet.lease import Lease, is_acquirable
from wsfleet.record import DesiredState, WorkerRecord
from wsfleet.store import DynamoDBLeaseStore, LeaseStore

pytestmark = pytest.mark.integration

LEASE_MS = 2_000


class FakeClock:
    """A settable wall clock, so expiry is tested without sleeping."""

    def __init__(self, start: int = 1_800_000_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def store(aws, clock):
    return DynamoDBLeaseStore(dynamodb_client(), aws.connections_table, lease_ms=LEASE_MS, clock=clock)


def started(store: LeaseStore, cid: str = "c1") -> str:
    return store.start(cid, "wss://up.example/s").record.pk


# ------------------------------------------------------------------ start / stop
def test_start_creates_then_is_idempotent(store):
    first = store.start("c1", "wss://up.example/s")
    assert first.created and first.record.desired_state is DesiredState.STARTED
    again = store.start("c1", "wss://up.example/s")
    assert not again.created and not again.restarted
    assert again.record == store.get("CONN#c1")


def test_restart_does_not_touch_a_live_lease(store, clock):
    pk = started(store)
    held = store.acquire(pk, "w1")
    clock.advance(100)
    result = store.start("c1", "wss://up.example/s")
    current = store.get(pk)
    assert (current.lease_owner, current.lease_epoch, current.lease_expires_at_ms) == (
        "w1", held.lease_epoch, held.lease_expires_at_ms,
    )
    assert result.record == current


def test_start_after_stop_restarts_and_keeps_checkpoint_for_same_url(store):
    pk = started(store)
    lease = Lease.of(store.acquire(pk, "w1"))
    store.checkpoint(lease, 41)
    store.stop(pk)
    result = store.start("c1", "wss://up.example/s")
    assert result.restarted and result.record.desired_state is DesiredState.STARTED
    assert result.record.last_seq == 41 and result.record.stop_reason is None
    store.stop(pk)
    moved = store.start("c1", "wss://elsewhere.example/s")
    assert moved.record.last_seq == 0 and moved.record.ws_url == "wss://elsewhere.example/s"


def test_stop_is_idempotent_and_404s_unknown(store):
    pk = started(store)
    first = store.stop(pk, reason="api")
    second = store.stop(pk, reason="again")
    assert first.stopped and first.record.desired_state is DesiredState.STOPPED
    assert not second.stopped
    assert second.record.stop_reason == "api"  # the second STOP wrote nothing
    with pytest.raises(ConnectionNotFound):
        store.stop("CONN#missing")


def test_stopped_items_get_a_ttl(aws, clock):
    store = DynamoDBLeaseStore(dynamodb_client(), aws.connections_table, lease_ms=LEASE_MS, clock=clock,
                       stopped_retention_ms=86_400_000)
    pk = started(store)
    store.stop(pk)
    raw = dynamodb_client().get_item(TableName=aws.connections_table, Key={"pk": {"S": pk}})
    assert int(raw["Item"]["expires_at"]["N"]) == (clock.now + 86_400_000) // 1000
    store.start("c1", "wss://up.example/s")
    raw = dynamodb_client().get_item(TableName=aws.connections_table, Key={"pk": {"S": pk}})
    assert "expires_at" not in raw["Item"]  # restarted connections must not be reaped


# ------------------------------------------------------------------ acquire
def test_acquire_sets_owner_expiry_and_bumps_epoch(store, clock):
    pk = started(store)
    rec = store.acquire(pk, "w1")
    lease = (rec.lease_owner, rec.lease_epoch, rec.lease_expires_at_ms)
    assert lease == ("w1", 1, clock.now + LEASE_MS)


def test_acquire_refusals_carry_the_current_record(store, clock):
    pk = started(store)
    store.acquire(pk, "w1")
    with pytest.raises(LeaseConflict) as conflict:
        store.acquire(pk, "w2")
    assert conflict.value.current.lease_owner == "w1"
    store.stop(pk)
    clock.advance(LEASE_MS + 1)
    with pytest.raises(ConnectionStopped):
        store.acquire(pk, "w2")
    with pytest.raises(ConnectionNotFound):
        store.acquire("CONN#nope", "w2")


def test_expired_lease_is_taken_over_with_a_new_epoch(store, clock):
    pk = started(store)
    old = Lease.of(store.acquire(pk, "w1"))
    clock.advance(LEASE_MS + 1)
    new = store.acquire(pk, "w2")
    assert new.lease_epoch == old.epoch + 1
    # the ex-owner is fenced on every write
    with pytest.raises(LeaseLost):
        store.renew(old)
    with pytest.raises(LeaseLost):
        store.checkpoint(old, 99)
    with pytest.raises(LeaseLost):
        store.release(old)
    with pytest.raises(LeaseLost):
        store.mark_stopped(old, "upstream_closed")
    assert store.get(pk).last_seq == 0


def test_same_owner_reacquiring_fences_its_own_old_session(store, clock):
    pk = started(store)
    old = Lease.of(store.acquire(pk, "w1"))
    clock.advance(LEASE_MS + 1)
    store.acquire(pk, "w1")
    with pytest.raises(LeaseLost):
        store.checkpoint(old, 5)


def test_concurrent_acquirers_exactly_one_wins(aws):
    """32 racers, each with its own client and LeaseStore: one winner per round.

    The 100-round regression of the server itself is tests/integration/test_backend.py; this
    one checks the store's acquire (condition, epoch bump, refusal type) under the same race.
    """
    racers, rounds = 32, 30
    clients = [dynamodb_client() for _ in range(racers)]
    stores = [DynamoDBLeaseStore(c, aws.connections_table, lease_ms=60_000) for c in clients]
    pks = [stores[0].start(f"race-{i}", "wss://up.example/s").record.pk for i in range(rounds)]
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
    contested = {pk: won for pk, won in winners.items() if len(won) != 1}
    assert not contested
    for pk, (winner,) in winners.items():
        rec = stores[0].get(pk)
        assert rec.lease_owner == f"w{winner}" and rec.lease_epoch == 1


# ------------------------------------------------------------------ renew
def test_renew_extends_and_checkpoints_in_one_write(store, clock):
    pk = started(store)
    lease = Lease.of(store.acquire(pk, "w1"))
    clock.advance(500)
    renewed = store.renew(lease, last_seq=17)
    assert renewed.expires_at_ms == clock.now + LEASE_MS and renewed.epoch == lease.epoch
    rec = store.get(pk)
    assert rec.last_seq == 17 and rec.lease_expires_at_ms == renewed.expires_at_ms
    store.renew(renewed)  # without a checkpoint, last_seq stays
    assert store.get(pk).last_seq == 17


def test_renew_tells_stopped_from_lost(store, clock):
    pk = started(store)
    lease = Lease.of(store.acquire(pk, "w1"))
    store.stop(pk)
    with pytest.raises(ConnectionStopped) as stopped:
        store.renew(lease)
    assert stopped.value.current.desired_state is DesiredState.STOPPED
    # stopped, but still ours: the final checkpoint and release are allowed
    store.checkpoint(lease, 3)
    released = store.release(lease, last_seq=4)
    assert (released.lease_owner, released.lease_expires_at_ms, released.last_seq) == ("", 0, 4)
    assert released.lease_epoch == lease.epoch


def _inject(client, event: str, exc_factory):
    def handler(**_kwargs):
        raise exc_factory()

    client.meta.events.register(event, handler)


def test_ambiguous_renew_that_landed_is_accepted(aws, clock):
    """The write reached DynamoDB but the reply was lost: re-read, still ours, accept."""
    client = dynamodb_client()
    store = DynamoDBLeaseStore(client, aws.connections_table, lease_ms=LEASE_MS, clock=clock)
    pk = started(store)
    lease = Lease.of(store.acquire(pk, "w1"))
    clock.advance(700)
    _inject(client, "after-call.dynamodb.UpdateItem",
            lambda: ReadTimeoutError(endpoint_url=aws.endpoint_url))
    renewed = store.renew(lease, last_seq=9)
    assert renewed.expires_at_ms == clock.now + LEASE_MS  # the stored, new expiry
    assert store.get(pk).last_seq == 9


def test_ambiguous_renew_that_did_not_land_keeps_the_stored_expiry(aws, clock):
    client = dynamodb_client(max_attempts=2)
    store = DynamoDBLeaseStore(client, aws.connections_table, lease_ms=LEASE_MS, clock=clock)
    pk = started(store)
    lease = Lease.of(store.acquire(pk, "w1"))
    clock.advance(700)
    _inject(client, "before-send.dynamodb.UpdateItem",
            lambda: ReadTimeoutError(endpoint_url=aws.endpoint_url))
    renewed = store.renew(lease)
    assert renewed.expires_at_ms == lease.expires_at_ms  # not extended: self-fence still applies


def test_ambiguous_renew_after_takeover_is_lost(aws, clock):
    client = dynamodb_client(max_attempts=2)
    store = DynamoDBLeaseStore(client, aws.connections_table, lease_ms=LEASE_MS, clock=clock)
    other = DynamoDBLeaseStore(dynamodb_client(), aws.connections_table, lease_ms=LEASE_MS, clock=clock)
    pk = started(store)
    lease = Lease.of(store.acquire(pk, "w1"))
    clock.advance(LEASE_MS + 1)
    other.acquire(pk, "w2")
    _inject(client, "before-send.dynamodb.UpdateItem",
            lambda: ReadTimeoutError(endpoint_url=aws.endpoint_url))
    with pytest.raises(LeaseLost):
        store.renew(lease)


def test_unknown_errors_are_wrapped(aws):
    store = DynamoDBLeaseStore(dynamodb_client(), "no-such-table", lease_ms=LEASE_MS)
    with pytest.raises(StoreError) as err:
        store.get("CONN#a")
    assert err.value.__cause__ is not None


# ------------------------------------------------------------------ holder writes
def test_mark_stopped_releases_in_the_same_write(store):
    pk = started(store)
    lease = Lease.of(store.acquire(pk, "w1"))
    rec = store.mark_stopped(lease, "upstream_closed", last_seq=12)
    assert rec.desired_state is DesiredState.STOPPED and rec.stop_reason == "upstream_closed"
    assert (rec.lease_owner, rec.lease_expires_at_ms, rec.last_seq) == ("", 0, 12)


def test_record_error_is_truncated_and_fenced(store, clock):
    pk = started(store)
    lease = Lease.of(store.acquire(pk, "w1"))
    store.record_error(lease, "x" * 5000)
    assert len(store.get(pk).last_error) == 1024
    clock.advance(LEASE_MS + 1)
    store.acquire(pk, "w2")
    with pytest.raises(LeaseLost):
        store.record_error(lease, "late")


# ------------------------------------------------------------------ reads and the GSI
def test_batch_get_many_pages(store):
    pks = [started(store, f"b{i}") for i in range(130)]
    found = store.batch_get([*pks, "CONN#absent"])
    assert set(found) == set(pks)


def test_query_orphans_all_pages_and_early_window(store, clock):
    free = [started(store, f"o{i}") for i in range(7)]
    held = started(store, "held")
    store.acquire(held, "w1")
    stopped = started(store, "stopped")
    store.stop(stopped)
    orphans = list(store.query_orphans(clock.now, page_size=2))
    assert sorted(r.pk for r in orphans) == sorted(free)
    assert all(is_acquirable(r, clock.now) for r in orphans)
    soon = {r.pk for r in store.query_orphans(clock.now + LEASE_MS + 1, page_size=3)}
    assert soon == set(free) | {held}


def test_list_connections_paginates(store):
    for i in range(5):
        started(store, f"l{i}")
    seen, key = [], None
    while True:
        page = store.list_connections(DesiredState.STARTED, limit=2, start_key=key)
        seen += [r.pk for r in page.records]
        key = page.next_key
        if key is None:
            break
    assert sorted(seen) == [f"CONN#l{i}" for i in range(5)]


def test_claim_hint_once_per_expiry(store, clock):
    pk = started(store)
    rec = store.get(pk)
    assert store.claim_hint(rec, rehint_after_ms=60_000)
    assert not store.claim_hint(rec, rehint_after_ms=60_000)
    clock.advance(60_001)
    assert store.claim_hint(rec, rehint_after_ms=60_000)  # a lost hint is retried eventually
    held = store.acquire(pk, "w1")
    assert not store.claim_hint(rec, rehint_after_ms=60_000)  # the lease moved on
    # released again (expiry 0 once more) under a new epoch: a new hint is due at once
    released = store.release(Lease.of(held))
    assert released.lease_expires_at_ms == rec.lease_expires_at_ms == 0
    assert store.claim_hint(released, rehint_after_ms=60_000)


# ------------------------------------------------------------------ worker items
def test_worker_items(store, clock):
    worker = WorkerRecord(worker_id="w1", control_queue_url="http://q/w1", started_at_ms=1,
                          heartbeat_at_ms=1, expires_at_ms=clock.now + LEASE_MS)
    store.register_worker(worker)
    store.heartbeat_worker("w1", expires_at_ms=clock.now + 5_000, connection_count=3)
    got = store.get_worker("w1")
    assert got.connection_count == 3 and got.expires_at_ms == clock.now + 5_000
    assert set(store.get_workers(["w1", "w2"])) == {"w1"}
    # worker items never show up as orphans: they have no desired_state
    assert not list(store.query_orphans(clock.now * 2))
    store.deregister_worker("w1")
    assert store.get_worker("w1") is None
    with pytest.raises(StoreError):
        store.heartbeat_worker("w1", expires_at_ms=1, connection_count=0)


def test_checkpoint_never_moves_backwards(store):
    """Two writes of one holder can land out of order (a retried request, a paused process)."""
    pk = started(store)
    lease = Lease.of(store.acquire(pk, "w1"))
    store.checkpoint(lease, 31)
    store.checkpoint(lease, 30)  # the late, older write
    assert store.get(pk).last_seq == 31
    renewed = store.renew(lease, last_seq=29)  # the renewal itself still lands
    rec = store.get(pk)
    assert rec.last_seq == 31 and rec.lease_expires_at_ms == renewed.expires_at_ms
    released = store.release(renewed, last_seq=28)
    assert (released.last_seq, released.lease_owner, released.lease_expires_at_ms) == (31, "", 0)


def test_stale_checkpoint_of_a_fenced_holder_is_still_lost(store, clock):
    pk = started(store)
    old = Lease.of(store.acquire(pk, "w1"))
    store.checkpoint(old, 10)
    clock.advance(LEASE_MS + 1)
    store.acquire(pk, "w2")
    with pytest.raises(LeaseLost):
        store.renew(old, last_seq=5)
    with pytest.raises(LeaseLost):
        store.checkpoint(old, 5)


# ------------------------------------------------------------------ crash-loop breaker
def test_note_failure_counts_on_the_item_and_survives_a_hand_over(store, clock):
    # GIVEN a connection whose holder counted a failure at checkpoint 7
    pk = started(store)
    first = Lease.of(store.acquire(pk, "w1"))
    store.note_failure(first, "crashed", count=1, at_seq=7)
    store.release(first)
    # WHEN the next worker acquires it
    taken = store.acquire(pk, "w2")
    # THEN the count and the position are there for it, with the coarse error
    assert (taken.failure_count, taken.failure_seq, taken.last_error) == (1, 7, "crashed")
    # AND the ex-holder can no longer count (fenced by owner and epoch)
    with pytest.raises(LeaseLost):
        store.note_failure(first, "crashed", count=2, at_seq=7)


def test_mark_failed_releases_and_leaves_the_orphan_query(store, clock):
    # GIVEN a held connection
    pk = started(store)
    lease = Lease.of(store.acquire(pk, "w1"))
    reason = "closed_by_worker (code 1009: message too big)"
    # WHEN the breaker trips
    record = store.mark_failed(lease, reason, count=5, at_seq=3, last_seq=3)
    # THEN it is FAILED, free, with the reason in stop_reason and last_error, and no TTL
    assert record.desired_state is DesiredState.FAILED
    assert (record.lease_owner, record.lease_expires_at_ms, record.last_seq) == ("", 0, 3)
    assert (record.stop_reason, record.last_error) == (reason, reason)
    assert (record.failure_count, record.failure_seq) == (5, 3)
    assert "expires_at" not in store._call("get_item", Key={"pk": {"S": pk}})["Item"]
    # AND no worker may take it, the reconciler does not see it, the listing does
    assert not is_acquirable(record, clock() + LEASE_MS)
    with pytest.raises(LeaseConflict):
        store.acquire(pk, "w2")
    assert pk not in [r.pk for r in store.query_orphans(clock() + 10 * LEASE_MS)]
    assert [r.pk for r in store.list_connections(DesiredState.FAILED).records] == [pk]


def test_start_restarts_a_failed_connection_and_resets_the_breaker(store, clock):
    # GIVEN a FAILED connection
    pk = started(store)
    lease = Lease.of(store.acquire(pk, "w1"))
    store.mark_failed(lease, "crashed", count=5, at_seq=3, last_seq=3)
    # WHEN it is STARTed again with the same URL
    result = store.start("c1", "wss://up.example/s")
    # THEN it runs again from its checkpoint, with the breaker count and the reasons cleared
    assert result.restarted and result.record.desired_state is DesiredState.STARTED
    assert (result.record.failure_count, result.record.failure_seq) == (0, None)
    assert (result.record.stop_reason, result.record.last_error) == (None, None)
    assert result.record.last_seq == 3
    assert store.acquire(pk, "w2").lease_owner == "w2"
