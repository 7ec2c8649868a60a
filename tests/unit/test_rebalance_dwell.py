"""Plans against the dwell time: a giver whose connections all moved a moment ago.

Replays, on the pure rules, the `make demo` run (seed 303, load 8.6) that held 4/4/3/1 after
a fourth worker joined: the connections the giver held had all been moved by the plans of the
earlier phases, so it could not give (``choose_to_give``), and the dwell-blind plan named it
again every settling cycle. Each round below is one plan, carried out by the givers as
:class:`wsfleet_worker.rebalancing.Rebalancer` does (only connections outside the dwell).
"""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from wsfleet.rebalance import Move, WorkerLoad, apply_moves, in_band, plan_moves
from wsfleet_worker.rebalancing import choose_to_give

DWELL_MS = 600_000
BAND = 10

#: pk -> rebalanced_at_ms per worker, as the demo's run left them when w3 joined (t in ms).
DEMO_303 = {
    "w0": {"00": 42_000, "03": 42_000, "04": 42_000, "05": 42_000, "11": None},
    "w1-r1": {"06": 50_000, "02": 50_000, "07": 50_000, "01": 50_000},
    "w2-r1": {"08": 50_000, "09": 50_000, "10": 50_000},
    "w3": {},
}


def _loads(fleet: dict[str, dict[str, int | None]], now: int, *, report: bool) -> list[WorkerLoad]:
    """The workers as their heartbeats show them (``report``: with the movable count)."""
    return [
        WorkerLoad(
            wid,
            len(held),
            100,
            movable=len(choose_to_give(held, len(held), now_ms=now, dwell_ms=DWELL_MS))
            if report
            else None,
        )
        for wid, held in fleet.items()
    ]


def _carry_out(fleet: dict[str, dict[str, int | None]], moves: tuple[Move, ...], now: int) -> int:
    """Each giver gives what it may of its part; the moved connections are stamped."""
    moved = 0
    for move in moves:
        giver = fleet[move.giver]
        for pk in choose_to_give(giver, move.count, now_ms=now, dwell_ms=DWELL_MS):
            fleet[move.taker][pk] = now
            del giver[pk]
            moved += 1
    return moved


def _run(fleet: dict[str, dict[str, int | None]], *, report: bool, rounds: int = 5) -> list:
    """(plan, moved) per round, one plan every 8 s from t = 57 s as in the demo."""
    history = []
    for n in range(rounds):
        now = 57_000 + 8_000 * n
        moves = plan_moves(_loads(fleet, now, report=report), band_percent=BAND, max_moves=20)
        history.append((moves, _carry_out(fleet, moves, now)))
    return history


def _copy(fleet: dict[str, dict[str, int | None]]) -> dict[str, dict[str, int | None]]:
    return {wid: dict(held) for wid, held in fleet.items()}


def test_the_demo_stall_a_dwell_blind_plan_names_a_giver_that_cannot_give() -> None:
    # GIVEN the demo's fleet when w3 joined, planned without the movable counts (as before)
    history = _run(_copy(DEMO_303), report=False)
    # THEN w0 gives one of the two asked, then is asked for one, again and again, in vain
    assert history[0] == ((Move("w0", "w3", 2),), 1)
    assert all(entry == ((Move("w0", "w3", 1),), 0) for entry in history[1:])


def test_with_movable_counts_no_plan_asks_for_what_the_dwell_forbids() -> None:
    # GIVEN the same fleet, its workers reporting how many connections they may move
    fleet = _copy(DEMO_303)
    history = _run(fleet, report=True)
    # THEN w0 is asked for the one it may give, and after it nothing: every connection
    # left moved within the dwell, so the band (w3 >= 2) cannot be reached before it ends
    assert history[0] == ((Move("w0", "w3", 1),), 1)
    assert all(entry == ((), 0) for entry in history[1:])
    held = {wid: len(conns) for wid, conns in fleet.items()}
    assert held == {"w0": 4, "w1-r1": 4, "w2-r1": 3, "w3": 1}
    assert not in_band(_loads(fleet, 100_000, report=False), BAND)


def test_another_giver_gives_what_a_dwelling_one_cannot() -> None:
    # GIVEN w0 above its band holding only connections moved a moment ago, w1 above its
    # target holding connections that never moved, and an empty worker that joined
    fleet = {
        "w0": {f"a{n}": 50_000 for n in range(5)},
        "w1": {f"b{n}": None for n in range(5)},
        "w2": {"c0": None, "c1": None},
        "w3": {},
    }
    blind = _run(_copy(fleet), report=False)
    aware = _run(fleet, report=True)
    # THEN the dwell-blind plan keeps asking w0 (nothing) and w3 stays out of its band ...
    assert sum(moved for _, moved in blind) == 1
    assert all(Move("w0", "w3", 1) in moves for moves, _ in blind)
    # ... while with the movable counts w1 gives w3 its band, once, and planning stops
    assert aware[0] == ((Move("w1", "w3", 2),), 2)
    assert all(entry == ((), 0) for entry in aware[1:])
    assert {wid: len(conns) for wid, conns in fleet.items()} == {"w0": 5, "w1": 3, "w2": 2, "w3": 2}


fleets_with_dwell = st.lists(
    st.tuples(st.integers(0, 300), st.integers(0, 300)), min_size=2, max_size=12
).map(
    lambda ws: [
        WorkerLoad(f"w{i:02d}", held, 1000, movable=min(held, movable))
        for i, (held, movable) in enumerate(ws)
    ]
)


@settings(max_examples=300, deadline=None)
@given(fleets_with_dwell, st.integers(1, 50), st.sampled_from([0, 10, 25]))
def test_no_giver_is_asked_for_more_than_it_may_move(
    workers: list[WorkerLoad], max_moves: int, band_percent: int
) -> None:
    # GIVEN plans carried out one after the other (movable counts as the heartbeats say)
    gave: set[str] = set()
    took: set[str] = set()
    # each plan moves at least one connection, and what moved is no longer movable
    for _ in range(sum(w.movable or 0 for w in workers) + 1):
        moves = plan_moves(workers, band_percent=band_percent, max_moves=max_moves)
        if not moves:
            break
        movable = {w.worker_id: w.movable for w in workers}
        given_by: dict[str, int] = {}
        for move in moves:
            given_by[move.giver] = given_by.get(move.giver, 0) + move.count
        # THEN no giver is asked for more than it may move, nor more than the bound
        assert all(n <= min(max_moves, movable[g] or 0) for g, n in given_by.items())
        gave |= set(given_by)
        took |= {m.taker for m in moves}
        workers = apply_moves(workers, moves)
    else:
        raise AssertionError("plans did not end")
    # THEN planning ends, and no worker both gave and took: no back and forth
    assert not gave & took
