"""Session: one leased upstream connection, as one structured task group with one way out.

A session starts right after its lease was acquired and lives until one of these happens:

==================  =========================================  ================================
Trigger             Reason                                     Ending
==================  =========================================  ================================
control STOP        :attr:`ExitReason.STOPPED`                 flush, release + checkpoint
checkpoint/sweep    :attr:`ExitReason.STOPPED`                 flush, release + checkpoint
  saw STOPPED
lease lost          :attr:`ExitReason.FENCED`                  abort socket, write nothing
  (a write refused,
  or the sweep)
worker fenced       :attr:`ExitReason.FENCED`                  abort socket, write nothing
upstream 1000/1001  :attr:`ExitReason.UPSTREAM_CLOSED`         flush, mark STOPPED
  (only with
  normal_close:
  final)
worker draining     :attr:`ExitReason.SHUTDOWN`                flush, release, hint a peer
rebalancing         :attr:`ExitReason.REBALANCED`              flush, release (moved), the
                                                               worker hints the chosen peer
bug                 :attr:`ExitReason.CRASHED`                 flush, release, hint a peer
breaker tripped     :attr:`ExitReason.FAILED`                  flush, mark FAILED (no hint)
prepared, not owned :attr:`ExitReason.ABANDONED`               close, write nothing
==================  =========================================  ================================

Make-before-break (docs/handoff.md, driven by :mod:`~wsfleet_worker.handover`). Two modes
beside the ordinary one:

* **prepared** (the taker, before it owns): :meth:`Session.prepared_for` builds a session that
  connects like any other but writes nothing anywhere (``may_write`` and every lease write are
  off) and buffers what it reads, bounded in frames and bytes (``HANDOFF_BUFFER_FRAMES``,
  ``WORKER_SESSION_QUEUE_BYTES``; over either the session ends ABANDONED, reason
  ``budget``). It does not reconnect: any end of its socket ends it. :meth:`Session.adopt`,
  called once a consistent read showed the transfer, makes it an ordinary session of the new
  epoch and stores the buffered frames above the transferred checkpoint, then live ones.
* **handing over** (the giver): :meth:`Session.hold` stops reconnecting (a second session
  could cut the taker's). :meth:`Session.hand_over` ends the session for a move or a drain
  with a transfer instead of a release: the streaming task is cancelled (nothing read after
  is stored), queued frames are flushed and no batch of the session is in flight, then the
  one conditional ``transfer`` write, and only then the socket is closed (1001). If the
  transfer does not land (STOPPED meanwhile, lost, a store error whose outcome a read does
  not confirm) the session ends by the break path as today.

Crash-loop breaker: a crash, a close the worker itself sent for what the upstream sent (1002,
1007, 1008, 1009), an unreadable credential, or a normal upstream close before any frame, is
counted on the connection item at the position it happened
(:func:`wsfleet.lease.breaker_verdict`, :func:`~wsfleet_worker.session_rules.is_poison`,
:func:`~wsfleet_worker.session_rules.is_empty_close`). The count survives hand-overs;
``WORKER_BREAKER_MAX_FAILURES`` of them at one position, or within
``WORKER_BREAKER_WINDOW_SECONDS`` of the first, end the connection FAILED. A crash that trips
it turns into :attr:`ExitReason.FAILED`.

Shape: :meth:`Session.run` opens a task group holding the streaming task (connect, receive,
reconnect with backoff) and waits for the *done* signal that :meth:`Session.finish` raises from
anywhere (the worker's liveness task, checkpoint loop or sweep, the control channel, the
worker's shutdown, or the streaming task itself). Whatever comes first, the streaming task is
cancelled, the socket is closed at once, and the ending in
:func:`~wsfleet_worker.session_rules.exit_plan` runs. There is no path where a STOP or a lost lease
leaves the socket open (the seed worker's ``asyncio.gather`` did).

Liveness (lease model v2): a session renews nothing. Its connection is alive while the worker
lease is (:class:`~wsfleet_worker.liveness.WorkerLiveness`), so :meth:`Session.may_write`
asks the worker lease, and a worker that loses its lease fences every session at once. The
checkpoint is written by the worker's checkpoint loop (:meth:`Session.checkpoint`), at most
once per CHECKPOINT_SECONDS and only when it advanced.

The final write (release, mark STOPPED/FAILED) must land: a live worker must never keep a
connection it does not stream, and no expiry would free it. A write that fails for a reason
that may pass is retried with jittered backoff until it lands, the lease turns out lost, or
the worker is fenced (then the worker's expiry frees the connection).

Upstream trouble (a dropped link, any close from the upstream, a failed connect) does not end
the session: it records ``last_error``, backs off with jitter (reset only by a connection that
stayed open, :class:`~wsfleet_worker.session_rules.ReconnectPolicy`) and reconnects with
``from_seq = checkpoint + 1``. Only ``normal_close: final`` makes a 1000/1001 close the end.
Frames replayed that way are recognised by the
:class:`~wsfleet_worker.checkpoint.CheckpointTracker` (or overwrite themselves in the table).

Each connect sends the connection's handshake options (:mod:`~wsfleet_worker.handshake`:
headers, subprotocols, the credential resolved by :mod:`~wsfleet_worker.credentials`, the
subscribe message after the handshake) and resumes as its ``resume`` mode says. A secret
that cannot be read is a failed connect counted by the crash-loop breaker.

Resume gap (issue #13). The first sequenced frame after every connect is compared with what
the session already has: ``gap = first seq - baseline - 1``
(:func:`wsfleet.upstream_options.resume_gap`). The baseline is the highest seq this session
received (at the first connect: the checkpoint it acquired with). An upstream that cannot
replay (``resume: none``, or a START with ``resume: false``) is different at a takeover: the
previous holder may have stored frames above its checkpoint (checkpoints are written every
CHECKPOINT_SECONDS, or never before a crash), so the session first reads the highest seq in
the messages table and measures from there; otherwise frames that are safely stored would
be reported lost (and a stream that crashed before its first checkpoint, baseline 0, would
report no gap at all). Totals (gapped resumes, frames) are added to the counts the session
acquired with and written with :meth:`~wsfleet.store.LeaseStore.note_gap`, one write at a
time (totals, so the last one to land must be the newest), metric ``ResumeGapFrames``. The
gap is never silently lost: pending totals are written before any checkpoint write (so no
checkpoint passes an unrecorded gap: if this worker dies first, the next holder resumes below
it and measures it again) and before the final write; a write that keeps failing is logged.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, ConnectionClosedError, InvalidStatus

from wsfleet.aws import CONNECT_TIMEOUT_SECONDS, READ_TIMEOUT_SECONDS
from wsfleet.backoff import backoff
from wsfleet.clock import Clock, now_ms
from wsfleet.exceptions import (
    ConnectionStopped,
    LeaseLost,
    StoreError,
    UpstreamRefused,
    WsfleetError,
)
from wsfleet.lease import (
    BreakerVerdict,
    HandoffStep,
    Lease,
    breaker_verdict,
    checkpoint_due,
    commit_confirmed,
    prepared_resume_seq,
    taker_verdict,
)
from wsfleet.messages import Message, local_sk, seq_sk
from wsfleet.record import ConnectionRecord
from wsfleet.sinks.select import AT_LEAST_ONCE_SINKS
from wsfleet.store import LeaseStore
from wsfleet.upstream_options import ResumeMode, resume_gap

from .checkpoint import CheckpointTracker, SendWindow
from .config import WorkerConfig
from .connector import Connector, describe_error, is_permanent
from .credentials import CredentialUnavailable, SecretResolver
from .flusher import MessageFlusher, QueuedFrame
from .frames import Frame, FrameKind, parse_frame
from .handshake import Handshake, plan_handshake
from .observability import WorkerMetrics
from .offload import Offloader
from .session_rules import (
    MESSAGE_TIMEOUT_CODE,
    CloseAction,
    ErrorCategory,
    ExitReason,
    FinalWrite,
    ReconnectPolicy,
    SessionState,
    close_action,
    exit_plan,
    is_credential_refusal,
    is_empty_close,
    is_poison,
    last_error_text,
    supersedes,
)

__all__ = ["Liveness", "Session", "SessionContext", "SessionResult"]

#: Base wait for a session's queued frames at its end (plus three flush intervals).
_SETTLE_GRACE_SECONDS = 1.0
# One DynamoDB attempt at most: once the session is ending the flusher's guard refuses every
# retry of a batch holding its frames.
_IN_FLIGHT_WAIT_SECONDS = CONNECT_TIMEOUT_SECONDS + READ_TIMEOUT_SECONDS
#: Backoff of a final write that failed for a reason that may pass (throttling, an outage).
_FINAL_WRITE_BACKOFF = {"initial": 0.2, "factor": 2.0, "cap": 10.0}
#: A checkpoint write that failed is tried again after this long (not on every tick).
_CHECKPOINT_RETRY_MS = 5_000
#: A frame waiting for its send limit to be raised retries a failed raise after this long.
_SEND_LIMIT_RETRY_SECONDS = 0.5
#: How often a session waiting for its last message write re-checks its lease.
_QUIESCE_POLL_SECONDS = 0.5
#: Backoff of a gap-totals write that failed, and how many attempts one flush makes.
_GAP_WRITE_BACKOFF = {"initial": 0.2, "factor": 2.0, "cap": 2.0}
_GAP_WRITE_ATTEMPTS = 5


class Liveness(Protocol):
    """The worker lease as a session sees it (:class:`~wsfleet_worker.liveness.WorkerLiveness`)."""

    @property
    def fenced(self) -> bool: ...

    @property
    def fence_at_ms(self) -> int: ...

    def may_write(self, now: int) -> bool: ...


@dataclass(frozen=True)
class SessionContext:
    """Everything a session shares with the rest of its worker."""

    config: WorkerConfig
    worker_id: str
    leases: LeaseStore
    offloader: Offloader
    flusher: MessageFlusher
    liveness: Liveness
    metrics: WorkerMetrics
    logger: Any
    connect: Connector
    clock: Clock = now_ms
    rng: random.Random = field(default_factory=random.Random)
    #: Resolves credential references (None: a connection naming one cannot connect).
    secrets: SecretResolver | None = None
    #: ``highest_seq(pk)``: the highest seq stored (see the module docstring, resume gap).
    highest_seq: Callable[[str], int] | None = None


@dataclass(frozen=True)
class SessionResult:
    """How a session ended. ``released``: the lease is free now (a peer may take it)."""

    pk: str
    epoch: int
    reason: ExitReason
    via: str
    released: bool
    last_seq: int
    hint: bool
    #: make-before-break: the worker the connection was transferred to ("" otherwise)
    transferred_to: str = ""


class Session:
    """One connection held under one lease epoch. See the module docstring."""

    def __init__(
        self, record: ConnectionRecord, context: SessionContext, *, prepared: bool = False
    ) -> None:
        self.record = record
        self.pk = record.pk
        self._ctx = context
        lease = Lease.of(record)
        self._lease = lease
        self.started_at_ms = context.clock()
        self.tracker = CheckpointTracker(record.last_seq)
        self.persisted_seq = record.last_seq
        # A random phase: a thousand sessions acquired in one burst must not checkpoint in one
        # burst forever after (the next one is due an interval after the previous write).
        interval = context.config.settings.checkpoint_ms
        self.checkpointed_at_ms = self.started_at_ms - int(context.rng.uniform(0, interval))
        self._checkpointing = False
        self._checkpoint_ended = asyncio.Event()
        #: At-least-once sinks only: the send limit that bounds what a failover re-sends.
        self.window: SendWindow | None = None
        self._replay_unstored = False
        self._inherit_window(record)
        self._send_wait = 0  # the seq of a frame waiting for the send limit (0: none)
        self.state = SessionState.CONNECTING
        self.reason: ExitReason | None = None
        self.via = ""
        self.fenced = False
        self._done = asyncio.Event()
        self._progress = asyncio.Event()  # set on every acknowledgement (and on fencing)
        self._ws: ClientConnection | None = None
        self._local_count = 0  # frames without seq stored so far (their sk counter)
        self._local_unacked = 0
        self._frame_bytes: dict[tuple[str, str], int] = {}  # item bytes of frames in flight
        self._bytes_in_flight = 0
        self._uncovered_since_ms: int | None = None
        self._warned_invalid = False
        self._ending = False  # the final lease write has begun: no other write may follow
        self._verdict: BreakerVerdict | None = None  # a crash counted, not yet written
        self._failure = ""  # last_error of the failure the breaker counted last
        #: The last_error the record holds as far as this session knows: the same trouble again
        #: (an upstream that keeps closing, say) is not written again on every reconnect.
        self._error_noted = record.last_error
        self._log = {"connection_id": record.connection_id, "epoch": lease.epoch}
        options = record.upstream
        self._seq_pointer = options.seq_pointer  # None: the fleet's SEQ_FIELD, top level
        #: The upstream cannot replay: a takeover measures its gap from the highest seq stored.
        self._live_only = options.resume is ResumeMode.NONE or not record.resume
        self._stored_high: int | None = None  # read once, before the first connect
        self._gap_baseline: int | None = None  # set at each connect until its first seq frame
        self.gap_resumes = record.resume_gaps  # totals: the acquired counts plus this session's
        self.gap_frames = record.gap_frames
        self._gaps_stored = (record.resume_gaps, record.gap_frames)
        self._gap_lock = asyncio.Lock()  # one note_gap in flight: the newest totals land last
        self._gap_tasks: set[asyncio.Task[bool]] = set()
        self._stored_any = False  # the first acknowledged frame is logged (hand-off timing)
        # make-before-break (see the module docstring)
        self.prepared = prepared  # a taker's session that does not own the connection (yet)
        self._buffering = prepared  # frames go to the buffer, not to the flusher
        self._buffer: deque[tuple[Frame, int, int]] = deque()  # (frame, received ms, bytes)
        self._buffer_bytes = 0
        #: the first numbered frame the prepared session holds (it holds every one after it)
        self.first_buffered_seq: int | None = None
        self.buffered_seq = asyncio.Event()  # set once first_buffered_seq is known
        self._replayed = asyncio.Event()  # adopt() has stored the buffer
        self.abandon_reason = ""
        self.connects = 0  # sessions opened to the upstream
        self.handing_over = False  # a giver's move is under way: do not reconnect
        self._transfer_to = ""
        #: set once the transfer write landed (the socket is still closing): the taker may
        #: be told now
        self.transferred = asyncio.Event()

    def _inherit_window(self, record: ConnectionRecord) -> None:
        """The send window (at-least-once sinks only) of a session resuming ``record``."""
        settings = self._ctx.config.settings
        if settings.message_sink not in AT_LEAST_ONCE_SINKS:
            return
        self.window = SendWindow(
            last_seq=record.last_seq,
            sent_limit=record.sent_limit,
            frames=settings.message_replay_window,
            takeovers=record.replayed_takeovers,
            replayed_frames=record.replayed_frames,
        )
        #: A takeover's window is stored with the first checkpoint write, due at once.
        self._replay_unstored = self.window.replay is not None

    @classmethod
    def prepared_for(
        cls, record: ConnectionRecord, context: SessionContext, *, durable: int = 0
    ) -> Session:
        """A taker's prepared session of ``record`` (read when the PREPARE was confirmed),
        resuming a replaying upstream from the giver's last stored frame where the giver says
        it stored that far (:func:`~wsfleet.lease.prepared_resume_seq`,
        :class:`~wsfleet.control.PrepareCommand`)."""
        session = cls(record, context, prepared=True)
        resume_after = prepared_resume_seq(durable, record.last_seq) - 1
        if resume_after > record.last_seq:
            session.tracker = CheckpointTracker(resume_after)
        return session

    # ------------------------------------------------------------------ identity
    @property
    def lease(self) -> Lease:
        return self._lease

    @property
    def epoch(self) -> int:
        return self._lease.epoch

    @property
    def connection_id(self) -> str:
        return self.record.connection_id

    def __repr__(self) -> str:
        return f"<Session {self.pk} epoch={self.epoch} state={self.state.name}>"

    # ------------------------------------------------------------------ the way out
    def finish(self, reason: ExitReason, *, via: str = "") -> None:
        """Ask the session to end (idempotent; see
        :func:`~wsfleet_worker.session_rules.supersedes`).

        Fencing takes effect synchronously: the socket is aborted and the session's queued
        frames will be dropped by the flusher before this returns.
        """
        if not supersedes(reason, self.reason):
            return
        self.reason = reason
        self.via = via
        if reason is ExitReason.FENCED:
            self.fenced = True
            self._progress.set()
            ws = self._ws
            if ws is not None:
                ws.transport.abort()
        self._done.set()

    def fence(self, via: str) -> None:
        """The lease is lost (or the worker lease is over): abort now, write nothing more."""
        self.finish(ExitReason.FENCED, via=via)

    def stop_command(self, epoch: int) -> bool:
        """A control-channel STOP; applies only to the epoch it names."""
        if epoch != self.epoch:
            return False
        self.finish(ExitReason.STOPPED, via="control")
        return True

    # ------------------------------------------------------------------ make-before-break
    def hold(self) -> None:
        """A giver's move began (PREPARE sent): from now on the session does not reconnect,
        since a second session of ours could cut the taker's. A socket that ends now leaves
        the session waiting for :meth:`finish` (the move breaks: :attr:`streaming` is false).
        """
        self.handing_over = True

    @property
    def ending(self) -> asyncio.Event:
        """Set once :meth:`finish` was called."""
        return self._done

    @property
    def streaming(self) -> bool:
        """Reading its upstream session now, and not ending."""
        return self.reason is None and self.state is SessionState.STREAMING

    def hand_over(self, taker: str, reason: ExitReason) -> None:
        """End for a move (REBALANCED) or a drain (SHUTDOWN) with a transfer to ``taker``
        instead of a release (see the module docstring); the break path if it fails."""
        if self.reason is None:
            self._transfer_to = taker
        self.finish(reason, via="handover")

    def abandon(self, why: str) -> None:
        """End a prepared session that will not own the connection: close, write nothing."""
        if self.prepared:
            self.abandon_reason = self.abandon_reason or why
            self.finish(ExitReason.ABANDONED, via=why)

    async def adopt(self, record: ConnectionRecord, worker_id: str) -> bool:
        """Step 7: ``record`` (read consistently) shows the transfer to us, so the prepared
        session becomes an ordinary one of the new epoch. The buffered frames above the
        transferred checkpoint are stored first (numbered ones at or below it the giver
        stored; frames without a seq before the first new numbered one may have been stored
        by the giver, so they are skipped too), then live ones. False if the session ended
        before (the connection is then one its worker owns without a session: the sweep or
        the move's hint copy deals with it)."""
        if not self.prepared or self.reason is not None:
            return False
        if not commit_confirmed(record, worker_id, record.lease_epoch):
            return False
        lease = Lease.of(record)
        self.record = record
        self._lease = lease
        self.tracker = CheckpointTracker(record.last_seq)
        self.persisted_seq = record.last_seq
        # the transferred window (none in flight: nothing to re-send), not the PREPARE's read
        self._inherit_window(record)
        self.gap_resumes, self.gap_frames = record.resume_gaps, record.gap_frames
        self._gaps_stored = (record.resume_gaps, record.gap_frames)
        self._error_noted = record.last_error
        self._log = {"connection_id": record.connection_id, "epoch": lease.epoch}
        self.prepared = False  # writes allowed from here on
        self._ctx.metrics.count("HandoffsAdopted")
        self._info("prepared session adopted", last_seq=record.last_seq,
                   buffered=len(self._buffer), first_seq=self.first_buffered_seq)
        started = False  # past the first numbered frame above the checkpoint
        try:
            # (_on_frame waits meanwhile: live frames follow the buffer, and the socket is not
            # read while the buffer is being stored, so nothing grows without bound)
            while self._buffer:
                frame, received_ms, size = self._buffer.popleft()
                self._buffer_bytes -= size
                if not started:
                    if frame.seq is None or frame.seq <= record.last_seq:
                        continue
                    started = True
                    if frame.seq > record.last_seq + 1:  # the giver broke its promise: report
                        self._first_frame(record.last_seq, frame.seq)
                if self.reason is not None:
                    break
                await self._store_frame(frame, received_ms)
        finally:
            self._buffer.clear()
            self._buffering = False
            self._replayed.set()
        return True

    def _buffer_frame(self, frame: Frame, now: int, size: int) -> None:
        """A prepared session's frame: kept in memory (bounded), written nowhere."""
        self._buffer.append((frame, now, size))
        self._buffer_bytes += size
        if frame.seq is not None and self.first_buffered_seq is None:
            self.first_buffered_seq = frame.seq
            self.buffered_seq.set()
        config = self._ctx.config
        verdict = taker_verdict(
            buffered_frames=len(self._buffer),
            buffered_bytes=self._buffer_bytes,
            # Not the in-flight budget (500 frames: half a second at 1,000 frames/s, less
            # than an overlap lasts); memory stays bounded by the same bytes.
            max_frames=config.handoff_buffer_frames,
            max_bytes=config.session_queue_bytes,
            deadline_ms=now + 1,  # the bound in time is the hand-over's (handover.py)
            now_ms=now,
        )
        if verdict.step is HandoffStep.DECLINE and self.prepared:
            self._ctx.metrics.count("HandoffBufferFull")
            self.abandon(verdict.reason)

    async def run(self) -> SessionResult:
        """Stream until :meth:`finish` is called, then end as the exit plan says."""
        ctx = self._ctx
        self._info("session started", last_seq=self.tracker.durable)
        try:
            try:
                async with asyncio.TaskGroup() as group:
                    streaming = group.create_task(self._stream())
                    await self._done.wait()
                    streaming.cancel()
            except* Exception as errors:  # a bug in the streaming code: hand the stream over
                ctx.logger.error(
                    "session crashed",
                    extra={**self._log, "error": describe_error(errors.exceptions[0])},
                    exc_info=errors.exceptions[0],
                )
                self.finish(ExitReason.CRASHED, via="exception")
            assert self.reason is not None
            self.state = SessionState.CLOSING
            return await self._end()
        finally:
            self.state = SessionState.CLOSED

    async def _close_socket(self) -> None:
        ws, self._ws = self._ws, None
        if ws is None:
            return
        plan = exit_plan(self.reason or ExitReason.CRASHED)
        if plan.abort or self.fenced:
            ws.transport.abort()
            return
        try:
            async with asyncio.timeout(self._ctx.config.settings.heartbeat_seconds):
                await ws.close(plan.close_code or 1000)
        except (TimeoutError, OSError):
            ws.transport.abort()

    async def _end(self) -> SessionResult:
        """Close the socket and flush (concurrently), then the one final lease write.

        The socket is closed before the lease is released, so the peer that takes the lease
        next never streams at the same time as this session.
        """
        reason = self.reason or ExitReason.CRASHED
        plan = exit_plan(reason)
        if self.prepared:  # it never owned the connection: close, write nothing
            await self._close_socket()
            self._info("prepared session closed", reason=reason.value, via=self.via,
                       why=self.abandon_reason)
            return SessionResult(self.pk, self.epoch, reason, self.via, False, 0, False)
        if (
            self._transfer_to
            and reason in (ExitReason.REBALANCED, ExitReason.SHUTDOWN)
            and not self.fenced
        ):
            transferred = await self._transfer(self._transfer_to, reason)
            if transferred is not None:
                self.transferred.set()
                await self._close_socket()  # (1001) only once the taker owns it
                return SessionResult(self.pk, self.epoch, reason, self.via, False, transferred,
                                     False, transferred_to=self._transfer_to)
            self._ending = False  # the break path below ends it as today
        if plan.flush and not self.fenced:
            await asyncio.gather(self._close_socket(), self._settle_writes())
        else:
            await self._close_socket()
        released = False
        last_seq = self.tracker.durable
        self._ending = True  # no frame may be written from here on (see may_write)
        # A crash is counted now, after the flush: the position is where the next owner resumes.
        if (
            reason is ExitReason.CRASHED
            and not self.fenced
            and self._count_failure(last_error_text(ErrorCategory.CRASHED), crashed=True)
        ):
            reason = self.reason = ExitReason.FAILED
            plan = exit_plan(reason)
        if plan.final_write is not FinalWrite.NONE and not self.fenced and await self._quiesce():
            if self.gaps_pending and not await self._store_gaps() and not self.fenced:
                self._ctx.logger.warning(
                    "resume-gap totals not stored before the release; they are lost",
                    extra={**self._log, "resume_gaps": self.gap_resumes,
                           "gap_frames": self.gap_frames},
                )
            released = await self._final_write(
                plan.final_write,
                plan.stop_reason,
                last_seq,
                stopped=reason is ExitReason.STOPPED,
                moved=reason is ExitReason.REBALANCED,
            )
        if self.fenced:
            reason = self.reason = ExitReason.FENCED
            self._ctx.metrics.count("LeaseLost")
        if reason is ExitReason.FAILED and released:
            self._ctx.metrics.count("ConnectionsFailed")
            self._ctx.logger.error(
                "connection FAILED: crash-loop breaker tripped",
                extra={**self._log, "error": self._failure, "failures": self.record.failure_count},
            )
        self._info(
            "session finished",
            reason=reason.value,
            via=self.via,
            last_seq=last_seq,
            released=released,
        )
        return SessionResult(
            self.pk, self.epoch, reason, self.via, released, last_seq, plan.hint and released
        )

    async def _transfer(self, taker: str, reason: ExitReason) -> int | None:
        """Steps 4-5 after the giver decided: nothing read from here on is stored (the
        streaming task is cancelled), no batch of ours is in flight, then the one conditional
        write to ``(taker, epoch + 1)`` with the checkpoint. Returns that checkpoint, or None
        if it did not land (break instead).

        Frames received but not yet written are dropped, not flushed first: the taker holds
        every frame above the checkpoint already (the verdict saw ``first_seq <= durable +
        1``) and stores them, so flushing them here would only put the giver's write backlog
        on the hand-off's path. (An at-least-once sink with a send window still flushes: its
        ``sent_limit`` is what keeps the taker from sending a frame twice.)"""
        ctx = self._ctx
        if self.window is not None:
            await self._settle_writes()
        self._ending = True  # no frame of ours may be written from here on
        if not await self._quiesce():
            return None
        if self.gaps_pending and not await self._store_gaps():
            return None  # (the break path's release tries once more, and logs)
        last_seq = self.tracker.durable
        began = ctx.clock()
        try:
            await ctx.offloader.io(
                ctx.leases.transfer, self.lease, taker, last_seq=last_seq,
                moved=reason is ExitReason.REBALANCED, **self._final_window(),
            )
        except ConnectionStopped:
            self._info("stopped before the transfer; ending as a STOP")
            return None
        except LeaseLost:
            self.fenced = True
            return None
        except WsfleetError as exc:
            # The write may have landed (a lost answer): the record says.
            try:
                current = await ctx.offloader.io(ctx.leases.get, self.pk)
            except WsfleetError:
                current = None
            if not commit_confirmed(current, taker, self.epoch + 1):
                ctx.logger.warning(
                    "transfer failed; breaking instead",
                    extra={**self._log, "error": describe_error(exc)},
                )
                return None
        self.persisted_seq = max(self.persisted_seq, last_seq)
        ctx.metrics.count("HandoffsTransferred")
        self._info("session transferred", reason=reason.value, to=taker, last_seq=last_seq,
                   write_ms=ctx.clock() - began)
        return last_seq

    async def _quiesce(self) -> bool:
        """Wait until no batch holding this session's frames is being written.

        BatchWriteItem is unconditional: a batch landing after the release could land after
        the next owner's acquire. A request that is still out is waited for (it ends within
        botocore's timeouts), never left behind: with no expiry on connection items, leaving
        the lease unreleased would keep a connection this worker does not stream. False if
        the lease was lost (or the worker fenced) meanwhile: nothing may be written then.
        """
        flusher = self._ctx.flusher
        waited = 0.0
        warned = False
        while self._lease_writable():
            try:
                async with asyncio.timeout(_QUIESCE_POLL_SECONDS):
                    await flusher.quiesce(self)
            except TimeoutError:
                waited += _QUIESCE_POLL_SECONDS
                if waited >= _IN_FLIGHT_WAIT_SECONDS and not warned:
                    warned = True
                    self._ctx.logger.warning(
                        "a message write is still out; releasing once it has settled",
                        extra=self._log,
                    )
                continue
            return self._lease_writable()
        return False

    async def _final_write(
        self,
        kind: FinalWrite,
        stop_reason: str | None,
        last_seq: int,
        *,
        stopped: bool,
        moved: bool = False,
    ) -> bool:
        """The final lease write, retried until it lands (see the module docstring)."""
        ctx = self._ctx
        delays = None
        while True:
            if not self._lease_writable():
                self._info("worker lease over before the final write; nothing written")
                return False
            try:
                await self._final_write_once(
                    kind, stop_reason, last_seq, stopped=stopped, moved=moved
                )
            except LeaseLost:
                self.fenced = True
                self._info("lease already lost at the final write")
                return False
            except WsfleetError as exc:
                delays = delays or backoff(**_FINAL_WRITE_BACKOFF, rng=ctx.rng)
                delay = next(delays)
                ctx.metrics.count("FinalWriteRetries")
                ctx.logger.warning(
                    "final lease write failed; retrying",
                    extra={
                        **self._log, "error": describe_error(exc), "retry_in_s": round(delay, 3)
                    },
                )
                await self._sleep_unless_fenced(delay)
                continue
            self.persisted_seq = max(self.persisted_seq, last_seq)
            return True

    async def _final_write_once(
        self,
        kind: FinalWrite,
        stop_reason: str | None,
        last_seq: int,
        *,
        stopped: bool,
        moved: bool = False,
    ) -> None:
        ctx = self._ctx
        window = self._final_window()
        if kind is FinalWrite.MARK_FAILED:
            self._verdict = None
            record = self.record
            await ctx.offloader.io(
                ctx.leases.mark_failed,
                self.lease,
                self._failure,
                count=record.failure_count,
                at_seq=record.failure_seq if record.failure_seq is not None else last_seq,
                since_ms=record.failure_since_ms,
                last_seq=last_seq,
                **window,
            )
        elif kind is FinalWrite.MARK_STOPPED:
            await ctx.offloader.io(
                ctx.leases.mark_stopped,
                self.lease,
                stop_reason or "stopped",
                last_seq=last_seq,
                **window,
            )
        else:
            verdict = self._verdict
            if verdict is not None:  # a crash below the threshold: count it, then release
                await self._store_failure(verdict)
                self._verdict = None
            extra: dict[str, Any] = {"moved": True} if moved else {}  # stamps rebalanced_at_ms
            await ctx.offloader.io(
                ctx.leases.release,
                self.lease,
                last_seq=last_seq,
                stopped=stopped,
                **extra,
                **window,
            )

    def _final_window(self) -> dict[str, Any]:
        """The final write's ``window`` argument (at-least-once sinks; see
        :meth:`SendWindow.final_limit`): nothing in flight, so the next owner re-sends
        nothing; else the stored limit still bounds it."""
        window = self.window
        if window is None:
            return {}
        limit = window.final_limit(self.tracker.durable, self.tracker.outstanding)
        return {"window": window.fields(limit)}

    async def _sleep_unless_fenced(self, seconds: float) -> None:
        try:
            async with asyncio.timeout(seconds):
                while not self.fenced:
                    self._progress.clear()
                    await self._progress.wait()
        except TimeoutError:
            pass

    async def _settle_writes(self) -> None:
        """Wait (briefly) until every accepted frame is acknowledged.

        Flushing only saves the next owner from fetching those frames again: they are above
        the checkpoint, so a resume replays them. So the wait is bounded by a short grace
        (a few flush intervals) and by the worker's self-fence deadline, not by the lease: a
        hand-off must stay fast even when the write queue is backed up. What is still
        unwritten then is dropped (see may_write).
        """
        if self._in_flight() == 0:
            return
        self._ctx.flusher.flush_now()
        fence_in = (self._ctx.liveness.fence_at_ms - self._ctx.clock()) / 1000
        grace = _SETTLE_GRACE_SECONDS + 3 * self._ctx.config.settings.message_flush_ms / 1000
        try:
            async with asyncio.timeout(max(0.0, min(grace, fence_in))):
                while self._in_flight() and not self.fenced:
                    self._progress.clear()
                    await self._progress.wait()
        except TimeoutError:
            self._ctx.logger.warning(
                "frames still unwritten at the end of the session; the next owner replays them",
                extra={**self._log, "unwritten": self._in_flight()},
            )

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_due(self, now: int) -> bool:
        """Is a checkpoint write due (advanced, and CHECKPOINT_SECONDS since the last)?"""
        if self.reason is not None or self._checkpointing or self.prepared:
            return False
        window = self.window
        if window is not None and (
            self._replay_unstored
            or (
                self.tracker.durable > self.persisted_seq
                and window.running_low(self.tracker.highest_received)
            )
        ):
            return True
        return checkpoint_due(
            durable=self.tracker.durable,
            persisted=self.persisted_seq,
            last_written_ms=self.checkpointed_at_ms,
            now_ms=now,
            interval_ms=self._ctx.config.settings.checkpoint_ms,
        )

    async def checkpoint(self) -> None:
        """Write the durable checkpoint (the worker's checkpoint loop calls this when due).

        The write is fenced by owner and epoch and allowed only while STARTED, so it also
        tells the session of a STOP it missed (ConnectionStopped) or of a lost lease.
        """
        ctx = self._ctx
        started = ctx.clock()
        last_seq = self.tracker.durable
        if self.reason is not None or self._checkpointing or not self.may_write(started):
            return
        self._checkpointing = True
        try:
            # No checkpoint may pass a gap that is not stored (see the module docstring).
            if self.gaps_pending and not await self._store_gaps():
                return
            window = self.window
            limit = 0
            if window is None:
                await ctx.offloader.io(ctx.leases.checkpoint, self.lease, last_seq)
            else:
                limit = window.next_limit(last_seq, self.tracker.outstanding, self._send_wait)
                await ctx.offloader.io(
                    ctx.leases.checkpoint, self.lease, last_seq, window=window.fields(limit)
                )
        except ConnectionStopped:
            if not self._ending:
                self.finish(ExitReason.STOPPED, via="checkpoint")
        except LeaseLost:
            if not self._ending:  # (our own release may have landed first)
                self.fence("checkpoint")
        except WsfleetError as exc:
            ctx.metrics.count("CheckpointFailures")
            ctx.logger.warning(
                "checkpoint write failed; retrying later",
                extra={**self._log, "error": describe_error(exc), "last_seq": last_seq},
            )
            interval = ctx.config.settings.checkpoint_ms
            self.checkpointed_at_ms = started - interval + min(interval, _CHECKPOINT_RETRY_MS)
        else:
            self.checkpointed_at_ms = started
            ctx.metrics.count("CheckpointWrites")
            self._note_checkpoint(last_seq, started)
            if window is not None:
                window.stored(limit)
                self._replay_unstored = False
        finally:
            self._checkpointing = False
            self._checkpoint_ended.set()

    async def _await_send_limit(self, seq: int) -> bool:
        """Hold the frame ``seq`` until the send limit covers it (:class:`SendWindow`): the
        checkpoint that raises the limit is written now, or the one under way awaited. The
        socket is not read meanwhile (backpressure). False if the session ends first: the
        frame is not sent (it is above the checkpoint, so the next owner gets it replayed)."""
        window = self.window
        assert window is not None
        self._send_wait = seq
        try:
            while not window.allows(seq):
                if self._done.is_set() or self.fenced:
                    return False
                if self._checkpointing:
                    self._checkpoint_ended.clear()
                    await self._checkpoint_ended.wait()
                    continue
                self._progress.clear()
                tracker = self.tracker
                if window.next_limit(tracker.durable, tracker.outstanding, seq) < seq:
                    await self._progress.wait()  # the frames in flight must be written first
                    continue
                await self.checkpoint()
                if not window.allows(seq):  # failed, or the lease was not surely ours
                    await self._sleep_unless_fenced(_SEND_LIMIT_RETRY_SECONDS)
            return True
        finally:
            self._send_wait = 0

    def _note_checkpoint(self, last_seq: int, at_ms: int) -> None:
        """CheckpointLagMs: receipt of the oldest newly covered frame -> checkpoint stored."""
        if last_seq > self.persisted_seq and self._uncovered_since_ms is not None:
            self._ctx.metrics.observe("CheckpointLagMs", max(0, at_ms - self._uncovered_since_ms))
            fully_covered = last_seq >= self.tracker.highest_received
            self._uncovered_since_ms = None if fully_covered else at_ms
        self.persisted_seq = max(self.persisted_seq, last_seq)

    # ------------------------------------------------------------------ frames (FrameOwner)
    def may_write(self, now: int) -> bool:
        """Frames may be written only while the worker lease is surely ours (see
        :meth:`wsfleet.lease.WorkerLeaseTimer.may_write`), and not once the final lease write
        has begun (a peer may acquire right after it)."""
        return (
            not (self.fenced or self._ending or self.prepared)
            and self._ctx.liveness.may_write(now)
        )

    def _lease_writable(self) -> bool:
        """Connection-item writes (final write, error notes): the lease is surely ours."""
        return (
            not (self.fenced or self.prepared) and self._ctx.liveness.may_write(self._ctx.clock())
        )

    def on_written(self, message: Message) -> None:
        self._bytes_in_flight -= self._frame_bytes.pop(message.key, 0)
        if not self._stored_any:  # once per session: how long a take-over took to store
            self._stored_any = True
            self._info(
                "first frame stored",
                seq=message.seq,
                since_start_ms=self._ctx.clock() - self.started_at_ms,
            )
        if message.seq is None:
            self._local_unacked -= 1
        else:
            self.tracker.written(message.seq)
            if self.window is not None:
                self.window.written(message.seq)
        self._progress.set()

    def on_rejected(self, message: Message) -> None:
        """DynamoDB refused even the frame's marker (the flusher stores one for a frame it
        refuses): nothing records the frame, so the checkpoint must not pass it. The session
        ends (CRASHED) at the checkpoint below it; the next owner replays from there."""
        self._bytes_in_flight -= self._frame_bytes.pop(message.key, 0)
        self._ctx.metrics.count("FramesUnrecorded")
        self._ctx.logger.error(
            "frame and its marker rejected by the messages table; ending the session below it",
            extra={**self._log, "sk": message.sk},
        )
        self.finish(ExitReason.CRASHED, via="rejected")

    def _in_flight(self) -> int:
        return self.tracker.outstanding + self._local_unacked

    def _over_budget(self) -> bool:
        """Too much in flight: in frames, or in bytes (memory is what the budget protects)."""
        config = self._ctx.config
        return (
            self._in_flight() >= config.session_queue_frames
            or self._bytes_in_flight >= config.session_queue_bytes
        )

    # ------------------------------------------------------------------ streaming
    async def _stream(self) -> None:
        ctx = self._ctx
        settings = ctx.config.settings
        policy = ReconnectPolicy(rng=ctx.rng)
        if self._live_only and self._stored_high is None and not self.prepared:
            await self._read_stored_high()
        while not self._done.is_set():
            if self.connects and (self.prepared or self.handing_over):
                # a prepared session does not reconnect (it ends: the move breaks), nor does
                # a giver whose move is under way (a new session could cut the taker's)
                self.abandon("upstream_ended")
                await self._done.wait()
                return
            self.state = SessionState.CONNECTING
            try:
                handshake = await self._handshake(settings.resume_param)
            except CredentialUnavailable as exc:
                if await self._credential_failed(exc, policy):
                    return
                continue
            try:
                ws = await ctx.connect(
                    handshake.url,
                    headers=handshake.headers,
                    subprotocols=handshake.subprotocols,
                    origin_locked=handshake.origin_locked,
                    on_socket=self._socket_opened,
                )
            except asyncio.CancelledError:
                raise
            except UpstreamRefused as exc:
                await self._refused(exc)
                return
            except Exception as exc:
                if self.prepared:
                    self.abandon("connect_failed")
                    return
                if is_permanent(exc):
                    self.finish(ExitReason.INVALID_URL, via="connect")
                    return
                category = ErrorCategory.CONNECT_FAILED
                if isinstance(exc, InvalidStatus):
                    category = ErrorCategory.HANDSHAKE_REJECTED
                    await self._credential_refused(exc.response.status_code, policy)
                await self._upstream_trouble(
                    last_error_text(category), policy, detail=describe_error(exc)
                )
                continue
            self._ws = ws
            if self._done.is_set():  # finished while the handshake was in flight
                return
            self.connects += 1
            self.state = SessionState.STREAMING
            opened_at = asyncio.get_running_loop().time()
            frames = 0
            # Every seq frame up to here is written or in flight (this session writes those).
            self._gap_baseline = (
                None if self.prepared  # (adopt measures the gap from the transfer)
                else max(self.tracker.highest_received, self._stored_high or 0)
            )
            try:
                if handshake.subscribe is not None:
                    await ws.send(handshake.subscribe)
                async for raw in ws:
                    frames += 1
                    await self._on_frame(raw)
            except ConnectionClosedError:
                pass
            except ConnectionClosed:  # defensive: websockets ends the loop on a clean close
                pass
            # Only a connection that stayed open resets the backoff, never frames received
            # (an upstream that sends one frame and then poison or a close on every connect).
            policy.connection_ended(asyncio.get_running_loop().time() - opened_at)
            if self.prepared or self.handing_over:
                self._ws = None
                self.state = SessionState.BACKING_OFF  # (not streaming: the move breaks)
                continue  # (the loop's top ends it: no reconnect, nothing noted)
            close_frame = ws.protocol.close_rcvd  # None: the link died without a close frame
            received = close_frame.code if close_frame is not None else None
            sent = ws.protocol.close_sent
            # We started the closing handshake (the upstream's close, if any, only echoed ours).
            by_worker = sent is not None and not ws.protocol.close_rcvd_then_sent
            self._ws = None
            if by_worker and sent is not None:
                error = last_error_text(ErrorCategory.CLOSED_BY_WORKER, sent.code, sent.reason)
                if sent.code == MESSAGE_TIMEOUT_CODE:
                    ctx.metrics.count("MessageTimeouts")
                counted = is_poison(False, sent.code, worker_initiated=True)
            else:
                final = self.record.upstream.final_normal_close
                if close_action(received, final_normal_close=final) is CloseAction.END:
                    self.finish(ExitReason.UPSTREAM_CLOSED, via="upstream")
                    return
                if received is None:
                    error = last_error_text(ErrorCategory.CONNECTION_LOST)
                else:
                    error = last_error_text(ErrorCategory.UPSTREAM_CLOSED, received)
                counted = is_empty_close(received, frames)
            if counted and await self._counted_failure(error):
                return
            # (a counted failure's write also stored the last_error: no record_error needed)
            await self._upstream_trouble(error, policy, noted=counted)

    async def _handshake(self, default_resume_param: str) -> Handshake:
        """This connect's request; resolves the credential (CredentialUnavailable if not)."""
        record = self.record
        credential = record.upstream.credential
        secret = None
        if credential is not None:
            if self._ctx.secrets is None:
                raise CredentialUnavailable(credential.ref, "this worker resolves no credentials")
            secret = await self._ctx.secrets.resolve(credential)
        return plan_handshake(
            record.ws_url,
            record.upstream,
            from_seq=self.tracker.resume_from(),
            resume_enabled=record.resume,
            default_resume_param=default_resume_param,
            secret=secret,
        )

    async def _credential_failed(self, exc: CredentialUnavailable, policy: ReconnectPolicy) -> bool:
        """An unreadable secret: a failed connect that counts toward the crash-loop breaker
        (a secret that stays missing must not spin forever). True if the session is over."""
        ctx = self._ctx
        ctx.metrics.count("CredentialFailures")
        ctx.logger.warning(
            "upstream credential unavailable", extra={**self._log, "error": describe_error(exc)}
        )
        error = last_error_text(ErrorCategory.CREDENTIAL_UNAVAILABLE)
        if await self._counted_failure(error):
            return True
        await self._upstream_trouble(error, policy, detail=describe_error(exc), noted=True)
        return False

    async def _credential_refused(self, status: int, policy: ReconnectPolicy) -> None:
        """A handshake that carried a credential was refused with 401/403: the secret may have
        been rotated, so read it again now rather than when the cached value ages out (the
        resolver allows one such read per reference per interval). A fresh read retries soon."""
        credential = self.record.upstream.credential
        secrets = self._ctx.secrets
        if credential is None or secrets is None or not is_credential_refusal(status):
            return
        try:
            refreshed = await secrets.refresh(credential)
        except CredentialUnavailable as exc:  # the next connect's resolve counts it
            self._ctx.logger.warning(
                "could not read the refused credential again",
                extra={**self._log, "error": describe_error(exc)},
            )
            return
        if refreshed:
            self._ctx.metrics.count("CredentialRefreshes")
            self._info("handshake refused with the credential; read it again", status=status)
            policy.reset()

    async def _counted_failure(self, error: str) -> bool:
        """A failure the crash-loop breaker counts (not a crash: :meth:`_end` counts those).
        Trips: the session ends FAILED (its final write stores the count). Else the count
        and ``last_error`` are stored now, in one write. True if the session is over."""
        if self._count_failure(error, crashed=False):
            self.finish(ExitReason.FAILED, via="breaker")
            return True
        await self._write_verdict()
        return self._done.is_set()  # the count found the lease lost

    async def _read_stored_high(self) -> None:
        """The highest seq already stored (live-only upstreams; see the module docstring).
        A failed read falls back to the checkpoint: a gap may then count stored frames."""
        ctx = self._ctx
        if ctx.highest_seq is None:
            return
        try:
            self._stored_high = await ctx.offloader.io(ctx.highest_seq, self.pk)
        except WsfleetError as exc:
            ctx.logger.warning(
                "could not read the highest stored seq; the resume gap counts from the checkpoint",
                extra={**self._log, "error": describe_error(exc)},
            )
            self._stored_high = 0

    # ------------------------------------------------------------------ resume gap
    def _first_frame(self, baseline: int, seq: int) -> None:
        """The first seq frame since the last connect: count the gap (if any), write totals."""
        self._gap_baseline = None
        gap = resume_gap(baseline, seq)
        if gap <= 0:
            return
        self.gap_resumes += 1
        self.gap_frames += gap
        metrics = self._ctx.metrics
        metrics.count("ResumeGaps")
        metrics.count("ResumeGapFrames", gap)
        self._ctx.logger.warning(
            "upstream resumed past the highest seq received or stored: frames lost",
            extra={**self._log, "gap_frames": gap, "highest_seq": baseline, "first_seq": seq,
                   "resume_gaps": self.gap_resumes, "gap_frames_total": self.gap_frames},
        )
        task = asyncio.get_running_loop().create_task(self._store_gaps())
        self._gap_tasks.add(task)
        task.add_done_callback(self._gap_tasks.discard)

    @property
    def gaps_pending(self) -> bool:
        """Gap totals counted but not stored yet."""
        return self._gaps_stored != (self.gap_resumes, self.gap_frames)

    async def _store_gaps(self) -> bool:
        """Write the gap totals until the stored ones are the newest; True when they are.

        One write at a time (the lock): totals written out of order would go backwards. A
        failure is retried a few times, then left pending for the next checkpoint or the
        final write (both call this first), and logged.
        """
        ctx = self._ctx
        async with self._gap_lock:
            delays = None
            attempts = 0
            while self.gaps_pending:
                if self.fenced or not self._lease_writable():
                    return False
                totals = (self.gap_resumes, self.gap_frames)
                try:
                    await ctx.offloader.io(
                        ctx.leases.note_gap, self.lease, resumes=totals[0], frames=totals[1]
                    )
                except LeaseLost:
                    if not self._ending:
                        self.fence("note_gap")
                    return False
                except WsfleetError as exc:
                    attempts += 1
                    ctx.metrics.count("GapWriteFailures")
                    ctx.logger.warning(
                        "could not store the resume-gap totals; retrying",
                        extra={**self._log, "error": describe_error(exc), "attempt": attempts,
                               "resume_gaps": totals[0], "gap_frames": totals[1]},
                    )
                    if attempts >= _GAP_WRITE_ATTEMPTS:
                        return False
                    delays = delays or backoff(**_GAP_WRITE_BACKOFF, rng=ctx.rng)
                    await asyncio.sleep(next(delays))
                    continue
                self._gaps_stored = totals
            return True

    async def _refused(self, exc: UpstreamRefused) -> None:
        """SSRF guard (issue #11): note why on the record, then stop the connection for good.

        Terminal rather than a backoff: where a redirect or a DNS answer points does not heal
        by waiting, and retrying would probe the refused target on a schedule. The operator
        sees ``STOPPED`` with ``stop_reason=upstream_refused`` and the rule in ``last_error``.
        """
        ctx = self._ctx
        # The rule and host, never socket detail: nothing was connected, so this says nothing
        # about what the refused target would have answered.
        rule = describe_error(exc).partition(": ")[2]
        message = f"{last_error_text(ErrorCategory.REFUSED_BY_POLICY)}: {rule}"
        ctx.metrics.count("UpstreamRefused")
        ctx.logger.warning("upstream refused; stopping", extra={**self._log, "error": message})
        try:
            await self._record_error(message)
        except LeaseLost:
            self.finish(ExitReason.FENCED, via="record_error")
            return
        except (StoreError, WsfleetError):
            pass  # best effort: stopping matters more than the note
        self.finish(ExitReason.REFUSED, via="connect")

    def _count_failure(self, error: str, *, crashed: bool) -> bool:
        """Count a poison failure at the highest position received; True if the breaker trips.

        The record kept by the session carries the count (read at acquire, so it includes the
        previous owners' failures) and is updated in memory; the store write follows
        (:meth:`_write_verdict` or the final write), fenced by our lease.
        """
        config = self._ctx.config
        position = max(self.tracker.highest_received, self.tracker.durable)
        verdict = breaker_verdict(
            self.record,
            position,
            config.breaker_max_failures,
            now_ms=self._ctx.clock(),
            window_ms=int(config.breaker_window_seconds * 1000),
        )
        self.record = self.record.with_changes(
            failure_count=verdict.count,
            failure_seq=verdict.at_seq,
            failure_since_ms=verdict.since_ms,
        )
        self._failure = error
        self._verdict = verdict
        self._ctx.metrics.count("BreakerFailures")
        self._ctx.logger.warning(
            "crash-loop breaker counted a failure",
            extra={**self._log, "error": error, "crashed": crashed, "failures": verdict.count,
                   "at_seq": verdict.at_seq, "trip": verdict.trip},
        )
        return verdict.trip

    async def _record_error(self, message: str) -> None:
        """``last_error`` on the record (fenced by our lease; skipped once it is not surely
        ours: a worker past its self-fence deadline writes nothing)."""
        if self._lease_writable():
            await self._ctx.offloader.io(self._ctx.leases.record_error, self.lease, message)
            self._error_noted = message

    async def _store_failure(self, verdict: BreakerVerdict) -> None:
        """The counted failure and its position on the record (fenced by our lease)."""
        ctx = self._ctx
        if not self._lease_writable():
            raise LeaseLost("the worker lease is over", None)
        await ctx.offloader.io(
            ctx.leases.note_failure,
            self.lease,
            self._failure,
            count=verdict.count,
            at_seq=verdict.at_seq,
            since_ms=verdict.since_ms,
        )
        self._error_noted = self._failure

    async def _write_verdict(self) -> None:
        """Store a counted in-session failure now (the final write stores a tripping one)."""
        verdict = self._verdict
        if verdict is None or verdict.trip:
            return
        self._verdict = None
        try:
            await self._store_failure(verdict)
        except LeaseLost:
            self.finish(ExitReason.FENCED, via="note_failure")
        except (StoreError, WsfleetError):
            pass  # best effort: a lost count only delays the breaker by one failure

    async def _upstream_trouble(
        self, message: str, policy: ReconnectPolicy, *, detail: str = "", noted: bool = False
    ) -> None:
        """Note the error on the record (fenced write), back off, and let the loop reconnect.

        ``message`` is the coarse category the API shows; ``detail`` goes to the log only.
        ``noted``: the breaker's write already stored ``message`` as ``last_error``.
        """
        ctx = self._ctx
        self.state = SessionState.BACKING_OFF
        ctx.metrics.count("Reconnects")
        delay = policy.next_delay()
        ctx.logger.warning(
            "upstream trouble; reconnecting",
            extra={**self._log, "error": message, "detail": detail, "retry_in_s": round(delay, 3)},
        )
        try:
            if not noted and message != self._error_noted:
                await self._record_error(message)
        except LeaseLost:
            self.finish(ExitReason.FENCED, via="record_error")
            return
        except (StoreError, WsfleetError):
            pass  # best effort: the reconnect matters more than the note
        await asyncio.sleep(delay)

    async def _on_frame(self, raw: str | bytes) -> None:
        if self.fenced:
            return
        ctx = self._ctx
        now = ctx.clock()
        ctx.metrics.count("MessagesReceived")
        frame = parse_frame(
            raw,
            ctx.config.settings.seq_field,
            highest_seq=self.tracker.highest_received,
            max_seq_jump=ctx.config.max_seq_jump,
            seq_pointer=self._seq_pointer,
        )
        if self._buffering:
            if self.prepared:
                size = len(frame.data) + 64  # about what it costs held in memory
                self._buffer_frame(frame, now, size)
                return
            await self._replayed.wait()  # adopt() is storing the buffer: this one follows it
        await self._store_frame(frame, now)

    async def _store_frame(self, frame: Frame, now: int) -> None:
        """Hand one frame to the flusher (numbered: once; the checkpoint tracks it)."""
        ctx = self._ctx
        if frame.kind is FrameKind.SEQUENCED:
            assert frame.seq is not None
            if self._gap_baseline is not None:
                self._first_frame(self._gap_baseline, frame.seq)
            # (a seq above the limit was never accepted: the limit only grows)
            window = self.window
            if (
                window is not None
                and not window.allows(frame.seq)
                and not await self._await_send_limit(frame.seq)
            ):
                return
            if not self.tracker.accept(frame.seq):
                ctx.metrics.count("DuplicateFrames")
                return
            sk = seq_sk(frame.seq)
        else:
            self._count_unnumbered(frame.kind)
            self._local_count += 1
            self._local_unacked += 1
            sk = local_sk(self.epoch, now, self._local_count)
        if self._uncovered_since_ms is None:
            self._uncovered_since_ms = now
        message = Message(self.pk, sk, frame.data, now, ctx.worker_id, self.epoch, frame.seq)
        size = await ctx.flusher.put(QueuedFrame(message, self))
        self._frame_bytes[message.key] = size
        self._bytes_in_flight += size
        # Backpressure: not reading the socket makes TCP push back on the upstream.
        while self._over_budget() and not self.fenced:
            self._progress.clear()
            await self._progress.wait()

    def _count_unnumbered(self, kind: FrameKind) -> None:
        metric = "InvalidFrames" if kind is FrameKind.INVALID else "NoSeqFrames"
        self._ctx.metrics.count(metric)
        if not self._warned_invalid:  # once per session: a garbage feed must not flood logs
            self._warned_invalid = True
            self._ctx.logger.warning(
                "frame without a usable sequence number; stored under a local key",
                extra={**self._log, "kind": kind.value},
            )

    def _socket_opened(self, local: str, peer: str) -> None:
        """One line per upstream socket, before its handshake is sent: ``local`` is the
        client address the upstream's access log shows, so an operator (or the chaos
        checker) can tell which worker, connection and epoch each upstream session was, and
        whether it was a taker's prepared one."""
        self._info("upstream socket opened", local=local, peer=peer, prepared=self.prepared)

    def _info(self, message: str, **fields: Any) -> None:
        self._ctx.logger.info(message, extra={**self._log, **fields})
