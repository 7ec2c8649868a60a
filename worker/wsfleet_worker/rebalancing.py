"""Rebalancer: a worker's part of evening the fleet out, and where new work should go.

At start and every ``REBALANCE_SECONDS`` the worker reads the one ``FLEET#view`` item the
reconciler writes each pass (:mod:`wsfleet.rebalance`): one eventually consistent GetItem,
however large the fleet. If the view's plan is new and asks this worker to give:

* it gives at most what the plan says, and never below its target share as it stands now
  (its own count is live; the view's may be a heartbeat old);
* it picks connections that have not been moved within ``REBALANCE_DWELL_SECONDS`` (the
  release of a move stamps ``rebalanced_at_ms`` on the item, so the next owner knows too),
  never moved ones first, then by key;
* each one ends like a SIGTERM hand-off: socket closed (1001), frames flushed, the lease
  released with the final checkpoint in one write (:attr:`ExitReason.REBALANCED`); five at
  a time, each wave once the previous one has released, so the hand-offs do not slow each
  other down;
* once released, a :class:`~wsfleet.control.HandoffHint` goes to the chosen peer's control
  queue (it acquires at once: no placement wait; hand-offs released while a send to that
  peer is out go together next, ten per SendMessageBatch), and a copy goes to the hint queue
  delayed
  by ``HANDOFF_COPY_DELAY_SECONDS``, for anyone, in case that peer died meanwhile (if the
  peer took it, the copy costs one refused acquire).

A plan is carried out once (by its ``plan_at_ms``), and only within ``REBALANCE_SECONDS`` of
its making: the reconciler plans again only after every worker of the plan has reported its
count a heartbeat after that window (:func:`wsfleet.rebalance.settled`).

Placement (:meth:`Rebalancer.placement_delay`): a worker that holds (now) more than its share
of the fleet's load (per the view) plus the band waits ``REBALANCE_PLACEMENT_SECONDS``
before each receive from the hint queue, then receives without waiting, so less loaded peers'
long polls take new and orphaned connections first. Hand-offs addressed to it are not delayed.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from wsfleet.control import HandoffHint
from wsfleet.exceptions import WsfleetError
from wsfleet.hints import SQS_BATCH_LIMIT, Hint
from wsfleet.rebalance import FleetView, defer_placement

from .connector import describe_error
from .handover import HANDOFF_COPY_DELAY_SECONDS, Handover
from .outbox import HintOutbox
from .parts import WorkerParts, WorkerRole
from .session import Session, SessionResult
from .session_rules import ExitReason

__all__ = ["HANDOFF_COPY_DELAY_SECONDS", "HANDOFF_WAVE", "Rebalancer", "choose_to_give"]

#: Sessions a giver ends at once (see Rebalancer._give), and how long it waits at most for a
#: wave to release before it starts the next.
HANDOFF_WAVE = 5
_WAVE_WAIT_SECONDS = 2.0
#: A view older than this many REBALANCE_SECONDS is not used for placement (the reconciler
#: stopped writing it).
_VIEW_FRESH_INTERVALS = 3


@dataclass(frozen=True)
class _Destination:
    taker: str
    queue_url: str


def _dwelt(moved_at: int | None, *, now_ms: int, dwell_ms: int) -> bool:
    """Not moved within ``dwell_ms`` (never moved: ``moved_at`` None)."""
    return moved_at is None or now_ms - moved_at >= dwell_ms


def choose_to_give(
    candidates: Mapping[str, int | None], count: int, *, now_ms: int, dwell_ms: int
) -> list[str]:
    """Which ``count`` connections to give, from pk -> ``rebalanced_at_ms``: none moved
    within ``dwell_ms``; never moved ones first, then the longest ago; keys break ties.

    >>> choose_to_give({"CONN#b": None, "CONN#a": 5, "CONN#c": None}, 2, now_ms=10, dwell_ms=3)
    ['CONN#b', 'CONN#c']
    >>> choose_to_give({"CONN#a": 9}, 1, now_ms=10, dwell_ms=3)
    []
    """
    eligible = [
        (moved_at if moved_at is not None else -1, pk)
        for pk, moved_at in candidates.items()
        if _dwelt(moved_at, now_ms=now_ms, dwell_ms=dwell_ms)
    ]
    return [pk for _, pk in sorted(eligible)[: max(0, count)]]


class Rebalancer(WorkerRole):
    """One worker's rebalancing: reads the fleet view, gives its part, sends the hand-offs.

    :param sessions: the worker's sessions by pk (read only; sessions are ended via finish).
    :param session_tasks: their tasks (a wave of hand-offs waits for them).
    :param send_handoffs: sends up to ten hand-offs to a peer's control queue and returns the
        pks that went out (None: no control channel here; then the hint-queue copies go out
        without a delay).
    """

    def __init__(
        self,
        parts: WorkerParts,
        outbox: HintOutbox,
        *,
        sessions: Mapping[str, Session],
        session_tasks: Mapping[str, asyncio.Task[SessionResult]],
        capacity: int,
        interval_seconds: float,
        dwell_seconds: float,
        band_percent: float,
        placement_seconds: float,
        send_handoffs: Callable[[str, list[HandoffHint]], Awaitable[set[str]]] | None,
        stopping: Callable[[], bool],
        handover: Handover | None = None,
    ) -> None:
        super().__init__(parts)
        self._handover = handover
        self._outbox = outbox
        self._sessions = sessions
        self._session_tasks = session_tasks
        self._capacity = capacity
        self._interval_ms = int(interval_seconds * 1000)
        self._dwell_ms = int(dwell_seconds * 1000)
        self._band_percent = band_percent
        self._placement_seconds = placement_seconds
        self._send_handoffs = send_handoffs
        self._queued: dict[str, list[HandoffHint]] = {}  # by taker queue URL
        self._stopping = stopping
        #: The last view read (placement uses it between reads).
        self.view: FleetView | None = None
        self._done_plan_at_ms = 0
        #: Connections being handed off, and to whom.
        self._destinations: dict[str, _Destination] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.given = 0

    # ------------------------------------------------------------------ the loop
    async def run(self) -> None:
        """Every REBALANCE_SECONDS: read the view and carry out this worker's part (until
        cancelled; nothing while the worker drains or is fenced)."""
        loop = asyncio.get_running_loop()
        interval = self._interval_ms / 1000
        # The first read at once: placement needs the fleet's load from the start (a burst
        # of STARTs on a fleet that just started went to whoever polled first).
        next_at = loop.time() - interval
        while True:
            # On a fixed grid, however long a hand-off took: every plan is read within
            # REBALANCE_SECONDS of its making (run_once acts on no older one).
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            next_at = max(next_at, loop.time() - interval)  # after a long stall, no catch-up
            if self._stopping():
                continue
            try:
                await self.run_once()
            except WsfleetError as exc:
                self._metrics.count("RebalanceFailures")
                self._logger.warning(
                    "fleet view not read; rebalancing waits", extra={"error": describe_error(exc)}
                )

    async def run_once(self) -> int:
        """Read the view; give what its plan asks of us (once per plan). Returns how many."""
        view = await self._offloader.io(self._leases.get_fleet_view)
        self.view = view
        if view is None or self._stopping():
            return 0
        now = self._clock()
        if view.plan_at_ms == self._done_plan_at_ms or now - view.plan_at_ms > self._interval_ms:
            return 0  # done already, or too old to act on (the next plan is made without it)
        self._done_plan_at_ms = view.plan_at_ms
        moves = view.moves_from(self.worker_id)
        if not moves:
            return 0
        running = self._running()
        target = view.targets.get(self.worker_id, len(running))
        budget = min(sum(m.count for m in moves), len(running) - target)
        chosen = iter(choose_to_give(running, budget, now_ms=now, dwell_ms=self._dwell_ms))
        plan: list[tuple[str, _Destination]] = []
        for move in moves:
            destination = _Destination(move.taker, view.queues.get(move.taker, ""))
            plan += [(pk, destination) for pk in itertools.islice(chosen, move.count)]
        if len(plan) < budget:
            # the rest moved within the dwell: the heartbeat's movable count tells the planner
            self._logger.info(
                "rebalancing: fewer connections movable than the plan asks",
                extra={"asked": budget, "movable": len(plan), "dwell_ms": self._dwell_ms},
            )
        if not plan:
            return 0
        self._logger.info(
            "rebalancing: handing connections off",
            extra={"connections": len(plan), "held": len(running), "target": target,
                   "takers": sorted({m.taker for m in moves})},
        )
        given = await self._give(plan)
        self.given += given
        self._metrics.count("RebalanceGiven", given)
        return given

    def _running(self) -> dict[str, int | None]:
        """pk -> ``rebalanced_at_ms`` of the sessions that could be given (not ending)."""
        return {
            pk: s.record.rebalanced_at_ms
            for pk, s in self._sessions.items()
            if s.reason is None and pk not in self._destinations and not s.handing_over
        }

    def movable(self) -> int:
        """How many connections a plan could ask of this worker now: those not moved within
        the dwell time. Each heartbeat reports it, so the reconciler plans only moves that can
        happen (a giver whose connections all just moved is not named again and again)."""
        now = self._clock()
        return sum(
            _dwelt(moved_at, now_ms=now, dwell_ms=self._dwell_ms)
            for moved_at in self._running().values()
        )

    async def _give(self, plan: list[tuple[str, _Destination]]) -> int:
        """End the chosen sessions ``HANDOFF_WAVE`` at a time, each wave once the previous
        one has released: a burst of simultaneous hand-offs (close, flush, release, hint,
        the peer's acquire and connect) would stretch every one of them."""
        given = 0
        for start in range(0, len(plan), HANDOFF_WAVE):
            if self._stopping():
                break
            wave = []
            for pk, destination in plan[start : start + HANDOFF_WAVE]:
                session = self._sessions.get(pk)
                if session is None or session.reason is not None:
                    continue
                handover = self._handover
                if handover is not None and handover.overlap_for(session, destination.queue_url):
                    # make-before-break: the hand-over sends PREPARE ... COMMIT (or breaks)
                    handover.spawn_give(session, destination.taker, destination.queue_url,
                                        ExitReason.REBALANCED)
                else:
                    self._destinations[pk] = destination
                    session.finish(ExitReason.REBALANCED, via="rebalance")
                given += 1
                task = self._session_tasks.get(pk)
                if task is not None:
                    wave.append(task)
            if wave:
                await asyncio.wait(wave, timeout=_WAVE_WAIT_SECONDS)
        return given

    # ------------------------------------------------------------------ the hand-off
    def session_done(self, result: SessionResult | None, pk: str) -> None:
        """A session ended (called by the worker for every session): a released move gets
        its hints."""
        destination = self._destinations.pop(pk, None)
        if (
            destination is None
            or result is None
            or result.reason is not ExitReason.REBALANCED
            or not result.released
        ):
            return
        handoff = HandoffHint(result.pk, result.epoch)
        url = destination.queue_url
        if self._send_handoffs is None or not url:
            self._outbox.add(Hint(result.pk, epoch=result.epoch))
            return
        queued = self._queued.setdefault(url, [])
        queued.append(handoff)
        if len(queued) == 1:  # else a send to this peer is out, and takes these next
            task = asyncio.create_task(self._send(url), name=f"handoff:{destination.taker}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, url: str) -> None:
        """Send the hand-offs queued for one peer, ten at a time, until none is left; then a
        delayed copy of each on the hint queue (at once for one that did not go out)."""
        assert self._send_handoffs is not None
        queued = self._queued[url]
        try:
            while queued:
                batch = queued[:SQS_BATCH_LIMIT]
                sent = await self._send_handoffs(url, batch)
                del queued[: len(batch)]
                for handoff in batch:
                    delay = HANDOFF_COPY_DELAY_SECONDS if handoff.pk in sent else 0
                    self._outbox.add(Hint(handoff.pk, epoch=handoff.epoch, delay_seconds=delay))
        except Exception as exc:  # a bug costs the direct hand-off only: the copies below go out
            self._metrics.count("RebalanceFailures")
            self._logger.error(
                "hand-offs not sent to the peer", extra={"error": describe_error(exc)}, exc_info=exc
            )
        finally:
            for handoff in queued:  # failed or cancelled mid-way: the copies still go out
                self._outbox.add(Hint(handoff.pk, epoch=handoff.epoch))
            del self._queued[url]

    async def close(self) -> None:
        """Let the hand-off hints in flight go out (the worker flushes the outbox after)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # ------------------------------------------------------------------ placement
    def placement_delay(self) -> float:
        """Seconds to wait before the next hint-queue receive (0: receive now)."""
        view = self.view
        if view is None or self._placement_seconds <= 0:
            return 0.0
        if self._clock() - view.at_ms > _VIEW_FRESH_INTERVALS * max(self._interval_ms, 1):
            return 0.0
        held = len(self._sessions)
        if defer_placement(
            held,
            self._capacity,
            fleet_held=view.held,
            fleet_capacity=view.capacity,
            band_percent=self._band_percent,
        ):
            return self._placement_seconds
        return 0.0
