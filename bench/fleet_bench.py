"""Benchmarks on a running local fleet: crash failover, graceful hand-off, STOP latency, loss.

Each run starts its own :class:`~bench.faults.FaultyFleet` (no faults injected), so
runs do not disturb each other:

Runs use the embedded moto server for DynamoDB and SQS, or (``dynamodb="dynalite"``) dynalite
for DynamoDB: a concurrent implementation that shows what the serialised moto server costs.

* **crash / handoff** (``disruption``): one worker alone receives K connections (START through
  the API) and streams them all; then peers join; the lone worker gets SIGKILL (crash) or
  SIGTERM (graceful hand-off). For every connection, the time from the signal to the first
  frame the upstream sent to a session opened after the signal (the simulator's session log:
  ``first_frame_at``) is the failover time. A crash is noticed through the dead worker's
  *worker lease* (lease model v2: one ``WORKER#`` item per worker, no expiry on connection
  items): it expires a lease after its last renewal, the reconciler's early hints land in its
  last second and the peers take over at the expiry. A hand-off moves every connection at
  once (make-before-break where it can, docs/handoff.md); its run also probes the rig's SQS
  hop floor (:mod:`bench.hop_probe`) and times each stream's store stall
  (:func:`bench.handoff_stages.store_stalls`). With ``task_events`` the fleet publishes the
  killed process's exit as its ECS task state change event (as ECS does when a container
  stops): the task exit function kills the worker's lease at once and hints its connections,
  so a crash fails over in about a second instead of a lease
  (``crash-default-100-dynalite-exit`` beside the lease-bound
  ``crash-default-100-dynalite``). Afterwards every connection is STOPped through the API (the
  STOP writes the final checkpoint, so the audit covers every frame up to the STOP, not only up
  to the last periodic checkpoint, which is every ``CHECKPOINT_SECONDS``) and the messages table is
  audited (:func:`wsfleet_local.audit.audit_stream`): every seq up to the record's checkpoint
  stored exactly once with its own content, no frame under an older epoch after a newer one,
  and no two upstream sessions of one stream open at the same time (no tolerance: a fenced
  or crashed owner and the new one never stream side by side).
* **STOP latency** (``stop_latency``): N streams spread over the workers; STOP each through the
  API (0.2 s apart) and time API call -> the upstream saw the socket close (``closed_at``).
  With the control channel (DynamoDB Streams -> notifier -> the owner's control queue) and
  without it (``WORKER_CONTROL_CHANNEL=false``: the worker's sweep, every
  ``WORKER_SWEEP_SECONDS``, reads its connections from ``gsi_owner`` and ends the STOPPED ones).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from .harness import by_stream, percentiles, records_by_id
from .waiting import WaitTimeout as BenchTimeout, wait_until

__all__ = [
    "Profile",
    "audit",
    "audit_streams",
    "first_frames_after",
    "fleet_for_bench",
    "run_disruption",
    "run_stop_latency",
    "timings_for",
]


#: Issue #14: a crash fails over within this (p99, K = 100) when the exit event is delivered.
EXIT_EVENT_TARGET_SECONDS = 2.0
#: Issue #26: a graceful hand-off stores each stream's first frame on the taker within this
#: (p99, K = 100, from the giver's SIGTERM).
HANDOFF_TARGET_SECONDS = 0.5
#: How long the hop probe measures the idle rig before a hand-off run starts its streams.
PROBE_IDLE_SECONDS = 5.0


def store_worker(fleet: Any, worker_id: str) -> Any:
    """The worker item of ``worker_id`` (consistent read), or None."""
    from wsfleet.store import DynamoDBLeaseStore

    from .harness import aws_client

    client = aws_client("dynamodb", fleet.dynamodb_endpoint_url, fleet.resources.region)
    return DynamoDBLeaseStore(client, fleet.resources.connections_table).get_worker(
        worker_id, consistent=True
    )


class Profile:
    """Lease settings of a run: the production defaults, or short local ones."""

    #: lease 20 s, heartbeat 5 s, margin 2 s, reconcile pass 10 s, CHECKPOINT_SECONDS 600,
    #: WORKER_SWEEP_SECONDS 30: the template's defaults
    DEFAULT = "default"
    SHORT = "short"  # lease 4 s, heartbeat 1 s, margin 1 s, reconcile pass 1 s
    #: lease 8 s, heartbeat 2 s: a short-lease K = 100 run on the serialised moto server (v1
    #: renewed every connection, 100 renewals/s at heartbeat 1 s; kept for comparison)
    MEDIUM = "medium"


class _ProfileTimings(TypedDict):
    """FleetTimings keywords of a profile, typed so ``FleetTimings(**timings)`` is checked."""

    lease_seconds: float
    heartbeat_seconds: float
    lease_safety_margin_seconds: float
    reconcile_pass_seconds: float
    drain_timeout_seconds: float
    queue_wait_seconds: int
    checkpoint_seconds: NotRequired[float]
    sweep_seconds: NotRequired[float]


#: Each profile's FleetTimings (those not named keep FleetTimings' defaults).
_PROFILE_TIMINGS: dict[str, _ProfileTimings] = {
    Profile.DEFAULT: {
        "lease_seconds": 20.0,
        "heartbeat_seconds": 5.0,
        "lease_safety_margin_seconds": 2.0,
        "reconcile_pass_seconds": 10.0,
        "drain_timeout_seconds": 20.0,
        "queue_wait_seconds": 20,
        "checkpoint_seconds": 600.0,
        "sweep_seconds": 30.0,
    },
    Profile.MEDIUM: {
        "lease_seconds": 8.0,
        "heartbeat_seconds": 2.0,
        "lease_safety_margin_seconds": 1.0,
        "reconcile_pass_seconds": 2.0,
        "drain_timeout_seconds": 10.0,
        "queue_wait_seconds": 2,
    },
    Profile.SHORT: {
        "lease_seconds": 4.0,
        "heartbeat_seconds": 1.0,
        "lease_safety_margin_seconds": 1.0,
        "reconcile_pass_seconds": 1.0,
        "drain_timeout_seconds": 10.0,
        "queue_wait_seconds": 2,
    },
}


def timings_for(profile: str, *, max_connections: int, queue_wait: int | None = None) -> Any:
    """The profile's timings (an unknown profile runs SHORT), for ``max_connections`` each."""
    from wsfleet_local.fleet import FleetTimings

    timings = _PROFILE_TIMINGS.get(profile, _PROFILE_TIMINGS[Profile.SHORT]).copy()
    if queue_wait is not None:
        timings["queue_wait_seconds"] = queue_wait
    return FleetTimings(
        **timings,
        max_connections=max_connections,
        rebalance_max_moves=0,  # nothing moves but what the disruption moves
    )


def _timings_dict(timings: Any) -> dict[str, Any]:
    return {
        "lease_seconds": timings.lease_seconds,
        "heartbeat_seconds": timings.heartbeat_seconds,
        "safety_margin_seconds": timings.lease_safety_margin_seconds,
        "reconcile_pass_seconds": timings.reconcile_pass_seconds,
        "queue_wait_seconds": timings.queue_wait_seconds,
        "checkpoint_seconds": timings.checkpoint_seconds,
        "sweep_seconds": timings.sweep_seconds,
    }


class _PlainFleet:
    """A LocalFleet with the FaultyFleet shape (``.fleet``), without the proxy hop.

    Latency runs use it: the proxy is a test instrument, not part of the product, and each
    hop through it costs a little on a loaded machine.
    """

    def __init__(self, **options: Any) -> None:
        from wsfleet_local.fleet import LocalFleet

        self.fleet = LocalFleet(**options)

    def __enter__(self) -> _PlainFleet:
        self.fleet.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.fleet.stop()


def fleet_for_bench(
    *,
    workers: int,
    timings: Any,
    rate: float,
    run_dir: Path,
    worker_env: Mapping[str, str],
    proxied: bool = False,
    dynamodb: str = "moto",
    task_events: bool = False,
) -> Any:
    """A fleet context (``.fleet``); ``proxied``: workers go through the counting proxy;
    ``dynamodb``: where the tables are (``moto`` or ``dynalite``, :mod:`bench.dynalite`);
    ``task_events``: worker exits reach the task exit function (off: the lease-bound path)."""
    # WSFLEET_BENCH_WORKER_LOG_LEVEL=DEBUG keeps every worker log line (where a run's time went).
    level = os.environ.get("WSFLEET_BENCH_WORKER_LOG_LEVEL", "WARNING")
    env = {"POWERTOOLS_LOG_LEVEL": level, **worker_env}
    if proxied:
        from bench.faults import FaultyFleet

        return FaultyFleet(
            workers=workers, timings=timings, rate=rate, run_dir=run_dir, extra_worker_env=env
        )
    from bench.dynalite import tables_service

    return _PlainFleet(
        workers=workers, timings=timings, rate=rate, run_dir=run_dir, extra_worker_env=env,
        tables=tables_service(dynamodb), task_events=task_events,
    )


def _start_streams(fleet: Any, ids: list[str]) -> None:
    from wsfleet_local.client import ApiClient

    api = ApiClient(fleet.api_url)
    simulator = fleet.simulator
    for stream_id in ids:
        api.start(stream_id, simulator.url_for(stream_id))


def _all_streaming(fleet: Any, ids: list[str], owners: set[str] | None = None) -> bool:
    """Every stream owned (by one of ``owners``) and flowing: an open upstream session that
    has sent a frame. (v2: a checkpoint is written only every CHECKPOINT_SECONDS, so
    ``last_seq`` no longer tells a streaming connection; the simulator's session log does.)"""
    flowing = {s.stream_id for s in fleet.simulator.sessions() if s.is_open and s.first_frame_at}
    if not all(i in flowing for i in ids):
        return False
    records = records_by_id(fleet)
    for stream_id in ids:
        record = records.get(stream_id)
        if record is None or not record.lease_owner:
            return False
        if owners is not None and record.lease_owner not in owners:
            return False
    return True


def first_frames_after(fleet: Any, ids: Sequence[str], at: float) -> dict[str, float] | None:
    """Seconds from ``at`` to the first frame of a session opened after it, per stream (the
    simulator's session log); None until every stream in ``ids`` has one."""
    grouped = by_stream(fleet.simulator.sessions())
    found: dict[str, float] = {}
    for stream_id in ids:
        firsts = [
            s.first_frame_at
            for s in grouped.get(stream_id, [])
            if s.opened_at > at and s.first_frame_at is not None
        ]
        if not firsts:
            return None
        found[stream_id] = min(firsts) - at
    return found


def stop_all(fleet: Any, ids: list[str], timeout: float = 120) -> None:
    """STOP every stream through the API and wait until each is STOPPED, free and its
    upstream socket closed: the STOP writes the final checkpoint, which the audit relies on."""
    from wsfleet_local.client import ApiClient

    api = ApiClient(fleet.api_url)
    for stream_id in ids:
        api.stop(stream_id)

    def settled() -> bool:
        grouped = by_stream(fleet.simulator.sessions())
        if any(s.is_open for i in ids for s in grouped.get(i, [])):
            return False
        records = records_by_id(fleet)
        return all(
            records[i].desired_state.value == "STOPPED" and not records[i].lease_owner
            for i in ids
        )

    wait_until(settled, timeout=timeout, interval=0.5, message="every stream STOPPED and released")


def stored_items(fleet: Any, ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Every stored frame of each stream in ``ids`` (the messages table, consistent reads)."""
    from wsfleet.messages import MessageStore
    from wsfleet.record import connection_pk

    from .harness import aws_client

    messages = MessageStore(
        aws_client("dynamodb", fleet.dynamodb_endpoint_url), fleet.resources.messages_table
    )
    return {stream_id: messages.read_all(connection_pk(stream_id)) for stream_id in ids}


def audit_streams(
    fleet: Any,
    ids: list[str],
    records: Mapping[str, Any] | None = None,
    items: Mapping[str, list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """Each stream's :class:`wsfleet_local.audit.StreamAudit`: every seq up to its record's
    checkpoint (``records`` if given, else the table's now) against the messages table
    (``items`` if given: :func:`stored_items` read after the streams settled) and the
    upstream's session log."""
    from wsfleet_local.audit import audit_stream

    records = records if records is not None else records_by_id(fleet)
    items = items if items is not None else stored_items(fleet, ids)
    sessions = by_stream(fleet.simulator.sessions())
    return {
        stream_id: audit_stream(
            stream_id,
            final_seq=records[stream_id].last_seq,
            ended=False,
            checkpointed=records[stream_id].last_seq,
            items=items[stream_id],
            sessions=sessions.get(stream_id, []),
        )
        for stream_id in ids
    }


def audit(
    fleet: Any, ids: list[str], items: Mapping[str, list[dict[str, Any]]] | None = None
) -> dict[str, Any]:
    """Loss and duplicates over ``ids`` (:func:`audit_streams`), summed."""
    totals: dict[str, Any] = {"streams": len(ids), "checkpointed": 0, "stored": 0, "lost": 0,
              "wrong_content": 0, "stale_epoch": 0, "overlapping_sessions": 0,
              "replay_gaps": 0, "streams_with_problems": []}  # fmt: skip
    for stream_id, result in audit_streams(fleet, ids, items=items).items():
        totals["checkpointed"] += result.checkpointed
        totals["stored"] += result.stored
        totals["lost"] += result.lost
        totals["wrong_content"] += len(result.corrupt)
        totals["stale_epoch"] += len(result.stale_epoch)
        totals["overlapping_sessions"] += result.overlapping_sessions
        totals["replay_gaps"] += result.replay_gaps
        if result.lost or result.duplicated or result.replay_gaps:  # overlaps: no tolerance
            totals["streams_with_problems"].append(stream_id)
    totals["ok"] = not totals["streams_with_problems"]
    return totals


def _breakdown(fleet: Any, ids: list[str], signalled_at: float) -> dict[str, Any]:
    """Where a failover's time went, per stream, from the upstream's session log (seconds
    after the signal): the old session closed, the new one opened (acquire + connect), its
    first frame (the failover figure). Percentiles of each."""
    grouped = by_stream(fleet.simulator.sessions())
    closed, opened = [], []
    for stream_id in ids:
        sessions = grouped.get(stream_id, [])
        old = [s.closed_at for s in sessions if s.opened_at <= signalled_at and s.closed_at]
        new = [s.opened_at for s in sessions if s.opened_at > signalled_at]
        if old:
            closed.append(max(old) - signalled_at)
        if new:
            opened.append(min(new) - signalled_at)
    figures = {"old_session_closed": percentiles(closed), "new_session_opened": percentiles(opened)}
    return {name: stats.to_dict() for name, stats in figures.items() if stats is not None}


def run_disruption(
    kind: str,
    *,
    connections: int,
    profile: str,
    rate: float,
    run_dir: Path,
    peers: int = 2,
    dynamodb: str = "moto",
    task_events: bool = False,
) -> dict[str, Any]:
    """SIGKILL (``kind="crash"``) or SIGTERM (``"handoff"``) a worker holding ``connections``;
    ``task_events``: its exit event reaches the task exit function (crash failover in seconds)."""
    signum = signal.SIGKILL if kind == "crash" else signal.SIGTERM
    handoff = kind == "handoff"
    # A hand-off's stages are stamped by the workers' DEBUG lines (bench/handoff_stages.py).
    worker_env = {"POWERTOOLS_LOG_LEVEL": "DEBUG"} if handoff else {}
    timings = timings_for(profile, max_connections=max(100, connections))
    lease = timings.lease_seconds
    ids = [f"{kind[0]}{profile[0]}{connections}-{i:03d}" for i in range(connections)]
    result: dict[str, Any] = {
        "benchmark": kind,
        "connections": connections,
        "profile": profile,
        "settings": {
            **_timings_dict(timings),
            "frames_per_second_per_stream": rate,
            "workers": 1 + peers,
            "dynamodb": dynamodb,
            "task_exit_events": task_events,
        },
    }
    with fleet_for_bench(
        workers=1, timings=timings, rate=rate, run_dir=run_dir, worker_env=worker_env,
        dynamodb=dynamodb, task_events=task_events,
    ) as faulty, contextlib.ExitStack() as stack:
        fleet = faulty.fleet
        victim = fleet.workers[0]
        # A hand-off's SQS hop floor (bench/hop_probe.py): probed on the idle rig (before any
        # stream starts), on the steady fleet (before the signal) and during the hand-off.
        windows: dict[str, tuple[float, float]] = {}
        probe = None
        if handoff:
            from .hop_probe import HopProbe

            probe = stack.enter_context(
                HopProbe(fleet.endpoint_url, fleet.resources.region, run_dir)
            )
            time.sleep(1.0)  # past the probe's first requests (its connections)
            idle_from = time.time()
            time.sleep(PROBE_IDLE_SECONDS)
            windows["idle"] = (idle_from, time.time())
        _start_streams(fleet, ids)
        wait_until(
            lambda: _all_streaming(fleet, ids, {victim.worker_id}),
            timeout=60 + connections * 0.5,
            interval=0.5,
            message=f"{connections} streams on the first worker",
        )
        for _ in range(peers):
            fleet.add_worker()
        steady_from = time.time()
        time.sleep(2 * timings.heartbeat_seconds)  # steady: peers polling, renewals spread
        signalled_at = time.time()
        windows["steady"] = (steady_from, signalled_at)
        fleet.kill_worker(0, signum)

        try:
            gaps = wait_until(lambda: first_frames_after(fleet, ids, signalled_at),
                              timeout=lease * 2 + 60, interval=0.25,
                              message="takeover")  # fmt: skip
        except BenchTimeout as exc:
            result["error"] = str(exc)
            return result
        result["victim_exit_code"] = fleet.wait_worker_exit(0, timings.drain_timeout_seconds + 5)
        # The new owners stream a while; then STOP writes every final checkpoint.
        time.sleep(2 * timings.heartbeat_seconds + 1)
        if probe is not None:  # every probe message of the hand-off is received by now
            probe.stop()
        owners_after = {r.lease_owner for i, r in records_by_id(fleet).items() if i in ids}
        stop_all(fleet, ids, timeout=60 + connections)
        items = stored_items(fleet, ids)  # read once: the audit and the hand-off's stall
        stats = percentiles(gaps.values())
        assert stats is not None
        result["seconds"] = stats.to_dict()
        result["breakdown_seconds"] = _breakdown(fleet, ids, signalled_at)
        result["ratio_to_lease"] = {
            key: round(value / lease, 3)
            for key, value in stats.to_dict().items()
            if key != "n"
        }
        # From the exit event: issue #14's 2 s; from the lease: the lease plus a second.
        crash_target = EXIT_EVENT_TARGET_SECONDS if task_events else lease + 1.0
        target = crash_target if kind == "crash" else 1.0
        result["target"] = f"p99 {'<=' if kind == 'crash' else '<'} {target:g} s"
        result["target_met"] = stats.p99 <= target if kind == "crash" else stats.p99 < target
        if handoff:
            _handoff_stages(result, fleet, run_dir, ids, signalled_at, victim.worker_id,
                            items=items)  # fmt: skip
            if probe is not None:
                _hop_floor(result, probe, windows, signalled_at)
        if task_events:
            killed = store_worker(fleet, victim.worker_id)
            # The victim died by the exit event's write (before its last renewal's lease ran
            # out), not by a peer's kill of an expired lease: the event made this figure.
            result["killed_by_exit_event"] = bool(
                killed and killed.dead_at_ms is not None
                and killed.dead_at_ms < killed.heartbeat_at_ms + lease * 1000
            )
        result["owners_after"] = sorted(owners_after)
        result["audit"] = audit(fleet, ids, items=items)
    return result


def _handoff_stages(
    result: dict[str, Any], fleet: Any, run_dir: Path, ids: list[str], signalled_at: float,
    giver: str, *, items: Mapping[str, list[dict[str, Any]]],
) -> None:
    """Issue #26's figure (signal -> each stream's first frame stored by its taker), each
    stage's time and the store stall per stream (:mod:`bench.handoff_stages`; ``items``: every
    stored frame per stream), into ``result``."""
    from .handoff_stages import (
        first_stored_frames,
        giver_ends,
        log_events,
        stage_times,
        store_stalls,
    )

    events = log_events(sorted(Path(run_dir).glob("worker-*.log")))
    timed = stage_times(
        events,
        fleet.simulator.sessions(),
        ids,
        signalled_at=signalled_at,
        giver=giver,
    )
    result["stages_seconds"] = timed["stages"]
    result["stage_moves"] = timed["moves"]
    result["stage_paths"] = timed["paths"]
    firsts = first_stored_frames(events, ids, signalled_at=signalled_at, giver=giver)
    result["store_stall_seconds"] = store_stalls(
        items, firsts, signalled_at=signalled_at, giver=giver,
        giver_ended=giver_ends(events, ids, signalled_at=signalled_at, giver=giver),
    )  # fmt: skip
    if firsts:  # the hand-off window: the signal -> the last stream's first stored frame
        result["handoff_window_seconds"] = round(
            max(at for at, _ in firsts.values()) - signalled_at, 3)
    stored = timed["stages"].get("first_stored")
    if stored is None or stored["n"] < len(ids):
        result["first_stored_target_met"] = False
        return
    result["first_stored_seconds"] = stored
    result["first_stored_target"] = f"p99 <= {HANDOFF_TARGET_SECONDS:g} s"
    result["first_stored_target_met"] = stored["p99"] <= HANDOFF_TARGET_SECONDS


def _hop_floor(
    result: dict[str, Any], probe: Any, windows: dict[str, tuple[float, float]],
    signalled_at: float,
) -> None:
    """The probe's windows (:class:`bench.hop_probe.HopProbe`) into ``result["hop_probe"]``,
    with two of the hand-off: ``control`` from the signal to the last hand-off message seen
    (PREPARE, READY, COMMIT or a break's hint: while the hops of the hand-off fly) and
    ``handoff`` to the last stream's first stored frame (``handoff_window_seconds``)."""
    windows = dict(windows)
    seen = [stats["max"] for stage in ("prepare_seen", "ready_seen", "commit_seen", "hint_seen")
            if (stats := result.get("stages_seconds", {}).get(stage))]  # fmt: skip
    if seen:
        windows["control"] = (signalled_at, signalled_at + max(seen))
    if (window := result.get("handoff_window_seconds")) is not None:
        windows["handoff"] = (signalled_at, signalled_at + window)
    result["hop_probe"] = probe.result(windows)


def run_stop_latency(
    *,
    control_channel: bool,
    streams: int,
    profile: str,
    rate: float,
    run_dir: Path,
    workers: int = 2,
    spacing_seconds: float = 0.2,
) -> dict[str, Any]:
    """STOP ``streams`` connections through the API; API call -> upstream socket closed."""
    from wsfleet_local.client import ApiClient

    timings = timings_for(profile, max_connections=max(100, streams))
    worker_env = {} if control_channel else {"WORKER_CONTROL_CHANNEL": "false"}
    ids = [f"stop{'c' if control_channel else 's'}-{i:03d}" for i in range(streams)]
    result: dict[str, Any] = {
        "benchmark": "stop",
        "control_channel": control_channel,
        "profile": profile,
        "settings": {
            **_timings_dict(timings),
            "workers": workers,
            "streams": streams,
            "stop_spacing_seconds": spacing_seconds,
            "streams_poll_seconds": 0.15,
        },
    }
    with fleet_for_bench(
        workers=workers, timings=timings, rate=rate, run_dir=run_dir, worker_env=worker_env
    ) as faulty:
        fleet = faulty.fleet
        _start_streams(fleet, ids)
        wait_until(lambda: _all_streaming(fleet, ids), timeout=60 + streams, interval=0.5,
                   message="all streams streaming")  # fmt: skip
        time.sleep(timings.heartbeat_seconds)
        api = ApiClient(fleet.api_url)
        sent_at: dict[str, float] = {}
        for stream_id in ids:
            sent_at[stream_id] = time.time()
            api.stop(stream_id)
            time.sleep(spacing_seconds)

        def closed() -> dict[str, float] | None:
            grouped = by_stream(fleet.simulator.sessions())
            found: dict[str, float] = {}
            for stream_id in ids:
                sessions = grouped.get(stream_id, [])
                if any(s.is_open for s in sessions):
                    return None
                at = sent_at[stream_id]
                closes = [s.closed_at for s in sessions if s.opened_at <= at and s.closed_at]
                found[stream_id] = max(closes) - at if closes else 0.0
            return found

        try:
            latencies = wait_until(
                closed, timeout=max(timings.lease_seconds * 2, timings.sweep_seconds * 2) + 30,
                interval=0.25, message="sockets closed",
            )  # fmt: skip
        except BenchTimeout as exc:
            result["error"] = str(exc)
            return result
        stats = percentiles(latencies.values())
        assert stats is not None
        result["seconds"] = stats.to_dict()
        if control_channel:
            result["target"] = "p99 < 1 s"
            result["target_met"] = stats.p99 < 1.0
        else:
            bound = timings.sweep_seconds + 1.0
            result["target"] = f"p99 <= sweep interval ({timings.sweep_seconds:g} s) + 1 s"
            result["target_met"] = stats.p99 <= bound
        records = records_by_id(fleet)
        result["stopped_records"] = sum(
            1
            for i in ids
            if records[i].desired_state.value == "STOPPED" and not records[i].lease_owner
        )
    return result
