"""HeartbeatScheduler: one timer for every lease the worker holds.

A worker with 5,000 connections must renew 5,000 leases per heartbeat and self-fence any it
could not renew in time. One scheduler does both from a heap ordered by each lease's next
deadline (:meth:`LeaseTimer.next_wakeup_ms`): it sleeps until the earliest one, dispatches the
renewals that are due (at most ``max_concurrent`` at once, so a burst queues here instead of in
the thread pool where it would delay every other DynamoDB call), and fences the sessions whose
self-fence deadline passed without a successful renewal.

Renewals stay spread over the interval because each lease's first renewal is drawn at a random
point of its first heartbeat (:meth:`LeaseTimer.start`) and each next one is due a heartbeat
after the previous one started.

The scheduler measures how late each renewal completed relative to when it was due
(``RenewLatenessMs``); the capacity benchmark reports its maximum.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from typing import Protocol

from wsfleet.clock import Clock, now_ms

from .observability import WorkerMetrics
from .protocol import LeaseTimer, TimerAction

__all__ = ["HeartbeatScheduler", "Renewable"]


class Renewable(Protocol):
    """A session as the scheduler sees it."""

    timer: LeaseTimer

    def self_fence(self) -> None:
        """The self-fence deadline passed without a renewal: close now, write nothing."""

    async def renew(self) -> None:
        """Renew once (off the loop); update ``timer`` and act on the outcome."""


class HeartbeatScheduler:
    """Renews and self-fences every registered :class:`Renewable` on time."""

    def __init__(
        self, metrics: WorkerMetrics, *, max_concurrent: int = 8, clock: Clock = now_ms
    ) -> None:
        self._metrics = metrics
        self._clock = clock
        self._heap: list[tuple[int, int, Renewable]] = []
        self._when: dict[Renewable, int] = {}  # the live heap entry of each session
        self._order = itertools.count()
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(max_concurrent)
        self._renewals: set[asyncio.Task[None]] = set()
        self._due: dict[asyncio.Task[None], int] = {}  # renewal in progress -> when it was due

    def __len__(self) -> int:
        return len(self._when)

    def behind_ms(self) -> int:
        """How overdue the oldest unfinished renewal is (0 when renewals keep up).

        The worker stops taking new connections while this grows: acquiring more leases
        than the store can renew in time would put the ones already held at risk.
        """
        if not self._due:
            return 0
        return max(0, self._clock() - min(self._due.values()))

    def add(self, session: Renewable) -> None:
        self._schedule(session)

    def remove(self, session: Renewable) -> None:
        """Forget a session (its stale heap entries are skipped when they come up)."""
        self._when.pop(session, None)

    def _schedule(self, session: Renewable) -> None:
        when = session.timer.next_wakeup_ms()
        self._when[session] = when
        heapq.heappush(self._heap, (when, next(self._order), session))
        if self._heap[0][2] is session:
            self._wake.set()

    async def run(self) -> None:
        """Dispatch due renewals and fences until cancelled."""
        while True:
            self._dispatch_due(self._clock())
            delay = (self._heap[0][0] - self._clock()) / 1000 if self._heap else None
            self._wake.clear()
            if delay is not None and delay <= 0:
                await asyncio.sleep(0)
                continue
            try:
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _dispatch_due(self, now: int) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now:
            when, _, session = heapq.heappop(heap)
            if self._when.get(session) != when:
                continue  # stale entry: rescheduled or removed since
            del self._when[session]
            action = session.timer.action(now)
            if action is TimerAction.FENCE:
                self._metrics.count("SelfFenced")
                session.self_fence()
                continue
            if action is TimerAction.RENEW:
                session.timer.renew_started()
                task = asyncio.create_task(self._renew(session, session.timer.renew_due_ms))
                self._renewals.add(task)
                self._due[task] = session.timer.renew_due_ms
                task.add_done_callback(self._forget)
            self._schedule(session)  # while renewing: wakes at the self-fence deadline

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._renewals.discard(task)
        self._due.pop(task, None)

    async def _renew(self, session: Renewable, due_ms: int) -> None:
        async with self._slots:
            try:
                await session.renew()
            except Exception:  # a bug in renew must not stop the heartbeat of everyone else
                session.timer.renew_failed(self._clock())
        self._metrics.observe("RenewLatenessMs", max(0, self._clock() - due_ms))
        if session in self._when:
            self._schedule(session)

    async def aclose(self) -> None:
        """Wait for renewals in flight (the caller cancels :meth:`run`)."""
        if self._renewals:
            await asyncio.gather(*self._renewals, return_exceptions=True)
