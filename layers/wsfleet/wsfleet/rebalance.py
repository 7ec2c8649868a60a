"""Rebalancing after a scale-out: each worker's target share and the moves that reach it.

Pure (no I/O, no clock): the reconciler feeds it the live workers' items (held connections,
capacity) once per pass, writes the result as the one ``FLEET#view`` item, and each worker
reads that item and carries out its own part (:mod:`wsfleet_worker.rebalancing`).

The rules:

* **Target share** (:func:`target_shares`): the connections held fleet-wide, split in
  proportion to capacity (largest remainder; ties to the lower worker id), never above a
  worker's capacity.
* **Tolerance band** (:func:`band`): a worker within ``band_percent`` of its target (at least
  one connection either way) is balanced. Nothing moves while every worker is.
* **Moves** (:func:`plan_moves`): once some worker is outside its band, connections go from
  workers above their target to workers below it, the ones outside their band first, only
  as many as it takes to bring every worker into its band, at most ``max_moves`` from any
  one giver per plan, and never more than a giver may move now (``movable``: its
  connections not moved within the dwell time, as its heartbeat reports them). A move never
  takes a giver below its target nor a taker above it, so a worker that gives never takes
  back in a later plan of the same fleet: no back and forth.
* **Settling** (:func:`settled`): a plan is made only once every worker of the previous plan
  has reported its held count after that plan was carried out (a heartbeat later), so a plan
  never acts on counts that do not show the previous one yet.

Example::

    >>> workers = [WorkerLoad("a", 100, 200), WorkerLoad("b", 100, 200), WorkerLoad("c", 0, 200)]
    >>> target_shares(workers)
    {'a': 67, 'b': 67, 'c': 66}
    >>> plan_moves(workers, band_percent=10, max_moves=20)
    (Move(giver='a', taker='c', count=20), Move(giver='b', taker='c', count=20))
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

_log = logging.getLogger(__name__)

__all__ = [
    "FLEET_VIEW_PK",
    "MAX_VIEW_MOVES",
    "FleetView",
    "Move",
    "WorkerLoad",
    "apply_moves",
    "band",
    "defer_placement",
    "in_band",
    "make_view",
    "plan_moves",
    "settled",
    "target_shares",
]


@dataclass(frozen=True)
class WorkerLoad:
    """One live worker as its item shows it: connections held and the most it may hold.

    ``movable``: how many of them it may give now, those not moved within the dwell time
    (None: not reported, all of them). Without it a plan could name, again and again, a
    giver whose connections all moved a moment ago, while another giver could have given.
    """

    worker_id: str
    held: int
    capacity: int
    joined_at_ms: int = 0
    movable: int | None = None

    @property
    def free(self) -> int:
        return max(0, self.capacity - self.held)


@dataclass(frozen=True)
class Move:
    """``giver`` hands ``count`` connections to ``taker``."""

    giver: str
    taker: str
    count: int


def target_shares(workers: Sequence[WorkerLoad]) -> dict[str, int]:
    """Each worker's share of the connections held fleet-wide, in proportion to capacity.

    The shares add up to the total held (or to the total capacity, if more is held than fits).

    >>> target_shares([WorkerLoad("a", 10, 100), WorkerLoad("b", 0, 300)])
    {'a': 3, 'b': 7}
    """
    ordered = sorted(workers, key=lambda w: w.worker_id)
    capacity = sum(max(0, w.capacity) for w in ordered)
    if capacity <= 0:
        return {w.worker_id: 0 for w in ordered}
    total = min(sum(max(0, w.held) for w in ordered), capacity)
    exact = {w.worker_id: total * max(0, w.capacity) / capacity for w in ordered}
    shares = {wid: math.floor(share) for wid, share in exact.items()}
    left = total - sum(shares.values())
    # Largest remainder; ties go to the lower id, so every reader computes the same shares.
    by_remainder = sorted(ordered, key=lambda w: (-(exact[w.worker_id] % 1), w.worker_id))
    for worker in by_remainder[:left]:
        shares[worker.worker_id] += 1
    return shares


def band(target: int, band_percent: float) -> tuple[int, int]:
    """The held counts a worker with ``target`` counts as balanced at: target -/+ the band
    (``band_percent`` of the target, at least one connection).

    >>> band(50, 10), band(4, 10)
    ((45, 55), (3, 5))
    """
    slack = max(1, math.floor(target * band_percent / 100))
    return max(0, target - slack), target + slack


def in_band(workers: Sequence[WorkerLoad], band_percent: float) -> bool:
    """Whether every worker holds a count within its band (nothing to move)."""
    shares = target_shares(workers)
    for worker in workers:
        low, high = band(shares[worker.worker_id], band_percent)
        if not low <= worker.held <= high:
            return False
    return True


def _allot(amount: int, wants: Sequence[tuple[str, int, int]]) -> dict[str, int]:
    """Split ``amount`` over ``(id, must, may)`` entries one connection at a time, each to the
    entry with the most left of its ``must`` (then of its ``may``): the counts even out
    instead of one worker taking everything. Ids break ties."""
    allotted = {wid: 0 for wid, _, _ in wants}
    for caps in ({w: must for w, must, _ in wants}, {w: may for w, _, may in wants}):
        heap = [(-(cap - allotted[wid]), wid, cap) for wid, cap in caps.items()]
        heap = [entry for entry in heap if entry[0] < 0]
        heapq.heapify(heap)
        while amount > 0 and heap:
            _, wid, cap = heapq.heappop(heap)
            allotted[wid] += 1
            amount -= 1
            if allotted[wid] < cap:
                heapq.heappush(heap, (-(cap - allotted[wid]), wid, cap))
    return allotted


def plan_moves(
    workers: Sequence[WorkerLoad], *, band_percent: float, max_moves: int
) -> tuple[Move, ...]:
    """The moves that bring every worker into its band (see the module docstring).

    Deterministic: the same workers give the same plan whatever their order. Empty when
    everyone is within its band, or ``max_moves`` is 0 (rebalancing off).
    """
    if max_moves <= 0 or len(workers) < 2:
        return ()
    shares = target_shares(workers)
    givers: list[tuple[str, int, int]] = []  # (id, must give, may give)
    takers: list[tuple[str, int, int]] = []
    for worker in workers:
        target = shares[worker.worker_id]
        low, high = band(target, band_percent)
        if worker.held > target:
            may = worker.held - target
            if worker.movable is not None:
                may = min(may, max(0, worker.movable))
            givers.append((worker.worker_id, min(may, max(0, worker.held - high)), may))
        elif worker.held < target:
            takers.append((worker.worker_id, max(0, low - worker.held), target - worker.held))
    must = max(sum(g[1] for g in givers), sum(t[1] for t in takers))
    if must == 0:
        return ()
    # At most max_moves from each giver: cap what it may give (its must is capped too).
    givers = [(wid, min(m, max_moves), min(may, max_moves)) for wid, m, may in givers]
    amount = min(must, sum(g[2] for g in givers), sum(t[2] for t in takers))
    gives = _allot(amount, givers)
    takes = _allot(amount, takers)
    moves: list[Move] = []
    taker_order = sorted((wid for wid, n in takes.items() if n), key=lambda w: (-takes[w], w))
    for giver in sorted((wid for wid, n in gives.items() if n), key=lambda w: (-gives[w], w)):
        left = gives[giver]
        for taker in taker_order:
            step = min(left, takes[taker])
            if step <= 0:
                continue
            moves.append(Move(giver, taker, step))
            takes[taker] -= step
            left -= step
            if left == 0:
                break
    return tuple(moves)


def apply_moves(workers: Sequence[WorkerLoad], moves: Iterable[Move]) -> list[WorkerLoad]:
    """The workers as they stand once ``moves`` are carried out (tests and the bench model)."""
    delta: dict[str, int] = {}
    for move in moves:
        delta[move.giver] = delta.get(move.giver, 0) - move.count
        delta[move.taker] = delta.get(move.taker, 0) + move.count
    # What a giver gave is no longer its to give; what a taker took has just moved (dwell).
    return [
        replace(
            w,
            held=w.held + delta.get(w.worker_id, 0),
            movable=None if w.movable is None else w.movable + min(0, delta.get(w.worker_id, 0)),
        )
        for w in workers
    ]


def settled(
    previous_at_ms: int | None,
    previous_moves: Iterable[Move],
    heartbeats: Mapping[str, int],
    *,
    act_ms: int,
) -> bool:
    """Whether the held counts now show the previous plan carried out.

    Workers carry a plan out within ``act_ms`` of its making (their REBALANCE_SECONDS and the
    hand-off); a count reported by a heartbeat after that includes it. A worker of the
    previous plan that is gone no longer matters.

    >>> settled(1_000, [Move("a", "b", 3)], {"a": 12_000, "b": 9_000}, act_ms=10_000)
    False
    """
    if previous_at_ms is None:
        return True
    after = previous_at_ms + act_ms
    for move in previous_moves:
        for wid in (move.giver, move.taker):
            beat = heartbeats.get(wid)
            if beat is not None and beat <= after:
                return False
    return True


def defer_placement(
    held: int, capacity: int, *, fleet_held: int, fleet_capacity: int, band_percent: float
) -> bool:
    """Whether a worker should let less loaded peers take new work first: it holds (now) more
    than its share of the fleet's load (as of the fleet view) plus the band.

    Two idle workers and a burst of STARTs: each takes two at most before the other is
    preferred (share 0, band one connection), instead of whoever polls first taking most.

    >>> defer_placement(2, 100, fleet_held=0, fleet_capacity=200, band_percent=10)
    True
    >>> defer_placement(55, 100, fleet_held=100, fleet_capacity=200, band_percent=10)
    False
    """
    share = fleet_held * capacity / fleet_capacity if fleet_capacity > 0 else 0.0
    return held > share + max(1, math.floor(share * band_percent / 100))


# ---------------------------------------------------------------------------- the fleet view
#: The one item the reconciler writes per pass and every worker reads per REBALANCE_SECONDS.
FLEET_VIEW_PK = "FLEET#view"
#: Moves one view carries at most: the item stays a few KB (one read unit or two) whatever
#: the fleet's size; moves left out are planned again once this plan has settled.
MAX_VIEW_MOVES = 100


@dataclass(frozen=True)
class FleetView:
    """What a worker needs to know about the fleet, in one small item.

    ``plan_at_ms``: when ``moves`` were planned (a worker carries a plan out once, and only
    within REBALANCE_SECONDS of it: see :func:`settled`); ``targets``: the share of each
    worker named in a move; ``queues``: the control queue of each taker, where its hand-off
    hints go; ``best_free``: the most free capacity any live worker has.
    """

    at_ms: int
    plan_at_ms: int = 0
    workers: int = 0
    held: int = 0
    capacity: int = 0
    best_free: int = 0
    moves: tuple[Move, ...] = ()
    targets: Mapping[str, int] = field(default_factory=dict)
    queues: Mapping[str, str] = field(default_factory=dict)

    def moves_from(self, worker_id: str) -> tuple[Move, ...]:
        return tuple(m for m in self.moves if m.giver == worker_id)

    def to_item(self) -> dict[str, Any]:
        return {
            "pk": FLEET_VIEW_PK,
            "at_ms": self.at_ms,
            "plan_at_ms": self.plan_at_ms,
            "workers": self.workers,
            "held": self.held,
            "capacity": self.capacity,
            "best_free": self.best_free,
            "moves": [[m.giver, m.taker, m.count] for m in self.moves],
            "targets": dict(self.targets),
            "queues": dict(self.queues),
        }

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> FleetView:
        """ValueError (only) for an item that is not a well-formed view (it is data anyone
        with write access to the table could have put there)."""
        try:
            moves = tuple(
                Move(str(giver), str(taker), int(count))
                for giver, taker, count in item.get("moves") or []
            )
            view = cls(
                at_ms=int(item["at_ms"]),
                plan_at_ms=int(item.get("plan_at_ms", 0)),
                workers=int(item.get("workers", 0)),
                held=int(item.get("held", 0)),
                capacity=int(item.get("capacity", 0)),
                best_free=int(item.get("best_free", 0)),
                moves=moves[:MAX_VIEW_MOVES],
                targets={str(k): int(v) for k, v in (item.get("targets") or {}).items()},
                queues={str(k): str(v) for k, v in (item.get("queues") or {}).items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a fleet view: {exc}") from None
        if any(m.count <= 0 for m in view.moves):
            raise ValueError("not a fleet view: a move of no connections")
        return view

    @classmethod
    def parse(cls, item: Mapping[str, Any] | None) -> FleetView | None:
        """The view in a stored item; None for no item, and for a malformed one, which is
        logged (a bad view must not stop rebalancing for good, nor pass without a trace)."""
        if not item:
            return None
        try:
            return cls.from_item(item)
        except ValueError as exc:
            _log.warning("fleet view ignored: %s", exc)
            return None


def make_view(
    workers: Sequence[WorkerLoad],
    *,
    now_ms: int,
    queues: Mapping[str, str],
    heartbeats: Mapping[str, int],
    previous: FleetView | None,
    band_percent: float,
    max_moves: int,
    act_ms: int,
) -> FleetView:
    """The view the reconciler writes this pass.

    A new plan is made once the previous one has :func:`settled`; until then the previous
    plan stays in the view unchanged (workers have carried it out already: they act on a
    ``plan_at_ms`` once). ``queues``: each worker's control queue URL.

    >>> loads = [WorkerLoad("a", 10, 100), WorkerLoad("b", 0, 100)]
    >>> view = make_view(loads, now_ms=5, queues={"b": "q-b"}, heartbeats={}, previous=None,
    ...                  band_percent=10, max_moves=20, act_ms=1)
    >>> view.moves, dict(view.queues), view.best_free
    ((Move(giver='a', taker='b', count=4),), {'b': 'q-b'}, 100)
    """
    plan_at = now_ms
    moves: tuple[Move, ...]
    if previous is not None and previous.moves and not settled(
        previous.plan_at_ms, previous.moves, heartbeats, act_ms=act_ms
    ):
        plan_at, moves = previous.plan_at_ms, previous.moves
    else:
        moves = plan_moves(workers, band_percent=band_percent, max_moves=max_moves)
    moves = moves[:MAX_VIEW_MOVES]
    shares = target_shares(workers)
    named = {m.giver for m in moves} | {m.taker for m in moves}
    return FleetView(
        at_ms=now_ms,
        plan_at_ms=plan_at,
        workers=len(workers),
        held=sum(w.held for w in workers),
        capacity=sum(w.capacity for w in workers),
        best_free=max((w.free for w in workers), default=0),
        moves=moves,
        targets={wid: shares[wid] for wid in sorted(named) if wid in shares},
        queues={m.taker: queues[m.taker] for m in moves if queues.get(m.taker)},
    )
