"""WorkerLiveness: the worker's one lease, renewed by one task, over the in-memory store.

GIVEN a worker item in :class:`wsfleet.memstore.InMemoryLeaseStore`, WHEN the liveness task
runs with short timings, THEN it renews it on time, retries transient failures, fences when
the self-fence deadline passes, and fences at once on WorkerDead. A pause is played by moving
a clock offset forward (what a SIGSTOPped process sees on waking up). Also the
:class:`~wsfleet.lease.WorkerLeaseTimer` rules the task relies on.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable

import pytest
from worker_doubles import sync

from bench.waiting import wait_until_async
from wsfleet.clock import now_ms
from wsfleet.exceptions import StoreError
from wsfleet.lease import TimerAction, WorkerLeaseTimer
from wsfleet.memstore import InMemoryLeaseStore
from wsfleet.record import WorkerRecord
from wsfleet_worker.liveness import FenceCause, WorkerLiveness
from wsfleet_worker.observability import WorkerMetrics
from wsfleet_worker.offload import Offloader
from wsfleet_worker.parts import WorkerParts

WAIT = 10.0  # generous bound for every convergence below


class ShiftedClock:
    """Wall clock plus an offset a test moves forward (a pause, as the process sees it)."""

    def __init__(self) -> None:
        self.offset = 0

    def __call__(self) -> int:
        return now_ms() + self.offset


class Store(InMemoryLeaseStore):
    """The in-memory store, with renewals that can fail or hang on demand."""

    def __init__(self, clock: Callable[[], int]) -> None:
        super().__init__(lease_ms=400, clock=clock)
        self.renewals: list[int] = []
        self.fail_next = 0
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def renew_worker(
        self,
        worker_id: str,
        *,
        expires_at_ms: int,
        connection_count: int,
        movable_count: int | None = None,
    ) -> None:
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(WAIT)
        if self.fail_next:
            self.fail_next -= 1
            raise StoreError("throttled")
        super().renew_worker(
            worker_id, expires_at_ms=expires_at_ms, connection_count=connection_count
        )
        self.renewals.append(expires_at_ms)


class Logger:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def __getattr__(self, level: str) -> Callable[..., None]:
        return lambda message, *a, **k: self.lines.append((level, message))


#: The shared poll (bench.waiting), bounded by WAIT.
until = functools.partial(wait_until_async, timeout=WAIT)


def make(
    *, lease_ms: int = 400, heartbeat_ms: int = 40, margin_ms: int = 100,
    on_renewal_done: Callable[[], None] = lambda: None,
) -> tuple[WorkerLiveness, Store, ShiftedClock, list[FenceCause], WorkerMetrics]:
    clock = ShiftedClock()
    store = Store(clock)
    now = clock()
    store.register_worker(
        WorkerRecord(worker_id="w1", control_queue_url="", started_at_ms=now,
                     heartbeat_at_ms=now, expires_at_ms=now + lease_ms)
    )
    fences: list[FenceCause] = []
    metrics = WorkerMetrics("test", emit=lambda doc: None)
    parts = WorkerParts(
        worker_id="w1", leases=store, offloader=Offloader(io_threads=2, write_threads=1),
        metrics=metrics, logger=Logger(), clock=clock,
    )  # fmt: skip
    liveness = WorkerLiveness(
        parts, lease_ms=lease_ms, heartbeat_ms=heartbeat_ms, margin_ms=margin_ms,
        connection_count=lambda: 7, on_fence=fences.append, on_renewal_done=on_renewal_done,
    )
    liveness.start(now)
    return liveness, store, clock, fences, metrics


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


# ---------------------------------------------------------------- the timer's rules
def test_timer_renews_a_heartbeat_after_the_start_and_fences_at_expiry_minus_margin():
    t = WorkerLeaseTimer.start(10_000, lease_ms=2_000, heartbeat_ms=500, margin_ms=500)
    assert (t.action(10_499), t.action(10_500)) == (TimerAction.WAIT, TimerAction.RENEW)
    assert (t.fence_at_ms, t.action(11_500)) == (11_500, TimerAction.FENCE)
    assert t.may_write(11_499) and not t.may_write(11_500)


def test_timer_success_counts_from_the_start_of_the_call_and_failure_retries_soon():
    t = WorkerLeaseTimer.start(10_000, lease_ms=2_000, heartbeat_ms=500, margin_ms=500)
    t.renew_started()
    assert t.action(10_600) is TimerAction.WAIT and t.next_wakeup_ms() == t.fence_at_ms
    assert t.behind_ms(10_600) == 100
    t.renew_succeeded(10_520)
    assert (t.renewing, t.renew_due_ms, t.fence_at_ms) == (False, 11_020, 12_020)
    t.renew_started()
    t.renew_failed(11_100)
    assert (t.renew_due_ms, t.fence_at_ms) == (11_100 + t.retry_ms, 12_020)


# ---------------------------------------------------------------- the task
@sync
async def test_renews_the_worker_item_once_per_heartbeat_with_expiry_from_the_call():
    liveness, store, clock, fences, metrics = make()
    task = asyncio.create_task(liveness.run())
    try:
        await until(lambda: len(store.renewals) >= 5)
    finally:
        await stop(task)
    item = store.get_worker("w1")
    assert item is not None and item.connection_count == 7
    assert item.expires_at_ms == store.renewals[-1]
    assert store.renewals == sorted(store.renewals)
    assert liveness.may_write(clock()) and fences == []
    assert metrics.totals["RenewFailures"] == 0
    assert "RenewLatenessMs" in metrics.peaks


@sync
async def test_a_failed_renewal_is_retried_and_the_lease_survives():
    liveness, store, _clock, fences, metrics = make()
    store.fail_next = 2
    task = asyncio.create_task(liveness.run())
    try:
        await until(lambda: len(store.renewals) >= 2)
    finally:
        await stop(task)
    assert metrics.totals["RenewFailures"] == 2
    assert fences == [] and not liveness.fenced


@sync
async def test_renewals_that_keep_failing_fence_at_the_deadline_before_the_expiry():
    liveness, store, clock, fences, _metrics = make()
    store.fail_next = 10**6
    registered_expiry = liveness.timer.expires_at_ms  # type: ignore[union-attr]
    await asyncio.wait_for(liveness.run(), WAIT)  # returns once fenced
    assert fences == [FenceCause.DEADLINE]
    assert clock() < registered_expiry  # fenced before the lease could be taken over
    assert not liveness.may_write(clock())
    worker = store.get_worker("w1")
    assert worker is not None and not worker.dead  # nothing retired: it just expires


@sync
async def test_a_hanging_renewal_does_not_hold_the_self_fence_back():
    liveness, store, _clock, fences, _metrics = make()
    store.gate = threading.Event()
    try:
        await asyncio.wait_for(liveness.run(), WAIT)
        assert fences == [FenceCause.DEADLINE]
    finally:
        store.gate.set()


@sync
async def test_a_late_renewal_tells_the_poller_the_moment_it_ends():
    # GIVEN a worker whose renewal hangs (the taker refuses new work while it runs late)
    done: list[int] = []
    liveness, store, clock, fences, _metrics = make(
        lease_ms=10_000, heartbeat_ms=40, margin_ms=1_000,
        on_renewal_done=lambda: done.append(liveness.behind_ms(clock())),
    )  # fmt: skip
    store.gate = threading.Event()
    task = asyncio.create_task(liveness.run())
    try:
        await until(lambda: store.entered.is_set() and liveness.behind_ms(clock()) > 0)
        # THEN nobody is told while it is still out
        assert done == []
        # WHEN it lands
        store.gate.set()
        await until(lambda: bool(done))
    finally:
        store.gate.set()
        await stop(task)
    # THEN the poller was told, once the renewal was no longer late (and per renewal after)
    assert done[0] == 0 and fences == []


@sync
async def test_a_paused_worker_fences_on_waking_without_renewing_first():
    # GIVEN a live worker lease
    liveness, store, clock, fences, _metrics = make(lease_ms=10_000, heartbeat_ms=5_000)
    task = asyncio.create_task(liveness.run())
    await asyncio.sleep(0)  # one loop turn, no clock: run() is parked in its timed wait
    # WHEN the process "wakes up" after a pause longer than the lease
    clock.offset += 20_000
    liveness._wake.set()  # its timer fired while it was stopped
    await asyncio.wait_for(task, WAIT)
    # THEN it fences at once, and never wrote a renewal after the pause
    assert fences == [FenceCause.DEADLINE]
    assert store.renewals == []
    assert not liveness.may_write(clock())


@sync
async def test_a_renewal_refused_because_a_peer_killed_the_lease_fences_at_once():
    # GIVEN a renewal in flight when the process was paused past its lease
    liveness, store, clock, fences, _metrics = make(lease_ms=10_000, heartbeat_ms=50)
    store.gate = threading.Event()
    task = asyncio.create_task(liveness.run())
    await asyncio.to_thread(store.entered.wait, WAIT)
    clock.offset += 20_000
    assert store.kill_worker("w1")  # a peer found it expired and killed it
    # WHEN the renewal goes out on waking up
    store.gate.set()
    await asyncio.wait_for(task, WAIT)
    # THEN it is refused (WorkerDead) and the worker fences: its incarnation is over
    assert fences == [FenceCause.DEAD]
    assert store.renewals == []
    assert not liveness.may_write(clock()) and liveness.fenced


@sync
async def test_fence_is_idempotent_and_ends_the_task():
    liveness, _store, _clock, fences, _metrics = make(lease_ms=10_000, heartbeat_ms=5_000)
    task = asyncio.create_task(liveness.run())
    await asyncio.sleep(0)  # one loop turn, no clock: run() is parked in its timed wait
    liveness.fence(FenceCause.DEAD)
    liveness.fence(FenceCause.DEADLINE)
    await asyncio.wait_for(task, WAIT)
    assert fences == [FenceCause.DEAD]


def test_nothing_may_be_written_before_the_lease_is_registered():
    clock = ShiftedClock()
    parts = WorkerParts(
        worker_id="w1", leases=InMemoryLeaseStore(clock=clock),
        offloader=Offloader(io_threads=1, write_threads=1),
        metrics=WorkerMetrics("test", emit=lambda doc: None), logger=Logger(), clock=clock,
    )  # fmt: skip
    liveness = WorkerLiveness(
        parts, lease_ms=400, heartbeat_ms=40, margin_ms=100, connection_count=lambda: 0,
        on_fence=lambda cause: None,
    )
    assert not liveness.may_write(clock()) and liveness.fence_at_ms == 0
    with pytest.raises(RuntimeError):
        asyncio.run(liveness.run())
