"""Make-before-break hand-offs (issue #26; docs/handoff.md sections 2-7): both sides of a move.

**Giver** (:meth:`Handover.give`, for a rebalancing move or a SIGTERM drain with a named
taker). The move is an overlap only where :func:`wsfleet.lease.handoff_mode` says so (the
connection does not ask for ``break``, its frames carry a seq), overlaps are on
(``HANDOFF_PREPARE_SECONDS`` > 0) and the taker has a control queue; else the session ends as
today (break-before-make, :meth:`~wsfleet_worker.session.Session.finish`). An overlap:

1. the session stops reconnecting (:meth:`~wsfleet_worker.session.Session.hold`) and
   ``PREPARE`` goes to the taker; the session keeps streaming and storing;
2. :func:`wsfleet.lease.giver_verdict` is asked again on every ``READY``/``DECLINE`` and every
   tick until it says TRANSFER (the taker holds every frame from ``first_seq`` on, and this
   session stored every one below) or BREAK (declined, the bound passed, the session's
   upstream ended);
3. TRANSFER: :meth:`~wsfleet_worker.session.Session.hand_over` ends the session with the one
   conditional transfer write, then its socket is closed; ``COMMIT`` goes to the taker.
   BREAK (or a transfer that did not land): the session ends by the break path (close, then
   release) and a ``HANDOFF`` goes to the taker, which closes what it prepared and acquires
   as today. Either way a copy goes to the hint queue ``HANDOFF_COPY_DELAY_SECONDS`` later,
   for anyone, in case the taker died meanwhile.

**Taker** (:meth:`Handover.on_prepare`, :meth:`Handover.on_commit`). A ``PREPARE`` is taken up
only with room (capacity, not draining, the worker lease surely ours) and once a consistent
read confirms it (:func:`wsfleet.lease.prepare_confirmed`); else ``DECLINE``. The prepared
session (:meth:`~wsfleet_worker.session.Session.prepared_for`) connects, buffers and writes
nothing; its pk sits in the lease taker's ``acquiring`` set meanwhile (it counts against
capacity, and the sweep leaves alone a connection the transfer made ours before the session
adopted it). At its first numbered frame ``READY`` goes back to the giver's queue: the queue
*name* the PREPARE gives, put beside our own queue (same endpoint and account: never a URL
from a message). ``COMMIT`` is
believed only after a consistent read (:func:`wsfleet.lease.commit_confirmed`); then the
session adopts the connection. Twice the prepare bound after the PREPARE, a session still
prepared is abandoned (closed, nothing written); a ``COMMIT`` that comes later, or a transfer
without a prepared session, is acquired like a hint (the store re-takes a connection that
already names us under a new epoch).

Every message is only a reason to look: stale, duplicated or forged ones fail the reads or
match nothing pending, and are dropped with a log line.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from wsfleet.control import (
    CommitNotice,
    DeclineReply,
    HandoffHint,
    PrepareCommand,
    ReadyReply,
    control_queue_name,
    queue_name_of,
    sibling_queue_url,
)
from wsfleet.exceptions import WsfleetError
from wsfleet.hints import Hint
from wsfleet.lease import (
    HandoffStep,
    giver_verdict,
    handoff_mode,
    is_worker_alive,
    prepare_confirmed,
)
from wsfleet.record import ConnectionRecord, WorkerRecord, connection_id_from_pk
from wsfleet.upstream_options import HandoffMode

from .connector import describe_error
from .control_channel import ControlBatcher
from .liveness import WorkerLiveness
from .outbox import HintOutbox
from .parts import WorkerParts, WorkerRole
from .session import Session, SessionResult
from .session_rules import ExitReason

__all__ = ["HANDOFF_COPY_DELAY_SECONDS", "Handover", "Peer", "drain_prepare_seconds", "plan_drain"]

#: The hint-queue copy of a hand-off waits this long: the addressed peer takes it well before,
#: and the copy only matters if that peer is gone.
HANDOFF_COPY_DELAY_SECONDS = 5
#: How often the giver re-asks its verdict while nothing arrives (its stored seq grows).
_GIVER_TICK_SECONDS = 0.05

Send = Callable[[str, list[HandoffHint | PrepareCommand | ReadyReply | DeclineReply |
                          CommitNotice]], Awaitable[set[str]]]


async def _first_of(one: asyncio.Event, other: asyncio.Event, seconds: float) -> bool:
    """Wait until either event is set, at most ``seconds``; True if one was."""
    waits = {asyncio.ensure_future(one.wait()), asyncio.ensure_future(other.wait())}
    try:
        done, _ = await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    return bool(done)


@dataclass(frozen=True)
class Peer:
    """A live worker a drain may hand connections to."""

    worker_id: str
    queue_url: str
    free: int


def plan_drain(pks: Sequence[str], peers: Sequence[Peer]) -> dict[str, Peer]:
    """Name a taker for each connection of a drain, within the peers' free capacity (the one
    with the most room left first, so the load spreads); what does not fit gets none (breaks).

    >>> a, b = Peer("a", "qa", 2), Peer("b", "qb", 1)
    >>> {pk: p.worker_id for pk, p in plan_drain(["1", "2", "3", "4"], [a, b]).items()}
    {'1': 'a', '2': 'b', '3': 'a'}
    """
    room = {peer.worker_id: peer.free for peer in peers}
    by_id = {peer.worker_id: peer for peer in peers}
    plan: dict[str, Peer] = {}
    for pk in pks:
        best = max(room, key=lambda w: (room[w], w), default=None) if room else None
        if best is None or room[best] <= 0:
            break
        plan[pk] = by_id[best]
        room[best] -= 1
    return plan


def drain_prepare_seconds(drain_timeout_seconds: float, prepare_seconds: float) -> float:
    """The giver's prepare bound in a drain: ``HANDOFF_PREPARE_SECONDS``, but at most half the
    drain, so a move that falls back after the whole bound still has the other half for the
    break path (its close, release and the taker's acquire). 0: no overlaps.

    >>> drain_prepare_seconds(20, 3), drain_prepare_seconds(5, 3), drain_prepare_seconds(20, 0)
    (3, 2.5, 0)
    """
    if prepare_seconds <= 0:
        return 0
    return min(prepare_seconds, drain_timeout_seconds / 2)


@dataclass
class _Pending:
    """A giver's move waiting for the taker's answer."""

    epoch: int
    taker: str
    first_seq: int | None = None
    declined: bool = False
    answered: asyncio.Event = field(default_factory=asyncio.Event)


class Handover(WorkerRole):
    """Both sides of make-before-break for one worker; see the module docstring.

    :param sessions: the worker's sessions by pk (read only here).
    :param session_tasks: their tasks.
    :param prepared: the taker's prepared sessions by pk (the worker keeps them).
    :param prepared_tasks: their tasks.
    :param start_prepared: starts a prepared session for a confirmed record (the worker
        registers it in ``prepared``) and returns it.
    :param adopt: moves an adopted session from ``prepared`` to the worker's sessions.
    :param acquiring: the lease taker's set of pks being acquired (prepared pks sit there).
    :param acquire: hands a hint to the lease taker (a COMMIT or HANDOFF without a session).
    :param send: sends up to ten control messages to a queue; returns the pks sent.
    :param own_queue_url: this worker's control queue URL ("" without one).
    :param has_room: the lease taker's answer: may this worker take one more connection now.
    """

    def __init__(
        self,
        parts: WorkerParts,
        liveness: WorkerLiveness,
        outbox: HintOutbox,
        *,
        prepare_seconds: float,
        queue_prefix: str,
        sessions: Mapping[str, Session],
        session_tasks: Mapping[str, asyncio.Task[SessionResult]],
        prepared: Mapping[str, Session],
        prepared_tasks: Mapping[str, asyncio.Task[SessionResult]],
        start_prepared: Callable[[ConnectionRecord, int], Session],
        adopt: Callable[[Session], None],
        acquiring: set[str],
        acquire: Callable[[Hint], Awaitable[object]],
        send: Send | None,
        own_queue_url: Callable[[], str],
        has_room: Callable[[], bool],
    ) -> None:
        super().__init__(parts)
        self._liveness = liveness
        self._outbox = outbox
        self.prepare_ms = int(prepare_seconds * 1000)
        self._queue_prefix = queue_prefix
        self._sessions = sessions
        self._session_tasks = session_tasks
        self._prepared = prepared
        self._prepared_tasks = prepared_tasks
        self._start_prepared = start_prepared
        self._adopt = adopt
        self._acquiring = acquiring
        self._acquire = acquire
        self._send = send
        self._batcher = ControlBatcher(send) if send is not None else None
        self._own_queue_url = own_queue_url
        self._has_room = has_room
        self._pending: dict[str, _Pending] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        #: outcomes of this worker's moves as a giver, by how they ended (tests, bench)
        self.outcomes: dict[str, int] = {}

    # ------------------------------------------------------------------ giver
    def overlap_for(self, session: Session, queue_url: str) -> bool:
        """Whether a move of ``session`` to a peer with ``queue_url`` tries an overlap."""
        mode = handoff_mode(
            session.record.upstream.handoff,
            usable_seq=session.tracker.highest_received > 0,
        )
        return (
            mode is HandoffMode.OVERLAP
            and self.prepare_ms > 0
            and bool(queue_url)
            and self._send is not None
            and bool(self._own_queue_url())
            and session.streaming
        )

    def spawn_give(
        self, session: Session, taker: str, queue_url: str, reason: ExitReason,
        *, bound_ms: int | None = None,
    ) -> None:
        """:meth:`give` as a task of its own (tracked: :meth:`close` waits for them)."""
        task = asyncio.create_task(
            self.give(session, taker, queue_url, reason, bound_ms=bound_ms),
            name=f"give:{session.pk}",
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def give(
        self, session: Session, taker: str, queue_url: str, reason: ExitReason,
        *, bound_ms: int | None = None,
    ) -> None:
        """Move ``session`` to ``taker`` (``reason``: REBALANCED or SHUTDOWN), overlapping if
        :meth:`overlap_for` says so, else (or as the fallback) breaking as today.
        ``bound_ms``: the prepare bound (default ``HANDOFF_PREPARE_SECONDS``; a drain's is
        shorter, :func:`drain_prepare_seconds`)."""
        pk = session.pk
        if session.handing_over or pk in self._pending:
            # A move of it is under way (a rebalancing move the drain found): that move ends
            # the session. A second PREPARE would open a third upstream session.
            return
        task = self._session_tasks.get(pk)  # (taken now: it leaves the map when it ends)
        if not self.overlap_for(session, queue_url):
            session.finish(reason, via="handover")
            await self._outcome("break_mode", session, task, taker, queue_url)
            return
        pending = _Pending(session.epoch, taker)
        self._pending[pk] = pending
        session.hold()
        prepared_at = self._clock()
        deadline = prepared_at + (self.prepare_ms if bound_ms is None else bound_ms)
        try:
            prepare = PrepareCommand(pk, session.epoch, self.worker_id, session.tracker.durable,
                                     queue_name_of(self._own_queue_url()))
            # logged before it goes: the taker's session opens only after this line
            self._logger.info(
                "hand-off prepared",
                extra={"connection_id": connection_id_from_pk(pk), "epoch": session.epoch,
                       "taker": taker, "durable": prepare.durable, "reason": reason.value},
            )
            sent = await self._send_one(queue_url, prepare)
            verdict = None
            if sent:
                while True:
                    verdict = giver_verdict(
                        durable=session.tracker.durable,
                        first_seq=pending.first_seq,
                        declined=pending.declined,
                        session_live=session.streaming,
                        deadline_ms=deadline,
                        now_ms=self._clock(),
                    )
                    if verdict.step is not HandoffStep.WAIT or session.reason is not None:
                        break
                    pending.answered.clear()
                    try:
                        async with asyncio.timeout(_GIVER_TICK_SECONDS):
                            await pending.answered.wait()
                    except TimeoutError:
                        pass
        finally:
            self._pending.pop(pk, None)
        if verdict is not None and verdict.step is HandoffStep.TRANSFER:
            session.hand_over(taker, reason)
            why = ""
        else:
            session.finish(reason, via="handover")
            why = verdict.reason if verdict is not None else "prepare_not_sent"
            if session.reason is not reason:
                why = f"ended_{session.reason.value if session.reason else 'unknown'}"
        self._logger.info(
            "hand-off decided",
            extra={"connection_id": connection_id_from_pk(pk), "epoch": session.epoch,
                   "taker": taker, "decision": why or "transfer",
                   "first_seq": pending.first_seq,
                   "waited_ms": self._clock() - prepared_at},
        )
        await self._outcome(why, session, task, taker, queue_url)

    async def _outcome(
        self, why: str, session: Session, task: asyncio.Task[SessionResult] | None, taker: str,
        queue_url: str,
    ) -> None:
        """Once the transfer landed: COMMIT (the giver's socket may still be closing: the
        taker need not wait for that round trip to the upstream); else once the session
        ended: HANDOFF (released). Either way the delayed copy for anyone."""
        if task is None:
            return
        transferred = asyncio.ensure_future(session.transferred.wait())
        try:
            await asyncio.wait({task, transferred}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            transferred.cancel()
        if session.transferred.is_set():
            self._count("transferred", "HandoffOverlaps")
            await self._tell(queue_url, CommitNotice(session.pk, session.epoch + 1),
                             copy_epoch=session.epoch + 1, delayed=True)
            await asyncio.wait({task})  # (the move ends with the session: its close)
            return
        await asyncio.wait({task})
        if task.cancelled() or task.exception() is not None:
            return
        result = task.result()
        if result.released and result.reason in (ExitReason.REBALANCED, ExitReason.SHUTDOWN):
            # a fallback (why: declined, no_ready, behind, giver_session_ended, ...), a
            # transfer that did not land, or break mode
            self._count(f"broke:{why or 'transfer_failed'}", "HandoffBreaks")
            # (a drain's release already hinted the hint queue at once, as today)
            await self._tell(queue_url, HandoffHint(result.pk, result.epoch),
                             copy_epoch=result.epoch,
                             delayed=result.reason is ExitReason.REBALANCED)
        else:
            self._count(f"ended:{result.reason.value}", "")

    async def _tell(
        self, queue_url: str, message: CommitNotice | HandoffHint, *, copy_epoch: int,
        delayed: bool,
    ) -> None:
        """``message`` to the taker and, with ``delayed``, its copy on the hint queue for
        anyone (at once if the taker could not be told)."""
        sent = await self._send_one(queue_url, message) if queue_url else False
        if delayed:
            delay = HANDOFF_COPY_DELAY_SECONDS if sent else 0
            self._outbox.add(Hint(message.pk, epoch=copy_epoch, delay_seconds=delay))

    def _count(self, outcome: str, metric: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if metric:
            self._metrics.count(metric)

    def on_reply(self, reply: ReadyReply | DeclineReply) -> None:
        """A taker's READY or DECLINE: applies only to the move pending for that pk, epoch
        and taker (anything else is stale or forged)."""
        pending = self._pending.get(reply.pk)
        if pending is None or pending.epoch != reply.epoch or pending.taker != reply.taker:
            self._logger.info(
                "hand-off reply matches no pending move; dropped",
                extra={"connection_id": connection_id_from_pk(reply.pk), "epoch": reply.epoch,
                       "type": type(reply).__name__},
            )
            return
        if isinstance(reply, ReadyReply):
            pending.first_seq = reply.first_seq
        else:
            pending.declined = True
            self._logger.info(
                "hand-off declined",
                extra={"connection_id": connection_id_from_pk(reply.pk), "reason": reply.reason},
            )
        pending.answered.set()

    # ------------------------------------------------------------------ drains
    async def drain_peers(self) -> list[Peer]:
        """Live peers with a control queue and free room, from their worker items (one query
        and one batch read per drain)."""
        ids = await self._offloader.io(self._leases.list_worker_ids)
        others = [w for w in ids if w != self.worker_id]
        if not others:
            return []
        workers: dict[str, WorkerRecord] = await self._offloader.io(
            self._leases.get_workers, others
        )
        now = self._clock()
        return [
            Peer(w.worker_id, w.control_queue_url, w.capacity - w.connection_count)
            for w in workers.values()
            if is_worker_alive(w, now) and w.control_queue_url and w.capacity > w.connection_count
        ]

    # ------------------------------------------------------------------ taker
    async def on_prepare(self, command: PrepareCommand) -> None:
        """Step 2: confirm, then open a prepared session; else DECLINE."""
        pk = command.pk
        reply_to = sibling_queue_url(
            self._own_queue_url(),
            command.reply_to or control_queue_name(self._queue_prefix, command.giver),
        )
        if pk in self._prepared or pk in self._sessions or pk in self._acquiring:
            return  # a duplicate PREPARE (or ours already): nothing new
        if self._stopping or not self._has_room():
            await self._decline(reply_to, command, "draining" if self._stopping else "full")
            return
        self._acquiring.add(pk)  # counts against capacity from here
        started = False
        try:
            try:
                record = await self._offloader.io(self._leases.get, pk)
            except WsfleetError as exc:
                self._logger.warning("cannot confirm PREPARE; declined",
                                     extra={"connection_id": connection_id_from_pk(pk),
                                            "error": describe_error(exc)})
                await self._decline(reply_to, command, "failed")
                return
            if not prepare_confirmed(record, pk, command.epoch, command.giver):
                self._metrics.count("UnconfirmedHandoffs")
                await self._decline(reply_to, command, "moved")
                return
            assert record is not None
            if self._stopping or self._liveness.fenced:
                await self._decline(reply_to, command, "draining")
                return
            session = self._start_prepared(record, command.durable)
            started = True
        finally:
            if not started:
                self._acquiring.discard(pk)
        task = asyncio.create_task(self._prepare(session, command, reply_to),
                                   name=f"prepare:{pk}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _prepare(self, session: Session, command: PrepareCommand, reply_to: str) -> None:
        """Step 3 and the taker's bound: READY at the first numbered frame; abandoned if still
        prepared twice the prepare bound after the PREPARE."""
        bound = self.prepare_ms / 1000
        if not await _first_of(session.buffered_seq, session.ending, bound):
            session.abandon("no_frame")
        if session.reason is not None or session.first_buffered_seq is None:
            await self._decline(reply_to, command, session.abandon_reason or "failed")
            return
        ready = ReadyReply(command.pk, command.epoch, self.worker_id, session.first_buffered_seq)
        await self._send_one(reply_to, ready)
        await _first_of(session.ending, session.ending, bound)  # (the rest of the 2x bound)
        if session.prepared and session.reason is None:
            session.abandon("no_commit")
        if session.prepared and session.abandon_reason in ("budget", "upstream_ended"):
            await self._decline(reply_to, command, "budget"
                                if session.abandon_reason == "budget" else "failed")

    async def on_commit(self, commit: CommitNotice) -> None:
        """Step 7: adopt once a consistent read confirms the transfer; a COMMIT for which no
        session is prepared any more is acquired like a hint."""
        session = self._prepared.get(commit.pk)
        if session is None or not session.prepared or session.reason is not None:
            await self._acquire(Hint(commit.pk, epoch=commit.epoch))
            return
        try:
            record = await self._offloader.io(self._leases.get, commit.pk)
        except WsfleetError as exc:
            self._logger.warning("cannot confirm COMMIT; the hint copy will do",
                                 extra={"connection_id": connection_id_from_pk(commit.pk),
                                        "error": describe_error(exc)})
            return
        if record is None or record.lease_epoch != commit.epoch:
            self._metrics.count("UnconfirmedHandoffs")
            return
        if await session.adopt(record, self.worker_id):
            self._adopt(session)
        else:
            self._metrics.count("UnconfirmedHandoffs")

    async def on_handoff_hint(self, handoff: HandoffHint) -> None:
        """The giver broke instead: close what we prepared (an upstream allowing one
        session must see ours gone first), then acquire as today."""
        session = self._prepared.get(handoff.pk)
        if session is not None:
            session.abandon("giver_broke")
            task = self._prepared_tasks.get(handoff.pk)
            if task is not None:
                await asyncio.wait({task})
        await self._acquire(Hint(handoff.pk, epoch=handoff.epoch))

    async def _decline(self, queue_url: str, command: PrepareCommand, reason: str) -> None:
        self._metrics.count("HandoffDeclines")
        await self._send_one(queue_url, DeclineReply(command.pk, command.epoch, self.worker_id,
                                                     reason))

    async def _send_one(
        self, queue_url: str,
        message: HandoffHint | PrepareCommand | ReadyReply | DeclineReply | CommitNotice,
    ) -> bool:
        if self._batcher is None or not queue_url:
            return False
        try:
            return await self._batcher.send(queue_url, message)
        except Exception as exc:  # a send must cost this move its overlap, never the worker
            self._logger.warning("hand-off message not sent",
                                 extra={"connection_id": connection_id_from_pk(message.pk),
                                        "type": type(message).__name__,
                                        "error": describe_error(exc)})
            return False

    # ------------------------------------------------------------------ lifecycle
    def stop(self) -> None:
        """The worker drains: no new prepares; prepared sessions are abandoned."""
        self._stopping = True
        for session in list(self._prepared.values()):
            session.abandon("draining")

    async def close(self) -> None:
        """Let the moves under way finish (the drain's bound applies)."""
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
