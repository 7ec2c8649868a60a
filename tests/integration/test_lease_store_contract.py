"""One set of lease-store scenarios, run against every store: the DynamoDB one on the embedded
moto server and on dynalite (a second DynamoDB implementation; skipped when it is not
installed, a failure in CI), and :class:`wsfleet.memstore.InMemoryLeaseStore`.

The in-memory store stands in for DynamoDB in the unit tests of the session and the worker,
so it must behave exactly like the real one: same conditions, same refusals, same index
contents after every transition. A settable clock replaces waiting for leases to lapse: both
stores take ``now`` from it (the DynamoDB store sends it in its condition values).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import pytest
from lease_helpers import STORES, FakeClock, make_store, register as register_worker

import bench.dynalite_plugin
from wsfleet.exceptions import (
    ConnectionNotFound,
    ConnectionStopped,
    LeaseConflict,
    LeaseLost,
    StoreError,
    WorkerDead,
)
from wsfleet.lease import Lease
from wsfleet.memstore import InMemoryLeaseStore
from wsfleet.rebalance import FLEET_VIEW_PK, FleetView, Move
from wsfleet.record import INDEX_SHARDS, DesiredState, WorkerRecord, index_shard
from wsfleet.store import DynamoDBLeaseStore, IndexEntry, LeaseStore
from wsfleet.upstream_options import (
    DEFAULT_OPTIONS,
    ResumeMode,
    UpstreamOptions,
    parse_upstream_options,
)

pytestmark = pytest.mark.integration

#: One dynalite server for the session (bench/dynalite_plugin.py): skips without dynalite.
dynalite_server = bench.dynalite_plugin.dynalite_server

LEASE_MS = 2_000
URL = "wss://up.example/s"
FAR = 10**15  # "before" bound that includes every unowned_since_ms


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, clock: FakeClock) -> LeaseStore:
    return make_store(request, clock, lease_ms=LEASE_MS)


@pytest.fixture(params=STORES)
def ttl_store(request: pytest.FixtureRequest, clock: FakeClock) -> LeaseStore:
    return make_store(request, clock, lease_ms=LEASE_MS, stopped_retention_ms=86_400_000)


def raw_item(store: LeaseStore, pk: str) -> dict[str, Any]:
    """The stored attributes, including those ConnectionRecord does not carry (TTL, claims)."""
    if isinstance(store, InMemoryLeaseStore):
        return store._read(pk) or {}
    assert isinstance(store, DynamoDBLeaseStore)
    from wsfleet.store import _load

    response = store._call("get_item", Key={"pk": {"S": pk}}, ConsistentRead=True)
    return _load(response.get("Item")) or {}


def started(store: LeaseStore, cid: str = "c1") -> str:
    return store.start(cid, URL).record.pk


def register(store: LeaseStore, clock: FakeClock, worker_id: str) -> WorkerRecord:
    return register_worker(store, clock, worker_id, lease_ms=LEASE_MS)


def listing(store: LeaseStore, state: DesiredState, limit: int = 2) -> list[str]:
    """Every pk list_connections shows for ``state``, page by page (each page within limit)."""
    seen: list[str] = []
    key = None
    for _ in range(1000):
        page = store.list_connections(state, limit=limit, start_key=key)
        assert len(page.records) <= limit
        assert all(r.desired_state is state for r in page.records)
        seen += [r.pk for r in page.records]
        key = page.next_key
        if key is None:
            break
    assert len(seen) == len(set(seen)), f"a page repeated a connection: {seen}"
    return sorted(seen)


def all_unowned(store: LeaseStore, before_ms: int = FAR) -> list[IndexEntry]:
    entries = [e for shard in range(INDEX_SHARDS) for e in store.unowned(shard, before_ms)]
    for shard in range(INDEX_SHARDS):
        assert all(index_shard(e.pk) == shard for e in store.unowned(shard, before_ms))
    return sorted(entries, key=lambda e: e.pk)


def indexes(store: LeaseStore, owners: Iterable[str] = ("w1", "w2")) -> dict[str, Any]:
    """What every index view shows now."""
    return {
        "owned": {
            owner: sorted((e.pk, e.epoch, e.desired_state) for e in store.owned_by(owner))
            for owner in owners
        },
        "unowned": [e.pk for e in all_unowned(store)],
        **{state.value: listing(store, state) for state in DesiredState},
    }


def expected(
    owned: dict[str, list[tuple[str, int, DesiredState]]] | None = None,
    unowned: Iterable[str] = (),
    **states: Iterable[str],
) -> dict[str, Any]:
    return {
        "owned": {"w1": [], "w2": [], **(owned or {})},
        "unowned": sorted(unowned),
        **{state.value: sorted(states.get(state.value, ())) for state in DesiredState},
    }


STARTED, STOPPED, FAILED = DesiredState.STARTED, DesiredState.STOPPED, DesiredState.FAILED


# ------------------------------------------------------------------ start / restart / stop
def test_start_creates_a_free_connection_then_is_idempotent(store, clock):
    first = store.start("c1", URL)
    assert first.created and not first.restarted
    assert first.record.desired_state is STARTED and first.record.lease_owner == ""
    assert first.record.unowned_since_ms == clock.now
    clock.advance(10)
    again = store.start("c1", URL)
    assert not again.created and not again.restarted
    assert again.record == store.get("CONN#c1") == first.record
    assert indexes(store) == expected(unowned=["CONN#c1"], STARTED=["CONN#c1"])
    (entry,) = all_unowned(store)
    assert entry == IndexEntry("CONN#c1", 0, STARTED, first.record.unowned_since_ms)


def test_start_leaves_a_live_lease_alone(store, clock):
    pk = started(store)
    register(store, clock, "w1")
    held = store.acquire(pk, "w1")
    clock.advance(100)
    result = store.start("c1", URL)
    assert not result.restarted and result.record == store.get(pk)
    assert (result.record.lease_owner, result.record.lease_epoch) == ("w1", held.lease_epoch)


def test_stop_is_idempotent_and_unknown_is_not_found(store):
    pk = started(store)
    first = store.stop(pk, reason="api")
    second = store.stop(pk, reason="again")
    assert first.stopped and first.record.desired_state is STOPPED
    assert not second.stopped and second.record.stop_reason == "api"  # wrote nothing
    assert indexes(store) == expected(STOPPED=[pk])  # out of gsi_unowned
    with pytest.raises(ConnectionNotFound):
        store.stop("CONN#missing")


def stopped_at_checkpoint(store, clock, seq: int) -> str:
    """A connection streamed up to ``seq`` by w1, released, then STOPPED; its pk."""
    pk = started(store)
    register(store, clock, "w1")
    lease = Lease.of(store.acquire(pk, "w1"))
    store.checkpoint(lease, seq)
    store.release(lease)
    store.stop(pk)
    return pk


def test_restart_keeps_the_checkpoint_for_the_same_url_only(store, clock):
    pk = stopped_at_checkpoint(store, clock, 41)
    clock.advance(5)
    result = store.start("c1", URL)
    assert result.restarted and result.record.desired_state is STARTED
    assert (result.record.last_seq, result.record.stop_reason) == (41, None)
    assert result.record.unowned_since_ms == clock.now
    assert indexes(store) == expected(unowned=[pk], STARTED=[pk])
    store.stop(pk)
    moved = store.start("c1", "wss://elsewhere.example/s")
    assert (moved.record.last_seq, moved.record.ws_url) == (0, "wss://elsewhere.example/s")


def test_start_stores_the_upstream_options_and_a_restart_replaces_them(store, clock):
    options = UpstreamOptions(
        headers=(("X-Client", "acme"),), seq_pointer="/meta/seq", resume=ResumeMode.NONE
    )
    pk = stopped_at_checkpoint(store, clock, 41)
    restarted = store.start("c1", URL, upstream=options)
    assert restarted.restarted and store.get(pk).upstream == options
    assert restarted.record.last_seq == 0  # another seq pointer: another numbering
    store.stop(pk)
    assert store.start("c1", URL).record.upstream == DEFAULT_OPTIONS
    assert "upstream" not in store.get(pk).to_item()
    created = store.start("c2", URL, upstream=options)
    assert created.created and store.get(created.record.pk).upstream == options


def test_restart_while_the_stopped_session_still_owns_it(store, clock):
    # GIVEN a STOPPED connection whose session has not released it yet
    pk = started(store)
    register(store, clock, "w1")
    lease = Lease.of(store.acquire(pk, "w1"))
    store.stop(pk)
    assert indexes(store) == expected(owned={"w1": [(pk, 1, STOPPED)]}, STOPPED=[pk])
    # WHEN it is STARTed again
    result = store.start("c1", URL)
    # THEN it is STARTED, still owned (not in gsi_unowned) until that session lets go
    assert result.restarted and result.record.lease_owner == "w1"
    assert indexes(store) == expected(owned={"w1": [(pk, 1, STARTED)]}, STARTED=[pk])
    clock.advance(7)
    store.release(lease)
    assert indexes(store) == expected(unowned=[pk], STARTED=[pk])
    assert store.get(pk).unowned_since_ms == clock.now


@pytest.mark.parametrize("how", ["expired", "killed", "deleted"])
def test_restart_drops_an_owner_whose_lease_is_over(store, clock, how):
    # GIVEN a STOPPED connection still owned by a worker that will never release it
    pk = started(store)
    register(store, clock, "w1")
    lease = Lease.of(store.acquire(pk, "w1"))
    store.stop(pk)
    clock.advance(LEASE_MS + 1)
    if how == "killed":
        assert store.kill_worker("w1")
    elif how == "deleted":
        assert store.delete_worker("w1", dead_before_ms=clock.now)
    # WHEN it is STARTed again
    result = store.start("c1", URL)
    # THEN the owner is gone, the connection is free and findable in gsi_unowned, the old
    # owner is dead for good and its late writes are fenced
    assert result.restarted and result.record.lease_owner == ""
    assert indexes(store) == expected(unowned=[pk], STARTED=[pk])
    worker = store.get_worker("w1", consistent=True)
    assert worker is None or worker.dead
    with pytest.raises(WorkerDead):
        store.renew_worker("w1", expires_at_ms=clock.now + LEASE_MS, connection_count=0)
    with pytest.raises(LeaseLost):
        store.release(lease)
    assert store.acquire(pk, "w2").lease_epoch == 2


def test_stopped_items_get_a_ttl_and_restarted_ones_lose_it(ttl_store, clock):
    store = ttl_store
    pk = started(store)
    store.stop(pk)
    assert int(raw_item(store, pk)["expires_at"]) == (clock.now + 86_400_000) // 1000
    store.start("c1", URL)
    assert "expires_at" not in raw_item(store, pk)  # restarted connections must not be reaped
    register(store, clock, "w1")
    lease = Lease.of(store.acquire(pk, "w1"))
    store.mark_stopped(lease, "upstream_closed")
    assert int(raw_item(store, pk)["expires_at"]) == (clock.now + 86_400_000) // 1000
    other = started(store, "c2")
    failed = Lease.of(store.acquire(other, "w1"))
    store.mark_failed(failed, "crashed", count=3, at_seq=0)
    assert "expires_at" not in raw_item(store, other)  # an operator must find it


def test_without_retention_stopped_items_are_kept(store):
    pk = started(store)
    store.stop(pk)
    assert "expires_at" not in raw_item(store, pk)


# ------------------------------------------------------------------ acquire
def test_acquire_a_free_connection(store, clock):
    pk = started(store)
    register(store, clock, "w1")
    rec = store.acquire(pk, "w1")
    assert (rec.lease_owner, rec.lease_epoch, rec.unowned_since_ms) == ("w1", 1, None)
    assert rec == store.get(pk)
    assert indexes(store) == expected(owned={"w1": [(pk, 1, STARTED)]}, STARTED=[pk])


def test_acquire_refusals(store, clock):
    pk = started(store)
    stopped = started(store, "c2")
    store.stop(stopped)
    with pytest.raises(ConnectionStopped) as refused:
        store.acquire(stopped, "w1")
    assert refused.value.current.desired_state is STOPPED
    with pytest.raises(ConnectionNotFound):
        store.acquire("CONN#nope", "w1")
    assert store.get(pk).lease_owner == ""


def test_takeover_of_an_expired_worker_kills_it_and_fences_it(store, clock):
    # GIVEN w1 holding a connection, then missing its renewals
    pk = started(store)
    register(store, clock, "w1")
    register(store, clock, "w2")
    old = Lease.of(store.acquire(pk, "w1"))
    store.checkpoint(old, 10)
    clock.advance(LEASE_MS + 1)
    # WHEN w2 acquires it
    new = store.acquire(pk, "w2")
    # THEN w2 holds it under the next epoch, and w1 is dead for good
    assert (new.lease_owner, new.lease_epoch, new.last_seq) == ("w2", old.epoch + 1, 10)
    assert store.get_worker("w1", consistent=True).dead_at_ms == clock.now
    assert indexes(store) == expected(owned={"w2": [(pk, 2, STARTED)]}, STARTED=[pk])
    with pytest.raises(WorkerDead):
        store.renew_worker("w1", expires_at_ms=clock.now + LEASE_MS, connection_count=1)
    # AND every write of w1's session is fenced
    for write in (
        lambda: store.checkpoint(old, 99),
        lambda: store.release(old, last_seq=99),
        lambda: store.release(old, stopped=True),
        lambda: store.mark_stopped(old, "upstream_closed"),
        lambda: store.mark_failed(old, "x", count=1, at_seq=1),
        lambda: store.record_error(old, "late"),
        lambda: store.note_failure(old, "late", count=1, at_seq=1),
        lambda: store.note_gap(old, resumes=1, frames=5),
    ):
        with pytest.raises(LeaseLost) as lost:
            write()
        assert lost.value.current.lease_owner == "w2"
    assert store.get(pk) == new


@pytest.mark.parametrize("how", ["retired", "killed", "missing"])
def test_takeover_from_a_dead_or_missing_owner_needs_no_kill(store, clock, how):
    pk = started(store)
    if how != "missing":
        register(store, clock, "w1")
    store.acquire(pk, "w1")
    if how == "retired":
        store.retire_worker("w1")
    elif how == "killed":
        clock.advance(LEASE_MS + 1)
        assert store.kill_worker("w1")
    before = store.get_worker("w1", consistent=True)
    taken = store.acquire(pk, "w2")
    assert (taken.lease_owner, taken.lease_epoch) == ("w2", 2)
    assert store.get_worker("w1", consistent=True) == before  # not written again


def test_an_owner_lapsing_soon_gives_a_wait(store, clock):
    # GIVEN w1's lease lapses in 700 ms (an early hint came in the last second)
    pk = started(store)
    register(store, clock, "w1")
    store.acquire(pk, "w1")
    clock.advance(LEASE_MS - 700)
    # WHEN w2 tries THEN it is told how long to wait
    with pytest.raises(LeaseConflict) as conflict:
        store.acquire(pk, "w2", max_wait_ms=2_000)
    assert conflict.value.retry_in_ms == 701
    assert conflict.value.current.lease_owner == "w1"
    with pytest.raises(LeaseConflict) as impatient:
        store.acquire(pk, "w2", max_wait_ms=700)
    assert impatient.value.retry_in_ms is None
    # AND after that wait, it takes the connection over
    clock.advance(701)
    assert store.acquire(pk, "w2", max_wait_ms=2_000).lease_epoch == 2
    assert store.get_worker("w1").dead


def test_an_alive_owner_keeps_its_connection(store, clock):
    pk = started(store)
    register(store, clock, "w1")
    store.acquire(pk, "w1")
    clock.advance(LEASE_MS // 2)
    store.renew_worker("w1", expires_at_ms=clock.now + LEASE_MS, connection_count=1)
    clock.advance(LEASE_MS // 2 + 1)  # past the first expiry, not the renewed one
    with pytest.raises(LeaseConflict) as conflict:
        store.acquire(pk, "w2", max_wait_ms=0)
    assert conflict.value.retry_in_ms is None
    assert (conflict.value.current.lease_owner, conflict.value.current.lease_epoch) == ("w1", 1)
    assert not store.get_worker("w1").dead
    assert not store.kill_worker("w1")


def test_own_reacquire_bumps_the_epoch_and_fences_the_earlier_session(store, clock):
    pk = started(store)
    register(store, clock, "w1")
    old = Lease.of(store.acquire(pk, "w1"))
    again = store.acquire(pk, "w1")
    assert (again.lease_owner, again.lease_epoch) == ("w1", old.epoch + 1)
    with pytest.raises(LeaseLost):
        store.checkpoint(old, 5)
    store.checkpoint(Lease.of(again), 5)
    assert indexes(store) == expected(owned={"w1": [(pk, 2, STARTED)]}, STARTED=[pk])


# ------------------------------------------------------------------ release / stop / checkpoint
def test_release_of_a_started_connection_puts_it_in_unowned(store, clock):
    pk = started(store)
    register(store, clock, "w1")
    lease = Lease.of(store.acquire(pk, "w1"))
    clock.advance(30)
    released = store.release(lease, last_seq=12)
    assert (released.lease_owner, released.lease_epoch, released.last_seq) == ("", 1, 12)
    assert released.unowned_since_ms == clock.now
    assert indexes(store) == expected(unowned=[pk], STARTED=[pk])
    shard = index_shard(pk)
    assert not list(store.unowned(shard, clock.now))  # strictly before
    (entry,) = store.unowned(shard, clock.now + 1)
    assert entry == IndexEntry(pk, 1, STARTED, clock.now)
    with pytest.raises(LeaseLost):
        store.release(lease)  # not ours any more
    assert store.acquire(pk, "w2").lease_epoch == 2  # the epoch keeps counting


def test_release_after_stop_stays_out_of_unowned(store, clock):
    register(store, clock, "w1")
    flagged, unflagged = started(store, "c1"), started(store, "c2")
    leases = [Lease.of(store.acquire(pk, "w1")) for pk in (flagged, unflagged)]
    store.stop(flagged)
    store.stop(unflagged)
    assert indexes(store) == expected(
        owned={"w1": [(flagged, 1, STOPPED), (unflagged, 1, STOPPED)]},
        STOPPED=[flagged, unflagged],
    )
    # the holder that knows (stopped=True) and the one that does not: both end up free, STOPPED
    store.release(leases[0], last_seq=3, stopped=True)
    assert store.release(leases[1], last_seq=4).last_seq == 4
    assert indexes(store) == expected(STOPPED=[flagged, unflagged])


def test_checkpoint_never_regresses(store, clock):
    pk = started(store)
    register(store, clock, "w1")
    lease = Lease.of(store.acquire(pk, "w1"))
    store.checkpoint(lease, 31)
    store.checkpoint(lease, 30)  # a late, older write of the same holder
    assert store.get(pk).last_seq == 31
    store.record_error(lease, "x" * 5000)
    assert len(store.get(pk).last_error) == 1024
    released = store.release(lease, last_seq=28)  # the release itself still lands
    assert (released.last_seq, released.lease_owner) == (31, "")


def test_a_stale_checkpoint_never_lowers_the_send_limit_and_a_release_sets_it(store, clock):
    # At-least-once sinks (issue #27): sent_limit bounds what the holder has sent; an older
    # checkpoint landing late must not lower it under frames sent since.
    pk = started(store)
    register(store, clock, "w1")
    lease = Lease.of(store.acquire(pk, "w1"))
    store.checkpoint(lease, 31, window={"sent_limit": 131})
    store.checkpoint(lease, 30, window={"sent_limit": 130})  # a late, older write
    record = store.get(pk)
    assert (record.last_seq, record.sent_limit) == (31, 131)
    window = {"sent_limit": 40, "replayed_takeovers": 1, "replayed_frames": 9,
              "replayed_from_seq": 5, "replayed_to_seq": 14}
    released = store.release(lease, last_seq=40, window=window)
    assert (released.last_seq, released.sent_limit, released.replayed_frames) == (40, 40, 9)
    assert (released.replayed_from_seq, released.replayed_to_seq) == (5, 14)
    # a START of another stream forgets the old stream's window
    store.stop(pk)
    restarted = store.start("c1", "wss://elsewhere.example/s").record
    assert (restarted.sent_limit, restarted.replayed_takeovers) == (None, 0)


def test_checkpoint_after_stop_is_refused_but_the_final_release_lands(store, clock):
    pk = started(store)
    register(store, clock, "w1")
    lease = Lease.of(store.acquire(pk, "w1"))
    store.stop(pk)
    with pytest.raises(ConnectionStopped) as stopped:
        store.checkpoint(lease, 3)
    assert stopped.value.current.desired_state is STOPPED
    released = store.release(lease, last_seq=4, stopped=True)
    assert (released.lease_owner, released.last_seq, released.desired_state) == ("", 4, STOPPED)


def test_stale_checkpoint_of_a_fenced_holder_is_lost(store, clock):
    pk = started(store)
    register(store, clock, "w1")
    old = Lease.of(store.acquire(pk, "w1"))
    store.checkpoint(old, 10)
    store.acquire(pk, "w1")
    with pytest.raises(LeaseLost):
        store.checkpoint(old, 5)
    assert store.get(pk).last_seq == 10


def test_mark_stopped_ends_and_releases_in_one_write(store, clock):
    pk = started(store)
    register(store, clock, "w1")
    lease = Lease.of(store.acquire(pk, "w1"))
    rec = store.mark_stopped(lease, "upstream_closed", last_seq=12)
    assert (rec.desired_state, rec.stop_reason, rec.lease_owner, rec.last_seq) == (
        STOPPED, "upstream_closed", "", 12,
    )
    assert indexes(store) == expected(STOPPED=[pk])
    with pytest.raises(LeaseLost):
        store.mark_stopped(lease, "again")


def test_mark_failed_then_start_resets_the_breaker(store, clock):
    # GIVEN a held connection whose breaker trips
    pk = started(store)
    register(store, clock, "w1")
    lease = Lease.of(store.acquire(pk, "w1"))
    reason = "closed_by_worker (code 1009: message too big)"
    rec = store.mark_failed(lease, reason, count=5, at_seq=3, last_seq=3)
    # THEN it is FAILED, free, with the reason and the count, listed but in no other index
    assert (rec.desired_state, rec.lease_owner, rec.last_seq) == (FAILED, "", 3)
    assert (rec.stop_reason, rec.last_error, rec.failure_count, rec.failure_seq) == (
        reason, reason, 5, 3,
    )
    assert indexes(store) == expected(FAILED=[pk])
    with pytest.raises(ConnectionStopped):
        store.acquire(pk, "w2")
    # WHEN it is STARTed again THEN it resumes from its checkpoint with a fresh breaker
    result = store.start("c1", URL)
    assert result.restarted and result.record.last_seq == 3
    assert (result.record.failure_count, result.record.failure_seq) == (0, None)
    assert (result.record.stop_reason, result.record.last_error) == (None, None)
    assert indexes(store) == expected(unowned=[pk], STARTED=[pk])
    assert store.acquire(pk, "w2").lease_owner == "w2"


def test_note_failure_survives_a_hand_over(store, clock):
    pk = started(store)
    register(store, clock, "w1")
    first = Lease.of(store.acquire(pk, "w1"))
    store.note_failure(first, "crashed", count=1, at_seq=7)
    store.release(first)
    taken = store.acquire(pk, "w2")
    assert (taken.failure_count, taken.failure_seq, taken.last_error) == (1, 7, "crashed")
    with pytest.raises(LeaseLost):
        store.note_failure(first, "crashed", count=2, at_seq=7)


def test_gap_totals_survive_a_hand_over_and_are_fenced(store, clock):
    pk = started(store)
    register(store, clock, "w1")
    first = Lease.of(store.acquire(pk, "w1"))
    store.note_gap(first, resumes=1, frames=30)
    store.release(first)
    taken = store.acquire(pk, "w2")
    assert (taken.resume_gaps, taken.gap_frames) == (1, 30)
    with pytest.raises(LeaseLost):
        store.note_gap(first, resumes=2, frames=31)
    assert (store.get(pk).resume_gaps, store.get(pk).gap_frames) == (1, 30)


# ------------------------------------------------------------------ indexes across shards
def test_every_index_after_every_transition_across_shards(store, clock):
    # GIVEN 40 connections: more than one per shard, so pages end inside shards and between
    pks = [started(store, f"p{i:02d}") for i in range(40)]
    per_shard = [sum(index_shard(pk) == shard for pk in pks) for shard in range(INDEX_SHARDS)]
    assert max(per_shard) >= 3
    register(store, clock, "w1")
    register(store, clock, "w2")
    assert indexes(store) == expected(unowned=pks, STARTED=pks)
    for limit in (1, 3, 7, 50):
        assert listing(store, STARTED, limit=limit) == sorted(pks)
    # WHEN they move through every state
    leases = {pk: Lease.of(store.acquire(pk, "w1" if i % 2 else "w2")) for i, pk in enumerate(pks)}
    w1 = [pk for i, pk in enumerate(pks) if i % 2]
    w2 = [pk for i, pk in enumerate(pks) if not i % 2]
    assert indexes(store) == expected(
        owned={"w1": [(pk, 1, STARTED) for pk in w1], "w2": [(pk, 1, STARTED) for pk in w2]},
        STARTED=pks,
    )
    stopped, failed, released, kept = w1[:5], w1[5:10], w1[10:], w2
    for pk in stopped:
        store.stop(pk)
    assert indexes(store) == expected(
        owned={
            "w1": sorted(
                [(pk, 1, STOPPED) for pk in stopped] + [(pk, 1, STARTED) for pk in w1[5:]]
            ),
            "w2": [(pk, 1, STARTED) for pk in w2],
        },
        STARTED=[pk for pk in pks if pk not in stopped],
        STOPPED=stopped,
    )
    for pk in stopped:
        store.release(leases[pk], stopped=True)
    for pk in failed:
        store.mark_failed(leases[pk], "poison", count=3, at_seq=0)
    for pk in released:
        store.release(leases[pk])
    # THEN each index shows exactly what the items say
    assert indexes(store) == expected(
        owned={"w2": [(pk, 1, STARTED) for pk in kept]},
        unowned=released,
        STARTED=kept + released,
        STOPPED=stopped,
        FAILED=failed,
    )
    for limit in (1, 4, 100):
        assert listing(store, STOPPED, limit=limit) == sorted(stopped)
    assert store.batch_get([*pks, "CONN#absent"]).keys() == set(pks)


# ------------------------------------------------------------------ worker items
def test_worker_register_renew_retire_and_delete(store, clock):
    worker = register(store, clock, "w1")
    with pytest.raises(StoreError):  # an id is one incarnation
        store.register_worker(dataclasses.replace(worker, started_at_ms=worker.started_at_ms + 1))
    store.register_worker(worker)  # the same record again: a retried write that had landed
    assert store.get_worker("w1") == worker
    assert store.list_worker_ids() == ["w1"]
    assert not list(store.owned_by("w1"))
    clock.advance(500)
    store.renew_worker("w1", expires_at_ms=clock.now + LEASE_MS, connection_count=3)
    got = store.get_worker("w1", consistent=True)
    assert (got.heartbeat_at_ms, got.expires_at_ms, got.connection_count) == (
        clock.now, clock.now + LEASE_MS, 3,
    )
    assert set(store.get_workers(["w1", "w2"])) == {"w1"}
    # nothing deletes a live worker's item
    assert not store.delete_worker("w1", dead_before_ms=clock.now)
    # retire: dead and expired now; no renewal after it, retiring again is harmless
    clock.advance(10)
    store.retire_worker("w1")
    retired = store.get_worker("w1", consistent=True)
    assert retired.dead and retired.dead_at_ms == retired.expires_at_ms == clock.now
    with pytest.raises(WorkerDead):
        store.renew_worker("w1", expires_at_ms=clock.now + LEASE_MS, connection_count=0)
    store.retire_worker("w1")
    assert store.get_worker("w1") == retired
    # deleted only once its lease ended before the cutoff
    assert not store.delete_worker("w1", dead_before_ms=clock.now)
    assert store.delete_worker("w1", dead_before_ms=clock.now + 1)
    assert store.get_worker("w1") is None and store.list_worker_ids() == []
    assert not store.delete_worker("w1", dead_before_ms=FAR)
    with pytest.raises(WorkerDead):
        store.renew_worker("w1", expires_at_ms=clock.now + LEASE_MS, connection_count=0)
    store.retire_worker("w1")  # gone: nothing to end, no error
    assert store.get_worker("w1") is None


def test_kill_worker(store, clock):
    register(store, clock, "w1")
    assert not store.kill_worker("w1")  # alive
    clock.advance(LEASE_MS)
    assert not store.kill_worker("w1")  # expiry is inclusive: still alive at expires_at_ms
    clock.advance(1)
    assert store.kill_worker("w1")
    dead_at = store.get_worker("w1").dead_at_ms
    clock.advance(1)
    assert store.kill_worker("w1")  # dead already: True, and the first kill stands
    assert store.get_worker("w1").dead_at_ms == dead_at == clock.now - 1
    assert store.kill_worker("ghost")  # no item: nothing alive to protect
    assert store.get_worker("ghost") is None


def test_worker_items_stay_out_of_the_connection_indexes(store, clock):
    register(store, clock, "w1")
    clock.advance(LEASE_MS + 1)
    store.kill_worker("w1")
    assert indexes(store) == expected()
    register(store, clock, "w2")
    assert sorted(store.list_worker_ids()) == ["w1", "w2"]


# ------------------------------------------------------------------ hint claims
def test_claim_worker_hints_once_per_expiry(store, clock):
    worker = register(store, clock, "w1")
    assert store.claim_worker_hints(worker, rehint_after_ms=10_000)
    assert not store.claim_worker_hints(worker, rehint_after_ms=10_000)
    claimed = store.get_worker("w1", consistent=True)
    assert (claimed.hinted_expiry_ms, claimed.hinted_at_ms) == (worker.expires_at_ms, clock.now)
    clock.advance(10_001)
    assert store.claim_worker_hints(worker, rehint_after_ms=10_000)  # a lost hint, again
    assert not store.claim_worker_hints(worker, rehint_after_ms=10_000)
    # it renewed: the old view claims nothing, the new expiry is claimable once
    store.renew_worker("w1", expires_at_ms=clock.now + LEASE_MS, connection_count=0)
    assert not store.claim_worker_hints(worker, rehint_after_ms=10_000)
    renewed = store.get_worker("w1", consistent=True)
    assert store.claim_worker_hints(renewed, rehint_after_ms=10_000)
    assert not store.claim_worker_hints(renewed, rehint_after_ms=10_000)
    ghost = WorkerRecord(worker_id="ghost", control_queue_url="", started_at_ms=0,
                         heartbeat_at_ms=0, expires_at_ms=1)
    assert not store.claim_worker_hints(ghost, rehint_after_ms=0)
    assert store.get_worker("ghost") is None  # no item created by a refused claim


def test_claim_hint_once_per_free_spell_and_withdraw(store, clock):
    pk = started(store)
    (entry,) = all_unowned(store)
    assert store.claim_hint(entry, rehint_after_ms=60_000)
    assert not store.claim_hint(entry, rehint_after_ms=60_000)
    # the hint could not be sent: withdrawn, claimable again
    assert store.withdraw_hint_claim(entry)
    assert not store.withdraw_hint_claim(entry)
    assert store.claim_hint(entry, rehint_after_ms=60_000)
    clock.advance(60_001)
    assert store.claim_hint(entry, rehint_after_ms=60_000)  # a lost hint is retried eventually
    # taken: no claim for that spell; released: a new spell is claimable at once
    register(store, clock, "w1")
    lease = Lease.of(store.acquire(pk, "w1"))
    assert not store.claim_hint(entry, rehint_after_ms=0)
    assert "hinted_at_ms" not in raw_item(store, pk)  # the take cleared the claim
    clock.advance(1)
    store.release(lease)
    (spell,) = all_unowned(store)
    assert spell.unowned_since_ms == clock.now and spell.epoch == 1
    assert not store.claim_hint(entry, rehint_after_ms=0)  # the old spell
    assert not store.withdraw_hint_claim(spell)  # nothing claimed for it yet
    assert store.claim_hint(spell, rehint_after_ms=60_000)
    assert not store.withdraw_hint_claim(entry)
    assert not store.claim_hint(IndexEntry("CONN#nope", 0, STARTED, 5), rehint_after_ms=0)
    assert store.get("CONN#nope") is None


@pytest.mark.parametrize(
    ("first", "then"),
    [({}, {"seq_pointer": "/seq"}), ({"seq_pointer": "/seq"}, {}),
     ({"seq_pointer": "/seq", "resume": "none"}, {"resume": "none"})],
)
def test_restart_spelling_out_the_default_seq_pointer_keeps_the_checkpoint(
    store, clock, first, then
):
    # GIVEN a connection STARTed with options as the router parses them, streamed to 41 and
    # STOPPED
    def options(raw: dict[str, Any]) -> UpstreamOptions:
        return parse_upstream_options(raw, secret_prefixes=(), default_seq_field="seq")

    pk = store.start("c1", URL, upstream=options(first)).record.pk
    register(store, clock, "w1")
    lease = Lease.of(store.acquire(pk, "w1"))
    store.checkpoint(lease, 41)
    store.release(lease)
    store.stop(pk)
    # WHEN it is STARTed again, adding or dropping "seq_pointer": "/seq" (the default)
    restarted = store.start("c1", URL, upstream=options(then))
    # THEN it is the same stream: the checkpoint is kept and no pointer is stored
    assert restarted.restarted and restarted.record.last_seq == 41
    assert "seq_pointer" not in (raw_item(store, pk).get("upstream") or {})
    assert store.get(pk).upstream == options(then)


# ------------------------------------------------------------------ rebalancing
def test_a_moved_release_remembers_when_and_the_next_owner_reads_it(store, clock):
    pk = started(store)
    register(store, clock, "w1")
    lease = Lease.of(store.acquire(pk, "w1"))
    clock.advance(30)
    released = store.release(lease, last_seq=4, moved=True)
    assert released.rebalanced_at_ms == clock.now
    assert released.unowned_since_ms == clock.now  # a hand-off like any other
    register(store, clock, "w2")
    taken = store.acquire(pk, "w2")
    assert (taken.rebalanced_at_ms, taken.last_seq) == (clock.now, 4)
    # an ordinary release leaves the mark as it was
    again = store.release(Lease.of(taken))
    assert again.rebalanced_at_ms == taken.rebalanced_at_ms


def test_fleet_view_put_get_and_stays_out_of_every_index(store, clock):
    assert store.get_fleet_view() is None
    view = FleetView(
        at_ms=clock.now, plan_at_ms=clock.now, workers=3, held=200, capacity=600,
        best_free=200, moves=(Move("w1", "w3", 20), Move("w2", "w3", 20)),
        targets={"w1": 67, "w2": 67, "w3": 66}, queues={"w3": "https://sqs/q-w3"},
    )
    store.put_fleet_view(view)
    assert store.get_fleet_view(consistent=True) == view
    store.put_fleet_view(FleetView(at_ms=clock.now + 1))  # the latest pass wins
    assert store.get_fleet_view(consistent=True) == FleetView(at_ms=clock.now + 1)
    assert indexes(store) == expected()
    assert store.list_worker_ids() == []


def test_a_malformed_fleet_view_reads_as_none(store, clock):
    store.put_fleet_view(FleetView(at_ms=1, moves=(Move("a", "b", 1),)))
    if isinstance(store, InMemoryLeaseStore):
        store._items[FLEET_VIEW_PK]["moves"] = [["a", "b", -1]]
    else:
        store._call(
            "update_item", Key={"pk": {"S": FLEET_VIEW_PK}},
            UpdateExpression="SET moves = :m",
            ExpressionAttributeValues={":m": {"S": "garbage"}},
        )
    assert store.get_fleet_view(consistent=True) is None


# ------------------------------------------------------------------ make-before-break transfer
def test_transfer_moves_the_lease_in_one_write_and_fences_the_giver(store, clock):
    pk = started(store)
    register(store, clock, "w1")
    register(store, clock, "w2")
    giver = Lease.of(store.acquire(pk, "w1"))
    store.checkpoint(giver, 5)
    clock.advance(30)
    moved = store.transfer(giver, "w2", last_seq=9)
    assert (moved.lease_owner, moved.lease_epoch, moved.last_seq) == ("w2", giver.epoch + 1, 9)
    assert moved.rebalanced_at_ms == clock.now
    # the taker shows in gsi_owner at once, never in gsi_unowned (it was never free)
    assert indexes(store) == expected(owned={"w2": [(pk, giver.epoch + 1, STARTED)]},
                                      STARTED=[pk])
    assert store.get(pk) == moved
    # the giver is fenced: every write of (w1, e) is refused, a second transfer too
    for write in (lambda: store.checkpoint(giver, 10), lambda: store.release(giver),
                  lambda: store.transfer(giver, "w2", last_seq=10)):
        with pytest.raises(LeaseLost):
            write()
    # the taker's lease works like an acquired one
    taker = Lease.of(moved)
    store.checkpoint(taker, 12)
    assert store.release(taker, last_seq=13).last_seq == 13


def test_transfer_never_moves_the_checkpoint_back_and_a_drain_leaves_no_dwell_mark(store, clock):
    pk = started(store)
    register(store, clock, "w1")
    giver = Lease.of(store.acquire(pk, "w1"))
    store.checkpoint(giver, 20)
    moved = store.transfer(giver, "w2", last_seq=15, moved=False)  # a stale durable
    assert (moved.lease_owner, moved.last_seq, moved.rebalanced_at_ms) == ("w2", 20, None)


def test_transfer_carries_the_send_window_as_a_release_does(store, clock):
    # At-least-once sinks (issue #27): a make-before-break taker inherits the giver's final
    # window from the transfer itself; with nothing in flight it has nothing to re-send.
    pk = started(store)
    register(store, clock, "w1")
    giver = Lease.of(store.acquire(pk, "w1"))
    store.checkpoint(giver, 31, window={"sent_limit": 91})
    window = {"sent_limit": 40, "replayed_takeovers": 1, "replayed_frames": 9,
              "replayed_from_seq": 5, "replayed_to_seq": 14}
    moved = store.transfer(giver, "w2", last_seq=40, window=window)
    assert (moved.lease_owner, moved.last_seq, moved.sent_limit) == ("w2", 40, 40)
    assert (moved.replayed_takeovers, moved.replayed_frames) == (1, 9)
    assert (moved.replayed_from_seq, moved.replayed_to_seq) == (5, 14)
    assert store.get(pk) == moved


def test_transfer_refusals(store, clock):
    register(store, clock, "w1")
    register(store, clock, "w2")
    # STOPPED meanwhile: nothing moves, the giver still holds it and ends it as a STOP
    pk = started(store, "c1")
    giver = Lease.of(store.acquire(pk, "w1"))
    store.stop(pk)
    with pytest.raises(ConnectionStopped):
        store.transfer(giver, "w2", last_seq=1)
    assert store.get(pk).lease_owner == "w1"
    # another epoch (the giver was taken over meanwhile): refused, the new owner keeps it
    pk2 = started(store, "c2")
    old = Lease.of(store.acquire(pk2, "w1"))
    current = store.acquire(pk2, "w1")  # a re-acquire fences the old epoch
    with pytest.raises(LeaseLost):
        store.transfer(old, "w2", last_seq=1)
    assert (store.get(pk2).lease_owner, store.get(pk2).lease_epoch) == ("w1", current.lease_epoch)
    # a released connection cannot be transferred; a deleted one neither
    released = Lease.of(current)
    store.release(released)
    with pytest.raises(LeaseLost):
        store.transfer(released, "w2", last_seq=1)
    with pytest.raises(ValueError):
        store.transfer(Lease(pk2, "w1", 9), "w1", last_seq=1)


@pytest.mark.parametrize("first", ["transfer", "takeover"])
def test_a_transfer_racing_a_takeover_lands_at_most_once(store, clock, first):
    # G's worker lease lapses while it transfers: the takeover and the transfer are both
    # conditional on (G, e); exactly one lands, whichever goes first.
    register(store, clock, "w1")
    pk = started(store)
    giver = Lease.of(store.acquire(pk, "w1"))
    clock.advance(LEASE_MS + 1)
    register(store, clock, "w2")
    register(store, clock, "w3")
    if first == "transfer":
        store.transfer(giver, "w2", last_seq=1)
        with pytest.raises(LeaseConflict):
            store.acquire(pk, "w3")  # the taker is alive: no takeover
        winner = "w2"
    else:
        store.acquire(pk, "w3")  # kills w1, takes it
        with pytest.raises(LeaseLost):
            store.transfer(giver, "w2", last_seq=1)
        winner = "w3"
    assert store.get(pk).lease_owner == winner
    assert store.get(pk).lease_epoch == giver.epoch + 1
