"""Rebalancing after a scale-out (issue 14, part 2): N connections on W workers, W more join.

The fleet runs the template's production cadences (lease 20 s, heartbeat 5 s, reconcile pass
10 s, REBALANCE_SECONDS 10, REBALANCE_MAX_MOVES 20, REBALANCE_BAND_PERCENT 10); the tables on
dynalite when it is installed (SQS on moto). Steps:

1. W workers; N connections STARTed through the API; wait until all stream (and, bounded,
   until the W hold their even share: rebalancing among them counts as "before").
2. W workers more join (``t0`` = just before the first is started).
3. Measured until every worker holds its share +/- 10 % (``seconds_to_even``), then two more
   plan cycles to see that nothing else moves:

   * ``moves``: connections whose owner changed after ``t0`` (lease epoch + 1 per acquire);
     ``moved_twice``: more than one acquire after ``t0``;
   * hand-off gap per move, from the upstream's session log: the old session's close to the
     new session's first frame (``gap_seconds``), and to its open (``reconnect_seconds``);
   * loss and duplicates: every stream STOPped, the messages table audited
     (:func:`bench.fleet_bench.audit`).

Target: even within 120 s, every gap < 1 s, 0 lost, 0 moved twice.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from pathlib import Path
from typing import Any

from .fleet_bench import _all_streaming, _start_streams, audit, fleet_for_bench, stop_all
from .harness import by_stream, percentiles, records_by_id
from .waiting import WaitTimeout as BenchTimeout, wait_until

__all__ = ["run_rebalance"]

BAND_PERCENT = 10.0


def _spread(records: dict[str, Any], ids: list[str], workers: list[str]) -> dict[str, int]:
    held = dict.fromkeys(workers, 0)
    for stream_id in ids:
        owner = records[stream_id].lease_owner if stream_id in records else ""
        if owner in held:
            held[owner] += 1
    return held


def _even(held: dict[str, int], total: int) -> bool:
    share = total / len(held)
    return all(abs(n - share) <= share * BAND_PERCENT / 100 for n in held.values())


def run_rebalance(
    *,
    connections: int = 300,
    workers: int = 3,
    added: int = 3,
    rate: float = 1.0,
    run_dir: Path,
    dynamodb: str = "dynalite",
    settle_seconds: float = 30.0,
) -> dict[str, Any]:
    """Scale ``workers`` holding ``connections`` out by ``added``; see the module docstring."""
    from wsfleet_local.fleet import FleetTimings

    timings = FleetTimings(
        lease_seconds=20.0,
        heartbeat_seconds=5.0,
        lease_safety_margin_seconds=2.0,
        reconcile_pass_seconds=10.0,
        drain_timeout_seconds=20.0,
        queue_wait_seconds=20,
        checkpoint_seconds=600.0,
        sweep_seconds=30.0,
        max_connections=max(100, connections),
        rebalance_seconds=10.0,
    )
    ids = [f"rb{connections}-{i:03d}" for i in range(connections)]
    result: dict[str, Any] = {
        "benchmark": "rebalance",
        "connections": connections,
        "settings": {
            "workers_before": workers,
            "workers_after": workers + added,
            "lease_seconds": timings.lease_seconds,
            "heartbeat_seconds": timings.heartbeat_seconds,
            "reconcile_pass_seconds": timings.reconcile_pass_seconds,
            "rebalance_seconds": timings.rebalance_seconds,
            "rebalance_max_moves": 20,
            "rebalance_band_percent": BAND_PERCENT,
            "max_connections": timings.max_connections,
            "frames_per_second_per_stream": rate,
            "dynamodb": dynamodb,
        },
        "target": "every worker within its share +/- 10 % in <= 120 s; gap < 1 s; 0 lost; "
                  "0 moved twice",
    }
    with fleet_for_bench(
        workers=workers, timings=timings, rate=rate, run_dir=run_dir, worker_env={},
        dynamodb=dynamodb,
    ) as context:
        fleet = context.fleet
        _start_streams(fleet, ids)
        wait_until(
            lambda: _all_streaming(fleet, ids),
            timeout=120 + connections * 0.5,
            interval=1.0,
            message=f"{connections} streams on {workers} workers",
        )
        first = list(fleet.worker_ids)
        with contextlib.suppress(BenchTimeout):  # measured from here anyway ("before" says how)
            wait_until(
                lambda: _even(_spread(records_by_id(fleet), ids, first), connections),
                timeout=180, interval=1.0, message="the first workers to hold even shares",
            )
        before = records_by_id(fleet)
        result["spread_before"] = _spread(before, ids, first)
        t0 = time.time()
        for _ in range(added):
            fleet.add_worker()
        everyone = list(fleet.worker_ids)
        result["workers_joined_seconds"] = round(time.time() - t0, 2)
        try:
            wait_until(
                lambda: _even(_spread(records_by_id(fleet), ids, everyone), connections),
                timeout=300, interval=0.5, message="every worker to hold its share +/- 10 %",
            )
            result["seconds_to_even"] = round(time.time() - t0, 1)
        except BenchTimeout as exc:
            result["error"] = str(exc)
        time.sleep(settle_seconds)  # more plan cycles: nothing else should move
        after = records_by_id(fleet)
        result["spread_after"] = _spread(after, ids, everyone)
        epochs = {i: after[i].lease_epoch - before[i].lease_epoch for i in ids}
        moved = [i for i in ids if epochs[i] >= 1]
        result["moves"] = len(moved)
        result["moved_twice"] = sum(1 for i in ids if epochs[i] >= 2)
        result["lease_epochs_after_t0"] = {str(k): sum(1 for v in epochs.values() if v == k)
                                           for k in sorted(set(epochs.values()))}
        gaps, reconnects = [], []
        grouped = by_stream(fleet.simulator.sessions())
        for stream_id in moved:
            sessions = grouped.get(stream_id, [])
            for old, new in itertools.pairwise(sessions):
                if new.opened_at < t0 or old.closed_at is None:
                    continue
                reconnects.append(new.opened_at - old.closed_at)
                if new.first_frame_at is not None:
                    gaps.append(new.first_frame_at - old.closed_at)
        gap_stats, reconnect_stats = percentiles(gaps), percentiles(reconnects)
        result["gap_seconds"] = gap_stats.to_dict() if gap_stats else None
        result["reconnect_seconds"] = reconnect_stats.to_dict() if reconnect_stats else None
        stop_all(fleet, ids, timeout=60 + connections)
        result["audit"] = audit(fleet, ids)
    gap_max = result["gap_seconds"]["max"] if result.get("gap_seconds") else None
    result["target_met"] = bool(
        result.get("seconds_to_even") is not None
        and result["seconds_to_even"] <= 120
        and gap_max is not None and gap_max < 1.0
        and result["audit"]["lost"] == 0
        and result["moved_twice"] == 0
    )
    return result
