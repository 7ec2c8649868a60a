"""Lease rules (model v2) as truth tables: pure functions over records, worker items and a
clock reading, no I/O.

The store turns the same rules into condition expressions (``expires_at_ms < :now`` for the
kill, owner + epoch for every holder write); the edges here are the edges those conditions
have, and test_lease_store_contract.py checks the stores agree.
"""

from __future__ import annotations

import pytest

from wsfleet.lease import (
    EARLY_HINT_MAX_WAIT_MS,
    MAX_HINT_DELAY_SECONDS,
    Lease,
    LeaseState,
    RefusalReason,
    TakeoverVerdict,
    TimerAction,
    WorkerLeaseTimer,
    breaker_verdict,
    checkpoint_due,
    hint_delay_seconds,
    is_acquirable,
    is_fenced,
    is_free,
    is_ours,
    is_stale_checkpoint,
    is_worker_alive,
    lease_expires_in_ms,
    lease_state,
    refusal_reason,
    takeover_verdict,
)
from wsfleet.record import ConnectionRecord, DesiredState, WorkerRecord

NOW = 1_000_000
STARTED, STOPPED, FAILED = DesiredState.STARTED, DesiredState.STOPPED, DesiredState.FAILED


def record(**changes) -> ConnectionRecord:
    base = ConnectionRecord(pk="CONN#a", desired_state=STARTED, ws_url="wss://h/x")
    return base.with_changes(**changes)


def worker(expires_at_ms: int = NOW + 5_000, dead_at_ms: int | None = None) -> WorkerRecord:
    return WorkerRecord(
        worker_id="w1", control_queue_url="q", started_at_ms=0, heartbeat_at_ms=0,
        expires_at_ms=expires_at_ms, dead_at_ms=dead_at_ms,
    )  # fmt: skip


HELD = record(lease_owner="w1", lease_epoch=3)
LEASE = Lease.of(HELD)


def test_lease_of_a_record():
    assert Lease.of(HELD) == Lease("CONN#a", "w1", 3)


# ------------------------------------------------------------------ free / acquirable
@pytest.mark.parametrize(
    ("state", "owner", "free", "acquirable"),
    [
        (STARTED, "", True, True),
        (STARTED, "w1", False, False),
        (STOPPED, "", True, False),
        (STOPPED, "w1", False, False),
        (FAILED, "", True, False),
        (FAILED, "w1", False, False),
    ],
)
def test_free_and_acquirable(state, owner, free, acquirable):
    candidate = record(desired_state=state, lease_owner=owner, lease_epoch=7)
    assert is_free(candidate) is free
    assert is_acquirable(candidate) is acquirable


# ------------------------------------------------------------------ worker liveness
@pytest.mark.parametrize(
    ("owner", "alive"),
    [
        (None, False),  # no item: long gone
        (worker(NOW + 1), True),
        (worker(NOW), True),  # inclusive: the kill condition is expires_at_ms < :now
        (worker(NOW - 1), False),
        (worker(NOW + 5_000, dead_at_ms=NOW - 10), False),  # killed or retired: for good
    ],
)
def test_is_worker_alive(owner, alive):
    assert is_worker_alive(owner, NOW) is alive


@pytest.mark.parametrize(
    ("rec", "owner", "state", "left"),
    [
        (record(), None, LeaseState.FREE, None),
        (record(lease_epoch=7), worker(), LeaseState.FREE, None),  # released: free, history
        (HELD, worker(NOW + 5_000), LeaseState.HELD, 5_000),
        (HELD, worker(NOW), LeaseState.HELD, 0),
        (HELD, worker(NOW - 1), LeaseState.EXPIRED, 0),
        (HELD, worker(NOW + 5_000, dead_at_ms=NOW), LeaseState.EXPIRED, 0),
        (HELD, None, LeaseState.EXPIRED, 0),
    ],
)
def test_lease_state_and_time_left(rec, owner, state, left):
    # GIVEN a connection and its owner's worker item WHEN viewed at NOW THEN the API's and
    # the CLI's lease state and time left follow from the worker lease
    assert lease_state(rec, owner, NOW) is state
    assert lease_expires_in_ms(rec, owner, NOW) == left


# ------------------------------------------------------------------ takeover
@pytest.mark.parametrize(
    ("owner", "max_wait", "verdict", "wait"),
    [
        (None, EARLY_HINT_MAX_WAIT_MS, TakeoverVerdict.TAKE, 0),
        (worker(NOW + 60_000, dead_at_ms=NOW - 1), 0, TakeoverVerdict.TAKE, 0),  # dead wins
        (worker(NOW - 1), 0, TakeoverVerdict.KILL, 0),
        (worker(NOW - 10_000), EARLY_HINT_MAX_WAIT_MS, TakeoverVerdict.KILL, 0),
        (worker(NOW), EARLY_HINT_MAX_WAIT_MS, TakeoverVerdict.WAIT, 1),  # lapses in 1 ms
        (worker(NOW), 0, TakeoverVerdict.CONFLICT, 0),  # no waiting allowed
        (worker(NOW + 700), EARLY_HINT_MAX_WAIT_MS, TakeoverVerdict.WAIT, 701),
        (worker(NOW + 1_999), 2_000, TakeoverVerdict.WAIT, 2_000),  # at the budget
        (worker(NOW + 2_000), 2_000, TakeoverVerdict.CONFLICT, 0),  # just past it
        (worker(NOW + 60_000), EARLY_HINT_MAX_WAIT_MS, TakeoverVerdict.CONFLICT, 0),
    ],
)
def test_takeover_verdict(owner, max_wait, verdict, wait):
    assert takeover_verdict(owner, NOW, max_wait) == (verdict, wait)


@pytest.mark.parametrize("expires", [NOW - 2, NOW - 1, NOW, NOW + 1, NOW + 3_000])
@pytest.mark.parametrize("dead", [None, NOW])
def test_takeover_agrees_with_liveness_and_waits_exactly_until_the_lapse(expires, dead):
    owner = worker(expires, dead)
    verdict, wait = takeover_verdict(owner, NOW, 10_000)
    # a live owner is never taken, a lapsed one always is
    assert (verdict in (TakeoverVerdict.WAIT, TakeoverVerdict.CONFLICT)) is is_worker_alive(
        owner, NOW
    )
    if verdict is TakeoverVerdict.WAIT:
        # after the wait, the owner is lapsed (KILL); one ms earlier it is still alive
        assert takeover_verdict(owner, NOW + wait, 0)[0] is TakeoverVerdict.KILL
        assert is_worker_alive(owner, NOW + wait - 1)


# ------------------------------------------------------------------ ownership and refusals
def test_ours_requires_owner_and_epoch():
    assert is_ours(HELD, LEASE)
    assert not is_ours(HELD.with_changes(lease_owner="w2"), LEASE)
    # Same owner, newer epoch: a later acquire by the same worker fences the old session.
    assert not is_ours(HELD.with_changes(lease_epoch=4), LEASE)
    assert not is_ours(HELD.with_changes(lease_owner=""), LEASE)  # released


def test_fenced_when_gone_or_not_ours():
    assert is_fenced(None, LEASE)
    assert is_fenced(HELD.with_changes(lease_epoch=4), LEASE)
    assert not is_fenced(HELD, LEASE)
    assert not is_fenced(HELD.with_changes(desired_state=STOPPED), LEASE)


@pytest.mark.parametrize(
    ("current", "expected"),
    [
        (None, RefusalReason.GONE),
        (HELD.with_changes(lease_owner="w2", lease_epoch=4), RefusalReason.LOST),
        (HELD.with_changes(lease_owner=""), RefusalReason.LOST),  # released meanwhile
        (HELD.with_changes(desired_state=STOPPED), RefusalReason.STOPPED),
        (HELD.with_changes(desired_state=FAILED), RefusalReason.STOPPED),
        # stopped *and* taken over: fenced wins, we must not write a final checkpoint
        (HELD.with_changes(desired_state=STOPPED, lease_epoch=4), RefusalReason.LOST),
        (HELD, RefusalReason.LOST),  # ours and STARTED yet refused: the safe direction
    ],
)
def test_refusal_reason(current, expected):
    assert refusal_reason(current, LEASE) is expected


def test_stale_checkpoint_only_when_ours_and_behind():
    ahead = HELD.with_changes(last_seq=31)
    assert is_stale_checkpoint(ahead, LEASE, 30)
    assert not is_stale_checkpoint(ahead, LEASE, 31)
    assert not is_stale_checkpoint(ahead.with_changes(lease_epoch=4), LEASE, 30)  # fenced instead
    assert not is_stale_checkpoint(None, LEASE, 30)


# ------------------------------------------------------------------ hints
@pytest.mark.parametrize(
    ("expires", "delay"),
    [
        (NOW - 10, 0),  # lapsed already: hint now
        (NOW, 0),
        (NOW + 1, 0),
        (NOW + 999, 0),
        (NOW + 1_000, 1),
        (NOW + 2_500, 2),  # rounded down: lands in the last second before the expiry
        (NOW + 3_600_000, MAX_HINT_DELAY_SECONDS),  # SQS's cap
    ],
)
def test_hint_delay_seconds(expires, delay):
    assert hint_delay_seconds(expires, NOW) == delay


def test_an_early_hint_lands_within_the_wait_budget():
    # whatever the remainder, a hint delayed by hint_delay_seconds lands less than a second
    # before the expiry, so the receiver's takeover_verdict is WAIT (or KILL), never CONFLICT
    for left in range(0, 20_000, 37):
        landed = NOW + 1_000 * hint_delay_seconds(NOW + left, NOW)
        verdict, _ = takeover_verdict(worker(NOW + left), landed, EARLY_HINT_MAX_WAIT_MS)
        assert verdict in (TakeoverVerdict.WAIT, TakeoverVerdict.KILL), left


# ------------------------------------------------------------------ the worker's own lease
def timer(**overrides) -> WorkerLeaseTimer:
    settings = {"lease_ms": 20_000, "heartbeat_ms": 5_000, "margin_ms": 2_000, **overrides}
    return WorkerLeaseTimer.start(0, **settings)


class TestWorkerLeaseTimer:
    def test_start(self):
        t = timer()
        assert (t.expires_at_ms, t.renew_due_ms, t.fence_at_ms, t.retry_ms) == (
            20_000, 5_000, 18_000, 1_000,
        )
        assert timer(heartbeat_ms=100).retry_ms == 50  # never below 50 ms
        assert timer(heartbeat_ms=400).retry_ms == 100  # a quarter heartbeat
        assert timer(heartbeat_ms=60_000).retry_ms == 1_000  # never above a second

    @pytest.mark.parametrize(
        ("now", "action"),
        [
            (0, TimerAction.WAIT),
            (4_999, TimerAction.WAIT),
            (5_000, TimerAction.RENEW),
            (17_999, TimerAction.RENEW),
            (18_000, TimerAction.FENCE),  # at expiry - margin, before any peer may kill
            (25_000, TimerAction.FENCE),
        ],
    )
    def test_action(self, now, action):
        assert timer().action(now) is action

    def test_a_renewal_in_flight_waits_but_still_fences(self):
        t = timer()
        t.renew_started()
        assert t.action(6_000) is TimerAction.WAIT
        assert t.next_wakeup_ms() == 18_000
        assert t.behind_ms(4_000) == 0 and t.behind_ms(7_500) == 2_500
        assert t.action(18_000) is TimerAction.FENCE

    def test_success_extends_from_the_renewal_start(self):
        t = timer()
        t.renew_started()
        t.renew_succeeded(5_000)
        assert (t.expires_at_ms, t.renew_due_ms, t.fence_at_ms) == (25_000, 10_000, 23_000)
        assert not t.renewing and t.behind_ms(20_000) == 0
        assert t.next_wakeup_ms() == 10_000
        assert t.action(18_000) is TimerAction.RENEW

    def test_a_late_success_never_shortens_the_lease(self):
        t = timer()
        t.renew_succeeded(10_000)
        t.renew_succeeded(5_000)  # an older renewal's answer
        assert t.expires_at_ms == 30_000

    def test_failure_retries_soon_and_the_fence_still_holds(self):
        t = timer()
        t.renew_started()
        t.renew_failed(6_000)
        assert not t.renewing and t.renew_due_ms == 7_000
        assert t.action(6_999) is TimerAction.WAIT and t.action(7_000) is TimerAction.RENEW
        assert t.next_wakeup_ms() == 7_000
        t.renew_failed(17_500)  # retry would be due after the fence: the fence comes first
        assert t.next_wakeup_ms() == 18_000 and t.action(18_000) is TimerAction.FENCE

    def test_may_write_only_before_the_fence(self):
        t = timer()
        assert t.may_write(17_999) and not t.may_write(18_000)


# ------------------------------------------------------------------ checkpoints
@pytest.mark.parametrize(
    ("durable", "persisted", "last_written", "now", "due"),
    [
        (5, 5, 0, 10**9, False),  # idle: nothing to write, ever
        (6, 5, 0, 600, True),  # advanced, interval passed
        (6, 5, 1, 600, False),  # advanced, 1 ms short of the interval
        (6, 5, 0, 599, False),
        (4, 5, 0, 10**9, False),  # behind what is persisted: never backwards
    ],
)
def test_checkpoint_due(durable, persisted, last_written, now, due):
    assert checkpoint_due(
        durable=durable, persisted=persisted, last_written_ms=last_written, now_ms=now,
        interval_ms=600,
    ) is due  # fmt: skip


# ------------------------------------------------------------------ crash-loop breaker
def _counted(count: int, at: int | None) -> ConnectionRecord:
    return ConnectionRecord.new("c", "wss://x", 0).with_changes(failure_count=count, failure_seq=at)


@pytest.mark.parametrize(
    ("count", "at", "checkpoint", "threshold", "expected"),
    [
        (0, None, 0, 3, (1, 0, False)),  # first failure ever, even at seq 0
        (1, 4, 4, 3, (2, 4, False)),  # same checkpoint: counts up
        (2, 4, 4, 3, (3, 4, True)),  # reaches the threshold: trips
        (2, 4, 5, 3, (1, 5, False)),  # checkpoint advanced, no window: starts again
        (0, None, 9, 1, (1, 9, True)),  # threshold 1 trips on the first
        (99, 4, 4, 0, (100, 4, False)),  # 0 turns the breaker off
    ],
)
def test_breaker_verdict_at_one_position(count, at, checkpoint, threshold, expected):
    verdict = breaker_verdict(_counted(count, at), checkpoint, threshold)
    assert (verdict.count, verdict.at_seq, verdict.trip) == expected


def _windowed(count: int, at: int, since: int | None) -> ConnectionRecord:
    return _counted(count, at).with_changes(failure_since_ms=since)


@pytest.mark.parametrize(
    ("record", "checkpoint", "now", "expected"),
    [
        # progress on every session, failures inside the window: the count keeps growing
        (_windowed(1, 4, 1_000), 5, 2_000, (2, 5, False, 1_000)),
        (_windowed(2, 5, 1_000), 9, 60_999, (3, 9, True, 1_000)),
        # the window has passed and the stream moved on: a new count, a new window
        (_windowed(2, 5, 1_000), 9, 61_000, (1, 9, False, 61_000)),
        # stuck at one position: counts however late (the window does not reset it)
        (_windowed(2, 5, 1_000), 5, 10**9, (3, 5, True, 1_000)),
        # a count stored before windows existed (no since): position rule only, window starts
        (_windowed(2, 5, None), 5, 7_000, (3, 5, True, 7_000)),
        (_windowed(2, 5, None), 6, 7_000, (1, 6, False, 7_000)),
        # nothing counted yet: the first failure opens the window
        (_windowed(0, 0, None), 0, 5_000, (1, 0, False, 5_000)),
    ],
)
def test_breaker_verdict_within_a_window(record, checkpoint, now, expected):
    verdict = breaker_verdict(record, checkpoint, 3, now_ms=now, window_ms=60_000)
    assert (verdict.count, verdict.at_seq, verdict.trip, verdict.since_ms) == expected


def test_a_loop_that_moves_the_checkpoint_every_session_trips_within_the_limit():
    # GIVEN an upstream that sends one new frame, then poison, on every connect
    record = ConnectionRecord.new("c", "wss://x", 0)
    sessions = 0
    verdict = None
    # WHEN the worker counts each failure a second apart, each one seq further on
    while sessions < 100 and not (verdict and verdict.trip):
        sessions += 1
        verdict = breaker_verdict(
            record, sessions, 5, now_ms=sessions * 1_000, window_ms=600_000
        )
        record = record.with_changes(
            failure_count=verdict.count, failure_seq=verdict.at_seq,
            failure_since_ms=verdict.since_ms,
        )  # fmt: skip
    # THEN it trips at the limit, not never
    assert sessions == 5
