"""wsfleet.reconcile hint planning: which records get a hint, with what delay, and when not.

Pure: records and a clock reading in, a plan out. The DynamoDB side (query, claim) is covered
by tests/integration/test_reconciler.py.
"""

from __future__ import annotations

import pytest

from wsfleet.hints import Hint
from wsfleet.lease import MAX_HINT_DELAY_SECONDS
from wsfleet.reconcile import (
    DEFAULT_REHINT_FLOOR_MS,
    HintLedger,
    orphan_age_ms,
    orphan_since_ms,
    plan_hints,
    rehint_after_ms,
)
from wsfleet.record import ConnectionRecord, DesiredState

NOW = 1_000_000
INTERVAL = 10_000
HORIZON = NOW + INTERVAL


def conn(
    cid: str,
    *,
    expires: int = 0,
    owner: str = "w1",
    epoch: int = 1,
    state: DesiredState = DesiredState.STARTED,
    created: int = NOW - 60_000,
    updated: int = NOW - 30_000,
) -> ConnectionRecord:
    return ConnectionRecord(
        pk=f"CONN#{cid}",
        desired_state=state,
        ws_url="wss://upstream.example/x",
        lease_owner=owner if expires else "",
        lease_expires_at_ms=expires,
        lease_epoch=epoch,
        created_at_ms=created,
        updated_at_ms=updated,
    )


# ---------------------------------------------------------------- which records, what delay
def test_orphans_get_an_immediate_hint_with_the_epoch_they_were_seen_with() -> None:
    # GIVEN a lease that expired a second ago
    record = conn("a", expires=NOW - 1_000, epoch=4)
    # WHEN a pass plans
    plan = plan_hints([record], now_ms=NOW, horizon_ms=HORIZON)
    # THEN it is an orphan hinted with no delay
    assert plan.orphans_found == 1
    assert plan.expiring_found == 0
    (candidate,) = plan.candidates
    assert candidate.orphan is True
    assert candidate.hint == Hint("CONN#a", epoch=4, delay_seconds=0)


def test_a_lease_expiring_before_the_next_pass_is_hinted_to_land_in_its_last_second() -> None:
    record = conn("b", expires=NOW + 6_400)
    plan = plan_hints([record], now_ms=NOW, horizon_ms=HORIZON)
    assert plan.orphans_found == 0
    assert plan.expiring_found == 1
    (candidate,) = plan.candidates
    assert candidate.orphan is False
    # 6.4 s left: a 6 s delay lands 0.4 s ahead; the worker waits out the rest.
    assert candidate.hint.delay_seconds == 6


@pytest.mark.parametrize("remaining_ms", [0, 1, 999, 1_000, 1_001, 9_999])
def test_early_hint_lands_within_the_last_second_before_the_expiry(remaining_ms: int) -> None:
    record = conn("c", expires=NOW + remaining_ms)
    plan = plan_hints([record], now_ms=NOW, horizon_ms=HORIZON)
    (candidate,) = plan.candidates
    lands_at = NOW + candidate.hint.delay_seconds * 1000
    # never after the expiry (that would add to the failover time), and early by less than
    # a second, so the worker's wait (EARLY_HINT_MAX_WAIT_MS) always covers it
    assert record.lease_expires_at_ms - 1_000 < lands_at <= record.lease_expires_at_ms


def test_a_lease_expiring_exactly_now_is_not_yet_an_orphan() -> None:
    # expiry == now is still live (orphan means expiry < now), so it is an early hint.
    plan = plan_hints([conn("d", expires=NOW)], now_ms=NOW, horizon_ms=HORIZON)
    assert plan.orphans_found == 0 and plan.expiring_found == 1
    assert plan.candidates[0].hint.delay_seconds == 0


def test_live_leases_beyond_the_horizon_and_stopped_connections_are_ignored() -> None:
    records = [
        conn("live", expires=HORIZON),  # ends exactly at the next pass: that pass hints it
        conn("later", expires=HORIZON + 5_000),
        conn("stopped", expires=NOW - 5_000, state=DesiredState.STOPPED),
    ]
    plan = plan_hints(records, now_ms=NOW, horizon_ms=HORIZON)
    assert plan.candidates == ()
    assert (plan.orphans_found, plan.expiring_found) == (0, 0)


def test_delay_is_capped_at_the_sqs_maximum() -> None:
    far = NOW + (MAX_HINT_DELAY_SECONDS + 100) * 1000
    plan = plan_hints([conn("e", expires=far)], now_ms=NOW, horizon_ms=far + 1)
    assert plan.candidates[0].hint.delay_seconds == MAX_HINT_DELAY_SECONDS


def test_candidates_keep_query_order_and_are_capped_per_pass() -> None:
    # GIVEN five orphans, oldest first (the GSI returns ascending expiry)
    records = [conn(f"o{i}", expires=NOW - 5_000 + i) for i in range(5)]
    # WHEN the pass may send at most three hints
    plan = plan_hints(records, now_ms=NOW, horizon_ms=HORIZON, max_hints=3)
    # THEN the three oldest go now and two are deferred to the next pass
    assert [c.record.pk for c in plan.candidates] == ["CONN#o0", "CONN#o1", "CONN#o2"]
    assert plan.deferred == 2
    assert plan.orphans_found == 5


# ---------------------------------------------------------------- orphan age
def test_orphan_age_of_an_expired_lease_counts_from_its_expiry() -> None:
    record = conn("a", expires=NOW - 2_500)
    assert orphan_since_ms(record) == NOW - 2_500
    assert orphan_age_ms(record, NOW) == 2_500


def test_orphan_age_of_a_free_lease_counts_from_its_last_update() -> None:
    # A released (or never acquired) lease has expiry 0; "since 1970" would be nonsense.
    released = conn("r", expires=0, updated=NOW - 4_000)
    assert orphan_age_ms(released, NOW) == 4_000
    never = conn("n", expires=0, created=NOW - 9_000, updated=0)
    assert orphan_age_ms(never, NOW) == 9_000


def test_orphan_age_of_a_live_lease_is_zero() -> None:
    assert orphan_age_ms(conn("l", expires=NOW + 1), NOW) == 0


def test_plan_reports_the_oldest_orphan_age_and_zero_without_orphans() -> None:
    records = [
        conn("young", expires=NOW - 1_000),
        conn("old", expires=0, updated=NOW - 45_000),
        conn("soon", expires=NOW + 3_000),
    ]
    assert plan_hints(records, now_ms=NOW, horizon_ms=HORIZON).oldest_orphan_age_ms == 45_000
    only_live = plan_hints([conn("soon", expires=NOW + 3_000)], now_ms=NOW, horizon_ms=HORIZON)
    assert only_live.oldest_orphan_age_ms == 0


# ---------------------------------------------------------------- rehint interval and ledger
def test_rehint_after_is_twice_the_visibility_timeout_with_a_floor() -> None:
    assert rehint_after_ms(10) == DEFAULT_REHINT_FLOOR_MS
    assert rehint_after_ms(30) == 60_000
    assert rehint_after_ms(120) == 240_000
    assert rehint_after_ms(5, floor_ms=1_000) == 10_000


def test_ledger_suppresses_a_claimed_lease_until_the_rehint_interval() -> None:
    # GIVEN an orphan this reconciler claimed a hint for
    ledger = HintLedger(rehint_after_ms=60_000)
    record = conn("a", expires=NOW - 1_000)
    ledger.remember(record, NOW)
    # WHEN later passes plan
    early = plan_hints([record], now_ms=NOW + 59_999, horizon_ms=NOW + 69_999, ledger=ledger)
    late = plan_hints([record], now_ms=NOW + 60_000, horizon_ms=NOW + 70_000, ledger=ledger)
    # THEN it is skipped while the claim is fresh and planned again once it is stale
    assert early.candidates == () and early.already_pending == 1
    assert early.orphans_found == 1  # still counted: it is an orphan all the same
    assert [c.record.pk for c in late.candidates] == ["CONN#a"]


def test_ledger_does_not_suppress_a_new_lease_on_the_same_connection() -> None:
    ledger = HintLedger(rehint_after_ms=60_000)
    ledger.remember(conn("a", expires=NOW - 1_000, epoch=1), NOW)
    # re-acquired (epoch 2) and that lease expired too: a different lease, a new hint
    reacquired = conn("a", expires=NOW + 20_000, epoch=2)
    later = NOW + 21_000
    plan = plan_hints([reacquired], now_ms=later, horizon_ms=later + INTERVAL, ledger=ledger)
    assert len(plan.candidates) == 1
    # released (expiry 0) under the same epoch: also a different lease state
    released = conn("a", expires=0, epoch=1)
    assert not ledger.is_pending(released, NOW + 1)


def test_ledger_prune_and_bound() -> None:
    ledger = HintLedger(rehint_after_ms=1_000, max_entries=3)
    for i in range(5):
        ledger.remember(conn(f"x{i}", expires=NOW - 1), NOW + i)
    assert len(ledger) == 3  # the two oldest were dropped
    assert not ledger.is_pending(conn("x0", expires=NOW - 1), NOW + 5)
    assert ledger.is_pending(conn("x4", expires=NOW - 1), NOW + 5)
    assert ledger.prune(NOW + 1_003) == 2  # x2 and x3 are stale, x4 (claimed at +4) is not
    assert len(ledger) == 1
    ledger.forget("CONN#x4")
    assert len(ledger) == 0


def test_ledger_refuses_a_non_positive_interval() -> None:
    with pytest.raises(ValueError):
        HintLedger(0)
