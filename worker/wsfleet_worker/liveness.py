"""WorkerLiveness: the worker's one lease, renewed by one task, and its self-fence.

Lease model v2 keeps connections alive through their owner's worker item
(``WORKER#<worker_id>``, ``expires_at_ms``): one write per worker per heartbeat, whatever it
holds. This module is the only place that renews it. One asyncio task sleeps until the
:class:`~wsfleet.lease.WorkerLeaseTimer` says something is due:

* RENEW: ``renew_worker`` off the loop, asking for ``start of the call + lease``. A success
  moves the timer from that start; a failure that may pass (throttling, a timeout) is retried
  soon; :class:`~wsfleet.exceptions.WorkerDead` (a peer killed the lease after it expired,
  e.g. this process was paused, or the item is gone) fences at once.
* FENCE: the self-fence deadline (``expires_at - margin``) passed without a successful
  renewal: fence at once, before any peer may kill the lease and take the connections.

Fencing is final: the incarnation never renews again (its connections would otherwise stay
owned by a live worker without sessions). :meth:`WorkerLiveness.fence` is synchronous and
calls ``on_fence`` before returning, so the worker aborts every socket before anything else
runs on the loop; :meth:`may_write` turns false in the same step, so the flusher drops every
queued frame and no connection write follows.

The renewal is not awaited by the loop that watches the deadline: a renewal stuck in a slow
request cannot hold the self-fence back. It runs on a thread of its own
(:meth:`~wsfleet_worker.offload.Offloader.lease`), so no queue of connection writes can delay
it.

``RenewLatenessMs``: completion of a renewal minus the moment it was due (the capacity bench
reports its maximum). While a renewal runs late (more than a quarter heartbeat) the worker takes
nothing new (:meth:`~wsfleet_worker.taking.LeaseTaker.free_slots`); ``on_renewal_done`` tells
the hint poller the moment it has ended, so a worker that was late takes hints again at once,
not at the poller's next re-check of its room.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from enum import StrEnum

from wsfleet.exceptions import WorkerDead
from wsfleet.lease import TimerAction, WorkerLeaseTimer

from .connector import describe_error
from .parts import WorkerParts, WorkerRole

__all__ = ["FenceCause", "WorkerLiveness"]


class FenceCause(StrEnum):
    """Why the worker lease is over (the ``via`` of every session it fenced)."""

    DEADLINE = "self-fence"  # no renewal landed before expires_at - margin
    DEAD = "worker-dead"  # the renewal was refused: killed by a peer, or the item is gone


class WorkerLiveness(WorkerRole):
    """Renews the worker lease on time and fences the whole worker when it cannot.

    :param connection_count: the ``connection_count`` each renewal writes (for operators).
    :param movable_count: the ``movable_count`` each renewal writes (rebalancing plans with
        it; None: not written).
    :param on_fence: called once, synchronously, when the lease is over; it must abort every
        session's socket before it returns.
    :param on_renewal_done: called after every renewal that ended (landed or failed) without
        fencing: the renewal is no longer running late (see the module docstring).
    """

    def __init__(
        self,
        parts: WorkerParts,
        *,
        lease_ms: int,
        heartbeat_ms: int,
        margin_ms: int,
        connection_count: Callable[[], int],
        movable_count: Callable[[], int | None] = lambda: None,
        on_fence: Callable[[FenceCause], None],
        on_renewal_done: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(parts)
        self._lease_ms = lease_ms
        self._heartbeat_ms = heartbeat_ms
        self._margin_ms = margin_ms
        self._connection_count = connection_count
        self._movable_count = movable_count
        self._on_fence = on_fence
        self._on_renewal_done = on_renewal_done
        self.timer: WorkerLeaseTimer | None = None
        self.cause: FenceCause | None = None
        self._wake = asyncio.Event()
        self._renewal: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ state
    def start(self, registered_at_ms: int) -> None:
        """The worker item was written with ``expires_at = registered_at_ms + lease``."""
        self.timer = WorkerLeaseTimer.start(
            registered_at_ms,
            lease_ms=self._lease_ms,
            heartbeat_ms=self._heartbeat_ms,
            margin_ms=self._margin_ms,
        )

    @property
    def fenced(self) -> bool:
        return self.cause is not None

    @property
    def fence_at_ms(self) -> int:
        """The self-fence deadline (0 before :meth:`start`: nothing may be written yet)."""
        return self.timer.fence_at_ms if self.timer is not None else 0

    def may_write(self, now: int) -> bool:
        """Writes under this worker's leases: only while the lease is surely ours."""
        return self.cause is None and self.timer is not None and self.timer.may_write(now)

    def behind_ms(self, now: int) -> int:
        """How overdue the running renewal is (0 when renewals keep up)."""
        return self.timer.behind_ms(now) if self.timer is not None else 0

    # ------------------------------------------------------------------ fencing
    def fence(self, cause: FenceCause) -> None:
        """End the incarnation now (idempotent). Synchronous on purpose: see the module doc."""
        if self.cause is not None:
            return
        self.cause = cause
        self._wake.set()
        self._on_fence(cause)

    # ------------------------------------------------------------------ the task
    async def run(self) -> None:
        """Renew until fenced (then return) or cancelled."""
        timer = self.timer
        if timer is None:
            raise RuntimeError("WorkerLiveness.start() must be called first")
        try:
            while self.cause is None:
                now = self._clock()
                action = timer.action(now)
                if action is TimerAction.FENCE:
                    self.fence(FenceCause.DEADLINE)
                    return
                if action is TimerAction.RENEW:
                    timer.renew_started()
                    self._renewal = asyncio.create_task(
                        self._renew(timer, timer.renew_due_ms), name="worker:renew"
                    )
                    continue  # next wakeup: the fence deadline, or the renewal's outcome
                self._wake.clear()
                delay = max(0.0, (timer.next_wakeup_ms() - now) / 1000)
                try:
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
                except TimeoutError:
                    pass
        finally:
            renewal = self._renewal
            if renewal is not None and not renewal.done() and self.cause is None:
                renewal.cancel()  # cancelled from outside (shutdown): the thread finishes alone

    async def _renew(self, timer: WorkerLeaseTimer, due_ms: int) -> None:
        started = self._clock()
        try:
            await self._offloader.lease(
                self._leases.renew_worker,
                self.worker_id,
                expires_at_ms=started + self._lease_ms,
                connection_count=self._connection_count(),
                movable_count=self._movable_count(),
            )
        except WorkerDead as exc:
            if self.cause is None:
                self._logger.error(
                    "worker lease refused: this incarnation is over",
                    extra={"error": describe_error(exc)},
                )
            self.fence(FenceCause.DEAD)
            return
        except Exception as exc:  # throttling, timeouts: the old deadline still stands
            timer.renew_failed(self._clock())
            self._metrics.count("RenewFailures")
            self._logger.warning(
                "worker lease renewal failed; retrying",
                extra={"error": describe_error(exc), "fence_in_ms": timer.fence_at_ms - started},
            )
        else:
            timer.renew_succeeded(started)
        finally:
            self._metrics.observe("RenewLatenessMs", max(0, self._clock() - due_ms))
            self._wake.set()
        if self.cause is None:
            self._on_renewal_done()
