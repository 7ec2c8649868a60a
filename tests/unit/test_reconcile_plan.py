"""wsfleet.reconcile hint planning: which workers' connections and which free connections get a
hint, with what delay, and when not.

Pure: worker records, index entries and a clock reading in, a plan out. The DynamoDB side
(indexes, claims) is covered by tests/integration/test_reconciler.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from wsfleet.lease import MAX_HINT_DELAY_SECONDS
from wsfleet.reconcile import (
    DEFAULT_REHINT_FLOOR_MS,
    HintLedger,
    WorkerHintKind,
    WorkerHintPlan,
    plan_unowned,
    plan_worker_hints,
    rehint_after_ms,
    unowned_grace_ms,
    worker_ended_at_ms,
)
from wsfleet.record import WorkerRecord

NOW = 1_000_000
INTERVAL = 10_000
HORIZON = NOW + INTERVAL
GRACE = unowned_grace_ms(INTERVAL)


def worker(wid: str, *, expires: int, dead_at: int | None = None) -> WorkerRecord:
    return WorkerRecord(
        worker_id=wid,
        control_queue_url=f"https://sqs.example/1/ctl-{wid}",
        started_at_ms=NOW - 3_600_000,
        heartbeat_at_ms=expires - 20_000,
        expires_at_ms=expires,
        dead_at_ms=dead_at,
    )


@dataclass(frozen=True)
class Entry:
    """What gsi_unowned returns (the shape of wsfleet.store.IndexEntry)."""

    pk: str
    epoch: int
    unowned_since_ms: int | None


def plan(
    *workers: WorkerRecord, ledger: HintLedger | None = None, now: int = NOW
) -> WorkerHintPlan:
    return plan_worker_hints(workers, now_ms=now, horizon_ms=now + INTERVAL, ledger=ledger)


# ---------------------------------------------------------------- which workers, what delay
def test_an_expired_worker_is_hinted_now_and_a_live_one_not_at_all() -> None:
    # GIVEN a worker whose lease lapsed a second ago and one renewing normally
    result = plan(worker("gone", expires=NOW - 1_000), worker("live", expires=NOW + 20_000))
    # THEN only the lapsed one is planned, with no delay
    (hint,) = result.hints
    assert (hint.worker.worker_id, hint.kind) == ("gone", WorkerHintKind.EXPIRED)
    assert hint.orphaned
    assert hint.delay_seconds(NOW) == 0
    assert (result.workers_seen, result.expired, result.expiring, result.dead) == (2, 1, 0, 0)


def test_a_dead_worker_is_hinted_now_even_if_its_lease_had_time_left() -> None:
    # A retired worker (dead_at = expires_at = when it retired) and a killed one
    retired = worker("retired", expires=NOW - 5, dead_at=NOW - 5)
    killed = worker("killed", expires=NOW - 3_000, dead_at=NOW - 1_000)
    result = plan(retired, killed)
    assert {h.kind for h in result.hints} == {WorkerHintKind.DEAD}
    assert all(h.delay_seconds(NOW) == 0 for h in result.hints)
    assert result.dead == 2
    # ... its orphans' age counts from the end of its lease, not from the kill
    by_id = {h.worker.worker_id: h for h in result.hints}
    assert by_id["killed"].orphan_age_ms(NOW) == 3_000
    assert worker_ended_at_ms(killed) == NOW - 3_000


def test_a_worker_lapsing_before_the_next_pass_gets_hints_for_its_last_second() -> None:
    (hint,) = plan(worker("dying", expires=NOW + 6_400)).hints
    assert hint.kind is WorkerHintKind.EXPIRING and not hint.orphaned
    # 6.4 s left: a 6 s delay lands 0.4 s ahead; the receiving worker waits out the rest.
    assert hint.delay_seconds(NOW) == 6
    # ... re-timed at the moment of sending: a second later, a second less
    assert hint.delay_seconds(NOW + 1_000) == 5
    assert hint.orphan_age_ms(NOW) == 0


@pytest.mark.parametrize("remaining_ms", [0, 1, 999, 1_000, 1_001, 9_999])
def test_early_hints_land_within_the_last_second_before_the_expiry(remaining_ms: int) -> None:
    expires = NOW + remaining_ms
    (hint,) = plan(worker("w", expires=expires)).hints
    lands_at = NOW + hint.delay_seconds(NOW) * 1000
    # never after the expiry (that would add to the failover time), and early by less than a
    # second, so the worker's wait (EARLY_HINT_MAX_WAIT_MS) always covers it
    assert expires - 1_000 < lands_at <= expires


def test_a_lease_ending_exactly_now_is_not_yet_expired_and_one_at_the_horizon_is_left() -> None:
    # expiry == now is still live (expired means expiry < now): an early hint with no delay
    (hint,) = plan(worker("now", expires=NOW)).hints
    assert hint.kind is WorkerHintKind.EXPIRING and hint.delay_seconds(NOW) == 0
    # a lease ending exactly when the next pass starts is that pass's business
    assert plan(worker("later", expires=HORIZON)).hints == ()


def test_an_early_hint_delay_is_capped_at_the_sqs_maximum() -> None:
    far = NOW + (MAX_HINT_DELAY_SECONDS + 100) * 1000
    (hint,) = plan_worker_hints(
        [worker("w", expires=far)], now_ms=NOW, horizon_ms=far + 1
    ).hints
    assert hint.delay_seconds(NOW) == MAX_HINT_DELAY_SECONDS


def test_workers_are_planned_most_urgent_first() -> None:
    result = plan(
        worker("soon", expires=NOW + 2_000),
        worker("recent", expires=NOW - 1_000),
        worker("old", expires=NOW - 9_000),
        worker("dead", expires=NOW - 5_000, dead_at=NOW - 4_000),
    )
    # orphaned ones by how long ago their lease ended, then the ones about to lapse
    assert [h.worker.worker_id for h in result.hints] == ["old", "dead", "recent", "soon"]


# ---------------------------------------------------------------- the ledger, per worker expiry
def test_the_ledger_suppresses_a_workers_hints_for_one_expiry_until_the_rehint_interval() -> None:
    # GIVEN a lapsed worker whose hints this reconciler claimed and sent
    ledger = HintLedger(rehint_after_ms=60_000)
    gone = worker("gone", expires=NOW - 1_000)
    ledger.remember(gone.pk, gone.expires_at_ms, NOW)
    # WHEN later passes plan
    (early,) = plan(gone, ledger=ledger, now=NOW + 59_999).hints
    (late,) = plan(gone, ledger=ledger, now=NOW + 60_000).hints
    # THEN it is pending (read, not re-claimed) while the claim is fresh, then due again
    assert early.pending and not early.owed
    assert not late.pending


def test_an_early_hint_counts_for_the_expiry_that_follows() -> None:
    # The early hint for a lease is the hint for its expiry: the next pass, after the expiry,
    # must not claim and send again.
    ledger = HintLedger(rehint_after_ms=60_000)
    dying = worker("dying", expires=NOW + 4_000)
    (hint,) = plan(dying, ledger=ledger).hints
    ledger.remember(hint.worker.pk, hint.worker.expires_at_ms, NOW)
    (after,) = plan(dying, ledger=ledger, now=NOW + INTERVAL).hints
    assert after.kind is WorkerHintKind.EXPIRED and after.pending


def test_a_renewed_worker_that_lapses_again_is_a_new_expiry() -> None:
    ledger = HintLedger(rehint_after_ms=60_000)
    ledger.remember("WORKER#w", NOW - 1_000, NOW)
    (hint,) = plan(worker("w", expires=NOW + 5_000), ledger=ledger, now=NOW + 1).hints
    assert not hint.pending


def test_hints_that_could_not_be_sent_are_owed_not_pending() -> None:
    # GIVEN a claim whose sending failed (the claim in DynamoDB is ours and still fresh)
    ledger = HintLedger(rehint_after_ms=60_000)
    gone = worker("gone", expires=NOW - 1_000)
    ledger.remember(gone.pk, gone.expires_at_ms, NOW, sent=False)
    # THEN the next pass sends again without a new claim
    (hint,) = plan(gone, ledger=ledger, now=NOW + INTERVAL).hints
    assert hint.owed and not hint.pending
    # ... and once sent, the claim still dates from when it was made
    ledger.remember(gone.pk, gone.expires_at_ms, NOW + INTERVAL)
    assert ledger.is_pending(gone.pk, gone.expires_at_ms, NOW + 59_999)
    assert not ledger.is_pending(gone.pk, gone.expires_at_ms, NOW + 60_000)


def test_an_owed_claim_that_went_stale_is_claimed_anew() -> None:
    ledger = HintLedger(rehint_after_ms=60_000)
    ledger.remember("WORKER#w", NOW - 1_000, NOW, sent=False)
    assert not ledger.is_owed("WORKER#w", NOW - 1_000, NOW + 60_000)


def test_ledger_prune_and_bound() -> None:
    ledger = HintLedger(rehint_after_ms=1_000, max_entries=3)
    for i in range(5):
        ledger.remember(f"CONN#x{i}", 7, NOW + i)
    assert len(ledger) == 3  # the two oldest were dropped
    assert not ledger.is_pending("CONN#x0", 7, NOW + 5)
    assert ledger.is_pending("CONN#x4", 7, NOW + 5)
    assert ledger.prune(NOW + 1_003) == 2  # x2 and x3 are stale, x4 (claimed at +4) is not
    assert len(ledger) == 1
    ledger.forget("CONN#x4")
    assert len(ledger) == 0


def test_ledger_refuses_a_non_positive_interval() -> None:
    with pytest.raises(ValueError):
        HintLedger(0)


def test_rehint_after_is_twice_the_visibility_timeout_with_a_floor() -> None:
    assert rehint_after_ms(10) == DEFAULT_REHINT_FLOOR_MS
    assert rehint_after_ms(30) == 60_000
    assert rehint_after_ms(120) == 240_000
    assert rehint_after_ms(5, floor_ms=1_000) == 10_000


# ---------------------------------------------------------------- free connections
def test_the_unowned_grace_is_one_pass_interval() -> None:
    assert unowned_grace_ms(10_000) == 10_000


@pytest.mark.parametrize(
    ("free_for_ms", "hinted"),
    [(0, False), (GRACE - 1, False), (GRACE, False), (GRACE + 1, True), (10 * GRACE, True)],
)
def test_a_free_connection_is_hinted_only_once_free_for_longer_than_the_grace(
    free_for_ms: int, hinted: bool
) -> None:
    # Whoever freed it (the router at START, the releaser) hinted it; within the grace that
    # hint is most likely still on its way.
    entry = Entry("CONN#a", 3, NOW - free_for_ms)
    result = plan_unowned([entry], now_ms=NOW, grace_ms=GRACE)
    assert (result.candidates == (entry,)) is hinted
    assert result.found == int(hinted)


def test_free_connections_report_the_oldest_age_and_are_capped_per_pass() -> None:
    entries = [Entry(f"CONN#f{i}", 1, NOW - GRACE - 1_000 * (i + 1)) for i in range(5)]
    result = plan_unowned(entries, now_ms=NOW, grace_ms=GRACE, max_hints=3)
    assert [e.pk for e in result.candidates] == ["CONN#f0", "CONN#f1", "CONN#f2"]
    assert (result.found, result.deferred) == (5, 2)
    assert result.oldest_age_ms == GRACE + 5_000
    assert plan_unowned([], now_ms=NOW, grace_ms=GRACE).oldest_age_ms == 0


def test_the_ledger_suppresses_a_free_spell_once_claimed_but_not_the_next_one() -> None:
    ledger = HintLedger(rehint_after_ms=60_000)
    spell = Entry("CONN#a", 2, NOW - GRACE - 1)
    ledger.remember(spell.pk, NOW - GRACE - 1, NOW)
    again = plan_unowned([spell], now_ms=NOW + 1_000, grace_ms=GRACE, ledger=ledger)
    assert again.candidates == () and again.already_pending == 1 and again.found == 1
    # taken, released again later: a new free spell, a new hint
    next_spell = Entry("CONN#a", 3, NOW - GRACE + 500)
    later = plan_unowned([next_spell], now_ms=NOW + 1_000, grace_ms=GRACE, ledger=ledger)
    assert later.candidates == (next_spell,)


def test_an_entry_without_a_since_is_ignored() -> None:
    result = plan_unowned([Entry("CONN#x", 1, None)], now_ms=NOW, grace_ms=GRACE)
    assert (result.candidates, result.found) == ((), 0)
