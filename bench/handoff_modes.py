"""Make-before-break beside break-before-make, in the same run (issue #26's evidence).

``python -m bench --only handoff-modes``. One local fleet on dynalite tables (SQS on moto), the
short lease profile. Its streams form *cohorts*: an upstream behaviour (a simulator shape and
session limit) times a hand-off mode (the per-connection option ``upstream.handoff``:
``break`` or ``overlap``). Every cohort lives through the same disruptions in the same run, so
the two modes are compared under the same load, the same signals and the same takers:

============================  ==========================================================
upstream behaviour            simulator
============================  ==========================================================
``live``                      ``live_only``: a session starts at the live frame; nothing
                              produced while nobody listened can be had again
``live-one-session``          ``live_only`` and a ``one`` session limit: a second handshake
                              is refused (409) while a session is open
``live-cut-first``            ``live_only`` and a ``cut_first`` limit: a second session is
                              accepted and the first is closed (1008)
``replay``                    ``plain``: replays from ``?from_seq=`` (the checkpoint)
============================  ==========================================================

Runs (each a few minutes):

* **drains** (``handoff-modes-drain-20``, ``-drain-1000``): every stream on worker 0; two peers
  join; worker 0 gets SIGTERM (a deploy drains it); once all flow again a fresh worker joins and
  worker 1 gets SIGTERM. Rebalancing is off, so only the drains move connections.
* **rebalance** (``handoff-modes-rebalance``): streams spread over 3 workers, 3 more join; the
  reconciler's plans move about half of them (REBALANCE_SECONDS 2 s).

Per cohort, after STOP (final checkpoints): **moves** (lease epochs taken after the streams
first flowed), **frames lost** (seqs between the first and the last stored that are not
stored: the messages table is the witness) and lost per move, the **gap reported** (the
record's ``gap_frames``: what ``GET /connections/{id}`` shows), and the **overlap at the
upstream**: pairs of sessions of one stream that were open together and for how long (the
simulator's session log; :func:`wsfleet_local.simulator.overlap_seconds`). Handshakes refused by
a one-session upstream are counted.

Targets (issue #26): ``live`` with ``overlap``: 0 lost per move, beside what ``break`` loses;
``live-one-session`` and ``live-cut-first``: gap reported == frames lost in both modes (overlap
falls back to break);
``replay``: 0 lost, 0 gap in both modes; ``break``: no overlap at the upstream.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .fleet_bench import _all_streaming, fleet_for_bench, stop_all, timings_for
from .harness import by_stream, percentiles, records_by_id
from .shapes import lost_seqs
from .waiting import WaitTimeout as BenchTimeout, wait_until

__all__ = [
    "BEHAVIOURS",
    "Cohort",
    "cohort_figures",
    "loses_nothing",
    "run_handoff_modes",
]

MODES = ("break", "overlap")


@dataclass(frozen=True)
class Behaviour:
    """How an upstream treats its clients: the simulator's shape and session limit, and the
    upstream options a user would give such a feed."""

    shape: str
    limit: str
    options: Mapping[str, Any]


BEHAVIOURS: dict[str, Behaviour] = {
    "live": Behaviour("live_only", "many", {"resume": "none"}),
    "live-one-session": Behaviour("live_only", "one", {"resume": "none"}),
    "live-cut-first": Behaviour("live_only", "cut_first", {"resume": "none"}),
    "replay": Behaviour("plain", "many", {}),
}


@dataclass(frozen=True)
class Cohort:
    behaviour: str
    mode: str
    ids: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.behaviour}/{self.mode}"


def _start(
    fleet: Any, behaviours: Sequence[str], modes: Sequence[str], per_cohort: int, run_id: str
) -> list[Cohort]:
    """Shape the simulator's streams, then START each through the API with its options."""
    from wsfleet_local.client import ApiClient

    api = ApiClient(fleet.api_url)
    simulator = fleet.simulator
    cohorts = []
    for behaviour in behaviours:
        spec = BEHAVIOURS[behaviour]
        for mode in modes:
            ids = tuple(f"{behaviour}-{mode}-{run_id}-{i}" for i in range(per_cohort))
            options = dict(spec.options) | {"handoff": mode}
            for stream_id in ids:
                simulator.set_shape(stream_id, spec.shape)
                simulator.limit_sessions(stream_id, spec.limit)
                api.start(stream_id, simulator.url_for(stream_id), upstream=options)
            cohorts.append(Cohort(behaviour, mode, ids))
    return cohorts


def _flowing_since(fleet: Any, ids: Iterable[str], since: float) -> bool:
    """Every stream has an open session, opened after ``since``, that has sent a frame."""
    grouped = by_stream(fleet.simulator.sessions())
    return all(
        any(s.opened_at > since and s.first_frame_at and s.is_open for s in grouped.get(i, []))
        for i in ids
    )


def cohort_figures(
    cohort: Cohort,
    *,
    records: Mapping[str, Any],
    epochs_before: Mapping[str, int],
    stored: Mapping[str, Sequence[int]],
    sessions: Mapping[str, Sequence[Any]],
    refusals: Mapping[str, int],
    end: float,
) -> dict[str, Any]:
    """The figures of one cohort (pure: everything read is passed in)."""
    from wsfleet_local.simulator import overlap_seconds

    moves = lost = gap = resumes = frames = 0
    overlaps: list[float] = []
    for stream_id in cohort.ids:
        record = records[stream_id]
        moves += record.lease_epoch - epochs_before[stream_id]
        seqs = list(stored.get(stream_id, ()))
        frames += len(seqs)
        lost += len(lost_seqs(seqs, max(seqs, default=0)))
        gap += record.gap_frames
        resumes += record.resume_gaps
        overlaps += [t for _, _, t in overlap_seconds(sessions.get(stream_id, ()), end)]
    stats = percentiles(overlaps)
    return {
        "streams": len(cohort.ids),
        "moves": moves,
        "frames_stored": frames,
        "frames_lost": lost,
        "lost_per_move": round(lost / moves, 1) if moves else None,
        "gap_frames_reported": gap,
        "gapped_resumes_reported": resumes,
        "upstream_overlaps": len(overlaps),
        "overlap_seconds": stats.to_dict() if stats else None,
        "refused_handshakes": sum(refusals.get(i, 0) for i in cohort.ids),
    }


def loses_nothing(figures: Mapping[str, Any]) -> bool:
    """Issue #26's 0-loss row: the cohort moved, and no frame is missing from what it stored."""
    return bool(figures["moves"] > 0 and figures["frames_lost"] == 0)


def _targets(per_cohort: Mapping[str, dict[str, Any]]) -> dict[str, bool]:
    """Issue #26's targets over the cohorts that ran."""
    met: dict[str, bool] = {}
    for name, f in per_cohort.items():
        behaviour, mode = name.split("/")
        if behaviour == "live" and mode == "overlap":
            met[name + ": 0 lost"] = loses_nothing(f)
        if behaviour in ("live-one-session", "live-cut-first"):
            met[name + ": gap reported == lost"] = f["gap_frames_reported"] == f["frames_lost"]
        if behaviour == "replay":
            met[name + ": 0 lost, 0 gap"] = f["frames_lost"] == 0 == f["gap_frames_reported"]
        if mode == "break":
            met[name + ": no overlap at the upstream"] = f["upstream_overlaps"] == 0
    return met


def _drains(fleet: Any, ids: list[str], heartbeat: float) -> None:
    """Worker 0 holds everything; two peers join; SIGTERM 0; a fresh one joins; SIGTERM 1."""
    for _ in range(2):
        fleet.add_worker()
    time.sleep(2 * heartbeat + 1)  # peers polling, their fleet view entries written
    for victim in (0, 1):
        worker_id = fleet.workers[victim].worker_id
        records = records_by_id(fleet)
        held = [i for i in ids if records[i].lease_owner == worker_id]
        signalled = time.time()
        fleet.kill_worker(victim, signal.SIGTERM)
        wait_until(functools.partial(_flowing_since, fleet, held, signalled), timeout=90,
                   interval=0.25,
                   message=f"every stream flowing again after worker {victim}'s drain")  # fmt: skip
        fleet.wait_worker_exit(victim, 30)
        if victim == 0:
            fleet.add_worker()
        time.sleep(2 * heartbeat + 1)


def _even(fleet: Any, ids: Sequence[str], workers: Sequence[str], capacity: int) -> bool:
    """Every worker holds its share of ``ids`` within the reconciler's band (10 %): the plans
    have nothing left to move."""
    from wsfleet.rebalance import WorkerLoad, in_band

    held = dict.fromkeys(workers, 0)
    for stream_id, record in records_by_id(fleet).items():
        if stream_id in ids and record.lease_owner in held:
            held[record.lease_owner] += 1
    if sum(held.values()) != len(ids):
        return False
    return in_band([WorkerLoad(w, n, capacity) for w, n in held.items()], 10.0)


def _rebalance(fleet: Any, ids: list[str], added: int, capacity: int, timeout: float) -> None:
    """``added`` workers join; wait until every worker holds its share."""
    for _ in range(added):
        fleet.add_worker()
    workers = list(fleet.worker_ids)
    wait_until(lambda: _even(fleet, ids, workers, capacity), timeout=timeout, interval=0.5,
               message="every worker to hold its share")  # fmt: skip


def run_handoff_modes(
    *,
    run_dir: Path,
    disruption: str = "drain",
    rate: float = 20.0,
    behaviours: Sequence[str] = tuple(BEHAVIOURS),
    per_cohort: int = 4,
    dynamodb: str = "dynalite",
) -> dict[str, Any]:
    """One run of the module docstring: ``disruption`` is ``drain`` or ``rebalance``."""
    from wsfleet.messages import MessageStore
    from wsfleet.record import connection_pk

    from .harness import aws_client

    modes = MODES
    rebalancing = disruption == "rebalance"
    workers = 3 if rebalancing else 1
    total = len(behaviours) * len(modes) * per_cohort
    timings = timings_for("short", max_connections=max(100, total))
    if rebalancing:  # the plans are what moves connections here (dwell: nothing moves twice)
        timings = replace(timings, rebalance_max_moves=None, rebalance_seconds=2.0)
    result: dict[str, Any] = {
        "benchmark": "handoff-modes",
        "disruption": disruption,
        "settings": {
            "lease_seconds": timings.lease_seconds,
            "heartbeat_seconds": timings.heartbeat_seconds,
            "frames_per_second_per_stream": rate,
            "streams_per_cohort": per_cohort,
            "workers": "3 -> 6" if rebalancing else "1 + 2, drain 0, + 1, drain 1",
            "dynamodb": dynamodb,
        },
        "modes": list(modes),
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
    }
    run_id = uuid.uuid4().hex[:4]
    with fleet_for_bench(workers=workers, timings=timings, rate=rate, run_dir=run_dir,
                         worker_env={}, dynamodb=dynamodb) as context:  # fmt: skip
        fleet = context.fleet
        cohorts = _start(fleet, behaviours, modes, per_cohort, run_id)
        ids = [i for c in cohorts for i in c.ids]
        try:
            wait_until(lambda: _all_streaming(fleet, ids), timeout=60 + total, interval=0.5,
                       message="every stream flowing")  # fmt: skip
            if rebalancing:  # the first workers' own evening out is not what is measured
                first = list(fleet.worker_ids)
                with contextlib.suppress(BenchTimeout):
                    wait_until(lambda: _even(fleet, ids, first, timings.max_connections),
                               timeout=60, interval=0.5)  # fmt: skip
            time.sleep(2 * timings.heartbeat_seconds + 1)
            epochs_before = {i: r.lease_epoch for i, r in records_by_id(fleet).items() if i in ids}
            if rebalancing:
                try:
                    _rebalance(fleet, ids, added=3, capacity=timings.max_connections,
                               timeout=180)  # fmt: skip
                except BenchTimeout as exc:  # what did move is still measured
                    result["not_even"] = str(exc)
                time.sleep(2 * timings.rebalance_seconds + 2 * timings.heartbeat_seconds)
            else:
                _drains(fleet, ids, timings.heartbeat_seconds)
            stop_all(fleet, ids, timeout=60 + total)
        except BenchTimeout as exc:
            result["error"] = str(exc)
            return result
        end = time.time()
        messages = MessageStore(
            aws_client("dynamodb", fleet.dynamodb_endpoint_url), fleet.resources.messages_table
        )
        stored = {
            i: [int(m["seq"]) for m in messages.read_all(connection_pk(i)) if m.get("seq")]
            for i in ids
        }
        simulator = fleet.simulator
        figures = {
            cohort.name: cohort_figures(
                cohort, records=records_by_id(fleet), epochs_before=epochs_before, stored=stored,
                sessions=by_stream(simulator.sessions()),
                refusals={i: simulator.limit_refusals(i) for i in cohort.ids}, end=end,
            )
            for cohort in cohorts
        }  # fmt: skip
    result["cohorts"] = figures
    met = _targets(figures)
    result["targets"] = met
    result["target_met"] = all(met.values())
    print(json.dumps(figures, indent=1))
    return result
