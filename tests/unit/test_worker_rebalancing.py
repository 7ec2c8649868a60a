"""The worker's part of rebalancing over the in-memory lease store: which connections it
gives, the hand-off hints, once per plan, the dwell time, placement.

Built like ``test_worker_decisions``: a Worker on :class:`wsfleet.memstore.InMemoryLeaseStore`
with no control channel, no poller and an upstream that never answers. The fleet view is
put in the store as the reconciler would.
"""

from __future__ import annotations

import asyncio
from typing import Any

from test_worker_decisions import Outbox, Store, connect, make_worker, sync, until

from wsfleet.clock import now_ms
from wsfleet.control import HandoffHint
from wsfleet.rebalance import FleetView, Move
from wsfleet_worker.rebalancing import HANDOFF_COPY_DELAY_SECONDS, choose_to_give
from wsfleet_worker.session_rules import ExitReason


def plan(*moves: Move, at: int | None = None, targets: dict[str, int] | None = None) -> FleetView:
    now = now_ms() if at is None else at
    return FleetView(
        at_ms=now, plan_at_ms=now, workers=2, held=0, capacity=20, best_free=10,
        moves=moves, targets=targets or {}, queues={"w2": "https://sqs.invalid/ctl-w2"},
    )


async def _drain(worker: Any) -> None:
    """Wait for the sessions that are ending, then for their hand-off hints."""
    tasks = [t for pk, t in worker._session_tasks.items() if worker.sessions[pk].reason]
    if tasks:
        await asyncio.wait(tasks, timeout=10)
    await worker.rebalancer.close()


@sync
async def test_a_giver_hands_off_its_part_with_an_addressed_hint_and_a_delayed_copy():
    # GIVEN a worker holding 6 connections and a plan asking it for 2 (its target is 4)
    store = Store()
    worker = make_worker(store)
    sessions = [connect(worker, store, f"c{i}") for i in range(6)]
    sent: list[tuple[str, HandoffHint]] = []

    async def send(url: str, handoffs: list[HandoffHint]) -> set[str]:
        sent.extend((url, h) for h in handoffs)
        return {h.pk for h in handoffs if h.pk != "CONN#c0"}  # c0 did not go out

    worker.rebalancer._send_handoffs = send
    store.put_fleet_view(plan(Move("w1", "w2", 2), targets={"w1": 4, "w2": 4}))
    # WHEN the worker reads the view
    given = await worker.rebalancer.run_once()
    await _drain(worker)
    # THEN two connections, never moved, are released as moved with their hints
    assert given == 2
    moved = [s for s in sessions if s.reason is ExitReason.REBALANCED]
    assert [s.pk for s in moved] == ["CONN#c0", "CONN#c1"]
    for session in moved:
        record = store.get(session.pk)
        assert record.lease_owner == "" and record.rebalanced_at_ms is not None
    assert [(url, h.pk) for url, h in sent] == [
        ("https://sqs.invalid/ctl-w2", "CONN#c0"), ("https://sqs.invalid/ctl-w2", "CONN#c1")
    ]
    outbox = worker.outbox
    assert isinstance(outbox, Outbox)
    # the copy of the one that did not go out is not delayed
    assert {(h.pk, h.delay_seconds) for h in outbox.hints} == {
        ("CONN#c0", 0), ("CONN#c1", HANDOFF_COPY_DELAY_SECONDS)
    }
    # WHEN it reads the same plan again
    # THEN it gives nothing more (a plan is carried out once)
    assert await worker.rebalancer.run_once() == 0
    assert len(worker.sessions) == 4


@sync
async def test_never_below_the_target_as_it_stands_now_and_not_from_a_stale_plan():
    store = Store()
    worker = make_worker(store, rebalance_seconds=1.0)
    for i in range(5):
        connect(worker, store, f"c{i}")
    # a plan asking for 3, though the worker now holds only one above its target
    store.put_fleet_view(plan(Move("w1", "w2", 3), targets={"w1": 4}))
    assert await worker.rebalancer.run_once() == 1
    # a plan older than REBALANCE_SECONDS is not acted on
    store.put_fleet_view(plan(Move("w1", "w2", 3), at=now_ms() - 5_000, targets={"w1": 0}))
    assert await worker.rebalancer.run_once() == 0
    await _drain(worker)


@sync
async def test_without_a_control_channel_the_copy_goes_out_at_once():
    store = Store()
    worker = make_worker(store)
    for i in range(3):
        connect(worker, store, f"c{i}")
    store.put_fleet_view(plan(Move("w1", "w2", 1), targets={"w1": 2}))
    await worker.rebalancer.run_once()
    await _drain(worker)
    outbox = worker.outbox
    assert isinstance(outbox, Outbox)
    assert [(h.pk, h.delay_seconds) for h in outbox.hints] == [("CONN#c0", 0)]


def test_connections_moved_within_the_dwell_time_are_not_chosen():
    now = 1_000_000
    candidates = {"CONN#new": now - 10, "CONN#old": now - 700_000, "CONN#never": None}
    assert choose_to_give(candidates, 3, now_ms=now, dwell_ms=600_000) == [
        "CONN#never", "CONN#old"
    ]


async def _one_moved_one_not(store: Store) -> tuple[Any, str]:
    """A worker holding a connection a peer moved here a moment ago (the item says so) and
    one that never moved; and the moved one's pk."""
    store.start("m", "wss://up.example/m")
    worker = make_worker(store)
    session = connect(worker, store, "m")
    session.finish(ExitReason.REBALANCED)
    await asyncio.wait([worker._session_tasks[session.pk]], timeout=10)
    worker._start_session(store.acquire(session.pk, "w1"))
    connect(worker, store, "plain")
    return worker, session.pk


@sync
async def test_a_connection_taken_after_a_move_is_not_moved_again_within_the_dwell():
    # GIVEN a connection a peer moved here a moment ago and one that never moved
    store = Store()
    worker, moved = await _one_moved_one_not(store)
    # WHEN a plan asks for both
    store.put_fleet_view(plan(Move("w1", "w2", 2), targets={"w1": 0}))
    given = await worker.rebalancer.run_once()
    # THEN only the one that never moved goes
    assert given == 1
    assert worker.sessions[moved].reason is None
    await _drain(worker)


@sync
async def test_the_heartbeat_reports_how_many_connections_may_move():
    # GIVEN a connection moved here a moment ago and one that never moved
    store = Store()
    worker, _ = await _one_moved_one_not(store)
    # WHEN the worker renews its lease
    assert worker.liveness.timer is not None
    await worker.liveness._renew(worker.liveness.timer, now_ms())
    # THEN its item says it holds two, of which one may move (the reconciler plans with it)
    item = store.get_workers(["w1"])["w1"]
    assert (item.connection_count, item.movable_count) == (2, 1)
    await _drain(worker)


@sync
async def test_the_first_view_is_read_at_start_so_placement_works_from_the_start():
    # GIVEN a view in the store and a worker that reads it every minute
    store = Store()
    store.put_fleet_view(plan())
    worker = make_worker(store, rebalance_seconds=60.0)
    # WHEN its rebalancer starts
    task = asyncio.create_task(worker.rebalancer.run())
    try:
        # THEN it has the view at once, not a minute later (a START burst on a new fleet
        # would otherwise go to whoever polls first)
        await until(lambda: worker.rebalancer.view is not None, "the view read at start")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_placement_defers_a_worker_above_its_share_of_the_fleet():
    store = Store()
    worker = make_worker(store, max_connections=10, rebalance_placement_seconds=0.5)
    rebalancer = worker.rebalancer
    assert rebalancer.placement_delay() == 0  # no view yet
    # two workers of 10, 4 connections in the fleet: a share of 2, band one connection
    rebalancer.view = FleetView(at_ms=now_ms(), workers=2, held=4, capacity=20)
    for i in range(3):
        worker.sessions[f"CONN#x{i}"] = object()  # type: ignore[assignment]
    assert rebalancer.placement_delay() == 0  # 3: within the band
    worker.sessions["CONN#x3"] = object()  # type: ignore[assignment]
    assert rebalancer.placement_delay() == 0.5
    rebalancer.view = FleetView(at_ms=now_ms() - 3_600_000, workers=2, held=4, capacity=20)
    assert rebalancer.placement_delay() == 0  # a stale view says nothing


def test_rebalance_off_builds_no_rebalancer():
    worker = make_worker(Store(), rebalance=False)
    assert worker.rebalancer is None
