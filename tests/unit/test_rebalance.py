"""The pure rebalancing rules: target shares, the band, the moves, settling, placement."""

from __future__ import annotations

import doctest
from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from wsfleet import rebalance
from wsfleet.rebalance import (
    FleetView,
    Move,
    WorkerLoad,
    apply_moves,
    band,
    defer_placement,
    in_band,
    make_view,
    plan_moves,
    settled,
    target_shares,
)


def test_doctests() -> None:
    assert doctest.testmod(rebalance).failed == 0


def _fleet(*held: int, capacity: int = 1000) -> list[WorkerLoad]:
    return [WorkerLoad(f"w{i}", h, capacity) for i, h in enumerate(held)]


def test_shares_add_up_and_follow_capacity() -> None:
    workers = [WorkerLoad("a", 90, 100), WorkerLoad("b", 0, 200), WorkerLoad("c", 10, 100)]
    shares = target_shares(workers)
    assert sum(shares.values()) == 100
    assert shares == {"a": 25, "b": 50, "c": 25}


def test_shares_never_exceed_capacity_when_overfull() -> None:
    shares = target_shares([WorkerLoad("a", 150, 100), WorkerLoad("b", 100, 100)])
    assert shares == {"a": 100, "b": 100}


def test_no_capacity_means_no_share() -> None:
    assert target_shares([WorkerLoad("a", 5, 0)]) == {"a": 0}


def test_scale_out_three_to_six() -> None:
    # GIVEN 300 connections on three workers, three empty ones joined
    workers = _fleet(100, 100, 100, 0, 0, 0)
    # WHEN the plan is made
    moves = plan_moves(workers, band_percent=10, max_moves=20)
    # THEN each old worker gives its bound to the new ones, nothing between old ones
    assert sum(m.count for m in moves) == 60
    assert {m.giver for m in moves} == {"w0", "w1", "w2"}
    assert {m.taker for m in moves} == {"w3", "w4", "w5"}
    assert all(sum(m.count for m in moves if m.giver == g) == 20 for g in ("w0", "w1", "w2"))


def test_balanced_fleet_moves_nothing() -> None:
    assert plan_moves(_fleet(52, 48, 50, 55, 45), band_percent=10, max_moves=20) == ()


def test_one_outside_the_band_pulls_from_those_above_target() -> None:
    # w0 is above its band; w1, w2 are below target but inside theirs: they still take
    moves = plan_moves(_fleet(58, 47, 45), band_percent=10, max_moves=20)
    after = apply_moves(_fleet(58, 47, 45), moves)
    assert in_band(after, 10)
    assert all(m.giver == "w0" for m in moves)


def test_max_moves_zero_turns_it_off() -> None:
    assert plan_moves(_fleet(100, 0), band_percent=10, max_moves=0) == ()


def test_plan_ignores_input_order() -> None:
    workers = _fleet(100, 7, 0, 33, 90)
    assert plan_moves(workers, band_percent=10, max_moves=5) == plan_moves(
        list(reversed(workers)), band_percent=10, max_moves=5
    )


def test_band_is_at_least_one_connection() -> None:
    assert band(0, 10) == (0, 1)
    assert band(3, 10) == (2, 4)


def test_settled_waits_for_a_heartbeat_after_the_plan() -> None:
    moves = [Move("a", "b", 3)]
    assert settled(None, (), {}, act_ms=10)
    assert not settled(1_000, moves, {"a": 20_000, "b": 11_000}, act_ms=10_000)
    assert settled(1_000, moves, {"a": 20_000, "b": 11_001}, act_ms=10_000)
    # a worker of the previous plan that is gone no longer holds anything up
    assert settled(1_000, moves, {"a": 20_000}, act_ms=10_000)


def test_placement_defers_only_beyond_the_share_and_its_band() -> None:
    # two equal workers, 100 connections in the fleet: a share of 50, a band of 5
    assert not defer_placement(55, 100, fleet_held=100, fleet_capacity=200, band_percent=10)
    assert defer_placement(56, 100, fleet_held=100, fleet_capacity=200, band_percent=10)
    # an idle fleet: one connection is within the band, two are not
    assert not defer_placement(1, 100, fleet_held=0, fleet_capacity=200, band_percent=10)
    assert defer_placement(2, 100, fleet_held=0, fleet_capacity=200, band_percent=10)
    # no view of the fleet's capacity: never held back beyond one connection
    assert not defer_placement(1, 100, fleet_held=0, fleet_capacity=0, band_percent=10)


# ---------------------------------------------------------------------------- properties
fleets = st.lists(
    st.tuples(st.integers(0, 300), st.sampled_from([100, 300, 1000])), min_size=2, max_size=12
).map(lambda ws: [WorkerLoad(f"w{i:02d}", min(h, c), c) for i, (h, c) in enumerate(ws)])


@settings(max_examples=300, deadline=None)
@given(fleets, st.integers(1, 50), st.sampled_from([0, 5, 10, 25]))
def test_moves_are_bounded_and_never_cross_the_target(
    workers: list[WorkerLoad], max_moves: int, band_percent: int
) -> None:
    moves = plan_moves(workers, band_percent=band_percent, max_moves=max_moves)
    shares = target_shares(workers)
    held = {w.worker_id: w.held for w in workers}
    given_by: dict[str, int] = {}
    for move in moves:
        assert move.count > 0 and move.giver != move.taker
        given_by[move.giver] = given_by.get(move.giver, 0) + move.count
    assert all(n <= max_moves for n in given_by.values())
    givers = {m.giver for m in moves}
    takers = {m.taker for m in moves}
    assert not givers & takers
    for worker in apply_moves(workers, moves):
        wid = worker.worker_id
        if wid in givers:
            assert shares[wid] <= worker.held < held[wid]
        if wid in takers:
            assert held[wid] < worker.held <= shares[wid]
    assert sum(w.held for w in apply_moves(workers, moves)) == sum(held.values())


@settings(max_examples=200, deadline=None)
@given(fleets, st.integers(1, 50), st.sampled_from([0, 5, 10, 25]))
def test_repeated_plans_converge_without_back_and_forth(
    workers: list[WorkerLoad], max_moves: int, band_percent: int
) -> None:
    # GIVEN plans carried out one after the other on a fleet whose total does not change
    gave: set[str] = set()
    took: set[str] = set()
    largest_gap = max(abs(w.held - s) for w, s in zip(
        sorted(workers, key=lambda w: w.worker_id),
        [target_shares(workers)[w] for w in sorted(w.worker_id for w in workers)],
        strict=True,
    ))
    rounds = 0
    while moves := plan_moves(workers, band_percent=band_percent, max_moves=max_moves):
        gave |= {m.giver for m in moves}
        took |= {m.taker for m in moves}
        workers = apply_moves(workers, moves)
        rounds += 1
        # THEN it ends within the rounds the largest excess needs at the per-giver bound
        assert rounds <= largest_gap // max_moves + 2
    # THEN every worker ends within its band, and no worker both gave and took
    assert in_band(workers, band_percent)
    assert not gave & took


# ---------------------------------------------------------------------------- the fleet view
def _view(**changes: object) -> FleetView:
    loads = _fleet(100, 100, 0, capacity=200)
    base = make_view(loads, now_ms=1_000, queues={"w2": "https://q/w2"}, heartbeats={},
                     previous=None, band_percent=10, max_moves=20, act_ms=13_000)
    return replace(base, **changes)  # type: ignore[arg-type]


def test_view_round_trips_through_its_item() -> None:
    view = _view()
    assert view.moves and view.queues == {"w2": "https://q/w2"}
    assert FleetView.from_item(view.to_item()) == view
    assert view.moves_from("w0") == tuple(m for m in view.moves if m.giver == "w0")


@pytest.mark.parametrize(
    "item",
    [
        {},
        {"at_ms": "soon"},
        {"at_ms": 1, "moves": [["a", "b"]]},
        {"at_ms": 1, "moves": [["a", "b", 0]]},
        {"at_ms": 1, "moves": "ab"},
        {"at_ms": 1, "targets": ["a"]},
    ],
)
def test_a_malformed_view_is_refused(item: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="not a fleet view"):
        FleetView.from_item(item)


def test_an_unsettled_plan_stays_in_the_view() -> None:
    previous = _view()
    loads = apply_moves(_fleet(100, 100, 0, capacity=200), previous.moves)
    beats = {"w0": 5_000, "w1": 20_000, "w2": 20_000}  # w0 has not reported since
    kept = make_view(loads, now_ms=11_000, queues={}, heartbeats=beats, previous=previous,
                     band_percent=10, max_moves=20, act_ms=13_000)
    assert (kept.plan_at_ms, kept.moves) == (previous.plan_at_ms, previous.moves)
    beats["w0"] = 15_000
    fresh = make_view(loads, now_ms=21_000, queues={}, heartbeats=beats, previous=previous,
                      band_percent=10, max_moves=20, act_ms=13_000)
    assert fresh.plan_at_ms == 21_000
    assert fresh.held == 200 and fresh.workers == 3
