"""The pure rebalancing rules: target shares, the band, the moves, settling, placement."""

from __future__ import annotations

import doctest

from hypothesis import given, settings, strategies as st

from wsfleet import rebalance
from wsfleet.rebalance import (
    Move,
    WorkerLoad,
    apply_moves,
    band,
    defer_placement,
    in_band,
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


def test_placement_defers_only_beyond_the_band() -> None:
    assert not defer_placement(0, 100, 100, 10)
    assert not defer_placement(10, 100, 100, 10)  # 10 below the best: within the band
    assert defer_placement(11, 100, 100, 10)


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
