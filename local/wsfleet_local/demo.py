"""``wsfleet demo``: watch a lease fleet survive a crash, a deploy and STOPs, then audit it.

The scenario, on a :class:`~wsfleet_local.fleet.LocalFleet` with short timings:

1. open M simulated streams through the REST API (START) and wait until all stream;
2. **crash**: SIGKILL the busiest worker; the fleet publishes its exit as the ECS task state
   change event, the task exit function kills its worker lease at once and hints its
   connections, and peers resume every stream from its checkpoint within about a second, not
   a lease (ECS would then replace the task: the slot is restarted with a new worker id).
   With ``task_events=False`` (``--no-task-events``) no event is sent, as for a hung or
   partitioned worker: its connections wait out its lease and the reconciler's early hints;
3. **deploy**: two live-only streams join (an upstream that cannot replay), one with
   ``upstream.handoff: overlap`` (make-before-break: the taker's session opens before the
   giver's closes) and one with ``break``; SIGTERM the worker holding them (and, rolling on,
   the other one's holder); each drains (final checkpoints, released or transferred leases,
   immediate hints) and peers take over at once; the slot is restarted. The two live streams
   are then ended at the upstream and audited side by side: frames lost through the deploy,
   the gap each reports, and how long the upstream had both sessions open;
4. **scale-out**: a worker joins; the reconciler's fleet view plans moves and the loaded
   workers hand connections off gracefully until every worker holds its share;
5. **STOP** a few streams through the API (the notifier routes STOP to the owner's queue);
6. end every other stream at the upstream (a normal close: the owner stores what is owed,
   checkpoints it and marks the connection STOPPED);
7. audit (:mod:`wsfleet_local.audit`) the simulator's session log, the messages table and the
   records: failover, hand-off and STOP times; produced / stored / lost / duplicated.

A live table shows, per worker, its connections and, per connection, owner, epoch, lease
left and last_seq. Without a terminal (CI) the table is printed at the end and the events as
they happen. The exit code is non-zero if anything was lost or duplicated or a phase did not
converge.

Example::

    report = run_demo(DemoOptions(workers=3, streams=12), Console())
    raise SystemExit(0 if report.ok else 1)
"""

from __future__ import annotations

import contextlib
import itertools
import random
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from wsfleet.exceptions import WsfleetError
from wsfleet.messages import MessageStore
from wsfleet.record import DesiredState, connection_pk

from .audit import FleetAudit, StreamAudit, audit_stream, latency_summary
from .backend import local_client
from .client import ApiClient, ConnectionRow, read_table
from .fleet import FleetTimings, LocalFleet
from .simulator import SessionRecord, first_frame_after, overlap_seconds

__all__ = [
    "DemoInterrupted",
    "DemoOptions",
    "DemoReport",
    "LiveHandoff",
    "PhaseTiming",
    "crash_path",
    "render_summary",
    "run_demo",
]

#: How long each wait may take beyond what the timings imply before the phase counts as failed.
CONVERGE_SLACK_SECONDS = 20.0
#: REBALANCE_DWELL_SECONDS in REBALANCE_SECONDS, unless the timings set it. The plans after
#: the crash and the deploy move most connections seconds before the scale-out; under the
#: production dwell (600 s, 60 intervals) none of them could move again during the demo, and
#: the spread after the join stayed out of the band whenever the loaded worker held only
#: such connections (seed 303 under load: 4/4/3/1). Five intervals (10 s) outlast a plan's
#: settling (REBALANCE_SECONDS + 5 s), so two plans in a row never move the same connection.
DEMO_DWELL_INTERVALS = 5
REFRESH_SECONDS = 0.25


@dataclass(frozen=True)
class DemoOptions:
    """What to run: fleet size, streams (and how many to STOP), upstream rate, timings."""

    workers: int = 3
    streams: int = 12
    stops: int = 3
    rate: float = 10.0
    seed: int | None = None
    steady_seconds: float = 3.0
    timings: FleetTimings = field(default_factory=FleetTimings)
    run_dir: Path | None = None
    #: Publish a worker's exit as its ECS task state change event (the template's rule), so a
    #: crash fails over in about a second; False shows the lease path instead (a hung,
    #: partitioned or unreported worker: its connections wait out its lease).
    task_events: bool = True


class DemoInterrupted(WsfleetError):
    """The demo was asked to stop (``cancel``) before it ended; the fleet was stopped."""


@dataclass
class PhaseTiming:
    """Per-stream durations of one disruption, in seconds."""

    label: str
    victim: str = ""
    seconds: dict[str, float] = field(default_factory=dict)
    converged: bool = True

    def summary(self) -> tuple[float, float] | None:
        return latency_summary(list(self.seconds.values()))


#: The live-only pair's hand-off modes (``upstream.handoff``), in the summary's order.
LIVE_MODES = ("overlap", "break")
#: The live-only pair's frames/s: fast enough that a break-before-make hand-off (a few
#: hundred ms locally) visibly loses frames, slow enough to cost the demo nothing.
LIVE_RATE = 100.0


@dataclass
class LiveHandoff:
    """One live-only stream through the deploy, audited at its end (issue #26)."""

    stream_id: str
    mode: str
    moves: int = 0
    stored: int = 0
    #: Seqs between the first and the last stored that are not stored.
    lost: int = 0
    #: The gap the connection reports (``gap_frames``): must equal ``lost``.
    gap_frames: int = 0
    #: How long the upstream had two of its sessions open together (seconds, summed).
    overlap_seconds: float = 0.0


@dataclass
class DemoReport:
    """Everything measured; ``ok`` decides the exit status (nothing lost or duplicated)."""

    options: DemoOptions
    seed: int
    crash: PhaseTiming
    handoff: PhaseTiming
    stop: PhaseTiming
    #: A worker joins and the spread evens out (per moved stream: old close -> first frame).
    rebalance: PhaseTiming = field(default_factory=lambda: PhaseTiming("rebalance"))
    rebalance_line: str = ""
    audit: FleetAudit = field(default_factory=FleetAudit)
    failures: list[str] = field(default_factory=list)
    run_dir: Path | None = None
    #: Resume-gap totals the connections report (resumes, frames): 0 with a replaying upstream.
    gaps: tuple[int, int] = (0, 0)
    #: The live-only pair through the deploy (overlap, break).
    live: list[LiveHandoff] = field(default_factory=list)
    elapsed_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.audit.ok and not self.failures and bool(self.audit.streams)


@dataclass(frozen=True)
class Snapshot:
    """One read of the connections table (and, when asked, the simulator's session log)."""

    rows: Mapping[str, ConnectionRow]
    sessions: Mapping[str, list[SessionRecord]] = field(default_factory=dict)


class _Monitor:
    """Reads the system, keeps the live view fresh, waits for conditions. Main thread only."""

    def __init__(
        self,
        fleet: LocalFleet,
        console: Console,
        stream_ids: Sequence[str],
        cancel: threading.Event | None = None,
    ) -> None:
        self.fleet = fleet
        self.cancel = cancel or threading.Event()
        self.console = console
        self.stream_ids = list(stream_ids)
        self.started = time.monotonic()
        self.phase = "starting"
        self.slot_state: dict[int, str] = {}
        resources = fleet.resources
        self.ddb = local_client("dynamodb", resources.endpoint_url, resources.region)
        self.live: Live | None = None
        self.last: Snapshot | None = None

    def event(self, message: str) -> None:
        self.console.print(f"[{time.monotonic() - self.started:5.1f}s] {message}", highlight=False)

    def snapshot(self, *, with_sessions: bool = False) -> Snapshot:
        table_rows, _ = read_table(
            self.ddb, self.fleet.resources.connections_table, int(time.time() * 1000)
        )
        rows = {row.connection_id: row for row in table_rows}
        sessions: dict[str, list[SessionRecord]] = {}
        if with_sessions:
            for record in self.fleet.simulator.sessions():
                sessions.setdefault(record.stream_id, []).append(record)
        self.last = Snapshot(rows=rows, sessions=sessions)
        if self.live is not None:
            self.live.update(self.render(), refresh=True)
        return self.last

    def wait(
        self,
        what: str,
        predicate: Callable[[Snapshot], bool],
        *,
        timeout_seconds: float | None = None,
        with_sessions: bool = True,
    ) -> bool:
        """Poll until ``predicate(snapshot)``; False (and an event) on timeout. The default
        bound is a lease (a takeover may wait for one) plus the slack."""
        if timeout_seconds is None:
            timeout_seconds = self.fleet.timings.lease_seconds + CONVERGE_SLACK_SECONDS
        deadline = time.monotonic() + timeout_seconds
        while True:
            snap = self.snapshot(with_sessions=with_sessions)
            if predicate(snap):
                return True
            if time.monotonic() > deadline:
                self.event(f"[red]timed out waiting for {what}[/red]")
                return False
            self._sleep()

    def pause(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.snapshot()
            self._sleep()

    def _sleep(self) -> None:
        """One refresh interval; raises DemoInterrupted once ``cancel`` is set."""
        if self.cancel.wait(REFRESH_SECONDS):
            raise DemoInterrupted("the demo was interrupted")

    # -- the live view -----------------------------------------------------------------------

    def render(self) -> RenderableType:
        """Phase line, workers table, connections table (events scroll above, as log lines)."""
        snap = self.last
        title = Text.assemble(
            ("wsfleet demo", "bold"),
            "  ",
            (self.phase, "cyan"),
            f"  t={time.monotonic() - self.started:4.1f}s",
        )
        if snap is None:
            return title
        return Group(title, self._workers_table(snap), self._connections_table(snap))

    def _workers_table(self, snap: Snapshot) -> Table:
        table = Table(title="workers", title_justify="left", expand=False)
        for column in ("slot", "worker", "pid", "process", "conns", "connections"):
            table.add_column(column)
        for slot in self.fleet.workers:
            owned = _held_by(snap, slot.worker_id)
            state = self.slot_state.get(slot.index, "running" if slot.alive() else "exited")
            table.add_row(
                str(slot.index),
                slot.worker_id,
                str(slot.pid),
                state,
                str(len(owned)),
                " ".join(owned),
            )
        return table

    def _connections_table(self, snap: Snapshot) -> Table:
        table = Table(title="connections", title_justify="left", expand=False)
        for column in ("connection", "state", "owner", "epoch", "lease left", "last_seq"):
            table.add_column(column, justify="right" if column in ("epoch", "last_seq") else "left")
        for stream_id in self.stream_ids:
            row = snap.rows.get(stream_id)
            if row is None:
                table.add_row(stream_id, "-", "-", "-", "-", "-")
                continue
            left = "-" if row.lease_left_ms is None else f"{row.lease_left_ms / 1000:.1f}s"
            state = row.desired_state if row.desired_state != "STARTED" else row.lease_state
            table.add_row(
                stream_id, state, row.owner or "-", str(row.epoch), left, str(row.last_seq)
            )
        return table


def _held_by(snap: Snapshot, worker_id: str) -> list[str]:
    """The connections ``worker_id`` holds a live lease on, sorted."""
    return sorted(
        row.connection_id
        for row in snap.rows.values()
        if row.owner == worker_id and row.lease_state == "held"
    )


def _busiest_slot(
    fleet: LocalFleet,
    snap: Snapshot,
    rng: random.Random,
    exclude: set[int],
    prefer: Sequence[str] = (),
) -> int | None:
    """The live slot holding the most of ``prefer``, then the most connections (ties: random)."""
    counts = {
        slot.index: (
            len(set(_held_by(snap, slot.worker_id)) & set(prefer)),
            len(_held_by(snap, slot.worker_id)),
        )
        for slot in fleet.workers
        if slot.index not in exclude and slot.alive()
    }
    if not counts or max(counts.values())[1] == 0:
        return None
    top = max(counts.values())
    return rng.choice(sorted(index for index, count in counts.items() if count == top))


#: A condition on one stream: its row in the connections table and its upstream sessions.
StreamCheck = Callable[[ConnectionRow, list[SessionRecord]], bool]


def _every(ids: Sequence[str], holds: StreamCheck) -> Callable[[Snapshot], bool]:
    """A wait condition: ``holds`` for every stream of ``ids`` (one not in the table fails)."""

    def check(snap: Snapshot) -> bool:
        return all(
            (row := snap.rows.get(stream_id)) is not None
            and holds(row, snap.sessions.get(stream_id, []))
            for stream_id in ids
        )

    return check


def _streaming(row: ConnectionRow, sessions: list[SessionRecord]) -> bool:
    """Owned, with an open upstream session that has sent a frame."""
    return row.streaming and any(s.is_open and s.first_frame_at for s in sessions)


def _finished(row: ConnectionRow, sessions: list[SessionRecord]) -> bool:
    """STOPPED and nobody streams it: released, or (owner self-fenced) its owner's worker
    lease has lapsed."""
    return row.desired_state == DesiredState.STOPPED and row.lease_state != "held"


def _closed(row: ConnectionRow, sessions: list[SessionRecord]) -> bool:
    """Finished, and no upstream session of it is left open."""
    return _finished(row, sessions) and not any(s.is_open for s in sessions)


def _disrupt(
    monitor: _Monitor,
    fleet: LocalFleet,
    rng: random.Random,
    *,
    label: str,
    signum: int,
    exclude: set[int],
    prefer: Sequence[str] = (),
) -> tuple[PhaseTiming, int | None]:
    """Signal the busiest worker (the one holding most of ``prefer`` first) and time how long
    its streams took to flow again elsewhere."""
    timing = PhaseTiming(label=label)
    snap = monitor.snapshot()
    index = _busiest_slot(fleet, snap, rng, exclude, prefer)
    if index is None:
        timing.converged = False
        monitor.event(f"[red]{label}: no worker holds a connection[/red]")
        return timing, None
    slot = fleet.workers[index]
    affected = _held_by(snap, slot.worker_id)
    timing.victim = slot.worker_id
    name = signal.Signals(signum).name
    monitor.phase = f"{label}: {name} {slot.worker_id}"
    monitor.slot_state[index] = "killed" if signum == signal.SIGKILL else "draining"
    at = time.time()
    fleet.kill_worker(index, signum)
    monitor.event(
        f"{name} worker {slot.worker_id} (pid {slot.pid}), holding {len(affected)}: "
        f"{' '.join(affected)}"
    )
    bound = fleet.timings.lease_seconds * 2 + CONVERGE_SLACK_SECONDS

    def resumed(row: ConnectionRow, sessions: list[SessionRecord]) -> bool:
        return (
            row.streaming
            and row.owner != slot.worker_id
            and first_frame_after(sessions, at) is not None
        )

    timing.converged = monitor.wait(
        f"{label} takeover", _every(affected, resumed), timeout_seconds=bound
    )
    sessions = monitor.last.sessions if monitor.last else {}
    for stream_id in affected:
        first = first_frame_after(sessions.get(stream_id, []), at)
        if first is not None:
            timing.seconds[stream_id] = first - at
    _announce(monitor, timing, f"{label}: {len(timing.seconds)} stream(s) flowing again elsewhere")
    return timing, index


def _announce(monitor: _Monitor, timing: PhaseTiming, what: str) -> None:
    """An event with the phase's p50 and max, once anything was measured."""
    summary = timing.summary()
    if summary:
        monitor.event(f"{what}, p50 {summary[0]:.2f} s, max {summary[1]:.2f} s")


def _held(snap: Snapshot, workers: Sequence[str]) -> dict[str, int]:
    return {worker: len(_held_by(snap, worker)) for worker in workers}


def _scale_out(monitor: _Monitor, fleet: LocalFleet, ids: Sequence[str]) -> tuple[PhaseTiming, str]:
    """A worker joins (autoscaling adds a task); time until every worker holds its share
    within the band, and each move's gap (old upstream session closed -> new one's first
    frame). Moves are graceful hand-offs planned by the reconciler's fleet view."""
    from wsfleet.rebalance import WorkerLoad, in_band

    band = 10.0  # REBALANCE_BAND_PERCENT's default (the template's)
    capacity = fleet.timings.max_connections
    timing = PhaseTiming(label="rebalance")

    def even(workers: Sequence[str]) -> Callable[[Snapshot], bool]:
        def check(snap: Snapshot) -> bool:
            held = _held(snap, workers)
            return sum(held.values()) == len(ids) and in_band(
                [WorkerLoad(w, n, capacity) for w, n in held.items()], band
            )

        return check

    monitor.phase = "rebalancing"
    before_workers = list(fleet.worker_ids)
    monitor.wait(
        "the spread to settle", even(before_workers), timeout_seconds=CONVERGE_SLACK_SECONDS
    )
    before = monitor.snapshot()
    spread_before = "/".join(str(n) for n in _held(before, before_workers).values())
    at = time.time()
    slot = fleet.add_worker()
    timing.victim = slot.worker_id
    workers = list(fleet.worker_ids)
    monitor.phase = f"scale-out: {slot.worker_id} joined"
    monitor.event(f"scale-out: worker {slot.worker_id} joins; held per worker {spread_before}")
    timing.converged = monitor.wait(
        "the spread to even out",
        even(workers),
        timeout_seconds=fleet.timings.rebalance_seconds * 6 + CONVERGE_SLACK_SECONDS,
    )
    after = monitor.snapshot(with_sessions=True)
    took = time.time() - at
    moved = [
        i
        for i in ids
        if (row := after.rows.get(i)) and (old := before.rows.get(i)) and row.epoch > old.epoch
    ]
    for stream_id in moved:
        sessions = sorted(after.sessions.get(stream_id, []), key=lambda r: r.opened_at)
        for old_session, new_session in itertools.pairwise(sessions):
            if (
                new_session.opened_at >= at
                and old_session.closed_at is not None
                and new_session.first_frame_at is not None
            ):
                timing.seconds[stream_id] = new_session.first_frame_at - old_session.closed_at
                break
    spread_after = "/".join(str(n) for n in _held(after, workers).values())
    line = (
        f"{slot.worker_id} joined: held {spread_before}/0 -> {spread_after} in {took:.1f} s, "
        f"{len(moved)} move(s), each a graceful hand-off"
    )
    monitor.event(f"rebalance: {line}")
    return timing, line


def _restart(monitor: _Monitor, fleet: LocalFleet, index: int, why: str) -> None:
    old = fleet.workers[index]
    fleet.wait_worker_exit(index, fleet.timings.drain_timeout_seconds + 5)
    slot = fleet.restart_worker(index, wait_ready=False)  # readiness is awaited before STOP
    monitor.slot_state.pop(index, None)
    monitor.event(f"{why}: worker {old.worker_id} replaced by {slot.worker_id} (pid {slot.pid})")


def _stop_some(
    monitor: _Monitor, api: ApiClient, rng: random.Random, ids: Sequence[str], count: int
) -> tuple[PhaseTiming, dict[str, int]]:
    """STOP ``count`` streams via the API; time API call -> upstream session closed."""
    timing = PhaseTiming(label="STOP")
    monitor.phase = "STOP via API"
    chosen = sorted(rng.sample(list(ids), min(count, len(ids))))
    sim = monitor.fleet.simulator
    produced: dict[str, int] = {}
    sent_at: dict[str, float] = {}
    for stream_id in chosen:
        produced[stream_id] = sim.current_seq(stream_id)
        sent_at[stream_id] = time.time()
        api.stop(stream_id)
    monitor.event(f"STOP sent for {' '.join(chosen)}")

    timing.converged = monitor.wait("STOPs", _every(chosen, _closed))
    for stream_id in chosen:
        sessions = monitor.last.sessions.get(stream_id, []) if monitor.last else []
        at = sent_at[stream_id]
        closes = [
            s.closed_at for s in sessions if s.opened_at <= at and s.closed_at and s.closed_at >= at
        ]
        if closes:
            timing.seconds[stream_id] = max(closes) - at
    _announce(monitor, timing, "STOP: upstream sessions closed")
    return timing, produced


def _read_messages(monitor: _Monitor, stream_id: str) -> list[dict[str, Any]]:
    store = MessageStore(monitor.ddb, monitor.fleet.resources.messages_table)
    # only what the audit reads: moto's cost grows with every attribute it serialises
    return store.read_all(
        connection_pk(stream_id), attributes=("seq", "message_data", "lease_epoch")
    )


def run_demo(
    options: DemoOptions,
    console: Console,
    *,
    cancel: threading.Event | None = None,
    on_fleet: Callable[[LocalFleet], object] | None = None,
) -> DemoReport:
    """Run the whole scenario; the fleet is always stopped before this returns.

    ``cancel`` set: the scenario raises :class:`DemoInterrupted` at its next wait, after
    stopping the fleet (the first Ctrl-C). ``on_fleet`` is given the fleet before it starts
    (the CLI keeps it to abort it on a second Ctrl-C)."""
    seed = options.seed if options.seed is not None else random.SystemRandom().randrange(10_000)
    rng = random.Random(seed)
    ids = [f"demo-{n:02d}" for n in range(options.streams)]
    report = DemoReport(
        options=options,
        seed=seed,
        crash=PhaseTiming("crash"),
        handoff=PhaseTiming("handoff"),
        stop=PhaseTiming("STOP"),
    )
    started = time.monotonic()
    timings = options.timings
    if timings.rebalance_dwell_seconds is None:
        dwell = DEMO_DWELL_INTERVALS * timings.rebalance_seconds
        timings = replace(timings, rebalance_dwell_seconds=dwell)
    console.print(
        f"wsfleet demo: {options.workers} workers, {options.streams} streams, "
        f"lease {options.timings.lease_seconds:g} s, heartbeat "
        f"{options.timings.heartbeat_seconds:g} s, seed {seed}"
    )
    fleet = LocalFleet(
        workers=options.workers,
        timings=timings,
        rate=options.rate,
        run_dir=options.run_dir,
        progress=lambda message: console.print(f"  {message}", style="dim", highlight=False),
        task_events=options.task_events,
    )
    report.run_dir = fleet.run_dir
    if on_fleet is not None:
        on_fleet(fleet)
    with fleet:
        monitor = _Monitor(fleet, console, ids, cancel)
        if console.is_terminal:
            monitor.live = Live(monitor.render(), console=console, auto_refresh=False)
        with monitor.live or contextlib.nullcontext():
            _scenario(monitor, fleet, rng, ids, options, report)
            monitor.phase = "done"
            monitor.snapshot()
        if monitor.live is None:  # CI logs: the events were printed as they happened
            console.print(monitor.render())  # show the final tables once
        console.print("stopping the fleet", style="dim")
    report.elapsed_seconds = time.monotonic() - started
    return report


def _scenario(
    monitor: _Monitor,
    fleet: LocalFleet,
    rng: random.Random,
    ids: Sequence[str],
    options: DemoOptions,
    report: DemoReport,
) -> None:
    api = ApiClient(fleet.api_url)
    sim = fleet.simulator
    monitor.phase = "START"
    for stream_id in ids:
        sim.open_stream(stream_id, rate=options.rate)
        # The demo's feeds are finite: their end (a 1000 close) ends the connection STOPPED,
        # where the default would reconnect to a feed that is over (README "Real upstreams").
        api.start(stream_id, sim.url_for(stream_id), upstream={"normal_close": "final"})
    monitor.event(f"START sent for {len(ids)} streams via {fleet.api_url}")
    if not monitor.wait("every stream to flow", _every(ids, _streaming)):
        report.failures.append("not every stream started")
    monitor.phase = "streaming"
    monitor.pause(options.steady_seconds)

    report.crash, crashed = _disrupt(
        monitor, fleet, rng, label="crash", signum=signal.SIGKILL, exclude=set()
    )
    if crashed is not None:
        _restart(monitor, fleet, crashed, "ECS replaces the crashed task")
    live = _start_live(monitor, api, LIVE_RATE)
    report.handoff, drained = _disrupt(
        monitor,
        fleet,
        rng,
        label="handoff",
        signum=signal.SIGTERM,
        exclude=set() if crashed is None else {crashed},
        prefer=[h.stream_id for h in live],
    )
    if drained is not None:
        _restart(monitor, fleet, drained, "deploy")
        _deploy_the_rest(monitor, fleet, rng, live, drained)
    _end_live(monitor, live, report)
    report.failures += [
        f"{t.label} did not converge" for t in (report.crash, report.handoff) if not t.converged
    ]

    fleet.wait_workers_ready()
    report.rebalance, report.rebalance_line = _scale_out(monitor, fleet, ids)
    if not report.rebalance.converged:
        report.failures.append("the spread did not even out after a worker joined")
    report.stop, produced = _stop_some(monitor, api, rng, ids, options.stops)
    if not report.stop.converged:
        report.failures.append("STOP did not converge")
    remaining = [stream_id for stream_id in ids if stream_id not in produced]
    monitor.phase = "converging"
    if not monitor.wait("the remaining streams to flow", _every(remaining, _streaming)):
        report.failures.append("the fleet did not converge after the disruptions")
    monitor.pause(1.0)

    monitor.phase = "ending streams at the upstream"
    ended: dict[str, int] = {}
    for stream_id in remaining:
        ended[stream_id] = int(sim.end_stream(stream_id)["max_seq"])
    monitor.event(f"upstream ended {len(ended)} streams (normal close)")

    if monitor.wait("every connection to stop and release", _every(ids, _finished)):
        monitor.event("every connection is STOPPED and no lease is held")
    else:
        report.failures.append("not every connection stopped after the upstream ended")
    monitor.phase = "auditing"
    snap = monitor.snapshot(with_sessions=True)
    audits: list[StreamAudit] = []
    for stream_id in ids:
        row = snap.rows.get(stream_id)
        is_ended = stream_id in ended
        audits.append(
            audit_stream(
                stream_id,
                final_seq=ended[stream_id] if is_ended else produced[stream_id],
                ended=is_ended,
                checkpointed=row.last_seq if row else 0,
                items=_read_messages(monitor, stream_id),
                sessions=snap.sessions.get(stream_id, []),
            )
        )
    report.audit = FleetAudit(tuple(audits))
    rows = [row for stream_id in ids if (row := snap.rows.get(stream_id)) is not None]
    report.gaps = (sum(r.gap_resumes for r in rows), sum(r.gap_frames for r in rows))
    monitor.event(
        f"audit: produced {report.audit.produced}, stored {report.audit.stored}, "
        f"lost {report.audit.lost}, duplicated {report.audit.duplicated}"
    )


def _start_live(monitor: _Monitor, api: ApiClient, rate: float) -> list[LiveHandoff]:
    """START the live-only pair (one stream per hand-off mode) and wait until both flow."""
    sim = monitor.fleet.simulator
    live = []
    for mode in LIVE_MODES:
        handoff = LiveHandoff(stream_id=f"live-{mode}", mode=mode)
        options: dict[str, Any] = {"resume": "none", "normal_close": "final", "handoff": mode}
        sim.open_stream(handoff.stream_id, rate=rate)
        sim.set_shape(handoff.stream_id, "live_only")
        api.start(handoff.stream_id, sim.url_for(handoff.stream_id), upstream=options)
        live.append(handoff)
    ids = [h.stream_id for h in live]
    monitor.event(f"START sent for live-only streams {' '.join(ids)} (handoff overlap / break)")
    monitor.wait("the live-only streams to flow", _every(ids, _streaming))
    snap = monitor.snapshot()
    for handoff in live:
        row = snap.rows.get(handoff.stream_id)
        handoff.moves = -(row.epoch if row else 0)  # the epoch at the end minus this one
    return live


def _deploy_the_rest(
    monitor: _Monitor,
    fleet: LocalFleet,
    rng: random.Random,
    live: Sequence[LiveHandoff],
    drained: int,
) -> None:
    """The deploy rolls on to a worker still holding a live stream the first drain did not
    move (the pair may have landed on two workers)."""
    snap = monitor.snapshot()
    unmoved = [
        h.stream_id
        for h in live
        if (row := snap.rows.get(h.stream_id)) is not None and row.epoch == -h.moves
    ]
    if not unmoved:
        return
    fleet.wait_workers_ready()
    timing, index = _disrupt(
        monitor, fleet, rng, label="deploy (next task)", signum=signal.SIGTERM,
        exclude={drained}, prefer=unmoved,
    )  # fmt: skip
    if index is not None:
        _restart(monitor, fleet, index, "deploy")
    if not timing.converged:
        monitor.event("[red]the deploy's next task did not converge[/red]")


def _end_live(monitor: _Monitor, live: Sequence[LiveHandoff], report: DemoReport) -> None:
    """End the live-only pair at the upstream and audit each: moves, lost, gap, overlap. A
    loss the connection reports is shown, not failed (an overlap may fall back to break, by
    design); a loss it does not report fails the demo."""
    ids = [h.stream_id for h in live]
    sim = monitor.fleet.simulator
    for stream_id in ids:
        sim.end_stream(stream_id)
    if not monitor.wait("the live-only streams to stop", _every(ids, _finished)):
        report.failures.append("the live-only streams did not stop after the upstream ended")
    snap = monitor.snapshot(with_sessions=True)
    for handoff in live:
        row = snap.rows.get(handoff.stream_id)
        handoff.moves += row.epoch if row else 0
        handoff.gap_frames = row.gap_frames if row else 0
        seqs = {
            int(item["seq"])
            for item in _read_messages(monitor, handoff.stream_id)
            if item.get("seq") is not None
        }
        handoff.stored = len(seqs)
        handoff.lost = (max(seqs) - min(seqs) + 1 - len(seqs)) if seqs else 0
        sessions = snap.sessions.get(handoff.stream_id, [])
        handoff.overlap_seconds = sum(t for _, _, t in overlap_seconds(sessions))
        if handoff.lost != handoff.gap_frames:
            report.failures.append(
                f"{handoff.stream_id}: {handoff.lost} frame(s) lost but "
                f"{handoff.gap_frames} reported"
            )
    report.live = list(live)
    monitor.event(
        "live-only through the deploy: "
        + ", ".join(f"{h.mode} lost {h.lost} in {h.moves} move(s)" for h in live)
    )


def _live_row(handoff: LiveHandoff) -> tuple[str, str, str, str]:
    what = (
        f"handoff {handoff.mode}: {handoff.moves} move(s), {handoff.stored} stored, gap reported "
        f"{handoff.gap_frames}, upstream overlap {handoff.overlap_seconds:.2f} s"
    )
    return (f"live-only {handoff.mode}", str(handoff.lost), "", what)


def _timing_row(label: str, timing: PhaseTiming, what: str) -> tuple[str, str, str, str]:
    summary = timing.summary()
    streams = f"{len(timing.seconds)} stream(s)"
    victim = f"{timing.victim}: " if timing.victim else ""
    if summary is None:
        return (label, "-", "-", f"{victim}not measured")
    return (label, f"{summary[0]:.2f} s", f"{summary[1]:.2f} s", f"{victim}{streams}, {what}")


def crash_path(options: DemoOptions) -> str:
    """How the crash was failed over: what the summary's crash line measured."""
    if options.task_events:
        return "SIGKILL -> task exit event -> first frame elsewhere"
    return "SIGKILL -> worker lease expired (no task exit event) -> first frame elsewhere"


def render_summary(report: DemoReport) -> Table:
    """The closing summary as a rich table (plain enough to paste into a README)."""
    options = report.options
    t = options.timings
    audit = report.audit
    table = Table(
        title=(
            f"wsfleet demo: {options.workers} workers, {options.streams} streams, "
            f"lease {t.lease_seconds:g} s, heartbeat {t.heartbeat_seconds:g} s, "
            f"seed {report.seed}, {report.elapsed_seconds:.0f} s"
        ),
        title_justify="left",
    )
    for column, justify in (("", "left"), ("p50", "right"), ("max", "right"), ("", "left")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    joined = report.rebalance_line or "a worker joins -> the spread evens out"
    phases = (
        ("crash failover", report.crash, crash_path(options)),
        ("graceful handoff", report.handoff, "SIGTERM -> first frame elsewhere"),
        ("rebalance", report.rebalance,
         f"{joined}; old session closed -> new one's first frame (< 0: they overlapped)"),
        ("STOP", report.stop, "API call -> upstream socket closed"),
    )
    for label, timing, what in phases:
        table.add_row(*_timing_row(label, timing, what))
    table.add_section()
    overlaps = (
        f"bad content, stale-epoch writes ({audit.overlapping_sessions} upstream session "
        "overlaps: planned make-before-break hand-offs)"
    )
    skipped = f"frames the upstream skipped, reported in {report.gaps[0]} resume(s) (0: replayed)"
    counts = (
        ("produced", audit.produced, "frames, to each stream's end or STOP"),
        ("stored", audit.stored, "items in the messages table"),
        ("lost", audit.lost, "produced up to end/checkpoint, not stored"),
        ("duplicated", audit.duplicated, overlaps),
        ("resume gaps", report.gaps[1], skipped),
    )
    for label, count, what in counts:
        table.add_row(label, str(count), "", what)
    if report.live:
        table.add_section()
        for handoff in report.live:
            table.add_row(*_live_row(handoff))
    table.add_section()
    failures = report.failures or [f"{audit.lost} lost, {audit.duplicated} duplicated"]
    verdict = "OK" if report.ok else "FAILED"
    table.add_row("result", verdict, "", "" if report.ok else "; ".join(failures))
    table.caption = f"logs: {report.run_dir}" if report.run_dir else None
    return table
