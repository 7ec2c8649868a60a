"""Worker: the process that owns sessions, and its lifecycle from start to graceful exit.

Start
    1. create this worker's control queue (unless WORKER_CONTROL_CHANNEL=false);
    2. register the worker item (``WORKER#<id>``: control queue URL, liveness expiry);
    3. start the shared machinery: the message flusher, the heartbeat scheduler, housekeeping
       (health file, worker-item heartbeat, gauges), EMF flushes, the control-queue consumer
       and, last, the hint poller.

Run
    The poller acquires leases and starts a :class:`~wsfleet_worker.session.Session` per
    connection. Sessions end on their own (STOP, lost lease, upstream end); a session that
    crashed releases its lease and a hint is sent so a peer takes over at once.

Graceful shutdown (first SIGTERM/SIGINT; a second one exits at once), uvicorn's order:
    1. stop polling for hints (a receive already in flight is given back to the queue);
    2. every session, in parallel: stop reading, close its socket (1001), flush its frames,
       then release its lease with the final checkpoint in the same write (owner "",
       expiry 0, epoch kept);
    3. hints for all released connections go out as they are released (SendMessageBatch),
       so a peer acquires each one within a poll round trip instead of after the lease;
    4. all of the above bounded by DRAIN_TIMEOUT_SECONDS; whatever is left is cancelled and
       its lease simply expires (ECS's stopTimeout must exceed DRAIN_TIMEOUT_SECONDS + 5 s);
    5. deregister the worker item, delete the control queue, flush metrics, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import signal
import sys
from collections.abc import Awaitable, Coroutine
from typing import Any

from wsfleet.aws import dynamodb_client, sqs_client
from wsfleet.clock import Clock, now_ms
from wsfleet.control import StopCommand, stop_confirmed
from wsfleet.exceptions import (
    ConfigurationError,
    ConnectionNotFound,
    ConnectionStopped,
    LeaseConflict,
    LeaseError,
    WsfleetError,
)
from wsfleet.hints import Hint, HintSender
from wsfleet.lease import EARLY_HINT_MAX_WAIT_MS, Lease, acquire_wait_ms
from wsfleet.messages import MessageStore
from wsfleet.record import ConnectionRecord, WorkerRecord, connection_id_from_pk
from wsfleet.store import LeaseStore

from . import health
from .config import WorkerConfig
from .control_channel import ControlChannel
from .flusher import MessageFlusher
from .heartbeat import HeartbeatScheduler
from .observability import WorkerMetrics, make_logger
from .offload import Offloader
from .poller import HintOutcome, HintPoller
from .protocol import ExitReason
from .session import Session, SessionContext, SessionResult
from .upstream import Connector, describe_error, make_connector

__all__ = ["HintOutbox", "Worker", "main"]

#: Bounds after DRAIN_TIMEOUT_SECONDS: hints still queued when the drain timed out, then
#: deregistering and deleting the control queue. Keep drain + both below ECS's stopTimeout.
_LATE_HINTS_TIMEOUT_SECONDS = 2.0
_CLEANUP_TIMEOUT_SECONDS = 3.0
#: Hint delay for a connection whose session crashed (see _session_done).
_CRASH_HINT_DELAY_SECONDS = 2


class HintOutbox:
    """Sends hints in batches as they are queued: whatever accumulates while one
    SendMessageBatch is in flight goes out together in the next."""

    def __init__(self, sender: HintSender, offloader: Offloader, logger: Any) -> None:
        self._sender = sender
        self._offloader = offloader
        self._logger = logger
        self._pending: list[Hint] = []
        self._task: asyncio.Task[None] | None = None
        self.sent = 0

    def add(self, hint: Hint) -> None:
        self._pending.append(hint)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                failed = await self._offloader.sqs(self._sender.send_many, batch)
            except Exception as exc:  # the reconciler will find these leases free
                failed = batch
                self._logger.warning("hint send failed", extra={"error": describe_error(exc)})
            self.sent += len(batch) - len(failed)
            if failed:
                self._logger.warning("hints not sent", extra={"count": len(failed)})

    async def flush(self) -> None:
        """Wait until everything queued so far has been sent (or given up on)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)


class Worker:
    """One worker process. ``await Worker(config).run()`` returns the exit status."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        dynamodb: Any = None,
        sqs: Any = None,
        logger: Any = None,
        metrics: WorkerMetrics | None = None,
        connector: Connector | None = None,
        clock: Clock = now_ms,
    ) -> None:
        settings = config.settings
        self.config = config
        self.worker_id = settings.worker_id
        self.logger = logger or make_logger(settings.service_name, self.worker_id)
        self.metrics = metrics or WorkerMetrics(settings.service_name)
        threads = config.io_threads + config.write_threads
        dynamodb = dynamodb or dynamodb_client(max_pool_connections=threads + 4)
        sqs = sqs or sqs_client(max_pool_connections=threads + 4)
        self._sqs = sqs
        self._clock = clock
        self.leases = LeaseStore.from_settings(settings, dynamodb)
        self.messages = MessageStore.from_settings(settings, dynamodb)
        self.offloader = Offloader(io_threads=config.io_threads, write_threads=config.write_threads)
        self.flusher = MessageFlusher(
            self.messages,
            self.offloader,
            self.metrics,
            flush_ms=settings.message_flush_ms,
            capacity=config.queue_frames,
            capacity_bytes=config.queue_bytes,
            max_in_flight=config.write_threads,
            logger=self.logger,
            clock=clock,
        )
        self.scheduler = HeartbeatScheduler(
            self.metrics, max_concurrent=max(1, config.io_threads // 2), clock=clock
        )
        self.outbox = HintOutbox(
            HintSender(sqs, settings.require_hint_queue_url()), self.offloader, self.logger
        )
        self.control = (
            ControlChannel(
                sqs,
                self.offloader,
                self.metrics,
                self.logger,
                prefix=settings.control_queue_prefix,
                sender_arns=tuple(
                    arn.strip() for arn in settings.control_queue_sender_arns.split(",")
                    if arn.strip()
                ),
                worker_id=self.worker_id,
                wait_seconds=config.control_wait_seconds,
            )
            if config.control_channel
            else None
        )
        self.poller = HintPoller(
            sqs,
            settings.hint_queue_url,
            self.offloader,
            self.metrics,
            self.logger,
            free_slots=self.free_slots,
            capacity=self._capacity_left,
            running=self.running,
            acquire=self.acquire,
            wait_seconds=config.hint_wait_seconds,
        )
        self._context = SessionContext(
            config=config,
            worker_id=self.worker_id,
            leases=self.leases,
            offloader=self.offloader,
            flusher=self.flusher,
            scheduler=self.scheduler,
            metrics=self.metrics,
            logger=self.logger,
            connect=connector
            or make_connector(
                max_frame_bytes=config.max_frame_bytes,
                allowed_hosts=config.settings.allowed_upstream_hosts,
                allow_insecure=config.settings.allow_insecure_ws,
            ),
            clock=clock,
            rng=random.Random(),
        )
        self.sessions: dict[str, Session] = {}
        self._session_tasks: dict[str, asyncio.Task[SessionResult]] = {}
        self._acquiring: set[str] = set()
        self._background: dict[str, asyncio.Task[None]] = {}
        self._stop = asyncio.Event()
        self._stopping = False
        self._signals = 0
        self._started_at_ms = 0
        self.exit_code = 0

    # ------------------------------------------------------------------ capacity
    def free_slots(self) -> int:
        """Connections this worker may take on now.

        Zero while draining, and while renewals run late (more than a quarter of the
        heartbeat): the leases already held come before new ones.
        """
        if self._stopping or self.scheduler.behind_ms() > self.config.heartbeat_ms // 4:
            return 0
        return self._capacity_left()

    def _capacity_left(self) -> int:
        return self.config.settings.max_connections - len(self.sessions) - len(self._acquiring)

    def running(self) -> set[str]:
        """Connections streaming here now (sessions already ending do not count)."""
        return {pk for pk, session in self.sessions.items() if session.reason is None}

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
        await self._stop.wait()
        await self.shutdown()
        return self.exit_code

    def request_stop(self) -> None:
        """Begin the graceful shutdown (what the first SIGTERM/SIGINT does)."""
        self._stop.set()

    async def start(self) -> None:
        settings = self.config.settings
        now = self._clock()
        self._started_at_ms = now
        queue_url = await self._open_control_channel()
        await self.offloader.io(
            self.leases.register_worker,
            WorkerRecord(
                worker_id=self.worker_id,
                control_queue_url=queue_url,
                started_at_ms=now,
                heartbeat_at_ms=now,
                expires_at_ms=now + settings.lease_ms,
                connection_count=0,
            ),
        )
        health.touch(settings.health_file)
        self._spawn("flusher", self.flusher.run())
        self._spawn("scheduler", self.scheduler.run())
        self._spawn("housekeeping", self._housekeeping())
        self._spawn("metrics", self._flush_metrics_periodically())
        if self.control is not None:
            self._spawn("control", self.control.run(self._on_stop_command))
        self._spawn("poller", self.poller.run())
        self.logger.info(
            "worker started",
            extra={
                "max_connections": settings.max_connections,
                "lease_seconds": settings.lease_seconds,
                "heartbeat_seconds": settings.heartbeat_seconds,
                "control_queue": self.control.queue_name if self.control else None,
            },
        )

    async def _open_control_channel(self) -> str:
        """Create the control queue; without one, STOP still arrives with the next renewal."""
        if self.control is None:
            return ""
        try:
            return await self.control.open()
        except Exception as exc:
            self.logger.error(
                "control queue unavailable; STOP will be noticed by renewals only",
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
        if name == "poller" and error is None:
            return
        self.logger.error(
            "background task ended unexpectedly; shutting down",
            extra={"task": name, "error": describe_error(error) if error else "returned"},
            exc_info=error,
        )
        self.exit_code = 1
        self.request_stop()

    # ------------------------------------------------------------------ acquiring
    async def acquire(self, hint: Hint) -> HintOutcome:
        """Acquire the hinted connection and start it; see :class:`HintPoller`."""
        pk = hint.pk
        if pk in self._acquiring:
            return HintOutcome.DONE
        ending = self.sessions.get(pk)
        if ending is not None:
            if ending.reason is None:
                return HintOutcome.DONE  # streaming here already: a duplicate hint
            # A session of ours is still winding down (e.g. it self-fenced): let it finish,
            # then compete for the lease like anyone else.
            task = self._session_tasks.get(pk)
            if task is not None:
                await asyncio.wait({task}, timeout=self.config.settings.heartbeat_seconds * 2)
            if pk in self.sessions:
                return HintOutcome.GIVE_BACK
        if self._stopping or self._capacity_left() <= 0:
            return HintOutcome.GIVE_BACK
        self._acquiring.add(pk)
        try:
            record = await self._acquire_lease(pk)
            if record is None:  # began to drain while waiting for the lease to lapse
                return HintOutcome.GIVE_BACK
        except (LeaseConflict, ConnectionStopped, ConnectionNotFound) as exc:
            self.metrics.count("AcquireConflicts")
            current = exc.current if isinstance(exc, LeaseError) else None
            self.logger.debug(
                "hint dropped",
                extra={
                    "connection_id": connection_id_from_pk(pk),
                    "reason": type(exc).__name__,
                    "holder": current.lease_owner if current else None,
                    "expires_at_ms": current.lease_expires_at_ms if current else None,
                },
            )
            return HintOutcome.DONE
        except WsfleetError as exc:
            self.logger.warning(
                "acquire failed; hint left for redelivery",
                extra={"connection_id": connection_id_from_pk(pk), "error": describe_error(exc)},
            )
            return HintOutcome.RETRY_LATER
        finally:
            self._acquiring.discard(pk)
        self.metrics.count("Acquired")
        if self._stopping:  # won a lease while draining: give it straight back
            await self._hand_back(record)
            return HintOutcome.DONE
        self._start_session(record)
        return HintOutcome.DONE

    async def _acquire_lease(self, pk: str) -> ConnectionRecord | None:
        """Acquire, waiting once for a lease that is about to lapse (an early hint).

        The wait happens inside the hint's round; the poller keeps receiving meanwhile.
        """
        try:
            return await self.offloader.io(self.leases.acquire, pk, self.worker_id)
        except LeaseConflict as conflict:
            wait_ms = acquire_wait_ms(
                conflict.current, self.worker_id, self._clock(), EARLY_HINT_MAX_WAIT_MS
            )
            if wait_ms is None:
                raise
        self.metrics.count("EarlyHintWaits")
        await asyncio.sleep(wait_ms / 1000)
        if self._stopping:
            return None
        return await self.offloader.io(self.leases.acquire, pk, self.worker_id)

    async def _hand_back(self, record: ConnectionRecord) -> None:
        lease = Lease.of(record)
        try:
            await self.offloader.io(self.leases.release, lease)
        except WsfleetError:
            return
        self.outbox.add(Hint(record.pk, epoch=lease.epoch))

    def _start_session(self, record: ConnectionRecord) -> None:
        session = Session(record, self._context)
        self.sessions[record.pk] = session
        task = asyncio.create_task(session.run(), name=f"session:{record.pk}")
        self._session_tasks[record.pk] = task
        task.add_done_callback(functools.partial(self._session_done, session))
        self.metrics.gauge("ActiveConnections", len(self.sessions))

    def _session_done(self, session: Session, task: asyncio.Task[SessionResult]) -> None:
        if self.sessions.get(session.pk) is session:
            del self.sessions[session.pk]
            self._session_tasks.pop(session.pk, None)
        self.metrics.gauge("ActiveConnections", len(self.sessions))
        self.poller.slot_freed()
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

    async def _on_stop_command(self, command: StopCommand) -> bool:
        """Close the named session if the connection record confirms the STOP.

        A STOP on the control queue is checked against a consistent read of the record
        (:func:`~wsfleet.control.stop_confirmed`) before anything closes, so a forged or stale
        command cannot end a live stream (issue #11, finding 7). If the read fails, nothing
        closes: the lease renewal still sees a real STOP within one heartbeat.
        """
        session = self.sessions.get(command.pk)
        if session is None or session.epoch != command.epoch or session.reason is not None:
            return False
        try:
            record = await self.offloader.io(self.leases.get, command.pk)
        except WsfleetError as exc:
            self.logger.warning(
                "cannot confirm STOP; left to the lease renewal",
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
        """Once per heartbeat: health file, worker-item heartbeat, gauges."""
        settings = self.config.settings
        while True:
            try:
                health.touch(settings.health_file)
            except OSError as exc:
                self.logger.warning("cannot touch health file", extra={"error": str(exc)})
            self.metrics.gauge("ActiveConnections", len(self.sessions))
            self.metrics.gauge("QueuedFrames", self.flusher.queued)
            await self._heartbeat_worker_item()
            await asyncio.sleep(settings.heartbeat_seconds)

    async def _heartbeat_worker_item(self) -> None:
        settings = self.config.settings
        now = self._clock()
        try:
            await self.offloader.io(
                self.leases.heartbeat_worker,
                self.worker_id,
                expires_at_ms=now + settings.lease_ms,
                connection_count=len(self.sessions),
            )
        except WsfleetError:
            # Gone (a reconciler thought us dead) or a transient failure: put it back.
            record = WorkerRecord(
                worker_id=self.worker_id,
                control_queue_url=self.control.queue_url if self.control else "",
                started_at_ms=self._started_at_ms,
                heartbeat_at_ms=now,
                expires_at_ms=now + settings.lease_ms,
                connection_count=len(self.sessions),
            )
            with contextlib.suppress(WsfleetError):
                await self.offloader.io(self.leases.register_worker, record)

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
        sys.stdout.flush()
        os._exit(1)

    async def shutdown(self) -> None:
        """Drain as described in the module docstring. Safe to call twice."""
        if self._stopping:
            return
        self._stopping = True
        settings = self.config.settings
        self.poller.stop()
        count = len(self.sessions)
        self.logger.info("draining", extra={"connections": count})
        loop = asyncio.get_running_loop()
        started = loop.time()
        hints_before = self.outbox.sent
        try:
            async with asyncio.timeout(settings.drain_timeout_seconds):
                self.flusher.flush_now()
                for session in list(self.sessions.values()):
                    session.finish(ExitReason.SHUTDOWN, via="shutdown")
                tasks = list(self._session_tasks.values())
                if tasks:
                    await asyncio.wait(tasks)  # (unlike gather, a timeout cancels nothing here)
                await self.outbox.flush()
                poller = self._background.get("poller")
                if poller is not None and (self.outbox.sent > hints_before or self._acquiring):
                    # Our hints may have been caught by our own long poll, or an acquire is
                    # in flight: let the poller hand messages and leases back (it does so
                    # once stopped) before we go.
                    await asyncio.wait({poller})
                    await self.outbox.flush()
        except TimeoutError:
            self.logger.warning(
                "drain timeout: leaving the rest to lease expiry",
                extra={"undrained": len(self.sessions)},
            )
            # Leases already released must still be hinted, or they wait for the reconciler.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_LATE_HINTS_TIMEOUT_SECONDS):
                    await self.outbox.flush()
        for task in list(self._session_tasks.values()):
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

    async def _cleanup(self) -> None:
        for task in self._background.values():
            task.cancel()
        await asyncio.gather(*self._background.values(), return_exceptions=True)
        # On the default executor: after a drain timeout the io pool may still hold a queue
        # of releases, and deregistering must not wait behind them.
        loop = asyncio.get_running_loop()
        steps: list[Awaitable[None]] = [
            loop.run_in_executor(None, self.leases.deregister_worker, self.worker_id)
        ]
        if self.control is not None:
            steps.append(self.control.close())
        try:
            async with asyncio.timeout(_CLEANUP_TIMEOUT_SECONDS):
                await asyncio.gather(*steps, return_exceptions=True)
        except TimeoutError:
            self.logger.warning("cleanup timed out")
        self.metrics.gauge("ActiveConnections", len(self.sessions))
        self.metrics.flush()
        self.offloader.shutdown()
        self.logger.info("worker stopped", extra={"exit_code": self.exit_code})


def main() -> int:
    """Entry point of ``python -m wsfleet_worker``: configuration only from the environment."""
    try:
        config = WorkerConfig.from_env()
        config.settings.require_hint_queue_url()
    except ConfigurationError as exc:
        print(f"wsfleet-worker: configuration error: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(Worker(config).run())

