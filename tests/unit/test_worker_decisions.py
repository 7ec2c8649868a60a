"""Session and worker decisions of lease model v2, over the in-memory lease store.

A :class:`~wsfleet_worker.worker.Worker` is built on :class:`wsfleet.memstore.InMemoryLeaseStore`
with no control channel, no poller running and an upstream connector that never answers (so
sessions hold their connection and stream nothing: the tests drive their checkpoint tracker
directly). Each test reads GIVEN / WHEN / THEN:

* checkpoints: written only when advanced and due, with a random initial phase; a refused one
  ends the session STOPPED (ConnectionStopped) or FENCED (LeaseLost);
* final writes: retried until they land, given up once the worker is fenced;
* the sweep: STOP fallback, stranded connections, sessions whose connection is gone;
* the worker lease: fencing every session synchronously, exit status 3, free slots;
* acquire: an early hint's wait (``LeaseConflict.retry_in_ms``);
* shutdown: retire the worker item only when everything was released.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import signal
import threading
from typing import Any

from worker_doubles import Logger, sync

import wsfleet_worker.worker as worker_module
from wsfleet.clock import now_ms
from wsfleet.exceptions import StoreError
from wsfleet.hints import Hint
from wsfleet.lease import Lease
from wsfleet.memstore import InMemoryLeaseStore
from wsfleet.messages import Message, MessageStore, PutResult
from wsfleet.record import ConnectionRecord, DesiredState, WorkerRecord, connection_pk
from wsfleet.settings import Settings
from wsfleet_local.waiting import wait_until_async
from wsfleet_worker.config import WorkerConfig
from wsfleet_worker.flusher import MessageFlusher
from wsfleet_worker.liveness import FenceCause
from wsfleet_worker.observability import WorkerMetrics
from wsfleet_worker.session import Session
from wsfleet_worker.session_rules import ExitReason
from wsfleet_worker.taking import HintOutcome
from wsfleet_worker.worker import EXIT_LEASE_LOST, Worker

WAIT = 10.0


#: The shared poll (wsfleet_local.waiting), bounded by WAIT.
until = functools.partial(wait_until_async, timeout=WAIT)


class Store(InMemoryLeaseStore):
    """The in-memory store, counting holder writes and failing releases on demand."""

    def __init__(self) -> None:
        super().__init__(lease_ms=60_000)
        self.writes: list[tuple[str, str]] = []
        self.release_failures = 0

    def checkpoint(self, lease: Lease, last_seq: int) -> None:
        self.writes.append(("checkpoint", lease.pk))
        super().checkpoint(lease, last_seq)

    def release(self, lease: Lease, **options: Any) -> ConnectionRecord:
        self.writes.append(("release", lease.pk))
        if self.release_failures:
            self.release_failures -= 1
            raise StoreError("throttled")
        return super().release(lease, **options)

    def record_error(self, lease: Lease, message: str) -> None:
        self.writes.append(("record_error", lease.pk))
        super().record_error(lease, message)


class HeldMessages(MessageStore):
    """The messages table as the flusher sees it, with a batch that can be held in flight
    (a request that has left and not yet been answered)."""

    def __init__(self) -> None:
        super().__init__(None, "messages")
        self.hold = threading.Event()
        self.entered = threading.Event()

    def put_batch(self, messages: Any, *, guard: Any = None) -> PutResult:
        batch: list[Message] = list(messages)
        self.entered.set()
        assert self.hold.wait(WAIT)
        return PutResult(written=len(batch), requests=1)


class Outbox:
    """Stands in for the hint outbox (SQS is not the subject here)."""

    def __init__(self) -> None:
        self.hints: list[Hint] = []
        self.sent = 0

    def add(self, hint: Hint) -> None:
        self.hints.append(hint)
        self.sent += 1

    async def flush(self) -> None:
        return None


async def never_answers(url: str, **_options: Any) -> Any:
    await asyncio.Event().wait()


def make_worker(store: Store, **settings: Any) -> Worker:
    values: dict[str, Any] = {
        "hint_queue_url": "https://sqs.invalid/hints",
        "worker_id": "w1",
        "lease_seconds": 60.0,
        "heartbeat_seconds": 10.0,
        "lease_safety_margin_seconds": 2.0,
        "checkpoint_seconds": 600.0,
        "max_connections": 10,
        **settings,
    }
    config = WorkerConfig(settings=Settings(**values), control_channel=False, sweep_seconds=1.0)
    worker = Worker.from_config(
        config,
        dynamodb=object(),
        sqs=object(),
        leases=store,
        outbox=Outbox(),  # type: ignore[arg-type]
        logger=Logger(),
        metrics=WorkerMetrics("test", emit=lambda doc: None),
        connector=never_answers,
    )
    now = now_ms()
    store.register_worker(
        WorkerRecord(worker_id="w1", control_queue_url="", started_at_ms=now,
                     heartbeat_at_ms=now, expires_at_ms=now + config.settings.lease_ms)
    )
    worker.liveness.start(now)
    return worker


def connect(worker: Worker, store: Store, connection_id: str) -> Session:
    """Start and acquire a connection, and run a session for it on ``worker``."""
    store.start(connection_id, f"wss://up.example/{connection_id}")
    record = store.acquire(connection_pk(connection_id), "w1")
    worker._start_session(record)
    return worker.sessions[record.pk]


def receive(session: Session, *seqs: int) -> None:
    """Frames received and written (as the flusher would acknowledge them)."""
    for seq in seqs:
        session.tracker.accept(seq)
        session.tracker.written(seq)
        if session._uncovered_since_ms is None:
            session._uncovered_since_ms = now_ms()


async def ended(worker: Worker, session: Session) -> Any:
    return await asyncio.wait_for(worker._session_tasks[session.pk], WAIT)


def log_of(worker: Worker) -> Logger:
    logger = worker.logger
    assert isinstance(logger, Logger)
    return logger


# ---------------------------------------------------------------- checkpoints
@sync
async def test_checkpoints_are_written_when_advanced_and_due_and_idle_ones_write_nothing():
    # GIVEN a busy and an idle session, checkpoints due every 0.2 s
    store = Store()
    worker = make_worker(store, checkpoint_seconds=0.2)
    busy, idle = connect(worker, store, "busy"), connect(worker, store, "idle")
    marker = connect(worker, store, "marker")  # its checkpoints show that passes went by
    receive(busy, 1, 2, 3)
    loop = asyncio.create_task(worker._checkpoint_loop())
    try:
        # WHEN the checkpoint loop runs, then runs again with nothing new for busy or idle
        await until(lambda: store.get(busy.pk).last_seq == 3)
        for seq in (1, 2):  # a pass handles a session once: seq 2 lands in a later pass
            receive(marker, seq)
            await until(lambda seq=seq: store.get(marker.pk).last_seq == seq)
    finally:
        loop.cancel()
    # THEN the busy one wrote once, the idle one never
    assert store.writes.count(("checkpoint", busy.pk)) == 1
    assert ("checkpoint", idle.pk) not in store.writes
    assert busy.persisted_seq == 3
    assert "CheckpointLagMs" in worker.metrics.peaks
    assert worker.metrics.totals["CheckpointWrites"] == 1 + 2  # busy once, marker twice


@sync
async def test_first_checkpoints_get_a_random_phase_within_one_interval():
    store = Store()
    worker = make_worker(store, max_connections=50)
    started = now_ms()
    sessions = [connect(worker, store, f"c{i}") for i in range(40)]
    phases = {s.checkpointed_at_ms for s in sessions}
    assert len(phases) > 30  # a burst of acquires does not checkpoint in one burst
    assert all(started - 600_000 <= p <= now_ms() for p in phases)
    for session in sessions:
        session.finish(ExitReason.SHUTDOWN)
    await asyncio.gather(*worker._session_tasks.values())


@sync
async def test_a_checkpoint_refused_as_stopped_ends_the_session_stopped_and_releases():
    # GIVEN a session with a checkpoint due, and a STOP it was not told about
    store = Store()
    worker = make_worker(store, checkpoint_seconds=0.2)
    session = connect(worker, store, "stopme")
    receive(session, 1, 2)
    store.stop(session.pk)
    session.checkpointed_at_ms = 0
    # WHEN the checkpoint is written
    await session.checkpoint()
    result = await ended(worker, session)
    # THEN the session ends STOPPED (via the checkpoint) and releases with its checkpoint
    assert (result.reason, result.via, result.released, result.hint) == (
        ExitReason.STOPPED, "checkpoint", True, False
    )
    record = store.get(session.pk)
    assert (record.lease_owner, record.desired_state, record.last_seq) == (
        "", DesiredState.STOPPED, 2
    )
    assert record.unowned_since_ms is None  # released as stopped: not in gsi_unowned


@sync
async def test_a_checkpoint_refused_as_lost_fences_the_session_and_writes_nothing_more():
    store = Store()
    worker = make_worker(store)
    session = connect(worker, store, "lost")
    receive(session, 1)
    store.release(session.lease)  # (as if a peer had taken it meanwhile)
    writes = len(store.writes)
    await session.checkpoint()
    result = await ended(worker, session)
    assert (result.reason, result.via, result.released) == (ExitReason.FENCED, "checkpoint", False)
    assert len(store.writes) == writes + 1  # the refused checkpoint, nothing after it
    assert worker.metrics.totals["LeaseLost"] == 1


# ---------------------------------------------------------------- final writes
@sync
async def test_a_final_write_that_fails_is_retried_until_it_lands():
    # GIVEN a release that fails twice (throttling)
    store = Store()
    worker = make_worker(store)
    session = connect(worker, store, "retry")
    receive(session, 1, 2, 3)
    store.release_failures = 2
    # WHEN the session ends for a hand-off
    session.finish(ExitReason.SHUTDOWN, via="shutdown")
    result = await ended(worker, session)
    # THEN the third release landed, with the final checkpoint, and a peer is hinted
    assert (result.released, result.hint, result.last_seq) == (True, True, 3)
    assert store.writes.count(("release", session.pk)) == 3
    assert worker.metrics.totals["FinalWriteRetries"] == 2
    record = store.get(session.pk)
    assert (record.lease_owner, record.last_seq) == ("", 3)
    assert record.unowned_since_ms is not None  # STARTED and free: in gsi_unowned


@sync
async def test_final_write_retries_end_when_the_worker_is_fenced():
    store = Store()
    worker = make_worker(store)
    session = connect(worker, store, "stuck")
    store.release_failures = 10**6
    session.finish(ExitReason.SHUTDOWN, via="shutdown")
    await until(lambda: worker.metrics.totals["FinalWriteRetries"] >= 1)
    worker.liveness.fence(FenceCause.DEADLINE)
    result = await ended(worker, session)
    assert (result.reason, result.released) == (ExitReason.FENCED, False)
    assert store.get(session.pk).lease_owner == "w1"  # left to the worker lease's expiry


@sync
async def test_a_release_waits_for_a_message_write_still_out_then_lands():
    # GIVEN a session whose frame is in a BatchWriteItem that has left and not returned
    store = Store()
    worker = make_worker(store, message_flush_ms=0)
    messages = HeldMessages()
    worker.flusher = MessageFlusher(messages, worker.offloader, worker.metrics, flush_ms=0)
    worker._context = dataclasses.replace(worker._context, flusher=worker.flusher)
    flushing = asyncio.create_task(worker.flusher.run())
    try:
        session = connect(worker, store, "inflight")
        await session._on_frame('{"seq": 1}')
        await asyncio.to_thread(messages.entered.wait, WAIT)
        # WHEN the session ends for a hand-off
        session.finish(ExitReason.SHUTDOWN, via="shutdown")
        await until(lambda: session._ending)
        await asyncio.sleep(0.3)  # a release, were it wrongly allowed, gets its chance
        # THEN it does not release while the write is out (the batch could land after the
        # next owner's acquire) ...
        assert ("release", session.pk) not in store.writes
        # ... and releases once it has been answered: it never leaves the connection behind
        messages.hold.set()
        result = await ended(worker, session)
        assert result.released and store.get(session.pk).lease_owner == ""
    finally:
        messages.hold.set()
        flushing.cancel()


# ---------------------------------------------------------------- the worker lease
@sync
async def test_fencing_the_worker_aborts_every_session_at_once_and_exits_3():
    # GIVEN three streaming sessions
    store = Store()
    worker = make_worker(store)
    sessions = [connect(worker, store, f"f{i}") for i in range(3)]
    for session in sessions:
        receive(session, 1)
    writes = len(store.writes)
    # WHEN the renewal is refused (a peer killed the lease)
    worker.liveness.fence(FenceCause.DEAD)
    # THEN, before anything was awaited, every session is fenced and nothing may be written
    assert all(s.reason is ExitReason.FENCED and s.fenced for s in sessions)
    assert not any(s.may_write(now_ms()) for s in sessions)
    assert worker.taker.free_slots() == 0
    assert worker.exit_code == EXIT_LEASE_LOST and worker._stop.is_set()
    tasks = [worker._session_tasks[s.pk] for s in sessions]
    results = await asyncio.wait_for(asyncio.gather(*tasks), WAIT)
    assert all(not r.released and r.via == "worker-dead" for r in results)
    assert len(store.writes) == writes  # no checkpoint, no release
    assert worker.metrics.totals["SelfFenced"] == 3
    assert worker.metrics.totals["WorkerDead"] == 1
    # AND the shutdown that follows retires nothing
    await worker.shutdown()
    assert not store.get_worker("w1", consistent=True).dead


@sync
async def test_no_free_slots_while_the_worker_lease_renewal_runs_late():
    store = Store()
    worker = make_worker(store, max_connections=4)
    assert worker.taker.free_slots() == 4
    timer = worker.liveness.timer
    assert timer is not None
    timer.renew_due_ms = now_ms() - 5_000  # due 5 s ago and still running
    timer.renew_started()
    assert worker.taker.free_slots() == 0
    timer.renew_succeeded(now_ms())
    assert worker.taker.free_slots() == 4


# ---------------------------------------------------------------- acquire
@sync
async def test_an_early_hint_waits_for_the_owners_lease_to_lapse_then_takes_over():
    # GIVEN a connection held by a worker whose lease lapses in 0.3 s
    store = Store()
    worker = make_worker(store)
    now = now_ms()
    store.register_worker(
        WorkerRecord(worker_id="w2", control_queue_url="", started_at_ms=now,
                     heartbeat_at_ms=now, expires_at_ms=now + 300)
    )
    store.start("early", "wss://up.example/early")
    held = store.acquire(connection_pk("early"), "w2")
    # WHEN w1 acquires it
    record = await worker.taker._acquire_lease(held.pk)
    # THEN it waited once, killed the lapsed lease and took the connection with epoch + 1
    assert record is not None
    assert (record.lease_owner, record.lease_epoch) == ("w1", held.lease_epoch + 1)
    assert worker.metrics.totals["EarlyHintWaits"] == 1
    assert store.get_worker("w2", consistent=True).dead


@sync
async def test_a_hint_handled_past_the_fence_deadline_acquires_nothing():
    # GIVEN a worker woken from a pause: its self-fence deadline has passed, but the liveness
    # task has not run yet (the poller's coroutine may run first)
    store = Store()
    worker = make_worker(store)
    store.start("late", "wss://up.example/late")
    assert worker.liveness.timer is not None
    worker.liveness.timer.expires_at_ms = now_ms() - 1
    assert not worker.liveness.fenced
    # WHEN a hint it held through the pause is handled
    outcome = await worker.taker.acquire(Hint(connection_pk("late")))
    # THEN it is given back and the connection stays free: taken now, it would die with us
    assert outcome is HintOutcome.GIVE_BACK
    assert store.get(connection_pk("late")).lease_owner == ""


# ---------------------------------------------------------------- the sweep
@sync
async def test_the_sweep_ends_a_stopped_connection_whose_stop_was_missed():
    store = Store()
    worker = make_worker(store)
    session = connect(worker, store, "missed")
    store.stop(session.pk)
    await worker.sweep()
    result = await ended(worker, session)
    assert (result.reason, result.via, result.released) == (ExitReason.STOPPED, "sweep", True)
    assert store.get(session.pk).lease_owner == ""
    assert worker.metrics.totals["SweepStops"] == 1


@sync
async def test_the_sweep_releases_and_hints_a_connection_owned_without_a_session():
    # GIVEN connections that name w1 without a session (a release that never landed)
    store = Store()
    worker = make_worker(store)
    store.start("stranded", "wss://up.example/s")
    stranded = store.acquire(connection_pk("stranded"), "w1")
    store.start("stopped", "wss://up.example/t")
    stopped = store.acquire(connection_pk("stopped"), "w1")
    store.stop(stopped.pk)
    # WHEN the sweep runs
    await worker.sweep()
    # THEN both are released; only the STARTED one is hinted (and joins gsi_unowned)
    assert store.get(stranded.pk).lease_owner == "" and store.get(stopped.pk).lease_owner == ""
    assert store.get(stranded.pk).unowned_since_ms is not None
    assert store.get(stopped.pk).unowned_since_ms is None
    assert [h.pk for h in worker.outbox.hints] == [stranded.pk]  # type: ignore[attr-defined]
    assert worker.metrics.totals["SweepReleases"] == 2


@sync
async def test_the_sweep_leaves_a_connection_being_acquired_alone():
    store = Store()
    worker = make_worker(store)
    store.start("racing", "wss://up.example/r")
    record = store.acquire(connection_pk("racing"), "w1")
    worker.taker.acquiring.add(record.pk)
    await worker.sweep()
    assert store.get(record.pk).lease_owner == "w1"
    assert worker.metrics.totals["SweepReleases"] == 0


@sync
async def test_the_sweep_fences_an_old_session_whose_connection_is_someone_elses():
    # GIVEN a session running for more than two sweeps whose connection a peer now holds
    store = Store()
    worker = make_worker(store)
    session = connect(worker, store, "taken")
    fresh = connect(worker, store, "fresh")
    store.release(session.lease)
    store.acquire(session.pk, "w2")
    session.started_at_ms -= 5_000
    # WHEN the sweep runs
    await worker.sweep()
    # THEN that session is fenced (and the young one, which the index shows, is left alone)
    result = await ended(worker, session)
    assert (result.reason, result.via, result.released) == (ExitReason.FENCED, "sweep", False)
    assert fresh.reason is None
    assert store.get(session.pk).lease_owner == "w2"
    assert worker.metrics.totals["SweepFenced"] == 1


# ---------------------------------------------------------------- shutdown
@sync
async def test_a_drained_worker_releases_everything_then_retires_its_item():
    store = Store()
    worker = make_worker(store)
    sessions = [connect(worker, store, f"d{i}") for i in range(3)]
    await worker.shutdown()
    assert all(store.get(s.pk).lease_owner == "" for s in sessions)
    assert len(worker.outbox.hints) == 3  # type: ignore[attr-defined]
    assert store.get_worker("w1", consistent=True).dead
    assert worker.exit_code == 0


# ---------------------------------------------------------------- incarnations (serve)
class KeyedLogger(Logger):
    def append_keys(self, **keys: Any) -> None:
        self.lines.append(("keys", "", keys))


class ScriptedWorker:
    """What serve() sees of a Worker: a run with a set outcome."""

    def __init__(self, config: WorkerConfig, outcome: tuple[int, bool], logger: Any) -> None:
        self.worker_id = config.settings.worker_id
        self.code, self.started = outcome
        self.signalled = False
        self.logger = logger

    async def run(self) -> int:
        return self.code


def run_serve(monkeypatch: Any, outcomes: list[tuple[int, bool]]) -> tuple[int, list[str]]:
    ids: list[str] = []
    script = iter(outcomes)

    def build(config: WorkerConfig, *, logger: Any = None) -> ScriptedWorker:
        ids.append(config.settings.worker_id)
        return ScriptedWorker(config, next(script), logger or KeyedLogger())

    monkeypatch.setattr(worker_module.Worker, "from_config", staticmethod(build))
    config = WorkerConfig(settings=Settings(hint_queue_url="https://q", worker_id="w0"))
    return asyncio.run(worker_module.serve(config)), ids


def test_a_lost_lease_and_failed_restarts_start_over_until_an_incarnation_runs(monkeypatch):
    # the lease is lost; the next two incarnations cannot start (a throttled table); the
    # fourth runs and ends normally
    code, ids = run_serve(
        monkeypatch, [(EXIT_LEASE_LOST, True), (1, False), (1, False), (0, True)]
    )
    assert (code, ids) == (0, ["w0", "w0+2", "w0+3", "w0+4"])


def test_the_first_incarnation_that_cannot_start_ends_the_process(monkeypatch):
    assert run_serve(monkeypatch, [(1, False)]) == (1, ["w0"])


# ---------------------------------------------------------------- signals
@sync
async def test_a_second_signal_cuts_the_drain_short_and_restores_the_handlers():
    # GIVEN a worker draining a session whose message write is still out (drain bound 600 s)
    store = Store()
    worker = make_worker(store, message_flush_ms=0, drain_timeout_seconds=600.0)
    messages = HeldMessages()
    worker.flusher = MessageFlusher(messages, worker.offloader, worker.metrics, flush_ms=0)
    worker._context = dataclasses.replace(worker._context, flusher=worker.flusher)
    flushing = asyncio.create_task(worker.flusher.run())
    loop = asyncio.get_running_loop()
    try:
        worker._install_signal_handlers()
        session = connect(worker, store, "slow")
        await session._on_frame('{"seq": 1}')
        await asyncio.to_thread(messages.entered.wait, WAIT)
        worker._on_signal(signal.SIGTERM)
        draining = asyncio.create_task(worker.shutdown())
        await until(lambda: session._ending)

        # WHEN a second signal arrives
        worker._on_signal(signal.SIGTERM)

        # THEN the drain ends now (not after its bound, not by exiting the process), the exit
        # status says it was forced, and a third signal would get the default action
        await asyncio.wait_for(draining, WAIT)
        assert worker.force_exit and worker.exit_code == 1
        assert not loop.remove_signal_handler(signal.SIGTERM)  # none left to remove
        assert not loop.remove_signal_handler(signal.SIGINT)
    finally:
        messages.hold.set()
        flushing.cancel()
        loop.remove_signal_handler(signal.SIGTERM)
        loop.remove_signal_handler(signal.SIGINT)
