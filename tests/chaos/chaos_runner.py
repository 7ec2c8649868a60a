"""Chaos scenario runner: a local fleet under crashes, drains, zombies, STOPs and AWS faults.

One run:

1. start a :class:`~bench.faults.FaultyFleet` (moto, simulator, the three Lambdas,
   the Streams poller, N workers whose AWS traffic crosses the fault proxy) with short
   timings, and START the streams through the API;
2. START the hostile-upstream streams beside them: ``hostile-frames`` (armed with bad-seq and
   maximum-size non-ASCII frames during the run and again once healed), ``hostile-flood``
   (``flood_rate`` frames/s, audited like the others), ``hostile-redirect`` (a 302 to
   127.0.0.2, where a trap listener counts connections), ``hostile-breaker`` (every session
   opens with a frame over the worker's limit), ``hostile-creep`` (every session sends one new
   frame, then one over the limit: the checkpoint moves each time) and ``hostile-trickle``
   (every session trickles a message that never completes); the last three must end FAILED;
3. play the seeded schedule (:mod:`chaos_schedule`, including its poison and hostile tracks)
   while a sampler thread records the connections table every ~0.2 s;
4. heal: clear faults, SIGCONT paused workers, replace dead ones, poison the live workers'
   queues once more; wait until the fleet converges (bounded), then arm hostile frames on the
   quiet fleet and wait (bounded) until they are stored and the poisoned queues drain;
5. collect the simulator's session log, the records, every stored message and the workers'
   exits, STOP and hand-off log lines, and check the invariants (:mod:`chaos_history`).

With ``handoffs`` (``WSFLEET_CHAOS_HANDOFFS``) the schedule also disrupts that many planned
hand-offs midway (issue #26: SIGKILL of the giver or a taker, SIGSTOP of a taker, a partition
from DynamoDB, a taker whose upstream sessions get no frame); the hand-offs the givers
log (:data:`HANDOFF_PREPARED_LOG`, :data:`HANDOFF_DECIDED_LOG`) are the planned overlaps the
checker tells from a split brain, and every upstream session is attributed to the worker that
opened it (:data:`SOCKET_OPENED_LOG`: its client address, logged before the handshake).

Configuration from the environment (defaults in :class:`ChaosConfig`): ``WSFLEET_CHAOS_SEED``,
``WSFLEET_CHAOS_WORKERS``, ``WSFLEET_CHAOS_STREAMS``, ``WSFLEET_CHAOS_SECONDS``,
``WSFLEET_CHAOS_RATE``. Standalone::

    WSFLEET_CHAOS_SEED=7 PYTHONPATH=. python tests/chaos/chaos_runner.py  # from the repository root
"""

from __future__ import annotations

import contextlib
import heapq
import json
import os
import random
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from chaos_history import (
    Adoption,
    ForgedStop,
    Pause,
    PlannedHandoff,
    Sample,
    SocketOpen,
    StopOutcome,
    Verdict,
    WorkerExit,
    check_history,
    check_hostile,
    check_poison,
    replay_windows,
)
from chaos_schedule import FAULT_MENUS, PARTITION_RULES, POISON_BODIES, Action, make_schedule

from bench.waiting import WaitTimeout, wait_until

__all__ = ["DEFAULT_SEED", "ChaosConfig", "ChaosReport", "run_chaos"]

DEFAULT_SEED = 20240601

#: The hostile-upstream track's streams (outside the schedule's STOP/START draws).
HOSTILE_FRAMES = "hostile-frames"  # normal frames, plus bad-seq and maximum-size ones
HOSTILE_FLOOD = "hostile-flood"  # normal frames at ChaosConfig.flood_rate: fully audited
HOSTILE_REDIRECT = "hostile-redirect"  # 302 to a loopback host the policy refuses
HOSTILE_BREAKER = "hostile-breaker"  # every session opens with a frame over the limit
HOSTILE_CREEP = "hostile-creep"  # one new frame, then one over the limit, on every session
HOSTILE_TRICKLE = "hostile-trickle"  # a fragmented message trickled a byte at a time, forever
#: The streams that must end FAILED within the breaker's bound (see check_hostile).
LOOPING = (HOSTILE_CREEP, HOSTILE_TRICKLE)
#: The worker's WORKER_MESSAGE_TIMEOUT_SECONDS in the run: short, so the trickled stream's
#: sessions end quickly (the default 30 s would only make the run longer).
MESSAGE_TIMEOUT_SECONDS = 1.0
#: Over WORKER_MAX_FRAME_BYTES (393,216): the worker's client closes 1009, a poison failure.
BREAKER_FRAME_BYTES = 500_000
#: The refused redirect target: loopback, but not 127.0.0.1 (the local allowed list).
TRAP_HOST = "127.0.0.2"
#: What a giver logs about a make-before-break hand-off, each line with ``connection_id`` and
#: ``epoch`` (the giver's): when it announced it (PREPARE sent), and when it decided it
#: (transfer, or a fallback to break) with ``waited_ms`` since the PREPARE. The checker's
#: planned-overlap windows: from the PREPARE to the decision (plus the giver's close).
HANDOFF_PREPARED_LOG = "hand-off prepared"
HANDOFF_DECIDED_LOG = "hand-off decided"
#: What a worker logs of every upstream socket before its handshake (``local``: the client
#: address the simulator logs as the session's ``peer``; ``prepared``: a taker's), and when a
#: taker's prepared session becomes an owner's: the checker attributes sessions with them.
SOCKET_OPENED_LOG = "upstream socket opened"
ADOPTED_LOG = "prepared session adopted"
#: HANDOFF_PREPARE_SECONDS in the run (the design's default).
HANDOFF_PREPARE_SECONDS = 3.0


@dataclass(frozen=True)
class ChaosConfig:
    seed: int = DEFAULT_SEED
    workers: int = 4
    streams: int = 50
    chaos_seconds: float = 40.0
    rate: float = 1.0  # frames/s per stream
    lease_seconds: float = 6.0
    heartbeat_seconds: float = 1.5
    safety_margin_seconds: float = 1.5
    reconcile_pass_seconds: float = 1.0
    drain_timeout_seconds: float = 5.0
    #: Above the reconciler's re-hint floor (60 s): a hint lost with a crashed worker or a
    #: reconcile pass cut short is only replaced after it (see the report's convergence time).
    converge_timeout_seconds: float = 150.0
    sample_every_seconds: float = 0.2
    flood_rate: float = 50.0  # frames/s on the hostile-flood stream
    breaker_max_failures: int = 5
    #: Where the workers store frames (MESSAGE_SINK): ``kinesis`` checks the at-least-once
    #: contract (every duplicate inside a reported replay window) instead of the table's.
    sink: str = "dynamodb"
    #: MESSAGE_REPLAY_WINDOW on a stream sink: small, so the windows checked are narrow.
    replay_window: int = 20
    #: Disrupted planned hand-offs in the schedule (its own track; 0: none).
    handoffs: int = 0
    #: Mean seconds between the primary track's actions.
    mean_gap: float = 2.5
    run_dir: Path | None = None

    @classmethod
    def from_env(cls, **overrides: Any) -> ChaosConfig:
        env = os.environ
        values: dict[str, Any] = {}
        for name, field_name, kind in (
            ("WSFLEET_CHAOS_SEED", "seed", int),
            ("WSFLEET_CHAOS_WORKERS", "workers", int),
            ("WSFLEET_CHAOS_STREAMS", "streams", int),
            ("WSFLEET_CHAOS_SECONDS", "chaos_seconds", float),
            ("WSFLEET_CHAOS_RATE", "rate", float),
            ("WSFLEET_CHAOS_SINK", "sink", str),
            ("WSFLEET_CHAOS_HANDOFFS", "handoffs", int),
        ):
            if env.get(name):
                values[field_name] = kind(env[name])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return replace(cls(), **values)


@dataclass
class ChaosReport:
    config: ChaosConfig
    schedule: list[Action]
    events: list[str] = field(default_factory=list)
    verdict: Verdict = field(default_factory=Verdict)
    converged_after_seconds: float | None = None
    #: the wait, right before the end check, for the fleet to be converged again
    settled_after_seconds: float | None = None
    proxy: dict[str, int] = field(default_factory=dict)
    wall_seconds: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.verdict.ok

    def summary(self) -> str:
        c = self.config
        lines = [
            f"chaos run seed={c.seed}: {c.workers} workers, {c.streams} streams at {c.rate:g}/s "
            f"into {c.sink}, "
            f"{c.chaos_seconds:g} s of chaos, lease {c.lease_seconds:g} s / heartbeat "
            f"{c.heartbeat_seconds:g} s / margin {c.safety_margin_seconds:g} s "
            f"({self.wall_seconds:.0f} s wall)",
            "events:",
            *(f"  {event}" for event in self.events),
            f"converged {self.converged_after_seconds:.1f} s after healing"
            if self.converged_after_seconds is not None else "did NOT converge",
            f"settled again {self.settled_after_seconds:.1f} s before the end check"
            if self.settled_after_seconds is not None else "did NOT settle before the end check",
            "figures: " + json.dumps(self.verdict.figures),
            "proxy: " + json.dumps(self.proxy),
        ]  # fmt: skip
        if self.error:
            lines.append(f"ERROR: {self.error}")
        if self.verdict.violations:
            lines.append(f"{len(self.verdict.violations)} violation(s):")
            lines += [f"  {v}" for v in self.verdict.violations[:40]]
        lines.append(
            f"verdict: {'OK' if self.ok else 'FAILED'}; replay with WSFLEET_CHAOS_SEED={c.seed}"
        )
        return "\n".join(lines)


class _Sampler(threading.Thread):
    """Scans the connections table every ``every`` seconds (stamped after each response)."""

    def __init__(self, client: Any, table: str, every: float) -> None:
        super().__init__(name="chaos-sampler", daemon=True)
        self._client = client
        self._table = table
        self._every = every
        self._halt = threading.Event()
        self.samples: list[Sample] = []
        self.errors = 0

    def run(self) -> None:
        from wsfleet.record import connection_id_from_pk
        from wsfleet_local.client import scan_table

        while not self._halt.is_set():
            try:
                connections, _workers = scan_table(self._client, self._table)
            except Exception:  # the backend is busy: a missed sample is only less evidence
                self.errors += 1
                self._halt.wait(self._every)
                continue
            t = time.time()
            for item in connections:
                low, high = item.get("replayed_from_seq"), item.get("replayed_to_seq")
                self.samples.append(
                    Sample(
                        t=t,
                        stream_id=connection_id_from_pk(str(item["pk"])),
                        epoch=int(item.get("lease_epoch", 0)),
                        owner=str(item.get("lease_owner", "")),
                        last_seq=int(item.get("last_seq", 0)),
                        desired_state=str(item.get("desired_state", "")),
                        replayed=None if low is None or high is None else (int(low), int(high)),
                    )
                )
            self._halt.wait(self._every)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


class _Trap(threading.Thread):
    """Listens on the refused redirect target and counts connections (there must be none)."""

    def __init__(self) -> None:
        super().__init__(name="chaos-trap", daemon=True)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((TRAP_HOST, 0))
        self._sock.listen(16)
        self._sock.settimeout(0.5)
        self.port = int(self._sock.getsockname()[1])
        self.accepted = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
        self._sock.close()


class _Chaos:
    """Plays a schedule against a running FaultyFleet (single-threaded, like LocalFleet)."""

    def __init__(
        self, faulty: Any, config: ChaosConfig, report: ChaosReport, client: Any = None
    ) -> None:
        self.faulty = faulty
        self.fleet = faulty.fleet
        self.config = config
        self.report = report
        self.client = client
        self.rng = random.Random(config.seed + 1)
        # The poison track draws from its own RNG so it leaves the STOP/START choices alone.
        self.poison_rng = random.Random(config.seed + 2)
        self.all_slots = list(self.fleet.workers)  # every worker incarnation, for `survived`
        #: Hostile frames found stored while their session was open (_hostile_stored).
        self.hostile_verified = 0
        self.poisoned_queues: dict[str, str] = {}  # control queue url -> its worker id
        self.forged: list[ForgedStop] = []
        # Forged-STOP targets are never STOPped by the schedule, so any STOP a worker applies
        # to one of them was the forged one.
        self.protected: set[str] = set()
        self.poison_refused: dict[str, int] = {}  # body label -> times SQS refused it
        self.poison_sent = 0
        self.ids = [f"chaos-{i:03d}" for i in range(config.streams)]
        self.desired = dict.fromkeys(self.ids, "STARTED")
        self.paused: dict[int, tuple[str, float]] = {}  # slot -> (worker id, stopped at)
        self.revive_waits: dict[int, float] = {}
        self.pauses: list[Pause] = []
        self.fault_window_end = 0.0
        self.muted: set[str] = set()  # streams whose new upstream sessions get nothing
        self.partition_end = 0.0  # schedule time at which the partition ends
        self.started = time.monotonic()
        from wsfleet_local.client import ApiClient

        self.api = ApiClient(self.fleet.api_url)

    def log(self, message: str) -> None:
        line = f"t+{time.monotonic() - self.started:5.1f}s {message}"
        self.report.events.append(line)
        print(f"[chaos] {line}", file=sys.stderr, flush=True)

    # -- actions ------------------------------------------------------------------------------
    def run_schedule(self, schedule: list[Action]) -> None:
        self.started = time.monotonic()
        queue = list(schedule)
        heapq.heapify(queue)
        while queue:
            action = heapq.heappop(queue)
            delay = self.started + action.at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            retry = self.apply(action)
            if retry is not None:
                heapq.heappush(queue, replace(action, at=action.at + retry))
        remaining = self.started + self.config.chaos_seconds - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)

    def apply(self, action: Action) -> float | None:
        """Carry out one action; a delay in seconds asks for it to be retried later."""
        fleet = self.fleet
        if action.slot is not None:
            slot = fleet.workers[action.slot]
        match action.kind:
            case "handoff":  # a drain whose hand-offs the follow-up disrupts midway
                if not _running(slot) or action.slot in self.paused:
                    self.log(f"skip hand-off ({action.variant}) of slot {action.slot}: "
                             "not running")  # fmt: skip
                    return None
                if action.variant == "mute_taker":
                    self._mute_held_by(slot.worker_id)
                fleet.kill_worker(action.slot, signal.SIGTERM)
                self.log(f"SIGTERM {slot.worker_id}: hand-offs, then {action.variant} "
                         f"{action.duration:.1f} s in")  # fmt: skip
            case "kill_draining":  # the giver dies mid-hand-off
                if not slot.alive() or action.slot in self.paused:
                    self.log(f"skip SIGKILL of slot {action.slot}: already gone")
                    return None
                fleet.kill_worker(action.slot, signal.SIGKILL)
                self.log(f"SIGKILL {slot.worker_id} mid-drain")
            case "partition":
                from bench.faults import FaultRule
                from wsfleet_local.fleet import FleetError

                # of a running fleet: a worker still starting would fail its start (exit 1),
                # which the partition is not about (revives wait for its end, see above)
                for index, starting in enumerate(fleet.workers):
                    if starting.alive() and index not in self.paused:
                        with contextlib.suppress(FleetError):
                            fleet._wait_worker_ready(starting)
                self.faulty.faults.set_rules([FaultRule.from_dict(r) for r in PARTITION_RULES])
                self.fault_window_end = max(self.fault_window_end, action.at + action.duration)
                self.partition_end = action.at + action.duration
                self.log(f"partition: DynamoDB unreachable for {action.duration:.1f} s")
            case "unmute":
                for stream_id in sorted(self.muted):
                    self.fleet.simulator.mute_stream(stream_id, False)
                self.log(f"unmuted {len(self.muted)} stream(s)")
                self.muted.clear()
            case "kill" | "term":
                signum = signal.SIGKILL if action.kind == "kill" else signal.SIGTERM
                if not _running(slot) or action.slot in self.paused:
                    self.log(f"skip {action.kind} of slot {action.slot}: not running")
                    return None
                fleet.kill_worker(action.slot, signum)
                self.log(f"{signum.name} {slot.worker_id}")
            case "revive":
                # ECS would start the replacement again until it can register; a worker
                # started into the partition fails its start (exit 1): start it after
                wait = self.partition_end - (time.monotonic() - self.started)
                if wait > 0:
                    return wait + 0.2
                if slot.alive():
                    waited = self.revive_waits.get(action.slot, 0.0)
                    if waited > self.config.drain_timeout_seconds + 10:  # a stuck drain
                        fleet.kill_worker(action.slot, signal.SIGKILL)
                        self.log(f"{slot.worker_id} still draining: SIGKILL")
                    self.revive_waits[action.slot] = waited + 0.5
                    return 0.5
                self.revive_waits.pop(action.slot, None)
                new = fleet.restart_worker(action.slot, wait_ready=False)
                self.all_slots.append(new)
                self.log(f"replaced {slot.worker_id} by {new.worker_id}")
            case "pause":
                if not _running(slot):
                    self.log(f"skip pause of slot {action.slot}: not running")
                    return None
                fleet.kill_worker(action.slot, signal.SIGSTOP)
                self.paused[action.slot] = (slot.worker_id, time.time())
                self.log(f"SIGSTOP {slot.worker_id} for {action.duration:.1f} s (zombie)")
            case "resume":
                self._resume(action.slot)
            case "restart":  # a rolling deploy: drain, and the slot is replaced at once
                if not _running(slot) or action.slot in self.paused:
                    self.log(f"skip restart of slot {action.slot}: not running")
                    return None
                fleet.kill_worker(action.slot, signal.SIGTERM)
                self.log(f"SIGTERM {slot.worker_id} (rolling restart)")
                return None
            case "stop" | "start":
                started = sorted(
                    i for i, s in self.desired.items() if s == "STARTED" and i not in self.protected
                )
                stopped = sorted(
                    i for i, s in self.desired.items() if s == "STOPPED" and i not in self.protected
                )
                # a re-START needs a stopped stream: with none yet, STOP one instead
                if action.kind == "start" and stopped:
                    again = self.rng.choice(stopped)
                    self.api.start(again, self.fleet.simulator.url_for(again))
                    self.desired[again] = "STARTED"
                    self.log(f"re-START {again}")
                elif started:
                    victim = self.rng.choice(started)
                    self.api.stop(victim)
                    self.desired[victim] = "STOPPED"
                    self.log(f"STOP {victim}")
            case "faults":
                from bench.faults import FaultRule

                name, rules = FAULT_MENUS[action.menu or 0]
                if action.at < self.partition_end:  # the partition is every fault at once
                    self.log(f"skip faults ({name}): DynamoDB is partitioned away")
                    return None
                self.faulty.faults.set_rules([FaultRule.from_dict(r) for r in rules])
                self.fault_window_end = action.at + action.duration
                self.log(f"faults on: {name} for {action.duration:.1f} s")
            case "poison":
                self._poison()
            case "hostile":
                self.arm_hostile()
            case "clear":
                if action.at + 1e-6 >= max(self.fault_window_end, self.partition_end):
                    self.faulty.faults.clear_rules()
                    self.log("faults off")
            case _:
                raise ValueError(f"unknown action {action.kind}")
        return None

    def _mute_held_by(self, worker_id: str) -> None:
        """Mute the upstream streams ``worker_id`` holds: its takers' sessions get no frame."""
        records = _records(self.client, self.fleet.resources.connections_table)
        held = sorted(
            i for i, r in records.items()
            if r.lease_owner == worker_id and self.desired.get(i) == "STARTED"
        )  # fmt: skip
        for stream_id in held:
            self.fleet.simulator.mute_stream(stream_id, True)
        self.muted.update(held)
        self.log(f"muted {len(held)} stream(s) held by {worker_id}")

    def _send(self, sqs: Any, url: str, label: str, body: str) -> None:
        from botocore.exceptions import ClientError

        try:
            sqs.send_message(QueueUrl=url, MessageBody=body)
            self.poison_sent += 1
        except ClientError as exc:  # SQS refused it at the door (size, characters): recorded
            self.poison_refused[label] = self.poison_refused.get(label, 0) + 1
            code = exc.response.get("Error", {}).get("Code")
            if self.poison_refused[label] == 1:
                self.log(f"poison {label!r} refused by SQS ({code})")

    def _poison(self) -> None:
        """Poison bodies to the hint queue and every running worker's control queue, and a
        forged STOP (the stream's current epoch, so only the record can tell) to each."""
        from botocore.exceptions import ClientError

        from wsfleet.control import StopCommand, control_queue_name
        from wsfleet.record import connection_pk

        sqs = _direct_client("sqs", self.fleet.endpoint_url)
        hint_url = self.fleet.resources.queues["HintQueue"]
        for label, body in POISON_BODIES:
            self._send(sqs, hint_url, label, body)
        records = _records(self.client, self.fleet.resources.connections_table)
        targets = []
        poisoned = 0
        for index, slot in enumerate(self.fleet.workers):
            if not _running(slot) or index in self.paused:
                continue
            name = control_queue_name(self.fleet.control_queue_prefix, slot.worker_id)
            try:
                url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
            except sqs.exceptions.QueueDoesNotExist:  # a worker still starting: next time
                continue
            self.poisoned_queues[url] = slot.worker_id
            poisoned += 1
            for label, body in POISON_BODIES:
                self._send(sqs, url, label, body)
            held = sorted(
                i for i, r in records.items()
                if r.lease_owner == slot.worker_id and self.desired.get(i) == "STARTED"
                and i not in self.protected
            )  # fmt: skip
            if held:
                victim = self.poison_rng.choice(held)
                epoch = records[victim].lease_epoch
                sent_at = time.time()
                try:
                    sqs.send_message(
                        QueueUrl=url, MessageBody=StopCommand(connection_pk(victim), epoch).body()
                    )
                except ClientError as exc:
                    # The queue went between get_queue_url and here (the worker drained, or the
                    # janitor removed a dead worker's queue): nothing was forged, nothing to judge.
                    code = exc.response.get("Error", {}).get("Code")
                    self.log(f"forged STOP of {victim} not sent ({code})")
                    continue
                self.protected.add(victim)
                self.forged.append(ForgedStop(victim, slot.worker_id, epoch, sent_at))
                targets.append(f"{victim}@{epoch}")
        self.log(
            f"poison: {len(POISON_BODIES)} bodies to the hint queue and "
            f"{poisoned} control queue(s); forged STOP of {', '.join(targets) or 'none'}"
        )

    def start_hostile(self, trap_port: int) -> None:
        """START the hostile-upstream streams, each with the end state it must reach."""
        sim = self.fleet.simulator
        sim.open_stream(HOSTILE_FLOOD, rate=self.config.flood_rate)
        sim.redirect_stream(HOSTILE_REDIRECT, f"ws://{TRAP_HOST}:{trap_port}/trap")
        sim.poison_stream(HOSTILE_BREAKER, BREAKER_FRAME_BYTES)
        sim.creep_stream(HOSTILE_CREEP, BREAKER_FRAME_BYTES)
        sim.trickle_stream(HOSTILE_TRICKLE, 0.1)
        for stream_id, end in (
            (HOSTILE_FRAMES, "STARTED"),
            (HOSTILE_FLOOD, "STARTED"),
            (HOSTILE_REDIRECT, "STOPPED"),
            (HOSTILE_BREAKER, "FAILED"),
            (HOSTILE_CREEP, "FAILED"),
            (HOSTILE_TRICKLE, "FAILED"),
        ):
            self.api.start(stream_id, sim.url_for(stream_id))
            self.desired[stream_id] = end
            self.protected.add(stream_id)
        self.log(
            f"hostile upstreams: {HOSTILE_FLOOD} at {self.config.flood_rate:g}/s, "
            f"{HOSTILE_REDIRECT} -> {TRAP_HOST}:{trap_port}, {HOSTILE_BREAKER} opens with "
            f"{BREAKER_FRAME_BYTES} bytes, {HOSTILE_CREEP} sends one new frame then such a "
            f"frame, {HOSTILE_TRICKLE} trickles a message a byte per 0.1 s"
        )

    def arm_hostile(self, max_size_frames: int = 1) -> None:
        sim = self.fleet.simulator
        for kind in ("huge_seq", "digits_seq", "out_of_range_seq"):
            sim.inject_hostile(HOSTILE_FRAMES, kind)
        for _ in range(max_size_frames):  # several back to back: a burst of the largest
            sim.inject_hostile(HOSTILE_FRAMES, "max_size")
        self.log(f"hostile frames armed on {HOSTILE_FRAMES} ({max_size_frames} max-size)")

    def _resume(self, index: int) -> None:
        entry = self.paused.pop(index, None)
        if entry is None:
            return
        worker_id, stopped_at = entry
        self.fleet.kill_worker(index, signal.SIGCONT)
        self.pauses.append(Pause(worker_id, stopped_at, time.time()))
        self.log(f"SIGCONT {worker_id}")

    # -- healing and convergence --------------------------------------------------------------
    def heal(self) -> None:
        self.faulty.faults.clear_rules()
        for stream_id in sorted(self.muted):
            self.fleet.simulator.mute_stream(stream_id, False)
        self.muted.clear()
        for index in list(self.paused):
            self._resume(index)
        for index, slot in enumerate(self.fleet.workers):
            if not slot.alive():
                new = self.fleet.restart_worker(index, wait_ready=False)
                self.all_slots.append(new)
                self.log(f"heal: replaced {slot.worker_id} by {new.worker_id}")


def _running(slot: Any) -> bool:
    """The slot's worker is alive and not draining (no SIGTERM sent to it yet)."""
    return bool(slot.alive()) and signal.SIGTERM not in slot.process.signals_sent


def _direct_client(service: str, endpoint_url: str) -> Any:
    """A client straight to the backend: the observer is not behind the fault proxy.

    Its read timeout is generous: the observer's reads (a whole table, every stored message)
    are large, the machine may be loaded, and a timeout here would fail the run for the
    observer's sake, not the fleet's.
    """
    import boto3

    from wsfleet.aws import client_config

    session = boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    )
    config = client_config(read_timeout=60.0, max_attempts=8)
    return session.client(service, endpoint_url=endpoint_url, config=config)


def _live_worker_ids(fleet: Any) -> set[str]:
    return {slot.worker_id for slot in fleet.workers if slot.alive()}


def _records(client: Any, table: str) -> dict[str, Any]:
    return _table(client, table)[0]


def _stream_items(fleet: Any, ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Every frame of the fleet's Kinesis stream (read once, from the trim horizon, straight
    from the backend), as the table's items (``sk``, ``message_data``...), duplicates kept."""
    import base64

    from wsfleet.sinks.kinesis import deaggregate

    kinesis = _direct_client("kinesis", fleet.endpoint_url)
    stream = fleet.extra_worker_env["MESSAGE_STREAM"]
    wanted = set(ids)
    items: dict[str, list[dict[str, Any]]] = {i: [] for i in ids}
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        iterator = kinesis.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while iterator:
            page = kinesis.get_records(ShardIterator=iterator, Limit=10_000)
            for record in page["Records"]:
                key = record["PartitionKey"]
                if key not in wanted:
                    continue
                for _key, data in deaggregate(record["Data"], key):
                    frame = json.loads(data)
                    raw = frame.get("data_base64")
                    items[key].append({
                        **frame,
                        "sk": frame.get("key"),
                        "message_data": base64.b64decode(raw) if raw else frame.get("data"),
                    })  # fmt: skip
            records = page["Records"]
            caught_up = not records or (
                page.get("MillisBehindLatest") == 0 and len(records) < 10_000
            )
            iterator = None if caught_up else page.get("NextShardIterator")
    return items


def _table(client: Any, table: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Connection records by stream id and worker records by worker id."""
    from wsfleet.record import ConnectionRecord, WorkerRecord, connection_id_from_pk
    from wsfleet_local.client import scan_table

    connections, workers = scan_table(client, table)
    records = {
        connection_id_from_pk(str(item["pk"])): ConnectionRecord.from_item(item)
        for item in connections
    }
    return records, {str(w["worker_id"]): WorkerRecord.from_item(w) for w in workers}


def _unconverged(chaos: _Chaos, client: Any) -> tuple[list[str], set[str]]:
    """The streams not yet where they should be (one line each), and the live worker ids.

    Converged: every stream's record has its desired state; a STARTED one is held by a live
    worker process whose worker lease is live, with exactly one open upstream session; a
    STOPPED one has none.
    """
    from wsfleet.lease import is_worker_alive
    from wsfleet.record import worker_base_id

    fleet = chaos.fleet
    records, workers = _table(client, fleet.resources.connections_table)
    live = _live_worker_ids(fleet)
    now_ms = int(time.time() * 1000)
    open_by_stream: dict[str, int] = {}
    for session in fleet.simulator.open_sessions():
        open_by_stream[session.stream_id] = open_by_stream.get(session.stream_id, 0) + 1
    stuck = []
    for stream_id, desired in sorted(chaos.desired.items()):
        record = records.get(stream_id)
        if record is None:
            stuck.append(f"{stream_id}: no record")
            continue
        if record.desired_state.value != desired:
            stuck.append(f"{stream_id}: {record.desired_state.value}, wanted {desired}")
            continue
        owner = workers.get(record.lease_owner)
        state = (
            "free" if not record.lease_owner
            else "expired" if not is_worker_alive(owner, now_ms)
            else "held-by-dead" if worker_base_id(record.lease_owner) not in live else "held"
        )  # fmt: skip
        if desired == "STARTED" and (state != "held" or open_by_stream.get(stream_id, 0) != 1):
            expired = (now_ms - owner.expires_at_ms) / 1000 if owner else None
            stuck.append(
                f"{stream_id}: {state} owner={record.lease_owner!r} epoch={record.lease_epoch} "
                f"owner lease expired {expired} s ago, "
                f"open sessions {open_by_stream.get(stream_id, 0)}"
            )
        elif desired == "STOPPED" and open_by_stream.get(stream_id, 0):
            stuck.append(f"{stream_id}: STOPPED with {open_by_stream[stream_id]} open session(s)")
    return stuck, live


def _is_converged(chaos: _Chaos, client: Any) -> bool:
    return not _unconverged(chaos, client)[0]


def _diagnose(chaos: _Chaos, client: Any) -> list[str]:
    """Why the fleet has not converged: queues, lease states, a few stuck streams."""
    fleet = chaos.fleet
    lines: list[str] = []
    sqs = _direct_client("sqs", fleet.endpoint_url)
    for name in ("HintQueue", "HintDeadLetterQueue"):
        url = fleet.resources.queues.get(name)
        if url:
            response = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
            prefix = "ApproximateNumberOfMessages"
            counts = {
                attribute[len(prefix) :] or "Visible": count
                for attribute, count in response["Attributes"].items()
                if attribute.startswith(prefix)
            }
            lines.append(f"{name}: {counts}")
    stuck, live = _unconverged(chaos, client)
    lines.append(f"{len(stuck)} stream(s) not converged; live workers {sorted(live)}")
    lines += stuck[:8]
    return lines


def _hostile_evidence(
    chaos: _Chaos,
    sessions: list[Any],
    items: dict[str, Any],
    records: dict[str, Any],
    schedule: list[Action],
) -> dict[str, Any]:
    return dict(
        frames_stream=HOSTILE_FRAMES,
        sessions=[s for s in sessions if s.stream_id == HOSTILE_FRAMES],
        items=items.get(HOSTILE_FRAMES, []),
        redirect_stream=HOSTILE_REDIRECT,
        redirect_record=records.get(HOSTILE_REDIRECT),
        redirects_served=chaos.fleet.simulator.redirects_served(HOSTILE_REDIRECT),
        breaker_stream=HOSTILE_BREAKER,
        breaker_record=records.get(HOSTILE_BREAKER),
        breaker_sessions=sum(1 for s in sessions if s.stream_id == HOSTILE_BREAKER),
        max_failures=chaos.config.breaker_max_failures,
        disruptions=sum(1 for a in schedule if a.kind in ("kill", "term", "pause", "restart")),
        looping={
            stream: (records.get(stream), sum(1 for s in sessions if s.stream_id == stream))
            for stream in LOOPING
        },
    )


def _hostile_stored(chaos: _Chaos, client: Any) -> bool:
    """Whether every hostile frame sent to a still-open session is stored yet."""
    from wsfleet.messages import MessageStore
    from wsfleet.record import connection_pk

    scratch = Verdict()
    sessions = chaos.fleet.simulator.sessions(HOSTILE_FRAMES)
    if chaos.config.sink == "dynamodb":
        items = MessageStore(client, chaos.fleet.resources.messages_table).read_all(
            connection_pk(HOSTILE_FRAMES)
        )
    else:
        items = _stream_items(chaos.fleet, [HOSTILE_FRAMES])[HOSTILE_FRAMES]
    check_hostile(
        scratch, **{**_hostile_evidence(chaos, sessions, {HOSTILE_FRAMES: items}, {}, []),
                    "trap_connections": 0},
    )  # fmt: skip
    if any(v.invariant == "hostile_lost" for v in scratch.violations):
        return False
    chaos.hostile_verified = int(scratch.figures.get("hostile_frames_checked", 0))
    return True


def _checkpoints(chaos: _Chaos, client: Any) -> dict[str, int]:
    """The stored checkpoint of every stream that should be streaming now."""
    records, _workers = _table(client, chaos.fleet.resources.connections_table)
    return {
        stream_id: records[stream_id].last_seq
        for stream_id, desired in chaos.desired.items()
        if desired == "STARTED" and stream_id in records
    }


def _checkpoints_advanced(chaos: _Chaos, client: Any, marks: dict[str, int]) -> bool:
    now = _checkpoints(chaos, client)
    return all(now.get(stream_id, 0) > seq for stream_id, seq in marks.items())


def _queue_depth(sqs: Any, url: str) -> int:
    try:
        attributes = sqs.get_queue_attributes(
            QueueUrl=url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
    except sqs.exceptions.QueueDoesNotExist:
        # The janitor deleted it: its worker's lease lapsed (a zombie that came back is fenced
        # and never renews again), and its messages went with it.
        return 0
    return sum(int(v) for v in attributes.values())


def _wait_drained(chaos: _Chaos, timeout: float = 30.0) -> dict[str, int]:
    """Depth of every poisoned queue still consumed (the hint queue, the control queues of live
    workers) once all are empty, or when ``timeout`` runs out (bounded, like convergence).
    A dead worker's control queue has no consumer: its messages stay, and prove nothing."""
    if not chaos.poisoned_queues and not chaos.poison_sent:
        return {}
    sqs = _direct_client("sqs", chaos.fleet.endpoint_url)
    live = _live_worker_ids(chaos.fleet)
    queues = {"HintQueue": chaos.fleet.resources.queues["HintQueue"]}
    queues.update({f"control:{w}": url for url, w in chaos.poisoned_queues.items() if w in live})
    depths: dict[str, int] = {}

    def drained() -> bool:
        depths.update({name: _queue_depth(sqs, url) for name, url in queues.items()})
        return not any(depths.values())

    with contextlib.suppress(WaitTimeout):  # the depths left over are the answer
        wait_until(drained, timeout=timeout, interval=0.5, message="poisoned queues drained")
    return depths


def _dead_lettered_poison(chaos: _Chaos) -> int:
    """Poison bodies in the hint DLQ (read at the very end; nothing consumes that queue)."""
    url = chaos.fleet.resources.queues.get("HintDeadLetterQueue")
    if not url or not chaos.poison_sent:
        return 0
    sqs = _direct_client("sqs", chaos.fleet.endpoint_url)
    poison = {body for _, body in POISON_BODIES}
    found = 0
    for _ in range(20):  # bounded: a DLQ deeper than 200 messages is its own failure
        messages = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60
        ).get("Messages", [])
        if not messages:
            break
        found += sum(1 for m in messages if m.get("Body") in poison)
    return found


def _stop_outcomes(slots: list[Any]) -> dict[str, list[StopOutcome]]:
    """Per stream, every "STOP command received" the workers logged: epoch, applied, when."""
    outcomes: dict[str, list[StopOutcome]] = {}
    for entry in _log_entries(slots, "STOP command received"):
        stream = entry.get("connection_id")
        if isinstance(stream, str) and "applied" in entry:
            epoch = entry.get("epoch")
            outcomes.setdefault(stream, []).append(StopOutcome(
                epoch if isinstance(epoch, int) else None,
                bool(entry["applied"]),
                _log_time(entry.get("timestamp")),
            ))  # fmt: skip
    return outcomes


def _log_entries(slots: list[Any], marker: str) -> Iterator[dict[str, Any]]:
    """The JSON entries of every worker's log whose line holds ``marker``."""
    for slot in slots:
        path = slot.process.log_path
        if path is None or not Path(path).exists():
            continue
        with open(path, encoding="utf-8", errors="replace") as log:
            for line in log:
                if marker not in line or "{" not in line:
                    continue
                try:
                    entry = json.loads(line[line.index("{") :])
                except ValueError:
                    continue
                if isinstance(entry, dict):
                    yield entry


def _planned_handoffs(slots: list[Any]) -> list[PlannedHandoff]:
    """Every make-before-break hand-off a giver announced, with when it ended (if logged):
    one per stream, giver's epoch and taker (both lines name the taker; the giver is the
    worker that logged them)."""
    prepared: dict[tuple[str, int, str], float] = {}
    ended: dict[tuple[str, int, str], float] = {}
    decisions: dict[tuple[str, int, str], str] = {}
    givers: dict[tuple[str, int, str], str] = {}
    for entry in _log_entries(slots, "hand-off"):
        stream, epoch, taker = entry.get("connection_id"), entry.get("epoch"), entry.get("taker")
        at = _log_time(entry.get("timestamp"))
        if (not isinstance(stream, str) or not isinstance(epoch, int)
                or not isinstance(taker, str) or at is None):  # fmt: skip
            continue
        message = str(entry.get("message", ""))
        key = (stream, epoch, taker)
        if message.startswith(HANDOFF_DECIDED_LOG):
            ended[key] = max(at, ended.get(key, at))
            decisions[key] = str(entry.get("decision", ""))
            waited = entry.get("waited_ms")
            if isinstance(waited, int | float) and waited >= 0:
                at -= waited / 1000
            else:
                continue
        elif not message.startswith(HANDOFF_PREPARED_LOG):
            continue
        if isinstance(entry.get("worker_id"), str):
            givers[key] = entry["worker_id"]
        prepared[key] = min(at, prepared.get(key, at))
    return [
        PlannedHandoff(stream, epoch, prepared_at=at, ended_at=ended.get(key),
                       decision=decisions.get(key), taker=taker, giver=givers.get(key))
        for key, at in sorted(prepared.items())
        for stream, epoch, taker in [key]
    ]


def _socket_opens(slots: list[Any]) -> list[SocketOpen]:
    """Every upstream socket the workers logged opening (:data:`SOCKET_OPENED_LOG`)."""
    opens = []
    for entry in _log_entries(slots, SOCKET_OPENED_LOG):
        worker, stream = entry.get("worker_id"), entry.get("connection_id")
        epoch, local = entry.get("epoch"), entry.get("local")
        at = _log_time(entry.get("timestamp"))
        if (entry.get("message") == SOCKET_OPENED_LOG and isinstance(worker, str)
                and isinstance(stream, str) and isinstance(epoch, int)
                and isinstance(local, str) and at is not None):  # fmt: skip
            opens.append(SocketOpen(worker, stream, epoch, local, at,
                                    prepared=entry.get("prepared") is True))  # fmt: skip
    return opens


def _adoptions(slots: list[Any]) -> list[Adoption]:
    """Every prepared session a taker logged adopting (:data:`ADOPTED_LOG`)."""
    found = []
    for entry in _log_entries(slots, ADOPTED_LOG):
        worker, stream = entry.get("worker_id"), entry.get("connection_id")
        epoch, at = entry.get("epoch"), _log_time(entry.get("timestamp"))
        if (isinstance(worker, str) and isinstance(stream, str) and isinstance(epoch, int)
                and at is not None):  # fmt: skip
            found.append(Adoption(worker, stream, epoch, at))
    return found


def _log_time(stamp: Any) -> float | None:
    """A Powertools log timestamp (``2026-12-01 10:39:51,008+0000``) in epoch seconds."""
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f%z").timestamp()
    except ValueError:
        return None


def run_chaos(config: ChaosConfig) -> ChaosReport:
    """One full scenario; never raises for a violated invariant (see the report)."""
    from bench.faults import FaultyFleet
    from wsfleet.messages import MessageStore
    from wsfleet.record import connection_pk
    from wsfleet_local.fleet import FleetTimings

    began = time.monotonic()
    schedule = make_schedule(
        random.Random(config.seed),
        duration=config.chaos_seconds,
        workers=config.workers,
        lease_seconds=config.lease_seconds,
        mean_gap=config.mean_gap,
        handoffs=config.handoffs,
    )
    report = ChaosReport(config=config, schedule=schedule)
    run_dir = config.run_dir or Path(tempfile.mkdtemp(prefix="wsfleet-chaos-"))
    timings = FleetTimings(
        lease_seconds=config.lease_seconds,
        heartbeat_seconds=config.heartbeat_seconds,
        lease_safety_margin_seconds=config.safety_margin_seconds,
        reconcile_pass_seconds=config.reconcile_pass_seconds,
        drain_timeout_seconds=config.drain_timeout_seconds,
        queue_wait_seconds=1,
        max_connections=config.streams,
    )
    faulty = FaultyFleet(
        workers=config.workers,
        seed=config.seed,
        timings=timings,
        rate=config.rate,
        run_dir=run_dir,
        sink=config.sink,
        extra_worker_env={
            "MESSAGE_REPLAY_WINDOW": str(config.replay_window),
            "POWERTOOLS_LOG_LEVEL": "INFO",
            "WORKER_METRICS_FLUSH_SECONDS": "5",
            # explicit: the breaker check bounds the sessions by it
            "WORKER_BREAKER_MAX_FAILURES": str(config.breaker_max_failures),
            "WORKER_MESSAGE_TIMEOUT_SECONDS": str(MESSAGE_TIMEOUT_SECONDS),
            "HANDOFF_PREPARE_SECONDS": str(HANDOFF_PREPARE_SECONDS),
        },
    )
    sampler: _Sampler | None = None
    trap: _Trap | None = None
    try:
        faulty.start()
        fleet = faulty.fleet
        client = _direct_client("dynamodb", fleet.endpoint_url)
        chaos = _Chaos(faulty, config, report, client)
        for stream_id in chaos.ids:
            chaos.api.start(stream_id, fleet.simulator.url_for(stream_id))
        wait_until(lambda: _is_converged(chaos, client), timeout=60 + config.streams, interval=0.25,
                   message="initial streaming")  # fmt: skip
        trap = _Trap()
        trap.start()
        chaos.start_hostile(trap.port)
        sampler = _Sampler(client, fleet.resources.connections_table, config.sample_every_seconds)
        sampler.start()
        chaos.log(f"{config.streams} streams streaming on {config.workers} workers; chaos begins")
        chaos.run_schedule(schedule)
        chaos.heal()
        # Poison once more while healed: these workers live to the end, so their queues must
        # be seen draining (the ones poisoned under chaos may have been killed since).
        chaos._poison()
        healed = time.monotonic()
        try:
            wait_until(lambda: _is_converged(chaos, client),
                       timeout=config.converge_timeout_seconds, interval=0.5,
                       message="convergence")  # fmt: skip
            report.converged_after_seconds = time.monotonic() - healed
        except TimeoutError:
            chaos.log("did not converge in time")
            for line in _diagnose(chaos, client):
                chaos.log(f"  diagnosis: {line}")
        # Hostile frames on a quiet fleet too: every one sent to a session still open at the
        # end must be found stored (bounded wait, like convergence). Rebalancing may still be
        # evening out the replaced workers and hand the stream off after the frames went out
        # (a closed session proves nothing either way): then arm again, a bounded few times.
        for _ in range(3):
            chaos.arm_hostile(max_size_frames=3)
            try:
                wait_until(lambda: _hostile_stored(chaos, client), timeout=30, interval=0.5,
                           message="hostile frames stored")  # fmt: skip
                break
            except TimeoutError:
                chaos.log("hostile frames not all stored in time")
        # Checkpoints catch up: every stream still STARTED writes one more, so the loss check
        # (every seq up to the checkpoint stored) covers what was stored until now.
        marks = _checkpoints(chaos, client)
        try:
            wait_until(lambda: _checkpoints_advanced(chaos, client, marks), timeout=30,
                       interval=0.5, message="checkpoints to catch up")  # fmt: skip
        except TimeoutError:
            chaos.log("checkpoints did not all advance in time (the loss check covers less)")
        depths = _wait_drained(chaos)
        # The end state is checked on a settled fleet: the replaced workers may still be
        # evening out, and a rebalancing move in flight has 0 (break: the giver closed, the
        # taker not yet open) or 2 (overlap) sessions open at that instant. Bounded: a stream
        # that never settles stays unconverged and the check below flags it.
        settling = time.monotonic()
        try:
            wait_until(lambda: _is_converged(chaos, client), timeout=60, interval=0.5,
                       message="convergence before the end check")  # fmt: skip
            report.settled_after_seconds = time.monotonic() - settling
        except TimeoutError:
            chaos.log("not converged again before the end check")
        sampler.stop()
        end_time = time.time()
        sessions = fleet.simulator.sessions()
        records, workers = _table(client, fleet.resources.connections_table)
        windows = None
        if config.sink == "dynamodb":
            messages = MessageStore(client, fleet.resources.messages_table)
            items = {i: messages.read_all(connection_pk(i)) for i in chaos.desired}
        else:
            items = _stream_items(fleet, list(chaos.desired))
            windows = replay_windows(sampler.samples, records)
        report.verdict = check_history(
            expected_states=chaos.desired,
            final_records=records,
            live_workers=_live_worker_ids(fleet),
            worker_records=workers,
            sessions=sessions,
            items=items,
            samples=sampler.samples,
            pauses=chaos.pauses,
            resume_grace_seconds=config.heartbeat_seconds + 2.0,
            end_time=end_time,
            windows=windows,
            opens=_socket_opens(chaos.all_slots),
            handoffs=_planned_handoffs(chaos.all_slots),
            adoptions=_adoptions(chaos.all_slots),
            # a taker waits twice the prepare bound for COMMIT; a close takes up to 2 s more
            handoff_grace_seconds=2 * HANDOFF_PREPARE_SECONDS + 2.0,
        )
        check_poison(
            report.verdict,
            exits=[
                WorkerExit(s.worker_id, s.process.popen.poll(), tuple(s.process.signals_sent))
                for s in chaos.all_slots
            ],
            queue_depths=depths,
            dead_lettered=_dead_lettered_poison(chaos),
            forged=chaos.forged,
            stop_outcomes=_stop_outcomes(chaos.all_slots),
        )
        check_hostile(
            report.verdict,
            **_hostile_evidence(chaos, sessions, items, records, schedule),
            trap_connections=trap.accepted,
            verified_open=chaos.hostile_verified,
        )
        report.verdict.figures["poison_sent"] = chaos.poison_sent
        report.verdict.figures["poison_refused_by_sqs"] = chaos.poison_refused
        stats = faulty.faults.stats()
        report.proxy = {
            "requests": stats.total(),
            "faults_injected": stats.total(what="injected"),
            "sampler_errors": sampler.errors,
        }
    except Exception as exc:  # report, with the seed, rather than lose the history
        report.error = f"{type(exc).__name__}: {exc}"
    finally:
        if sampler is not None and sampler.is_alive():
            sampler.stop()
        if trap is not None:
            trap.stop()
        faulty.stop()
        report.wall_seconds = time.monotonic() - began
    return report


def main() -> int:
    report = run_chaos(ChaosConfig.from_env())
    print(report.summary())
    print(json.dumps(asdict(report.config), default=str))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
