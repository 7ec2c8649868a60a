"""HeartbeatScheduler: renews on time, bounds concurrency, self-fences (asyncio, no network)."""

from __future__ import annotations

import asyncio
import time

from wsfleet.clock import now_ms
from wsfleet.lease import Lease
from wsfleet_worker.heartbeat import HeartbeatScheduler
from wsfleet_worker.observability import WorkerMetrics
from wsfleet_worker.protocol import LeaseTimer

HEARTBEAT_MS = 40
LEASE_MS = 400
MARGIN_MS = 100
WAIT = 10.0  # generous bound for every convergence below


class FakeSession:
    """A Renewable whose renewals succeed, hang or fail on demand."""

    def __init__(self, name: str, *, gate: asyncio.Event | None = None, fail: bool = False):
        now = now_ms()
        self.name = name
        self.timer = LeaseTimer.start(
            Lease(f"CONN#{name}", "w", 1, now + LEASE_MS),
            now,
            heartbeat_ms=HEARTBEAT_MS,
            margin_ms=MARGIN_MS,
        )
        self.renewals = 0
        self.fenced = 0
        self.gate = gate
        self.fail = fail
        self.active = 0
        self.peak = 0

    def self_fence(self) -> None:
        self.fenced += 1

    async def renew(self) -> None:
        started = now_ms()
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.fail:
                self.timer.renew_failed(now_ms())
                return
            self.renewals += 1
            self.timer.renew_succeeded(self.timer.lease.extended_to(started + LEASE_MS), started)
        finally:
            self.active -= 1


async def until(condition, limit: float = WAIT) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def running(scheduler: HeartbeatScheduler):
    task = asyncio.create_task(scheduler.run())
    await asyncio.sleep(0)
    return task


def test_renews_every_session_repeatedly_and_never_fences_healthy_ones():
    async def scenario():
        metrics = WorkerMetrics("t", emit=lambda doc: None)
        scheduler = HeartbeatScheduler(metrics, max_concurrent=4)
        sessions = [FakeSession(f"s{i}") for i in range(20)]
        for session in sessions:
            scheduler.add(session)
        task = await running(scheduler)
        await until(lambda: all(s.renewals >= 5 for s in sessions))
        task.cancel()
        await scheduler.aclose()
        assert all(s.fenced == 0 for s in sessions)
        assert metrics.peaks["RenewLatenessMs"] >= 0
        assert len(scheduler) == 20

    asyncio.run(scenario())


def test_concurrent_renewals_are_bounded():
    async def scenario():
        scheduler = HeartbeatScheduler(WorkerMetrics("t", emit=lambda d: None), max_concurrent=3)
        gate = asyncio.Event()
        sessions = [FakeSession(f"s{i}", gate=gate) for i in range(10)]
        for session in sessions:
            scheduler.add(session)
        task = await running(scheduler)
        await until(lambda: sum(s.active for s in sessions) == 3)
        await asyncio.sleep(0.1)
        assert sum(s.active for s in sessions) == 3  # the other seven wait for a slot
        gate.set()
        await until(lambda: all(s.renewals >= 1 for s in sessions))
        task.cancel()
        await scheduler.aclose()

    asyncio.run(scenario())


def test_a_renewal_that_hangs_past_the_deadline_self_fences_once():
    async def scenario():
        scheduler = HeartbeatScheduler(WorkerMetrics("t", emit=lambda d: None))
        stuck = FakeSession("stuck", gate=asyncio.Event())
        healthy = FakeSession("ok")
        scheduler.add(stuck)
        scheduler.add(healthy)
        task = await running(scheduler)
        await until(lambda: stuck.fenced == 1)
        assert now_ms() >= stuck.timer.fence_at_ms
        assert len(scheduler) == 1  # the fenced session is no longer scheduled
        await until(lambda: healthy.renewals >= 3)
        assert stuck.fenced == 1 and healthy.fenced == 0
        task.cancel()
        stuck.gate.set()
        await scheduler.aclose()

    asyncio.run(scenario())


def test_failing_renewals_are_retried_until_the_fence_deadline():
    async def scenario():
        scheduler = HeartbeatScheduler(WorkerMetrics("t", emit=lambda d: None))
        failing = FakeSession("f", fail=True)
        scheduler.add(failing)
        task = await running(scheduler)
        await until(lambda: failing.fenced == 1)
        assert failing.renewals == 0
        task.cancel()
        await scheduler.aclose()

    asyncio.run(scenario())


def test_removed_sessions_are_neither_renewed_nor_fenced():
    async def scenario():
        scheduler = HeartbeatScheduler(WorkerMetrics("t", emit=lambda d: None))
        gone = FakeSession("gone")
        kept = FakeSession("kept")
        scheduler.add(gone)
        scheduler.add(kept)
        scheduler.remove(gone)
        task = await running(scheduler)
        await until(lambda: kept.renewals >= 3)
        await until(lambda: now_ms() > gone.timer.fence_at_ms)
        await asyncio.sleep(0.05)
        assert (gone.renewals, gone.fenced) == (0, 0)
        task.cancel()
        await scheduler.aclose()

    asyncio.run(scenario())


def test_behind_reports_how_overdue_the_oldest_pending_renewal_is():
    async def scenario():
        scheduler = HeartbeatScheduler(WorkerMetrics("t", emit=lambda d: None), max_concurrent=1)
        gate = asyncio.Event()
        sessions = [FakeSession(f"s{i}", gate=gate) for i in range(3)]
        for session in sessions:
            scheduler.add(session)
        assert scheduler.behind_ms() == 0
        task = await running(scheduler)
        await until(lambda: scheduler.behind_ms() >= 100)  # renewals stuck behind a slow store
        gate.set()
        await until(lambda: all(s.renewals >= 1 for s in sessions))
        await until(lambda: scheduler.behind_ms() < HEARTBEAT_MS)
        task.cancel()
        await scheduler.aclose()

    asyncio.run(scenario())
