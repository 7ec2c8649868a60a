"""Worker: the process that owns sessions, and its lifecycle from start to graceful exit.

Start
    1. create this worker's control queue (unless WORKER_CONTROL_CHANNEL=false);
    2. register the worker item (``WORKER#<id>``: control queue URL, capacity, and the
       worker's one liveness lease, ``expires_at_ms``), before anything is acquired; the
       lease timer starts from the moment of that write;
    3. start the shared machinery: the message flusher, the liveness task (renews the worker
       lease, :mod:`~wsfleet_worker.liveness`), the checkpoint loop, the sweep, housekeeping
       (health file, gauges), EMF flushes, the control-queue consumer and, last, the hint
       poller.

Run
    The poller (:mod:`~wsfleet_worker.poller`) hands each hint to the lease taker
    (:mod:`~wsfleet_worker.taking`), which acquires the connection; the worker starts a
    :class:`~wsfleet_worker.session.Session` per connection won. Sessions end on their own
    (STOP, lost lease, upstream end); a session that crashed releases its connection and a
    hint is sent so a peer takes over at once.

    * Checkpoints: once a second the checkpoint loop writes, with bounded concurrency, the
      checkpoint of every session for which :func:`wsfleet.lease.checkpoint_due` says so
      (CHECKPOINT_SECONDS, advanced only). Idle connections write nothing.
    * Sweep (every WORKER_SWEEP_SECONDS): ``owned_by(self)`` on gsi_owner, the fallback for
      a lost STOP and the repair of what no session holds; see :meth:`Worker.sweep`.
    * Rebalancing (every REBALANCE_SECONDS, unless REBALANCE=false): the fleet view's plan,
      hand-offs to less loaded peers, and placement of new work
      (:mod:`~wsfleet_worker.rebalancing`); hand-offs addressed here arrive on the control
      queue and are acquired at once.

Lease lost: a new incarnation
    A worker whose lease renewals keep failing fences itself at ``expires_at - margin``; one
    whose renewal is refused (:class:`~wsfleet.exceptions.WorkerDead`: a peer killed its
    expired lease, e.g. after a pause) does so at once. Every session's socket is aborted
    first, synchronously, then that :class:`Worker` ends with :data:`EXIT_LEASE_LOST` without
    writing anything under its leases: no release, no retire. :func:`serve` then starts a new
    incarnation in the same process under a new id (``<id>+2``, ``+3``...,
    :func:`wsfleet.record.incarnation_id`): the old id is dead for good, its connections are
    taken over once its lease has lapsed (by peers, or by the new incarnation itself, which
    is a peer like any other). A process restart would do the same, only slower: a transient
    DynamoDB stall must not cost a task.

Graceful shutdown (first SIGTERM/SIGINT; a second one cuts every wait below short and gives
the signals their default action back, as uvicorn does), uvicorn's order:
    1. stop polling for hints (a receive already in flight is given back to the queue);
    2. every session, in parallel: stop reading, close its socket (1001), flush its frames,
       then release its connection with the final checkpoint in the same write (owner
       removed, epoch kept);
    3. hints for all released connections go out as they are released (SendMessageBatch),
       so a peer acquires each one within a poll round trip;
    4. all of the above bounded by DRAIN_TIMEOUT_SECONDS; whatever is left is cancelled and
       its connections wait for the worker lease to expire;
    5. if every session released, retire the worker item (dead now: peers need not wait for
       its expiry), else leave it to expire; delete the control queue, flush metrics, exit 0.
       ECS's stopTimeout must exceed DRAIN_TIMEOUT_SECONDS + 5 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import signal
import sys
from collections.abc import Awaitable, Coroutine, Iterator, Mapping
from dataclasses import replace
from typing import Any

from wsfleet.aws import dynamodb_client, sqs_client
from wsfleet.backoff import backoff
from wsfleet.clock import Clock, now_ms
from wsfleet.control import (
    CommitNotice,
    DeclineReply,
    HandoffHint,
    PrepareCommand,
    ReadyReply,
    StopCommand,
    stop_confirmed,
)
from wsfleet.exceptions import (
    ConfigurationError,
    WsfleetError,
)
from wsfleet.hint_sender import HintSender
from wsfleet.hints import Hint
from wsfleet.record import (
    ConnectionRecord,
    WorkerRecord,
    connection_id_from_pk,
    incarnation_id,
)
from wsfleet.sinks.select import sink_from_settings
from wsfleet.store import LeaseStore

from . import health, task_identity
from .config import WorkerConfig
from .connector import Connector, describe_error, make_connector
from .control_channel import ControlChannel, HandoffMessage
from .credentials import SecretResolver
from .flusher import MessageFlusher
from .handover import Handover, drain_prepare_seconds, plan_drain
from .liveness import FenceCause, WorkerLiveness
from .observability import WorkerMetrics, make_logger
from .offload import Offloader
from .outbox import HintOutbox
from .parts import WorkerParts
from .poller import HintPoller
from .rebalancing import Rebalancer
from .session import Session, SessionContext, SessionResult
from .session_rules import ExitReason
from .sqs_consumer import QueueConsumer
from .sweep import OwnershipSweep
from .taking import LeaseTaker

__all__ = ["EXIT_LEASE_LOST", "Worker", "main", "serve"]

#: Exit status of a worker whose lease is over (self-fenced, or killed by a peer): distinct
#: from 1 (failure) and 2 (configuration), so operators and the fleet can tell it apart.
EXIT_LEASE_LOST = 3

#: Longest wait between attempts to start a new incarnation after the previous one's lease
#: was lost (while the table is throttled or stalled).
_RESTART_BACKOFF_CAP_SECONDS = 10.0
#: Bounds after DRAIN_TIMEOUT_SECONDS: hints still queued when the drain timed out, then
#: deregistering and deleting the control queue. Keep drain + both below ECS's stopTimeout.
_LATE_HINTS_TIMEOUT_SECONDS = 2.0
_CLEANUP_TIMEOUT_SECONDS = 3.0
#: Hint delay for a connection whose session crashed (see _session_done).
_CRASH_HINT_DELAY_SECONDS = 2
#: A drain with no live peer yet reads the worker items again this often (see _drain_overlaps).
_DRAIN_PEER_POLL_SECONDS = 0.5
#: The checkpoint loop's tick (a checkpoint is due at most once per CHECKPOINT_SECONDS).
_CHECKPOINT_TICK_SECONDS = 1.0


class Worker:
    """One worker process. ``await Worker.from_config(config).run()`` returns the exit status.

    :meth:`from_config` builds the parts that stand on their own (stores, pools, the message
    flusher, the hint outbox, the hint queue's consumer, the control channel, the upstream
    connector); the constructor takes them and wires the three that act on this worker's own
    sessions, and so cannot exist before it: the liveness task (it fences them), the lease
    taker (it starts them) and the hint poller (it asks the taker). Tests replace parts
    through :meth:`from_config`'s keywords (an in-memory store, a stand-in outbox).
    """

    def __init__(
        self,
        config: WorkerConfig,
        *,
        leases: LeaseStore,
        renewals: LeaseStore,
        offloader: Offloader,
        flusher: MessageFlusher,
        outbox: HintOutbox,
        hint_queue: QueueConsumer,
        control: ControlChannel | None,
        connector: Connector,
        logger: Any,
        metrics: WorkerMetrics,
        clock: Clock = now_ms,
    ) -> None:
        """``renewals`` is the store the worker lease is renewed through (see from_config)."""
        settings = config.settings
        self.config = config
        self.worker_id = settings.worker_id
        self.logger = logger
        self.metrics = metrics
        self._clock = clock
        self.leases = leases
        self.offloader = offloader
        self.flusher = flusher
        self.outbox = outbox
        self.control = control
        self.sessions: dict[str, Session] = {}
        self._session_tasks: dict[str, asyncio.Task[SessionResult]] = {}
        #: make-before-break: the taker's prepared sessions (not owned yet), by pk
        self.prepared: dict[str, Session] = {}
        self._prepared_tasks: dict[str, asyncio.Task[SessionResult]] = {}
        self._write_slots = max(1, config.io_threads // 2)
        parts = WorkerParts(
            worker_id=self.worker_id,
            leases=leases,
            offloader=offloader,
            metrics=metrics,
            logger=logger,
            clock=clock,
        )
        self.liveness = WorkerLiveness(
            replace(parts, leases=renewals),
            lease_ms=settings.lease_ms,
            heartbeat_ms=config.heartbeat_ms,
            margin_ms=settings.safety_margin_ms,
            connection_count=lambda: len(self.sessions),
            movable_count=lambda: self.rebalancer.movable() if self.rebalancer else None,
            on_fence=self._fence_all,
            # a renewal no longer late: room for hints again at once (LeaseTaker.free_slots)
            on_renewal_done=lambda: self.poller.slot_freed(),
        )
        self.taker = LeaseTaker(
            parts,
            self.liveness,
            outbox,
            max_connections=settings.max_connections,
            heartbeat_seconds=settings.heartbeat_seconds,
            sessions=self.sessions,
            session_tasks=self._session_tasks,
            start_session=self._start_session,
        )
        self.handover = Handover(
            parts,
            self.liveness,
            outbox,
            prepare_seconds=config.handoff_prepare_seconds,
            queue_prefix=settings.control_queue_prefix,
            sessions=self.sessions,
            session_tasks=self._session_tasks,
            prepared=self.prepared,
            prepared_tasks=self._prepared_tasks,
            start_prepared=self._start_prepared,
            adopt=self._adopt_prepared,
            acquiring=self.taker.acquiring,
            acquire=self.taker.acquire,
            send=self._send_handoffs,
            own_queue_url=lambda: self.control.queue_url if self.control is not None else "",
            has_room=lambda: self.taker.free_slots() > 0,
        )
        self.rebalancer = (
            Rebalancer(
                parts,
                outbox,
                sessions=self.sessions,
                session_tasks=self._session_tasks,
                capacity=settings.max_connections,
                interval_seconds=settings.rebalance_seconds,
                dwell_seconds=settings.rebalance_dwell_seconds,
                band_percent=settings.rebalance_band_percent,
                placement_seconds=settings.rebalance_placement_seconds,
                send_handoffs=self._send_handoffs,
                stopping=lambda: self._stopping or self.liveness.fenced,
                handover=self.handover,
            )
            if settings.rebalance
            else None
        )
        self.poller = HintPoller(
            hint_queue,
            self.taker,
            metrics,
            logger,
            placement=self.rebalancer.placement_delay if self.rebalancer else None,
        )
        self.ownership = OwnershipSweep(
            parts,
            self.liveness,
            self.taker,
            outbox,
            sessions=self.sessions,
            sweep_ms=int(config.sweep_seconds * 1000),
            stopping=lambda: self._stopping,
        )
        self._context = SessionContext(
            config=config,
            worker_id=self.worker_id,
            leases=leases,
            offloader=offloader,
            flusher=flusher,
            liveness=self.liveness,
            metrics=metrics,
            logger=logger,
            connect=connector,
            clock=clock,
            rng=random.Random(),
            secrets=SecretResolver(offloader.io, ttl_seconds=config.secret_cache_seconds),
            highest_seq=flusher.store.highest_seq,
        )
        self._background: dict[str, asyncio.Task[None]] = {}
        self._stop = asyncio.Event()
        self._stopping = False
        self._signals = 0
        #: A second signal arrived: every shutdown wait ends now (uvicorn's ``force_exit``).
        self.force_exit = False
        self._deadline: asyncio.Timeout | None = None
        self._started_at_ms = 0
        self._drain_complete = False
        #: ``start`` completed (registered, machinery running): a failure after is not a start's
        self.started = False
        self.exit_code = 0

    @classmethod
    def from_config(
        cls,
        config: WorkerConfig,
        *,
        dynamodb: Any = None,
        sqs: Any = None,
        leases: LeaseStore | None = None,
        outbox: HintOutbox | None = None,
        logger: Any = None,
        metrics: WorkerMetrics | None = None,
        connector: Connector | None = None,
        clock: Clock = now_ms,
    ) -> Worker:
        """Build a worker and its parts from configuration; each keyword given replaces what
        would be built (tests pass an in-memory store, a stand-in outbox, the moto clients).
        """
        settings = config.settings
        logger = logger or make_logger(settings.service_name, settings.worker_id)
        metrics = metrics or WorkerMetrics(settings.service_name)
        threads = config.io_threads + config.write_threads
        own_clients = dynamodb is None
        dynamodb = dynamodb or dynamodb_client(max_pool_connections=threads + 4)
        sqs = sqs or sqs_client(max_pool_connections=threads + 4)
        store = leases if leases is not None else LeaseStore.from_settings(settings, dynamodb)
        # The renewal gets a client of its own: the shared one's adaptive retry mode slows
        # every request once message writes are throttled, and a late renewal fences the
        # whole worker. Few botocore attempts: the liveness task retries on its own schedule
        # (WorkerLeaseTimer.retry_ms). Injected clients and stores are used as given.
        renewals = store
        if own_clients and leases is None:
            renewals = LeaseStore.from_settings(
                settings,
                dynamodb_client(max_pool_connections=2, retry_mode="standard", max_attempts=2),
            )
        offloader = Offloader(io_threads=config.io_threads, write_threads=config.write_threads)
        flusher = MessageFlusher(
            sink_from_settings(settings, dynamodb=dynamodb, max_pool_connections=threads + 4),
            offloader,
            metrics,
            flush_ms=settings.message_flush_ms,
            capacity=config.queue_frames,
            capacity_bytes=config.queue_bytes,
            max_in_flight=config.write_threads,
            logger=logger,
            clock=clock,
        )
        control = (
            ControlChannel(
                sqs,
                offloader,
                metrics,
                logger,
                prefix=settings.control_queue_prefix,
                sender_arns=tuple(
                    arn.strip() for arn in settings.control_queue_sender_arns.split(",")
                    if arn.strip()
                ),
                worker_id=settings.worker_id,
                wait_seconds=config.control_wait_seconds,
            )
            if config.control_channel
            else None
        )
        return cls(
            config,
            leases=store,
            renewals=renewals,
            offloader=offloader,
            flusher=flusher,
            outbox=outbox
            if outbox is not None
            else HintOutbox(HintSender(sqs, settings.require_hint_queue_url()), offloader, logger),
            hint_queue=QueueConsumer(
                sqs,
                offloader,
                logger,
                queue="hint queue",
                message="hint",
                queue_url=settings.hint_queue_url,
                wait_seconds=config.hint_wait_seconds,
            ),
            control=control,
            connector=connector
            or make_connector(
                max_frame_bytes=config.max_frame_bytes,
                message_timeout=config.message_timeout_seconds,
                allowed_hosts=settings.allowed_upstream_hosts,
                allow_insecure=settings.allow_insecure_ws,
            ),
            logger=logger,
            metrics=metrics,
            clock=clock,
        )

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> int:
        """Start, serve until asked to stop, drain. Returns the process exit status."""
        self._install_signal_handlers()
        try:
            await self.start()
        except Exception as exc:
            self.logger.exception("worker failed to start", extra={"error": describe_error(exc)})
            await self._cleanup()
            return 1
        self.started = True
        await self._stop.wait()
        await self.shutdown()
        return self.exit_code

    @property
    def signalled(self) -> bool:
        """A SIGTERM/SIGINT arrived: the process is to end, not start over."""
        return self._signals > 0

    def request_stop(self) -> None:
        """Begin the graceful shutdown (what the first SIGTERM/SIGINT does)."""
        self._stop.set()

    async def start(self) -> None:
        settings = self.config.settings
        now = self._clock()
        self._started_at_ms = now
        queue_url = await self._open_control_channel()
        registered_at = self._clock()
        await self.offloader.io(
            self.leases.register_worker,
            WorkerRecord(
                worker_id=self.worker_id,
                control_queue_url=queue_url,
                started_at_ms=now,
                heartbeat_at_ms=registered_at,
                expires_at_ms=registered_at + settings.lease_ms,
                connection_count=0,
                capacity=settings.max_connections,
                task_arn=self.config.task.task_arn if self.config.task else None,
                container_runtime_id=(
                    self.config.task.container_runtime_id if self.config.task else None
                ),
            ),
        )
        self.liveness.start(registered_at)
        health.touch(settings.health_file)
        self._spawn("liveness", self.liveness.run())
        self._spawn("flusher", self.flusher.run())
        self._spawn("housekeeping", self._housekeeping())
        self._spawn("checkpoints", self._checkpoint_loop())
        self._spawn("sweep", self._sweep_loop())
        self._spawn("metrics", self._flush_metrics_periodically())
        if self.control is not None:
            self._spawn("control", self.control.run(self._on_stop_command, self._on_handoff))
        if self.rebalancer is not None:
            self._spawn("rebalance", self.rebalancer.run())
        self._spawn("poller", self.poller.run())
        self.logger.info(
            "worker started",
            extra={
                "max_connections": settings.max_connections,
                "lease_seconds": settings.lease_seconds,
                "heartbeat_seconds": settings.heartbeat_seconds,
                "checkpoint_seconds": settings.checkpoint_seconds,
                "sweep_seconds": self.config.sweep_seconds,
                "control_queue": self.control.queue_name if self.control else None,
                "task_arn": self.config.task.task_arn if self.config.task else None,
            },
        )

    async def _open_control_channel(self) -> str:
        """Create the control queue; without one, STOP still arrives through the sweep."""
        if self.control is None:
            return ""
        try:
            return await self.control.open()
        except Exception as exc:
            self.logger.error(
                "control queue unavailable; STOP will be noticed by the sweep only",
                extra={"error": describe_error(exc)},
            )
            self.control = None
            return ""

    def _spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro, name=f"worker:{name}")
        self._background[name] = task
        task.add_done_callback(functools.partial(self._background_done, name))

    def _background_done(self, name: str, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self._stopping:
            return
        error = task.exception()
        if name in ("poller", "liveness") and error is None:
            return  # the poller returns once stopped; liveness once fenced (_fence_all)
        self.logger.error(
            "background task ended unexpectedly; shutting down",
            extra={"task": name, "error": describe_error(error) if error else "returned"},
            exc_info=error,
        )
        self.exit_code = 1
        self.request_stop()

    # ------------------------------------------------------------------ sessions
    def _start_session(self, record: ConnectionRecord) -> None:
        session = Session(record, self._context)
        self.sessions[record.pk] = session
        task = asyncio.create_task(session.run(), name=f"session:{record.pk}")
        self._session_tasks[record.pk] = task
        task.add_done_callback(functools.partial(self._session_done, session))
        self.metrics.gauge("ActiveConnections", len(self.sessions))

    def _start_prepared(self, record: ConnectionRecord, durable: int) -> Session:
        """A taker's prepared session (make-before-break): it owns nothing yet."""
        session = Session.prepared_for(record, self._context, durable=durable)
        self.prepared[record.pk] = session
        task = asyncio.create_task(session.run(), name=f"prepared:{record.pk}")
        self._prepared_tasks[record.pk] = task
        task.add_done_callback(functools.partial(self._session_done, session))
        return session

    def _adopt_prepared(self, session: Session) -> None:
        """The prepared session owns its connection now: it is one of ours like any other."""
        pk = session.pk
        if self.prepared.get(pk) is not session:
            return
        del self.prepared[pk]
        self.sessions[pk] = session
        self._session_tasks[pk] = self._prepared_tasks.pop(pk)
        self.taker.acquiring.discard(pk)
        self.metrics.gauge("ActiveConnections", len(self.sessions))

    def _session_done(self, session: Session, task: asyncio.Task[SessionResult]) -> None:
        if self.prepared.get(session.pk) is session:  # never owned: nothing to hand over
            del self.prepared[session.pk]
            self._prepared_tasks.pop(session.pk, None)
            self.taker.acquiring.discard(session.pk)
            error = None if task.cancelled() else task.exception()
            if error is not None:
                self.logger.error(
                    "prepared session ended with an error",
                    extra={"connection_id": session.connection_id,
                           "error": describe_error(error)},
                    exc_info=error,
                )
            return
        if self.sessions.get(session.pk) is session:
            del self.sessions[session.pk]
            self._session_tasks.pop(session.pk, None)
        self.metrics.gauge("ActiveConnections", len(self.sessions))
        self.poller.slot_freed()
        if self.rebalancer is not None:
            done = None if task.cancelled() or task.exception() else task.result()
            self.rebalancer.session_done(done, session.pk)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self.logger.error(
                "session ended with an error",
                extra={"connection_id": session.connection_id, "error": describe_error(error)},
                exc_info=error,
            )
            return
        result = task.result()
        if result.hint:
            # A crashed session is handed over with a short delay, so a frame that crashes
            # every session cannot spin the connection between workers in a tight loop.
            delay = _CRASH_HINT_DELAY_SECONDS if result.reason is ExitReason.CRASHED else 0
            self.outbox.add(Hint(result.pk, epoch=result.epoch, delay_seconds=delay))

    async def _on_handoff(self, handoff: HandoffMessage) -> None:
        """A hand-off message from a peer. ``HANDOFF`` (break-before-make): take it at once,
        no placement wait; if we cannot (full, draining), its delayed copy on the hint queue
        finds another. The make-before-break ones go to :class:`~.handover.Handover`."""
        if isinstance(handoff, PrepareCommand):
            await self.handover.on_prepare(handoff)
            return
        if isinstance(handoff, ReadyReply | DeclineReply):
            self.handover.on_reply(handoff)
            return
        if isinstance(handoff, CommitNotice):
            await self.handover.on_commit(handoff)
            return
        if handoff.pk in self.prepared:
            await self.handover.on_handoff_hint(handoff)
            return
        outcome = await self.taker.acquire(Hint(handoff.pk, epoch=handoff.epoch))
        self.logger.debug(
            "hand-off received",
            extra={"connection_id": connection_id_from_pk(handoff.pk), "outcome": outcome.value},
        )

    async def _send_handoffs(
        self, queue_url: str, handoffs: list[HandoffHint] | list[HandoffMessage]
    ) -> set[str]:
        if self.control is None:
            return set()
        return await self.control.send_handoffs(queue_url, handoffs)

    async def _on_stop_command(self, command: StopCommand) -> bool:
        """Close the named session if the connection record confirms the STOP.

        A STOP on the control queue is checked against a consistent read of the record
        (:func:`~wsfleet.control.stop_confirmed`) before anything closes, so a forged or stale
        command cannot end a live stream (issue #11, finding 7). If the read fails, nothing
        closes: the checkpoint write or the sweep still sees a real STOP.
        """
        session = self.sessions.get(command.pk)
        if session is None or session.epoch != command.epoch or session.reason is not None:
            return False
        try:
            record = await self.offloader.io(self.leases.get, command.pk)
        except WsfleetError as exc:
            self.logger.warning(
                "cannot confirm STOP; left to the sweep",
                extra={
                    "connection_id": connection_id_from_pk(command.pk),
                    "error": describe_error(exc),
                },
            )
            return False
        if not stop_confirmed(command, record):
            self.metrics.count("UnconfirmedStops")
            self.logger.warning(
                "STOP not confirmed by the record; stream kept",
                extra={
                    "connection_id": connection_id_from_pk(command.pk),
                    "epoch": command.epoch,
                    "desired_state": record.desired_state if record else None,
                    "record_epoch": record.lease_epoch if record else None,
                },
            )
            return False
        return session.stop_command(command.epoch)

    # ------------------------------------------------------------------ periodic work
    async def _housekeeping(self) -> None:
        """Once per heartbeat: health file, gauges (the worker lease is the liveness task's)."""
        settings = self.config.settings
        while True:
            try:
                health.touch(settings.health_file)
            except OSError as exc:
                self.logger.warning("cannot touch health file", extra={"error": str(exc)})
            self.metrics.gauge("ActiveConnections", len(self.sessions))
            self.metrics.gauge("QueuedFrames", self.flusher.queued)
            await asyncio.sleep(settings.heartbeat_seconds)

    # ------------------------------------------------------------------ the worker lease
    def _fence_all(self, cause: FenceCause) -> None:
        """The worker lease is over (:class:`~wsfleet_worker.liveness.WorkerLiveness`).

        Synchronous: every session's socket is aborted before this returns, and from now on
        ``may_write`` is false for all of them (the flusher drops their queued frames, no
        checkpoint or release follows). Then this incarnation ends with :data:`EXIT_LEASE_LOST`,
        without retiring its item or releasing anything: peers take over after the expiry.
        """
        sessions = list(self.sessions.values())
        for session in [*sessions, *self.prepared.values()]:
            session.fence(cause.value)
        self.poller.stop()
        self.metrics.count("SelfFenced", len(sessions))
        self.metrics.count("WorkerDead" if cause is FenceCause.DEAD else "WorkerSelfFenced")
        self.logger.error(
            "worker lease over: every session fenced; this incarnation ends",
            extra={
                "cause": cause.value,
                "sessions": len(sessions),
                "exit_code": EXIT_LEASE_LOST,
                "fence_at_ms": self.liveness.fence_at_ms,
            },
        )
        self.exit_code = EXIT_LEASE_LOST
        self.request_stop()

    # ------------------------------------------------------------------ checkpoints
    async def _checkpoint_loop(self) -> None:
        """About once a second: write the checkpoints that are due, a few at a time."""
        slots = asyncio.Semaphore(self._write_slots)

        async def write(session: Session) -> None:
            async with slots:
                try:
                    await session.checkpoint()
                except Exception as exc:  # a bug here must not stop everyone's checkpoints
                    self.logger.exception(
                        "checkpoint failed unexpectedly",
                        extra={"connection_id": session.connection_id,
                               "error": describe_error(exc)},
                    )

        tick = min(_CHECKPOINT_TICK_SECONDS, self.config.settings.checkpoint_seconds)
        while True:
            await asyncio.sleep(tick)
            if self.liveness.fenced:
                return
            now = self._clock()
            due = [s for s in list(self.sessions.values()) if s.checkpoint_due(now)]
            if due:
                await asyncio.gather(*(write(session) for session in due))

    # ------------------------------------------------------------------ sweep
    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.sweep_seconds)
            if self.liveness.fenced or self._stopping:
                return
            try:
                await self.ownership.run_once()
            except WsfleetError as exc:
                self.metrics.count("SweepFailures")
                self.logger.warning("sweep failed", extra={"error": describe_error(exc)})

    async def sweep(self) -> None:
        """One pass of :class:`~wsfleet_worker.sweep.OwnershipSweep` (tests call it)."""
        await self.ownership.run_once()

    async def _flush_metrics_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.config.metrics_flush_seconds)
            self.metrics.gauge("ActiveConnections", len(self.sessions))
            self.metrics.flush()

    # ------------------------------------------------------------------ shutdown
    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, self._on_signal, signum)

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        name = signal.Signals(signum).name
        if self._signals == 1:
            self.logger.info("graceful shutdown requested", extra={"signal": name})
            self.request_stop()
            return
        self.logger.warning("second signal: exiting now", extra={"signal": name})
        self.force_exit = True
        self.exit_code = 1
        loop = asyncio.get_running_loop()
        for other in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(other)  # a third signal: the default action
        self.request_stop()
        if self._deadline is not None:
            with contextlib.suppress(RuntimeError):  # that wait is over already
                self._deadline.reschedule(loop.time())

    def _bounded(self, seconds: float) -> asyncio.Timeout:
        """``asyncio.timeout(seconds)`` that a second signal expires at once."""
        self._deadline = asyncio.timeout(0 if self.force_exit else seconds)
        return self._deadline

    async def shutdown(self) -> None:
        """Drain as described in the module docstring. Safe to call twice."""
        if self._stopping:
            return
        self._stopping = True
        settings = self.config.settings
        self.taker.stop()
        self.handover.stop()
        self.poller.stop()
        count = len(self.sessions)
        self.logger.info(
            "draining", extra={"connections": count, "fenced": self.liveness.fenced}
        )
        loop = asyncio.get_running_loop()
        started = loop.time()
        hints_before = self.outbox.sent
        try:
            async with self._bounded(settings.drain_timeout_seconds):
                self.flusher.flush_now()
                await self._drain_overlaps()  # (ends every session it does not hand over)
                tasks = [*self._session_tasks.values(), *self._prepared_tasks.values()]
                if tasks:
                    await asyncio.wait(tasks)  # (unlike gather, a timeout cancels nothing here)
                await self.handover.close()  # the COMMITs and HANDOFFs of the moves
                self._drain_complete = not self.sessions
                if self.rebalancer is not None:
                    await self.rebalancer.close()
                await self.outbox.flush()
                poller = self._background.get("poller")
                if poller is not None and (self.outbox.sent > hints_before or self.taker.acquiring):
                    # Our hints may have been caught by our own long poll, or an acquire is
                    # in flight: let the poller hand messages and leases back (it does so
                    # once stopped) before we go.
                    await asyncio.wait({poller})
                    await self.outbox.flush()
        except TimeoutError:
            self.logger.warning(
                "drain timeout: leaving the rest to the worker lease's expiry",
                extra={"undrained": len(self.sessions)},
            )
            # Leases already released must still be hinted, or they wait for the reconciler.
            with contextlib.suppress(TimeoutError):
                async with self._bounded(_LATE_HINTS_TIMEOUT_SECONDS):
                    await self.outbox.flush()
        for task in [*self._session_tasks.values(), *self._prepared_tasks.values()]:
            task.cancel()
        self.logger.info(
            "drained",
            extra={
                "connections": count,
                "hints_sent": self.outbox.sent - hints_before,
                "drain_ms": round((loop.time() - started) * 1000),
            },
        )
        await self._cleanup()

    async def _drain_overlaps(self) -> set[str]:
        """Make-before-break for a drain: name a live peer for each connection that may
        overlap (the worker items give their control queues and free room) and hand it over
        (:meth:`~.handover.Handover.give`); returns the pks given that way. Every other
        session is ended as before at once. With no peer yet (a rolling deploy that stops the
        old task as it starts the new one), the worker items are read again every half second
        for a quarter of the drain (the streams keep streaming and storing meanwhile). The
        prepare bound is what is left of half the drain (at most HANDOFF_PREPARE_SECONDS,
        :func:`~.handover.drain_prepare_seconds`); what does not fit the peers' room breaks
        as before."""
        settings = self.config.settings
        loop = asyncio.get_running_loop()
        started = loop.time()
        bound = drain_prepare_seconds(
            settings.drain_timeout_seconds, self.config.handoff_prepare_seconds
        )
        candidates = {
            pk for pk, session in self.sessions.items()
            if bound > 0 and not self.liveness.fenced and session.reason is None
            and self.handover.overlap_for(session, "peer")
        }
        for session in list(self.sessions.values()):
            if session.pk not in candidates:
                session.finish(ExitReason.SHUTDOWN, via="shutdown")
        if not candidates:
            return set()
        peers: list[Any] = []
        while True:
            try:
                async with asyncio.timeout(bound):
                    peers = await self.handover.drain_peers()
            except (WsfleetError, TimeoutError) as exc:
                self.logger.warning("no peers read for the drain",
                                    extra={"error": describe_error(exc)})
            waited = loop.time() - started
            if peers or waited >= settings.drain_timeout_seconds / 4 or self.force_exit:
                break
            await asyncio.sleep(_DRAIN_PEER_POLL_SECONDS)
        bound = min(bound, settings.drain_timeout_seconds / 2 - (loop.time() - started))
        live = [pk for pk in sorted(candidates)
                if pk in self.sessions and self.sessions[pk].reason is None]
        plan = plan_drain(live, peers) if bound > 0 else {}
        for pk, peer in plan.items():
            self.handover.spawn_give(
                self.sessions[pk], peer.worker_id, peer.queue_url, ExitReason.SHUTDOWN,
                bound_ms=int(bound * 1000),
            )
        for pk in live:
            if pk not in plan:
                self.sessions[pk].finish(ExitReason.SHUTDOWN, via="shutdown")
        self.logger.info("draining with overlaps",
                         extra={"overlaps": len(plan), "candidates": len(candidates),
                                "peers": len(peers),
                                "waited_ms": round((loop.time() - started) * 1000)})
        return set(plan)

    def _retire(self) -> None:
        try:
            self.leases.retire_worker(self.worker_id)
        except WsfleetError as exc:
            self.logger.warning("cannot retire the worker item; it will expire",
                                extra={"error": describe_error(exc)})

    async def _cleanup(self) -> None:
        for task in self._background.values():
            task.cancel()
        await asyncio.gather(*self._background.values(), return_exceptions=True)
        loop = asyncio.get_running_loop()
        steps: list[Awaitable[None]] = []
        if self._drain_complete and not self.liveness.fenced and self.liveness.timer is not None:
            # Every connection was released: end the lease now, so a peer that still finds one
            # of ours (an acquire racing the drain) need not wait for the expiry. On the
            # default executor: the io pool may still hold queued work.
            steps.append(loop.run_in_executor(None, self._retire))
        elif self.liveness.timer is not None:
            self.logger.info(
                "worker item left to expire",
                extra={"fenced": self.liveness.fenced, "sessions_left": len(self.sessions)},
            )
        if self.control is not None:
            steps.append(self.control.close())
        try:
            async with self._bounded(_CLEANUP_TIMEOUT_SECONDS):
                await asyncio.gather(*steps, return_exceptions=True)
        except TimeoutError:
            self.logger.warning("cleanup timed out")
        self.metrics.gauge("ActiveConnections", len(self.sessions))
        self.metrics.flush()
        self.offloader.shutdown()
        self.logger.info("worker stopped", extra={"exit_code": self.exit_code})


async def serve(config: WorkerConfig) -> int:
    """Run incarnations of the worker until one ends for another reason than a lost lease.

    Each incarnation is a fresh :class:`Worker` (its own control queue, item, pools and
    sessions) under :func:`~wsfleet.record.incarnation_id` of the configured id. A signal ends
    the process whatever the incarnation was doing. The first incarnation that cannot start
    ends it too (exit 1: a configuration or network problem the orchestrator must see); a
    later one retries with jittered backoff under the next id, since the process has already
    shown it can run and the trouble that cost its lease (a throttled or stalled table) is
    what keeps a start from landing.
    """
    base_id = config.settings.worker_id
    incarnation = 1
    logger: Any = None  # one Powertools Logger per process (a second one has no formatter)
    delays: Iterator[float] | None = None
    while True:
        worker = Worker.from_config(config, logger=logger)
        logger = worker.logger
        code = await worker.run()
        if worker.signalled:
            return code
        if worker.started:
            delays = None
            if code != EXIT_LEASE_LOST:
                return code
            reason = "worker lease lost: starting over under a new identity"
        elif incarnation == 1:
            return code
        else:
            delays = delays or backoff(initial=0.5, cap=_RESTART_BACKOFF_CAP_SECONDS)
            await asyncio.sleep(next(delays))
            if worker.signalled:
                return code
            reason = "incarnation could not start; trying again under a new identity"
        incarnation += 1
        worker_id = incarnation_id(base_id, incarnation)
        worker.logger.warning(
            reason,
            extra={"previous": worker.worker_id, "next": worker_id, "incarnation": incarnation},
        )
        logger.append_keys(worker_id=worker_id)
        config = replace(config, settings=replace(config.settings, worker_id=worker_id))


def main() -> int:
    """Entry point of ``python -m wsfleet_worker``: configuration only from the environment."""
    try:
        config = WorkerConfig.from_env()
        config.settings.require_hint_queue_url()
    except ConfigurationError as exc:
        print(f"wsfleet-worker: configuration error: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(serve(in_task(config, os.environ)))


def in_task(config: WorkerConfig, environ: Mapping[str, str]) -> WorkerConfig:
    """``config`` with the ECS task identity (:mod:`wsfleet_worker.task_identity`), and the
    worker id naming the task unless ``WORKER_ID`` set one. Outside ECS: ``config`` as is."""
    try:
        identity = task_identity.discover(environ)
    except task_identity.MetadataError as exc:
        # Only this process's fast crash failover is lost: its lease still covers a crash.
        print(f"wsfleet-worker: no task identity ({exc}); crash failover waits out the lease",
              file=sys.stderr)  # fmt: skip
        return config
    if identity is None:
        return config
    worker_id = task_identity.worker_id_in_task(
        identity, config.settings.worker_id, explicit=bool(environ.get("WORKER_ID"))
    )
    return replace(config, task=identity, settings=replace(config.settings, worker_id=worker_id))
