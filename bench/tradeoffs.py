"""The operator's trade-off table: what each tuning knob buys and costs, measured and modelled.

``python -m bench --only tradeoffs`` (``make tradeoffs``) runs the sweep and writes
``docs/tradeoffs.md`` (the table) and ``docs/tradeoffs.png`` (the plot);
``python -m bench.tradeoffs --render`` redraws both from ``bench/results.json``
(``make tradeoffs-render``).

The knobs: ``LeaseSeconds`` / ``HeartbeatSeconds``, ``ReconcilePassSeconds``, the
``ReconcileSchedule`` rate and ``WorkerSweepSeconds``. For each row of :data:`ROWS`:

* **failover without the task exit event** (a hung, partitioned or unreported worker, or an
  event that was lost): measured on a local fleet at the row's real timings (no compression:
  the lease path is seconds long). One worker holds K connections, two peers join, the worker
  is SIGKILLed with the exit events off; SIGKILL to the first frame the upstream sent to the
  new owner, per connection (:func:`measure_row`);
* **failover with the exit event**: measured once, on the defaults row's fleet settings with
  the exit events on. The event path does not read any of the swept knobs (the task exit
  function kills the lease and hints at once), so every row quotes that one run;
* **hint-loss recovery**: connections written STARTED straight into the table with no hint
  (a hint SQS lost, or a router that died between its write and its send); time until the
  upstream sees a frame from an owner, which the reconciler's lost-hint pass arranges;
* **request cost** (read and write units per connection-hour at 10 and 1,000 connections per
  worker, a fleet of :data:`FLEET_WORKERS` workers): **modelled** by :func:`cost_model` from
  measured *units per request* and the row's cadences. Every coordination request rate is a
  cadence (one heartbeat per worker per HeartbeatSeconds, one sweep per worker per
  WorkerSweepSeconds, one pass per fleet per ReconcilePassSeconds while the schedule runs,
  one fleet-view read per worker per REBALANCE_SECONDS, at most one checkpoint per connection
  per CHECKPOINT_SECONDS), so only what one request costs needs measuring. The units come
  from a time-compressed recording of this checkout at 10 connections per worker
  (:func:`bench.request_cost.classify` over :func:`bench.scale_record.record`) and, for the
  sweep at 1,000 per worker, from the committed ``coordination-cost-1000`` run. The defaults
  row at 10 per worker is also shown as measured (that recording), beside the model;
* rows with another **ReconcileSchedule** rate are **modelled** from a measured row
  (:func:`schedule_delay`): with ``rate(N minutes)`` an invocation runs passes for about a
  minute (its 60 s timeout, less the reconciler's 3 s margin) and then nothing until the next
  one, so a lease that expires in the gap, or an orphan that appears in it, waits for the next
  invocation. Crash times are drawn uniformly over the schedule period (fixed seed) and the
  measured samples of the row it is modelled on give the rest.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .harness import ROOT, machine, percentiles, records_by_id
from .waiting import wait_until

__all__ = [
    "FLEET_WORKERS",
    "ROWS",
    "Row",
    "cost_model",
    "main",
    "measure_row",
    "render_markdown",
    "render_plot",
    "run_tradeoffs",
    "schedule_delay",
]

DOC_MD = ROOT / "docs" / "tradeoffs.md"
DOC_PNG = ROOT / "docs" / "tradeoffs.png"
RESULTS_JSON = ROOT / "bench" / "results.json"
STEP = "tradeoffs"

#: The fleet the cost columns are for: the template's MinTasks, where what a fleet pays once
#: (the reconciler) weighs most per connection.
FLEET_WORKERS = 2
#: Connections per worker of the two cost columns.
PER_WORKER = (10, 1000)
#: Template defaults the sweep does not vary.
CHECKPOINT_SECONDS = 600.0
REBALANCE_SECONDS = 10.0
#: How long one scheduled reconciler invocation runs passes: its 60 s timeout less the
#: reconciler's 3 s margin (functions/reconciler TIME_MARGIN_MS).
INVOCATION_ACTIVE_SECONDS = 57.0
#: Connections the crash moves, and hint-lost connections, per measured row.
CRASH_CONNECTIONS = 30
LOST_HINTS = 10


@dataclass(frozen=True)
class Row:
    """One setting of the knobs. ``modelled_from``: a measured row whose fleet run this one
    reuses (its other knobs change only the cost model, or the schedule model)."""

    name: str
    lease: float
    heartbeat: float
    reconcile_pass: float
    schedule_minutes: int
    sweep: float
    modelled_from: str | None = None

    @property
    def schedule(self) -> str:
        return f"rate({self.schedule_minutes} minute{'s' if self.schedule_minutes > 1 else ''})"


ROWS: tuple[Row, ...] = (
    Row("defaults", 20, 5, 10, 1, 30),
    Row("faster failover", 10, 3, 5, 1, 30),
    Row("fastest failover", 6, 2, 3, 1, 30),
    Row("longer pass", 20, 5, 14, 1, 30),
    Row("longer sweep", 20, 5, 10, 1, 120, modelled_from="defaults"),
    Row("schedule every 5 min", 20, 5, 10, 5, 30, modelled_from="defaults"),
    Row("lower read cost", 20, 5, 14, 5, 120, modelled_from="longer pass"),
)


# ----------------------------------------------------------------------------- pure models


def _pass_times(start: float, end: float, pass_seconds: float, period: float) -> list[float]:
    """Pass start times in [start, end): one invocation per ``period``, passes every
    ``pass_seconds`` while it runs (continuous when the period is a minute)."""
    active = period if period <= 60 else INVOCATION_ACTIVE_SECONDS
    times = []
    first = math.floor(start / period) - 1
    for invocation in range(first, math.ceil(end / period) + 1):
        at = invocation * period
        offset = 0.0
        while offset < active:
            if start <= at + offset < end:
                times.append(at + offset)
            offset += pass_seconds
    return sorted(times)


def schedule_delay(
    samples: Sequence[float],
    *,
    pass_seconds: float,
    schedule_minutes: int,
    draws: int = 4000,
    seed: int = 25,
) -> list[float]:
    """``samples`` (times measured with passes every ``pass_seconds`` all the time) as they
    would be under ``rate(schedule_minutes minutes)``: a draw picks a start time uniformly
    over the schedule period and a measured sample; the moment the pass was needed (start +
    sample) is served if a pass ran within ``pass_seconds`` before it (the early hint, or the
    lost-hint pass), else it waits for the next pass.

    >>> schedule_delay([5.0], pass_seconds=10, schedule_minutes=1, draws=3)
    [5.0, 5.0, 5.0]
    >>> max(schedule_delay([5.0], pass_seconds=10, schedule_minutes=5)) > 200
    True
    """
    rng = random.Random(seed)
    period = 60.0 * schedule_minutes
    if period <= 60:
        return [rng.choice(samples) for _ in range(draws)]
    out = []
    for _ in range(draws):
        start = rng.uniform(0, period)
        sample = rng.choice(samples)
        needed = start + sample
        passes = _pass_times(needed - pass_seconds, needed + 2 * period, pass_seconds, period)
        first = passes[0]
        out.append(sample + max(0.0, first - needed))
    return out


@dataclass(frozen=True)
class Units:
    """Measured capacity units per request, by what the request is for."""

    heartbeat_wcu: float
    checkpoint_wcu: float
    view_write_wcu: float
    view_read_rcu: float
    pass_rcu: float  # one reconcile pass, whatever the fleet's connections (steady state)
    sweep_rcu: Mapping[int, float]  # one sweep, by connections per worker


def cost_model(
    row: Row, per_worker: int, units: Units, *, workers: int = FLEET_WORKERS
) -> dict[str, float]:
    """Read and write units per connection-hour for ``row``'s cadences.

    Per worker-hour: heartbeats, sweeps and fleet-view reads; per fleet-hour: the reconciler's
    passes (only while the schedule runs them) and its fleet-view writes; per
    connection-hour: at most one checkpoint per CHECKPOINT_SECONDS (a busy connection).

    >>> u = Units(1, 1, 1, 0.5, 10, {10: 0.5})
    >>> cost_model(ROWS[0], 10, u)["write_units"]  # (2 x 720 + 360) / 20 + 6
    96.0
    """
    passes = 3600 / row.reconcile_pass * _duty(row.schedule_minutes)
    worker_reads = (3600 / row.sweep * units.sweep_rcu[per_worker]
                    + 3600 / REBALANCE_SECONDS * units.view_read_rcu)  # fmt: skip
    worker_writes = 3600 / row.heartbeat * units.heartbeat_wcu
    connections = workers * per_worker
    reads = (workers * worker_reads + passes * units.pass_rcu) / connections
    writes = ((workers * worker_writes + passes * units.view_write_wcu) / connections
              + 3600 / CHECKPOINT_SECONDS * units.checkpoint_wcu)  # fmt: skip
    return {"read_units": round(reads, 2), "write_units": round(writes, 2)}


def _duty(schedule_minutes: int) -> float:
    """The share of time the reconciler runs passes under ``rate(N minutes)``."""
    if schedule_minutes <= 1:
        return 1.0
    return INVOCATION_ACTIVE_SECONDS / (60.0 * schedule_minutes)


# ----------------------------------------------------------------------------- measurement


def _row_timings(row: Row) -> Any:
    from wsfleet_local.fleet import FleetTimings

    return FleetTimings(
        lease_seconds=row.lease,
        heartbeat_seconds=row.heartbeat,
        lease_safety_margin_seconds=2.0,  # the worker's default (the template sets none)
        reconcile_pass_seconds=row.reconcile_pass,
        drain_timeout_seconds=10.0,
        queue_wait_seconds=20,  # production long polls: a dead poller can hide hints
        checkpoint_seconds=CHECKPOINT_SECONDS,
        sweep_seconds=row.sweep,
        max_connections=100,
        rebalance_max_moves=0,  # nothing moves but what the crash moves
    )


def measure_row(
    row: Row, *, run_dir: Path, exit_events: bool = False, lost_hints: int = LOST_HINTS,
    connections: int = CRASH_CONNECTIONS, dynamodb: str = "moto",
) -> dict[str, Any]:
    """One fleet at ``row``'s timings: crash failover (exit events on or off) and, if
    ``lost_hints``, the recovery of that many connections STARTed without a hint."""
    from wsfleet.record import connection_pk
    from wsfleet.store import DynamoDBLeaseStore

    from .fleet_bench import _all_streaming, _start_streams, first_frames_after, fleet_for_bench
    from .harness import aws_client

    run_dir.mkdir(parents=True, exist_ok=True)
    timings = _row_timings(row)
    prefix = "x" if exit_events else "l"
    ids = [f"to{prefix}-{row.lease:g}-{i:03d}" for i in range(connections)]
    result: dict[str, Any] = {"row": row.name, "exit_events": exit_events,
                              "connections": connections, "dynamodb": dynamodb}  # fmt: skip
    with fleet_for_bench(
        workers=1, timings=timings, rate=2.0, run_dir=run_dir, worker_env={},
        dynamodb=dynamodb, task_events=exit_events,
    ) as plain:
        fleet = plain.fleet
        victim = fleet.workers[0]
        _start_streams(fleet, ids)
        wait_until(lambda: _all_streaming(fleet, ids, {victim.worker_id}),
                   timeout=60 + connections, interval=0.5,
                   message="streams on the first worker")  # fmt: skip
        for _ in range(2):
            fleet.add_worker()
        time.sleep(2 * row.heartbeat)  # peers polling, renewals spread
        signalled = time.time()
        fleet.kill_worker(0, signal.SIGKILL)
        failover = wait_until(lambda: first_frames_after(fleet, ids, signalled),
                              timeout=2 * row.lease + 60, interval=0.2,
                              message="takeover")  # fmt: skip
        result["failover_seconds"] = sorted(round(v, 3) for v in failover.values())
        owners = {r.lease_owner for i, r in records_by_id(fleet).items() if i in ids}
        result["victim_still_owns"] = victim.worker_id in owners
        if lost_hints:
            store = DynamoDBLeaseStore(
                aws_client("dynamodb", fleet.dynamodb_endpoint_url),
                fleet.resources.connections_table,
            )
            lost = [f"th-{row.lease:g}-{i:03d}" for i in range(lost_hints)]
            for stream_id in lost:
                fleet.simulator.open_stream(stream_id, rate=2.0)
            written = time.time()
            for stream_id in lost:  # the router's write, without its hint
                store.start(stream_id, fleet.simulator.url_for(stream_id), resume=True)
            recovered = wait_until(lambda: first_frames_after(fleet, lost, written),
                                   timeout=4 * row.reconcile_pass + 60, interval=0.2,
                                   message="lost hints recovered")  # fmt: skip
            result["hint_loss_seconds"] = sorted(round(v, 3) for v in recovered.values())
            result["hint_loss_pks"] = [connection_pk(i) for i in lost[:1]]
    return result


def measure_units(run_dir: Path) -> dict[str, Any]:
    """Units per request from a compressed recording at 10 connections per worker (2 workers,
    the defaults divided by 5, one checkpoint period), plus its measured totals."""
    from .request_cost import classify
    from .scale_record import record

    run_dir.mkdir(parents=True, exist_ok=True)
    factor, per_worker = 5.0, 10
    recording = record(version="v2", connections=per_worker * FLEET_WORKERS,
                       workers=FLEET_WORKERS, factor=factor,
                       window_seconds=CHECKPOINT_SECONDS / factor, rate=0.5, run_dir=run_dir,
                       keep_raw=True)  # fmt: skip
    raw = recording.pop("raw")
    production_seconds = recording["window_seconds"] * factor
    figures = classify(raw, per_worker * FLEET_WORKERS * production_seconds / 3600)
    counted = figures["counted_in_window"]
    steady = (recording["still_streaming_at_end"]
              and counted["writes"]["worker register / delete"]["requests"] == 0
              and counted["writes"]["reconciler hint claims and kills"]["requests"] == 0)
    return {
        "factor": factor,
        "connections_per_worker": per_worker,
        "workers": FLEET_WORKERS,
        "window_seconds_production": round(production_seconds, 1),
        "steady_state": steady,
        "counted_in_window": counted,
        "totals_per_connection_hour": figures["totals_per_connection_hour"],
    }  # fmt: skip


def _per_request(counted: Mapping[str, Any], kind: str, category: str, unit: str) -> float:
    row = counted[kind][category]
    return round(row[unit] / row["requests"], 3) if row["requests"] else 0.0


def units_from(measured: Mapping[str, Any], committed_1000: Mapping[str, Any] | None) -> Units:
    """:class:`Units` from :func:`measure_units`' recording and the committed 1,000-per-worker
    run (its sweep; without it, sweeps are scaled by entries: 8 read units per 1,000)."""
    counted = measured["counted_in_window"]
    passes = counted["writes"]["fleet view (reconciler)"]["requests"]  # one write per pass
    pass_rcu = counted["reads"]["reconciler passes"]["read_units"] / passes if passes else 0.0
    sweep = {10: _per_request(counted, "reads", "worker sweeps (gsi_owner)", "read_units")}
    if committed_1000 and "counted_in_window" in committed_1000:
        sweep[1000] = _per_request(committed_1000["counted_in_window"], "reads",
                                   "worker sweeps (gsi_owner)", "read_units")  # fmt: skip
    else:
        sweep[1000] = 8.0
    return Units(
        heartbeat_wcu=_per_request(counted, "writes", "worker-lease heartbeats", "write_units"),
        checkpoint_wcu=_per_request(counted, "writes", "checkpoints", "write_units") or 1.0,
        view_write_wcu=_per_request(counted, "writes", "fleet view (reconciler)", "write_units"),
        view_read_rcu=_per_request(counted, "reads", "fleet view (workers)", "read_units"),
        pass_rcu=round(pass_rcu, 3),
        sweep_rcu=sweep,
    )


def _load_results() -> dict[str, Any]:
    try:
        return dict(json.loads(RESULTS_JSON.read_text()))
    except (OSError, ValueError):
        return {}


def run_tradeoffs(run_dir: Path, *, rows: Sequence[Row] = ROWS) -> dict[str, Any]:
    """The whole sweep (a ``python -m bench`` step): fleet runs, the unit recording, the
    table; also writes docs/tradeoffs.md and docs/tradeoffs.png."""
    from .dynalite import available

    dynamodb = "dynalite" if available() else "moto"
    # Each measurement is kept in run_dir as soon as it is made: a run that fails later (a
    # starved machine) is resumed with `python -m bench.tradeoffs --resume RUN_DIR`.
    done_path = run_dir / "measurements.json"
    done: dict[str, Any] = json.loads(done_path.read_text()) if done_path.exists() else {}

    def once(key: str, what: str, measure: Any) -> Any:
        if key not in done:
            print(f"[tradeoffs] {what}", file=sys.stderr, flush=True)
            done[key] = json.loads(json.dumps(measure()))
            done_path.write_text(json.dumps(done, indent=1), encoding="utf-8")
        return done[key]

    measured: dict[str, Any] = {}
    for row in rows:
        if row.modelled_from is None:
            measured[row.name] = once(
                row.name, f"{row.name}: crash without the exit event, lost hints",
                lambda row=row: measure_row(row, run_dir=run_dir / _slug(row.name),
                                            dynamodb=dynamodb),
            )  # fmt: skip
    exit_run = once("exit event", "defaults: crash with the exit event", lambda: measure_row(
        rows[0], run_dir=run_dir / "exit-event", exit_events=True, lost_hints=0,
        dynamodb=dynamodb))  # fmt: skip
    units = once("units", "units per request (compressed recording)",
                 lambda: measure_units(run_dir / "units"))  # fmt: skip
    committed = _load_results().get("results", {}).get("coordination-cost-1000")
    result: dict[str, Any] = {
        "benchmark": "tradeoffs",
        "dynamodb": dynamodb,
        "rows": [asdict(row) for row in rows],
        "measured": measured,
        "exit_event": exit_run,
        "units_recording": units,
        "units_1000_source": "coordination-cost-1000" if committed else "assumed 8 RU/sweep",
        "units": asdict(units_from(units, committed)),
    }
    result["machine"] = machine()  # its load average: at the sweep's end
    result = json.loads(json.dumps(result))  # as results.json will hold it (string keys)
    result["table"] = table(result)
    write_docs(result)
    return result


def _slug(name: str) -> str:
    return name.replace(" ", "-")


# ----------------------------------------------------------------------------- the table


def _stats(values: Sequence[float]) -> dict[str, float] | None:
    stats = percentiles(values)
    if stats is None:
        return None
    return {"n": stats.n, "p50": round(stats.p50, 2), "p99": round(stats.p99, 2)}


def table(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One dict per row: the knobs, the figures, and where each figure came from."""
    units_dict = dict(result["units"])
    units_dict["sweep_rcu"] = {int(k): v for k, v in units_dict["sweep_rcu"].items()}
    units = Units(**units_dict)
    exit_stats = _stats(result["exit_event"]["failover_seconds"])
    rows = [Row(**row) for row in result["rows"]]
    out = []
    for row in rows:
        base = result["measured"][row.modelled_from or row.name]
        failover = base["failover_seconds"]
        hints = base["hint_loss_seconds"]
        source = "measured"
        if row.schedule_minutes > 1:
            failover = schedule_delay(failover, pass_seconds=row.reconcile_pass,
                                      schedule_minutes=row.schedule_minutes)  # fmt: skip
            hints = schedule_delay(hints, pass_seconds=row.reconcile_pass,
                                   schedule_minutes=row.schedule_minutes)  # fmt: skip
            source = f"modelled from '{row.modelled_from}' (schedule gap)"
        elif row.modelled_from:
            source = f"as '{row.modelled_from}' (the sweep changes neither)"
        costs = {n: cost_model(row, n, units) for n in PER_WORKER}
        out.append({
            **asdict(row),
            "schedule": row.schedule,
            "failover_no_event": _stats(failover),
            "failover_event": exit_stats,
            "hint_loss": _stats(hints),
            "cost": {str(n): c for n, c in costs.items()},
            "timings_source": source,
        })  # fmt: skip
    return out


def _seconds(stats: Mapping[str, float] | None) -> str:
    if not stats:
        return "-"
    return f"{_fmt(stats['p50'])} / {_fmt(stats['p99'])}"


def _fmt(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 100 else f"{seconds / 60:.1f} min"


def render_markdown(result: Mapping[str, Any], machine: Mapping[str, Any] | None = None) -> str:
    rows = result["table"]
    units = result["units"]
    recording = result["units_recording"]
    exit_run = result["exit_event"]
    lines = [
        "# Tuning trade-offs: failover, recovery and request cost",
        "",
        "Generated by `python -m bench --only tradeoffs` (`make tradeoffs`); do not edit by "
        "hand. `make tradeoffs-render` redraws this page and the plot from "
        "`bench/results.json`. The code and the model are in `bench/tradeoffs.py`.",
        "",
        "![trade-offs](tradeoffs.png)",
        "",
        "| row | LeaseSeconds / HeartbeatSeconds | ReconcilePassSeconds | ReconcileSchedule "
        "| WorkerSweepSeconds | failover without the exit event p50 / p99 | failover with it "
        "p50 / p99 | hint-loss recovery p50 / p99 | read / write units per connection-hour, "
        "10 per worker | same, 1,000 per worker | timings |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        c10, c1000 = row["cost"]["10"], row["cost"]["1000"]
        lines.append(
            f"| {row['name']} | {row['lease']:g} / {row['heartbeat']:g} "
            f"| {row['reconcile_pass']:g} | `{row['schedule']}` | {row['sweep']:g} "
            f"| {_seconds(row['failover_no_event'])} | {_seconds(row['failover_event'])} "
            f"| {_seconds(row['hint_loss'])} "
            f"| {_units(c10['read_units'])} / {_units(c10['write_units'])} "
            f"| {_units(c1000['read_units'])} / {_units(c1000['write_units'])} "
            f"| {row['timings_source']} |"
        )
    measured_totals = recording["totals_per_connection_hour"]
    default_model = rows[0]["cost"]["10"]
    crash_n = len(next(iter(result["measured"].values()))["failover_seconds"])
    hint_n = len(next(iter(result["measured"].values()))["hint_loss_seconds"])
    lines += [
        "",
        "## What each column is, and what was measured",
        "",
        f"* **Failover without the exit event** (measured, real timings, no compression): one "
        f"worker holds {crash_n} connections, two peers join, the worker is SIGKILLed with "
        "the task exit events off; SIGKILL to the first frame the upstream sent to the new "
        "owner, per connection. This is the path of a hung, partitioned or unreported worker "
        "(or a lost event): it waits out the worker lease, so it moves with `LeaseSeconds` "
        "(minus up to a heartbeat: the lease runs from the last renewal).",
        "* A lease-path p99 about 30 s above the lease (the short-lease rows) is, by its size, "
        "the hint queue's visibility timeout (30 s): the killed worker's own long poll "
        "(`WORKER_HINT_WAIT_SECONDS`, 20 s) is still open on the server after the kill and "
        "takes an early hint, which SQS then hides from every live peer until the timeout "
        "ends. The exit-event path sends each hint twice, 1 s apart, for this reason "
        "(docs/leases.md); the reconciler's early hints go once, so a lease shorter than "
        "the long poll risks this tail.",
        f"* **Failover with the exit event** (measured once, {len(exit_run['failover_seconds'])}"
        " connections, the defaults row's timings with the exit events on): the task exit "
        "function kills the lease and hints at once, and none of the swept knobs is on that "
        "path, so every row quotes the same run. A crash, OOM kill or lost host takes this "
        "path; a Lambda cold start on AWS would add to it (it cannot be measured here).",
        f"* **Hint-loss recovery** (measured, {hint_n} connections written STARTED into the "
        "table without a hint): the reconciler hints a connection that has stayed free for "
        "longer than one pass, so this is one to two `ReconcilePassSeconds`.",
        "* **Read / write units per connection-hour** (modelled from measured units): every "
        "coordination request comes at a cadence, so the model multiplies what one request "
        "costs (measured) by how often the row's settings send it, for a fleet of "
        f"{FLEET_WORKERS} workers (the template's `MinTasks`): heartbeats and sweeps per "
        "worker, reconcile passes per fleet (only while the schedule runs them), a fleet-view "
        "read per worker every `RebalanceSeconds` (10), at most one checkpoint per busy "
        "connection every `CheckpointSeconds` (600: 6 write units of every row's writes). A "
        "fleet's reconciler costs the same whatever it holds, so at 10 connections per "
        "worker it is most of the bill and `ReconcilePassSeconds` / the schedule are the "
        "knobs; at 1,000 per worker the sweep and the checkpoints are.",
        f"* Units per request (measured): heartbeat {units['heartbeat_wcu']:g} WCU, "
        f"checkpoint {units['checkpoint_wcu']:g} WCU, fleet-view write "
        f"{units['view_write_wcu']:g} WCU and read {units['view_read_rcu']:g} RCU, one "
        f"reconcile pass {units['pass_rcu']:g} RCU ({FLEET_WORKERS} workers), one sweep "
        f"{units['sweep_rcu']['10']:g} RCU at 10 connections and "
        f"{units['sweep_rcu']['1000']:g} RCU at 1,000. From a recording of this checkout "
        f"({recording['workers']} workers x {recording['connections_per_worker']} "
        f"connections, every cadence divided by {recording['factor']:g}, "
        f"{recording['window_seconds_production']:g} production seconds, steady state: "
        f"{'yes' if recording['steady_state'] else 'NO'}) and, for the 1,000-connection "
        f"sweep, {result['units_1000_source']} (bench/RESULTS.md).",
        f"* Check of the model: the recording measured {measured_totals['read_units']:g} read "
        f"and {measured_totals['write_units']:g} write units per connection-hour for the "
        f"defaults at 10 per worker; the model says {default_model['read_units']:g} and "
        f"{default_model['write_units']:g} (the recording's streams all advance, so it pays "
        "every checkpoint; an idle connection writes none).",
        "* **`ReconcileSchedule` rows** (modelled): with `rate(N minutes)` an invocation runs "
        f"passes for about {INVOCATION_ACTIVE_SECONDS:g} s (its 60 s timeout less the "
        "reconciler's margin), then none until the next one. A lease that expires in that "
        "gap, and an orphan that appears in it, wait for the next invocation: crash and loss "
        "times are drawn uniformly over the period and added to the measured samples of the "
        "row named. The exit-event path does not use the reconciler and does not change.",
        "* **`WorkerSweepSeconds`** also bounds a STOP whose control message was lost (within "
        "one sweep, `bench/RESULTS.md` section 3) and the repair of a connection a worker owns "
        "without a session; it does not touch failover.",
        f"* Tables on {result['dynamodb']}, SQS on the embedded moto server, the workers real "
        "processes, the Lambdas through their real handlers (`wsfleet_local.fleet`). "
        "Percentiles are nearest-rank: with 30 samples p99 is the maximum. The machine is a "
        "shared 2-core box: the small leases have less slack for its stalls than AWS gives.",
        "",
    ]
    if machine:
        lines += [f"Measured on {machine.get('cores')} cores ({machine.get('cpu')}), commit "
                  f"{machine.get('commit')}, load average when the sweep ended "
                  f"{machine.get('load_average_at_start')} (1, 5, 15 min; other sessions "
                  "share this machine).", ""]  # fmt: skip
    return "\n".join(lines)


def _units(value: float) -> str:
    """Three significant figures at most: the model is not more precise than that."""
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def render_plot(result: Mapping[str, Any], path: Path = DOC_PNG) -> None:
    """Two panels: failover and recovery times per row (log scale), and units per
    connection-hour at 10 and 1,000 per worker."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["table"]
    names = [row["name"] for row in rows]
    x = list(range(len(rows)))
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.2))
    series = (
        ("failover_no_event", "failover, no exit event", "tab:red"),
        ("failover_event", "failover, exit event", "tab:green"),
        ("hint_loss", "hint-loss recovery", "tab:blue"),
    )
    width = 0.26
    for i, (key, label, color) in enumerate(series):
        p50 = [row[key]["p50"] if row[key] else 0 for row in rows]
        p99 = [row[key]["p99"] if row[key] else 0 for row in rows]
        pos = [v + (i - 1) * width for v in x]
        left.bar(pos, p99, width, color=color, alpha=0.35)
        left.bar(pos, p50, width, color=color, label=f"{label} (p50; pale: p99)")
    left.set_yscale("log")
    left.set_ylabel("seconds (log)")
    left.set_title("time to stream again")
    left.set_xticks(x, names, rotation=30, ha="right")
    left.legend(fontsize=8)
    for i, (per, hatch) in enumerate(((10, ""), (1000, "//"))):
        reads = [row["cost"][str(per)]["read_units"] for row in rows]
        writes = [row["cost"][str(per)]["write_units"] for row in rows]
        pos = [v + (i * 2 - 1.5) * 0.2 for v in x]
        right.bar(pos, reads, 0.2, color="tab:purple", hatch=hatch,
                  label=f"read units, {per:,} per worker")  # fmt: skip
        right.bar([p + 0.2 for p in pos], writes, 0.2, color="tab:orange", hatch=hatch,
                  label=f"write units, {per:,} per worker")  # fmt: skip
    right.set_yscale("log")
    right.set_ylabel(f"units per connection-hour (log), {FLEET_WORKERS} workers")
    right.set_title("request cost (modelled from measured units)")
    right.set_xticks(x, names, rotation=30, ha="right")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_docs(result: Mapping[str, Any]) -> None:
    DOC_MD.write_text(render_markdown(result, result.get("machine")), encoding="utf-8")
    render_plot(result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tradeoffs", description=__doc__)
    parser.add_argument("--render", action="store_true",
                        help="redraw docs/tradeoffs.md and .png from bench/results.json")
    parser.add_argument("--resume", type=Path, metavar="RUN_DIR",
                        help="finish a sweep that failed, keeping what RUN_DIR measured")
    args = parser.parse_args(argv)
    if args.resume:
        document = _load_results()
        result = run_tradeoffs(args.resume)
        result["group"] = STEP
        result["run_dir"] = str(args.resume)
        document.setdefault("results", {})[STEP] = result
        RESULTS_JSON.write_text(json.dumps(document, indent=2, default=str) + "\n")
        return 0
    if not args.render:
        from . import __main__ as bench_main

        return bench_main.main(["--only", STEP])
    document = _load_results()
    result = document.get("results", {}).get(STEP)
    if not result or "table" not in result:
        print("no tradeoffs result in bench/results.json: run `make tradeoffs`", file=sys.stderr)
        return 1
    result = {**result, "table": table(result)}
    write_docs(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
