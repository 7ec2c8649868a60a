"""Lease rules as a truth table: pure functions over (record, lease, now), no I/O."""

from __future__ import annotations

import pytest

from wsfleet.lease import (
    EARLY_HINT_MAX_WAIT_MS,
    MAX_HINT_DELAY_SECONDS,
    BreakerVerdict,
    Lease,
    LeaseState,
    RefusalReason,
    acquire_wait_ms,
    breaker_verdict,
    hint_delay_seconds,
    is_acquirable,
    is_expired,
    is_fenced,
    is_free,
    is_orphan,
    is_ours,
    is_own_acquire,
    is_stale_checkpoint,
    is_worker_alive,
    lease_expires_in_ms,
    lease_state,
    refusal_reason,
    self_fence_at_ms,
    should_self_fence,
    will_expire_before,
)
from wsfleet.record import ConnectionRecord, DesiredState, WorkerRecord

NOW = 1_000_000


def record(**changes) -> ConnectionRecord:
    base = ConnectionRecord(pk="CONN#a", desired_state=DesiredState.STARTED, ws_url="wss://h/x")
    return base.with_changes(**changes)


HELD = record(lease_owner="w1", lease_epoch=3, lease_expires_at_ms=NOW + 5_000)
LEASE = Lease.of(HELD)


class TestFreeAndExpired:
    def test_new_record_is_free_and_expired(self):
        fresh = record()
        assert is_free(fresh)
        assert is_expired(fresh, NOW)

    def test_released_record_is_free_even_with_history(self):
        released = record(lease_owner="", lease_epoch=7, lease_expires_at_ms=0)
        assert is_free(released)
        assert is_expired(released, NOW)

    def test_held_record_is_neither(self):
        assert not is_free(HELD)
        assert not is_expired(HELD, NOW)

    def test_expiry_is_strict(self):
        # DynamoDB condition is `lease_expires_at_ms < :now`; the rule must agree at the edge.
        edge = record(lease_owner="w1", lease_expires_at_ms=NOW)
        assert not is_expired(edge, NOW)
        assert is_expired(edge, NOW + 1)


@pytest.mark.parametrize(
    ("changes", "now", "state", "left"),
    [
        ({}, NOW, LeaseState.FREE, None),
        ({"lease_epoch": 7, "lease_expires_at_ms": 0}, NOW, LeaseState.FREE, None),  # released
        ({"lease_owner": "w1", "lease_expires_at_ms": NOW + 5_000}, NOW, LeaseState.HELD, 5_000),
        ({"lease_owner": "w1", "lease_expires_at_ms": NOW}, NOW, LeaseState.HELD, 0),
        ({"lease_owner": "w1", "lease_expires_at_ms": NOW}, NOW + 1, LeaseState.EXPIRED, 0),
    ],
)
def test_lease_state_and_time_left(changes, now, state, left):
    # GIVEN a record WHEN viewed at `now` THEN the API's and the CLI's lease state follow
    assert lease_state(record(**changes), now) is state
    assert lease_expires_in_ms(record(**changes), now) == left


class TestAcquirable:
    @pytest.mark.parametrize(
        ("desired", "expires", "expected"),
        [
            (DesiredState.STARTED, 0, True),
            (DesiredState.STARTED, NOW - 1, True),
            (DesiredState.STARTED, NOW + 1, False),
            (DesiredState.STOPPED, 0, False),
            (DesiredState.STOPPED, NOW - 1, False),
        ],
    )
    def test_truth_table(self, desired, expires, expected):
        candidate = record(desired_state=desired, lease_owner="w1", lease_expires_at_ms=expires)
        assert is_acquirable(candidate, NOW) is expected
        assert is_orphan(candidate, NOW) is expected

    def test_will_expire_before_window(self):
        assert will_expire_before(HELD, NOW + 5_001)
        assert not will_expire_before(HELD, NOW + 5_000)
        stopped = HELD.with_changes(desired_state=DesiredState.STOPPED)
        assert not will_expire_before(stopped, NOW * 2)


class TestOwnership:
    def test_ours_requires_owner_and_epoch(self):
        assert is_ours(HELD, LEASE)
        assert not is_ours(HELD.with_changes(lease_owner="w2"), LEASE)
        # Same owner, newer epoch: a later acquire by the same worker still fences the old session.
        assert not is_ours(HELD.with_changes(lease_epoch=4), LEASE)

    def test_fenced_when_gone_or_not_ours(self):
        assert is_fenced(None, LEASE)
        assert is_fenced(HELD.with_changes(lease_epoch=4), LEASE)
        assert not is_fenced(HELD, LEASE)

    @pytest.mark.parametrize(
        ("current", "expected"),
        [
            (None, RefusalReason.GONE),
            (HELD.with_changes(lease_owner="w2", lease_epoch=4), RefusalReason.LOST),
            (HELD.with_changes(lease_owner="", lease_expires_at_ms=0), RefusalReason.LOST),
            (HELD.with_changes(desired_state=DesiredState.STOPPED), RefusalReason.STOPPED),
            # stopped *and* taken over: fenced wins, we must not write a final checkpoint
            (
                HELD.with_changes(desired_state=DesiredState.STOPPED, lease_epoch=4),
                RefusalReason.LOST,
            ),
            (HELD, RefusalReason.LOST),
        ],
    )
    def test_refusal_reason(self, current, expected):
        assert refusal_reason(current, LEASE) is expected


class TestSelfFence:
    def test_deadline_is_expiry_minus_margin(self):
        assert self_fence_at_ms(LEASE, 2_000) == NOW + 3_000

    def test_should_self_fence_at_and_after_deadline(self):
        assert not should_self_fence(LEASE, NOW + 2_999, 2_000)
        assert should_self_fence(LEASE, NOW + 3_000, 2_000)

    def test_extended_lease_moves_deadline(self):
        renewed = LEASE.extended_to(NOW + 20_000)
        assert renewed.epoch == LEASE.epoch
        assert not should_self_fence(renewed, NOW + 3_000, 2_000)


class TestHintDelay:
    def test_expired_lease_hints_now(self):
        assert hint_delay_seconds(record(lease_expires_at_ms=NOW - 10), NOW) == 0

    def test_rounds_down_to_land_in_the_last_second_before_expiry(self):
        assert hint_delay_seconds(record(lease_expires_at_ms=NOW + 1), NOW) == 0
        assert hint_delay_seconds(record(lease_expires_at_ms=NOW + 999), NOW) == 0
        assert hint_delay_seconds(record(lease_expires_at_ms=NOW + 1_000), NOW) == 1
        assert hint_delay_seconds(record(lease_expires_at_ms=NOW + 2_500), NOW) == 2

    def test_capped_at_sqs_maximum(self):
        far = record(lease_expires_at_ms=NOW + 3_600_000)
        assert hint_delay_seconds(far, NOW) == MAX_HINT_DELAY_SECONDS


class TestAcquireWait:
    """After a refused acquire: wait for a lease about to lapse (an early hint), else give up."""

    def test_waits_until_just_past_the_expiry_of_a_lease_about_to_lapse(self):
        lapsing = record(lease_owner="w1", lease_epoch=3, lease_expires_at_ms=NOW + 700)
        wait = acquire_wait_ms(lapsing, "w2", NOW, EARLY_HINT_MAX_WAIT_MS)
        assert wait == 701
        assert is_acquirable(lapsing, NOW + wait)  # the acquire condition holds by then
        assert not is_acquirable(lapsing, NOW + wait - 1)

    def test_a_lease_that_lapsed_since_the_refusal_is_tried_again_at_once(self):
        # refused with a few ms left; by the time the refusal is looked at, the lease is over
        just_lapsed = record(lease_owner="w1", lease_epoch=3, lease_expires_at_ms=NOW - 40)
        assert acquire_wait_ms(just_lapsed, "w2", NOW, EARLY_HINT_MAX_WAIT_MS) == 0

    def test_a_lease_further_out_than_the_bound_is_given_up(self):
        live = record(lease_owner="w1", lease_epoch=3, lease_expires_at_ms=NOW + 2_001)
        assert acquire_wait_ms(live, "w2", NOW, 2_000) is None
        assert acquire_wait_ms(live, "w2", NOW, 2_002) == 2_002

    @pytest.mark.parametrize(
        "current",
        [
            None,  # gone
            record(lease_owner="w1", lease_expires_at_ms=NOW + 500,
                   desired_state=DesiredState.STOPPED),
            record(lease_owner="w2", lease_expires_at_ms=NOW + 500),  # ours already
            record(lease_owner=None, lease_expires_at_ms=0),  # free: nothing to wait for
        ],
    )
    def test_nothing_to_wait_for(self, current):
        assert acquire_wait_ms(current, "w2", NOW, EARLY_HINT_MAX_WAIT_MS) is None


class TestOwnAcquire:
    """A refused retry that met the lease its own first attempt had taken."""

    def test_our_owner_and_the_expiry_we_wrote_is_our_own_acquire(self):
        landed = record(lease_owner="w2", lease_epoch=4, lease_expires_at_ms=NOW + 5_000)
        assert is_own_acquire(landed, "w2", NOW + 5_000)

    @pytest.mark.parametrize(
        "current",
        [
            None,
            record(lease_owner="w1", lease_epoch=4, lease_expires_at_ms=NOW + 5_000),
            record(lease_owner="w2", lease_epoch=4, lease_expires_at_ms=NOW + 4_000),
            record(lease_owner="w2", lease_epoch=4, lease_expires_at_ms=NOW + 5_000,
                   desired_state=DesiredState.STOPPED),
        ],
    )
    def test_anything_else_is_a_conflict(self, current):
        assert not is_own_acquire(current, "w2", NOW + 5_000)


def test_worker_alive_until_its_expiry():
    worker = WorkerRecord(
        worker_id="w1", control_queue_url="q", started_at_ms=0, heartbeat_at_ms=0,
        expires_at_ms=NOW,
    )
    assert is_worker_alive(worker, NOW)
    assert not is_worker_alive(worker, NOW + 1)
    assert not is_worker_alive(None, NOW)


def test_stale_checkpoint_only_when_ours_and_behind():
    ahead = HELD.with_changes(last_seq=31)
    assert is_stale_checkpoint(ahead, LEASE, 30)
    assert not is_stale_checkpoint(ahead, LEASE, 31)
    assert not is_stale_checkpoint(ahead.with_changes(lease_epoch=4), LEASE, 30)  # fenced instead
    assert not is_stale_checkpoint(None, LEASE, 30)


# ------------------------------------------------------------------ crash-loop breaker


def _counted(count: int, at: int | None) -> ConnectionRecord:
    return ConnectionRecord.new("c", "wss://x", 0).with_changes(failure_count=count, failure_seq=at)


@pytest.mark.parametrize(
    ("count", "at", "checkpoint", "threshold", "expected"),
    [
        (0, None, 0, 3, BreakerVerdict(1, 0, False)),  # first failure ever, even at seq 0
        (1, 4, 4, 3, BreakerVerdict(2, 4, False)),  # same checkpoint: counts up
        (2, 4, 4, 3, BreakerVerdict(3, 4, True)),  # reaches the threshold: trips
        (2, 4, 5, 3, BreakerVerdict(1, 5, False)),  # checkpoint advanced: starts again
        (0, None, 9, 1, BreakerVerdict(1, 9, True)),  # threshold 1 trips on the first
        (99, 4, 4, 0, BreakerVerdict(100, 4, False)),  # 0 turns the breaker off
    ],
)
def test_breaker_verdict(count, at, checkpoint, threshold, expected):
    assert breaker_verdict(_counted(count, at), checkpoint, threshold) == expected
